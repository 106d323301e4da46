//! Vectors from Dubbo's `TagStateRouterTest`, `NetUtilsTest` and its documentation.

use super::*;

fn matches(pattern: &str, host: &str, port: u16) -> bool {
    AddressPattern::parse(pattern)
        .unwrap_or_else(|e| panic!("{pattern}: {e}"))
        .matches(host, port)
}

#[test]
fn addresses_match_as_dubbos_net_utils_test_says() {
    // testMatchIpRangeMatchWhenIpv4
    assert!(matches("*.*.*.*", "192.168.1.63", 90));
    assert!(matches("192.168.1.*", "192.168.1.63", 90));
    assert!(matches("192.168.1.63", "192.168.1.63", 90));
    assert!(matches("192.168.1.1-65", "192.168.1.63", 90));
    assert!(!matches("192.168.1.1-61", "192.168.1.63", 90));
    assert!(!matches("192.168.1.62", "192.168.1.63", 90));
    // testMatchIpRangeMatchWhenIpv6
    assert!(matches("234e:0:4567:0:0:0:3d:*", "234e:0:4567::3d:ff", 90));
    assert!(matches("234e:0:4567:0:0:0:3d:ee", "234e:0:4567::3d:ee", 90));
    assert!(matches("234e:0:4567::3d:ee", "234e:0:4567::3d:ee", 90));
    assert!(matches(
        "234e:0:4567:0:0:0:3d:0-ff",
        "234e:0:4567::3d:ee",
        90
    ));
    assert!(matches(
        "234e:0:4567:0:0:0:3d:0-ee",
        "234e:0:4567::3d:ee",
        90
    ));
    assert!(!matches(
        "234e:0:4567:0:0:0:3d:ff",
        "234e:0:4567::3d:ee",
        90
    ));
    assert!(!matches(
        "234e:0:4567:0:0:0:3d:0-ea",
        "234e:0:4567::3d:ee",
        90
    ));
    // testMatchIpMatch
    assert!(matches("192.168.1.192/26", "192.168.1.199", 90));
    // testMatchIpv6WithIpPort
    assert!(matches("[234e:0:4567::3d:ee]", "234e:0:4567::3d:ee", 8090));
    assert!(matches(
        "[234e:0:4567:0:0:0:3d:ee]:8090",
        "234e:0:4567::3d:ee",
        8090
    ));
    assert!(matches(
        "[234e:0:4567:0:0:0:3d:0-ee]:8090",
        "234e:0:4567::3d:ee",
        8090
    ));
    assert!(matches(
        "[234e:0:4567:0:0:0:3d:*]:90",
        "234e:0:4567::3d:ff",
        90
    ));
    assert!(!matches(
        "[234e:0:4567:0:0:0:3d:ee]:7289",
        "234e:0:4567::3d:ee",
        8090
    ));
    assert!(!matches(
        "[234e:0:4567:0:0:0:3d:ee-ff]:8090",
        "234e:0:4567::3d:ee",
        9090
    ));
    // testMatchIpv4WithIpPort
    assert!(matches("*.*.*.*:90", "192.168.1.63", 90));
    assert!(matches("192.168.1.63-65:90", "192.168.1.63", 90));
    assert!(!matches("*.*.*.*:80", "192.168.1.63", 90));
    assert!(!matches("192.168.1.63:80", "192.168.1.63", 90));
    assert!(!matches("192.168.1.1-61:90", "192.168.1.62", 90));
    // TagStateRouter's own check: 0.0.0.0:PORT is any host on that port.
    assert!(matches("0.0.0.0:20880", "10.0.0.7", 20880));
    assert!(!matches("0.0.0.0:20880", "10.0.0.7", 20881));
    // Host names compare as text.
    assert!(matches("Provider-1:20880", "provider-1", 20880));
    assert!(!matches("provider-1", "provider-2", 20880));
}

#[test]
fn patterns_dubbo_throws_on_do_not_parse() {
    for bad in [
        "192.168.1.192/26:90", // testMatchIpv4WithIpPort: a port on a block
        "234e:0:4567::3d:*",   // testMatchIpRangeMatchWhenIpv6Exception: '*' needs all segments
        "192.168.1.1-65-3",    // a range of three
        "192.168.1.300",
        "10.0.0.1:http",
        "10.0.0.0/33",
        "",
    ] {
        assert!(AddressPattern::parse(bad).is_err(), "{bad:?} parsed");
    }
}

