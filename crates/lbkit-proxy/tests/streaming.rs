//! Bodies of any size through the proxy: chunked uploads and downloads stream
//! whole, and pooled upstream connections carry sequential requests of every kind.

mod common;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use common::{admin, client, config_text, counting_server, get, start, Backend, WAIT};
use http::{Method, Request, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

/// A request body of several chunks and no announced length (sent chunked).
struct Chunks(Vec<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop().map(|b| Ok(Frame::data(b))))
    }
}

/// A backend echoing each request body back as a chunked stream, counting its connections.
async fn echo_backend() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    counting_server(|stream| async move {
        let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
            Ok::<_, Infallible>(Response::new(req.into_body()))
        });
        let _ = auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), svc)
            .await;
    })
    .await
}

#[tokio::test]
async fn chunked_bodies_stream_both_ways_on_one_reused_connection() {
    let (addr, accepted) = echo_backend().await;
    // `config_text` takes backends; point a placeholder's address at the echo server.
    let placeholder = Backend::start("unused").await;
    let text = config_text(&[&placeholder], "round-robin", "")
        .replace(&placeholder.addr.to_string(), &addr.to_string());
    let proxy = start(&text).await;
    let front = proxy.listeners()[0];
    let streaming: Client<_, Chunks> = Client::builder(TokioExecutor::new()).build_http();
    let small = client();
    for (round, method) in [Method::POST, Method::PUT, Method::POST]
        .into_iter()
        .enumerate()
    {
        // 300 KiB in 30 chunks: above every buffering bound, so it streams up and back down.
        let chunks: Vec<Bytes> = (0..30u8)
            .map(|i| Bytes::from(vec![b'a' + (i + round as u8) % 26; 10 * 1024]))
            .collect();
        let expected: Vec<u8> = chunks.iter().rev().flat_map(|c| c.to_vec()).collect();
        let req = Request::builder()
            .method(method)
            .uri(format!("http://{front}/up"))
            .body(Chunks(chunks))
            .expect("request");
        let resp = tokio::time::timeout(WAIT, streaming.request(req))
            .await
            .expect("in time")
            .expect("response");
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().get("content-length").is_none());
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(body.as_ref() == expected.as_slice(), "round {round}");
        // A buffered exchange in between.
        assert_eq!(get(&small, front, "/", &[]).await.0, StatusCode::OK);
    }
    // Every exchange was sequential on this one thread: the chunked ones (served by hyper) on
    // one pooled upstream connection, the plain GETs (the HTTP/1 fast path) on another.
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let (_, doc) = admin(&small, &proxy, "GET", "/endpoints", "").await;
    let doc: serde_json::Value = serde_json::from_str(&doc).expect("json");
    let ep = &doc["services"]["svc"]["endpoints"][0];
    assert_eq!(ep["in_flight"].as_u64(), Some(0), "{doc}");
    assert_eq!(ep["failures"].as_u64(), Some(0), "{doc}");
}

/// A bidirectional stream, as a gRPC chat or a watch with acknowledgements runs one: each
/// message the client sends comes back before it sends the next, so neither direction may wait
/// for the other's end, nor for more bytes than one message. Over h2c from the client, to an
/// h2c upstream and to an HTTP/1.1 one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bidirectional_stream_goes_message_by_message() {
    let (addr, _) = echo_backend().await;
    for upstream in ["h2c = true", ""] {
        let text = common::config_for(&[addr], "round-robin", upstream);
        let proxy = start(&text).await;
        let stream = tokio::net::TcpStream::connect(proxy.listeners()[0])
            .await
            .expect("connect");
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("h2c");
        tokio::spawn(conn);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
        let frames = Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|f| (f, rx))
        }));
        let req = Request::post("http://svc.test/chat.Chat/Talk")
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(http_body_util::StreamBody::new(frames))
            .expect("a request");
        let resp = tokio::time::timeout(WAIT, send.send_request(req))
            .await
            .unwrap_or_else(|_| panic!("{upstream:?}: the answer's head in time"))
            .expect("a response");
        assert_eq!(resp.status(), StatusCode::OK, "{upstream:?}");
        let mut answer = resp.into_body();
        for i in 0..5 {
            let message = format!("message {i}");
            tx.send(Ok(Frame::data(Bytes::from(message.clone()))))
                .await
                .expect("the request stream is open");
            let mut got = Vec::new();
            while got.len() < message.len() {
                let frame = tokio::time::timeout(WAIT, answer.frame())
                    .await
                    .unwrap_or_else(|_| panic!("{upstream:?}: {message} echoed in time"))
                    .expect("the answer goes on")
                    .expect("a frame");
                got.extend_from_slice(&frame.into_data().expect("data"));
            }
            assert_eq!(got, message.as_bytes(), "{upstream:?}");
        }
        drop(tx);
        let end = tokio::time::timeout(WAIT, async {
            while let Some(frame) = answer.frame().await {
                frame.expect("a clean end");
            }
        });
        end.await
            .unwrap_or_else(|_| panic!("{upstream:?}: the end in time"));
    }
}
