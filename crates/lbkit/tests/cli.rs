//! Black-box tests of `lbkit pick`: every strategy reachable, published sequences, formats, and
//! every bad-input case (exit status 2, one line on stderr, never a panic).

use std::path::PathBuf;

#[path = "support/run.rs"]
mod run;
use run::{lbkit, ok};

fn lines(args: &[&str]) -> Vec<String> {
    ok(args).lines().map(str::to_owned).collect()
}

/// A temporary file with `name` and `content` in its own directory, both removed with the value.
struct TempFile {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl TempFile {
    fn new(name: &str, content: &str) -> Self {
        let dir = scratch("lbkit-cli-");
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        TempFile { path, _dir: dir }
    }
    fn path(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

/// A fresh, empty directory named `{prefix}…`, removed (with its contents) when the value drops.
fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
}

fn example_file() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/endpoints.toml").to_owned()
}

#[test]
fn nginx_smooth_weighted_order() {
    let picks = lines(&[
        "pick",
        "--strategy",
        "weighted-round-robin",
        "--endpoints",
        "a:1=5,b:1=1,c:1=1",
        "--count",
        "7",
    ]);
    assert_eq!(picks, ["a:1", "a:1", "b:1", "a:1", "c:1", "a:1", "a:1"]);
}

#[test]
fn round_robin_and_sticky_sequences() {
    let rr = lines(&["pick", "-s", "round-robin", "-e", "a:1,b:1,c:1", "-n", "4"]);
    assert_eq!(rr, ["a:1", "b:1", "c:1", "a:1"]);
    let sticky = lines(&[
        "pick",
        "-s",
        "sticky-round-robin",
        "-p",
        "n=2",
        "-e",
        "a:1,b:1",
        "-n",
        "5",
    ]);
    assert_eq!(sticky, ["a:1", "a:1", "b:1", "b:1", "a:1"]);
    let default_run = lines(&[
        "pick",
        "-s",
        "sticky-round-robin",
        "-e",
        "a:1,b:1",
        "-n",
        "4",
    ]);
    assert_eq!(default_run, ["a:1", "a:1", "a:1", "b:1"], "n defaults to 3");
}

#[test]
fn every_listed_strategy_is_reachable_and_seeded_runs_repeat() {
    let list = ok(&["pick", "--list"]);
    let names: Vec<&str> = list
        .lines()
        .filter(|l| !l.starts_with(' '))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert!(names.len() >= 6, "{list}");
    for name in names {
        let args = [
            "pick",
            "-s",
            name,
            "-e",
            "a:1=1,b:1=2,c:1=3",
            "-n",
            "50",
            "--seed",
            "7",
            "--format",
            "json",
        ];
        let first: Vec<String> = serde_json::from_str(&ok(&args)).unwrap();
        assert_eq!(first.len(), 50, "{name}");
        assert_eq!(ok(&args), ok(&args), "{name}: same seed, same picks");
    }
    let a = ok(&[
        "pick",
        "-s",
        "random",
        "-e",
        "a:1,b:1,c:1,d:1",
        "-n",
        "40",
        "--seed",
        "1",
    ]);
    let b = ok(&[
        "pick",
        "-s",
        "random",
        "-e",
        "a:1,b:1,c:1,d:1",
        "-n",
        "40",
        "--seed",
        "2",
    ]);
    assert_ne!(a, b, "different seeds give different random picks");
}

#[test]
fn one_pick_per_key_in_order() {
    let picks = lines(&[
        "pick",
        "-s",
        "round-robin",
        "-e",
        "a:1,b:1",
        "--key",
        "x",
        "--key",
        "y",
        "--key",
        "z",
    ]);
    assert_eq!(picks, ["a:1", "b:1", "a:1"]);
}

#[test]
fn warmup_from_dubbo_urls_in_explain_json() {
    let f = TempFile::new(
        "providers.txt",
        "# two providers, one deployed 150 s before --now-ms\n\
         dubbo://10.0.0.1:20880/com.acme.Greeter?weight=100\n\
         dubbo%3A%2F%2F10.0.0.2%3A20880%2Fcom.acme.Greeter%3Fweight%3D200%26timestamp%3D1699999850000\n",
    );
    let out = ok(&[
        "pick",
        "-s",
        "weighted-random",
        "-f",
        f.path(),
        "--now-ms",
        "1700000000000",
        "--explain",
        "--format",
        "json",
        "-n",
        "3",
        "--seed",
        "1",
    ]);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let eps = doc["endpoints"].as_array().unwrap();
    // Dubbo: trunc(150000 / (600000 / 200)) = 50.
    assert_eq!(eps[1]["effective_weight"], 50);
    assert_eq!(eps[1]["uptime_ms"], 150_000);
    assert_eq!(eps[0]["effective_weight"], 100);
    assert_eq!(doc["picks"].as_array().unwrap().len(), 3);
    assert!(eps[1]["strategy_note"].as_str().unwrap().contains("33.33%"));
}

#[test]
fn explain_text_on_the_shipped_example() {
    let out = ok(&[
        "pick",
        "-s",
        "weighted-round-robin",
        "-f",
        &example_file(),
        "--now-ms",
        "1700000000000",
        "--explain",
        "-n",
        "4",
    ]);
    assert!(
        out.contains("10.0.0.2:20880  weight 100 -> effective 20"),
        "{out}"
    );
    assert!(out.contains("circuit breaker tripped"), "{out}");
    assert!(out.contains("not eligible: marked down"), "{out}");
    let picks: Vec<&str> = out.split("picks:\n").nth(1).unwrap().lines().collect();
    assert_eq!(picks.len(), 4);
    assert!(!picks.contains(&"10.0.0.3:20880") && !picks.contains(&"10.0.0.4:20880"));
}

#[test]
fn json_endpoints_and_observed_statistics() {
    let f = TempFile::new(
        "eps.json",
        r#"[{"address":"a:1","avg_response_ms":10},{"address":"b:1","avg_response_ms":90},{"address":"c:1","in_flight":2}]"#,
    );
    let picks: Vec<String> = serde_json::from_str(&ok(&[
        "pick",
        "-s",
        "weighted-response-time",
        "-f",
        f.path(),
        "-n",
        "2000",
        "--seed",
        "3",
        "--format",
        "json",
        "--now-ms",
        "1000000",
    ]))
    .unwrap();
    let count = |a: &str| picks.iter().filter(|p| *p == a).count();
    // Ribbon weights: a = 100 − 10 = 90, b = 100 − 90 = 10, c (no samples) = mean 50.
    assert!(
        count("a:1") > 3 * count("c:1") / 2 && count("c:1") > 3 * count("b:1"),
        "{} {} {}",
        count("a:1"),
        count("b:1"),
        count("c:1")
    );
    let busy = lines(&[
        "pick",
        "-s",
        "round-robin",
        "-f",
        f.path(),
        "-n",
        "4",
        "--max-in-flight",
        "2",
    ]);
    assert!(!busy.contains(&"c:1".to_owned()), "{busy:?}");
}

#[test]
fn strategy_from_a_service_config() {
    let cfg = TempFile::new(
        "lbkit.toml",
        "[service.greeter]\nstrategy = \"round-robin\"\n[service.greeter.method.hello]\nstrategy = \"sticky-round-robin\"\nparams = { n = 2 }\n",
    );
    let svc = lines(&[
        "pick",
        "--config",
        cfg.path(),
        "--service",
        "greeter",
        "-e",
        "a:1,b:1",
        "-n",
        "3",
    ]);
    assert_eq!(svc, ["a:1", "b:1", "a:1"]);
    let m = lines(&[
        "pick",
        "--config",
        cfg.path(),
        "--service",
        "greeter",
        "--method",
        "hello",
        "-e",
        "a:1,b:1",
        "-n",
        "3",
    ]);
    assert_eq!(m, ["a:1", "a:1", "b:1"]);
}

#[test]
fn nothing_eligible_exits_1() {
    let f = TempFile::new(
        "drained.toml",
        "[[endpoint]]\naddress = \"a:1\"\nweight = 0\n",
    );
    let out = lbkit(&["pick", "-s", "random", "-f", f.path()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no eligible endpoint (0 marked down, 1 with weight 0"),
        "{stderr}"
    );
    let down = TempFile::new(
        "down.toml",
        "[[endpoint]]\naddress = \"a:1\"\nhealthy = false\n",
    );
    let out = lbkit(&[
        "pick",
        "-s",
        "random",
        "-f",
        down.path(),
        "--panic-threshold",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(1), "no panic mode: nothing to pick");
}

#[test]
fn panic_mode_balances_over_all_when_most_are_down() {
    let f = TempFile::new(
        "mostly-down.toml",
        "[[endpoint]]\naddress = \"a:1\"\n[[endpoint]]\naddress = \"b:1\"\nhealthy = false\n[[endpoint]]\naddress = \"c:1\"\nhealthy = false\n",
    );
    let picks = lines(&["pick", "-s", "round-robin", "-f", f.path(), "-n", "3"]);
    assert_eq!(
        picks,
        ["a:1", "b:1", "c:1"],
        "1 of 3 healthy < 50 %: all of them"
    );
    let out = ok(&["pick", "-s", "round-robin", "-f", f.path(), "--explain"]);
    assert!(
        out.contains("PANIC: fewer than 50%")
            && out.contains("eligible in panic mode: marked down"),
        "{out}"
    );
    let calm = lines(&[
        "pick",
        "-s",
        "round-robin",
        "-f",
        f.path(),
        "-n",
        "2",
        "--panic-threshold",
        "30",
    ]);
    assert_eq!(calm, ["a:1", "a:1"]);
}

#[test]
fn outlier_detection_ejects_from_observed_statistics() {
    let out = ok(&[
        "pick",
        "-s",
        "round-robin",
        "-f",
        &example_file(),
        "--now-ms",
        "1700000000000",
        "--explain",
        "-n",
        "6",
    ]);
    assert!(
        out.contains(
            "ejected by outlier detection for 30000 ms (7 consecutive failures, ejection #1)"
        ),
        "{out}"
    );
    assert!(
        !out.split("picks:").nth(1).unwrap().contains("10.0.0.5"),
        "{out}"
    );
    let kept = lines(&[
        "pick",
        "-s",
        "round-robin",
        "-f",
        &example_file(),
        "--now-ms",
        "1700000000000",
        "-n",
        "6",
        "--no-outlier",
        "--no-breaker",
    ]);
    assert!(kept.contains(&"10.0.0.5:20880".to_owned()), "{kept:?}");
}

#[test]
fn load_aware_strategies_from_observed_statistics() {
    let f = TempFile::new(
        "load.json",
        r#"[{"address":"slow:1","ewma_ms":400,"avg_response_ms":400,"in_flight":3},{"address":"fast:1","ewma_ms":5,"avg_response_ms":5},{"address":"mid:1","ewma_ms":20,"avg_response_ms":20,"in_flight":1}]"#,
    );
    for s in [
        "p2c-ewma",
        "least-active",
        "shortest-response",
        "best-available",
        "p2c-least-loaded",
        "least-request",
    ] {
        // Picks stay in flight, so three picks never bring another endpoint up to slow:1's 3.
        for seed in 0..10 {
            let picks = lines(&[
                "pick",
                "-s",
                s,
                "-f",
                f.path(),
                "-n",
                "3",
                "--seed",
                &seed.to_string(),
            ]);
            assert!(
                !picks.contains(&"slow:1".to_owned()),
                "{s} picked the slow, busy endpoint: {picks:?}"
            );
        }
    }
    let out = ok(&[
        "pick",
        "-s",
        "p2c-ewma",
        "-f",
        f.path(),
        "--explain",
        "--now-ms",
        "5000",
    ]);
    assert!(out.contains("cost 400.000 ms × 4"), "{out}");
}

#[test]
fn adaptive_from_reported_load() {
    let f = TempFile::new(
        "orca.toml",
        "[[endpoint]]\naddress = \"a:1\"\nutilization = 0.25\nqps = 100\n[[endpoint]]\naddress = \"b:1\"\nutilization = 0.75\nqps = 100\n",
    );
    let wrr = ["-s", "adaptive", "-p", "choice=wrr"];
    let picks = lines(&[&["pick", "-f", f.path(), "-n", "400"][..], &wrr].concat());
    let a = picks.iter().filter(|p| *p == "a:1").count();
    assert_eq!(a, 300, "weights 400 : 133 = 3 : 1");
    // The default choice compares latency × calls in flight scaled by the weights; `pick -n`
    // holds its picks in flight, so they spread 3 : 1 too.
    let picks = lines(&["pick", "-s", "adaptive", "-f", f.path(), "-n", "400"]);
    let a = picks.iter().filter(|p| *p == "a:1").count();
    assert!((295..=305).contains(&a), "{a}");
    // Utilisation alone (ORCA's cpu_utilization, no rps) weighs too; --explain shows the
    // report and the weight it gives.
    let f = TempFile::new(
        "cpu.toml",
        "[[endpoint]]\naddress = \"a:1\"\nutilization = 0.9\n[[endpoint]]\naddress = \"b:1\"\nutilization = 0.1\n",
    );
    let picks = lines(&[&["pick", "-f", f.path(), "-n", "1111"][..], &wrr].concat());
    let a = picks.iter().filter(|p| *p == "a:1").count();
    assert_eq!(a, 111, "weights 1/0.9 : 1/0.1");
    let args = ["pick", "-s", "adaptive", "-f", f.path(), "--explain"];
    let out = ok(&args);
    assert!(
        out.contains("load report: utilization 0.900, qps 0, eps 0"),
        "{out}"
    );
    assert!(out.contains("from its load report"), "{out}");
    assert!(out.contains("× 9.00 (reported load)"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&[&args[..], &["--format", "json"]].concat())).expect("JSON");
    let b = &json["endpoints"][1];
    assert_eq!(
        (b["address"].as_str(), b["load"]["utilization"].as_f64()),
        (Some("b:1"), Some(0.1))
    );
}

#[test]
fn zone_preference_and_slow_start() {
    let f = TempFile::new(
        "zones.toml",
        "[[endpoint]]\naddress = \"a:1\"\nzone = \"eu-1\"\n[[endpoint]]\naddress = \"b:1\"\nzone = \"eu-2\"\n[[endpoint]]\naddress = \"c:1\"\nzone = \"eu-1\"\n",
    );
    let local = lines(&[
        "pick",
        "-s",
        "round-robin",
        "-f",
        f.path(),
        "--zone",
        "eu-1",
        "-n",
        "4",
    ]);
    assert_eq!(local, ["a:1", "c:1", "a:1", "c:1"]);
    let other = lines(&[
        "pick",
        "-s",
        "round-robin",
        "-f",
        f.path(),
        "--zone",
        "eu-2",
        "-n",
        "2",
    ]);
    assert_eq!(other, ["b:1", "b:1"]);
    let out = ok(&[
        "pick",
        "-s",
        "weighted-random",
        "-e",
        "a:1,b:1",
        "--slow-start-ms",
        "60000",
        "--explain",
    ]);
    assert!(
        out.contains("weight 100 -> effective 10"),
        "just added: slow start floor 10 %: {out}"
    );
}

#[test]
fn bad_input_exits_2_with_one_clear_line() {
    let malformed = TempFile::new(
        "bad.toml",
        "[[endpoint]]\naddress = \"a:1\"\nweight = \"heavy\"\n",
    );
    let empty = TempFile::new("empty.toml", "# nothing here\n");
    let bad_url = TempFile::new("bad.txt", "dubbo://10.0.0.1/com.acme.Greeter\n");
    let bad_ext = TempFile::new("eps.yaml", "- a:1\n");
    let bad_cfg = TempFile::new("cfg.toml", "[service.g]\nstrategy = \"nope\"\n");
    let missing = "/nonexistent/lbkit/endpoints.toml";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["pick", "-s", "fastest", "-e", "a:1"],
            "unknown strategy \"fastest\"",
        ),
        (
            vec!["pick", "-s", "random", "-p", "n=3", "-e", "a:1"],
            "has no parameter \"n\"",
        ),
        (
            vec![
                "pick",
                "-s",
                "sticky-round-robin",
                "-p",
                "n=zero",
                "-e",
                "a:1",
            ],
            "n=\"zero\" is invalid",
        ),
        (
            vec!["pick", "-s", "sticky-round-robin", "-p", "n", "-e", "a:1"],
            "is not NAME=VALUE",
        ),
        (
            vec!["pick", "-s", "random", "-e", "a:1=heavy"],
            "bad weight \"heavy\"",
        ),
        (vec!["pick", "-s", "random", "-e", "a:1=-1"], "bad weight"),
        (vec!["pick", "-s", "random", "-e", ""], "empty entry"),
        (vec!["pick", "-s", "random", "-e", "nohost"], "has no port"),
        (vec!["pick", "-s", "random", "-f", missing], "cannot read"),
        (
            vec!["pick", "-s", "random", "-f", malformed.path()],
            "bad.toml:3:",
        ),
        (
            vec!["pick", "-s", "random", "-f", empty.path()],
            "no endpoints in the file",
        ),
        (
            vec!["pick", "-s", "random", "-f", bad_url.path()],
            "bad.txt:1: malformed provider URL",
        ),
        (
            vec!["pick", "-s", "random", "-f", bad_ext.path()],
            "unknown endpoints file type",
        ),
        (
            vec!["pick", "-s", "random", "-e", "a:1", "-n", "0"],
            "--count must be at least 1",
        ),
        (
            vec!["pick", "-s", "random", "-e", "a:1", "-n", "x"],
            "invalid value 'x'",
        ),
        (
            vec!["pick", "-s", "random", "-e", "a:1", "-n", "2", "-k", "x"],
            "cannot be used with",
        ),
        (vec!["pick", "-s", "random"], "required"),
        (vec!["pick", "-e", "a:1"], "required"),
        (
            vec!["pick", "-s", "random", "-e", "a:1", "--bogus"],
            "unexpected argument",
        ),
        (
            vec!["pick", "-s", "random", "-e", "a:1", "--format", "xml"],
            "invalid value 'xml'",
        ),
        (
            vec![
                "pick",
                "--config",
                bad_cfg.path(),
                "--service",
                "g",
                "-e",
                "a:1",
            ],
            "service.g.strategy: unknown strategy",
        ),
    ];
    for (args, want) in cases {
        let out = lbkit(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(want),
            "{args:?}: wanted {want:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: printed picks on error");
        if !want.contains("required")
            && !want.contains("invalid value")
            && !want.contains("unexpected")
            && !want.contains("cannot be used")
        {
            assert_eq!(
                stderr.trim_end().lines().count(),
                1,
                "{args:?}: one line, got {stderr}"
            );
        }
    }
}

#[test]
fn sim_lists_scenarios_and_reports_json_deterministically() {
    let list = ok(&["sim", "--list"]);
    for name in [
        "slow-provider",
        "warmup",
        "degraded",
        "crash",
        "hot-keys",
        "heterogeneous",
    ] {
        assert!(list.contains(name), "{list}");
    }
    let tmp = scratch("lbkit-cli-sim-");
    // Not there yet: the command makes its output directory.
    let dir = &tmp.path().join("out");
    let out = dir.to_str().unwrap();
    let args = [
        "sim",
        "--scenario",
        "crash",
        "--strategies",
        "round-robin,least-active",
        "-n",
        "3000",
        "--format",
        "json",
        "--out",
        out,
    ];
    let a = ok(&args);
    assert_eq!(a, ok(&args), "same seed, same bytes");
    let doc: serde_json::Value = serde_json::from_str(&a).unwrap();
    let names: Vec<&str> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["round-robin", "least-active", "oracle-sed"]);
    for f in [
        "ranked-p99.svg",
        "latency-cdf.svg",
        "watched-share.svg",
        "watched-queue.svg",
    ] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        roxmltree::Document::parse(&text).unwrap();
    }
    let table = ok(&[
        "sim",
        "-s",
        "slow-provider",
        "--strategies",
        "round-robin,p2c-ewma",
        "-n",
        "4000",
        "--out",
        out,
    ]);
    assert!(
        table.contains("p99 ms") && table.contains("Best p99: p2c-ewma"),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "plots: {out}/ranked-p99.svg, {out}/latency-cdf.svg"
        )),
        "{table}"
    );
    assert!(
        table.contains(&format!("report: {out}/index.html (open it in a browser)")),
        "{table}"
    );
}

