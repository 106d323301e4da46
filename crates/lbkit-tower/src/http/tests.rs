use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use lbkit_core::{CallGuard, Clock, Endpoint, EndpointSpec, EndpointStats, Timestamp};

use super::*;

fn call() -> (Completion, Arc<EndpointStats>) {
    let stats = Arc::new(EndpointStats::default());
    let ep = Endpoint::new(EndpointSpec::new("a:1"), stats.clone(), Timestamp::ZERO);
    let guard = CallGuard::new(ep, Clock::System.now(), Clock::System);
    (Completion::new(guard, Clock::System, 0), stats)
}

/// A body of data frames followed by optional trailers.
fn stream(
    frames: Vec<&'static str>,
    trailers: Option<HeaderMap>,
) -> impl http_body::Body<Data = Bytes, Error = Infallible> {
    let mut items: Vec<Result<http_body::Frame<Bytes>, Infallible>> = frames
        .into_iter()
        .map(|f| Ok(http_body::Frame::data(Bytes::from_static(f.as_bytes()))))
        .collect();
    if let Some(t) = trailers {
        items.push(Ok(http_body::Frame::trailers(t)));
    }
    http_body_util::StreamBody::new(futures_util::stream::iter(items))
}

fn grpc_trailers(code: &str) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", code.parse().unwrap());
    t
}

#[tokio::test]
async fn end_of_stream_counts_trailers() {
    let (c, stats) = call();
    let body = TrackBody::new(
        stream(vec!["a", "b"], Some(grpc_trailers("14"))),
        c,
        Outcome::Success,
        CompleteAt::EndOfStream,
        GrpcCodes::DEFAULT,
    );
    assert_eq!(stats.in_flight(), 1);
    let collected = body.collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["grpc-status"], "14");
    assert_eq!(
        (stats.in_flight(), stats.failures(), stats.successes()),
        (0, 1, 0)
    );

    let (c, stats) = call();
    let body = TrackBody::new(
        stream(vec!["a"], Some(grpc_trailers("0"))),
        c,
        Outcome::Success,
        CompleteAt::EndOfStream,
        GrpcCodes::DEFAULT,
    );
    body.collect().await.unwrap();
    assert_eq!((stats.in_flight(), stats.successes()), (0, 1));
}

#[tokio::test]
async fn first_frame_ends_the_call_early() {
    let (c, stats) = call();
    let mut body = TrackBody::new(
        stream(vec!["a", "b"], None),
        c,
        Outcome::Success,
        CompleteAt::FirstFrame,
        GrpcCodes::DEFAULT,
    );
    assert!(body.is_tracking());
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "a");
    assert!(!body.is_tracking());
    assert_eq!((stats.in_flight(), stats.successes()), (0, 1));
}

#[tokio::test]
async fn dropped_body_is_a_cancellation_and_empty_body_ends_at_once() {
    let (c, stats) = call();
    let body = TrackBody::new(
        stream(vec!["a"], None),
        c,
        Outcome::Success,
        CompleteAt::EndOfStream,
        GrpcCodes::DEFAULT,
    );
    drop(body);
    assert_eq!((stats.in_flight(), stats.cancellations()), (0, 1));

    let (c, stats) = call();
    let body = TrackBody::new(
        http_body_util::Empty::<Bytes>::new(),
        c,
        Outcome::Success,
        CompleteAt::EndOfStream,
        GrpcCodes::DEFAULT,
    );
    assert!(!body.is_tracking());
    assert_eq!((stats.in_flight(), stats.successes()), (0, 1));
}

#[tokio::test]
async fn a_failing_head_ends_with_its_body_and_its_outcome() {
    // A 503 streamed to the end: one failure, recorded when the body ends.
    let (c, stats) = call();
    let mut body = TrackBody::new(
        stream(vec!["a", "b"], None),
        c,
        Outcome::Failure(FailureKind::Server),
        CompleteAt::EndOfStream,
        GrpcCodes::DEFAULT,
    );
    body.frame().await.unwrap().unwrap();
    assert_eq!(
        (stats.in_flight(), stats.failures()),
        (1, 0),
        "still in flight"
    );
    while body.frame().await.is_some() {}
    assert_eq!((stats.in_flight(), stats.failures()), (0, 1));
}

