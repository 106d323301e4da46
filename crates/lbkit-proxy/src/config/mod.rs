//! The proxy's configuration file (TOML). Unknown fields are errors; every field below lists
//! its default.
//!
//! ```toml
//! [admin]                               # optional
//! bind = "127.0.0.1:9901"               # default 127.0.0.1:9901
//! token = "s3cret"                      # default none: no bearer token asked
//!
//! [limits]                              # optional
//! max_header_bytes = 65536              # default 64 KiB (at least 8192): request head buffer (HTTP/1) / header list (h2)
//! max_headers = 100                     # default 100 request headers (HTTP/1)
//! header_read_timeout_ms = 10000        # default 10 s: a client slower to send its head (and a small body) is cut off, from its first byte (or from the connection's start, for its first request; on a connection hyper serves, from the handover: a half-sent HTTP/2 preface)
//! idle_timeout_ms = 60000               # default 60 s: a client connection with no request in flight and none starting is closed (HTTP/2: GOAWAY, then closed header_read_timeout_ms later at the latest); nginx's keepalive_timeout
//! stream_idle_timeout_ms = 300000       # default 5 min: an HTTP/2 stream with no byte either way for this long (noticed within a quarter of it more) is reset (RST_STREAM CANCEL), its upstream exchange cancelled, whatever the connection's other streams do (Envoy's stream_idle_timeout; nginx has none per stream); a client connection hyper serves (HTTP/1.0, Expect, chunked uploads, ...) with a request in flight but no byte read or written for this long is closed
//! max_requests_per_connection = 1000    # default 1 000, 0 = no limit: requests one client connection may make; then HTTP/1.1 gets `Connection: close` with the last answer, HTTP/2 a graceful GOAWAY (its streams in flight finish); nginx's keepalive_requests (also 1 000), Envoy's max_requests_per_connection (no limit there by default)
//! max_premature_resets = 100            # default 100, 0 = no limit: an HTTP/2 connection whose client reset this many streams before their answer started, and at least half of the streams it opened, gets GOAWAY ENHANCE_YOUR_CALM and is closed (the HTTP/2 rapid reset attack, CVE-2023-44487, burst or paced); Envoy's overload.premature_reset_total_stream_count (500, with the same half); nginx caps requests per connection instead
//! max_connections = 10000               # default 10 000 client connections at once, all listeners
//! drain_timeout_ms = 10000              # default 10 s: graceful shutdown waits this long for in-flight work
//! upgrade_protocols = ["websocket"]     # default ["websocket"]: HTTP/1.1 upgrades tunnelled to the upstream (names, any case; "h2c" is refused); others go as plain requests
//! tunnel_idle_timeout_ms = 300000       # default 5 min: an upgraded connection with no byte either way for this long is closed
//! tcp_idle_timeout_ms = 600000          # default 10 min: a TCP listener's connection with no byte either way for this long is closed
//!
//! [[listener]]                          # at least one
//! bind = "127.0.0.1:8080"               # required
//! protocol = "http"                     # default "http" (HTTP/1.1 and h2c); or "tcp" (L4)
//! service = "db"                        # tcp only, required there: the service every connection goes to
//!
//! [[route]]                             # http listeners; first match in file order wins
//! host = "api.example.com"              # default any host (compared without port, case-insensitively)
//! path_prefix = "/api/"                 # default "/"
//! service = "api"                       # required: a [service.NAME]
//! timeout_ms = 15000                    # default 15 s: whole upstream exchange, retries included; once a large answer streams, each read or write (HTTP/1 fast path); an HTTP/2 answer waiting this long for the client's flow-control window is reset (give long-lived streaming routes, such as server-streaming gRPC to slow readers, a longer one); a client connection whose writes make no progress for the longest route timeout is closed
//! per_try_timeout_ms = 2000             # default none: each attempt's limit inside timeout_ms (Envoy's per_try_timeout); an attempt that times out is retried on another endpoint (idempotent requests) while timeout_ms has time left
//! hedge = "p95"                         # default none: hedge idempotent requests with a buffered body — after the service's recent p95 latency (or a delay: "20ms") without an answer, a second attempt goes to an endpoint not tried yet, the first answer wins and the other is cancelled (not the endpoint's failure); a hedge is an attempt (it needs retries >= 1) and draws on the retry budget. HTTP/1.1 requests it may hedge go through hyper's engine
//! hash_key = "header:x-user"            # default none; `header:NAME`, `cookie:NAME`, `path` (without the query), `uri` (with it), `query:NAME`, `source-ip`: read as lbkit-tower reads them, so a key picks the same endpoint through both
//!
//! [service.api]
//! endpoints = ["127.0.0.1:8081=100", "127.0.0.1:8082"]   # exactly one of endpoints, file, zookeeper, xds
//! # file = "endpoints.toml"                                # an endpoint file, watched (TOML, JSON, Dubbo URLs)
//! # zookeeper = { zk = "127.0.0.1:2181", interface = "com.acme.Api", root = "dubbo", layout = "dubbo", cache = "api.cache.json", watch = "auto", rules = true, application = "web" }
//! #   rules: obey the override rules under /ROOT/INTERFACE/configurators (weight, disabled; default true); application: the consumer's, for rules scoped to one
//! # xds = { server = "127.0.0.1:18000", cluster = "api", node = "lbkit", cache = "api.xds-cache.json" }
//! #   one cluster of an xDS control plane (`lbkit xds`, Istio, ...) over ADS: CDS, then EDS; node default "lbkit", cache default none (as zookeeper's)
//! strategy = "round-robin"              # default "round-robin"; any name of `lbkit pick --list`
//! params = { }                          # default {}: the strategy's parameters
//! retries = 2                           # default 2, at most 15: further attempts, each on an endpoint not tried yet (lbkit-core's attempt table decides which failures are retried)
//! retry_budget_percent = 20             # default 20: retries allowed as a share of requests
//! retry_budget_min_per_sec = 10         # default 10: retries always allowed per second
//! connect_timeout_ms = 1000             # default 1 s
//! upstream_idle_timeout_ms = 50000      # default 50 s: an idle upstream keep-alive connection is closed after this (keep it below the upstreams' own idle limit)
//! upstream_max_idle = 256               # default 256, at least 1: idle upstream HTTP/1.1 connections kept per endpoint and worker thread; an upstream connect finished after its request went (an HTTP/2 client reset the stream) waits there for the next request instead of being closed unused (nginx's upstream `keepalive`, 32 per worker there; Envoy keeps all)
//! h2c = false                           # default false: talk HTTP/2 cleartext to the upstreams (`:authority` = the endpoint's address, no `Host`, RFC 9113 §8.3.1; the client's host goes in `Forwarded: host=`; a connection on which a call gave up waiting is sent a PING, and closed when no PONG comes within connect_timeout_ms)
//! deadline_header = "x-request-timeout"  # default none: a request header of whole milliseconds that cuts the route's timeout_ms (the caller's deadline), rewritten to the time left on each attempt; gRPC's `grpc-timeout` is always honoured and rewritten the same way (Dubbo's timeout-countdown, gRPC deadline propagation); a deadline that has passed is answered 504, or `grpc-status: 4` (DEADLINE_EXCEEDED) to gRPC, with no attempt
//! orca_oob_ms = 1000                    # default none: with h2c = true, ask every endpoint for ORCA load reports on a gRPC stream (xds.service.orca.v3.OpenRcaService/StreamCoreMetrics) every this many ms, into the endpoint's statistics (what `adaptive` weighs, what /endpoints shows), as gRPC's weighted_round_robin does with enable_oob_load_report; reports in answers (endpoint-load-metrics) are read either way; a server without the service (UNIMPLEMENTED) is asked once; a failed stream is opened again after 1 s, doubling to 120 s
//! forwarded_headers = ["x-forwarded-for", "forwarded"]  # default both: the headers the client is appended to (`forwarded` is RFC 7239's, with proto and host); one left out is passed on as the client sent it; [] appends none (HAProxy without `option forwardfor`)
//! availability = { max_in_flight = 0 }  # default 0 = unlimited; plus `circuit_breaker` (default false)
//!                                       # and `pushback` (default true: pass over an endpoint that
//!                                       # answered 429, 503 + Retry-After or grpc-retry-pushback-ms)
//! outlier_detection = { enabled = true, interval_ms = 10000, consecutive_failures = 5, base_ejection_ms = 30000, max_ejection_percent = 10 }
//! removal_protection = { enabled = true, max_share = 0.5, window_ms = 10000, confirm_ms = 120000 }
//! #   mass-removal protection (default on): when the source's set shrinks by more than max_share of its largest size within window_ms (by more than one endpoint; additions count, so a blue/green switch holds nothing), the endpoints gone stay served until each is confirmed gone — its health check fails, outlier detection ejects it, or confirm_ms passes — as Eureka's self-preservation holds instances; the empty set is held as before (Dubbo's empty-push protection). Logged ("mass removal held"), counted (lbkit_discovery_removals_held_total, lbkit_discovery_endpoints_held)
//! health_check = { kind = "http", path = "/healthz", expect_status = 200, interval_ms = 5000, timeout_ms = 1000, rise = 2, fall = 3 }
//! tags = { header = "dubbo.tag", force_header = "dubbo.force.tag", default = "gray", force = false }
//! trace = { path = "api.lbkt", sample_rate = 0.01, max_bytes = 67108864 }
//! #   default none: record every attempt of sample_rate (default 0.01) of the requests into path (relative to this file; its older segment is path.1), at most max_bytes (default 64 MiB, at least 65536) over both; `lbkit trace print`, `lbkit sim --trace` read it
//! #   tag routing as Dubbo's TagRouter: a request's tag (header, or gRPC metadata, default none) picks the providers with that `dubbo.tag` (or the registry's tag rule); none → untagged providers; `force_header: true` → no fall back
//! ```
//!
//! * `zookeeper`: `zk` servers (required), `interface` (required), `root` (default `dubbo`),
//!   `layout` (`dubbo`, default, or `plain`), `cache` (default none: a registry cache file,
//!   Dubbo's `dubbo-registry-*.cache` as a JSON endpoints file, written after each change and
//!   served at start-up while ZooKeeper is unreachable, so a proxy restarted during an outage
//!   still routes), `watch` (`auto`, default: persistent recursive watches, or one-shot
//!   watches on servers older than ZooKeeper 3.6; `persistent`; `one-shot`).
//! * `outlier_detection` (Envoy's rules; each field defaults as shown, the whole table defaults to
//!   enabled): consecutive failures eject; success-rate and failure-percentage rules run with
//!   Envoy's defaults.
//! * `health_check` (default none): `kind` `http` (GET `path`, default `/`, expecting
//!   `expect_status`, default 200) or `tcp` (connect); `interval_ms` default 5000, `timeout_ms`
//!   default 1000, `rise` default 2 successes to mark up, `fall` default 3 failures to mark down.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// Most `retries` a service may have: lbkit-core's, for every config.
pub use lbkit_core::MAX_RETRIES;

