use super::*;

fn any() -> ProviderFilter {
    ProviderFilter::default()
}

fn endpoint(d: Decoded) -> EndpointSpec {
    match d {
        Decoded::Endpoint(s) => s,
        other => panic!("expected an endpoint, got {other:?}"),
    }
}

fn rejected(d: Decoded) -> String {
    match d {
        Decoded::Rejected(r) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn service_paths() {
    let p = ServicePath::new("/dubbo/", "com.acme.Greeter", Layout::Dubbo).unwrap();
    assert_eq!(p.dir(), "/dubbo/com.acme.Greeter/providers");
    assert_eq!(
        ServicePath::new("a/b", "s", Layout::Plain).unwrap().dir(),
        "/a/b/s"
    );
    for (root, svc) in [
        ("", "s"),
        ("a//b", "s"),
        ("dubbo", ""),
        ("dubbo", "a/b"),
        ("x/..", "s"),
    ] {
        assert!(
            ServicePath::new(root, svc, Layout::Dubbo).is_err(),
            "{root:?} {svc:?}"
        );
    }
}

#[test]
fn dubbo_nodes_decode_like_dubbo() {
    let name = "dubbo%3A%2F%2F10.0.0.1%3A20880%2Fcom.acme.Greeter%3Fweight%3D200%26timestamp%3D1700000000000%26group%3Dg1%26version%3D1.0";
    let s = endpoint(decode_dubbo(name, &any()));
    assert_eq!((s.address.as_str(), s.weight), ("10.0.0.1:20880", 200));
    assert!(s.registered_at.is_some());
    assert!(rejected(decode_dubbo("foo%3A%2F%2Fa%3A1%2Fx", &any())).contains("unknown protocol"));
    assert!(rejected(decode_dubbo(
        "dubbo%3A%2F%2Fa%3A1%2Fx%3Fweight%3Dheavy",
        &any()
    ))
    .contains("weight"));
    assert!(rejected(decode_dubbo("not-a-url", &any())).contains("no protocol"));
    assert!(rejected(decode_dubbo("dubbo%3A%2F%2Fa%2Fx", &any())).contains("no port"));
}

#[test]
fn filters_follow_dubbo_matching() {
    let url = |q: &str| ProviderUrl::parse(&format!("dubbo://a:1/x?{q}")).unwrap();
    let f = |g: Option<&str>, v: Option<&str>, p: Option<&str>| ProviderFilter {
        group: g.map(str::to_owned),
        version: v.map(str::to_owned),
        protocol: p.map(str::to_owned),
    };
    let g1 = url("group=g1&version=1.0");
    let plain = url("side=provider");
    assert!(any().matches(&g1) && any().matches(&plain));
    assert!(f(Some("g1"), None, None).matches(&g1));
    assert!(f(Some("g0,g1"), None, None).matches(&g1));
    assert!(f(Some("*"), Some("*"), None).matches(&g1));
    assert!(!f(Some("g2"), None, None).matches(&g1));
    assert!(
        f(Some(""), None, None).matches(&plain),
        "empty group = only ungrouped"
    );
    assert!(!f(Some(""), None, None).matches(&g1));
    assert!(f(None, Some("1.0"), None).matches(&g1));
    assert!(!f(None, Some("2.0"), None).matches(&g1));
    assert!(f(None, None, Some("dubbo")).matches(&g1));
    assert!(!f(None, None, Some("tri")).matches(&g1));
    assert_eq!(
        decode_dubbo(
            "dubbo%3A%2F%2Fa%3A1%2Fx%3Fgroup%3Dg1",
            &f(Some("g2"), None, None)
        ),
        Decoded::Filtered
    );
}

#[test]
fn plain_nodes() {
    let s = endpoint(decode_plain("10.0.0.1:80", b""));
    assert_eq!((s.address.as_str(), s.weight), ("10.0.0.1:80", 100));
    let s = endpoint(decode_plain(
        "10.0.0.1:80",
        br#"{"weight": 7, "zone": "eu-1", "metadata": {"v": "2"}, "future": true}"#,
    ));
    assert_eq!((s.weight, s.zone.as_deref()), (7, Some("eu-1")));
    assert_eq!(s.metadata["v"], "2");
    assert!(rejected(decode_plain("10.0.0.1", b"")).contains("no port"));
    assert!(rejected(decode_plain("10.0.0.1:80", b"{weight: 1")).contains("JSON"));
    assert!(rejected(decode_plain("10.0.0.1:80", br#"{"weight": -1}"#)).contains("JSON"));
    assert!(rejected(decode_plain("10.0.0.1:80", &[0xff, 0xfe])).contains("UTF-8"));
}

#[test]
fn provider_nodes_round_trip_in_both_layouts() {
    let mut p = Provider::new("10.0.0.9:20880");
    p.weight = 250;
    p.group = Some("g1".into());
    p.zone = Some("eu-1".into());
    p.metadata.insert("tag", "blue");
    p.validate().unwrap();
    let dubbo = ServicePath::new("dubbo", "com.acme.Greeter", Layout::Dubbo).unwrap();
    let (name, data) = p.node(&dubbo, 1_700_000_000_000);
    assert!(data.is_empty());
    assert!(
        name.starts_with("dubbo%3A%2F%2F10.0.0.9%3A20880%2Fcom.acme.Greeter%3Fanyhost%3Dfalse%26application%3Dlbkit"),
        "{name}"
    );
    let s = endpoint(decode_dubbo(&name, &any()));
    assert_eq!((s.address.as_str(), s.weight), ("10.0.0.9:20880", 250));
    assert_eq!(
        (
            s.zone.as_deref(),
            s.metadata["group"].as_str(),
            s.metadata["tag"].as_str()
        ),
        (Some("eu-1"), "g1", "blue")
    );
    let plain = ServicePath::new("svc", "greeter", Layout::Plain).unwrap();
    let (name, data) = p.node(&plain, 0);
    let s = endpoint(decode_plain(&name, &data));
    assert_eq!(
        (s.address.as_str(), s.weight, s.zone.as_deref()),
        ("10.0.0.9:20880", 250, Some("eu-1"))
    );
    assert_eq!(s.metadata["tag"], "blue");
}

#[test]
fn provider_validation() {
    let mut p = Provider::new("10.0.0.9:20880");
    p.protocol = "carrier-pigeon".into();
    assert!(p.validate().is_err());
    let mut p = Provider::new("10.0.0.9");
    assert!(p.validate().is_err());
    p.address = "10.0.0.9:1".into();
    p.metadata.insert("k", "a&b");
    assert!(p.validate().is_err());
}
