//! A tonic `echo.Echo` server that says who it is: the Rust provider of the Dubbo interop run.
//!
//! ```sh
//! cargo run -p lbkit-tower --example echo_server -- 127.0.0.1:50070 rust-a
//! lbkit register --zk $LBKIT_ZK --interface echo.Echo --protocol tri --address 127.0.0.1:50070
//! ```
//!
//! Every `Say` is answered with the request's message and `NAME` as the server, every `Repeat`
//! with `count` such replies (at most [`MAX_REPEAT`]), streamed one at a time. It serves until
//! Ctrl-C or SIGTERM, then prints `NAME served N calls` (the gRPC benchmark,
//! `scripts/bench-grpc.sh`, reads each backend's share from it; `TOKIO_WORKER_THREADS` sets its
//! threads). `crates/lbkit/tests/dubbo_python.rs` runs [`serve`] and has Python Dubbo consumers
//! call it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use futures_util::stream::{self, BoxStream, StreamExt};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

#[allow(clippy::all, missing_docs, unreachable_pub)]
#[rustfmt::skip]
#[path = "proto/echo.rs"]
pub mod echo;

use echo::echo_server::{Echo, EchoServer};
use echo::{RepeatRequest, SayReply, SayRequest};

/// The most replies one `Repeat` call streams; a larger `count` is refused.
pub const MAX_REPEAT: u32 = 10_000;

/// The server: answers as `name`, counting calls.
struct Named(String, Arc<AtomicU64>);

#[tonic::async_trait]
impl Echo for Named {
    async fn say(&self, request: Request<SayRequest>) -> Result<Response<SayReply>, Status> {
        self.1.fetch_add(1, Relaxed);
        Ok(Response::new(SayReply {
            message: request.into_inner().message,
            server: self.0.clone(),
        }))
    }

    type RepeatStream = BoxStream<'static, Result<SayReply, Status>>;

    async fn repeat(
        &self,
        request: Request<RepeatRequest>,
    ) -> Result<Response<Self::RepeatStream>, Status> {
        let RepeatRequest { message, count } = request.into_inner();
        if count > MAX_REPEAT {
            return Err(Status::invalid_argument(format!(
                "count {count} is over {MAX_REPEAT}"
            )));
        }
        self.1.fetch_add(1, Relaxed);
        let reply = SayReply {
            message,
            server: self.0.clone(),
        };
        // One reply at a time, yielding between them as a server producing them over time
        // would: tonic then sends each in its own DATA frame instead of batching them.
        let replies = stream::iter(0..count).then(move |_| {
            let reply = reply.clone();
            async move {
                tokio::task::yield_now().await;
                Ok(reply)
            }
        });
        Ok(Response::new(replies.boxed()))
    }
}

/// Serve `echo.Echo` as `name` on `addr` (port 0: any free one) until `stop` fires or is
/// dropped; the address it listens on.
///
/// # Errors
/// When `addr` cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    name: &str,
    stop: oneshot::Receiver<()>,
) -> std::io::Result<SocketAddr> {
    serve_counting(addr, name, stop, Arc::default()).await
}

/// [`serve`], adding each call to `calls`.
///
/// # Errors
/// When `addr` cannot be bound.
pub async fn serve_counting(
    addr: SocketAddr,
    name: &str,
    stop: oneshot::Receiver<()>,
    calls: Arc<AtomicU64>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder().serve_with_incoming_shutdown(
            EchoServer::new(Named(name.to_owned(), calls)),
            incoming,
            async {
                let _ = stop.await;
            },
        ),
    );
    Ok(addr)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(addr), Some(name)) = (args.next(), args.next()) else {
        eprintln!("usage: echo_server HOST:PORT NAME");
        std::process::exit(2);
    };
    let Ok(addr) = addr.parse::<SocketAddr>() else {
        eprintln!("echo_server: {addr:?} is not HOST:PORT");
        std::process::exit(2);
    };
    let (stop, stopped) = oneshot::channel();
    let calls = Arc::new(AtomicU64::new(0));
    match serve_counting(addr, &name, stopped, calls.clone()).await {
        Ok(at) => println!("serving echo.Echo as {name} on {at}"),
        Err(e) => {
            eprintln!("echo_server: cannot listen on {addr}: {e}");
            std::process::exit(1);
        }
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let _ = stop.send(());
    println!("{name} served {} calls", calls.load(Relaxed));
}