/// Smallest `limits.max_header_bytes`: hyper's HTTP/1 read buffer cannot be smaller (8 KiB).
pub const MIN_HEADER_BYTES: usize = 8192;

/// A whole proxy configuration, validated.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The admin listener.
    #[serde(default)]
    pub admin: Admin,
    /// Limits against bad peers.
    #[serde(default)]
    pub limits: Limits,
    /// Listeners.
    #[serde(default, rename = "listener")]
    pub listeners: Vec<Listener>,
    /// HTTP routes.
    #[serde(default, rename = "route")]
    pub routes: Vec<Route>,
    /// Services by name.
    #[serde(default, rename = "service")]
    pub services: BTreeMap<String, ServiceConfig>,
}

/// `[admin]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// Address to bind. Default `127.0.0.1:9901`.
    #[serde(default = "default_admin_bind")]
    pub bind: SocketAddr,
    /// Bearer token every admin request must carry (compared in constant time). Default none:
    /// then `bind` must be a loopback address unless `allow_unauthenticated` is set, since
    /// the admin API switches strategies and shows the fleet.
    #[serde(default)]
    pub token: Option<String>,
    /// Serve the admin API without a token on a non-loopback address. Default false.
    #[serde(default)]
    pub allow_unauthenticated: bool,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            bind: default_admin_bind(),
            token: None,
            allow_unauthenticated: false,
        }
    }
}

