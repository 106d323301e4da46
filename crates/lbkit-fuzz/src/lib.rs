//! # lbkit-fuzz
//!
//! The checks behind lbkit's fuzz targets: one function per parser that takes arbitrary bytes,
//! runs the parser and panics when a property fails — never just "does not crash" where a
//! property can be stated. The cargo-fuzz crate in `fuzz/` (stable toolchain,
//! `--sanitizer none`) calls them, and `tests/corpora.rs` replays every seed and finding in
//! `fuzz/corpus/` through them in the normal test suite. [`TARGETS`] lists them; RELIABILITY.md
//! has the commands and the figures.
//!
//! | target | parser | properties beyond "no panic" |
//! |---|---|---|
//! | `endpoints_toml`, `endpoints_json`, `endpoints_dubbo` | endpoint files | a parsed list is non-empty and has no duplicate address |
//! | `pick` | a JSON endpoint file with observed statistics, then every strategy of the catalog (`lbkit pick`'s path) | each pick is an endpoint of the snapshot or an error, and finishing its call never panics |
//! | `dubbo_url` | Dubbo provider URLs | printing a parsed URL (without reserved characters) and parsing it again gives it back |
//! | `zk_node` | ZooKeeper child names and data, both layouts | a decoded provider's address is valid |
//! | `override_rule` | Dubbo override rules (configurators nodes, and the input as a YAML configurator), applied to a provider | the rewritten provider still gives an endpoint; only parameters change, each to the value the last applied rule set |
//! | `trace` | a trace segment (lbkit-trace's format) | parsing never panics; every record it keeps is consistent (a retry is an attempt past the first); a trace with records fits a scenario (lbkit-sim's `fit`) that parses and validates, whatever names and numbers the trace holds |
//! | `tag_rule` | a Dubbo 3 tag rule (YAML), and each input line as a tag address | every tagged, untagged and forced pick over providers the rule annotated lands in the set the routing table gives (a tag's providers, the untagged ones) or fails with a tag error |
//! | `service_config` | lbkit's service config | every service and method resolves |
//! | `proxy_config` | the proxy's config | — |
//! | `scenario` | simulator scenarios | a parsed scenario is within every documented limit |
//! | `h1_request` | the fast path's request head | no prefix of a served head is served; offsets stay in the buffer |
//! | `h1_response` | the fast path's response head and body framing | feeding a body in pieces decides as feeding it whole |
//! | `h1_differential` | the fast path against hyper | a request the fast path serves, hyper's engine frames the same way (method, target, body length) and admits (`Host`, normal path) |
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

use std::cell::RefCell;
use std::collections::HashSet;
use std::path::Path;
use std::rc::Rc;

use lbkit::Timestamp;
use lbkit_discovery::dubbo::ProviderUrl;
use lbkit_discovery::file::{parse, Format};
use lbkit_discovery::zookeeper::{decode_node, Layout, ProviderFilter};
use lbkit_proxy::fuzzing::{self as proxy, RequestFraming};

/// A target's check: panics when a property fails for the input.
pub type Check = fn(&[u8]);

/// Every fuzz target: its name (the file in `fuzz/fuzz_targets/` and the corpus directory in
/// `fuzz/corpus/`) and its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("endpoints_toml", endpoints_toml),
    ("endpoints_json", endpoints_json),
    ("endpoints_dubbo", endpoints_dubbo),
    ("pick", pick),
    ("dubbo_url", dubbo_url),
    ("zk_node", zk_node),
    ("override_rule", override_rule),
    ("tag_rule", tag_rule),
    ("trace", trace),
    ("service_config", service_config),
    ("proxy_config", proxy_config),
    ("scenario", scenario),
    ("h1_request", h1_request),
    ("h1_response", h1_response),
    ("h1_differential", h1_differential),
];

/// The proxy's default `limits.max_headers`.
const MAX_HEADERS: usize = 100;

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

fn endpoints(data: &[u8], format: Format) {
    let Some(text) = text(data) else { return };
    let Ok(list) = parse(text, format, "fuzz", Timestamp::ZERO) else {
        return;
    };
    assert!(!list.is_empty(), "an empty list parsed");
    let mut seen = HashSet::new();
    for e in &list {
        assert!(
            seen.insert(e.spec.address.as_str()),
            "duplicate address {}",
            e.spec.address
        );
    }
}

/// Endpoint files in TOML.
pub fn endpoints_toml(data: &[u8]) {
    endpoints(data, Format::Toml);
}

/// Endpoint files in JSON.
pub fn endpoints_json(data: &[u8]) {
    endpoints(data, Format::Json);
}

