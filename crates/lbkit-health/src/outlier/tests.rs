use super::*;
use lbkit_core::{EndpointSpec, FailureKind, Outcome, SnapshotPolicy};
use std::sync::Arc;

const T0: Timestamp = Timestamp::from_millis(1_000_000);

fn at(s: u64) -> Timestamp {
    T0 + Duration::from_secs(s)
}

fn snap(n: usize) -> Arc<Snapshot> {
    Arc::new(Snapshot::from_specs(
        (0..n)
            .map(|i| EndpointSpec::new(format!("10.0.0.{i}:80")))
            .collect(),
        T0,
    ))
}

fn calls(s: &Snapshot, i: usize, ok: u64, failed: u64, now: Timestamp) {
    let stats = s.endpoints()[i].stats();
    for _ in 0..ok {
        stats.record(Duration::from_millis(1), now, Outcome::Success);
    }
    for _ in 0..failed {
        stats.record(
            Duration::from_millis(1),
            now,
            Outcome::Failure(FailureKind::Server),
        );
    }
}

fn only_consecutive() -> OutlierConfig {
    OutlierConfig {
        success_rate: None,
        failure_percentage: None,
        ..OutlierConfig::default()
    }
}

#[test]
fn consecutive_failures_eject_then_time_is_served_and_doubles() {
    let s = snap(10);
    let mut d = OutlierDetector::new(only_consecutive());
    calls(&s, 2, 0, 4, T0);
    assert!(!d.tick(&s, at(0)), "4 failures: not yet");
    calls(&s, 2, 0, 1, T0);
    assert!(d.tick(&s, at(10)));
    let key = s.endpoints()[2].key().clone();
    assert_eq!(d.ejection(&key).unwrap().until, at(40), "30 s × 1");
    assert_eq!(
        d.ejection(&key).unwrap().rule,
        EjectionRule::ConsecutiveFailures(5)
    );
    assert!(!d.tick(&s, at(30)), "still serving its time");
    assert!(d.tick(&s, at(40)), "readmitted");
    assert_eq!(d.overlay().readmitted.get(&key), Some(&at(40)));
    assert_eq!(
        s.endpoints()[2].stats().consecutive_failures(),
        0,
        "run cleared on readmission"
    );
    // Fails again at once: 60 s this time.
    calls(&s, 2, 0, 5, at(41));
    assert!(d.tick(&s, at(45)));
    assert_eq!(d.ejection(&key).unwrap().until, at(105));
    assert_eq!(d.ejection(&key).unwrap().times, 2);
}

#[test]
fn ejection_time_is_capped_and_the_multiplier_decays_while_serving() {
    let cfg = OutlierConfig {
        max_ejection_time: Duration::from_secs(50),
        ..only_consecutive()
    };
    let s = snap(10);
    let mut d = OutlierDetector::new(cfg);
    let key = s.endpoints()[0].key().clone();
    let mut now = 0;
    for round in 1..=3u64 {
        calls(&s, 0, 0, 5, at(now));
        d.tick(&s, at(now));
        let ej = *d.ejection(&key).unwrap();
        assert_eq!(ej.until, at(now + (30 * round).min(50)), "round {round}");
        now = (ej.until.as_millis() - T0.as_millis()) / 1000;
        d.tick(&s, at(now)); // readmitted
    }
    // Serving for several intervals brings the multiplier back down.
    for k in 1..=3 {
        d.tick(&s, at(now + 10 * k));
    }
    calls(&s, 0, 0, 5, at(now + 31));
    d.tick(&s, at(now + 31));
    assert_eq!(d.ejection(&key).unwrap().times, 1);
}

#[test]
fn at_most_ten_percent_but_at_least_one() {
    let s = snap(10);
    let mut d = OutlierDetector::new(only_consecutive());
    for i in 0..4 {
        calls(&s, i, 0, 6, T0);
    }
    d.tick(&s, at(0));
    assert_eq!(d.overlay().ejected.len(), 1, "10 % of 10");
    let s30 = snap(30);
    let mut d = OutlierDetector::new(only_consecutive());
    for i in 0..10 {
        calls(&s30, i, 0, 6, T0);
    }
    d.tick(&s30, at(0));
    assert_eq!(d.overlay().ejected.len(), 3);
    let s3 = snap(3);
    let mut d = OutlierDetector::new(only_consecutive());
    for i in 0..3 {
        calls(&s3, i, 0, 6, T0);
    }
    d.tick(&s3, at(0));
    assert_eq!(d.overlay().ejected.len(), 1, "at least one");
}