/// `[limits]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Request head size limit, bytes. Default 65 536.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// Request header count limit. Default 100.
    #[serde(default = "default_max_headers")]
    pub max_headers: usize,
    /// Time a client has to send its request head, ms. Default 10 000.
    #[serde(default = "default_header_read_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// Idle limit of a client connection (no request in flight, none starting), ms. Default
    /// 60 000.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Limit on an HTTP/2 stream with no byte either way (then reset with `CANCEL`, noticed
    /// within a quarter of the limit more), and on a
    /// client connection hyper serves with a request in flight but no byte either way (then
    /// closed), ms. Default 300 000 (Envoy's `stream_idle_timeout`).
    #[serde(default = "default_stream_idle_timeout_ms")]
    pub stream_idle_timeout_ms: u64,
    /// Requests one client connection may make, HTTP/1.1 and HTTP/2 alike; 0 = no limit.
    /// Default 1 000 (nginx's `keepalive_requests`).
    #[serde(default = "default_max_requests_per_connection")]
    pub max_requests_per_connection: u64,
    /// Streams an HTTP/2 client may reset before their answer started, once they are also at
    /// least half of the streams it opened, before its connection gets `GOAWAY
    /// ENHANCE_YOUR_CALM`; 0 = no limit. Default 100 (Envoy's premature-reset rule).
    #[serde(default = "default_max_premature_resets")]
    pub max_premature_resets: u64,
    /// Client connections at once. Default 10 000.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Bound on draining at shutdown, ms. Default 10 000.
    #[serde(default = "default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// Protocols an HTTP/1.1 upgrade may switch to through the proxy. Default `["websocket"]`.
    #[serde(default = "default_upgrade_protocols")]
    pub upgrade_protocols: Vec<String>,
    /// Idle limit of an upgraded connection (no byte either way), ms. Default 300 000.
    #[serde(default = "default_tunnel_idle_ms")]
    pub tunnel_idle_timeout_ms: u64,
    /// Idle limit of a TCP listener's connection (no byte either way), ms. Default 600 000
    /// (nginx's stream `proxy_timeout`).
    #[serde(default = "default_tcp_idle_ms")]
    pub tcp_idle_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: default_max_header_bytes(),
            max_headers: default_max_headers(),
            header_read_timeout_ms: default_header_read_timeout_ms(),
            idle_timeout_ms: default_idle_timeout_ms(),
            stream_idle_timeout_ms: default_stream_idle_timeout_ms(),
            max_requests_per_connection: default_max_requests_per_connection(),
            max_premature_resets: default_max_premature_resets(),
            max_connections: default_max_connections(),
            drain_timeout_ms: default_drain_timeout_ms(),
            upgrade_protocols: default_upgrade_protocols(),
            tunnel_idle_timeout_ms: default_tunnel_idle_ms(),
            tcp_idle_timeout_ms: default_tcp_idle_ms(),
        }
    }
}

