use super::*;

const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);

fn toml(text: &str) -> Result<Vec<FileEndpoint>, SourceError> {
    parse(text, Format::Toml, "eps.toml", NOW)
}

#[test]
fn toml_reads_every_field() {
    let eps = toml(
        r#"
[[endpoint]]
address = "10.0.0.1:20880"
weight = 200
zone = "eu-1"
registered_at_ms = 1699999700000
warmup_ms = 600000
metadata = { version = "1.2" }
in_flight = 3
avg_response_ms = 12.5
ewma_ms = 20
failures = 4
consecutive_failures = 2

[[endpoint]]
address = "10.0.0.2:20880"
healthy = false
"#,
    )
    .unwrap();
    let a = &eps[0];
    assert_eq!(a.spec.weight, 200);
    assert_eq!(a.spec.zone.as_deref(), Some("eu-1"));
    assert_eq!(
        a.spec.registered_at,
        Some(Timestamp::from_millis(1_699_999_700_000))
    );
    assert_eq!(a.spec.warmup, Some(Duration::from_secs(600)));
    assert_eq!(a.spec.metadata["version"], "1.2");
    assert_eq!(a.observed.in_flight, 3);
    assert_eq!(a.observed.avg_response, Some(Duration::from_micros(12_500)));
    assert_eq!(a.observed.ewma, Some(Duration::from_millis(20)));
    assert_eq!(
        a.observed.last_failure_at,
        Some(NOW),
        "failures without a time: now"
    );
    assert!(!eps[1].spec.healthy);
    assert_eq!(eps[1].spec.weight, 100);
}

#[test]
fn json_and_toml_agree() {
    let j = parse(
        r#"[{"address":"a:1","weight":5},{"address":"b:1"}]"#,
        Format::Json,
        "eps.json",
        NOW,
    )
    .unwrap();
    let t = toml("[[endpoint]]\naddress = \"a:1\"\nweight = 5\n[[endpoint]]\naddress = \"b:1\"\n")
        .unwrap();
    assert_eq!(j, t);
}

#[test]
fn dubbo_urls_with_comments_and_encoding() {
    let text = "# providers of com.acme.Greeter\n\
                dubbo://10.0.0.1:20880/com.acme.Greeter?weight=200&timestamp=1700000000000\n\
                \n\
                dubbo%3A%2F%2F10.0.0.2%3A20880%2Fcom.acme.Greeter%3Fweight%3D50\n";
    let eps = parse(text, Format::DubboUrls, "providers.txt", NOW).unwrap();
    assert_eq!(eps.len(), 2);
    assert_eq!((eps[0].spec.weight, eps[1].spec.weight), (200, 50));
    assert_eq!(
        eps[0].spec.warmup, None,
        "default window applied by the endpoint"
    );
}

#[test]
fn errors_name_file_line_and_field() {
    let cases: &[(&str, Format, &str)] = &[
        (
            "[[endpoint]]\naddress = \"a:1\"\nweight = -1\n",
            Format::Toml,
            "eps.toml:3:",
        ),
        (
            "[[endpoint]]\naddress = \"a:1\"\nwieght = 1\n",
            Format::Toml,
            "unknown field `wieght`",
        ),
        (
            "[[endpoint]]\naddress = \"a\"\n",
            Format::Toml,
            "endpoint #1: address \"a\" has no port",
        ),
        (
            "[[endpoint]]\naddress = \"a:1\"\navg_response_ms = -3\n",
            Format::Toml,
            "avg_response_ms = -3",
        ),
        ("", Format::Toml, "no endpoints"),
        (
            "[{\"address\": 5}]",
            Format::Json,
            "eps.toml:1: invalid type",
        ),
        (
            "dubbo://a:1/x\ndubbo://b/x\n",
            Format::DubboUrls,
            "eps.toml:2: malformed provider URL",
        ),
        (
            "dubbo://a:1/x\n#\ndubbo://a:1/y\n",
            Format::DubboUrls,
            "eps.toml:3: duplicate address a:1 (first given at line 1)",
        ),
        (
            "[[endpoint]]\naddress = \"a:1\"\n[[endpoint]]\naddress = \"a:1\"\n",
            Format::Toml,
            "duplicate address a:1 (first given at endpoint #1)",
        ),
    ];
    for (text, format, want) in cases {
        let e = parse(text, *format, "eps.toml", NOW)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{text:?}: {e}");
    }
}

#[test]
fn format_by_extension() {
    assert_eq!(
        Format::from_path(Path::new("x.txt")).unwrap(),
        Format::DubboUrls
    );
    assert!(Format::from_path(Path::new("x.yaml"))
        .unwrap_err()
        .to_string()
        .contains("expected .toml"));
}

#[test]
fn priority_and_backup() {
    let eps = parse(
        r#"[{"address":"a:1"},{"address":"b:1","priority":2},{"address":"c:1","backup":true},{"address":"d:1","backup":false}]"#,
        Format::Json,
        "eps.json",
        NOW,
    )
    .unwrap();
    let p: Vec<u32> = eps.iter().map(|e| e.spec.priority).collect();
    assert_eq!(p, vec![0, 2, 1, 0]);
    let e = toml("[[endpoint]]\naddress = \"a:1\"\npriority = 0\nbackup = true\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("endpoint #1: give priority or backup"),
        "{e}"
    );
    let e = toml("[[endpoint]]\naddress = \"a:1\"\npriority = -1\n").unwrap_err();
    assert!(e.to_string().contains("eps.toml"), "{e}");
}
