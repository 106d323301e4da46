//! Envoy's parser tests (`test/common/orca/orca_parser_test.cc`) as vectors, and grpc-go's
//! captured binary header.

use super::*;

/// Envoy's example report in TEXT, with `=` or `:`.
const TEXT: &str = "cpu_utilization=0.7,application_utilization=0.8,mem_utilization=0.9,\
                    rps_fractional=1000,eps=2,named_metrics.foo=123,named_metrics.bar=0.2,\
                    utilization.total=0.5";

/// A header value captured from a grpc-go backend (cpu 0.5, rps_fractional 100, eps 2, named
/// metric `rif` 4), without padding as grpc-go sends it.
const GRPC_GO: &str = "CQAAAAAAAOA/MQAAAAAAAFlAOQAAAAAAAABAQg4KA3JpZhEAAAAAAAAQQA";

fn example() -> OrcaReport {
    OrcaReport {
        cpu_utilization: 0.7,
        mem_utilization: 0.9,
        application_utilization: 0.8,
        rps_fractional: 1000.0,
        eps: 2.0,
    }
}

fn grpc_go() -> OrcaReport {
    OrcaReport {
        cpu_utilization: 0.5,
        rps_fractional: 100.0,
        eps: 2.0,
        ..OrcaReport::default()
    }
}

fn text(s: &str) -> Result<OrcaReport, OrcaError> {
    parse_header(format!("TEXT {s}").as_bytes())
}

#[test]
fn text_reports_read_as_envoy_reads_them() {
    assert_eq!(text(TEXT), Ok(example()));
    assert_eq!(text(&TEXT.replace('=', ":")), Ok(example()));
    assert_eq!(
        text(" cpu_utilization = 0.3 , eps=1 ").map(|r| r.eps),
        Ok(1.0)
    );
    assert_eq!(
        example().utilization(),
        0.8,
        "application utilisation first"
    );
    assert_eq!(grpc_go().utilization(), 0.5, "else cpu");
}

#[test]
fn bad_text_reports_are_rejected_whole() {
    let value = |n: &str, v: &str| Err(OrcaError::Value(n.into(), v.into()));
    assert_eq!(
        text("cpu_utilization=\"0.7\""),
        value("cpu_utilization", "\"0.7\"")
    );
    assert_eq!(text("cpu_utilization=NaN"), value("cpu_utilization", "NaN"));
    assert_eq!(text("cpu_utilization=inf"), value("cpu_utilization", "inf"));
    assert_eq!(text("cpu_utilization=-1"), value("cpu_utilization", "-1"));
    assert_eq!(
        text("cpu_utilization=0.7,cpu_utilization=0.8"),
        Err(OrcaError::Duplicate("cpu_utilization".into()))
    );
    assert_eq!(
        text("named_metrics.a=1,named_metrics.a=2"),
        Err(OrcaError::Duplicate("named_metrics.a".into()))
    );
    assert_eq!(
        text("cpu_utilization=0.7,unsupported_metric=0.8"),
        Err(OrcaError::Unknown("unsupported_metric".into()))
    );
    assert_eq!(
        text("utilization.=0.9"),
        Err(OrcaError::Unknown("utilization.".into()))
    );
    assert_eq!(
        text("not-a-list-of-key-value-pairs"),
        value("not-a-list-of-key-value-pairs", "")
    );
}

#[test]
fn the_format_prefix_is_required() {
    let format = |s: &str| Err(OrcaError::Format(s.into()));
    assert_eq!(parse_header(b"BAD random-value"), format("BAD"));
    assert_eq!(parse_header(b"BADBAD random-value"), format("BADBA"));
    assert_eq!(parse_header(b""), format(""));
    assert_eq!(parse_header(b"cpu_utilization=0.5"), format("cpu_u"));
}

