//! lbkit-discovery's xDS source against `lbkit xds` (the two agree: a file's endpoints arrive
//! with their weights and zones, and follow the file), and against a scripted control plane
//! that misbehaves: malformed or inconsistent resources are NACKed with their reason and the
//! last good set stays; a response above the size limit and a control plane that goes away
//! cost a reconnection, never the set; the cache file serves a restart while the control
//! plane is down.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig,
};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    address, config_source, socket_address, Address, AggregatedConfigSource, ConfigSource,
    SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use envoy_types::util::pack_any;
use futures_util::StreamExt;
use lbkit_core::{EndpointSpec, Update};
use lbkit_discovery::source::UpdateStream;
use lbkit_discovery::xds::{XdsSource, CLUSTER, ENDPOINTS};
use lbkit_discovery::DiscoveryError;
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(10);

type Pushed = mpsc::UnboundedSender<Result<DiscoveryResponse, Status>>;

/// One stream of the scripted control plane: the client's requests, and where responses go.
struct Ends {
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    push: Pushed,
}

impl Ends {
    async fn next(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(WAIT, self.requests.recv())
            .await
            .expect("a request in time")
            .expect("the stream is open")
    }

    /// The next request of `type_url` for which `pred` holds (others on the way are skipped).
    async fn until(
        &mut self,
        type_url: &str,
        pred: impl Fn(&DiscoveryRequest) -> bool,
    ) -> DiscoveryRequest {
        loop {
            let r = self.next_of(type_url).await;
            if pred(&r) {
                return r;
            }
        }
    }

    /// The next request of `type_url` (requests of other types on the way are skipped).
    async fn next_of(&mut self, type_url: &str) -> DiscoveryRequest {
        loop {
            let r = self.next().await;
            if r.type_url == type_url {
                return r;
            }
        }
    }

    fn send(&self, type_url: &str, version: &str, nonce: &str, resources: Vec<Any>) {
        let response = DiscoveryResponse {
            version_info: version.to_owned(),
            resources,
            type_url: type_url.to_owned(),
            nonce: nonce.to_owned(),
            ..DiscoveryResponse::default()
        };
        self.push.send(Ok(response)).expect("the stream is open");
    }
}

/// A control plane that hands each stream to the test.
struct Scripted {
    streams: mpsc::UnboundedSender<Ends>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Scripted {
    type StreamAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (req_tx, requests) = mpsc::unbounded_channel();
        let (push, rx) = mpsc::unbounded_channel();
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            while let Ok(Some(r)) = inbound.message().await {
                if req_tx.send(r).is_err() {
                    break;
                }
            }
        });
        let _ = self.streams.send(Ends { requests, push });
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// The scripted control plane on a loopback port: its address, its streams, and its task.
async fn scripted() -> (
    SocketAddr,
    mpsc::UnboundedReceiver<Ends>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("bound");
    let (streams, rx) = mpsc::unbounded_channel();
    let service = lbkit_xds::AdsServer::new(Scripted { streams }, 4 << 20);
    let task = tokio::spawn(lbkit_xds::serve_ads(listener, service));
    (addr, rx, task)
}

fn eds_cluster(name: &str, lb_policy: i32) -> Any {
    pack_any(Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ConfigSource {
                config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                    AggregatedConfigSource {},
                )),
                ..ConfigSource::default()
            }),
            service_name: String::new(),
        }),
        lb_policy,
        ..Cluster::default()
    })
}

