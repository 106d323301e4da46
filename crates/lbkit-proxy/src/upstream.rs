//! The HTTP/1.1 upstream client of hyper's engine and of the HTTP/2 server (the fast path keeps
//! its own connections, `h1/pool.rs`): hyper_util's pooled client, with its idle connections
//! bounded per endpoint (`upstream_max_idle`), over a [`Connector`] whose connects finish even
//! when nobody waits for them any more.
//!
//! Why: hyper_util drops a connect in progress with the request that started it. An HTTP/2
//! client that opens streams and resets each one a round trip later (the paced rapid reset)
//! so had the proxy open an upstream connection per stream and close it again unused: about
//! 6 000 a second from one client connection, which filled the backend's accept queue until
//! other clients' connects timed out. Here the connect runs in a task of its own; one that
//! finishes after its request went is kept, spare, for the next request to that endpoint, so a
//! storm of short streams reuses connections instead of making new ones.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// A boxed error, as hyper_util takes a connector's.
pub type ConnectError = Box<dyn std::error::Error + Send + Sync>;

/// hyper_util's HTTP connector, with connects that outlive their request: see the module docs.
#[derive(Clone, Debug)]
pub struct Connector {
    inner: HttpConnector,
    spares: Arc<Spares>,
}

/// Spare connections by endpoint address, each with the time it was put there.
type ByAddress = HashMap<Box<str>, Vec<(TcpStream, Instant)>>;

/// Connections made after their request went, by endpoint address, until taken or expired.
#[derive(Debug)]
struct Spares {
    #[allow(clippy::disallowed_types)] // taken only around a connect, never on the pick path
    idle: std::sync::Mutex<ByAddress>,
    /// How long one is kept (`upstream_idle_timeout_ms`).
    idle_for: Duration,
    /// How many are kept per address (`upstream_max_idle`).
    max: usize,
}

impl Connector {
    /// Connect with `inner`; keep spare connections for `idle_for`, at most `max` per address.
    pub(crate) fn new(inner: HttpConnector, idle_for: Duration, max: usize) -> Self {
        Connector {
            inner,
            spares: Arc::new(Spares {
                idle: Default::default(),
                idle_for,
                max,
            }),
        }
    }
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let address: Box<str> = dst.authority().map_or("", |a| a.as_str()).into();
        if let Some(spare) = self.spares.take(&address) {
            return Box::pin(std::future::ready(Ok(TokioIo::new(spare))));
        }
        let connecting = self.inner.call(dst);
        let (tx, rx) = oneshot::channel();
        let spares = self.spares.clone();
        tokio::spawn(async move {
            if let Err(Ok(io)) = tx.send(connecting.await) {
                // Its request went meanwhile: keep it for the next one.
                spares.put(address, io.into_inner());
            }
        });
        Box::pin(async move {
            match rx.await {
                Ok(made) => made.map_err(Into::into),
                Err(_) => Err("the connect task ended".into()),
            }
        })
    }
}

impl Spares {
    #[allow(clippy::disallowed_types)] // see the field
    fn lock(&self) -> std::sync::MutexGuard<'_, ByAddress> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A spare connection to `address` that is neither expired nor closed by its peer.
    fn take(&self, address: &str) -> Option<TcpStream> {
        let now = Instant::now();
        let mut idle = self.lock();
        self.sweep(&mut idle, now);
        let list = idle.get_mut(address)?;
        while let Some((stream, _)) = list.pop() {
            if still_open(&stream) {
                return Some(stream);
            }
        }
        idle.remove(address);
        None
    }

    /// Keep `stream`, unless `max` are kept for its address.
    fn put(&self, address: Box<str>, stream: TcpStream) {
        let now = Instant::now();
        let mut idle = self.lock();
        self.sweep(&mut idle, now);
        let list = idle.entry(address).or_default();
        if list.len() < self.max {
            list.push((stream, now));
        }
    }

    /// Close the spares past `idle_for`, of every address (one whose endpoint left keeps none
    /// beyond the next take or put). Spares are few, and both are rare: on the connect path.
    fn sweep(&self, idle: &mut ByAddress, now: Instant) {
        idle.retain(|_, list| {
            list.retain(|(_, since)| now.saturating_duration_since(*since) < self.idle_for);
            !list.is_empty()
        });
    }
}

/// Whether an idle connection is still open with nothing unasked to read. Usually answered by
/// the readiness the runtime already knows (polled with a no-op waker: nobody waits on it), no
/// system call; only when the last read left readiness set does a one-byte read check.
pub(crate) fn still_open(stream: &TcpStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    if stream.poll_read_ready(&mut cx).is_pending() {
        return true;
    }
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::Service as _;

    /// A connect whose caller gave up is kept and handed to the next call to that address,
    /// which makes no new connection.
    #[tokio::test]
    async fn a_connect_nobody_waits_for_is_kept_for_the_next_call() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let uri: Uri = format!("http://{addr}/").parse().expect("uri");
        let mut c = Connector::new(HttpConnector::new(), Duration::from_secs(60), 4);
        // Started, then dropped before it could finish.
        drop(c.call(uri.clone()));
        let (_first, _) = listener.accept().await.expect("the connect arrives");
        let kept = tokio::time::timeout(Duration::from_secs(10), async {
            while c
                .spares
                .lock()
                .get(&*addr.to_string())
                .is_none_or(Vec::is_empty)
            {
                tokio::task::yield_now().await;
            }
        });
        kept.await
            .expect("the finished connect kept within the bound");
        let io = c.call(uri.clone()).await.expect("the spare");
        assert_eq!(io.inner().peer_addr().expect("peer"), addr);
        assert!(c.spares.take(&addr.to_string()).is_none(), "taken");
        // Nothing else connected.
        let more = tokio::time::timeout(Duration::from_millis(50), listener.accept()).await;
        assert!(more.is_err(), "no second connection");
    }

    /// At most `max` spares are kept per address; spares past their idle limit or closed by
    /// the peer are not handed out.
    #[tokio::test]
    async fn spares_are_bounded_and_expired_or_closed_ones_dropped() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let key = addr.to_string();
        let spares = |idle_for| Spares {
            idle: Default::default(),
            idle_for,
            max: 2,
        };
        let kept = spares(Duration::from_secs(60));
        for _ in 0..3 {
            let s = TcpStream::connect(addr).await.expect("connect");
            kept.put(key.clone().into(), s);
        }
        assert_eq!(kept.lock()[&*key].len(), 2, "at most max kept");
        assert!(kept.take(&key).is_some(), "an open one is handed out");
        // One the peer closed, once its end has arrived.
        let closed = spares(Duration::from_secs(60));
        let s = TcpStream::connect(addr).await.expect("connect");
        let mut peers = Vec::new();
        loop {
            let (peer, _) = listener.accept().await.expect("accept");
            if peer.peer_addr().ok() == s.local_addr().ok() {
                drop(peer);
                break;
            }
            peers.push(peer);
        }
        tokio::time::timeout(Duration::from_secs(10), s.readable())
            .await
            .expect("the end arrives within the bound")
            .expect("readable");
        closed.put(key.clone().into(), s);
        assert!(
            closed.take(&key).is_none(),
            "a closed spare is not handed out"
        );
        let expired = spares(Duration::ZERO);
        let s = TcpStream::connect(addr).await.expect("connect");
        expired.put(key.clone().into(), s);
        assert!(
            expired.take(&key).is_none(),
            "an expired spare is not handed out"
        );
    }
}
