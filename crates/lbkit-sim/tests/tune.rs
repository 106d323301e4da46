//! `lbkit tune`'s search: it finds what the simulator says is better, says by how much with an
//! interval that means something, keeps the current setting when nothing beats it, and gives
//! the same answer on any number of threads.

use lbkit_sim::html::{write_report, write_tuning};
use lbkit_sim::tune::{candidates, tune, Objective, TuneOptions, Tuning};
use lbkit_sim::{run, RunOptions, Scenario};

fn search(current: &str, candidates: &[&str], threads: usize) -> Tuning {
    let s = Scenario::named("slow-provider").unwrap();
    let options = TuneOptions {
        candidates: candidates.iter().map(|c| (*c).to_owned()).collect(),
        requests: 4_000,
        final_seeds: 5,
        threads,
        ..TuneOptions::new(Objective::P99, current)
    };
    tune(&s, &options, &|_, _| {}).unwrap()
}

#[test]
fn a_latency_aware_winner_beats_round_robin_with_a_clear_interval() {
    let t = search(
        "round-robin",
        &["random", "least-active", "p2c-ewma", "shortest-response"],
        1,
    );
    assert!(
        t.winner == "p2c-ewma" || t.winner == "shortest-response",
        "{}",
        t.to_table(10)
    );
    // One slow provider in ten piles round robin's requests up: the winner cuts its p99 by far
    // more than half, on every fresh seed.
    assert!(t.gain.is_clear(), "{:?}", t.gain);
    assert!(t.gain.high < -0.5, "{:?}", t.gain);
    assert!(t.gain.low <= t.gain.change && t.gain.change <= t.gain.high);
    assert_eq!(t.gain.seeds, 5);
    assert_eq!(t.ranking[0].label, t.winner);
    assert_eq!(
        t.ranking[0].seeds, 9,
        "the last ones standing ran every round"
    );
    let current = t.ranking.iter().find(|c| c.label == "round-robin").unwrap();
    assert_eq!(current.seeds, 9, "the yardstick runs every seed");
    let random = t.ranking.iter().find(|c| c.label == "random").unwrap();
    assert!(random.seeds < 9, "random is raced out early: {random:?}");
    assert!(t.verdict().starts_with(&format!("Winner {}", t.winner)));
    let snippet = t.snippet("shop");
    assert!(snippet.contains("[service.shop]"), "{snippet}");
    let table: toml::Table = snippet.split("\n\n").next().unwrap().parse().unwrap();
    assert_eq!(
        table["service"]["shop"]["strategy"].as_str(),
        Some(t.winner.as_str())
    );
    // The comparison report: the current setting, the winner, the runner-ups and the oracle.
    let labels: Vec<&str> = t
        .comparison
        .results
        .iter()
        .map(|r| r.strategy.as_str())
        .collect();
    assert_eq!(labels[0], "round-robin");
    assert_eq!(labels[1], t.winner);
    assert_eq!(*labels.last().unwrap(), lbkit_sim::ORACLE);
    assert_eq!(labels.len(), 2 + 3 + 1);
}

#[test]
fn the_answer_does_not_depend_on_the_threads() {
    let labels = ["least-active", "p2c-ewma", "weighted-random"];
    let one = search("round-robin", &labels, 1);
    let two = search("round-robin", &labels, 2);
    assert_eq!(one.to_json(), two.to_json());
    assert_eq!(one.comparison, two.comparison);
}

#[test]
fn nothing_better_keeps_the_current_setting() {
    let t = search("p2c-ewma", &["round-robin", "random"], 2);
    assert_eq!(t.winner, "p2c-ewma");
    assert_eq!(t.ranking[0].label, "p2c-ewma");
    assert!(t
        .verdict()
        .starts_with("Keep p2c-ewma: none of the 2 candidates"));
    assert_eq!(t.snippet("shop"), "");
}

