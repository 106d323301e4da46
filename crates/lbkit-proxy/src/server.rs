//! Listeners: the HTTP/1.1 fast path, the HTTP/2 server (`h2s/`) and hyper's HTTP/1 server behind them, with their limits, the TCP
//! relay, and the [`Proxy`] handle that starts, reloads and drains them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use lbkit_core::{Clock, Timestamp};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::body::{Inbound, ProxyBody};
use crate::config::{Config, Limits, Protocol};
use crate::error::ProxyError;
use crate::forward;
use crate::hub::{Arrivals, ConnHold, Defences, Handed, Hub, Slot};
use crate::state::State;
use crate::watchdog::{self, Activity, BusyBody, Expired};
use crate::{admin, h1, h2s, tcp, worker};

/// A running proxy. Dropping it stops its worker threads; call [`Proxy::shutdown`] to drain.
#[derive(Debug)]
pub struct Proxy {
    hub: Arc<Hub>,
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
    /// (`SO_REUSEPORT`: the kernel spreads connections, and a worker serving more than the least
    /// loaded one hands a new connection over before reading it) and its own upstream pools, so
    /// a request never hops threads. The admin API and the services' upkeep stay on the calling runtime.
    ///
    /// # Errors
    /// A listener that cannot bind, a source that cannot start.
    pub async fn start_workers(config: Config, workers: usize) -> Result<Proxy, ProxyError> {
        let workers = workers.max(1);
        let (shutdown, _) = watch::channel(false);
        let (exit, _) = watch::channel(false);
        let state = State::build(config.clone(), None, workers)?;
        let (hub, handed) = Hub::new(
            state,
            config.limits.max_connections,
            workers,
            config.listeners.len(),
        );
        let hub = Arc::new(hub);
        let mut accept = Vec::new();
        let (listeners, sockets) = bind_all(&config, workers, &hub, &shutdown, &mut accept)?;
        if workers == 1 {
            tokio::spawn(h1::sweep_idle(Arc::downgrade(&hub)));
        } else {
            for ((w, mine), handed) in sockets.into_iter().enumerate().zip(handed) {
                let job = Worker {
                    index: w,
                    sockets: mine,
                    handed,
                    config: config.clone(),
                    hub: hub.clone(),
                    shutdown: shutdown.clone(),
                    exit: exit.subscribe(),
                };
                job.spawn(config.admin.bind)?;
            }
        }
        let admin_listener = bind(config.admin.bind, false)?;
        let admin = local_addr(&admin_listener, config.admin.bind)?;
        let job = admin::serve(admin_listener, hub.clone(), shutdown.subscribe());
        accept.push(tokio::spawn(job));
        tracing::info!(?listeners, %admin, workers, "lbkit proxy listening");
        Ok(Proxy {
            hub,
            listeners,
            admin,
            shutdown,
            exit,
            accept,
            workers,
        })
    }

    /// The client connections each worker thread serves now, worker 1 first (empty with one
    /// worker). They are kept even: a worker that accepts a connection while it serves more
    /// than the least loaded one hands it over, as HAProxy dispatches to its least loaded
    /// thread; the kernel's `SO_REUSEPORT` hash alone splits few connections unevenly.
    pub fn worker_connections(&self) -> Vec<usize> {
        self.hub.worker_connections()
    }

    /// Promise that the calling thread drives a current-thread runtime for its whole life (it
    /// built the runtime and `block_on`s it until the end, as `lbkit proxy` does), so that
    /// connections served on it may use the HTTP/1.1 fast path's write gate: the upstream
    /// writes of a scheduler round go out grouped by upstream, and each backend wakes once for
    /// several requests. The worker threads of [`Proxy::start_workers`] do this themselves.
    /// Call it on that thread before starting the proxy; without it, requests served on the
    /// calling runtime yield plainly (correct on any runtime, a few percent slower).
    pub fn pin_runtime_thread() {
        h1::pin_runtime_thread();
    }

    /// The bound addresses of the listeners, in configuration order.
    pub fn listeners(&self) -> &[SocketAddr] {
        &self.listeners
    }

    /// The running service `name` (its balancer, metrics, trace recorder).
    pub fn service(&self, name: &str) -> Option<Arc<crate::Service>> {
        self.hub.state.load().service(name).cloned()
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
        self.reloader()
            .reload_since(config, Clock::System.now())
            .map(drop)
    }

