//! What every listener — both HTTP engines, the TCP relay, the admin API — takes from below:
//! the [`Hub`] (the live [`State`] and the client connection slots), a connection's [`Slot`]
//! and [`ConnHold`], and the accept loop that hands out both.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

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
}

impl Hub {
    /// A hub serving `state`, with `max_conns` client connection slots.
    pub(crate) fn new(state: State, max_conns: usize) -> Self {
        Hub {
            state: ArcSwap::from_pointee(state),
            conns: Arc::new(Semaphore::new(max_conns)),
            max_conns,
            open: Arc::default(),
        }
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
        };
        Some((stream, peer, slot))
    }
}

/// An open client connection's place under `max_connections`.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
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
