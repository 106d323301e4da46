//! The examples, run against real servers on 127.0.0.1 with bounded request counts.

#[path = "../examples/grpc.rs"]
#[allow(dead_code)]
mod grpc;

#[path = "../examples/http.rs"]
#[allow(dead_code)]
mod http_example;

use std::time::Duration;

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the example finishes within 60 s")
}

#[tokio::test]
async fn grpc_example_balances_over_three_tonic_servers() {
    let report = within(grpc::run(60)).await.unwrap();
    println!("{report:?}");
    assert_eq!(
        report.failed, 0,
        "failover hides the failing server: {report:?}"
    );
    let answered: u32 = report.answered.values().sum();
    assert_eq!(answered, 60);
    assert!(!report.answered.contains_key("failing"));
    // Three failures in a row trip the failing server's circuit breaker for 10 s.
    assert!(
        report.received.get("failing").copied().unwrap_or(0) <= 3,
        "{report:?}"
    );
    // Peak EWMA keeps most calls away from the slow server.
    let slow = report.answered.get("slow").copied().unwrap_or(0);
    assert!(slow < 15, "slow server answered {slow} of 60: {report:?}");
}

#[tokio::test]
async fn http_example_balances_over_three_hyper_servers() {
    let report = within(http_example::run(40)).await.unwrap();
    println!("{report:?}");
    assert_eq!(report.failed, 0, "{report:?}");
    let ok: u32 = report
        .responses
        .iter()
        .filter(|((status, _), _)| *status == 200)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        ok, 40,
        "every 503 was retried on another server: {report:?}"
    );
    // The breaker trips after 3 failures in a row; up to 3 more may already be in flight (the
    // example sends 4 requests at a time).
    assert!(report.received["overloaded"] <= 6, "{report:?}");
    assert_eq!(report.received["fast"] + report.received["slow"], 40);
}
