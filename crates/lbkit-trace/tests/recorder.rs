//! The recorder and reader together, through real balancers and the shared call loop.

use std::path::PathBuf;
use std::sync::Arc;

use lbkit_core::*;
use lbkit_trace::{read, read_segment, Recorder, TraceConfig, TraceError, TraceOutcome};

/// Each eligible endpoint in turn (by attempt, so a retry moves on).
struct Rr;
struct RrPicker(Arc<Snapshot>);
impl Picker for RrPicker {
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let e = self.0.eligible();
        Ok(e[(cx.attempt as usize + cx.probe as usize) % e.len()])
    }
}
impl Strategy for Rr {
    type Picker = RrPicker;
    fn name(&self) -> &str {
        "rr"
    }
    fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> RrPicker {
        RrPicker(s.clone())
    }
}

/// A fresh directory, removed with everything in it when the value drops.
fn dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("lbkit-trace-{name}-"))
        .tempdir()
        .unwrap()
}

fn balancer(n: usize, now: Timestamp) -> Balancer<Rr> {
    let specs = (0..n)
        .map(|i| EndpointSpec::new(format!("10.0.0.{}:80", i + 1)))
        .collect();
    Balancer::new(Rr, Arc::new(Snapshot::from_specs(specs, now)), now)
}

#[test]
fn every_attempt_of_a_sampled_request_is_recorded_with_its_fields() {
    let d = dir("fields");
    let config = TraceConfig::new(d.path().join("t.lbkt")).with_sample_rate(1.0);
    let recorder = Recorder::open(&config).unwrap();
    let t0 = Timestamp::from_millis(1_700_000_000_000);
    let shop = recorder.attach(balancer(3, t0), "shop");
    let cart = recorder.attach(balancer(2, t0), "cart");
    let budget = RetryBudget::default();
    let (clock, _hand) = Clock::manual(t0);
    let mut rng = FastRng::seed_from_u64(3);
    let policy = AttemptPolicy {
        retries: 2,
        per_try: None,
        overall: None,
    };
    // shop: a 503, then a success on the next endpoint.
    let mut call = Attempts::start(policy, &budget, true, true, t0);
    let first = call.pick(&shop, t0, Route::default(), &mut rng).unwrap();
    let no_tries = TriedSet::new();
    let busy = shop // one more call in flight, on the endpoint the retry goes to
        .pick(&mut PickContext::new(t0, &mut rng).with_tried(1, &no_tries))
        .unwrap();
    assert_eq!(busy.endpoint().address(), "10.0.0.2:80");
    let c = Observed::Status(503).classify();
    let t1 = Timestamp::from_nanos(t0.as_nanos() + 5_000_000);
    first.finish_at(c.outcome, t1);
    assert_eq!(call.after(c, &budget, &clock), Next::Retry);
    let second = call.pick(&shop, t1, Route::default(), &mut rng).unwrap();
    assert_eq!(second.trace_id(), call.trace());
    second.finish_at(
        Outcome::Success,
        Timestamp::from_nanos(t1.as_nanos() + 7_000_000),
    );
    drop(busy); // cancelled
                // cart: a timeout.
    let g = cart.pick(&mut PickContext::new(t0, &mut rng)).unwrap();
    g.finish_at(Outcome::Failure(FailureKind::Timeout), t1);
    recorder.flush();

    let trace = read(&config.path).unwrap();
    assert_eq!((trace.segments, trace.truncated), (1, false));
    let r = &trace.records;
    assert_eq!(r.len(), 4, "{r:#?}");
    let (a, b) = (&r[0], &r[1]);
    assert_eq!(
        (
            &*a.service,
            &*a.strategy,
            &*a.endpoint,
            a.outcome,
            a.attempt,
            a.retry
        ),
        ("shop", "rr", "10.0.0.1:80", TraceOutcome::Server, 0, false)
    );
    assert_eq!((a.latency_ns, a.picked_at_ns), (5_000_000, t0.as_nanos()));
    assert_eq!(
        (&*b.endpoint, b.outcome, b.attempt, b.retry, b.latency_ns),
        ("10.0.0.2:80", TraceOutcome::Success, 1, true, 7_000_000)
    );
    assert_eq!(a.request, b.request, "one request, two attempts");
    assert_eq!(b.in_flight, 1, "the other call on 10.0.0.2 was in flight");
    assert_eq!(r[2].outcome, TraceOutcome::Cancelled);
    assert_ne!(r[2].request, a.request);
    assert_eq!(
        (&*r[3].service, r[3].outcome),
        ("cart", TraceOutcome::Timeout)
    );
    let stats = recorder.stats();
    assert_eq!((stats.written, stats.dropped, stats.lost), (4, 0, 0));
    let json = serde_json::to_string(&r[1]).unwrap();
    assert!(
        json.contains("\"outcome\":\"success\"") && json.contains("\"retry\":true"),
        "{json}"
    );
}