    /// What a reload needs of this proxy, for another thread.
    pub(crate) fn reloader(&self) -> Reloader {
        Reloader {
            hub: self.hub.clone(),
            workers: self.workers,
        }
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
    /// Per listener: the connections other workers hand to this one.
    handed: Vec<mpsc::UnboundedReceiver<Handed>>,
    config: Config,
    hub: Arc<Hub>,
    shutdown: watch::Sender<bool>,
    exit: watch::Receiver<bool>,
}

// === impl Worker ===

impl Worker {
    /// Run on a thread of its own (`lbkit-worker-N`); `admin` names the error when the
    /// thread cannot start.
    fn spawn(self, admin: SocketAddr) -> Result<(), ProxyError> {
        std::thread::Builder::new()
            .name(format!("lbkit-worker-{}", self.index))
            .spawn(move || self.run())
            .map(drop)
            .map_err(|source| ProxyError::Bind {
                addr: admin,
                source,
            })
    }

    fn run(mut self) {
        worker::set_index(self.index + 1);
        // This thread builds its runtime and drives it until the end.
        h1::pin_runtime_thread();
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
            let mut handed: Vec<_> = std::mem::take(&mut self.handed)
                .into_iter()
                .map(Some)
                .collect();
            for (i, socket) in std::mem::take(&mut self.sockets) {
                match TcpListener::from_std(socket) {
                    Ok(l) => {
                        let handed = handed.get_mut(i).and_then(Option::take);
                        let (config, hub) = (&self.config, &self.hub);
                        tokio::spawn(listen(l, i, config, hub, &self.shutdown, handed));
                    }
                    Err(e) => tracing::error!(worker = self.index, error = %e, "listener lost"),
                }
            }
            tokio::spawn(h1::sweep_idle(Arc::downgrade(&self.hub)));
            // Connections run on this runtime: keep it until the drain is over.
            let _ = self.exit.wait_for(|&exit| exit).await;
        });
    }
}

/// Each worker's listening sockets: (listener index, socket).
type WorkerSockets = Vec<Vec<(usize, std::net::TcpListener)>>;

