use super::*;

fn url(text: &str) -> ProviderUrl {
    ProviderUrl::parse(text).unwrap()
}

fn rule(text: &str) -> RuleNode {
    RuleNode::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn weight_after(rules: &[&str], provider: &str, app: Option<&str>) -> u32 {
    let rules = Overrides::new(rules.iter().map(|r| rule(r)));
    rules.apply(&url(provider), app).0.to_spec().unwrap().weight
}

const P10: &str =
    "dubbo://10.20.153.10:20880/com.foo.BarService?application=foo&side=provider&weight=100";
const P11: &str =
    "dubbo://10.20.153.11:20880/com.foo.BarService?application=bar&side=provider&weight=100";

/// Dubbo's own tests (`OverrideConfiguratorTest`, `AbsentConfiguratorTest`) as vectors.
#[test]
fn dubbo_configurator_test_vectors() {
    // testOverride_Application: `foo@0.0.0.0` is scoped to application foo.
    let app = Overrides::new([rule(
        "override://foo@0.0.0.0/com.foo.BarService?timeout=200",
    )]);
    assert_eq!(app.apply(&url(P10), None).0.params["timeout"], "200");
    assert!(!app.apply(&url(P11), None).0.params.contains_key("timeout"));
    // ... or to the consumer's application.
    assert_eq!(app.apply(&url(P11), Some("foo")).0.params["timeout"], "200");

    // testOverrideForVersion27, the provider rule: host and port, side and app match.
    let v27 = "override://172.24.160.179:21880/com.foo.BarService?side=provider&configVersion=2.7&application=foo&weight=200";
    let provider =
        "dubbo://172.24.160.179:21880/com.foo.BarService?application=foo&side=provider&weight=100";
    assert_eq!(weight_after(&[v27], provider, None), 200);

    // AbsentConfigurator: only what the URL lacks.
    let absent = Overrides::new([rule("absent://0.0.0.0/com.foo.BarService?timeout=200")]);
    let with = url("dubbo://10.20.153.10:20880/com.foo.BarService?timeout=1000");
    assert_eq!(absent.apply(&with, None).0.params["timeout"], "1000");
    assert_eq!(absent.apply(&url(P10), None).0.params["timeout"], "200");
}

/// The rules dubbo-admin writes, and Dubbo's documentation's examples.
#[test]
fn dubbo_admin_weight_and_disable_rules() {
    // dubbo-admin's weight and disable buttons: one provider, by address (URL-encoded node).
    let double = "override%3A%2F%2F10.20.153.10%3A20880%2Fcom.foo.BarService%3Fcategory%3Dconfigurators%26dynamic%3Dfalse%26enabled%3Dtrue%26weight%3D200";
    assert_eq!(weight_after(&[double], P10, None), 200);
    assert_eq!(weight_after(&[double], P11, None), 100, "another host");
    let disable = "override://10.20.153.10:20880/com.foo.BarService?category=configurators&disabled=true&dynamic=false&enabled=true";
    assert_eq!(weight_after(&[disable], P10, None), 0);
    // The documentation's "every provider": 0.0.0.0 without a port.
    let all =
        "override://0.0.0.0/com.foo.BarService?category=configurators&dynamic=false&disabled=true";
    assert_eq!(weight_after(&[all], P11, None), 0);
    // A host without a port names a consumer (Dubbo's reading): not applied to providers.
    let consumer = "override://10.20.153.10/com.foo.BarService?category=configurators&dynamic=false&weight=200";
    let rules = Overrides::new([rule(consumer)]);
    assert_eq!(
        rules.rules()[0].explain(&url(P10), None),
        Explained::Skipped("names a consumer address (a host without a port)")
    );
    // enabled=false switches the rule off; the condition keys are never copied.
    let off = "override://0.0.0.0/com.foo.BarService?enabled=false&weight=7";
    assert_eq!(weight_after(&[off], P10, None), 100);
    let doubled = Overrides::new([rule(double)]);
    let (out, applied) = doubled.apply(&url(P10), None);
    assert_eq!(applied[0].1, vec![("weight".to_owned(), "200".to_owned())]);
    assert!(!out.params.contains_key("category") && !out.params.contains_key("dynamic"));
}

#[test]
fn conditions_providers_and_tilde_keys() {
    let listed =
        "override://0.0.0.0/com.foo.BarService?providerAddresses=10.20.153.11:20880&weight=5";
    assert_eq!(weight_after(&[listed], P10, None), 100);
    assert_eq!(weight_after(&[listed], P11, None), 5);
    let tilde = "override://0.0.0.0/com.foo.BarService?~application=bar&weight=9";
    assert_eq!(weight_after(&[tilde], P10, None), 100);
    assert_eq!(weight_after(&[tilde], P11, None), 9);
    // Any host on one port.
    let port = "override://0.0.0.0:20880/com.foo.BarService?weight=3";
    assert_eq!(weight_after(&[port], P11, None), 3);
    let other = "override://0.0.0.0:20881/com.foo.BarService?weight=3";
    assert_eq!(weight_after(&[other], P11, None), 100);
}

#[test]
fn rules_compose_in_dubbos_order() {
    // The rule for one provider wins over the one for all, whatever the node order.
    let all = "override://0.0.0.0/com.foo.BarService?weight=50";
    let one = "override://10.20.153.10:20880/com.foo.BarService?weight=300";
    assert_eq!(weight_after(&[one, all], P10, None), 300);
    assert_eq!(weight_after(&[all, one], P10, None), 300);
    assert_eq!(weight_after(&[one, all], P11, None), 50);
    // Same host: by priority, the higher applying last.
    let low = "override://0.0.0.0/com.foo.BarService?weight=10&priority=1";
    let high = "override://0.0.0.0/com.foo.BarService?weight=20&priority=5";
    assert_eq!(weight_after(&[high, low], P10, None), 20);
    // A disable and a weight compose: disabled wins (weight 0), enabling again restores it.
    let enable = "override://10.20.153.10:20880/com.foo.BarService?disabled=false";
    let disable_all = "override://0.0.0.0/com.foo.BarService?disabled=true";
    assert_eq!(weight_after(&[disable_all, one], P10, None), 0);
    assert_eq!(weight_after(&[disable_all, one, enable], P10, None), 300);
    // empty:// clears everything.
    assert_eq!(
        weight_after(&[one, "empty://0.0.0.0/com.foo.BarService"], P10, None),
        100
    );
}

#[test]
fn malformed_rules_are_errors() {
    for (bad, why) in [
        ("route://0.0.0.0/x?weight=1", "not a rule protocol"),
        ("0.0.0.0/x?weight=1", "no protocol"),
        ("override:///x?weight=1", "no host"),
        ("override://0.0.0.0:http/x", "port"),
        ("override://0.0.0.0/x?weight=-1", "weight"),
        ("override://0.0.0.0/x?weight=2x", "weight"),
        ("override://0.0.0.0/x?priority=high", "priority"),
        ("override://0.0.0.0/x?=1", "has no name"),
        // Found by fuzzing: a rule that would leave the provider's URL unusable.
        (
            "override://10.0.0.1:20880/x?warmup=600000%2\u{4}weight=200",
            "warmup",
        ),
        ("override://0.0.0.0/x?timestamp=soon", "timestamp"),
        ("override://10.0.0lication=shop&timeout=5", "not a host"),
        ("override://a b/x?weight=1", "not a host"),
        ("override%3A%2F%2F%FF", "UTF-8"),
    ] {
        let e = RuleNode::parse(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

fn yaml_weight(yaml: &str, interface: &str, provider: &str, app: Option<&str>) -> u32 {
    let rules = Overrides::new(parse_yaml_configurators(yaml, interface).unwrap());
    rules.apply(&url(provider), app).0.to_spec().unwrap().weight
}

/// The examples of Dubbo's documentation ("configuration rules", v2.7 and v3.0 formats).
#[test]
fn dubbo_yaml_configurators() {
    let iface = "org.apache.dubbo.samples.governance.api.DemoService";
    let weight = "configVersion: v2.7\nscope: service\nkey: org.apache.dubbo.samples.governance.api.DemoService\nenabled: true\nconfigs:\n- addresses: [192.168.0.1:20880]\n  side: provider\n  parameters:\n    weight: 200\n";
    let p1 = format!("dubbo://192.168.0.1:20880/{iface}?application=demo-provider&weight=100");
    let p2 = format!("dubbo://192.168.0.2:20880/{iface}?application=demo-provider&weight=100");
    assert_eq!(yaml_weight(weight, iface, &p1, None), 200);
    assert_eq!(yaml_weight(weight, iface, &p2, None), 100);
    let rules = parse_yaml_configurators(weight, iface).unwrap();
    let RuleNode::Rule(r) = &rules[0] else {
        panic!("a rule")
    };
    assert_eq!(
        r.params["providerAddresses"], "192.168.0.1:20880",
        "a provider-side item's addresses"
    );
    assert_eq!(r.params["category"], "dynamicconfigurators");

    // Application scope: the key is the application; every service of it ("*").
    let disable = "configVersion: v2.7\nscope: application\nkey: demo-provider\nenabled: true\nconfigs:\n- addresses: [\"192.168.0.1:20880\"]\n  side: provider\n  parameters:\n    disabled: true\n";
    assert_eq!(yaml_weight(disable, iface, &p1, None), 0);
    assert_eq!(yaml_weight(disable, iface, &p2, None), 100);
    let other_app = format!("dubbo://192.168.0.1:20880/{iface}?application=shop&weight=100");
    assert_eq!(yaml_weight(disable, iface, &other_app, None), 100);

    // A consumer-side rule for every provider, scoped to applications; the document off.
    let consumer = format!("configVersion: v3.0\nscope: service\nkey: {iface}\nconfigs:\n- side: consumer\n  addresses: [0.0.0.0]\n  applications: [web, api]\n  parameters:\n    weight: 30\n");
    assert_eq!(parse_yaml_configurators(&consumer, iface).unwrap().len(), 2);
    assert_eq!(yaml_weight(&consumer, iface, &p2, Some("web")), 30);
    assert_eq!(yaml_weight(&consumer, iface, &p2, Some("batch")), 100);
    let off = consumer.replace("configs:", "enabled: false\nconfigs:");
    assert_eq!(yaml_weight(&off, iface, &p2, Some("web")), 100);
    // Another service's document gives no rule for this one; group and version go in the query.
    assert!(parse_yaml_configurators(&consumer, "other.Service")
        .unwrap()
        .is_empty());
    let keyed = consumer.replace(&format!("key: {iface}"), &format!("key: g1/{iface}:1.0"));
    let RuleNode::Rule(r) = &parse_yaml_configurators(&keyed, iface).unwrap()[0] else {
        panic!("a rule")
    };
    assert_eq!(
        (r.params["group"].as_str(), r.params["version"].as_str()),
        ("g1", "1.0")
    );

    // The older form: a JSON array of override URLs.
    let json = format!("[\"override://0.0.0.0/{iface}?weight=7\"]");
    assert_eq!(yaml_weight(&json, iface, &p1, None), 7);
}

#[test]
fn malformed_yaml_configurators_are_errors() {
    for (bad, why) in [
        ("configs: [", "not a configurator document"),
        ("scope: service\nconfigs: []\n", "key"),
        (
            "key: a.B\nconfigs:\n- addresses: [0.0.0.0]\n",
            "no parameters",
        ),
        (
            "key: a.B\nconfigs:\n- parameters:\n    weight: [1, 2]\n",
            "not a scalar",
        ),
        (
            "key: a.B\nconfigs:\n- parameters:\n    weight: heavy\n",
            "weight",
        ),
        ("[\"route://0.0.0.0/a.B?x=1\"]", "not a rule protocol"),
    ] {
        let e = parse_yaml_configurators(bad, "a.B").unwrap_err();
        assert!(e.contains(why), "{bad:?}: {e}");
    }
}
