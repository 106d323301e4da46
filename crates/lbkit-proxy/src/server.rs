//! Listeners: the HTTP/1.1 + h2c server (hyper-util's auto builder) with its limits, the TCP
//! relay, and the [`Proxy`] handle that starts, reloads and drains them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::body::ProxyBody;
use crate::config::{Config, Limits, Protocol};
use crate::error::ProxyError;
use crate::forward::{self, CallOptions};
use crate::state::State;
use crate::{admin, h1, tcp};

/// Pause after a failed `accept` (out of file descriptors): retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// What every listener shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: ArcSwap<State>,
    /// One permit per client connection (tunnels included), all listeners; an accept loop
    /// takes its permit before it waits.
    conns: Arc<Semaphore>,
    /// `limits.max_connections` at start (a reload does not change it).
    max_conns: usize,
    /// Client connections open.
    open: Arc<AtomicUsize>,
}

impl Shared {
    /// Client connections open now, and the most allowed at once.
    pub(crate) fn client_connections(&self) -> (usize, usize) {
        (self.open.load(Ordering::Relaxed), self.max_conns)
    }

    /// The slot of an accepted connection: its permit, counted as open until dropped.
    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        self.open.fetch_add(1, Ordering::Relaxed);
        Slot {
            _permit: permit,
            open: self.open.clone(),
        }
    }
}

/// An open client connection's place under `max_connections`.
#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A running proxy. Dropping it stops its worker threads; call [`Proxy::shutdown`] to drain.
#[derive(Debug)]
pub struct Proxy {
    shared: Arc<Shared>,
    listeners: Vec<SocketAddr>,
    admin: SocketAddr,
    shutdown: watch::Sender<bool>,
    /// Tells worker threads to drop their runtimes (after the drain).
    exit: watch::Sender<bool>,
    accept: Vec<JoinHandle<()>>,
    workers: usize,
}

// === impl Proxy ===

impl Proxy {
    /// Bind every listener of `config` and the admin listener, start the services, and serve
    /// on the calling runtime.
    ///
    /// # Errors
    /// A listener that cannot bind, a source that cannot start.
    pub async fn start(config: Config) -> Result<Proxy, ProxyError> {
        Proxy::start_workers(config, 1).await
    }

