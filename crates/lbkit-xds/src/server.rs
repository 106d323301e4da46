//! The Aggregated Discovery Service over gRPC (tonic): one task per stream runs a
//! [`Session`] (state of the world) or a [`DeltaSession`] (incremental) against the [`Cache`],
//! and the counters `/metrics` shows.

use std::pin::Pin;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::cache::{Cache, Kind, State};
use crate::delta::DeltaSession;
use crate::session::{Reply, Session};
use crate::wire::AdsServer;

/// Labels of the per-type counters: `type` = `lds`, `cds` or `eds`.
type TypeLabel = Vec<(&'static str, &'static str)>;

/// What the server counts (served at `/metrics`).
#[derive(Debug)]
pub struct Metrics {
    /// Streams open now.
    pub clients: Gauge,
    /// Responses sent, by type.
    pub pushes: Family<TypeLabel, Counter>,
    /// NACKs received, by type.
    pub nacks: Family<TypeLabel, Counter>,
    /// Bytes of resources sent, by type (what a change costs on the wire).
    pub pushed_bytes: Family<TypeLabel, Counter>,
    /// Seconds from a change of the cache to its response being handed to a stream.
    pub push_latency: Histogram,
    /// Endpoints left out of their assignment (not `IP:PORT`), over every service.
    pub skipped_endpoints: Gauge<i64, AtomicI64>,
}