/// What a listener speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 and HTTP/2 cleartext (prior knowledge), routed by `[[route]]`.
    #[default]
    Http,
    /// Plain TCP to one service.
    Tcp,
}

/// `[[listener]]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    /// Address to bind (port 0 picks a free port).
    pub bind: SocketAddr,
    /// Protocol. Default `http`.
    #[serde(default)]
    pub protocol: Protocol,
    /// The service of a `tcp` listener.
    #[serde(default)]
    pub service: Option<String>,
}

/// `[[route]]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Host to match (without port). Default: any.
    #[serde(default)]
    pub host: Option<String>,
    /// Path prefix to match. Default `/`.
    #[serde(default = "default_prefix")]
    pub path_prefix: String,
    /// Service to forward to.
    pub service: String,
    /// Upstream timeout of the whole exchange, retries included, ms. Default 15 000.
    #[serde(default = "default_route_timeout_ms")]
    pub timeout_ms: u64,
    /// Each attempt's timeout inside `timeout_ms`, ms. Default none (only `timeout_ms`).
    #[serde(default)]
    pub per_try_timeout_ms: Option<u64>,
    /// Hash key for hash strategies, as `KeyExtractor` text. Default none.
    #[serde(default)]
    pub hash_key: Option<String>,
    /// Hedge idempotent requests: `p95` (a quantile of the service's recent latencies) or a
    /// delay (`20ms`). Default none.
    #[serde(default)]
    pub hedge: Option<String>,
}

impl Route {
    /// `timeout_ms` when the file does not set it: 15 s.
    pub fn default_timeout_ms() -> u64 {
        default_route_timeout_ms()
    }
}

