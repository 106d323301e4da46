//! Keep-alive pools of upstream HTTP/1.1 connections, one per thread, driven by the task of the
//! request that uses them.
//!
//! hyper-util's legacy `Client` runs each upstream connection in a task of its own: a request
//! crossed a channel to that task and its response came back through another, the pool's mutex
//! was taken at checkout and checkin, and a task was spawned per response to return the
//! connection to the pool once its body was read. Here a request checks a connection out of its
//! thread's pool (a `RefCell`, no lock), polls hyper's `Connection` future itself while it waits
//! for the response and reads the body (so writing the request, reading the answer and relaying
//! it happen in one task, as in nginx's event loop), and puts it back when the body has ended.
//!
//! An idle connection is not polled; one that the upstream closed meanwhile is found at checkout
//! (its future resolves), and a request that a just-closed connection refused is sent again on a
//! new one. Idle connections older than [`IDLE_TIMEOUT`] are closed by the next checkin (a sweep
//! at most once per [`SWEEP_EVERY`] per thread).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use lbkit_core::{Clock, Timestamp};
use tokio::net::TcpStream;

use crate::service::{Service, UpstreamBody};

/// How long an idle upstream connection stays pooled (nginx's `keepalive_timeout` default is
/// 60 s; upstream servers commonly close at 60–75 s, so 50 s avoids racing their close).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(50);

/// How often a thread's pools are swept for expired or closed idle connections, at most.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

type Conn = http1::Connection<TokioIo<TcpStream>, UpstreamBody>;

thread_local! {
    static POOLS: RefCell<Pools> = RefCell::new(Pools::default());
}

/// This thread's idle connections: by service id, then by endpoint address.
#[derive(Default)]
struct Pools {
    services: HashMap<u64, HashMap<Arc<str>, Vec<Idle>>>,
    swept: Option<Timestamp>,
}

struct Idle {
    lease: Lease,
    since: Timestamp,
}

/// An upstream connection checked out of a pool: hyper's request handle and the connection's
/// future, polled by whoever holds the lease.
pub(crate) struct Lease {
    send: http1::SendRequest<UpstreamBody>,
    conn: Pin<Box<Conn>>,
    /// The connection's future has resolved: closed or failed.
    done: bool,
    service: u64,
    address: Arc<str>,
    /// The service's clock (idle times).
    clock: Clock,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("address", &self.address)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// Why an upstream exchange failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendError {
    /// No connection could be made (the request never left).
    Connect,
    /// The connection failed during the exchange.
    Other,
}

// === impl Lease ===

impl Lease {
    /// Poll the connection: it writes the request, reads the response and feeds its body.
    pub(crate) fn poll_conn(&mut self, cx: &mut Context<'_>) {
        if !self.done && self.conn.as_mut().poll(cx).is_ready() {
            self.done = true;
        }
    }

    /// Run `fut` while driving the connection.
    ///
    /// Two rounds per wakeup: reading a response takes the connection and its reader turns
    /// about (the body's reader asks for data, then the connection hands it over), and a second
    /// round saves a trip through the scheduler's queue for each of them.
    pub(crate) async fn drive<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = pin!(fut);
        poll_fn(|cx| {
            for _ in 0..2 {
                self.poll_conn(cx);
                if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                    return Poll::Ready(out);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// The exchange is over (its response body ended): back to this thread's pool when the
    /// connection can take another request, else closed.
    pub(crate) fn release(mut self) {
        // Let the connection finish the exchange and ask for the next request.
        self.poll_conn(&mut Context::from_waker(Waker::noop()));
        if self.done || !self.send.is_ready() {
            return;
        }
        let now = self.clock.now();
        POOLS.with_borrow_mut(|pools| {
            let sweep = pools
                .swept
                .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY);
            if sweep {
                pools.swept = Some(now);
                pools.sweep(now);
            }
            pools
                .services
                .entry(self.service)
                .or_default()
                .entry(self.address.clone())
                .or_default()
                .push(Idle {
                    lease: self,
                    since: now,
                });
        });
    }
}

// === impl Pools ===

impl Pools {
    /// Close idle connections that expired or that their upstream closed.
    fn sweep(&mut self, now: Timestamp) {
        let mut cx = Context::from_waker(Waker::noop());
        self.services.retain(|_, endpoints| {
            endpoints.retain(|_, idle| {
                idle.retain_mut(|i| {
                    i.lease.poll_conn(&mut cx);
                    !i.lease.done && now.saturating_duration_since(i.since) < IDLE_TIMEOUT
                });
                !idle.is_empty()
            });
            !endpoints.is_empty()
        });
    }
}

/// An idle connection of `service` to `address` from this thread's pool (the most recently
/// used first), checked to be still open.
fn checkout(service: u64, address: &str, now: Timestamp) -> Option<Lease> {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let idle = POOLS.with_borrow_mut(|pools| {
            let list = pools.services.get_mut(&service)?.get_mut(address)?;
            let idle = list.pop()?;
            if now.saturating_duration_since(idle.since) >= IDLE_TIMEOUT {
                // The rest are older still.
                list.clear();
                return None;
            }
            Some(idle)
        })?;
        let mut lease = idle.lease;
        lease.poll_conn(&mut cx);
        if !lease.done && lease.send.is_ready() {
            return Some(lease);
        }
    }
}

/// A new connection of `service` to `address` (`host:port`).
async fn connect(
    service: u64,
    address: &str,
    timeout: Duration,
    clock: &Clock,
) -> Result<Lease, SendError> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(address))
        .await
        .map_err(|_| SendError::Connect)?
        .map_err(|_| SendError::Connect)?;
    let _ = stream.set_nodelay(true);
    let (send, conn) = http1::Builder::new()
        // `send(2)` of one flat buffer rather than `writev(2)` (see the server's builder).
        .writev(false)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|_| SendError::Connect)?;
    Ok(Lease {
        send,
        conn: Box::pin(conn),
        done: false,
        service,
        address: Arc::from(address),
        clock: clock.clone(),
    })
}

/// Send `req` to `address` on a pooled connection of `service` (or a new one), and wait for the
/// response's head. The lease returned carries the connection that must be driven while the
/// body is read, then released.
pub(crate) async fn send(
    service: &Service,
    address: &str,
    now: Timestamp,
    mut req: Request<UpstreamBody>,
) -> Result<(Response<Incoming>, Lease), SendError> {
    let id = service.id();
    loop {
        let (mut lease, fresh) = match checkout(id, address, now) {
            Some(lease) => (lease, false),
            None => {
                let timeout = service.connect_timeout();
                (connect(id, address, timeout, service.clock()).await?, true)
            }
        };
        // Let the other ready tasks run first, so that this thread's writes to upstreams go
        // out together at the end of the scheduler's round (an upstream woken once then reads
        // many requests), as they did when each connection had its own task.
        tokio::task::yield_now().await;
        let sent = lease.send.try_send_request(req);
        match lease.drive(sent).await {
            Ok(resp) => return Ok((resp, lease)),
            Err(mut e) => match e.take_message() {
                // A pooled connection that closed as the request came: it never left; send it
                // on a new connection.
                Some(r) if !fresh => req = r,
                _ => return Err(SendError::Other),
            },
        }
    }
}

/// Drive `lease` (if any) around a poll of `inner`.
pub(crate) fn poll_with<T>(
    lease: &mut Option<Lease>,
    cx: &mut Context<'_>,
    inner: impl FnOnce(&mut Context<'_>) -> Poll<T>,
) -> Poll<T> {
    if let Some(l) = lease {
        l.poll_conn(cx);
    }
    inner(cx)
}
