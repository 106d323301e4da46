//! What every listener — both HTTP engines, the TCP relay, the admin API — takes from below:
//! the [`Hub`] (the live [`State`] and the client connection slots), a connection's [`Slot`]
//! and [`ConnHold`], and the accept loop that hands out both.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::config::Limits;
use crate::state::State;

/// Pause after a failed `accept` (out of file descriptors): retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// What every listener and the admin API share: the live configuration (swapped whole on
/// reload) and the client connection slots under `limits.max_connections`.
#[derive(Debug)]
pub(crate) struct Hub {
    pub(crate) state: ArcSwap<State>,
    /// One permit per client connection (tunnels included), all listeners; an accept loop
    /// takes its permit before it waits.
    conns: Arc<Semaphore>,
    /// `limits.max_connections` at start (a reload does not change it).
    max_conns: usize,
    /// Client connections open.
    open: Arc<AtomicUsize>,
    /// With several worker threads: how their connections are kept even.
    spread: Option<Spread>,
    /// What the client connections' defences did.
    pub(crate) defences: Defences,
}

/// What the defences of client connections did, counted for `/metrics` (atomics, `Relaxed`;
/// each counted once, off the request path).
#[derive(Debug, Default)]
pub(crate) struct Defences {
    /// HTTP/2 streams the client reset before their answer started.
    pub(crate) premature_resets: AtomicU64,
    /// HTTP/2 connections closed with `GOAWAY ENHANCE_YOUR_CALM` for too many of those.
    pub(crate) calmed: AtomicU64,
    /// Client connections that reached `max_requests_per_connection` (HTTP/2: `GOAWAY`;
    /// HTTP/1.1: `Connection: close` on the last answer).
    pub(crate) capped: AtomicU64,
    /// HTTP/2 streams reset (`CANCEL`) after `stream_idle_timeout_ms` without a byte either
    /// way, or their route's `timeout_ms` waiting for the client's flow-control window.
    pub(crate) idle_resets: AtomicU64,
}

impl Defences {
    /// Count one of `counter`.
    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The four counters, in field order.
    pub(crate) fn read(&self) -> [u64; 4] {
        [
            &self.premature_resets,
            &self.calmed,
            &self.capped,
            &self.idle_resets,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }
}

/// Client connections kept even over the worker threads, as HAProxy dispatches each accepted
/// connection to its least loaded thread. With `SO_REUSEPORT` alone the kernel picks a worker
/// by a hash of the connection's addresses, and few connections split unevenly: 4 over 2
/// workers are 3 + 1 or 4 + 0 five times in eight, leaving a worker (and a core) idle under
/// load while the other saturates. A worker that accepts a connection while it serves more than
/// the least loaded worker hands it over (the socket moves between the threads' runtimes once,
/// before its first byte is read).
#[derive(Debug)]
struct Spread {
    /// The connections each worker serves now (worker `w` at `w - 1`).
    loads: Arc<[AtomicUsize]>,
    /// Per listener, per worker: where a connection handed to that worker goes.
    to: Vec<Vec<mpsc::UnboundedSender<Handed>>>,
}

/// A connection accepted by one worker for another to serve.
#[derive(Debug)]
pub(crate) struct Handed {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    slot: Slot,
}

/// The receiving ends of the hand-overs: per worker, per listener.
pub(crate) type HandedTo = Vec<Vec<mpsc::UnboundedReceiver<Handed>>>;

impl Hub {
    /// A hub serving `state`, with `max_conns` client connection slots, for `workers` worker
    /// threads and `listeners` client listeners; with more than one worker, also what each
    /// worker receives of the connections the others hand over (see [`Spread`]).
    pub(crate) fn new(
        state: State,
        max_conns: usize,
        workers: usize,
        listeners: usize,
    ) -> (Self, HandedTo) {
        let mut handed: HandedTo = (0..workers).map(|_| Vec::new()).collect();
        let spread = (workers > 1).then(|| {
            let to = (0..listeners)
                .map(|_| {
                    handed
                        .iter_mut()
                        .map(|mine| {
                            let (tx, rx) = mpsc::unbounded_channel();
                            mine.push(rx);
                            tx
                        })
                        .collect()
                })
                .collect();
            let loads = (0..workers).map(|_| AtomicUsize::new(0)).collect();
            Spread { loads, to }
        });
        let hub = Hub {
            state: ArcSwap::from_pointee(state),
            conns: Arc::new(Semaphore::new(max_conns)),
            max_conns,
            open: Arc::default(),
            spread,
            defences: Defences::default(),
        };
        (hub, handed)
    }

    /// The client connections each worker thread serves now (empty with one worker).
    pub(crate) fn worker_connections(&self) -> Vec<usize> {
        self.spread.as_ref().map_or_else(Vec::new, |s| {
            s.loads.iter().map(|l| l.load(Ordering::Relaxed)).collect()
        })
    }