#[test]
fn success_rate_deviation() {
    let s = snap(10);
    let cfg = OutlierConfig {
        consecutive_failures: None,
        failure_percentage: None,
        ..OutlierConfig::default()
    };
    let mut d = OutlierDetector::new(cfg);
    d.tick(&s, T0); // baseline
    for i in 0..10 {
        // Interleave so no run of 5 failures builds up; endpoint 7 fails 40 %.
        let failed = if i == 7 { 80 } else { 2 };
        for _ in 0..failed {
            calls(&s, i, 1, 1, at(1));
        }
        calls(&s, i, 200 - 2 * failed, 0, at(1));
    }
    assert!(d.tick(&s, at(10)));
    let ej = d.ejection(s.endpoints()[7].key()).unwrap();
    match ej.rule {
        EjectionRule::SuccessRate { rate, threshold } => assert!(
            rate < threshold && (rate - 60.0).abs() < 1e-9,
            "{rate} {threshold}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(d.overlay().ejected.len(), 1);
    // Too little traffic: the rule does not run.
    let quiet = snap(10);
    let mut d = OutlierDetector::new(cfg);
    calls(&quiet, 0, 0, 99, T0);
    assert!(!d.tick(&quiet, at(10)));
}

#[test]
fn failure_percentage_rule() {
    let s = snap(6);
    let cfg = OutlierConfig {
        consecutive_failures: None,
        success_rate: None,
        ..OutlierConfig::default()
    };
    let mut d = OutlierDetector::new(cfg);
    for i in 0..6 {
        let (ok, failed) = if i == 4 { (5, 45) } else { (50, 0) };
        calls(&s, i, ok, failed, T0);
    }
    assert!(d.tick(&s, at(10)));
    assert_eq!(
        d.ejection(s.endpoints()[4].key()).unwrap().rule,
        EjectionRule::FailurePercentage { percent: 90.0 }
    );
}

#[test]
fn the_overlay_drives_a_snapshot_and_panic_mode() {
    let s = snap(2);
    let mut d = OutlierDetector::new(only_consecutive());
    calls(&s, 0, 0, 5, T0);
    d.tick(&s, at(0));
    let ejected = s.derive(1, &SnapshotPolicy::default(), d.overlay());
    assert_eq!(ejected.eligible().len(), 1);
    let panic = s.derive(
        1,
        &SnapshotPolicy {
            panic_threshold: 0.6,
            slow_start: None,
        },
        d.overlay(),
    );
    assert!(panic.in_panic(), "1 of 2 healthy < 60 %");
    assert_eq!(panic.eligible().len(), 2);
}

#[test]
fn endpoints_that_leave_are_forgotten() {
    let s = snap(10);
    let mut d = OutlierDetector::new(only_consecutive());
    calls(&s, 2, 0, 5, T0);
    assert!(d.tick(&s, at(10)));
    let key = s.endpoints()[2].key().clone();
    assert_eq!(d.ejection(&key).unwrap().times, 1);
    // Endpoint 2 leaves: its track and its ejection go with it.
    let without: Vec<EndpointSpec> = (0..10)
        .filter(|&i| i != 2)
        .map(|i| EndpointSpec::new(format!("10.0.0.{i}:80")))
        .collect();
    let fewer = Snapshot::from_specs(without, at(11));
    assert!(!d.tick(&fewer, at(11)));
    assert!(d.ejection(&key).is_none());
    assert!(!d.overlay().ejected.contains_key(&key));
    assert_eq!(d.tracks.len(), 9);
    // Back with the same address: a new endpoint, first ejection again (30 s, not 60 s).
    let back = snap(10);
    assert!(!d.tick(&back, at(12)));
    calls(&back, 2, 0, 5, at(12));
    assert!(d.tick(&back, at(13)));
    assert_eq!(d.ejection(&key).unwrap().times, 1);
    assert_eq!(d.ejection(&key).unwrap().until, at(43));
}
