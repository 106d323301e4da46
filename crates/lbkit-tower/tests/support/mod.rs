//! Test endpoints: in-memory backends whose behaviour a test switches, and real HTTP servers on
//! 127.0.0.1.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body_util::Full;
use hyper::body::Incoming;
use lbkit_core::{Endpoint, EndpointSpec};
use tokio::sync::mpsc;

pub const SEED: u64 = 0x6c62_6b69_7400_0006;

/// What an in-memory backend does with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Behaviour {
    /// Answer with the backend's name.
    Ok = 0,
    /// Fail as a connection error would (never reached the server).
    Refuse = 1,
    /// Fail after "processing" (reached the server).
    Fail = 2,
    /// Never answer.
    Hang = 3,
}

/// What a backend saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Called(String, u64),
    Dropped(String, u64),
}

pub struct State {
    pub name: String,
    pub calls: AtomicU32,
    behaviour: AtomicU8,
    ready: AtomicBool,
    waker: AtomicWaker,
    events: mpsc::UnboundedSender<Event>,
}

impl State {
    pub fn set(&self, b: Behaviour) {
        self.behaviour.store(b as u8, SeqCst);
    }
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, SeqCst);
        if ready {
            self.waker.wake();
        }
    }
    pub fn calls(&self) -> u32 {
        self.calls.load(SeqCst)
    }
}

/// An in-memory endpoint service: requests are `u64` ids, responses the backend's name.
#[derive(Clone)]
pub struct Backend(pub Arc<State>);

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(#[source] pub std::io::Error);

impl tower::Service<u64> for Backend {
    type Response = String;
    type Error = BackendError;
    type Future = Pin<Box<dyn Future<Output = Result<String, BackendError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BackendError>> {
        if self.0.ready.load(SeqCst) {
            return Poll::Ready(Ok(()));
        }
        self.0.waker.register(cx.waker());
        if self.0.ready.load(SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, id: u64) -> Self::Future {
        let state = self.0.clone();
        state.calls.fetch_add(1, SeqCst);
        let _ = state.events.send(Event::Called(state.name.clone(), id));
        let behaviour = state.behaviour.load(SeqCst);
        Box::pin(async move {
            let io = |k, m| Err(BackendError(std::io::Error::new(k, m)));
            match behaviour {
                0 => Ok(state.name.clone()),
                1 => io(std::io::ErrorKind::ConnectionRefused, "refused"),
                2 => io(std::io::ErrorKind::Other, "server failed"),
                _ => {
                    let _drop = DropEvent(state, id);
                    std::future::pending().await
                }
            }
        })
    }
}

struct DropEvent(Arc<State>, u64);

impl Drop for DropEvent {
    fn drop(&mut self) {
        let _ = self
            .0
            .events
            .send(Event::Dropped(self.0.name.clone(), self.1));
    }
}

/// Backends by address, created up front; `maker()` hands them to a pool.
pub struct Farm {
    pub backends: Arc<HashMap<String, Backend>>,
    pub events: mpsc::UnboundedReceiver<Event>,
}

impl Farm {
    pub fn new(names: &[&str]) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let backends = names
            .iter()
            .map(|n| {
                let state = State {
                    name: n.to_string(),
                    calls: AtomicU32::new(0),
                    behaviour: AtomicU8::new(0),
                    ready: AtomicBool::new(true),
                    waker: AtomicWaker::new(),
                    events: tx.clone(),
                };
                (n.to_string(), Backend(Arc::new(state)))
            })
            .collect();
        Farm {
            backends: Arc::new(backends),
            events: rx,
        }
    }

    pub fn specs(&self, names: &[&str]) -> Vec<EndpointSpec> {
        names.iter().map(|n| EndpointSpec::new(*n)).collect()
    }

    pub fn get(&self, name: &str) -> &State {
        &self.backends[name].0
    }

    pub fn maker(&self) -> impl FnMut(&Endpoint) -> Backend + Send + 'static {
        let backends = self.backends.clone();
        move |ep: &Endpoint| backends[ep.address()].clone()
    }

    /// The next event, within 30 s (of paused time, in most tests).
    pub async fn next_event(&mut self) -> Event {
        tokio::time::timeout(Duration::from_secs(30), self.events.recv())
            .await
            .expect("an event within 30 s")
            .expect("the farm is alive")
    }
}

// --- real HTTP servers ---