impl Default for Metrics {
    fn default() -> Self {
        let buckets = [
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
        ];
        Metrics {
            clients: Gauge::default(),
            pushes: Family::default(),
            nacks: Family::default(),
            pushed_bytes: Family::default(),
            push_latency: Histogram::new(buckets),
            skipped_endpoints: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Register every metric, prefixed `lbkit_xds_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("lbkit_xds");
        r.register("clients", "ADS streams open", self.clients.clone());
        r.register("pushes", "Responses sent, by type", self.pushes.clone());
        r.register("nacks", "NACKs received, by type", self.nacks.clone());
        r.register(
            "pushed_bytes",
            "Bytes of resources sent, by type",
            self.pushed_bytes.clone(),
        );
        r.register(
            "push_latency_seconds",
            "From a change of the served resources to its response being sent",
            self.push_latency.clone(),
        );
        r.register(
            "skipped_endpoints",
            "Endpoints left out of their assignment: not IP:PORT",
            self.skipped_endpoints.clone(),
        );
    }

    fn label(kind: Kind) -> TypeLabel {
        vec![("type", kind.label())]
    }
}

/// The ADS service: every stream follows `cache`.
#[derive(Clone, Debug)]
pub struct Ads {
    cache: Cache,
    metrics: Arc<Metrics>,
}

impl Ads {
    /// A service over `cache`, counting into `metrics`.
    pub fn new(cache: Cache, metrics: Arc<Metrics>) -> Self {
        Ads { cache, metrics }
    }

    /// As a gRPC service, accepting requests of up to `max_request` bytes.
    pub fn into_service(self, max_request: usize) -> AdsServer<Ads> {
        AdsServer::new(self, max_request)
    }
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

impl Ads {
    /// Run one stream of protocol `P` in a task of its own; its responses.
    fn open<P: Protocol>(
        &self,
        request: Request<Streaming<P::Request>>,
    ) -> Pin<Box<dyn Stream<Item = Result<P::Response, Status>> + Send>> {
        let peer = request
            .remote_addr()
            .map_or_else(|| "-".to_owned(), |a| a.to_string());
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let stream = StreamTask::<P> {
            peer,
            states: self.cache.subscribe(),
            clock: self.cache.clock().clone(),
            metrics: self.metrics.clone(),
            tx,
        };
        tokio::spawn(stream.run(inbound));
        Box::pin(ReceiverStream::new(rx))
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        Ok(Response::new(self.open::<Session>(request)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Ok(Response::new(self.open::<DeltaSession>(request)))
    }
}

/// A variant of the ADS protocol: state of the world ([`Session`]) or incremental
/// ([`DeltaSession`]); one stream's state machine, and what the server needs to know of its
/// messages.
pub trait Protocol: Default + Send + 'static {
    /// What clients send.
    type Request: prost::Message + Default + Send + 'static;
    /// What the server sends.
    type Response: Send + 'static;
    /// Take one request.
    fn on_request(&mut self, request: &Self::Request, state: &State) -> Reply<Self::Response>;
    /// Take one change of the cache.
    fn on_change(&mut self, state: &State) -> Vec<Self::Response>;
    /// A request's type URL and version (for logs).
    fn describe_request(request: &Self::Request) -> (&str, &str);
    /// The client's node, when the request carries it (the first of a stream: later ones are
    /// not decoded, see [`crate::wire`]).
    fn node(request: &Self::Request) -> Option<&Node>;
    /// A response's kind, resource count and resource bytes (for metrics and logs).
    fn describe(response: &Self::Response) -> (Kind, usize, usize);
}

impl Protocol for Session {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;

    fn on_request(&mut self, request: &DiscoveryRequest, state: &State) -> Reply {
        Session::on_request(self, request, state)
    }

    fn on_change(&mut self, state: &State) -> Vec<DiscoveryResponse> {
        Session::on_change(self, state)
    }

    fn describe_request(request: &DiscoveryRequest) -> (&str, &str) {
        (&request.type_url, &request.version_info)
    }

    fn node(request: &DiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }

    fn describe(r: &DiscoveryResponse) -> (Kind, usize, usize) {
        let bytes = r.resources.iter().map(|a| a.value.len()).sum();
        let kind = Kind::of(&r.type_url).unwrap_or(Kind::Endpoints);
        (kind, r.resources.len(), bytes)
    }
}

impl Protocol for DeltaSession {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;

    fn on_request(
        &mut self,
        request: &DeltaDiscoveryRequest,
        state: &State,
    ) -> Reply<DeltaDiscoveryResponse> {
        DeltaSession::on_request(self, request, state)
    }

    fn on_change(&mut self, state: &State) -> Vec<DeltaDiscoveryResponse> {
        DeltaSession::on_change(self, state)
    }

    fn describe_request(request: &DeltaDiscoveryRequest) -> (&str, &str) {
        (&request.type_url, "-")
    }

    fn node(request: &DeltaDiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }

    fn describe(r: &DeltaDiscoveryResponse) -> (Kind, usize, usize) {
        let bytes = r
            .resources
            .iter()
            .filter_map(|x| x.resource.as_ref())
            .map(|a| a.value.len())
            .sum();
        let kind = Kind::of(&r.type_url).unwrap_or(Kind::Endpoints);
        (kind, r.resources.len() + r.removed_resources.len(), bytes)
    }
}

/// One stream's task.
struct StreamTask<P: Protocol> {
    peer: String,
    states: tokio::sync::watch::Receiver<Arc<State>>,
    clock: lbkit_core::Clock,
    metrics: Arc<Metrics>,
    tx: mpsc::Sender<Result<P::Response, Status>>,
}

impl<P: Protocol> StreamTask<P> {
    async fn run(mut self, mut inbound: Streaming<P::Request>) {
        self.metrics.clients.inc();
        tracing::info!(peer = %self.peer, "xds: stream opened");
        let mut session = P::default();
        loop {
            tokio::select! {
                request = inbound.message() => match request {
                    Ok(Some(request)) => {
                        if !self.on_request(&mut session, &request).await {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        // Said back to the client too (a request above the size limit, a
                        // malformed message): its stream ends with the reason.
                        tracing::info!(peer = %self.peer, %status, "xds: stream failed");
                        let _ = self.tx.send(Err(status)).await;
                        break;
                    }
                },
                changed = self.states.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let state = self.states.borrow_and_update().clone();
                    let responses = session.on_change(&state);
                    if !self.send_all(responses, &state, true).await {
                        break;
                    }
                }
            }
        }
        self.metrics.clients.dec();
        tracing::info!(peer = %self.peer, "xds: stream closed");
    }

    /// Handle one request; false when the client is gone.
    async fn on_request(&mut self, session: &mut P, request: &P::Request) -> bool {
        // `borrow`, not `borrow_and_update`: a change that landed just before this request
        // stays unseen, so `changed()` fires and every type gets it (the per-resource versions
        // keep what this answer already sent from going twice).
        let state = self.states.borrow().clone();
        let reply = session.on_request(request, &state);
        let (type_url, version) = P::describe_request(request);
        if let Some(node) = P::node(request) {
            tracing::info!(peer = %self.peer, node = %node.id, cluster = %node.cluster, "xds: client");
        }
        if let Some((kind, detail)) = &reply.nack {
            self.metrics
                .nacks
                .get_or_create(&Metrics::label(*kind))
                .inc();
            tracing::warn!(peer = %self.peer, r#type = kind.label(), version, error_detail = %detail, "xds: NACK");
        }
        if reply.unknown_type {
            tracing::debug!(peer = %self.peer, type_url, "xds: request for a type not served");
        }
        self.send_all(reply.response, &state, false).await
    }

    async fn send_all(
        &self,
        responses: impl IntoIterator<Item = P::Response>,
        state: &State,
        pushed: bool,
    ) -> bool {
        for response in responses {
            let (kind, count, bytes) = P::describe(&response);
            if self.tx.send(Ok(response)).await.is_err() {
                return false;
            }
            let label = Metrics::label(kind);
            self.metrics.pushes.get_or_create(&label).inc();
            self.metrics
                .pushed_bytes
                .get_or_create(&label)
                .inc_by(bytes as u64);
            if let (true, Some(at)) = (pushed, state.changed_at) {
                let took = self.clock.now().saturating_duration_since(at);
                self.metrics.push_latency.observe(took.as_secs_f64());
            }
            tracing::debug!(peer = %self.peer, r#type = kind.label(), version = state.version, count, "xds: sent");
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::tests::set;

    /// A stream over `cache` that has seen its state, as after its first answer.
    fn stream(
        cache: &Cache,
    ) -> (
        StreamTask<Session>,
        mpsc::Receiver<Result<DiscoveryResponse, Status>>,
    ) {
        let (tx, rx) = mpsc::channel(16);
        let mut task = StreamTask::<Session> {
            peer: "test".to_owned(),
            states: cache.subscribe(),
            clock: cache.clock().clone(),
            metrics: Arc::new(Metrics::default()),
            tx,
        };
        task.states.borrow_and_update();
        (task, rx)
    }

    /// A change that lands while the server answers a request (RELIABILITY.md: "a change
    /// racing a request"): answering reads the state without marking it seen, so the change
    /// still wakes the stream's loop and reaches every subscribed type, not only the one the
    /// request asked for.
    #[tokio::test]
    async fn a_change_racing_a_request_still_wakes_the_stream() {
        let cache = Cache::new();
        set(&cache, "a", &["127.0.0.1:1"]);
        let (mut task, mut rx) = stream(&cache);
        let mut session = Session::new();
        // The change lands after the stream's last wake-up, before the request is answered.
        set(&cache, "a", &["127.0.0.1:2"]);
        let request = DiscoveryRequest {
            type_url: Kind::Cluster.type_url().to_owned(),
            ..DiscoveryRequest::default()
        };
        assert!(task.on_request(&mut session, &request).await);
        let answer = rx.try_recv().expect("the request is answered").unwrap();
        assert_eq!(answer.type_url, Kind::Cluster.type_url());
        assert!(
            task.states.has_changed().unwrap(),
            "answering the request marked the change seen: the stream's loop would sleep through it"
        );
    }
}
