//! Record → fit → replay: a run of the simulator recorded as a proxy records it (in virtual
//! time, every request), fitted to a scenario, and replayed. Replaying the strategy that ran
//! must reproduce the recorded p50 and p99 within 10 % (issue 17's validation), and the
//! candidates' comparison must then make sense.

use std::sync::Arc;

use lbkit_sim::fit::{fit, FIT_TOLERANCE};
use lbkit_sim::{run, RunOptions, Scenario};
use lbkit_trace::{read, Recorder, TraceConfig};

const TRUTH: &str = r#"
name = "truth"
requests = 60000
[workload]
rate = 200.0
clients = 1
balancer = "shared"
timeout_ms = 2000.0
[[server]]
name = "fast"
count = 3
concurrency = 2
service = { dist = "exponential", mean_ms = 10.0 }
[[server]]
name = "slow"
concurrency = 2
service = { dist = "exponential", mean_ms = 10.0 }
slow_factor = 3.0
"#;

/// A fresh directory, removed with everything in it when the value drops.
fn dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("lbkit-sim-replay-{name}-"))
        .tempdir()
        .unwrap()
}

fn record(strategy: &str, path: &std::path::Path) -> lbkit_sim::Report {
    let truth = Scenario::parse(TRUTH, "truth").unwrap();
    let config = TraceConfig::new(path)
        .with_sample_rate(1.0)
        .with_max_bytes(256 << 20)
        .with_lossless(true);
    let recorder = Arc::new(Recorder::open(&config).unwrap());
    let report = run(
        &truth,
        &RunOptions {
            strategies: vec![strategy.into()],
            skip_oracle: true,
            record: Some(recorder.clone()),
            ..RunOptions::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    recorder.flush();
    report
}

#[test]
fn replaying_the_strategy_that_ran_reproduces_its_p50_and_p99() {
    let d = dir("rr");
    let trace_path = d.path().join("calls.lbkt");
    let truth = record("round-robin", &trace_path);
    let trace = read(&trace_path).unwrap();
    assert_eq!(trace.records.len(), 60_000, "every attempt recorded");
    let f = fit(&trace, None).unwrap();
    assert_eq!(
        (f.service.as_str(), f.strategy.as_str(), f.requests),
        ("truth", "round-robin", 60_000)
    );
    // The trace's own percentiles are the truth's (the recorder saw every request).
    let t = &truth.results[0];
    assert!(
        (f.p50_ms / t.p50_ms - 1.0).abs() < 0.01,
        "{} vs {}",
        f.p50_ms,
        t.p50_ms
    );
    assert!(
        (f.p99_ms / t.p99_ms - 1.0).abs() < 0.01,
        "{} vs {}",
        f.p99_ms,
        t.p99_ms
    );

    let scenario_path = d.path().join("fitted").join("scenario.toml");
    f.write(&scenario_path).unwrap();
    let fitted = Scenario::load(&scenario_path).unwrap();
    let replay = run(
        &fitted,
        &RunOptions {
            strategies: vec![
                "round-robin".into(),
                "p2c-ewma".into(),
                "least-active".into(),
            ],
            seed: Some(7),
            skip_oracle: true,
            ..RunOptions::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    let check = f.validate(&fitted).unwrap();
    eprintln!("{}", check.describe("round-robin"));
    assert!(
        check.p50_error().abs() <= FIT_TOLERANCE && check.p99_error().abs() <= FIT_TOLERANCE,
        "{}",
        check.describe("round-robin")
    );
    assert!(check.is_good());
    // The slow server is 1 of 4: a latency-aware strategy beats round robin on the replay, as
    // it does on the truth.
    let (rr, ewma) = (&replay.results[0], &replay.results[1]);
    assert!(
        ewma.p99_ms < rr.p99_ms,
        "p2c-ewma {} vs round robin {}",
        ewma.p99_ms,
        rr.p99_ms
    );
}

#[test]
fn a_sampled_trace_fits_poisson_arrivals_at_the_scaled_rate() {
    let d = dir("sampled");
    let path = d.path().join("calls.lbkt");
    let truth = Scenario::parse(TRUTH, "truth").unwrap();
    let config = TraceConfig::new(&path)
        .with_sample_rate(0.25)
        .with_lossless(true);
    let recorder = Arc::new(Recorder::open(&config).unwrap());
    run(
        &truth,
        &RunOptions {
            strategies: vec!["least-active".into()],
            skip_oracle: true,
            record: Some(recorder.clone()),
            ..RunOptions::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    recorder.flush();
    let f = fit(&read(&path).unwrap(), None).unwrap();
    assert_eq!(f.strategy, "least-active");
    assert!((14_000..=16_000).contains(&f.requests), "{}", f.requests);
    let rate: f64 = f
        .scenario
        .lines()
        .find_map(|l| l.strip_prefix("rate = "))
        .unwrap()
        .parse()
        .unwrap();
    assert!((180.0..=220.0).contains(&rate), "{rate}");
    assert!(
        f.notes.iter().any(|n| n.contains("Poisson")),
        "{:?}",
        f.notes
    );
    let e = fit(&read(&path).unwrap(), Some("other"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"other\" is not in the trace (it has: truth)"),
        "{e}"
    );
}

/// A simulated request that times out and fails over is one request in the trace, its attempts
/// numbered 0 and 1 (the retry carries its first attempt's tracing decision, as `Attempts`
/// does in the tower layer and the proxy), and the fit counts requests, not attempts.
#[test]
fn a_retried_request_keeps_one_id_across_its_attempts() {
    let d = dir("retries");
    let path = d.path().join("calls.lbkt");
    let text = TRUTH
        .replace("requests = 60000", "requests = 3000")
        .replace("timeout_ms = 2000.0", "timeout_ms = 40.0\nretries = 1");
    let truth = Scenario::parse(&text, "truth").unwrap();
    let config = TraceConfig::new(&path)
        .with_sample_rate(1.0)
        .with_lossless(true);
    let recorder = Arc::new(Recorder::open(&config).unwrap());
    let report = run(
        &truth,
        &RunOptions {
            strategies: vec!["round-robin".into()],
            skip_oracle: true,
            record: Some(recorder.clone()),
            ..RunOptions::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    recorder.flush();
    let trace = read(&path).unwrap();
    let retries: Vec<_> = trace.records.iter().filter(|r| r.retry).collect();
    assert!(!retries.is_empty(), "the slow server's calls time out");
    let attempts = |id: u64| trace.records.iter().filter(|r| r.request == id).count();
    for r in &retries {
        assert_eq!(r.attempt, 1);
        assert_eq!(
            attempts(r.request),
            2,
            "request {} has both attempts",
            r.request
        );
    }
    let ids: std::collections::HashSet<u64> = trace.records.iter().map(|r| r.request).collect();
    assert_eq!(ids.len() as u64, report.results[0].requests);
    assert_eq!(fit(&trace, None).unwrap().requests, 3_000);
}