/// `[service.NAME]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Static endpoints, `ADDRESS[=WEIGHT]`.
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
    /// A watched endpoint file.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// A ZooKeeper registry.
    #[serde(default)]
    pub zookeeper: Option<ZooKeeper>,
    /// An xDS control plane (`xds = { server = "127.0.0.1:18000", cluster = "NAME" }`).
    #[serde(default)]
    pub xds: Option<XdsSourceConfig>,
    /// Strategy name. Default `round-robin`.
    #[serde(default = "default_strategy")]
    pub strategy: String,
    /// Strategy parameters. Default none.
    #[serde(default)]
    pub params: BTreeMap<String, toml::Value>,
    /// Retries after the first attempt. Default 2, at most [`MAX_RETRIES`].
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Retry budget, percent of requests. Default 20.
    #[serde(default = "default_budget_percent")]
    pub retry_budget_percent: f32,
    /// Retries always allowed per second. Default 10.
    #[serde(default = "default_budget_floor")]
    pub retry_budget_min_per_sec: u32,
    /// Upstream connect timeout, ms. Default 1 000.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long an idle upstream keep-alive connection stays pooled, ms. Default 50 000 (below
    /// the 60–75 s after which upstream servers commonly close, so a reuse never races their
    /// close).
    #[serde(default = "default_upstream_idle_ms")]
    pub upstream_idle_timeout_ms: u64,
    /// Idle upstream HTTP/1.1 connections kept per endpoint and worker thread (each engine's
    /// pool; more are closed when given back). Default 256; at least 1.
    #[serde(default = "default_upstream_max_idle")]
    pub upstream_max_idle: usize,
    /// HTTP/2 cleartext to upstreams. Default false.
    #[serde(default)]
    pub h2c: bool,
    /// The headers the client is appended to. Default both.
    #[serde(default)]
    pub forwarded_headers: ForwardedHeaders,
    /// A request header of whole milliseconds carrying the caller's deadline
    /// (`x-request-timeout`), honoured and rewritten to the time left on each attempt.
    /// `grpc-timeout` is honoured always. Default none.
    #[serde(default)]
    pub deadline_header: Option<String>,
    /// ORCA's out-of-band load reports: each endpoint is asked on a gRPC stream
    /// (`OpenRcaService`) for a report every this many milliseconds. Needs `h2c`. Default
    /// none (reports come only in answers).
    #[serde(default)]
    pub orca_oob_ms: Option<u64>,
    /// Pick-time filters.
    #[serde(default)]
    pub availability: AvailabilityConfig,
    /// Passive outlier detection.
    #[serde(default)]
    pub outlier_detection: OutlierDetection,
    /// Mass-removal protection. Default on.
    #[serde(default)]
    pub removal_protection: RemovalProtectionConfig,
    /// Active health check. Default none.
    #[serde(default)]
    pub health_check: Option<HealthCheck>,
    /// Tag routing (Dubbo's `dubbo.tag`): where requests carry their tag.
    #[serde(default)]
    pub tags: TagConfig,
    /// A sampled trace of the calls (`[service.NAME.trace]`). Default none.
    #[serde(default)]
    pub trace: Option<TraceTable>,
    /// The zone this proxy runs in, for this service: prefer the endpoints there and spill to
    /// the others when they are degraded or overloaded (zone preference, lbkit-strategy's
    /// `ZoneAware`, around the strategy; strategy switches keep it). Default none.
    #[serde(default)]
    pub zone: Option<String>,
    /// Which endpoints may serve a request (`[service.NAME.stages]`: subsets, localities,
    /// aperture, overprovisioning; `lbkit_discovery::stages`). Default none; priority tiers
    /// follow the endpoints' `priority` regardless.
    #[serde(default)]
    pub stages: lbkit_discovery::stages::StagesConfig,
}

/// `forwarded_headers = [..]`: the headers the proxy appends the client to, on the way to the
/// upstream (`X-Forwarded-For`, `Forwarded` of RFC 7239). A header left out is passed on as the
/// client sent it, as HAProxy without `option forwardfor` and nginx without
/// `proxy_set_header` do.
///
/// ```
/// # use lbkit_proxy::config::ForwardedHeaders;
/// let only_xff: ForwardedHeaders = toml::Value::Array(vec!["x-forwarded-for".into()])
///     .try_into()
///     .unwrap();
/// assert!(only_xff.x_forwarded_for && !only_xff.forwarded);
/// assert_eq!(ForwardedHeaders::default(), ForwardedHeaders::BOTH);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardedHeaders {
    /// `X-Forwarded-For: CLIENT_IP` appended.
    pub x_forwarded_for: bool,
    /// `Forwarded: for=CLIENT_IP;proto=http;host="HOST"` appended.
    pub forwarded: bool,
}

impl ForwardedHeaders {
    /// Both headers (the default).
    pub const BOTH: ForwardedHeaders = ForwardedHeaders {
        x_forwarded_for: true,
        forwarded: true,
    };
    /// Neither.
    pub const NONE: ForwardedHeaders = ForwardedHeaders {
        x_forwarded_for: false,
        forwarded: false,
    };
}

impl Default for ForwardedHeaders {
    fn default() -> Self {
        ForwardedHeaders::BOTH
    }
}

