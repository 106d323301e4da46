//! HTTP/2 and HTTP/1.1 clients that abuse the proxy (issue 40): a paced rapid reset, streams
//! stuck on a zero flow-control window, connections that never stop asking, and the textbook
//! HTTP/2 attacks — each written frame by frame (`lbkit_testkit::h2raw`), against the proxy's
//! own HTTP/2 server (`h2s/`).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::StatusCode;
use http_body_util::Full;
use lbkit_testkit::h2raw::{self, Frame, RawH2, CANCEL, ENHANCE_YOUR_CALM, GOAWAY, PING};
use tokio::time::Instant;

/// An HTTP/1.1 backend that answers after `delay` (its service time), counting the connections
/// it accepted and those that ended, and the requests that arrived.
struct Counted {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    ended: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

/// Size of the body `slow_counting_backend` serves at `/big`.
const SLOW_BIG: usize = 256 * 1024;

async fn slow_counting_backend(delay: Duration) -> Counted {
    let (ended, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (done, arrived) = (ended.clone(), requests.clone());
    let (addr, accepted) = counting_server(move |stream| {
        let (done, arrived) = (done.clone(), arrived.clone());
        async move {
            let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                let arrived = arrived.clone();
                async move {
                    let _: &http::Request<hyper::body::Incoming> = &req;
                    arrived.fetch_add(1, Ordering::SeqCst);
                    // A backend's service time, not a wait for a condition.
                    tokio::time::sleep(delay).await;
                    let body = if req.uri().path() == "/big" {
                        Bytes::from(vec![b'x'; SLOW_BIG])
                    } else {
                        Bytes::from_static(b"ok")
                    };
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(body)))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
            done.fetch_add(1, Ordering::SeqCst);
        }
    })
    .await;
    Counted {
        addr,
        accepted,
        ended,
        requests,
    }
}

/// The next frame within the test's bound; `None` when the connection closed.
async fn frame(h2: &mut RawH2) -> Option<Frame> {
    tokio::time::timeout(WAIT, h2.next_frame())
        .await
        .expect("a frame or the end within the bound")
}

/// Frames until one matching `what` (returned), within the test's bound.
async fn until(h2: &mut RawH2, what: impl FnMut(&Frame) -> bool) -> Option<Frame> {
    tokio::time::timeout(WAIT, h2.until(what))
        .await
        .expect("the frame or the end within the bound")
}

/// A client that opens 10 streams and a `PING`, waits for the `PING`'s `ACK` (and, to be
/// sure, for the requests to reach the backend), then resets all 10, again and again: the
/// connection gets `GOAWAY ENHANCE_YOUR_CALM` after `max_premature_resets` (100) such streams
/// and closes, the upstream connections made for them stay bounded, and another client is
/// served meanwhile. Its streams are all accepted before their reset, which `h2`'s own guard
/// does not count (it counts streams reset before they were accepted): only the proxy's
/// accounting can stop it. Before the proxy's own HTTP/2 server, one connection opened
/// 122 000–148 000 streams in 5 s and the proxy opened an upstream connection for nearly each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_rapid_reset_gets_goaway_and_bounded_upstream_connects() {
    let b = slow_counting_backend(Duration::from_millis(200)).await;
    let (backend, accepted) = (b.addr, b.accepted.clone());
    let proxy = start(&config_for(&[backend], "round-robin", "")).await;
    let connects_before = accepted.load(Ordering::SeqCst);
    let requests_before = b.requests.load(Ordering::SeqCst);
    let to = proxy.listeners()[0];
    let mut h2 = RawH2::connect(to, &[]).await.expect("connect");
    let (mut opened, mut goaway) = (0, None);
    'rounds: for round in 0u8..200 {
        let mut ids = Vec::new();
        for _ in 0..10 {
            // The proxy may have closed the connection meanwhile: its GOAWAY is queued.
            let Ok(id) = h2.request("GET", "/", true).await else {
                break 'rounds;
            };
            ids.push(id);
            opened += 1;
        }
        if h2.ping([round; 8]).await.is_err() {
            break 'rounds;
        }
        loop {
            match frame(&mut h2).await {
                Some(f) if f.kind == PING && f.flags & 1 == 1 && f.payload == [round; 8] => break,
                Some(f) if f.kind == GOAWAY => {
                    goaway = Some(f);
                    break 'rounds;
                }
                Some(_) => {}
                None => break 'rounds,
            }
        }
        // The round's requests reach the backend, unless the proxy ended the connection first.
        let arrived = || b.requests.load(Ordering::SeqCst) - requests_before;
        let forwarded = async {
            while arrived() < opened {
                tokio::task::yield_now().await;
            }
        };
        let ended = tokio::time::timeout(WAIT, async {
            tokio::select! {
                () = forwarded => None,
                f = h2.until(|f| f.kind == GOAWAY) => Some(f),
            }
        });
        let ended = ended
            .await
            .expect("the requests forwarded, or a GOAWAY, within the bound");
        if let Some(f) = ended {
            goaway = f;
            break 'rounds;
        }
        for id in ids {
            if h2.reset(id, CANCEL).await.is_err() {
                break 'rounds;
            }
        }
    }
    let goaway = match goaway {
        Some(g) => Some(g),
        None => until(&mut h2, |f| f.kind == GOAWAY).await,
    };
    let goaway = goaway.unwrap_or_else(|| panic!("no GOAWAY after {opened} streams"));
    assert_eq!(goaway.error_code(), Some(ENHANCE_YOUR_CALM), "{goaway:?}");
    assert!(opened <= 300, "GOAWAY only after {opened} streams");
    // ... and the connection closes.
    assert!(until(&mut h2, |_| false).await.is_none());
    // At most one upstream connection a stream (each request here reached the backend before
    // its reset), and so bounded with the streams.
    let connects = accepted.load(Ordering::SeqCst) - connects_before;
    assert!(
        connects <= opened,
        "{connects} upstream connections for {opened} streams"
    );
    // Another client is served at once.
    let (status, _, _) = get(&client(), to, "/", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let calmed = "lbkit_proxy_client_connections_limited_total{reason=\"premature_resets\"}";
    assert_eq!(sample(&proxy, calmed).await, 1.0);
    let resets = sample(&proxy, "lbkit_proxy_http2_premature_resets_total").await;
    assert!(resets >= 100.0, "{resets}");
    println!("GOAWAY after {opened} streams, {connects} upstream connections, {resets} resets");
}