#[test]
fn the_rule_parses_as_dubbos_tag_router_rule_parse_test() {
    // tagRouterRuleParseTest: null, [] and ~ list no addresses.
    let yaml = "---\nforce: false\nruntime: true\nenabled: false\npriority: 1\nkey: demo-provider\ntags:\n  - name: tag1\n    addresses: null\n  - name: tag2\n    addresses: [\"30.5.120.37:20880\"]\n  - name: tag3\n    addresses: []\n  - name: tag4\n    addresses: ~\n...";
    let parsed = parse_tag_rule(yaml).expect("parses");
    let rule = parsed.rule.expect("valid");
    assert_eq!(rule.key, "demo-provider");
    assert!(!rule.enabled && !rule.force);
    let names: Vec<&str> = rule.tags.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["tag1", "tag2", "tag3", "tag4"]);
    let listed: Vec<bool> = rule.tags.iter().map(|t| t.listed).collect();
    assert_eq!(listed, [false, true, false, false]);
    assert_eq!(rule.groups("30.5.120.37", 20880), ["tag2"]);
    assert!(rule.groups("30.5.120.37", 20881).is_empty());
    // Disabled: nothing is written on the providers.
    let mut spec = EndpointSpec::new("30.5.120.37:20880");
    rule.annotate(&mut spec);
    assert!(spec.metadata.is_empty());
}

#[test]
fn the_documented_rule_annotates_its_providers() {
    // The Dubbo 2.7 documentation's tag rule ("tag routing").
    let yaml = "force: false\nruntime: true\nenabled: true\nkey: governance-tagrouter-provider\ntags:\n  - name: tag1\n    addresses: [\"127.0.0.1:20880\"]\n  - name: tag2\n    addresses: [\"127.0.0.1:20881\"]\n";
    let rule = parse_tag_rule(yaml).expect("parses").rule.expect("valid");
    let mut a = EndpointSpec::new("127.0.0.1:20880");
    let mut c = EndpointSpec::new("127.0.0.1:20882");
    rule.annotate(&mut a);
    rule.annotate(&mut c);
    assert_eq!(a.metadata[TAG_RULE_KEY], "governance-tagrouter-provider");
    assert_eq!(a.metadata[TAG_RULE_FORCE_KEY], "false");
    assert_eq!(a.metadata[TAG_RULE_NAMES_KEY], "tag1,tag2");
    assert_eq!(a.metadata[TAG_RULE_LISTED_KEY], "tag1,tag2");
    assert_eq!(a.metadata[TAG_GROUPS_KEY], "tag1");
    assert!(!c.metadata.contains_key(TAG_GROUPS_KEY));
    assert_eq!(c.metadata[TAG_RULE_NAMES_KEY], "tag1,tag2");
}

#[test]
fn a_document_without_tags_is_no_rule_and_bad_ones_are_errors() {
    assert_eq!(
        parse_tag_rule("key: app\nenabled: true\n").map(|p| p.rule),
        Ok(None)
    );
    assert!(parse_tag_rule("tags: [\n").is_err());
    assert!(parse_tag_rule("tags:\n  - addresses: [\"1.2.3.4\"]\n").is_err());
    assert!(parse_tag_rule("tags:\n  - name: \"a,b\"\n").is_err());
    assert!(parse_tag_rule("tags:\n  - name: a\n  - name: a\n").is_err());
    // An address that does not parse is reported, and its tag stays listed (matching nobody).
    let p = parse_tag_rule("key: app\ntags:\n  - name: a\n    addresses: [\"10.0.0.300\"]\n")
        .expect("parses");
    assert_eq!(p.bad_addresses.len(), 1);
    let rule = p.rule.expect("valid");
    assert!(rule.tags[0].listed && rule.tags[0].addresses.is_empty());
}

#[test]
fn the_path_is_the_applications() {
    assert_eq!(
        tag_rule_path("dubbo", "demo-provider"),
        "/dubbo/config/dubbo/demo-provider.tag-router"
    );
}