/// Endpoint files of Dubbo URL lines.
pub fn endpoints_dubbo(data: &[u8]) {
    endpoints(data, Format::DubboUrls);
}

/// `lbkit pick`'s path: a JSON endpoint file with observed statistics (the format that can
/// carry every field, load reports included), the statistics seeded, then every strategy of
/// the catalog with its default parameters prepares and picks, and each call is finished.
pub fn pick(data: &[u8]) {
    use lbkit::strategy::catalog;
    use lbkit::{Balancer, FastRng, HealthOverlay, Outcome, PickContext, Snapshot, SnapshotPolicy};
    let Some(text) = text(data) else { return };
    let now = Timestamp::from_millis(1_700_000_000_000);
    let Ok(list) = parse(text, Format::Json, "fuzz", now) else {
        return;
    };
    // ketama puts 160 points per unit of weight on its ring, up to its documented bound of
    // 2^24 points, which takes 1.3-1.6 s and 250 MiB to prepare (release build, one endpoint
    // of weight 100 100; RELIABILITY.md has the command): within its limit, but past
    // libFuzzer's per-input timeout here.
    let total: u64 = list.iter().map(|e| u64::from(e.spec.weight)).sum();
    if total * 160 > 1 << 20 {
        return;
    }
    let (specs, seeds): (Vec<_>, Vec<_>) = list.into_iter().map(|e| (e.spec, e.observed)).unzip();
    let observed = Snapshot::from_specs(specs, now);
    for (e, seed) in observed.endpoints().iter().zip(&seeds) {
        e.stats().seed(seed, now);
    }
    let snapshot = std::sync::Arc::new(observed.derive(
        1,
        &SnapshotPolicy::default(),
        &HealthOverlay::default(),
    ));
    let mut rng = FastRng::seed_from_u64(u64::from(data.len() as u32));
    for info in catalog::strategies() {
        let Ok(strategy) = catalog::build(info.name, catalog::Params::default()) else {
            continue;
        };
        let balancer = Balancer::new(strategy, snapshot.clone(), now);
        for i in 0..4u8 {
            let key = [i];
            let mut cx = PickContext::new(now, &mut rng).with_key(&key);
            if let Ok(guard) = balancer.pick(&mut cx) {
                let address = guard.endpoint().address().to_owned();
                assert!(
                    snapshot.endpoints().iter().any(|e| e.address() == address),
                    "{}: picked {address}, not in the snapshot",
                    info.name
                );
                guard.finish(if i % 2 == 0 {
                    Outcome::Success
                } else {
                    Outcome::Cancelled
                });
            }
        }
    }
}

/// Characters that printing does not escape, so a URL with them cannot round-trip.
fn printable(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !"&=?#%+".contains(c))
}

/// Dubbo provider URLs, plain or URL-encoded.
pub fn dubbo_url(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(url) = ProviderUrl::parse(text) else {
        return;
    };
    let _ = url.to_spec();
    let clean = printable(&url.address)
        && (url.path.is_empty() || printable(&url.path))
        && url.params.iter().all(|(k, v)| printable(k) && printable(v));
    if clean {
        let printed = url.to_string();
        let again = ProviderUrl::parse(&printed)
            .unwrap_or_else(|e| panic!("{printed:?} (printed from {text:?}) does not parse: {e}"));
        assert_eq!(again, url, "{text:?} printed as {printed:?}");
    }
}

/// ZooKeeper provider nodes: the name up to the first NUL, the data after it, decoded in
/// both layouts.
pub fn zk_node(data: &[u8]) {
    let (name, node_data) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Some(name) = text(name) else { return };
    let any = ProviderFilter::default();
    for layout in [Layout::Dubbo, Layout::Plain] {
        if let Ok(Some(spec)) = decode_node(layout, name, node_data, &any) {
            assert!(
                lbkit_discovery::check_address(&spec.address).is_ok(),
                "{layout:?} node {name:?} decoded to a bad address {:?}",
                spec.address
            );
        }
    }
}

/// Override rules: each line of the input a configurators node name, applied together to a
/// provider URL (the first line, when it parses as one; else a fixed one).
pub fn override_rule(data: &[u8]) {
    use lbkit_discovery::governance::{parse_yaml_configurators, Overrides, RuleNode};
    let Some(text) = text(data) else { return };
    let mut lines = text.lines();
    let fixed = "dubbo://10.0.0.1:20880/com.acme.Greeter?application=shop&weight=100";
    let provider = lines
        .clone()
        .next()
        .and_then(|l| ProviderUrl::parse(l).ok())
        .filter(|u| u.to_spec().is_ok());
    let provider = match provider {
        Some(u) => {
            lines.next();
            u
        }
        None => ProviderUrl::parse(fixed).expect("a fixed provider"),
    };
    let rules = Overrides::new(lines.filter_map(|l| RuleNode::parse(l).ok()));
    check_rules(&rules, &provider);
    // The whole input as a Dubbo 3 YAML configurator, too.
    if let Ok(nodes) = parse_yaml_configurators(text, "com.acme.Greeter") {
        check_rules(&Overrides::new(nodes), &provider);
    }
}

