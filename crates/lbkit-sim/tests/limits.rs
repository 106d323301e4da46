//! Every size a scenario file can ask for has a limit, and past it parsing fails with an error
//! that names the field (issue 15: a file could ask for terabytes or endless work).

use lbkit_sim::Scenario;

fn parse(text: &str) -> Result<Scenario, String> {
    let text = format!("name = \"limits\"\n{text}");
    Scenario::parse(&text, "limits.toml").map_err(|e| e.to_string())
}

#[test]
fn sizes_past_their_limits_are_refused_by_name() {
    let cases = [
        ("requests = 1000000000000\n[[server]]\n", "requests"),
        (
            "[workload]\nclients = 4000000000\n[[server]]\n",
            "workload.clients",
        ),
        (
            "[workload]\nkey_count = 4000000000\n[[server]]\n",
            "workload.key_count",
        ),
        ("[[server]]\ncount = 4000000000\n", "servers"),
        (
            "[workload]\nclients = 10000\n[[server]]\ncount = 1000\n",
            "workload.clients x servers",
        ),
    ];
    for (text, field) in cases {
        let err = parse(text).expect_err(text);
        assert!(
            err.contains(field) && err.contains("at most"),
            "{text}: {err}"
        );
    }
    let events = "[[event]]\nat_ms = 1.0\nserver = \"s\"\naction = \"crash\"\n".repeat(100_001);
    let err = parse(&format!("[[server]]\n{events}")).expect_err("events");
    assert!(err.contains("[[event]]"), "{err}");
}

#[test]
fn sizes_at_their_limits_parse() {
    let text = "requests = 100000000\n[workload]\nclients = 100\nkey_count = 1000000\n\
                [[server]]\ncount = 10000\nconcurrency = 4000000000\nqueue = 4000000000\n";
    parse(text).expect("at the limits");
    let shared = "[workload]\nclients = 10000\nbalancer = \"shared\"\n[[server]]\ncount = 1000\n";
    parse(shared).expect("shared balancer: clients x servers is not bounded");
}