impl<'de> Deserialize<'de> for ForwardedHeaders {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut which = ForwardedHeaders::NONE;
        for name in Vec::<String>::deserialize(d)? {
            match name.to_ascii_lowercase().as_str() {
                "x-forwarded-for" => which.x_forwarded_for = true,
                "forwarded" => which.forwarded = true,
                _ => {
                    return Err(serde::de::Error::custom(format!(
                        "forwarded_headers: unknown header {name:?} \
                         (known: \"x-forwarded-for\", \"forwarded\")"
                    )))
                }
            }
        }
        Ok(which)
    }
}

/// `[service.NAME.trace]`: record a sampled trace of the service's calls (lbkit-trace).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceTable {
    /// The trace file (relative to the configuration file).
    pub path: PathBuf,
    /// Share of requests recorded, in `(0, 1]`. Default 0.01.
    #[serde(default = "default_sample_rate")]
    pub sample_rate: f64,
    /// Most bytes over the trace's two files. Default 64 MiB.
    #[serde(default = "default_trace_bytes")]
    pub max_bytes: u64,
}

impl TraceTable {
    /// The recorder's configuration.
    pub fn config(&self) -> lbkit_trace::TraceConfig {
        lbkit_trace::TraceConfig::new(&self.path)
            .with_sample_rate(self.sample_rate)
            .with_max_bytes(self.max_bytes)
    }
}

fn default_sample_rate() -> f64 {
    0.01
}

fn default_trace_bytes() -> u64 {
    64 << 20
}

/// `tags = { .. }`: where a request's routing tag is read (see `lbkit_core::route`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagConfig {
    /// The header (gRPC metadata key) with the tag. Default `dubbo.tag`.
    #[serde(default = "default_tag_header")]
    pub header: String,
    /// The header that forces it (`true`: no fall back to untagged providers). Default
    /// `dubbo.force.tag`.
    #[serde(default = "default_force_tag_header")]
    pub force_header: String,
    /// The tag of requests without one. Default none.
    #[serde(default)]
    pub default: Option<String>,
    /// Whether the default tag is forced. Default false.
    #[serde(default)]
    pub force: bool,
}

impl Default for TagConfig {
    fn default() -> Self {
        TagConfig {
            header: default_tag_header(),
            force_header: default_force_tag_header(),
            default: None,
            force: false,
        }
    }
}

impl TagConfig {
    /// The reader the request paths use.
    pub fn headers(&self) -> lbkit_strategy::TagHeaders {
        lbkit_strategy::TagHeaders::new(&self.header, &self.force_header)
            .with_default(self.default.clone(), self.force)
    }
}

/// `zookeeper = { .. }`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZooKeeper {
    /// Servers, `host:port[,host:port]`.
    pub zk: String,
    /// Service (Dubbo interface) name.
    pub interface: String,
    /// Root node. Default `dubbo`.
    #[serde(default = "default_zk_root")]
    pub root: String,
    /// `dubbo` (default) or `plain`.
    #[serde(default = "default_zk_layout")]
    pub layout: String,
    /// Registry cache file: the last known providers, written after each change and served at
    /// start-up while ZooKeeper cannot be reached. Default none.
    #[serde(default)]
    pub cache: Option<PathBuf>,
    /// `auto` (default: persistent recursive watches, one-shot ones on servers older than
    /// 3.6), `persistent` or `one-shot`.
    #[serde(default = "default_zk_watch")]
    pub watch: String,
    /// Obey the service's override rules (Dubbo layout: `configurators`, as dubbo-admin writes
    /// them; `lbkit_discovery::governance`). Default true.
    #[serde(default = "default_true")]
    pub rules: bool,
    /// The consumer's Dubbo application, for rules scoped to one. Default none.
    #[serde(default)]
    pub application: Option<String>,
    /// Register the proxy as a consumer of the interface, as Dubbo's consumers do: an
    /// ephemeral `consumer://` URL under `/<root>/<interface>/consumers` (the plain layout:
    /// `/<root>/<interface>.consumers`), on a ZooKeeper session of its own per service and
    /// gone with it. dubbo-admin lists it. A service whose aperture has no
    /// `client_index`/`client_count` numbers its clients from these nodes (and must
    /// register); other services' nodes are not counted. Default: true in the Dubbo layout,
    /// false in the plain one.
    #[serde(default)]
    pub register: Option<bool>,
}