/// Properties of `rules` applied to `provider`.
fn check_rules(rules: &lbkit_discovery::governance::Overrides, provider: &ProviderUrl) {
    let (out, applied) = rules.apply(provider, Some("web"));
    assert!(
        out.to_spec().is_ok(),
        "rules {:?} made {provider} unusable: {out}",
        rules.rules()
    );
    // Every parameter that changed is one an applied rule set, to the last value set.
    for (k, v) in &out.params {
        if provider.params.get(k) != Some(v) {
            let last = applied
                .iter()
                .flat_map(|(_, sets)| sets.iter())
                .rfind(|(key, _)| key == k);
            assert_eq!(last.map(|(_, val)| val), Some(v), "{k} changed by no rule");
        }
    }
    assert_eq!(
        (&out.protocol, &out.address, &out.path),
        (&provider.protocol, &provider.address, &provider.path),
        "rules change parameters only"
    );
}

/// A tag rule: the input as a YAML tag rule, applied to fixed providers (some with their own
/// `dubbo.tag`), then picks for every tag it names, an unknown one, forced or not, and none; and
/// each input line as a tag address, matched against the providers.
pub fn tag_rule(data: &[u8]) {
    use lbkit::{Balancer, Snapshot};
    use lbkit_discovery::governance::tag::{parse_tag_rule, AddressPattern};
    let Some(text) = text(data) else { return };
    for line in text.lines() {
        if let Ok(p) = AddressPattern::parse(line) {
            for h in TAG_HOSTS {
                let _ = p.matches(h, 20880);
            }
        }
    }
    let Ok(parsed) = parse_tag_rule(text) else {
        return;
    };
    let mut specs = tagged_providers();
    let mut names = vec!["blue".to_owned(), "gray".to_owned(), "unknown".to_owned()];
    if let Some(rule) = &parsed.rule {
        for s in &mut specs {
            rule.annotate(s);
        }
        names.extend(rule.tags.iter().map(|t| t.name.clone()));
    }
    let now = Timestamp::ZERO;
    let strategy = lbkit::strategy::catalog::build("round-robin", Default::default())
        .expect("round-robin builds");
    let balancer = Balancer::new(
        strategy,
        std::sync::Arc::new(Snapshot::from_specs(specs, now)),
        now,
    );
    check_tag_picks(&balancer, &names);
}

/// The providers [`tag_rule`] applies rules to, by host.
const TAG_HOSTS: [&str; 5] = ["10.0.0.1", "10.0.0.2", "192.168.1.63", "::1", "provider-1"];

/// [`TAG_HOSTS`] on port 20880, every third tagged `blue`, every third `gray`, the rest not.
fn tagged_providers() -> Vec<lbkit::EndpointSpec> {
    TAG_HOSTS
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let addr = if h.contains(':') {
                format!("[{h}]:20880")
            } else {
                format!("{h}:20880")
            };
            let spec = lbkit::EndpointSpec::new(addr);
            match i % 3 {
                0 => spec.with_meta("dubbo.tag", "blue"),
                1 => spec.with_meta("dubbo.tag", "gray"),
                _ => spec,
            }
        })
        .collect()
}

/// Picks for each tag of `names`, forced or not, and for none, each inside the set the routing
/// table gives that tag (a fall back never to a tagged provider), or failing as the table says.
fn check_tag_picks<S: lbkit::Strategy>(balancer: &lbkit::Balancer<S>, names: &[String]) {
    use lbkit::{FastRng, PickContext, RequestTag};
    let now = Timestamp::ZERO;
    let prepared = balancer.current();
    let mut rng = FastRng::seed_from_u64(1);
    let tags = names
        .iter()
        .flat_map(|n| {
            [
                RequestTag::new(n.as_bytes()),
                RequestTag::forced(n.as_bytes()),
            ]
        })
        .map(Some)
        .chain([None]);
    for tag in tags {
        let routed = prepared.routed(tag);
        for _ in 0..4 {
            let mut cx = PickContext::new(now, &mut rng);
            cx.tag = tag;
            check_tag_pick(balancer, tag, balancer.pick(&mut cx), &routed);
        }
    }
}