/// An assignment for `cluster`: `(ip, port, weight)` in one locality of zone `zone`.
fn assignment(cluster: &str, zone: &str, endpoints: &[(&str, u32, u32)]) -> Any {
    let lb_endpoints = endpoints
        .iter()
        .map(|&(ip, port, weight)| LbEndpoint {
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: ip.to_owned(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
                        ..SocketAddress::default()
                    })),
                }),
                ..Endpoint::default()
            })),
            load_balancing_weight: Some(UInt32Value { value: weight }),
            ..LbEndpoint::default()
        })
        .collect();
    pack_any(ClusterLoadAssignment {
        cluster_name: cluster.to_owned(),
        endpoints: vec![LocalityLbEndpoints {
            locality: Some(envoy_types::pb::envoy::config::core::v3::Locality {
                zone: zone.to_owned(),
                ..Default::default()
            }),
            lb_endpoints,
            ..LocalityLbEndpoints::default()
        }],
        ..ClusterLoadAssignment::default()
    })
}

async fn next_update(updates: &mut UpdateStream) -> Result<Update, DiscoveryError> {
    tokio::time::timeout(WAIT, updates.next())
        .await
        .expect("an update in time")
        .expect("the source goes on")
}

/// The next whole set (errors on the way are skipped).
async fn next_set(updates: &mut UpdateStream) -> Vec<EndpointSpec> {
    loop {
        if let Ok(Update::Reset(specs)) = next_update(updates).await {
            return specs;
        }
    }
}

/// The set's addresses and weights, in address order.
fn addresses(specs: &[EndpointSpec]) -> Vec<(String, u32)> {
    let mut out: Vec<_> = specs
        .iter()
        .map(|s| (s.address.clone(), s.weight))
        .collect();
    out.sort();
    out
}

/// Subscribe a new source's first stream to cluster `web` and give it one good set.
async fn good_start(ends: &mut Ends, updates: &mut UpdateStream) {
    let cds = ends.next_of(CLUSTER).await;
    assert_eq!(cds.resource_names, ["web"]);
    ends.send(CLUSTER, "c1", "n1", vec![eds_cluster("web", 0)]);
    let eds = ends.next_of(ENDPOINTS).await;
    assert_eq!(eds.resource_names, ["web"]);
    ends.send(
        ENDPOINTS,
        "e1",
        "n2",
        vec![assignment("web", "eu-1", &[("10.0.0.1", 80, 5)])],
    );
    let set = next_set(updates).await;
    assert_eq!(addresses(&set), [("10.0.0.1:80".to_owned(), 5)]);
    assert_eq!(set[0].zone.as_deref(), Some("eu-1"));
}

/// Send `bad` and check the NACK: the last accepted version, the reason, the error item.
async fn expect_nack(
    ends: &mut Ends,
    updates: &mut UpdateStream,
    (type_url, nonce, bad): Bad,
    (accepted, reason): (&str, &str),
) {
    ends.send(type_url, "bad", nonce, vec![bad]);
    let nack = loop {
        let r = ends.next_of(type_url).await;
        if r.response_nonce == nonce {
            break r;
        }
    };
    assert_eq!(
        nack.version_info, accepted,
        "a NACK carries the version kept"
    );
    let detail = nack.error_detail.expect("a NACK").message;
    assert!(detail.contains(reason), "{detail:?} names {reason:?}");
    match next_update(updates).await {
        Err(DiscoveryError::Rejected { reason: r, .. }) => assert_eq!(r, detail),
        other => panic!("a rejection, not {other:?}"),
    }
}

/// A bad response: its type, nonce and resource.
type Bad = (&'static str, &'static str, Any);