/// `xds = { .. }`: one cluster of an xDS control plane, over ADS (CDS, then EDS;
/// `lbkit_discovery::xds`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XdsSourceConfig {
    /// The control plane, `HOST:PORT` (plain-text gRPC).
    pub server: String,
    /// The cluster followed.
    pub cluster: String,
    /// The node id sent. Default `lbkit`.
    #[serde(default)]
    pub node: Option<String>,
    /// Cache file: the last set, written after each change and served at start-up while the
    /// control plane cannot be reached. Default none.
    #[serde(default)]
    pub cache: Option<PathBuf>,
}

/// `availability = { .. }`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AvailabilityConfig {
    /// Most calls in flight per endpoint; 0 = unlimited (default).
    #[serde(default)]
    pub max_in_flight: u32,
    /// Ribbon's circuit breaker. Default false (outlier detection does that job here).
    #[serde(default)]
    pub circuit_breaker: bool,
    /// Pass over an endpoint that pushed back (429, 503 with `Retry-After`,
    /// `grpc-retry-pushback-ms`) until the time it asked for, at most 60 s. Default true.
    #[serde(default = "yes")]
    pub pushback: bool,
}

impl Default for AvailabilityConfig {
    fn default() -> Self {
        AvailabilityConfig {
            max_in_flight: 0,
            circuit_breaker: false,
            pushback: true,
        }
    }
}

/// `outlier_detection = { .. }`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierDetection {
    /// On or off. Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Tick period, ms. Default 10 000.
    #[serde(default = "default_outlier_interval_ms")]
    pub interval_ms: u64,
    /// Consecutive failures that eject. Default 5.
    #[serde(default = "default_consecutive")]
    pub consecutive_failures: u32,
    /// First ejection time, ms. Default 30 000.
    #[serde(default = "default_base_ejection_ms")]
    pub base_ejection_ms: u64,
    /// Most endpoints ejected at once, percent. Default 10 (at least one).
    #[serde(default = "default_max_ejection_percent")]
    pub max_ejection_percent: u32,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            enabled: true,
            interval_ms: default_outlier_interval_ms(),
            consecutive_failures: default_consecutive(),
            base_ejection_ms: default_base_ejection_ms(),
            max_ejection_percent: default_max_ejection_percent(),
        }
    }
}

/// `removal_protection = { .. }`: mass-removal protection of the service's endpoint set
/// (`lbkit_discovery::RemovalProtection`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemovalProtectionConfig {
    /// On or off. Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A set that shrinks by more than this share of its largest size within `window_ms` has
    /// its removals held. Default 0.5; above 0, at most 1.
    #[serde(default = "default_removal_share")]
    pub max_share: f64,
    /// How far back the set's largest size counts, ms. Default 10 000.
    #[serde(default = "default_removal_window_ms")]
    pub window_ms: u64,
    /// Longest a held endpoint is served when neither its health check nor outlier detection
    /// confirms it gone, ms. Default 120 000.
    #[serde(default = "default_removal_confirm_ms")]
    pub confirm_ms: u64,
}

impl Default for RemovalProtectionConfig {
    fn default() -> Self {
        RemovalProtectionConfig {
            enabled: true,
            max_share: default_removal_share(),
            window_ms: default_removal_window_ms(),
            confirm_ms: default_removal_confirm_ms(),
        }
    }
}

/// How an active health check probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckKind {
    /// HTTP GET.
    Http,
    /// TCP connect.
    Tcp,
}

/// `health_check = { .. }`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// `http` or `tcp`.
    pub kind: CheckKind,
    /// HTTP path. Default `/`.
    #[serde(default = "default_prefix")]
    pub path: String,
    /// Expected HTTP status. Default 200.
    #[serde(default = "default_expect_status")]
    pub expect_status: u16,
    /// Probe period, ms. Default 5 000.
    #[serde(default = "default_check_interval_ms")]
    pub interval_ms: u64,
    /// Probe timeout, ms. Default 1 000.
    #[serde(default = "default_connect_timeout_ms")]
    pub timeout_ms: u64,
    /// Successes in a row that mark an endpoint up. Default 2.
    #[serde(default = "default_rise")]
    pub rise: u32,
    /// Failures in a row that mark an endpoint down. Default 3.
    #[serde(default = "default_fall")]
    pub fall: u32,
}

mod defaults;
pub(crate) use defaults::default_route_timeout_ms;
mod load;

use defaults::*;
pub use load::{from_toml, params_from, read};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ConfigError;
    use std::path::Path;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("proxy.toml"))
    }

    const OK: &str = r#"