/// Bind every listener of `config` once for each worker (a port of 0 takes the port the
/// first bind got). With one worker, each accept loop is spawned here (its task into
/// `accept`); with several, each worker's sockets come back, to start on its own thread.
/// Also the listeners' addresses, in the configuration's order.
fn bind_all(
    config: &Config,
    workers: usize,
    hub: &Arc<Hub>,
    shutdown: &watch::Sender<bool>,
    accept: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<(Vec<SocketAddr>, WorkerSockets), ProxyError> {
    let mut listeners = Vec::new();
    let mut sockets: WorkerSockets = (0..workers).map(|_| Vec::new()).collect();
    for (i, l) in config.listeners.iter().enumerate() {
        let mut addr = l.bind;
        for (w, mine) in sockets.iter_mut().enumerate() {
            let listener = bind(addr, workers > 1)?;
            addr = local_addr(&listener, l.bind)?;
            if w == 0 {
                listeners.push(addr);
            }
            if workers == 1 {
                let job = listen(listener, i, config, hub, shutdown, None);
                accept.push(tokio::spawn(job));
            } else {
                let std = listener
                    .into_std()
                    .map_err(|source| ProxyError::Bind { addr, source })?;
                mine.push((i, std));
            }
        }
    }
    Ok((listeners, sockets))
}

/// The accept loop of listener `i` of `config`, which also serves the connections of that
/// listener other workers hand to this one (`handed`).
fn listen(
    listener: TcpListener,
    i: usize,
    config: &Config,
    hub: &Arc<Hub>,
    shutdown: &watch::Sender<bool>,
    handed: Option<mpsc::UnboundedReceiver<Handed>>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    let (hub, rx) = (hub.clone(), shutdown.subscribe());
    let from = Arrivals::new(listener, i, handed);
    match config.listeners[i].protocol {
        Protocol::Http => Box::pin(serve_http(from, hub, config.limits.clone(), rx)),
        Protocol::Tcp => Box::pin(serve_tcp(from, hub, rx)),
    }
}

fn local_addr(listener: &TcpListener, addr: SocketAddr) -> Result<SocketAddr, ProxyError> {
    listener
        .local_addr()
        .map_err(|source| ProxyError::Bind { addr, source })
}

/// Listen on `addr` (with `SO_REUSEPORT` when several workers share it).
/// Applies configurations to a running proxy from any thread: the supervisor reloads on a
/// blocking thread, never on one that serves connections (with one worker, the main thread
/// does), since reading a large file and starting its services takes tens to hundreds of
/// milliseconds (BENCHMARKS.md, scale of configuration).
#[derive(Clone, Debug)]
pub(crate) struct Reloader {
    hub: Arc<Hub>,
    workers: usize,
}

impl Reloader {
    /// Switch to `config` ([`Proxy::reload`]), logging the time since `began` (when the file
    /// began to be read) and how many services started anew. Returns the configuration it
    /// replaced, for the caller to let go of off the serving threads.
    pub(crate) fn reload_since(
        &self,
        config: Config,
        began: Timestamp,
    ) -> Result<Arc<State>, ProxyError> {
        let current = self.hub.state.load_full();
        let (old, new) = (&current.config, &config);
        if old.listeners != new.listeners || old.limits != new.limits || old.admin != new.admin {
            tracing::warn!("listener, admin and limit changes take effect at the next restart");
        }
        let next = State::build(config, Some(&current), self.workers)?;
        let started = next
            .services
            .iter()
            .filter(|(name, r)| {
                current
                    .services
                    .get(*name)
                    .is_none_or(|c| !Arc::ptr_eq(c, r))
            })
            .count();
        let services = next.services.len();
        self.hub.state.store(Arc::new(next));
        let took = Clock::System.now().saturating_duration_since(began);
        tracing::info!(
            services,
            started,
            took_ms = took.as_secs_f64() * 1e3,
            "configuration reloaded"
        );
        Ok(current)
    }
}

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

async fn serve_http(
    mut from: Arrivals,
    hub: Arc<Hub>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = Arc::new(hyper_builder(&limits));
    let limits = Arc::new(limits);
    while let Some((stream, peer, slot)) = from.next(&hub, &mut shutdown).await {
        let conn = HttpConn {
            hub: hub.clone(),
            builder: builder.clone(),
            limits: limits.clone(),
            shutdown: shutdown.clone(),
            peer,
        };
        tokio::spawn(conn.serve(stream, slot));
    }
}

/// hyper's HTTP/1 server for the connections the fast path hands over, with the listener's
/// limits (HTTP/2 connections go to the proxy's own server, `h2s/`).
fn hyper_builder(limits: &Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms))
        // One flat buffer per write: `send(2)` rather than `writev(2)`, which goes through the
        // VFS layer (file position lock, iovec import) on every write.
        .writev(false)
        .max_headers(limits.max_headers)
        .max_buf_size(limits.max_header_bytes);
    builder
}

/// One accepted HTTP connection.
struct HttpConn {
    hub: Arc<Hub>,
    builder: Arc<http1::Builder>,
    limits: Arc<Limits>,
    shutdown: watch::Receiver<bool>,
    peer: SocketAddr,
}

impl HttpConn {
    /// Serve `stream` in `slot`: plain HTTP/1.1 on the fast path first, then the proxy's
    /// HTTP/2 server or hyper's HTTP/1 server for the rest of a connection the fast path hands
    /// over.
    async fn serve(mut self, stream: TcpStream, slot: Slot) {
        let (hub, limits) = (&self.hub, &self.limits);
        let (mut stream, read, served) =
            match h1::serve(stream, self.peer, hub, limits, &mut self.shutdown).await {
                h1::End::Closed => return,
                h1::End::Handover(stream, read, served) => (stream, read, served),
            };
        let head = Duration::from_millis(limits.header_read_timeout_ms);
        let Some((h2, read)) = h2s::sniff(&mut stream, read, head).await else {
            return;
        };
        // A write stalled for the longest route timeout fails (the fast path gives each write
        // its route's timeout; one connection serves every route).
        let stall = hub
            .state
            .load()
            .config
            .routes
            .iter()
            .map(|r| r.timeout_ms)
            .max();
        let stall =
            Duration::from_millis(stall.unwrap_or_else(crate::config::default_route_timeout_ms));
        let activity = Arc::new(Activity::default());
        let io = h1::Rewind::new(read, stream, stall, activity.clone());
        if h2 {
            let conn = h2s::Conn {
                hub: self.hub.clone(),
                peer: self.peer,
                limits: self.limits.clone(),
                shutdown: self.shutdown.clone(),
                activity,
            };
            let _slot = slot;
            return conn.serve(io).await;
        }
        self.serve_http1(io, slot, activity, served).await;
    }