/// One pick for `tag` against what the routing table gives it: inside the table's set (a fall
/// back never to a tagged provider), or the table's error.
fn check_tag_pick<S: lbkit::Strategy>(
    balancer: &lbkit::Balancer<S>,
    tag: Option<lbkit::RequestTag<'_>>,
    picked: Result<lbkit::CallGuard, lbkit::PickError>,
    routed: &Result<(lbkit::Routed, lbkit::RoutedSet<'_>), lbkit::PickError>,
) {
    use lbkit::{PickError, Routed};
    match (picked, routed) {
        (Ok(g), Ok((how, set))) => {
            let idx = balancer
                .snapshot()
                .find(g.endpoint().key())
                .expect("in the snapshot");
            assert!(set.contains(idx), "{tag:?} picked outside its set");
            let own = g.endpoint().metadata().get("dubbo.tag").cloned();
            match how {
                Routed::Untagged | Routed::Fallback => assert!(
                    *how == Routed::Untagged || own.is_none(),
                    "{tag:?}: a fall back to a tagged provider"
                ),
                Routed::Tagged | Routed::All => {}
            }
            g.finish(lbkit::Outcome::Success);
        }
        (Err(e), Err(want)) => assert_eq!(e, *want),
        (Err(PickError::NoTagMatch | PickError::AllTagged), _) => {
            panic!("{tag:?}: the pick failed but the table routes it")
        }
        (got, want) => panic!(
            "{tag:?}: pick {:?}, table {:?}",
            got.map(|g| g.endpoint().address().to_owned()),
            want.as_ref().map(|r| r.0)
        ),
    }
}

/// lbkit's service configuration (`lbkit.toml`).
pub fn service_config(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let Ok(config) = lbkit::config::Config::from_toml(text, "fuzz") else {
        return;
    };
    for service in config.services() {
        let _ = config.resolve(service, None);
        let _ = config.resolve(service, Some("m"));
    }
    let _ = config.resolve("unknown", Some("m"));
}

/// The proxy's configuration.
pub fn proxy_config(data: &[u8]) {
    let Some(text) = text(data) else { return };
    let _ = lbkit_proxy::Config::parse(text, Path::new("fuzz.toml"));
}

/// Simulator scenarios.
pub fn scenario(data: &[u8]) {
    use lbkit_sim::{Scenario, MAX_CLIENTS, MAX_EVENTS, MAX_REQUESTS, MAX_SERVERS};
    let Some(text) = text(data) else { return };
    let Ok(s) = Scenario::parse(text, "fuzz") else {
        return;
    };
    assert!(s.requests <= MAX_REQUESTS, "requests {}", s.requests);
    assert!(
        s.workload.clients <= MAX_CLIENTS,
        "clients {}",
        s.workload.clients
    );
    let servers: u64 = s.servers.iter().map(|sv| u64::from(sv.count)).sum();
    assert!(servers <= MAX_SERVERS, "servers {servers}");
    assert!(s.events.len() <= MAX_EVENTS, "events {}", s.events.len());
}

/// The fast path's request head.
pub fn h1_request(data: &[u8]) {
    let RequestFraming::Plain {
        head,
        body,
        method,
        target,
        ..
    } = proxy::request(data, MAX_HEADERS)
    else {
        return;
    };
    assert!(
        head <= data.len() && head > 0,
        "head {head} of {}",
        data.len()
    );
    assert!(!method.is_empty() && target.starts_with(b"/"));
    assert!(body as u64 <= lbkit_proxy::MAX_REPLAY_BODY, "body {body}");
    // A head is served only once it is complete: no prefix of it is.
    for cut in [head - 1, head / 2, head.saturating_sub(2)] {
        let prefix = proxy::request(&data[..cut], MAX_HEADERS);
        assert!(
            !matches!(prefix, RequestFraming::Plain { .. }),
            "the prefix of {cut} bytes of a {head}-byte head was served: {prefix:?}"
        );
    }
}

/// The fast path's response head and body framing. The first byte: bit 0 says whether the
/// request was a HEAD, the rest is the piece size for the split feed.
pub fn h1_response(data: &[u8]) {
    let Some((&flags, buf)) = data.split_first() else {
        return;
    };
    let Ok(Some((len, _code, framing, _keep))) = proxy::response(buf, flags & 1 == 1) else {
        return;
    };
    assert!(len <= buf.len());
    let body = &buf[len..];
    let mut whole = proxy::Body::new(framing);
    let at_once = whole.feed(body).map(|n| (n, whole.done()));
    let piece = usize::from(flags >> 1) + 1;
    let mut split = proxy::Body::new(framing);
    let mut taken = 0;
    let in_pieces = loop {
        if taken == body.len() || split.done() {
            break Ok((taken, split.done()));
        }
        let chunk = &body[taken..body.len().min(taken + piece)];
        match split.feed(chunk) {
            Ok(n) => {
                assert!(n <= chunk.len());
                taken += n;
                if n < chunk.len() {
                    break Ok((taken, split.done()));
                }
            }
            Err(()) => break Err(()),
        }
    };
    assert_eq!(
        at_once, in_pieces,
        "{framing:?} body fed whole and in pieces of {piece}"
    );
    // A complete chunked answer: its trailers are read backwards from its end, within it.
    if let (Ok((n, true)), proxy::ResponseFraming::Chunked) = (at_once, framing) {
        let answer = &buf[..len + n];
        let (_, load) = proxy::chunked_trailers(answer);
        assert!(load.is_none_or(|r| r.start <= r.end && r.end <= answer.len()));
    }
}

/// What hyper's engine made of the first request on a connection.
#[derive(Debug)]
struct Seen {
    method: String,
    target: Option<String>,
    body: Result<usize, String>,
    admitted: Result<(Option<String>, Option<String>), &'static str>,
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
}

/// Serve `data` as one client connection with hyper's HTTP/1 server (configured as the proxy
/// configures it) and the proxy's admission rules; the first request it makes of it.
fn hyper_first_request(data: &[u8]) -> Option<Seen> {
    use http_body_util::{BodyExt, Empty};
    use hyper::service::service_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // One thread, one connection: the service runs on this thread only.
    let seen: Rc<RefCell<Option<Seen>>> = Rc::default();
    let record = seen.clone();
    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let record = record.clone();
        async move {
            let admitted = proxy::admits(&req);
            let method = req.method().as_str().to_owned();
            let target = req.uri().path_and_query().map(|p| p.as_str().to_owned());
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().len())
                .map_err(|e| e.to_string());
            let mut slot = record.borrow_mut();
            if slot.is_none() {
                *slot = Some(Seen {
                    method,
                    target,
                    body,
                    admitted,
                });
            }
            let mut resp = http::Response::new(Empty::<bytes::Bytes>::new());
            resp.headers_mut()
                .insert(http::header::CONNECTION, "close".parse().expect("value"));
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    RUNTIME.with(|rt| {
        rt.block_on(async {
            let (mut client, server) = tokio::io::duplex(data.len() + 64 * 1024);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .max_headers(MAX_HEADERS)
                .max_buf_size(64 * 1024)
                .header_read_timeout(None)
                // The peer half-closes after its bytes; hyper answers what it read.
                .half_close(true);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(server), svc);
            let peer = async {
                let _ = client.write_all(data).await;
                let _ = client.shutdown().await;
                let mut out = Vec::new();
                let _ = client.read_to_end(&mut out).await;
            };
            let _ = tokio::join!(conn, peer);
        });
    });
    let first = seen.borrow_mut().take();
    first
}