#[test]
fn parameters_are_searched_and_the_snippet_sets_them() {
    let t = search(
        "round-robin",
        &[
            "least-request:choice_count=5",
            "least-request:choice_count=5:active_request_bias=2.0",
        ],
        2,
    );
    assert!(t.winner.starts_with("least-request:choice_count=5"));
    let snippet = t.snippet("api");
    assert!(
        snippet.contains("params = { choice_count = 5")
            && snippet.contains(r#""params": {"choice_count": 5"#),
        "{snippet}"
    );
    // Parameters at their default are left out of the config.
    assert!(!snippet.contains("active_request_bias = 1.0"), "{snippet}");
    // A hedged winner: the strategy, and where its hedge goes (the TOML still parses).
    let mut hedged = t.clone();
    hedged.winner = "p2c-ewma+hedge=p95".into();
    let snippet = hedged.snippet("api");
    assert!(
        snippet.contains("# call = { hedge = \"p95\" }"),
        "{snippet}"
    );
    let table: toml::Table = snippet.split("\n\n").next().unwrap().parse().unwrap();
    assert_eq!(
        table["service"]["api"]["strategy"].as_str(),
        Some("p2c-ewma")
    );
}

#[test]
fn bad_searches_name_the_problem() {
    let s = Scenario::named("slow-provider").unwrap();
    let cases = [
        (
            TuneOptions {
                candidates: vec!["fastest".into()],
                ..TuneOptions::new(Objective::P99, "round-robin")
            },
            "unknown strategy \"fastest\"",
        ),
        (
            TuneOptions {
                candidates: vec!["round-robin".into()],
                ..TuneOptions::new(Objective::P99, "round-robin")
            },
            "none besides the current setting round-robin",
        ),
        (
            TuneOptions::new(Objective::P99, "p2c-ewma:decay=3"),
            "has no parameter \"decay\"",
        ),
        (
            TuneOptions {
                final_seeds: 1,
                ..TuneOptions::new(Objective::P99, "round-robin")
            },
            "at least 2",
        ),
        (
            TuneOptions {
                requests: 0,
                ..TuneOptions::new(Objective::P99, "round-robin")
            },
            "must be within",
        ),
    ];
    for (options, want) in cases {
        let e = tune(&s, &options, &|_, _| {}).unwrap_err().to_string();
        assert!(e.contains(want), "{e} (wanted {want})");
    }
    // Without candidates, the whole space without the current setting.
    let all = candidates(&s, &TuneOptions::new(Objective::P99, "round-robin")).unwrap();
    assert!(all.len() > 20 && !all.contains(&"round-robin".to_owned()));
}

/// A fresh directory, removed with everything in it when the value drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("lbkit-sim-html-{name}-"))
        .tempdir()
        .unwrap()
}

/// The pages are self-contained (nothing fetched), group identical results, and lead with the
/// ranked chart. The browser check is `crates/lbkit/tests/html_report.rs`.
#[test]
fn the_html_pages_are_self_contained_and_grouped() {
    let s = Scenario::named("slow-provider").unwrap();
    let report = run(
        &s,
        &RunOptions {
            requests: Some(3_000),
            strategies: [
                "round-robin",
                "weighted-round-robin",
                "least-active",
                "p2c-least-loaded",
                "p2c-ewma",
            ]
            .map(String::from)
            .to_vec(),
            ..RunOptions::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(
        report.groups(),
        vec![vec![0, 1], vec![2, 3], vec![4], vec![5]]
    );
    let dir = scratch("sim");
    let written = write_report(&report, &s, dir.path()).unwrap();
    let page = std::fs::read_to_string(&written.page).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert_eq!(page.matches("<svg").count(), 4, "every plot inlined");
    let ranked = page.find("p99 latency, best first").unwrap();
    assert!(
        ranked < page.find("<h2>Results</h2>").unwrap(),
        "the ranked chart leads"
    );
    for attr in ["src=", "href=", "url(", "@import"] {
        assert!(!page.contains(attr), "the page fetches something: {attr}");
    }
    assert!(page.contains("<td>round-robin = weighted-round-robin</td>"));
    assert!(page.contains("<td>least-active = p2c-least-loaded</td>"));
    assert!(
        page.contains("name = &quot;slow-provider&quot;"),
        "the scenario, escaped"
    );

    let t = search("round-robin", &["p2c-ewma", "least-active", "random"], 2);
    let dir = scratch("tune");
    let written = write_tuning(&t, &s, "shop", dir.path()).unwrap();
    let page = std::fs::read_to_string(&written.page).unwrap();
    assert_eq!(written.plots.len(), 5);
    assert_eq!(page.matches("<svg").count(), 5);
    assert!(page.contains("[service.shop]"));
    assert!(page.contains(&format!("Winner {}", t.winner)));
    for attr in ["src=", "href=", "url("] {
        assert!(!page.contains(attr), "the page fetches something: {attr}");
    }
}

/// A scenario's text is input: names and descriptions with markup stay text on the page and in
/// the inlined plots.
#[test]
fn markup_in_a_scenario_stays_text() {
    let s = Scenario::parse(
        "name = \"x</title><script>alert(1)</script>\"\ndescription = \"<img src=x onerror=alert(2)> & co\"\nrequests = 500\n[[server]]\ncount = 2\n",
        "hostile",
    )
    .unwrap();
    let report = run(
        &s,
        &RunOptions {
            strategies: vec!["round-robin".into()],
            ..RunOptions::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    let dir = scratch("hostile");
    let page =
        std::fs::read_to_string(write_report(&report, &s, dir.path()).unwrap().page).unwrap();
    assert!(!page.contains("<script>alert"), "{page}");
    assert!(!page.contains("<img"), "{page}");
    assert!(page.contains("x&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert_eq!(
        page.matches("<script>").count(),
        1,
        "only the page's own script"
    );
}