/// A stream whose client grants no flow-control window (`SETTINGS_INITIAL_WINDOW_SIZE` 0) is
/// reset (`CANCEL`) within `stream_idle_timeout_ms` (+ 1 s), and its upstream connection let
/// go, while the other streams of its connection, which get window, keep being answered (the
/// connection's watchdog alone never fired: they kept it busy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_stuck_on_a_zero_window_is_reset_while_others_work() {
    let b = slow_counting_backend(Duration::ZERO).await;
    let (backend, ended) = (b.addr, b.ended.clone());
    let limits = "stream_idle_timeout_ms = 1000\n";
    let text = config_for(&[backend], "round-robin", "")
        .replace("[limits]\n", &format!("[limits]\n{limits}"));
    let proxy = start(&text).await;
    let ended_before = ended.load(Ordering::SeqCst);
    let to = proxy.listeners()[0];
    let mut h2 = RawH2::connect(to, &[(h2raw::INITIAL_WINDOW_SIZE, 0)])
        .await
        .expect("connect");
    h2.window_update(0, 1 << 30)
        .await
        .expect("connection window");
    let started = Instant::now();
    let stuck = h2.request("GET", "/big", true).await.expect("HEADERS");
    let (mut answered, mut reset_at) = (0, None);
    while reset_at.is_none() && started.elapsed() < Duration::from_secs(5) {
        // Another stream, given window: answered in full.
        let id = h2.request("GET", "/", true).await.expect("HEADERS");
        h2.window_update(id, 1 << 20).await.expect("stream window");
        while let Some(f) = frame(&mut h2).await {
            if f.stream == stuck && f.kind == h2raw::RST_STREAM {
                assert_eq!(f.error_code(), Some(CANCEL));
                reset_at = Some(started.elapsed());
            } else if f.stream == id && f.ends_stream() {
                answered += 1;
                break;
            }
        }
        // A client's pace, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let at = reset_at.expect("the stuck stream reset within 5 s");
    assert!(
        at >= Duration::from_millis(900) && at <= Duration::from_millis(2000),
        "reset after {at:?}"
    );
    assert!(answered >= 10, "the other streams kept working: {answered}");
    // Its upstream exchange was cancelled: the backend's connection ended.
    tokio::time::timeout(WAIT, async {
        while ended.load(Ordering::SeqCst) == ended_before {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the stuck stream's upstream connection closed");
    let idle = sample(&proxy, "lbkit_proxy_http2_stream_idle_resets_total").await;
    assert_eq!(idle, 1.0);
}

/// A streamed answer to a client that grants its window a little at a time (1 000 bytes, each
/// time it has read all it granted) arrives whole, in order and within the window: the
/// proxy's pipe, which counts the window `h2` assigned it and asks again only past that,
/// misses no grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_paced_by_small_windows_arrives_whole() {
    const STEP: usize = 1_000;
    let b = slow_counting_backend(Duration::ZERO).await;
    let proxy = start(&config_for(&[b.addr], "round-robin", "")).await;
    let mut h2 = RawH2::connect(proxy.listeners()[0], &[(h2raw::INITIAL_WINDOW_SIZE, 0)])
        .await
        .expect("connect");
    h2.window_update(0, 1 << 30)
        .await
        .expect("connection window");
    let id = h2.request("GET", "/big", true).await.expect("HEADERS");
    let (mut body, mut granted) = (Vec::new(), 0);
    loop {
        if body.len() == granted {
            h2.window_update(id, STEP as u32).await.expect("window");
            granted += STEP;
        }
        let f = frame(&mut h2).await.expect("the answer's frames");
        if f.stream != id {
            continue;
        }
        if f.kind == h2raw::DATA {
            body.extend_from_slice(&f.payload);
            assert!(
                body.len() <= granted,
                "{} bytes for {granted} granted",
                body.len()
            );
        }
        if f.ends_stream() {
            break;
        }
    }
    assert_eq!(body.len(), SLOW_BIG);
    assert!(
        body.iter().all(|&c| c == b'x'),
        "the body as the backend sent it"
    );
}

/// An answer waiting for the client's window is bounded by its route's `timeout_ms` when that
/// is shorter than `stream_idle_timeout_ms` (each write's limit, as on the HTTP/1.1 fast path).
#[tokio::test]
async fn a_zero_window_answer_is_bounded_by_its_route_timeout() {
    let backend = slow_counting_backend(Duration::ZERO).await.addr;
    let text =
        config_for(&[backend], "round-robin", "").replace("timeout_ms = 5000", "timeout_ms = 800");
    let proxy = start(&text).await;
    let mut h2 = RawH2::connect(proxy.listeners()[0], &[(h2raw::INITIAL_WINDOW_SIZE, 0)])
        .await
        .expect("connect");
    let started = Instant::now();
    let stuck = h2.request("GET", "/big", true).await.expect("HEADERS");
    let reset = until(&mut h2, |f| {
        f.stream == stuck && f.kind == h2raw::RST_STREAM
    })
    .await;
    let at = started.elapsed();
    assert_eq!(reset.and_then(|f| f.error_code()), Some(CANCEL));
    assert!(
        at >= Duration::from_millis(700) && at < Duration::from_millis(1800),
        "{at:?}"
    );
}

/// `max_requests_per_connection` over HTTP/2: after that many streams the connection gets a
/// graceful `GOAWAY` (`NO_ERROR`), every stream is answered, and it closes.
#[tokio::test]
async fn http2_connections_are_capped_at_max_requests() {
    let backend = slow_counting_backend(Duration::ZERO).await.addr;
    let text = config_for(&[backend], "round-robin", "")
        .replace("[limits]\n", "[limits]\nmax_requests_per_connection = 5\n");
    let proxy = start(&text).await;
    let mut h2 = RawH2::connect(proxy.listeners()[0], &[])
        .await
        .expect("connect");
    let mut goaways = Vec::new();
    for _ in 0..5 {
        let id = h2.request("GET", "/", true).await.expect("HEADERS");
        let end = until(&mut h2, |f| {
            if f.kind == GOAWAY {
                goaways.push(f.error_code());
            }
            f.stream == id && f.ends_stream()
        })
        .await;
        assert!(end.is_some(), "stream {id} answered");
    }
    while let Some(f) = frame(&mut h2).await {
        if f.kind == GOAWAY {
            goaways.push(f.error_code());
        }
    }
    assert!(!goaways.is_empty(), "a GOAWAY after the fifth stream");
    assert!(goaways.iter().all(|c| *c == Some(0)), "{goaways:?}");
    let capped = "lbkit_proxy_client_connections_limited_total{reason=\"max_requests\"}";
    assert_eq!(sample(&proxy, capped).await, 1.0);
}

/// An idle HTTP/2 connection is closed gracefully: a stream the client opened before it saw
/// the `GOAWAY` (here: after it, while the proxy still waits for its `PING`'s answer, so
/// before the final `GOAWAY` names the last stream taken) is still answered, then the
/// connection closes. (The first version stopped taking streams at the idle `GOAWAY`.)
#[tokio::test]
async fn a_stream_racing_the_idle_goaway_is_still_answered() {
    let backend = slow_counting_backend(Duration::ZERO).await.addr;
    let text = config_for(&[backend], "round-robin", "")
        .replace("[limits]\n", "[limits]\nidle_timeout_ms = 300\n");
    let proxy = start(&text).await;
    let mut h2 = RawH2::connect(proxy.listeners()[0], &[])
        .await
        .expect("connect");
    h2.stop_answering_pings();
    let first = h2.request("GET", "/", true).await.expect("HEADERS");
    let answered = until(&mut h2, |f| f.stream == first && f.ends_stream()).await;
    assert!(answered.is_some(), "a first request");
    // Then idle: the graceful GOAWAY comes.
    let goaway = until(&mut h2, |f| f.kind == GOAWAY)
        .await
        .expect("a GOAWAY");
    assert_eq!(goaway.error_code(), Some(0));
    let id = h2.request("GET", "/", true).await.expect("HEADERS");
    let answered = until(&mut h2, |f| f.stream == id && f.ends_stream()).await;
    assert!(
        answered.is_some(),
        "the stream sent before the last GOAWAY is answered"
    );
    // ... and the connection closes (within the head limit, 300 ms here).
    assert!(until(&mut h2, |_| false).await.is_none());
}

/// `max_requests_per_connection` on the HTTP/1.1 fast path: the last request's answer carries
/// `Connection: close` and the connection closes (nginx's `keepalive_requests`); a request
/// pipelined after it is not served.
#[tokio::test]
async fn http1_connections_are_capped_at_max_requests() {
    let backend = slow_counting_backend(Duration::ZERO).await.addr;
    let text = config_for(&[backend], "round-robin", "")
        .replace("[limits]\n", "[limits]\nmax_requests_per_connection = 3\n");
    let proxy = start(&text).await;
    let one = "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n";
    let raw = one.repeat(4);
    let answer = raw_exchange(proxy.listeners()[0], raw.as_bytes(), false).await;
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 3, "{answer}");
    let last = answer.rsplit("HTTP/1.1 200").next().expect("an answer");
    assert!(
        last.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
}

/// The burst rapid reset (CVE-2023-44487: streams reset as soon as they are opened, before
/// the server accepted them) still meets `h2`'s own guard: `GOAWAY ENHANCE_YOUR_CALM`.
#[tokio::test]
async fn a_burst_rapid_reset_gets_goaway() {
    let backend = slow_counting_backend(Duration::ZERO).await.addr;
    let proxy = start(&config_for(&[backend], "round-robin", "")).await;
    let mut h2 = RawH2::connect(proxy.listeners()[0], &[])
        .await
        .expect("connect");
    for _ in 0..1000 {
        let Ok(id) = h2.request("GET", "/", true).await else {
            break;
        };
        if h2.reset(id, CANCEL).await.is_err() {
            break;
        }
    }
    let goaway = until(&mut h2, |f| f.kind == GOAWAY)
        .await
        .expect("a GOAWAY");
    assert_eq!(goaway.error_code(), Some(ENHANCE_YOUR_CALM));
}

/// A header block that never ends (`HEADERS` without `END_HEADERS`, then `CONTINUATION` frames
/// without end: the CONTINUATION flood) and one larger than `max_header_bytes` (an HPACK bomb
/// decodes into one) end the connection; no request reaches the backend.
#[tokio::test]
async fn continuation_floods_and_oversized_header_lists_end_the_connection() {
    let b = slow_counting_backend(Duration::ZERO).await;
    let (backend, accepted) = (b.addr, b.accepted.clone());
    let proxy = start(&config_for(&[backend], "round-robin", "")).await;
    let before = accepted.load(Ordering::SeqCst);
    let to = proxy.listeners()[0];
    let mut h2 = RawH2::connect(to, &[]).await.expect("connect");
    // The start of a literal header field (a new name `x`, its value 127 + bytes long), and
    // no end: 200 `CONTINUATION` frames of 16 KB.
    let mut wire = h2raw::encode(
        h2raw::HEADERS,
        0x1,
        1,
        &[0x00, 0x01, b'x', 0x7f, 0xff, 0xff, 0x03],
    );
    for _ in 0..200 {
        wire.extend(h2raw::encode(h2raw::CONTINUATION, 0, 1, &[b'v'; 16 * 1024]));
    }
    let _ = h2.raw(wire);
    let goaway = until(&mut h2, |f| f.kind == GOAWAY).await;
    assert!(goaway.is_some(), "the connection ends with GOAWAY");
    assert!(until(&mut h2, |_| false).await.is_none(), "and closes");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        before,
        "nothing reached the backend"
    );
}