#[test]
fn response_classification() {
    let p = HttpResponses::new();
    let resp = |status: u16, grpc: Option<&str>| {
        let mut r = http::Response::builder().status(status);
        if let Some(g) = grpc {
            r = r.header("grpc-status", g);
        }
        r.body(http_body_util::Empty::<Bytes>::new()).unwrap()
    };
    assert_eq!(p.classify(&resp(200, None)), Outcome::Success);
    assert_eq!(p.classify(&resp(404, None)), Outcome::Success);
    assert_eq!(
        p.classify(&resp(503, None)),
        Outcome::Failure(FailureKind::Server)
    );
    assert_eq!(
        p.classify(&resp(504, None)),
        Outcome::Failure(FailureKind::Timeout)
    );
    assert_eq!(
        p.classify(&resp(200, Some("14"))),
        Outcome::Failure(FailureKind::Server)
    );
    assert_eq!(p.classify(&resp(200, Some("5"))), Outcome::Success);
}

#[test]
fn requests_keys_idempotency_and_replay() {
    let p = HttpRequests::new().hash_key("cookie:sid".parse().unwrap());
    let mut req = http::Request::post("http://h/cart?id=3")
        .header("cookie", "a=1; sid=s-9")
        .header("x-user", "u-1")
        .body(Full::new(Bytes::from_static(b"payload")))
        .unwrap();
    let key = p.with_hash_key(&req, |k| k.map(<[u8]>::to_vec));
    assert_eq!(key.as_deref(), Some(&b"s-9"[..]));
    assert!(!p.is_idempotent(&req), "POST");
    req.extensions_mut().insert(Idempotent);
    assert!(p.is_idempotent(&req), "marked");
    let copy = p.replay(&req).unwrap();
    assert_eq!(
        (copy.method(), copy.uri(), &copy.headers()["x-user"]),
        (req.method(), req.uri(), &req.headers()["x-user"])
    );
    assert!(copy.extensions().get::<Idempotent>().is_some());

    let src = HttpKeySource::new(&req);
    assert_eq!(src.target(), Some(&b"/cart?id=3"[..]));
    let key = |text: &str| {
        let k: KeyExtractor = text.parse().unwrap();
        k.extract(&HttpKeySource::new(&req)).map(|k| k.into_owned())
    };
    assert_eq!(
        key("path").as_deref(),
        Some(&b"/cart"[..]),
        "without the query"
    );
    assert_eq!(key("uri").as_deref(), Some(&b"/cart?id=3"[..]));
    assert_eq!(key("query:id").as_deref(), Some(&b"3"[..]));
    assert_eq!(src.header("x-user"), Some(&b"u-1"[..]));
    assert_eq!(src.source_ip(), None);
    req.extensions_mut()
        .insert(SourceAddr([10, 0, 0, 7].into()));
    let by_ip: KeyExtractor = "source-ip".parse().unwrap();
    assert_eq!(
        by_ip.extract(&HttpKeySource::new(&req)).as_deref(),
        Some(&b"10.0.0.7"[..])
    );

    let get = http::Request::get("/").body(String::new()).unwrap();
    assert!(HttpRequests::new().is_idempotent(&get));
    assert!(!HttpRequests::new()
        .idempotent_by_method(false)
        .is_idempotent(&get));
}