    /// Where a connection of listener `listener` accepted on this thread is served: `Some` to
    /// serve it here, `None` when it was handed to a less loaded worker (see [`Spread`]).
    pub(crate) fn place(
        &self,
        listener: usize,
        (stream, peer, mut slot): (TcpStream, SocketAddr, Slot),
    ) -> Option<(TcpStream, SocketAddr, Slot)> {
        let Some(spread) = &self.spread else {
            return Some((stream, peer, slot));
        };
        let loads = &spread.loads;
        let here = crate::worker::index().wrapping_sub(1).min(loads.len() - 1);
        let (least, fewest) = loads
            .iter()
            .map(|l| l.load(Ordering::Relaxed))
            .enumerate()
            .min_by_key(|&(_, n)| n)
            .unwrap_or((here, 0));
        let to = if loads[here].load(Ordering::Relaxed) > fewest {
            least
        } else {
            here
        };
        loads[to].fetch_add(1, Ordering::Relaxed);
        slot.load = Some((loads.clone(), to));
        if to == here {
            return Some((stream, peer, slot));
        }
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "a connection could not be handed over");
                return None;
            }
        };
        // Refused only when that worker's loop has ended: the proxy is shutting down, and
        // this worker's loop too; the connection closes unread, as one accepted then would.
        let _ = spread.to[listener][to].send(Handed { stream, peer, slot });
        None
    }

    /// Client connections open now, and the most allowed at once.
    pub(crate) fn client_connections(&self) -> (usize, usize) {
        (self.open.load(Ordering::Relaxed), self.max_conns)
    }

    /// Wait for a client connection slot and a connection on `listener`; `None` at shutdown.
    pub(crate) async fn accept(
        &self,
        listener: &TcpListener,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<(TcpStream, SocketAddr, Slot)> {
        let (stream, peer, permit) = accept(listener, &self.conns, shutdown).await?;
        self.open.fetch_add(1, Ordering::Relaxed);
        let slot = Slot {
            _permit: permit,
            open: self.open.clone(),
            load: None,
        };
        Some((stream, peer, slot))
    }
}

/// Where one listener's loop on one thread gets its connections: its socket, and the
/// connections other workers hand to this one (see [`Spread`]).
#[derive(Debug)]
pub(crate) struct Arrivals {
    listener: TcpListener,
    /// The listener's place in the configuration.
    pub(crate) index: usize,
    handed: Option<mpsc::UnboundedReceiver<Handed>>,
}

impl Arrivals {
    /// Listener `index`'s `listener`, and what other workers hand over (`handed`).
    pub(crate) fn new(
        listener: TcpListener,
        index: usize,
        handed: Option<mpsc::UnboundedReceiver<Handed>>,
    ) -> Self {
        Arrivals {
            listener,
            index,
            handed,
        }
    }

    /// The next connection for this thread to serve: accepted here (and kept, see
    /// [`Hub::place`]) or handed over by another worker; `None` at shutdown.
    pub(crate) async fn next(
        &mut self,
        hub: &Hub,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<(TcpStream, SocketAddr, Slot)> {
        loop {
            let handed = &mut self.handed;
            let from_others = async {
                match handed.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                accepted = hub.accept(&self.listener, shutdown) => {
                    if let Some(kept) = hub.place(self.index, accepted?) {
                        return Some(kept);
                    }
                }
                got = from_others => match got {
                    Some(Handed { stream, peer, slot }) => {
                        if let Ok(stream) = TcpStream::from_std(stream) {
                            return Some((stream, peer, slot));
                        }
                    }
                    None => self.handed = None,
                },
            }
        }
    }
}

/// An open client connection's place under `max_connections`.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
    /// The worker loads and the worker serving it (with several workers).
    load: Option<(Arc<[AtomicUsize]>, usize)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        if let Some((loads, w)) = &self.load {
            loads[*w].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Wait for a permit of `permits` and a connection; `None` at shutdown. Every listener's loop:
/// the client listeners' through [`Hub::accept`], the admin API's with its own permits.
pub(crate) async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.ok()?,
            _ = shutdown.changed() => return None,
        };
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return None,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return Some((stream, peer, permit));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// What a client connection holds while it lives: its slot under `max_connections` and a
/// receiver that makes the drain wait for it. An upgraded connection's tunnel takes it over
/// from hyper's connection.
#[derive(Clone, Debug)]
pub(crate) struct ConnHold {
    _slot: Arc<Slot>,
    drain: watch::Receiver<bool>,
    limits: Arc<Limits>,
}

impl ConnHold {
    /// The hold of a connection in `slot`, accepted under `limits`; `drain` is the proxy's
    /// shutdown signal.
    pub(crate) fn new(slot: Slot, drain: watch::Receiver<bool>, limits: Arc<Limits>) -> Self {
        ConnHold {
            _slot: Arc::new(slot),
            drain,
            limits,
        }
    }

    /// The limits the connection was accepted under.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether the proxy is shutting down (no new tunnels then).
    pub(crate) fn draining(&self) -> bool {
        *self.drain.borrow() || self.drain.has_changed().is_err()
    }

    /// Resolves when the proxy is gone (after the drain; the tunnel ends then).
    pub(crate) async fn proxy_gone(mut self) {
        while self.drain.changed().await.is_ok() {}
    }
}
