//! The HTTP/2 attacks of issue 40 against a running `lbkit proxy`, with figures, for
//! `scripts/h2-abuse.sh` (RELIABILITY.md): the example serves the proxy's backend itself
//! (counting the upstream connections the proxy makes), attacks, and meanwhile a second client
//! calls the same backend through the proxy.
//!
//! ```text
//! h2_abuse paced PROXY BACKEND_PORT SECONDS        # paced rapid reset, reconnecting for SECONDS
//! h2_abuse zero-window PROXY BACKEND_PORT ROUNDS   # a stream stuck on a zero window, ROUNDS times
//! ```
//!
//! The backend answers `/` after 50 ms (a service time, so a stream is still waiting when its
//! client resets it) and `/big` with 256 KB at once. One JSON object of figures goes to stdout.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use lbkit_testkit::h2raw::{self, RawH2, CANCEL, GOAWAY, PING, RST_STREAM};
use tokio::time::Instant;

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, proxy, port, n] = args.as_slice() else {
        return Err("usage: h2_abuse paced|zero-window PROXY BACKEND_PORT SECONDS|ROUNDS".into());
    };
    let (proxy, port, n): (SocketAddr, u16, u64) = (proxy.parse()?, port.parse()?, n.parse()?);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(async move {
            let accepted = backend(port).await?;
            // The proxy sees its backend once it answers.
            wait_for_proxy(proxy).await?;
            let before = accepted.load(Relaxed);
            let figures = match mode.as_str() {
                "paced" => paced(proxy, Duration::from_secs(n), &accepted, before).await?,
                "zero-window" => zero_window(proxy, n).await?,
                other => return Err(format!("unknown attack {other:?}").into()),
            };
            println!("{figures}");
            Ok(())
        })
}

/// The backend on 127.0.0.1:`port`; returns its count of accepted connections.
async fn backend(port: u16) -> Result<Arc<AtomicU64>, Error> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Relaxed);
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let body = if req.uri().path() == "/big" {
                        Bytes::from(vec![b'x'; 256 * 1024])
                    } else {
                        // The backend's service time, not a wait for a condition.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Bytes::from_static(b"ok")
                    };
                    Ok::<_, Infallible>(http::Response::new(Full::new(body)))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(accepted)
}