    /// Like [`Proxy::start`], with `workers` worker threads when `workers > 1`: nginx's model.
    /// Each worker runs its own current-thread runtime, its own listening sockets
    /// (`SO_REUSEPORT`: the kernel spreads connections) and its own upstream pools, so a request
    /// never hops threads. The admin API and the services' upkeep stay on the calling runtime.
    ///
    /// # Errors
    /// A listener that cannot bind, a source that cannot start.
    pub async fn start_workers(config: Config, workers: usize) -> Result<Proxy, ProxyError> {
        let workers = workers.max(1);
        let (shutdown, _) = watch::channel(false);
        let (exit, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            conns: Arc::new(Semaphore::new(config.limits.max_connections)),
            max_conns: config.limits.max_connections,
            open: Arc::default(),
            state: ArcSwap::from_pointee(State::build(config.clone(), None, workers)?),
        });
        let mut listeners = Vec::new();
        let mut accept = Vec::new();
        let mut sockets: Vec<Vec<(usize, std::net::TcpListener)>> =
            (0..workers).map(|_| Vec::new()).collect();
        for (i, l) in config.listeners.iter().enumerate() {
            let mut addr = l.bind;
            for (w, mine) in sockets.iter_mut().enumerate() {
                let listener = bind(addr, workers > 1)?;
                addr = local_addr(&listener, l.bind)?;
                if w == 0 {
                    listeners.push(addr);
                }
                if workers == 1 {
                    let job = listen(listener, i, &config, &shared, &shutdown);
                    accept.push(tokio::spawn(job));
                } else {
                    let std = listener
                        .into_std()
                        .map_err(|source| ProxyError::Bind { addr, source })?;
                    mine.push((i, std));
                }
            }
        }
        if workers == 1 {
            tokio::spawn(crate::h1::sweep_idle(Arc::downgrade(&shared)));
        } else {
            for (w, mine) in sockets.into_iter().enumerate() {
                let job = Worker {
                    index: w,
                    sockets: mine,
                    config: config.clone(),
                    shared: shared.clone(),
                    shutdown: shutdown.clone(),
                    exit: exit.subscribe(),
                };
                std::thread::Builder::new()
                    .name(format!("lbkit-worker-{w}"))
                    .spawn(move || job.run())
                    .map_err(|source| ProxyError::Bind {
                        addr: config.admin.bind,
                        source,
                    })?;
            }
        }
        let admin_listener = bind(config.admin.bind, false)?;
        let admin = local_addr(&admin_listener, config.admin.bind)?;
        let job = admin::serve(admin_listener, shared.clone(), shutdown.subscribe());
        accept.push(tokio::spawn(job));
        tracing::info!(?listeners, %admin, workers, "lbkit proxy listening");
        Ok(Proxy {
            shared,
            listeners,
            admin,
            shutdown,
            exit,
            accept,
            workers,
        })
    }

    /// Promise that the calling thread drives a current-thread runtime for its whole life (it
    /// built the runtime and `block_on`s it until the end, as `lbkit proxy` does), so that
    /// connections served on it may use the HTTP/1.1 fast path's write gate: the upstream
    /// writes of a scheduler round go out grouped by upstream, and each backend wakes once for
    /// several requests. The worker threads of [`Proxy::start_workers`] do this themselves.
    /// Call it on that thread before starting the proxy; without it, requests served on the
    /// calling runtime yield plainly (correct on any runtime, a few percent slower).
    pub fn pin_runtime_thread() {
        crate::h1::pin_runtime_thread();
    }

    /// The bound addresses of the listeners, in configuration order.
    pub fn listeners(&self) -> &[SocketAddr] {
        &self.listeners
    }

    /// The bound address of the admin listener.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// Switch to `config`: routes and services change at once for new requests; services whose
    /// configuration is unchanged keep running (statistics, health, ejections). Listener and
    /// limit changes need a restart and are logged as such.
    ///
    /// # Errors
    /// A source that cannot start; the running configuration stays.
    pub fn reload(&self, config: Config) -> Result<(), ProxyError> {
        let current = self.shared.state.load_full();
        let (old, new) = (&current.config, &config);
        if old.listeners != new.listeners || old.limits != new.limits || old.admin != new.admin {
            tracing::warn!("listener, admin and limit changes take effect at the next restart");
        }
        let next = State::build(config, Some(&current), self.workers)?;
        self.shared.state.store(Arc::new(next));
        tracing::info!("configuration reloaded");
        Ok(())
    }

    /// Stop accepting, let connections finish their requests, and wait for them at most
    /// `drain`. Returns whether every connection finished in time.
    pub async fn shutdown(self, drain: Duration) -> bool {
        let _ = self.shutdown.send(true);
        for a in &self.accept {
            a.abort();
        }
        let drained = tokio::time::timeout(drain, self.shutdown.closed())
            .await
            .is_ok();
        if !drained {
            tracing::warn!(?drain, "drain timeout: closing the remaining connections");
        }
        let _ = self.exit.send(true);
        drained
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.exit.send(true);
    }
}

/// One worker thread's share of the listeners.
struct Worker {
    index: usize,
    sockets: Vec<(usize, std::net::TcpListener)>,
    config: Config,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    exit: watch::Receiver<bool>,
}

// === impl Worker ===

impl Worker {
    fn run(mut self) {
        crate::service::set_worker_index(self.index + 1);
        // This thread builds its runtime and drives it until the end.
        crate::h1::pin_runtime_thread();
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(worker = self.index, error = %e, "cannot start a worker runtime");
                return;
            }
        };
        runtime.block_on(async move {
            for (i, socket) in std::mem::take(&mut self.sockets) {
                match TcpListener::from_std(socket) {
                    Ok(l) => {
                        tokio::spawn(listen(l, i, &self.config, &self.shared, &self.shutdown));
                    }
                    Err(e) => tracing::error!(worker = self.index, error = %e, "listener lost"),
                }
            }
            tokio::spawn(crate::h1::sweep_idle(Arc::downgrade(&self.shared)));
            // Connections run on this runtime: keep it until the drain is over.
            let _ = self.exit.wait_for(|&exit| exit).await;
        });
    }
}

/// The accept loop of listener `i` of `config`.
fn listen(
    listener: TcpListener,
    i: usize,
    config: &Config,
    shared: &Arc<Shared>,
    shutdown: &watch::Sender<bool>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    let (shared, rx) = (shared.clone(), shutdown.subscribe());
    match config.listeners[i].protocol {
        Protocol::Http => Box::pin(serve_http(listener, shared, config.limits.clone(), rx)),
        Protocol::Tcp => Box::pin(serve_tcp(listener, i, shared, rx)),
    }
}