#[test]
fn json_reports_in_both_name_styles() {
    let json = r#"JSON {"cpu_utilization": 0.7, "application_utilization": 0.8,
        "mem_utilization": 0.9, "rps_fractional": 1000, "eps": 2,
        "named_metrics": {"foo": 123, "bar": 0.2}, "utilization": {"total": 0.5}}"#;
    assert_eq!(parse_header(json.as_bytes()), Ok(example()));
    let camel = r#"JSON {"cpuUtilization": 0.7, "applicationUtilization": 0.8,
        "memUtilization": 0.9, "rpsFractional": 1000, "eps": 2}"#;
    assert_eq!(parse_header(camel.as_bytes()), Ok(example()));
    let rps = r#"JSON {"cpu_utilization": 0.2, "rps": "40"}"#;
    assert_eq!(parse_header(rps.as_bytes()).map(|r| r.qps()), Ok(40.0));
}

#[test]
fn bad_json_reports_are_rejected() {
    let unknown = r#"JSON {"cpu_utilization": 0.7, "unknown_field": 2}"#;
    assert_eq!(
        parse_header(unknown.as_bytes()),
        Err(OrcaError::Unknown("unknown_field".into()))
    );
    for bad in [
        r#"JSON {"cpu_utilization": "0.7"}"#,
        r#"JSON {"cpu_utilization": 0.7"#,
        "JSON JSON not-a-valid-json-string",
        "JSON [1, 2]",
        r#"JSON {"named_metrics": 3}"#,
        r#"JSON {"named_metrics": {"a": "x"}}"#,
    ] {
        let got = parse_header(bad.as_bytes());
        assert!(matches!(got, Err(OrcaError::Json(_))), "{bad}: {got:?}");
    }
    let negative = r#"JSON {"eps": -2}"#;
    assert!(matches!(
        parse_header(negative.as_bytes()),
        Err(OrcaError::Value(..))
    ));
}

#[test]
fn binary_reports_padded_or_not_in_either_header() {
    let padded = format!("{GRPC_GO}==");
    for value in [GRPC_GO, padded.as_str()] {
        assert_eq!(parse_bin(value.as_bytes()), Ok(grpc_go()), "{value}");
        let prefixed = format!("BIN {value}");
        assert_eq!(parse_header(prefixed.as_bytes()), Ok(grpc_go()), "{value}");
    }
    // The deprecated integer rps (tag 3, varint 7) stands in for rps_fractional.
    let rps = BASE64.encode([0x18, 7]);
    assert_eq!(parse_bin(rps.as_bytes()).map(|r| r.qps()), Ok(7.0));
}

#[test]
fn bad_binary_reports_are_rejected() {
    let half = BASE64.encode(&BASE64.decode(GRPC_GO).expect("base64")[..20]);
    for bad in ["", "not base64!", half.as_str()] {
        let got = parse_bin(bad.as_bytes());
        assert!(matches!(got, Err(OrcaError::Binary(_))), "{bad:?}: {got:?}");
    }
    // cpu_utilization = -1.0 (tag 1, fixed64).
    let mut negative = vec![0x09];
    negative.extend_from_slice(&(-1.0f64).to_le_bytes());
    assert!(matches!(
        parse_bin(BASE64.encode(negative).as_bytes()),
        Err(OrcaError::Value(..))
    ));
}

#[test]
fn the_binary_header_wins_and_is_recorded() {
    let mut headers = HeaderMap::new();
    assert!(from_headers(&headers).is_none());
    headers.insert(HEADER, "TEXT cpu_utilization=0.9".parse().expect("value"));
    assert_eq!(
        from_headers(&headers).map(|r| r.map(|r| r.cpu_utilization)),
        Some(Ok(0.9))
    );
    headers.insert(HEADER_BIN, GRPC_GO.parse().expect("value"));
    assert_eq!(from_headers(&headers), Some(Ok(grpc_go())));
    let stats = EndpointStats::default();
    let now = Timestamp::from_millis(5_000);
    let (clock, hand) = Clock::manual(now);
    record(&headers, &stats, &clock);
    let got = stats.load_report().expect("a report");
    assert_eq!(
        (got.utilization, got.qps, got.eps, got.at),
        (0.5, 100.0, 2.0, now)
    );
    // A rejected report leaves the last good one.
    let mut bad = HeaderMap::new();
    bad.insert(HEADER, "TEXT cpu_utilization=oops".parse().expect("value"));
    hand.advance(std::time::Duration::from_secs(1));
    record(&bad, &stats, &clock);
    assert_eq!(stats.load_report().map(|r| r.at), Some(now));
}