/// One HTTP/1.1 GET through the proxy on a new connection: its status and time.
async fn get(proxy: SocketAddr) -> (u16, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = Instant::now();
    let call = async {
        let mut s = tokio::net::TcpStream::connect(proxy).await.ok()?;
        let req = "GET / HTTP/1.1\r\nHost: victim\r\nConnection: close\r\n\r\n";
        s.write_all(req.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.ok()?;
        let head = std::str::from_utf8(answer.get(9..12)?).ok()?;
        head.parse().ok()
    };
    let status = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .ok()
        .flatten()
        .unwrap_or(0);
    (status, started.elapsed())
}

async fn wait_for_proxy(proxy: SocketAddr) -> Result<(), Error> {
    for _ in 0..200 {
        if get(proxy).await.0 == 200 {
            return Ok(());
        }
        // A start-up poll, bounded by the loop.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("the proxy never answered 200".into())
}

/// A second client: a GET every 20 ms until `stop`; statuses and the slowest answer.
fn victim(
    proxy: SocketAddr,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<(u64, u64, Duration)> {
    tokio::spawn(async move {
        let (mut sent, mut failed, mut slowest) = (0, 0, Duration::ZERO);
        let mut pace = tokio::time::interval(Duration::from_millis(20));
        while !*stop.borrow() {
            pace.tick().await;
            let (status, took) = get(proxy).await;
            sent += 1;
            failed += u64::from(status != 200);
            slowest = slowest.max(took);
        }
        (sent, failed, slowest)
    })
}

/// The paced rapid reset, reconnecting after each `GOAWAY` until `for_` has passed.
async fn paced(
    proxy: SocketAddr,
    for_: Duration,
    accepted: &AtomicU64,
    before: u64,
) -> Result<String, Error> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let victim = victim(proxy, stopped);
    let end = Instant::now() + for_;
    let (mut per_conn, mut codes) = (Vec::new(), Vec::new());
    while Instant::now() < end {
        let (streams, code) = paced_connection(proxy, end).await?;
        per_conn.push(streams);
        codes.push(code);
    }
    let _ = stop.send(true);
    let (sent, failed, slowest) = victim.await?;
    let upstream = accepted.load(Relaxed) - before;
    let total: u64 = per_conn.iter().sum();
    per_conn.sort_unstable();
    let calmed = codes
        .iter()
        .filter(|c| **c == Some(h2raw::ENHANCE_YOUR_CALM))
        .count();
    Ok(format!(
        "{{\"attack\":\"paced\",\"seconds\":{},\"connections\":{},\"streams\":{total},\
         \"streams_per_connection_median\":{},\"streams_per_connection_max\":{},\
         \"goaway_enhance_your_calm\":{calmed},\"upstream_connections\":{upstream},\
         \"upstream_connections_per_connection\":{:.1},\"victim_requests\":{sent},\
         \"victim_failed\":{failed},\"victim_slowest_ms\":{:.1}}}",
        for_.as_secs(),
        per_conn.len(),
        per_conn[per_conn.len() / 2],
        per_conn.last().copied().unwrap_or(0),
        upstream as f64 / per_conn.len().max(1) as f64,
        slowest.as_secs_f64() * 1e3,
    ))
}

/// One attacking connection: rounds of 50 streams, a `PING`, its `ACK`, 50 resets, until the
/// proxy sends `GOAWAY` or closes (or `end`). Returns the streams opened and the `GOAWAY` code.
async fn paced_connection(proxy: SocketAddr, end: Instant) -> Result<(u64, Option<u32>), Error> {
    let mut h2 = RawH2::connect(proxy, &[]).await?;
    let mut opened = 0;
    let mut round = 0u8;
    while Instant::now() < end {
        round = round.wrapping_add(1);
        let mut ids = Vec::with_capacity(50);
        for _ in 0..50 {
            match h2.request("GET", "/", true).await {
                Ok(id) => ids.push(id),
                Err(_) => return Ok((opened, None)),
            }
            opened += 1;
        }
        if h2.ping([round; 8]).await.is_err() {
            return Ok((opened, None));
        }
        let acked =
            |f: &h2raw::Frame| f.kind == PING && f.flags & 1 == 1 && f.payload == [round; 8];
        match tokio::time::timeout(
            Duration::from_secs(5),
            h2.until(|f| acked(f) || f.kind == GOAWAY),
        )
        .await
        {
            Ok(Some(f)) if f.kind == GOAWAY => return Ok((opened, f.error_code())),
            Ok(Some(_)) => {}
            _ => return Ok((opened, None)),
        }
        for id in ids {
            if h2.reset(id, CANCEL).await.is_err() {
                return Ok((opened, None));
            }
        }
    }
    Ok((opened, None))
}

/// A stream stuck on a zero window while the connection's other streams are served, `rounds`
/// times: each stuck stream's lifetime (its `HEADERS` to the proxy's `RST_STREAM`; `null` when
/// it lived past 60 s).
async fn zero_window(proxy: SocketAddr, rounds: u64) -> Result<String, Error> {
    let mut lifetimes = Vec::new();
    let mut others = 0;
    for _ in 0..rounds {
        let mut h2 = RawH2::connect(proxy, &[(h2raw::INITIAL_WINDOW_SIZE, 0)]).await?;
        h2.window_update(0, 1 << 30).await?;
        let started = Instant::now();
        let stuck = h2.request("GET", "/big", true).await?;
        let mut reset = None;
        while reset.is_none() && started.elapsed() < Duration::from_secs(60) {
            let id = h2.request("GET", "/", true).await?;
            h2.window_update(id, 1 << 20).await?;
            let wait = h2.until(|f| {
                if f.stream == stuck && f.kind == RST_STREAM {
                    reset = Some(started.elapsed());
                }
                f.stream == id && f.ends_stream()
            });
            if tokio::time::timeout(Duration::from_secs(10), wait)
                .await
                .ok()
                .flatten()
                .is_some()
            {
                others += 1;
            }
        }
        lifetimes.push(reset);
    }
    // `null`: not reset within 60 s, while the other streams kept the connection busy.
    let ms: Vec<String> = lifetimes
        .iter()
        .map(|d| d.map_or("null".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e3)))
        .collect();
    Ok(format!(
        "{{\"attack\":\"zero-window\",\"rounds\":{rounds},\"stuck_stream_lifetimes_ms\":[{}],\
         \"other_streams_answered\":{others}}}",
        ms.join(",")
    ))
}