fn local_addr(listener: &TcpListener, addr: SocketAddr) -> Result<SocketAddr, ProxyError> {
    listener
        .local_addr()
        .map_err(|source| ProxyError::Bind { addr, source })
}

/// Listen on `addr` (with `SO_REUSEPORT` when several workers share it).
fn bind(addr: SocketAddr, reuse_port: bool) -> Result<TcpListener, ProxyError> {
    let err = |source| ProxyError::Bind { addr, source };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    if reuse_port {
        socket.set_reuseport(true).map_err(err)?;
    }
    socket.bind(addr).map_err(err)?;
    // tokio's `TcpListener::bind` backlog.
    socket.listen(1024).map_err(err)
}

/// Wait for a connection slot and a connection; `None` at shutdown.
pub(crate) async fn accept(
    listener: &TcpListener,
    conns: &Arc<Semaphore>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    loop {
        let permit = tokio::select! {
            p = conns.clone().acquire_owned() => p.ok()?,
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

async fn serve_http(
    listener: TcpListener,
    shared: Arc<Shared>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms))
        // One flat buffer per write: `send(2)` rather than `writev(2)`, which goes through the
        // VFS layer (file position lock, iovec import) on every write.
        .writev(false)
        .max_headers(limits.max_headers)
        .max_buf_size(limits.max_header_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let builder = Arc::new(builder);
    let limits = Arc::new(limits);
    while let Some((stream, peer, permit)) = accept(&listener, &shared.conns, &mut shutdown).await {
        let (shared, builder, limits) = (shared.clone(), builder.clone(), limits.clone());
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let slot = shared.slot(permit);
            // Plain HTTP/1.1 first; hyper takes over a connection the fast path hands it.
            let (stream, read) =
                match h1::serve(stream, peer, &shared, &limits, &mut shutdown).await {
                    h1::End::Closed => return,
                    h1::End::Handover(stream, read) => (stream, read),
                };
            // A write stalled for the longest route timeout fails (the fast path gives each
            // write its route's timeout; hyper's connection serves every route).
            let stall = shared
                .state
                .load()
                .config
                .routes
                .iter()
                .map(|r| r.timeout_ms)
                .max();
            let stall = Duration::from_millis(
                stall.unwrap_or_else(crate::config::default_route_timeout_ms),
            );
            // An upgrade request carries the connection's slot and drain marker, for the
            // tunnel that outlives hyper's connection.
            let hold = ConnHold {
                _slot: Arc::new(slot),
                drain: shutdown.clone(),
                limits: limits.clone(),
            };
            let svc = service_fn(move |mut req: Request<Incoming>| {
                if req.headers().contains_key(http::header::UPGRADE) {
                    req.extensions_mut().insert(hold.clone());
                }
                handle(shared.clone(), peer, req)
            });
            let io = TokioIo::new(h1::Rewind::new(read, stream, stall));
            // Boxed: most connections never get here, and their tasks stay small.
            let mut conn = Box::pin(builder.serve_connection_with_upgrades(io, svc));
            tokio::select! {
                // The connection first: it may hold a request the fast path already read,
                // which a graceful shutdown before hyper has seen it would drop.
                biased;
                _ = conn.as_mut() => {}
                _ = shutdown.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
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

async fn handle(
    shared: Arc<Shared>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let state = shared.state.load_full();
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    let Some(route) = state.route(host, req.uri().path()) else {
        return Ok(forward::local(StatusCode::NOT_FOUND, "no route\n"));
    };
    let service = &route.service;
    let started = service.clock().now();
    service.metrics().start();
    let opts = CallOptions {
        policy: route.policy,
        hash_key: route.hash_key.as_ref(),
        client: peer,
    };
    let resp = forward::forward(service, req, opts).await;
    let elapsed = service.clock().now().saturating_duration_since(started);
    service
        .metrics()
        .finish(elapsed, resp.status().is_server_error());
    Ok(resp)
}

async fn serve_tcp(
    listener: TcpListener,
    index: usize,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    while let Some((stream, _peer, permit)) = accept(&listener, &shared.conns, &mut shutdown).await
    {
        let Some(service) = shared.state.load().tcp_service(index).cloned() else {
            continue;
        };
        // Holding a receiver marks the connection as one to drain at shutdown.
        let (slot, drain) = (shared.slot(permit), shutdown.clone());
        tokio::spawn(async move {
            let (_slot, _drain) = (slot, drain);
            tcp::relay(stream, &service).await;
        });
    }
}