#[test]
fn a_sample_rate_keeps_that_share_of_requests_and_all_their_attempts() {
    let d = dir("rate");
    let config = TraceConfig::new(d.path().join("t.lbkt")).with_sample_rate(0.1);
    let recorder = Recorder::open(&config).unwrap();
    let now = Timestamp::from_millis(1_000);
    let lb = recorder.attach(balancer(4, now), "svc");
    let budget = RetryBudget::default();
    let (clock, _hand) = Clock::manual(now);
    let mut rng = FastRng::seed_from_u64(11);
    let policy = AttemptPolicy {
        retries: 1,
        per_try: None,
        overall: None,
    };
    let mut made = std::collections::HashMap::<u64, Vec<u16>>::new();
    for _ in 0..10_000 {
        let mut call = Attempts::start(policy, &budget, true, true, now);
        let g = call.pick(&lb, now, Route::default(), &mut rng).unwrap();
        let c = Observed::ConnectFailed.classify();
        g.finish_at(c.outcome, now);
        let mut attempts = vec![0];
        if call.after(c, &budget, &clock) == Next::Retry {
            let g = call.pick(&lb, now, Route::default(), &mut rng).unwrap();
            g.finish_at(Outcome::Success, now);
            attempts.push(1);
        }
        if let Some(id) = call.trace().request() {
            made.insert(id, attempts);
        }
    }
    recorder.flush();
    let trace = read(&config.path).unwrap();
    let mut by_request = std::collections::HashMap::<u64, Vec<u16>>::new();
    for r in &trace.records {
        by_request.entry(r.request).or_default().push(r.attempt);
    }
    let n = by_request.len();
    assert!(
        (850..=1150).contains(&n),
        "{n} of 10000 requests sampled at 0.1"
    );
    assert!(
        made.values().any(|a| a.len() == 2),
        "some requests were retried"
    );
    assert_eq!(
        by_request, made,
        "a sampled request has every attempt it made"
    );
}

#[test]
fn the_files_stay_within_max_bytes_and_each_segment_reads_alone() {
    let d = dir("rotate");
    let path = d.path().join("t.lbkt");
    let config = TraceConfig::new(&path)
        .with_sample_rate(1.0)
        .with_max_bytes(64 * 1024);
    let recorder = Recorder::open(&config).unwrap();
    let now = Timestamp::from_millis(1_000);
    let lb = recorder.attach(balancer(50, now), "svc");
    let mut rng = FastRng::seed_from_u64(5);
    for i in 0..20_000u64 {
        let at = Timestamp::from_nanos(now.as_nanos() + i);
        let g = lb
            .pick(&mut PickContext::new(at, &mut rng).with_tried(i as u32 % 50, &TriedSet::new()))
            .unwrap();
        g.finish_at(Outcome::Success, at);
        if i % 4_000 == 0 {
            recorder.flush(); // keep the queue from overflowing in a slow debug build
        }
    }
    recorder.flush();
    let stats = recorder.stats();
    assert!(stats.rotations >= 2, "{stats:?}");
    let older = lbkit_trace::previous_segment(&path);
    let size = |p: &PathBuf| std::fs::metadata(p).unwrap().len();
    assert!(
        size(&path) + size(&older) <= 64 * 1024,
        "{} + {}",
        size(&path),
        size(&older)
    );
    let a = read_segment(&older).unwrap();
    let b = read_segment(&path).unwrap();
    assert!(!a.records.is_empty() && !b.records.is_empty());
    let both = read(&path).unwrap();
    assert_eq!(both.records.len(), a.records.len() + b.records.len());
    assert_eq!(both.segments, 2);
    let last = both.records.last().unwrap();
    assert_eq!(
        last.picked_at_ns,
        now.as_nanos() + 19_999,
        "the newest records are kept"
    );
    assert_eq!(stats.dropped, 0, "{stats:?}");

    // A new recorder on the same path keeps the last segment as PATH.1.
    drop(recorder);
    let before = read_segment(&path).unwrap().records.len();
    let again = Recorder::open(&config).unwrap();
    drop(again);
    assert_eq!(read_segment(&older).unwrap().records.len(), before);
    assert!(read_segment(&path).unwrap().records.is_empty());
}

