//! A tiny keep-alive HTTP backend for tests and `scripts/bench-proxy.sh`:
//! `cargo run --release -p lbkit-proxy --example backend -- PORT [THREADS [WORKERS SERVICE_MS]]`.
//! Answers every request with `200 backend PORT`. With `WORKERS` and `SERVICE_MS`, it serves
//! like an application server: at most `WORKERS` requests at once (the others wait their
//! turn), each taking an exponentially distributed time of mean `SERVICE_MS` — a slow or a
//! fast provider for the record → replay workflow of the README.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args
        .next()
        .ok_or("usage: backend PORT [THREADS]")?
        .parse()?;
    let threads: usize = args.next().map_or(Ok(1), |t| t.parse())?;
    let workers: Option<usize> = args.next().map(|w| w.parse()).transpose()?;
    let service_ms: f64 = args.next().map_or(Ok(0.0), |m| m.parse())?;
    let limit = workers.map(|w| (Arc::new(tokio::sync::Semaphore::new(w.max(1))), service_ms));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?
        .block_on(serve(port, limit))
}

/// Exponential with mean `mean_ms`, from a xorshift seeded per call by the clock.
fn service_time(mean_ms: f64) -> std::time::Duration {
    #[allow(clippy::disallowed_methods)] // an example server's randomness, not a pick
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = lbkit_core::FastRng::seed_from_u64(seed);
    let u = 1.0 - rng.unit_f64();
    std::time::Duration::from_secs_f64(-mean_ms * u.ln() / 1e3)
}

type Limit = Option<(Arc<tokio::sync::Semaphore>, f64)>;

async fn serve(port: u16, limit: Limit) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let body = Bytes::from(format!("backend {port}\n"));
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let body = body.clone();
        let limit = limit.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |_req| {
                let body = body.clone();
                let limit = limit.clone();
                async move {
                    if let Some((workers, mean_ms)) = limit {
                        let _worker = workers.acquire_owned().await;
                        tokio::time::sleep(service_time(mean_ms)).await;
                    }
                    Ok::<_, Infallible>(Response::new(Full::new(body)))
                }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
