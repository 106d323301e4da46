//! Load through the proxy (HTTP/1.1 keep-alive GETs at a fixed pace per connection), the
//! admin sampler, and the backend server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One request through the proxy.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// When it was sent, since the run's start.
    pub at: Duration,
    pub latency: Duration,
    /// HTTP status; 0 = no answer (connection error).
    pub status: u16,
    /// Index of the backend that answered (by its body), if one did.
    pub backend: Option<usize>,
}

/// What the admin API said about one service at one moment.
#[derive(Clone, Debug)]
pub struct View {
    pub at: Duration,
    /// (address, ejected) per endpoint of the service.
    pub endpoints: Vec<(String, bool)>,
    /// (address, weight, the registry's rules that changed it) per endpoint (the Dubbo interop
    /// test reads them; the fault run does not).
    #[allow(dead_code)]
    pub weights: Vec<(String, u64, Vec<String>)>,
    /// (address, its tags as `/endpoints` describes them) per endpoint (the interop test).
    #[allow(dead_code)]
    pub tags: Vec<(String, Vec<String>)>,
}

/// A GET over one connection; reconnects after an error. `None` on a connection error.
struct Conn {
    addr: SocketAddr,
    sender: Option<http1::SendRequest<Empty<Bytes>>>,
}

impl Conn {
    async fn get(&mut self, path: &str, host: &str) -> Option<(u16, Bytes)> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = TcpStream::connect(self.addr).await.ok()?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut()?;
        let answer = async {
            sender.ready().await.ok()?;
            let req = Request::get(path)
                .header("host", host)
                .body(Empty::new())
                .ok()?;
            let resp = sender.send_request(req).await.ok()?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.ok()?.to_bytes();
            Some((status, body))
        }
        .await;
        if answer.is_none() {
            self.sender = None;
        }
        answer
    }
}

/// `connections` connections each send a GET every `every` until `stop` turns true; `done`
/// counts the requests finished so far (answered or not), for waits on the traffic itself.
pub async fn run(
    proxy: SocketAddr,
    connections: usize,
    every: Duration,
    start: Instant,
    names: Arc<Vec<String>>,
    stop: watch::Receiver<bool>,
    done: Arc<watch::Sender<u64>>,
) -> Vec<Sample> {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..connections {
        let (names, mut stop, done) = (names.clone(), stop.clone(), done.clone());
        tasks.spawn(async move {
            let mut conn = Conn {
                addr: proxy,
                sender: None,
            };
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut samples = Vec::new();
            for n in 0u64.. {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
                let sent = Instant::now();
                let got = conn.get(&format!("/faults/{c}/{n}"), "faults.test").await;
                let latency = sent.elapsed();
                let (status, backend) = match got {
                    Some((status, body)) => (
                        status,
                        names
                            .iter()
                            .position(|name| body.as_ref() == name.as_bytes()),
                    ),
                    None => (0, None),
                };
                samples.push(Sample {
                    at: sent - start,
                    latency,
                    status,
                    backend,
                });
                done.send_modify(|n| *n += 1);
            }
            samples
        });
    }
    let mut all = Vec::new();
    while let Some(done) = tasks.join_next().await {
        all.extend(done.unwrap_or_default());
    }
    all.sort_by_key(|s| s.at);
    all
}

/// Every `every`, what `GET /endpoints` says about `service` (each view also sent to
/// `latest` as it is taken, for waits), until `stop`.
pub async fn sample_admin(
    admin: SocketAddr,
    service: String,
    every: Duration,
    start: Instant,
    mut stop: watch::Receiver<bool>,
    latest: watch::Sender<Option<View>>,
) -> Vec<View> {
    let mut conn = Conn {
        addr: admin,
        sender: None,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut views = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let at = start.elapsed();
        let Some((200, body)) = conn.get("/endpoints", "admin").await else {
            continue;
        };
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body) else {
            continue;
        };
        let list = json["services"][&service]["endpoints"].as_array();
        let weights = list
            .map(|list| {
                list.iter()
                    .map(|e| {
                        let rules = e["rules"].as_array().map(|r| {
                            r.iter()
                                .map(|x| x.as_str().unwrap_or_default().to_owned())
                                .collect()
                        });
                        (
                            e["address"].as_str().unwrap_or_default().to_owned(),
                            e["weight"].as_u64().unwrap_or(0),
                            rules.unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|r| {
                    r.iter()
                        .map(|x| x.as_str().unwrap_or_default().to_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        let tags = list
            .map(|list| {
                list.iter()
                    .map(|e| {
                        let address = e["address"].as_str().unwrap_or_default().to_owned();
                        (address, strings(&e["tags"]))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let endpoints = list
            .map(|list| {
                list.iter()
                    .map(|e| {
                        (
                            e["address"].as_str().unwrap_or_default().to_owned(),
                            e["ejected"].as_bool().unwrap_or(false),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let view = View {
            at,
            endpoints,
            weights,
            tags,
        };
        latest.send_replace(Some(view.clone()));
        views.push(view);
    }
    views
}

/// The backend: answers every request with its name. Prints `listening on ADDR`.
pub fn backend(name: &str) -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let body = Bytes::from(name.to_owned());
    runtime.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        println!("listening on {}", listener.local_addr().expect("addr"));
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let body = body.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let body = body.clone();
                    async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}