[[listener]]
bind = "127.0.0.1:0"
[[route]]
service = "api"
hash_key = "header:x-user"
[service.api]
endpoints = ["127.0.0.1:8081=100", "127.0.0.1:8082"]
strategy = "p2c-ewma"
"#;

    #[test]
    fn a_good_file_parses_with_defaults() {
        let c = parse(OK).unwrap();
        assert_eq!(c.admin.bind, default_admin_bind());
        assert_eq!(c.routes[0].path_prefix, "/");
        assert_eq!(c.services["api"].retries, 2);
        assert!(c.services["api"].outlier_detection.enabled);
        assert_eq!(c.services["api"].upstream_idle_timeout_ms, 50_000);
        assert_eq!(c.services["api"].connect_timeout_ms, 1_000);
    }

    #[test]
    fn tag_headers_default_to_dubbos_and_bad_names_are_rejected() {
        let c = parse(OK).unwrap();
        let tags = &c.services["api"].tags;
        assert_eq!(
            (tags.header.as_str(), tags.force_header.as_str()),
            ("dubbo.tag", "dubbo.force.tag")
        );
        let text = OK.replace(
            "strategy = ",
            "tags = { header = \"bad header\" }\nstrategy = ",
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(
            e.contains("service.api.tags.header") && e.contains("not a header name"),
            "{e}"
        );
        let text = OK.replace("strategy = ", "tags = { colour = \"x\" }\nstrategy = ");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn zero_timeouts_are_rejected() {
        for field in ["connect_timeout_ms", "upstream_idle_timeout_ms"] {
            let text = OK.replace("strategy = ", &format!("{field} = 0\nstrategy = "));
            let e = parse(&text).unwrap_err().to_string();
            assert!(
                e.contains(&format!("service.api.{field}: must be > 0")),
                "{e}"
            );
        }
        let text = OK.replace("strategy = ", "upstream_idle_timeout_ms = 200\nstrategy = ");
        assert_eq!(
            parse(&text).unwrap().services["api"].upstream_idle_timeout_ms,
            200
        );
    }

    #[test]
    fn forwarded_headers_default_to_both_and_unknown_names_are_rejected() {
        let with = |line: &str| parse(&OK.replace("strategy = ", &format!("{line}\nstrategy = ")));
        let services = |line: &str| with(line).unwrap().services;
        assert_eq!(
            services("")["api"].forwarded_headers,
            ForwardedHeaders::BOTH
        );
        assert_eq!(
            services("forwarded_headers = []")["api"].forwarded_headers,
            ForwardedHeaders::NONE
        );
        let only = services("forwarded_headers = [\"X-Forwarded-For\"]")["api"].forwarded_headers;
        assert!(only.x_forwarded_for && !only.forwarded);
        let e = with("forwarded_headers = [\"x-real-ip\"]")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("proxy.toml: line 9: forwarded_headers: unknown header \"x-real-ip\""),
            "{e}"
        );
    }

    #[test]
    fn upgrade_limits_are_checked() {
        let with = |lines: &str| parse(&format!("[limits]\n{lines}\n{OK}"));
        let c = with("").unwrap();
        assert_eq!(c.limits.upgrade_protocols, ["websocket"]);
        assert_eq!(c.limits.tunnel_idle_timeout_ms, 300_000);
        let c = with("upgrade_protocols = [\"websocket\", \"SPDY\"]").unwrap();
        assert_eq!(c.limits.upgrade_protocols, ["websocket", "SPDY"]);
        for bad in ["\"H2C\"", "\"web socket\"", "\"websocket/13\"", "\"\""] {
            let e = with(&format!("upgrade_protocols = [{bad}]"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("limits.upgrade_protocols"), "{e}");
        }
        let e = with("tunnel_idle_timeout_ms = 0").unwrap_err().to_string();
        assert!(
            e.contains("limits.tunnel_idle_timeout_ms: must be > 0"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let e = parse(&OK.replace("p2c-ewma", "nope"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("proxy.toml: service.api.strategy:"), "{e}");
        let e = parse(&OK.replace("hash_key", "bogus"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("proxy.toml") && e.contains("bogus"), "{e}");
        let e = parse(&OK.replace("header:x-user", "nonsense:1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("route[0].hash_key"), "{e}");
        let e = parse(&OK.replace("service = \"api\"", "service = \"web\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("route[0].service"), "{e}");
    }
}
