//! A tonic gRPC client balancing over three local tonic servers: one fast, one slow, one that
//! always answers UNAVAILABLE.
//!
//! The client stack is `EchoClient` → [`BufferRequest`] (so calls can be replayed) →
//! [`Balance`](lbkit_tower::Balance) (peak-EWMA power of two choices, failover) → one tonic
//! `Channel` per endpoint. Calls are marked [`Idempotent`], so the failing server's answers are
//! retried on another server; after three failures in a row its circuit breaker passes it over,
//! and the EWMA keeps most calls away from the slow one.
//!
//! Run it with `cargo run -p lbkit-tower --example grpc`; the tests run [`run`] too.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use lbkit_core::{Endpoint, EndpointSpec};
use lbkit_strategy::catalog::{build, Params};
use lbkit_tower::http::{BufferRequestLayer, Idempotent};
use lbkit_tower::{BalanceLayer, BoxError, PoolBuilder, TryMake};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};
use tower::{ServiceBuilder, ServiceExt};

#[allow(clippy::all, missing_docs, unreachable_pub)]
#[rustfmt::skip]
#[path = "proto/echo.rs"]
pub mod echo;

use echo::echo_client::EchoClient;
use echo::echo_server::{Echo, EchoServer};
use echo::{RepeatRequest, SayReply, SayRequest};

/// What the example saw.
#[derive(Debug, Default)]
pub struct Report {
    /// Calls each server received, by name.
    pub received: BTreeMap<&'static str, u32>,
    /// Calls the client got an answer to, by the server that answered.
    pub answered: BTreeMap<String, u32>,
    /// Calls that failed at the client.
    pub failed: u32,
}

/// How a server behaves.
#[derive(Clone, Copy)]
enum Behaviour {
    Fast,
    Slow(Duration),
    Unavailable,
}

struct Server {
    name: &'static str,
    behaviour: Behaviour,
    calls: tokio::sync::mpsc::UnboundedSender<&'static str>,
}

#[tonic::async_trait]
impl Echo for Server {
    async fn say(&self, request: Request<SayRequest>) -> Result<Response<SayReply>, Status> {
        self.answer(request.into_inner().message)
            .await
            .map(Response::new)
    }

    type RepeatStream = futures_util::stream::BoxStream<'static, Result<SayReply, Status>>;

    async fn repeat(
        &self,
        request: Request<RepeatRequest>,
    ) -> Result<Response<Self::RepeatStream>, Status> {
        use futures_util::StreamExt;
        let RepeatRequest { message, count } = request.into_inner();
        let reply = self.answer(message).await?;
        let replies = (0..count.min(1_000)).map(move |_| Ok(reply.clone()));
        Ok(Response::new(futures_util::stream::iter(replies).boxed()))
    }
}

impl Server {
    /// One reply as this server behaves: at once, late, or UNAVAILABLE.
    async fn answer(&self, message: String) -> Result<SayReply, Status> {
        let _ = self.calls.send(self.name);
        match self.behaviour {
            Behaviour::Fast => {}
            Behaviour::Slow(d) => tokio::time::sleep(d).await,
            Behaviour::Unavailable => return Err(Status::unavailable("shutting down")),
        }
        Ok(SayReply {
            message,
            server: self.name.to_owned(),
        })
    }
}

/// Start one server on 127.0.0.1; it stops when `stop` fires or is dropped.
async fn serve(server: Server, stop: oneshot::Receiver<()>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder().serve_with_incoming_shutdown(
            EchoServer::new(server),
            incoming,
            async {
                let _ = stop.await;
            },
        ),
    );
    Ok(addr)
}

/// Start the fast, the slow and the failing server, each telling `seen` the calls it gets:
/// their endpoints, and the senders that stop them when dropped.
async fn start_servers(
    seen: tokio::sync::mpsc::UnboundedSender<&'static str>,
) -> Result<(Vec<EndpointSpec>, Vec<oneshot::Sender<()>>), BoxError> {
    let behaviours = [
        ("fast", Behaviour::Fast),
        ("slow", Behaviour::Slow(Duration::from_millis(40))),
        ("failing", Behaviour::Unavailable),
    ];
    let mut stops = Vec::new();
    let mut specs = Vec::new();
    for (name, behaviour) in behaviours {
        let (stop, stopped) = oneshot::channel();
        let server = Server {
            name,
            behaviour,
            calls: seen.clone(),
        };
        specs.push(EndpointSpec::new(serve(server, stopped).await?.to_string()));
        stops.push(stop);
    }
    Ok((specs, stops))
}

/// Start three servers, send `calls` calls through the balance, and report.
///
/// # Errors
/// When a server cannot bind a loopback port.
pub async fn run(calls: u32) -> Result<Report, BoxError> {
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let (specs, stops) = start_servers(seen_tx).await?;

    // One lazily connected Channel per endpoint; the balance hands it buffered bodies.
    let make = TryMake(|ep: &Endpoint| {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", ep.address()))?
            .connect_lazy();
        Ok::<_, BoxError>(
            channel.map_request(|r: http::Request<Full<Bytes>>| r.map(tonic::body::Body::new)),
        )
    });
    let strategy = build("p2c-ewma", Params::new())?;
    let pool = PoolBuilder::new(strategy)
        .name("echo")
        .spawn_static(specs, make);
    let stack = ServiceBuilder::new()
        .layer(BufferRequestLayer::default())
        .layer(
            BalanceLayer::http()
                .failover(2)
                .timeout(Duration::from_secs(2)),
        )
        .service(pool);
    let mut client = EchoClient::new(stack);

    let mut report = Report::default();
    for i in 0..calls {
        let mut request = Request::new(SayRequest {
            message: format!("hello {i}"),
            user: format!("user-{}", i % 7),
        });
        request.extensions_mut().insert(Idempotent);
        match client.say(request).await {
            Ok(reply) => {
                *report
                    .answered
                    .entry(reply.into_inner().server)
                    .or_default() += 1
            }
            Err(_) => report.failed += 1,
        }
    }
    drop(stops); // stop the servers
    while let Ok(name) = seen.try_recv() {
        *report.received.entry(name).or_default() += 1;
    }
    Ok(report)
}

#[allow(dead_code)] // the tests call `run`
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let report = run(60).await?;
    println!("calls received by each server: {:?}", report.received);
    println!("calls answered by each server: {:?}", report.answered);
    println!("calls failed: {}", report.failed);
    Ok(())
}