/// What a real server does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// 200 with the server's name, echoing the deadline headers it got (`x-seen-grpc-timeout`,
    /// `x-seen-timeout` for `x-request-timeout`).
    Ok,
    Status503,
    /// This status with this header (`Retry-After`, `grpc-retry-pushback-ms`).
    Pushback(u16, &'static str, &'static str),
    /// 200 with the server's name after this many milliseconds.
    Delay(u64),
    /// [`Reply::Pushback`] after this many milliseconds.
    PushbackAfter(u64, u16, &'static str, &'static str),
    /// Never answer; report the drop of the handler (the client went away).
    Hang,
}

/// A hyper server (HTTP/1.1 and HTTP/2) on 127.0.0.1; stops when dropped.
pub struct HttpServer {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicU32>,
    pub cancelled: mpsc::UnboundedReceiver<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HttpServer {
    pub async fn start(name: &'static str, reply: Reply) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicU32::new(0));
        let (tx, cancelled) = mpsc::unbounded_channel();
        let h = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (h, tx) = (h.clone(), tx.clone());
                let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    h.fetch_add(1, SeqCst);
                    let tx = tx.clone();
                    let seen: Vec<_> = [
                        ("grpc-timeout", "x-seen-grpc-timeout"),
                        ("x-request-timeout", "x-seen-timeout"),
                    ]
                    .into_iter()
                    .filter_map(|(from, to)| Some((to, req.headers().get(from)?.clone())))
                    .collect();
                    async move {
                        match reply {
                            Reply::Ok => {
                                let mut resp = hyper::Response::new(Full::new(Bytes::from(name)));
                                for (to, v) in seen {
                                    resp.headers_mut().insert(to, v);
                                }
                                Ok::<_, Infallible>(resp)
                            }
                            Reply::Delay(ms) => {
                                tokio::time::sleep(Duration::from_millis(ms)).await;
                                Ok(hyper::Response::new(Full::new(Bytes::from(name))))
                            }
                            Reply::PushbackAfter(ms, status, header, value) => {
                                tokio::time::sleep(Duration::from_millis(ms)).await;
                                Ok(hyper::Response::builder()
                                    .status(status)
                                    .header(header, value)
                                    .body(Full::new(Bytes::from(name)))
                                    .unwrap())
                            }
                            Reply::Pushback(status, header, value) => {
                                Ok(hyper::Response::builder()
                                    .status(status)
                                    .header(header, value)
                                    .body(Full::new(Bytes::from(name)))
                                    .unwrap())
                            }
                            Reply::Status503 => Ok(hyper::Response::builder()
                                .status(503)
                                .body(Full::new(Bytes::from_static(b"unavailable")))
                                .unwrap()),
                            Reply::Hang => {
                                struct OnDrop(mpsc::UnboundedSender<()>);
                                impl Drop for OnDrop {
                                    fn drop(&mut self) {
                                        let _ = self.0.send(());
                                    }
                                }
                                let _guard = OnDrop(tx);
                                std::future::pending().await
                            }
                        }
                    }
                });
                tokio::spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(io, svc)
                    .await;
                });
            }
        });
        HttpServer {
            addr,
            hits,
            cancelled,
            task,
        }
    }

    pub fn hits(&self) -> u32 {
        self.hits.load(SeqCst)
    }
}

pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// A hyper-util client (HTTP/1.1, or HTTP/2 only with `h2`).
pub fn client(h2: bool) -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(h2)
        .build_http()
}

/// A round-robin pool over the hyper servers at `addrs` (HTTP/2 only with `h2`), picks
/// filtered by `availability`.
#[allow(dead_code)] // not every test binary uses it
pub fn round_robin_pool(
    addrs: &[SocketAddr],
    h2: bool,
    availability: lbkit_core::Availability,
) -> lbkit_tower::Pool<lbkit_tower::http::SetOrigin<Client>, lbkit_strategy::RoundRobin> {
    let client = client(h2);
    lbkit_tower::PoolBuilder::new(lbkit_strategy::RoundRobin::default())
        .availability(availability)
        .spawn_static(
            addrs
                .iter()
                .map(|a| EndpointSpec::new(a.to_string()))
                .collect(),
            lbkit_tower::TryMake(move |ep: &Endpoint| {
                lbkit_tower::http::SetOrigin::http(client.clone(), ep.address())
            }),
        )
}

/// Run `f` with a 10 s limit.
pub async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("finished within 10 s")
}