/// Resources lbkit cannot use, each with the version its NACK keeps and a part of its reason.
fn bad_resources() -> Vec<(Bad, (&'static str, &'static str))> {
    let eds = |nonce, cla| (ENDPOINTS, nonce, cla);
    vec![
        (
            (CLUSTER, "n3", eds_cluster("web", 99)),
            ("c1", "unknown lb_policy 99"),
        ),
        (
            eds("n4", assignment("other", "", &[("10.0.0.2", 80, 1)])),
            ("e1", "unknown cluster \"other\""),
        ),
        (
            eds("n5", assignment("web", "", &[("10.0.0.2", 80, 0)])),
            ("e1", "weight 0"),
        ),
        (
            eds(
                "n6",
                assignment(
                    "web",
                    "",
                    &[("10.0.0.2", 80, u32::MAX), ("10.0.0.3", 80, 2)],
                ),
            ),
            ("e1", "above 4294967295"),
        ),
        (
            eds("n7", assignment("web", "", &[("10.0.0.2", 0, 1)])),
            ("e1", "no port"),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_resources_are_nacked_and_the_last_good_set_stays() {
    let (addr, mut streams, _server) = scripted().await;
    let (mut updates, status) = XdsSource::new(addr.to_string(), "web")
        .with_retry(Duration::from_millis(10), Duration::from_millis(50))
        .spawn();
    let mut ends = streams.recv().await.expect("a stream");
    good_start(&mut ends, &mut updates).await;
    for (bad, expected) in bad_resources() {
        expect_nack(&mut ends, &mut updates, bad, expected).await;
    }
    let seen = status.get();
    assert_eq!(seen.nacks, 5);
    assert_eq!(seen.versions, ("c1".to_owned(), "e1".to_owned()));

    // 50 MB: above the 16 MiB limit, NACKed with its size; the set is untouched.
    let huge = Any {
        type_url: ENDPOINTS.to_owned(),
        value: vec![0; 50 << 20],
    };
    let big = (ENDPOINTS, "n8", huge);
    expect_nack(
        &mut ends,
        &mut updates,
        big,
        ("e1", "above the limit of 16777216"),
    )
    .await;
    // Above 4 × the limit (80 MB) it is not read: the stream fails, the source reconnects and
    // asks again with the versions it accepted.
    let huger = Any {
        type_url: ENDPOINTS.to_owned(),
        value: vec![0; 80 << 20],
    };
    ends.send(ENDPOINTS, "huge", "n9", vec![huger]);
    match next_update(&mut updates).await {
        Err(DiscoveryError::Xds { reason, .. }) => {
            assert!(reason.contains("stream failed"), "{reason}")
        }
        other => panic!("a failed stream, not {other:?}"),
    }
    let mut ends = tokio::time::timeout(WAIT, streams.recv())
        .await
        .expect("a new stream")
        .expect("open");
    let cds = ends.next_of(CLUSTER).await;
    assert_eq!(cds.version_info, "c1");
    let eds = ends.next_of(ENDPOINTS).await;
    assert_eq!(
        (eds.version_info.as_str(), eds.resource_names.as_slice()),
        ("e1", ["web".to_owned()].as_slice())
    );
    ends.send(
        ENDPOINTS,
        "e2",
        "m1",
        vec![assignment("web", "", &[("10.0.0.4", 80, 7)])],
    );
    let set = addresses(&next_set(&mut updates).await);
    assert_eq!(set, [("10.0.0.4:80".to_owned(), 7)]);
    assert!(status.get().reconnects >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_that_goes_away_costs_no_set_and_the_cache_serves_a_restart() {
    let dir = tempfile::tempdir().expect("a directory");
    let cache = dir.path().join("web.xds-cache.json");
    let (addr, mut streams, server) = scripted().await;
    let (mut updates, status) = XdsSource::new(addr.to_string(), "web")
        .with_cache(&cache)
        .with_retry(Duration::from_millis(10), Duration::from_millis(50))
        .spawn();
    let mut ends = streams.recv().await.expect("a stream");
    good_start(&mut ends, &mut updates).await;
    let mut written = status.clone();
    tokio::time::timeout(WAIT, written.wait_for(|s| s.cache_writes >= 1))
        .await
        .expect("the cache written");

    // The control plane goes: errors only, never a set.
    server.abort();
    drop(ends);
    drop(streams);
    for _ in 0..3 {
        match next_update(&mut updates).await {
            Err(DiscoveryError::Xds { .. }) => {}
            other => panic!("an error, not {other:?}"),
        }
    }
    assert!(!status.get().connected);
    drop(updates);

    // A new process, the control plane still down: the cache file serves.
    let (mut restarted, status) = XdsSource::new(addr.to_string(), "web")
        .with_cache(&cache)
        .with_retry(Duration::from_millis(10), Duration::from_millis(50))
        .spawn();
    let set = next_set(&mut restarted).await;
    assert_eq!(addresses(&set), [("10.0.0.1:80".to_owned(), 5)]);
    assert!(status.get().from_cache);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_follows_lbkit_xds() {
    let dir = tempfile::tempdir().expect("a directory");
    let file = dir.path().join("web.toml");
    let write = |text: &str| {
        let tmp = dir.path().join("web.toml.tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &file).expect("rename");
    };
    write("[[endpoint]]\naddress = \"10.0.0.1:80\"\nweight = 3\nzone = \"eu-1\"\n\n[[endpoint]]\naddress = \"10.0.0.2:80\"\n");
    let text = format!(
        "[xds]\nbind = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n[service.web]\nfile = \"{}\"\n",
        file.display()
    );
    let config = lbkit_xds::XdsConfig::parse(&text, &dir.path().join("xds.toml")).expect("config");
    let running = lbkit_xds::start(config).await.expect("lbkit xds");
    let (mut updates, status) = XdsSource::new(running.ads().to_string(), "web").spawn();
    let set = next_set(&mut updates).await;
    assert_eq!(
        addresses(&set),
        [
            ("10.0.0.1:80".to_owned(), 3),
            ("10.0.0.2:80".to_owned(), 100)
        ]
    );
    let zoned = set
        .iter()
        .find(|s| s.address == "10.0.0.1:80")
        .expect("listed");
    assert_eq!(zoned.zone.as_deref(), Some("eu-1"));
    assert_eq!(status.get().policy.as_deref(), Some("ROUND_ROBIN"));

    write("[[endpoint]]\naddress = \"10.0.0.2:80\"\nweight = 9\n");
    let set = next_set(&mut updates).await;
    assert_eq!(addresses(&set), [("10.0.0.2:80".to_owned(), 9)]);
    assert_eq!(status.get().nacks, 0);
}

/// A client of `lbkit xds` that sends a request above `[xds] max_request_bytes` loses its own
/// stream; the server goes on serving the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_fails_its_own_stream_only() {
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    let dir = tempfile::tempdir().expect("a directory");
    let text =
        "[xds]\nbind = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nmax_request_bytes = 65536\n\n\
                [service.web]\nendpoints = [\"10.0.0.1:80\"]\n";
    let config = lbkit_xds::XdsConfig::parse(text, &dir.path().join("xds.toml")).expect("config");
    let running = lbkit_xds::start(config).await.expect("lbkit xds");
    let uri = format!("http://{}", running.ads());
    let mut client = AggregatedDiscoveryServiceClient::connect(uri)
        .await
        .expect("connect");
    let huge = DiscoveryRequest {
        type_url: CLUSTER.to_owned(),
        resource_names: vec!["x".repeat(100_000)],
        ..DiscoveryRequest::default()
    };
    let requests = futures_util::stream::iter([huge]).chain(futures_util::stream::pending());
    let mut responses = client
        .stream_aggregated_resources(requests)
        .await
        .expect("a stream")
        .into_inner();
    let ended = tokio::time::timeout(WAIT, responses.message())
        .await
        .expect("in time");
    let status = ended.expect_err("the oversized request fails the stream");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");

    let (mut updates, _) = XdsSource::new(running.ads().to_string(), "web").spawn();
    assert_eq!(
        addresses(&next_set(&mut updates).await),
        [("10.0.0.1:80".to_owned(), 100)]
    );
}

/// A service's `health_check` runs in `lbkit xds` as in the proxy: an endpoint that fails it
/// is served as UNHEALTHY (the source reads it back as unhealthy), the others as healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_health_check_reaches_the_clients_as_unhealthy() {
    let dir = tempfile::tempdir().expect("a directory");
    let live = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let (up, down) = (
        live.local_addr().expect("bound"),
        lbkit_testkit::refused_addr(),
    );
    let text = format!(
        "[xds]\nbind = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n[service.web]\n\
         endpoints = [\"{up}\", \"{down}\"]\n\
         health_check = {{ kind = \"tcp\", interval_ms = 50, timeout_ms = 200, rise = 1, fall = 1 }}\n"
    );
    let config = lbkit_xds::XdsConfig::parse(&text, &dir.path().join("xds.toml")).expect("config");
    let running = lbkit_xds::start(config).await.expect("lbkit xds");
    let (mut updates, _) = XdsSource::new(running.ads().to_string(), "web").spawn();
    loop {
        let set = next_set(&mut updates).await;
        let health = |addr: SocketAddr| {
            set.iter()
                .find(|s| s.address == addr.to_string())
                .map(|s| s.healthy)
        };
        if health(down) == Some(false) {
            assert_eq!(health(up), Some(true));
            break;
        }
    }
    drop(live);
}

/// A cluster whose endpoints move: to another EDS name (an assignment for the old one still in
/// flight is no error), then inline (the EDS subscription dropped), then the cluster gone from
/// CDS (the last set stays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_endpoints_move_is_followed() {
    let (addr, mut streams, _server) = scripted().await;
    let (mut updates, status) = XdsSource::new(addr.to_string(), "web").spawn();
    let mut ends = streams.recv().await.expect("a stream");
    good_start(&mut ends, &mut updates).await;

    let mut renamed = Cluster::decode(&*eds_cluster("web", 0).value).expect("decodes");
    if let Some(eds) = renamed.eds_cluster_config.as_mut() {
        eds.service_name = "web-v2".to_owned();
    }
    ends.send(CLUSTER, "c2", "r1", vec![pack_any(renamed)]);
    let eds = ends
        .until(ENDPOINTS, |r| {
            r.response_nonce != "n2" || !r.resource_names.eq(&["web"])
        })
        .await;
    assert_eq!(eds.resource_names, ["web-v2"]);
    assert_eq!(
        eds.response_nonce, "n2",
        "the latest EDS nonce of the stream"
    );
    ends.send(
        ENDPOINTS,
        "e2",
        "r2",
        vec![assignment("web", "", &[("10.0.0.8", 80, 1)])],
    );
    let ack = ends.next_of(ENDPOINTS).await;
    assert!(
        ack.error_detail.is_none(),
        "the old name's assignment is passed over: {ack:?}"
    );
    ends.send(
        ENDPOINTS,
        "e3",
        "r3",
        vec![assignment("web-v2", "", &[("10.0.0.9", 80, 4)])],
    );
    assert_eq!(
        addresses(&next_set(&mut updates).await),
        [("10.0.0.9:80".to_owned(), 4)]
    );

    let inline = Cluster {
        name: "web".to_owned(),
        load_assignment: Some(
            ClusterLoadAssignment::decode(&*assignment("web", "", &[("10.0.0.10", 80, 2)]).value)
                .expect("decodes"),
        ),
        ..Cluster::default()
    };
    ends.send(CLUSTER, "c3", "r4", vec![pack_any(inline)]);
    assert_eq!(
        addresses(&next_set(&mut updates).await),
        [("10.0.0.10:80".to_owned(), 2)]
    );
    // EDS unsubscribed (on the stream's latest EDS nonce).
    let dropped = ends.until(ENDPOINTS, |r| r.resource_names.is_empty()).await;
    assert_eq!(dropped.response_nonce, "r3");

    ends.send(CLUSTER, "c4", "r5", vec![eds_cluster("other", 0)]);
    let ack = ends.until(CLUSTER, |r| r.response_nonce == "r5").await;
    assert_eq!(
        (ack.response_nonce.as_str(), ack.error_detail.is_none()),
        ("r5", true)
    );
    assert_eq!(status.get().endpoints, 1, "the last set stays");
    assert_eq!(status.get().nacks, 0);
}