#[test]
fn sim_from_a_scenario_file() {
    let f = TempFile::new(
        "tiny.toml",
        "name = \"tiny\"\nrequests = 2000\n[workload]\nrate = 100.0\n[[server]]\ncount = 2\n[[server]]\nname = \"slow\"\nslow_factor = 5.0\n",
    );
    let tmp = scratch("lbkit-cli-tiny-");
    // Not there yet: the command makes its output directory.
    let dir = &tmp.path().join("out");
    let out = ok(&[
        "sim",
        "--scenario",
        f.path(),
        "--strategies",
        "round-robin",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.contains("scenario tiny (2000 requests per strategy, seed 1)"),
        "{out}"
    );
}

#[test]
fn demo_names_a_winner() {
    let tmp = scratch("lbkit-cli-demo-");
    // Not there yet: the command makes its output directory.
    let dir = &tmp.path().join("out");
    let out = ok(&["demo", "-n", "3000", "--out", dir.to_str().unwrap()]);
    assert!(
        out.contains("Best p99: ") && out.contains("Round robin's p99 is"),
        "{out}"
    );
    assert!(out.contains("oracle-sed"), "{out}");
}

#[test]
fn sim_bad_input_exits_2() {
    let broken = TempFile::new("broken.toml", "name = \"b\"\n[[server]]\nconcurrency = 0\n");
    for (args, want) in [
        (vec!["sim", "--scenario", "nope"], "unknown scenario"),
        (
            vec!["sim", "--strategies", "fastest", "-n", "10"],
            "unknown strategy \"fastest\"",
        ),
        (
            vec!["sim", "--strategies", "ketama:x", "-n", "10"],
            "is not NAME=VALUE",
        ),
        (vec!["sim", "-n", "0"], "--requests must be within"),
        (
            vec!["sim", "--scenario", broken.path()],
            "concurrency must be positive",
        ),
        (
            vec!["sim", "--scenario", "/nonexistent/x.toml"],
            "cannot read",
        ),
        (vec!["sim", "--format", "yaml"], "invalid value 'yaml'"),
        (vec!["demo", "-n", "0"], "--requests must be within"),
    ] {
        let out = lbkit(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(want),
            "{args:?}: wanted {want:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}");
    }
}

#[test]
fn service_config_policies_apply_to_pick() {
    let cfg = TempFile::new(
        "policy.toml",
        "[service.greeter]\nstrategy = \"round-robin\"\n[service.greeter.policy]\nzone = \"eu-2\"\npanic_threshold_percent = 0\n",
    );
    let eps = TempFile::new(
        "policy-eps.toml",
        "[[endpoint]]\naddress = \"a:1\"\nzone = \"eu-1\"\n[[endpoint]]\naddress = \"b:1\"\nzone = \"eu-2\"\n[[endpoint]]\naddress = \"c:1\"\nzone = \"eu-2\"\n",
    );
    let base = [
        "pick",
        "--config",
        cfg.path(),
        "--service",
        "greeter",
        "-f",
        eps.path(),
        "-n",
        "2",
    ];
    assert_eq!(lines(&base), ["b:1", "c:1"], "zone eu-2 from the config");
    let mut flag = base.to_vec();
    flag.extend(["--zone", "eu-1"]);
    assert_eq!(
        lines(&flag),
        ["a:1", "a:1"],
        "the flag wins over the config"
    );
    let out = ok(&[&base[..], &["--explain"]].concat());
    assert!(!out.contains("PANIC"), "{out}");
}

/// `lbkit trace print` and `summary` over a trace recorded by a real balancer; bad files exit
/// with status 2 naming the problem.
#[test]
fn trace_print_gives_json_lines_and_summary_counts() {
    use lbkit_core::{Balancer, EndpointSpec, FastRng, Outcome, PickContext, Snapshot, Timestamp};
    let tmp = scratch("lbkit-cli-trace-");
    let dir = tmp.path();
    let path = dir.join("calls.lbkt");
    {
        let config = lbkit_trace::TraceConfig::new(&path).with_sample_rate(1.0);
        let recorder = lbkit_trace::Recorder::open(&config).unwrap();
        let now = Timestamp::from_millis(1_700_000_000_000);
        let specs = vec![
            EndpointSpec::new("10.0.0.1:80"),
            EndpointSpec::new("10.0.0.2:80"),
        ];
        let strategy = lbkit_strategy::catalog::build("round-robin", Default::default()).unwrap();
        let lb = recorder.attach(
            Balancer::new(
                strategy,
                std::sync::Arc::new(Snapshot::from_specs(specs, now)),
                now,
            ),
            "shop",
        );
        let mut rng = FastRng::seed_from_u64(1);
        for i in 0..3u64 {
            let g = lb.pick(&mut PickContext::new(now, &mut rng)).unwrap();
            g.finish_at(
                Outcome::Success,
                Timestamp::from_nanos(now.as_nanos() + i * 1_000_000),
            );
        }
    }
    let p = path.to_str().unwrap();
    let printed = lines(&["trace", "print", p]);
    assert_eq!(printed.len(), 3, "{printed:?}");
    let first: serde_json::Value = serde_json::from_str(&printed[0]).unwrap();
    assert_eq!(first["service"], "shop");
    assert_eq!(first["strategy"], "round-robin");
    assert_eq!(first["outcome"], "success");
    assert_eq!(first["attempt"], 0);
    assert_eq!(first["picked_at_ns"], 1_700_000_000_000_000_000u64);
    assert_eq!(lines(&["trace", "print", p, "--limit", "1"]).len(), 1);
    let summary = ok(&["trace", "summary", p]);
    assert!(
        summary.contains("shop (round-robin): 3 requests, 3 attempts (0 retries, 0 hedges), 0 failed, 2 endpoints"),
        "{summary}"
    );
    let junk = TempFile::new("junk.lbkt", "not a trace at all, no");
    for (args, want) in [
        (vec!["trace", "print", junk.path()], "not an lbkit trace"),
        (
            vec!["trace", "summary", "/nonexistent/t.lbkt"],
            "/nonexistent/t.lbkt",
        ),
    ] {
        let out = lbkit(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

/// Record → fit → replay from the command line: `sim --record`, `sim --fit`, `sim --trace`
/// (the fit check comes before any candidate), and bad traces exit with status 2.
#[test]
fn sim_records_fits_and_replays_a_trace() {
    let truth = TempFile::new(
        "truth.toml",
        "name = \"truth\"\nrequests = 4000\n[workload]\nrate = 200.0\nclients = 1\nbalancer = \"shared\"\n[[server]]\nname = \"fast\"\ncount = 3\nconcurrency = 2\nservice = { dist = \"exponential\", mean_ms = 10.0 }\n[[server]]\nname = \"slow\"\nconcurrency = 2\nservice = { dist = \"exponential\", mean_ms = 10.0 }\nslow_factor = 3.0\n",
    );
    let tmp = scratch("lbkit-cli-replay-");
    let dir = tmp.path();
    let trace = dir.join("calls.lbkt");
    let (t, d) = (trace.to_str().unwrap(), dir.to_str().unwrap());
    let plots = dir.join("plots");
    ok(&[
        "sim",
        "-s",
        truth.path(),
        "--strategies",
        "round-robin",
        "--record",
        t,
        "--out",
        plots.to_str().unwrap(),
    ]);
    let summary = ok(&["trace", "summary", t]);
    assert!(
        summary.contains("truth (round-robin): 4000 requests"),
        "{summary}"
    );
    let scenario = dir.join("fitted").join("scenario.toml");
    let fitted = ok(&["sim", "--fit", t, "--out", scenario.to_str().unwrap()]);
    assert!(
        fitted.contains("4000 recorded requests of truth"),
        "{fitted}"
    );
    assert!(scenario.is_file() && dir.join("fitted").join("arrivals.csv").is_file());
    let rerun = ok(&[
        "sim",
        "--scenario",
        scenario.to_str().unwrap(),
        "--strategies",
        "round-robin",
        "--out",
        plots.to_str().unwrap(),
    ]);
    assert!(rerun.contains("trace-truth"), "{rerun}");
    let replay_dir = dir.join("replay");
    let replay = ok(&[
        "sim",
        "--trace",
        t,
        "--strategies",
        "p2c-ewma",
        "--out",
        replay_dir.to_str().unwrap(),
    ]);
    let check = replay
        .find("fit check: replaying round-robin")
        .expect("a fit check");
    let table = replay.find("\nstrategy ").expect("a table");
    assert!(check < table, "the fit check comes first:\n{replay}");
    assert!(replay.contains("\np2c-ewma "), "{replay}");
    assert!(replay_dir.join("scenario.toml").is_file());

    let tuned_dir = dir.join("tuned");
    let tuned = ok(&[
        "tune",
        "--trace",
        t,
        "--strategies",
        "p2c-ewma,least-active",
        "-n",
        "3000",
        "--out",
        tuned_dir.to_str().unwrap(),
    ]);
    let check = tuned
        .find("fit check: replaying round-robin")
        .expect("a fit check");
    let search = tuned.find("current setting round-robin").expect("a search");
    assert!(check < search, "the fit check comes first:\n{tuned}");
    assert!(tuned.contains("lbkit tune --trace: 4000 recorded requests of truth"));
    assert!(tuned_dir.join("index.html").is_file());

    // With --format json, stdout is the JSON alone, for `jq`: the fit, its check and the
    // progress go to stderr (issue 40: `sim --trace` printed the fit check first).
    let refit = dir.join("refit.toml");
    let (refit, replay_dir, tuned_dir) = (
        refit.to_str().unwrap(),
        replay_dir.to_str().unwrap(),
        tuned_dir.to_str().unwrap(),
    );
    for (args, on_stderr) in [
        (vec!["sim", "--fit", t, "--out", refit], ""),
        (
            vec![
                "sim",
                "--trace",
                t,
                "--strategies",
                "p2c-ewma",
                "--out",
                replay_dir,
            ],
            "fit check: replaying round-robin",
        ),
        (
            vec![
                "tune",
                "--trace",
                t,
                "--strategies",
                "p2c-ewma",
                "-n",
                "3000",
                "--out",
                tuned_dir,
            ],
            "fit check: replaying round-robin",
        ),
    ] {
        let args: Vec<&str> = args.into_iter().chain(["--format", "json"]).collect();
        let out = lbkit(&args);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{args:?}: {stderr}");
        let doc: serde_json::Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{args:?}: stdout is not JSON alone ({e}):\n{stdout}"));
        assert!(doc.is_object(), "{args:?}: {stdout}");
        assert!(stderr.contains(on_stderr), "{args:?}: {stderr}");
    }

    let junk = TempFile::new("junk-trace.lbkt", "nope");
    for (args, want) in [
        (vec!["sim", "--trace", junk.path()], "not an lbkit trace"),
        (vec!["tune", "--trace", junk.path()], "not an lbkit trace"),
        (vec!["sim", "--fit", t], "--out"),
        (
            vec!["sim", "--trace", t, "--service", "nope", "--out", d],
            "\"nope\" is not in the trace",
        ),
        (
            vec!["sim", "--trace", t, "--scenario", "crash"],
            "cannot be used with",
        ),
    ] {
        let out = lbkit(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

/// `lbkit tune`: the winner, the config that applies it (which `lbkit pick --config` accepts as
/// written), the page, JSON for scripts.
#[test]
fn tune_prints_a_winner_and_the_config_that_applies_it() {
    let tmp = scratch("lbkit-cli-tune-");
    // Not there yet: the command makes its output directory.
    let dir = &tmp.path().join("out");
    let out = dir.to_str().unwrap();
    let args = [
        "tune",
        "-s",
        "slow-provider",
        "--strategies",
        "p2c-ewma:default_rtt_ms=100,least-active,random",
        "-n",
        "3000",
        "--service",
        "shop",
        "--out",
        out,
    ];
    let text = ok(&args);
    assert!(
        text.contains("current setting round-robin; 3 candidates, 3000 requests per run"),
        "{text}"
    );
    assert!(
        text.contains("Winner p2c-ewma:default_rtt_ms=100: "),
        "{text}"
    );
    assert!(text.contains("<- current"), "{text}");
    assert!(
        text.contains(&format!("report: {out}/index.html")),
        "{text}"
    );
    assert!(dir.join("index.html").is_file() && dir.join("tune-ranked.svg").is_file());
    // The config as printed, used as a service config.
    let start = text.find("# proxy.toml").expect("a config");
    let end = start + text[start..].find("\n\n").unwrap();
    let config = TempFile::new("tuned-service.toml", &text[start..end]);
    let picks = lines(&[
        "pick",
        "--config",
        config.path(),
        "--service",
        "shop",
        "--endpoints",
        "10.0.0.1:80,10.0.0.2:80",
        "--count",
        "2",
    ]);
    assert_eq!(picks.len(), 2);
    assert!(
        text.contains(r#"curl -X PUT localhost:9901/services/shop/strategy -d '{"strategy": "p2c-ewma", "params": {"default_rtt_ms": 100}}'"#),
        "{text}"
    );

    let json_args: Vec<&str> = args.iter().copied().chain(["--format", "json"]).collect();
    let json = ok(&json_args);
    assert_eq!(json, ok(&json_args), "same seed, same bytes");
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["winner"], "p2c-ewma:default_rtt_ms=100");
    assert_eq!(doc["objective"], "p99");
    assert_eq!(doc["ranking"].as_array().unwrap().len(), 4);
    assert!(doc["gain"]["high"].as_f64().unwrap() < 0.0);
}

/// `--budget` sizes the runs from the simulator's speed: a scenario of 2 000 requests is run
/// whole whatever the machine (the smallest size a budget may pick), so the output is fixed.
#[test]
fn tune_sizes_runs_by_budget_and_keeps_a_setting_nothing_beats() {
    let f = TempFile::new(
        "tune-tiny.toml",
        "name = \"tiny\"\nrequests = 2000\n[workload]\nrate = 100.0\n[[server]]\ncount = 2\n[[server]]\nname = \"slow\"\nslow_factor = 5.0\n",
    );
    let tmp = scratch("lbkit-cli-tune-tiny-");
    // Not there yet: the command makes its output directory.
    let dir = &tmp.path().join("out");
    let text = ok(&[
        "tune",
        "-s",
        f.path(),
        "--budget",
        "5",
        "--current",
        "p2c-ewma",
        "--strategies",
        "round-robin,random",
        "--objective",
        "mean",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(text.contains("2000 requests per run"), "{text}");
    assert!(
        text.contains("Keep p2c-ewma: none of the 2 candidates beat it on mean"),
        "{text}"
    );
    assert!(!text.contains("[service."), "nothing to apply: {text}");
}

#[test]
fn tune_bad_input_exits_2() {
    for (args, want) in [
        (vec!["tune"], "--scenario <FILE|NAME>"),
        (
            vec!["tune", "-s", "crash", "--trace", "x"],
            "cannot be used with",
        ),
        (vec!["tune", "-s", "nope"], "unknown scenario"),
        (
            vec!["tune", "-s", "crash", "--objective", "p95"],
            "unknown objective \"p95\"",
        ),
        (
            vec!["tune", "-s", "crash", "--budget", "0"],
            "--budget must be",
        ),
        (
            vec!["tune", "-s", "crash", "--budget", "nan"],
            "--budget must be",
        ),
        (
            vec!["tune", "-s", "crash", "-n", "0"],
            "--requests must be within",
        ),
        (
            vec!["tune", "-s", "crash", "--threads", "0"],
            "--threads must be",
        ),
        (
            vec!["tune", "-s", "crash", "--strategies", "fastest"],
            "unknown strategy \"fastest\"",
        ),
        (
            vec!["tune", "-s", "crash", "--current", "p2c-ewma:x=1"],
            "has no parameter \"x\"",
        ),
        (
            vec!["tune", "-s", "crash", "--strategies", "round-robin"],
            "none besides the current setting",
        ),
        (
            vec!["tune", "--trace", "/nonexistent.lbkt"],
            "/nonexistent.lbkt",
        ),
    ] {
        let out = lbkit(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(want),
            "{args:?}: wanted {want:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}");
    }
}
