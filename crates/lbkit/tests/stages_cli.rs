//! Black-box tests of `lbkit pick`'s stages: subsets (`--attr`, `--subset-keys`,
//! `--subset-fallback`, `--subset-default`), priority tiers (endpoint fields `priority` and
//! `backup`, `--overprovisioning`), locality weights and the aperture; their `--explain`
//! output; and their bad input (exit 2 naming the flag).

use std::collections::HashMap;

#[path = "support/run.rs"]
mod run;
use run::{lbkit, ok};

fn counts(args: &[&str]) -> HashMap<String, usize> {
    let mut c = HashMap::new();
    for l in ok(args).lines() {
        *c.entry(l.to_owned()).or_insert(0) += 1;
    }
    c
}

fn file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

const VERSIONS: &str = r#"[
 {"address":"a:1","metadata":{"version":"v1","zone":"eu"}},
 {"address":"b:1","metadata":{"version":"v2","zone":"eu"}},
 {"address":"c:1","metadata":{"version":"v2","zone":"us"}},
 {"address":"d:1","metadata":{"version":"v3"},"healthy":false}
]"#;

#[test]
fn subsets_and_every_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let eps = file(&dir, "eps.json", VERSIONS);
    let base = [
        "pick", "-s", "random", "-f", &eps, "--seed", "1", "-n", "200",
    ];
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        counts(&a)
    };
    let keys = ["--subset-keys", "version,zone", "--subset-keys", "version"];
    let v2: Vec<&str> = [&keys[..], &["--attr", "version=v2"]].concat();
    let c = with(&v2);
    assert_eq!(c.len(), 2, "v2's endpoints: {c:?}");
    assert!(c.contains_key("b:1") && c.contains_key("c:1"));
    let v2us: Vec<&str> = [&keys[..], &["--attr", "version=v2", "--attr", "zone=us"]].concat();
    assert_eq!(with(&v2us).keys().collect::<Vec<_>>(), vec!["c:1"]);
    // v3's only endpoint is down: fallback any serves the three that are up.
    let v3: Vec<&str> = [&keys[..], &["--attr", "version=v3"]].concat();
    assert_eq!(with(&v3).len(), 3);
    let dflt: Vec<&str> = [
        &v3[..],
        &[
            "--subset-fallback",
            "default",
            "--subset-default",
            "version=v1",
        ],
    ]
    .concat();
    assert_eq!(with(&dflt).keys().collect::<Vec<_>>(), vec!["a:1"]);
    // none: exit 1, naming why.
    for (attr, why) in [
        ("version=v3", "subset has no eligible endpoint"),
        ("version=v9", "no subset matches"),
    ] {
        let out = lbkit(&[
            "pick",
            "-s",
            "random",
            "-f",
            &eps,
            "--subset-keys",
            "version",
            "--attr",
            attr,
            "--subset-fallback",
            "none",
        ]);
        assert_eq!(out.status.code(), Some(1), "{attr}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{attr}: {err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn priority_tiers_split_as_envoy_documents() {
    // P0: 10 endpoints, 5 down (health 70); backups: 10 up. 70 / 30 over 4 000 picks.
    let dir = tempfile::tempdir().unwrap();
    let mut eps: Vec<String> = (0..10)
        .map(|i| format!(r#"{{"address":"p{i}:1","healthy":{}}}"#, i < 5))
        .collect();
    eps.extend((0..10).map(|i| format!(r#"{{"address":"b{i}:1","backup":true}}"#)));
    let eps = file(&dir, "eps.json", &format!("[{}]", eps.join(",")));
    let c = counts(&[
        "pick", "-s", "random", "-f", &eps, "--seed", "3", "-n", "4000",
    ]);
    let p0: usize = c
        .iter()
        .filter(|(k, _)| k.starts_with('p'))
        .map(|(_, v)| v)
        .sum();
    let share = p0 as f64 / 4000.0;
    assert!((share - 0.70).abs() < 0.025, "P0 took {share}");
    let json = ok(&[
        "pick",
        "-s",
        "random",
        "-f",
        &eps,
        "--explain",
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let loads: Vec<u64> = v["stages"]["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["load_percent"].as_u64().unwrap())
        .collect();
    assert_eq!(loads, vec![70, 30]);
    // A higher overprovisioning keeps P0 whole at 50 % healthy (2.0 × 50 = 100).
    let json = ok(&[
        "pick",
        "-s",
        "random",
        "-f",
        &eps,
        "--overprovisioning",
        "2",
        "--explain",
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["stages"]["tiers"][0]["load_percent"], 100);
    let text = ok(&["pick", "-s", "random", "-f", &eps, "--explain"]);
    assert!(
        text.contains("tier P0: 5 of 10 healthy, health 70, load 70 %"),
        "{text}"
    );
}

#[test]
fn locality_weights_and_aperture_in_explain() {
    let dir = tempfile::tempdir().unwrap();
    let mut eps: Vec<String> = (0..10)
        .map(|i| format!(r#"{{"address":"x{i}:1","zone":"x","healthy":{}}}"#, i < 5))
        .collect();
    eps.extend((0..10).map(|i| format!(r#"{{"address":"y{i}:1","zone":"y"}}"#)));
    let eps = file(&dir, "eps.json", &format!("[{}]", eps.join(",")));
    let json = ok(&[
        "pick",
        "-s",
        "random",
        "-f",
        &eps,
        "--locality-weight",
        "x=1",
        "--locality-weight",
        "y=2",
        "--explain",
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let x = &v["stages"]["tiers"][0]["localities"][0];
    assert_eq!(x["zone"], "x");
    // Envoy's table: X at 50 % healthy, weight 1 against 2: 0.7 / 2.7 = 25.9 %.
    let share = x["share_percent"].as_f64().unwrap();
    assert!((share - 25.9).abs() < 0.1, "{x}");
    // Deterministic aperture over the ring of the 15 serving endpoints (by key), 100 clients,
    // aperture 4: client 0 takes the first ⌈4·100/15⌉/100 = 0.27 of it, 4.05 endpoints' worth:
    // x0..x4.
    let c = counts(&[
        "pick",
        "-s",
        "random",
        "-f",
        &eps,
        "--aperture",
        "4",
        "--client-index",
        "0",
        "--client-count",
        "100",
        "-n",
        "400",
        "--seed",
        "1",
    ]);
    let mut got: Vec<&String> = c.keys().collect();
    got.sort();
    assert_eq!(got, vec!["x0:1", "x1:1", "x2:1", "x3:1", "x4:1"]);
    let random = counts(&[
        "pick",
        "-s",
        "random",
        "-f",
        &eps,
        "--aperture",
        "6",
        "--aperture-mode",
        "random",
        "-n",
        "600",
        "--seed",
        "7",
    ]);
    assert!(random.len() <= 6, "{random:?}");
    let again = counts(&[
        "pick",
        "-s",
        "random",
        "-f",
        &eps,
        "--aperture",
        "6",
        "--aperture-mode",
        "random",
        "-n",
        "600",
        "--seed",
        "7",
    ]);
    assert_eq!(random, again, "a seed gives the same slice and picks");
}

#[test]
fn stages_from_a_service_config() {
    let dir = tempfile::tempdir().unwrap();
    let eps = file(&dir, "eps.json", VERSIONS);
    let cfg = file(
        &dir,
        "lbkit.toml",
        "[service.greeter]\nstrategy = \"random\"\n\
         [service.greeter.stages]\nsubsets = { keys = [[\"version\"]], fallback = \"none\" }\n",
    );
    let c = counts(&[
        "pick",
        "--config",
        &cfg,
        "--service",
        "greeter",
        "-f",
        &eps,
        "--attr",
        "version=v1",
        "-n",
        "20",
    ]);
    assert_eq!(c.keys().collect::<Vec<_>>(), vec!["a:1"]);
    let out = lbkit(&["pick", "--config", &cfg, "--service", "greeter", "-f", &eps]);
    assert_eq!(out.status.code(), Some(1), "no attribute, fallback none");
    let bad = file(
        &dir,
        "bad.toml",
        "[service.greeter.stages]\nsubsets = { keys = [[\"version\"]], fallback = \"sometimes\" }\n",
    );
    let out = lbkit(&["pick", "--config", &bad, "--service", "greeter", "-f", &eps]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("service.greeter.stages.subsets.fallback"),
        "{err}"
    );
}

#[test]
fn bad_stage_flags_exit_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let eps = file(&dir, "eps.json", VERSIONS);
    let both = file(
        &dir,
        "both.json",
        r#"[{"address":"a:1","priority":1,"backup":true}]"#,
    );
    for (args, want) in [
        (vec!["--attr", "version"], "--attr"),
        (vec!["--subset-fallback", "maybe"], "--subset-fallback"),
        (
            vec!["--subset-fallback", "default"],
            "--subset-keys/--subset-default",
        ),
        (vec!["--subset-default", "v1"], "--subset-default"),
        (vec!["--overprovisioning", "0.5"], "--overprovisioning"),
        (vec!["--locality-weight", "x=heavy"], "--locality-weight"),
        (vec!["--aperture", "3"], "--client-index"),
        (
            vec![
                "--aperture",
                "3",
                "--client-index",
                "4",
                "--client-count",
                "4",
            ],
            "--aperture",
        ),
        (
            vec!["--aperture", "0", "--aperture-mode", "random"],
            "--aperture",
        ),
        (
            vec!["--aperture", "2", "--aperture-mode", "sideways"],
            "--aperture-mode",
        ),
    ] {
        let mut a = vec!["pick", "-s", "random", "-f", &eps];
        a.extend(args.iter().copied());
        let out = lbkit(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    let out = lbkit(&["pick", "-s", "random", "-f", &both]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give priority or backup"));
}

/// Under a deterministic aperture that covers its edge servers partly, the weighted
/// strategies' `--explain` says the weight they draw by is the effective weight times the
/// coverage: 10 servers, 7 clients, aperture 3, client 0 covers x0..x3 wholly (coverage 7)
/// and x4 for 2 sevenths.
#[test]
fn explain_names_the_aperture_coverage_in_the_weight_drawn_by() {
    let dir = tempfile::tempdir().unwrap();
    let eps: Vec<String> = (0..10)
        .map(|i| format!(r#"{{"address":"x{i}:1"}}"#))
        .collect();
    let eps = file(&dir, "eps.json", &format!("[{}]", eps.join(",")));
    for strategy in ["weighted-round-robin", "weighted-random", "least-request"] {
        let text = ok(&[
            "pick",
            "-s",
            strategy,
            "-f",
            &eps,
            "--aperture",
            "3",
            "--client-index",
            "0",
            "--client-count",
            "7",
            "--explain",
        ]);
        let whole = "weight 700 = effective weight 100 × aperture coverage 7 (23.33% of picks)";
        let edge = "weight 200 = effective weight 100 × aperture coverage 2 (6.67% of picks)";
        assert_eq!(text.matches(whole).count(), 4, "{strategy}: {text}");
        assert_eq!(text.matches(edge).count(), 1, "{strategy}: {text}");
    }
    // Without an aperture the note is as before.
    let text = ok(&["pick", "-s", "weighted-random", "-f", &eps, "--explain"]);
    assert_eq!(
        text.matches("weight 100 (10.00% of picks)").count(),
        10,
        "{text}"
    );
    assert!(!text.contains("coverage"), "{text}");
}
