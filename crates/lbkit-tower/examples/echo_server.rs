//! A tonic `echo.Echo` server that says who it is: the Rust provider of the Dubbo interop run.
//!
//! ```sh
//! cargo run -p lbkit-tower --example echo_server -- 127.0.0.1:50070 rust-a
//! lbkit register --zk $LBKIT_ZK --interface echo.Echo --protocol tri --address 127.0.0.1:50070
//! ```
//!
//! Every `Say` is answered with the request's message and `NAME` as the server. It serves until
//! Ctrl-C. `crates/lbkit/tests/dubbo_python.rs` runs [`serve`] and has Python Dubbo consumers
//! call it.

use std::net::SocketAddr;

use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

#[allow(clippy::all, missing_docs, unreachable_pub)]
#[rustfmt::skip]
#[path = "proto/echo.rs"]
pub mod echo;

use echo::echo_server::{Echo, EchoServer};
use echo::{SayReply, SayRequest};

/// The server: answers as `name`.
struct Named(String);

#[tonic::async_trait]
impl Echo for Named {
    async fn say(&self, request: Request<SayRequest>) -> Result<Response<SayReply>, Status> {
        Ok(Response::new(SayReply {
            message: request.into_inner().message,
            server: self.0.clone(),
        }))
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
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder().serve_with_incoming_shutdown(
            EchoServer::new(Named(name.to_owned())),
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
    match serve(addr, &name, stopped).await {
        Ok(at) => println!("serving echo.Echo as {name} on {at}"),
        Err(e) => {
            eprintln!("echo_server: cannot listen on {addr}: {e}");
            std::process::exit(1);
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    let _ = stop.send(());
}