/// The tag `with_route` reads from `headers` under `requests`, owned.
fn tag_of(requests: &HttpRequests, headers: &[(&str, &str)]) -> Option<(Vec<u8>, bool)> {
    let mut req = http::Request::new(Bytes::new());
    for (n, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    RequestPolicy::with_route(requests, &req, |route| {
        route.tag.map(|t| (t.name.to_vec(), t.force))
    })
}

#[test]
fn tags_are_read_by_their_prepared_header_names() {
    let default = HttpRequests::new();
    assert_eq!(tag_of(&default, &[]), None);
    assert_eq!(
        tag_of(
            &default,
            &[("dubbo.tag", "gray"), ("Dubbo.Force.Tag", "TRUE")]
        ),
        Some((b"gray".to_vec(), true))
    );
    let custom = HttpRequests::new().tags(Some(
        TagHeaders::new("X-Canary", "x-canary-only").with_default(Some("blue".into()), false),
    ));
    assert_eq!(
        tag_of(&custom, &[("x-canary", "gray"), ("dubbo.tag", "red")]),
        Some((b"gray".to_vec(), false))
    );
    assert_eq!(tag_of(&custom, &[]), Some((b"blue".to_vec(), false)));
    // A name no header can have reads as absent, as a lookup by that `&str` would.
    let invalid = HttpRequests::new().tags(Some(TagHeaders::new("bad name", "x-force")));
    assert_eq!(tag_of(&invalid, &[("x-force", "true")]), None);
    assert_eq!(
        tag_of(&HttpRequests::new().tags(None), &[("dubbo.tag", "gray")]),
        None
    );
}

/// A load report in the head (when the answer is completed) or in the trailers (when the
/// body is read to its end) becomes the endpoint's last report: the tower layer's half of
/// `lbkit_tower::orca` (issue 41).
#[tokio::test]
async fn load_reports_in_heads_and_trailers_are_recorded() {
    let (c, stats) = call();
    let resp = http::Response::builder()
        .header(
            crate::orca::HEADER,
            "TEXT cpu_utilization=0.9, rps_fractional=12",
        )
        .body(stream(vec!["a"], None))
        .unwrap();
    // The balance notes every answer's signals (the head's report) before it completes one.
    let policy = HttpResponses::new();
    assert_eq!(policy.signals(&resp, Outcome::Success, &c), None);
    let tracked = policy.complete(resp, Outcome::Success, c);
    let got = stats.load_report().expect("a report from the head");
    assert_eq!((got.utilization, got.qps), (0.9, 12.0));
    tracked.into_body().collect().await.unwrap();

    let (c, stats) = call();
    let mut t = grpc_trailers("0");
    t.insert(crate::orca::HEADER_BIN, "CZqZmZmZmbk/".parse().unwrap());
    let body = TrackBody::new(
        stream(vec!["a"], Some(t)),
        c,
        Outcome::Success,
        CompleteAt::EndOfStream,
        GrpcCodes::DEFAULT,
    );
    assert!(stats.load_report().is_none());
    body.collect().await.unwrap();
    assert_eq!(stats.load_report().map(|r| r.utilization), Some(0.1));
    // A call that ends at the first frame still records the report its trailers carry.
    let (c, stats) = call();
    let mut t = grpc_trailers("0");
    t.insert(crate::orca::HEADER_BIN, "CZqZmZmZmbk/".parse().unwrap());
    let body = TrackBody::new(
        stream(vec!["a", "b"], Some(t)),
        c,
        Outcome::Success,
        CompleteAt::FirstFrame,
        GrpcCodes::DEFAULT,
    );
    body.collect().await.unwrap();
    assert_eq!(stats.in_flight(), 0, "ended at the first frame");
    assert_eq!(stats.load_report().map(|r| r.utilization), Some(0.1));
}

/// The end of a body: a failing `grpc-status` trailer makes a success a failure, and a head
/// that failed stays the failure its status said; the proxy's buffered answers use the same
/// function.
#[test]
fn trailers_decide_only_a_successful_head() {
    let unavailable = grpc_trailers("14");
    let server = Outcome::Failure(FailureKind::Server);
    let timeout = Outcome::Failure(FailureKind::Timeout);
    let d = GrpcCodes::DEFAULT;
    assert_eq!(trailers_outcome(Outcome::Success, &unavailable, d), server);
    assert_eq!(
        trailers_outcome(Outcome::Success, &grpc_trailers("0"), d),
        Outcome::Success
    );
    assert_eq!(trailers_outcome(timeout, &unavailable, d), timeout);
    assert_eq!(
        trailers_outcome(Outcome::Success, &HeaderMap::new(), d),
        Outcome::Success
    );
}