#[test]
fn a_cut_file_keeps_its_whole_records_and_bad_files_are_named() {
    let d = dir("bad");
    let path = d.path().join("t.lbkt");
    let config = TraceConfig::new(&path).with_sample_rate(1.0);
    let recorder = Recorder::open(&config).unwrap();
    let now = Timestamp::from_millis(1_000);
    let lb = recorder.attach(balancer(2, now), "svc");
    let mut rng = FastRng::seed_from_u64(5);
    for _ in 0..10 {
        lb.pick(&mut PickContext::new(now, &mut rng))
            .unwrap()
            .finish_at(Outcome::Success, now);
    }
    drop(recorder);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
    let t = read(&path).unwrap();
    assert_eq!((t.records.len(), t.truncated), (9, true));

    std::fs::write(&path, b"hello, world: not a trace").unwrap();
    let e = read(&path).unwrap_err();
    assert!(
        matches!(e, TraceError::Format { .. }) && e.to_string().contains("not an lbkit trace"),
        "{e}"
    );
    let mut v2 = bytes.clone();
    v2[8] = 2;
    std::fs::write(&path, &v2).unwrap();
    let e = read(&path).unwrap_err().to_string();
    assert!(
        e.contains("version 2") && e.contains("reads version 1"),
        "{e}"
    );
    let mut bad_kind = bytes[..16].to_vec();
    bad_kind.push(9);
    std::fs::write(&path, &bad_kind).unwrap();
    let e = read(&path).unwrap_err().to_string();
    assert!(e.contains("byte 16: unknown record kind 9"), "{e}");
    // Records that name what was never defined, or an unknown outcome, or a name that is not
    // UTF-8: stream 7 (service "s", strategy "r"), then attempts to stream 7 / endpoint 3.
    let text = |t: &[u8]| [&(t.len() as u16).to_le_bytes()[..], t].concat();
    let stream = |name: &[u8]| {
        [
            &[1u8][..],
            &7u32.to_le_bytes(),
            &text(name),
            &text(b"r"),
            &1f64.to_le_bytes(),
        ]
        .concat()
    };
    let attempt = |stream: u32, endpoint: u32, outcome: u8| {
        let mut a = vec![3u8; 1];
        a.extend_from_slice(&[0; 24]);
        a.extend_from_slice(&stream.to_le_bytes());
        a.extend_from_slice(&endpoint.to_le_bytes());
        a.extend_from_slice(&[0; 6]);
        a.extend_from_slice(&[outcome, 0]);
        a
    };
    let endpoint = [&[2u8][..], &3u32.to_le_bytes(), &text(b"a:1")].concat();
    let header = &bytes[..16];
    let defined = [header, &stream(b"s")[..]].concat();
    let cases: [(&[u8], Vec<u8>, &str); 4] = [
        (
            header,
            attempt(7, 3, 0),
            "byte 16: attempt of stream 7 before its definition",
        ),
        (
            &defined,
            attempt(7, 3, 0),
            "attempt to endpoint 3 before its definition",
        ),
        (
            &defined,
            [&endpoint[..], &attempt(7, 3, 200)].concat(),
            "unknown outcome 200",
        ),
        (header, stream(b"\xff"), "byte 23: a name is not UTF-8"),
    ];
    for (head, records, want) in cases {
        std::fs::write(&path, [head, &records[..]].concat()).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
    // A file cut inside a record is read up to the cut, even where the record's name is bad.
    let bad = stream(b"\xff");
    std::fs::write(&path, [header, &bad[..bad.len() - 3]].concat()).unwrap();
    let t = read(&path).unwrap();
    assert_eq!((t.records.len(), t.truncated), (0, true));
    let e = read(&d.path().join("missing")).unwrap_err();
    assert!(matches!(e, TraceError::Io { .. }));

    for (config, field) in [
        (TraceConfig::new(&path).with_sample_rate(0.0), "sample_rate"),
        (TraceConfig::new(&path).with_sample_rate(1.5), "sample_rate"),
        (
            TraceConfig::new(&path).with_sample_rate(f64::NAN),
            "sample_rate",
        ),
        (TraceConfig::new(&path).with_max_bytes(1000), "max_bytes"),
        (TraceConfig::new(""), "path"),
    ] {
        let e = Recorder::open(&config).unwrap_err().to_string();
        assert!(e.starts_with(&format!("trace {field}:")), "{e}");
    }
}