/// The fast path against hyper's engine on the same bytes.
pub fn h1_differential(data: &[u8]) {
    let RequestFraming::Plain {
        head,
        body,
        method,
        target,
        host,
    } = proxy::request(data, MAX_HEADERS)
    else {
        return;
    };
    if data.len() < head + body {
        return; // the fast path waits for the rest of the body
    }
    let seen = hyper_first_request(data)
        .unwrap_or_else(|| panic!("the fast path serves a request hyper refuses: {data:?}"));
    let as_text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert_eq!(seen.method, as_text(&method), "method of {data:?}");
    assert_eq!(seen.target, Some(as_text(&target)), "target of {data:?}");
    assert_eq!(seen.body, Ok(body), "body length of {data:?}");
    let host = host.map(|h| as_text(&h));
    assert_eq!(
        seen.admitted,
        Ok((host, None)),
        "hyper's engine admits {data:?} otherwise"
    );
}

/// The `trace` target: see the table in the crate docs.
pub fn trace(data: &[u8]) {
    let Ok(trace) = lbkit_trace::parse_segment(data, std::path::Path::new("fuzz")) else {
        return;
    };
    for r in &trace.records {
        assert_eq!(r.retry, r.attempt > 0, "{r:?}");
    }
    if trace.records.is_empty() {
        return;
    }
    let fit = lbkit_sim::fit::fit(&trace, None).expect("a trace with records fits");
    if let Err(e) = lbkit_sim::Scenario::parse(&fit.scenario, "fitted") {
        panic!("the fitted scenario does not parse: {e}\n{}", fit.scenario);
    }
}