    /// The rest of an HTTP/1 connection on hyper's server, after `served` requests on the fast
    /// path.
    async fn serve_http1(
        mut self,
        io: h1::Rewind,
        slot: Slot,
        activity: Arc<Activity>,
        served: u64,
    ) {
        let limits = &self.limits;
        // An upgrade request carries the connection's slot and drain marker, for the tunnel
        // that outlives hyper's connection.
        let hold = ConnHold::new(slot, self.shutdown.clone(), limits.clone());
        let (hub, peer, busy) = (self.hub.clone(), self.peer, activity.clone());
        let cap = limits.max_requests_per_connection;
        let served = Arc::new(AtomicU64::new(served));
        let svc = service_fn(move |mut req: Request<Incoming>| {
            if req.headers().contains_key(http::header::UPGRADE) {
                req.extensions_mut().insert(hold.clone());
            }
            let busy = busy.begin();
            let last = cap > 0 && served.fetch_add(1, Relaxed) + 1 >= cap;
            // Boxed: the request's future is over 3 KB, and hyper and tokio move it several
            // times before it first runs (into hyper's stream future, then into the spawned
            // task); a box moves as a pointer.
            let resp = Box::pin(http1_request(hub.clone(), peer, req, last));
            async move { Ok::<_, Infallible>(resp.await.map(|body| BusyBody::new(body, busy))) }
        });
        let watched = watchdog::Limits::of(limits);
        // Boxed: most connections never get here, and their tasks stay small.
        let io = TokioIo::new(io);
        let mut conn = Box::pin(self.builder.serve_connection(io, svc).with_upgrades());
        tokio::select! {
            // The connection first: it may hold a request the fast path already read, which a
            // graceful shutdown before hyper has seen it would drop.
            biased;
            _ = conn.as_mut() => {}
            _ = self.shutdown.changed() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            expired = watchdog::watch(&activity, watched) => {
                tracing::debug!(peer = %self.peer, ?expired, "client connection closed by its watchdog");
                if expired == Expired::Idle {
                    // Nothing in flight: a graceful close loses nothing, but is bounded too,
                    // as a request may start meanwhile.
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(watched.head, conn).await;
                }
            }
        }
    }
}

/// One request on hyper's HTTP/1 server; the connection's `last` request under
/// `max_requests_per_connection` is answered with `Connection: close`, after which hyper
/// closes the connection (an upgrade's 101 keeps its `Connection: upgrade`: its tunnel ends the
/// connection's requests anyway).
async fn http1_request(
    hub: Arc<Hub>,
    peer: SocketAddr,
    req: Request<Incoming>,
    last: bool,
) -> Response<ProxyBody> {
    let (mut resp, _) = forward::serve(&hub, peer, req.map(Inbound::Left)).await;
    if last && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        Defences::count(&hub.defences.capped);
        let close = http::HeaderValue::from_static("close");
        resp.headers_mut().insert(http::header::CONNECTION, close);
    }
    resp
}

async fn serve_tcp(mut from: Arrivals, hub: Arc<Hub>, mut shutdown: watch::Receiver<bool>) {
    let index = from.index;
    while let Some((stream, _peer, slot)) = from.next(&hub, &mut shutdown).await {
        let state = hub.state.load();
        let Some(service) = state.tcp_service(index).cloned() else {
            continue;
        };
        let idle = Duration::from_millis(state.config.limits.tcp_idle_timeout_ms);
        // Holding a receiver marks the connection as one to drain at shutdown.
        let drain = shutdown.clone();
        tokio::spawn(async move {
            let (_slot, _drain) = (slot, drain);
            tcp::relay(stream, &service, idle).await;
        });
    }
}
