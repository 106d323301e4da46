//! The ADS stream of one [`XdsSource`]: connect, ask for the cluster, then for its endpoints,
//! ACK or NACK every response, and open the stream again with backoff when it fails.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use lbkit_core::{EndpointSpec, Update};
use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

use super::decode::{self, Endpoints};
use super::{XdsSource, XdsStatus, CLUSTER, ENDPOINTS};
use crate::cache;
use crate::error::DiscoveryError;
use crate::source::{Backoff, SourceItem};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What survives a reconnection: the accepted versions, the EDS name, whether a set was sent.
#[derive(Debug, Default)]
struct Accepted {
    cds_version: String,
    eds_version: String,
    eds_name: Option<String>,
    sent: bool,
}

pub(super) struct Client {
    source: XdsSource,
    tx: mpsc::Sender<SourceItem>,
    status: Arc<watch::Sender<XdsStatus>>,
    cache: Option<watch::Sender<Arc<Vec<EndpointSpec>>>>,
    accepted: Accepted,
    /// Whether the last stream failed (later failures are logged at debug level only).
    failing: bool,
}

/// One open stream: where requests go.
struct Stream {
    requests: mpsc::Sender<DiscoveryRequest>,
}

impl Client {
    pub(super) fn new(
        source: XdsSource,
        tx: mpsc::Sender<SourceItem>,
        status: watch::Sender<XdsStatus>,
    ) -> Self {
        Client {
            source,
            tx,
            status: Arc::new(status),
            cache: None,
            accepted: Accepted::default(),
            failing: false,
        }
    }

    /// Until the consumer goes: a stream, and after it fails, a pause and another.
    pub(super) async fn run(mut self) {
        self.cache = self.source.cache.clone().map(|p| {
            let status = self.status.clone();
            cache::spawn_writer(p, move |written| match written {
                Ok(_) => status.send_modify(|s| s.cache_writes += 1),
                Err(_) => status.send_modify(|s| s.cache_failures += 1),
            })
        });
        let (min, max) = self.source.retry;
        let mut backoff = Backoff::between(min, max);
        let mut first = true;
        while !self.tx.is_closed() {
            if !first {
                self.status.send_modify(|s| s.reconnects += 1);
            }
            first = false;
            let answered = self.stream().await;
            self.status.send_modify(|s| s.connected = false);
            if !self.accepted.sent && !self.serve_cache().await {
                return;
            }
            if answered {
                backoff.reset();
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// One stream, until it fails: whether any response came on it.
    async fn stream(&mut self) -> bool {
        let server = self.source.server.clone();
        let fail = |reason: String| DiscoveryError::Xds {
            server: server.clone(),
            reason,
        };
        let (stream, mut responses) = match self.open().await {
            Ok(opened) => opened,
            Err(reason) => {
                self.report(fail(reason)).await;
                return false;
            }
        };
        self.status.send_modify(|s| s.connected = true);
        if std::mem::take(&mut self.failing) {
            tracing::info!(server = %self.source.server, "xds: stream open again");
        }
        let mut answered = false;
        loop {
            match responses.message().await {
                Ok(Some(response)) => {
                    answered = true;
                    if !self.on_response(&stream, response).await {
                        return answered;
                    }
                }
                Ok(None) => {
                    self.report(fail("the control plane closed the stream".into()))
                        .await;
                    return answered;
                }
                Err(status) => {
                    let reason = format!("stream failed: {} {}", status.code(), status.message());
                    self.report(fail(reason)).await;
                    return answered;
                }
            }
        }
    }

    /// Connect and ask for the cluster (and its endpoints, when known from before).
    async fn open(&mut self) -> Result<(Stream, tonic::Streaming<DiscoveryResponse>), String> {
        let uri = format!("http://{}", self.source.server);
        let endpoint = tonic::transport::Endpoint::from_shared(uri)
            .map_err(|e| format!("bad server address: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("cannot connect: {}", crate::controller::error_chain(&e)))?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.source.max_response);
        let (requests, rx) = mpsc::channel(8);
        let stream = Stream { requests };
        let cds = self.request(
            CLUSTER,
            &self.source.cluster,
            &self.accepted.cds_version,
            "",
        );
        stream.send(cds).await;
        if let Some(eds) = &self.accepted.eds_name {
            stream
                .send(self.request(ENDPOINTS, eds, &self.accepted.eds_version, ""))
                .await;
        }
        let responses = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .map_err(|s| format!("stream refused: {} {}", s.code(), s.message()))?
            .into_inner();
        Ok((stream, responses))
    }

    fn request(&self, type_url: &str, name: &str, version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(Node {
                id: self.source.node.clone(),
                user_agent_name: "lbkit".to_owned(),
                ..Node::default()
            }),
            resource_names: vec![name.to_owned()],
            type_url: type_url.to_owned(),
            response_nonce: nonce.to_owned(),
            ..DiscoveryRequest::default()
        }
    }

    /// One response: ACK or NACK it, and pass on what it changed. False when the consumer is
    /// gone.
    async fn on_response(&mut self, stream: &Stream, response: DiscoveryResponse) -> bool {
        let result = match response.type_url.as_str() {
            CLUSTER => self.on_clusters(stream, &response).await,
            ENDPOINTS => self.on_endpoints(&response).await,
            _ => Ok(None),
        };
        let (version, detail) = match result {
            Ok(_) => (response.version_info.clone(), None),
            Err(why) => (self.version_of(&response.type_url), Some(why)),
        };
        let name = self.name_for(&response.type_url);
        let mut reply = self.request(&response.type_url, &name, &version, &response.nonce);
        match detail {
            None => {
                self.accept(&response.type_url, &version);
            }
            Some(why) => {
                tracing::warn!(server = %self.source.server, type_url = %response.type_url, reason = %why, "xds: NACK");
                self.status.send_modify(|s| {
                    s.nacks += 1;
                    s.last_nack = Some(why.clone());
                });
                let kind = if response.type_url == CLUSTER {
                    "clusters"
                } else {
                    "endpoints"
                };
                let rejected = DiscoveryError::Rejected {
                    server: self.source.server.clone(),
                    kind,
                    reason: why.clone(),
                };
                reply.error_detail = Some(RpcStatus {
                    code: tonic::Code::InvalidArgument as i32,
                    message: why,
                    details: Vec::new(),
                });
                if self.tx.send(Err(rejected)).await.is_err() {
                    return false;
                }
            }
        }
        stream.send(reply).await;
        !self.tx.is_closed()
    }

    /// A CDS response: the cluster's endpoints inline, or its EDS name (subscribed to when new).
    async fn on_clusters(
        &mut self,
        stream: &Stream,
        response: &DiscoveryResponse,
    ) -> Result<Option<()>, String> {
        let Some(info) = decode::cluster(&response.resources, &self.source.cluster)? else {
            tracing::warn!(cluster = %self.source.cluster, "xds: the control plane does not list the cluster; the last set stays");
            return Ok(None);
        };
        self.status
            .send_modify(|s| s.policy = Some(info.policy.to_owned()));
        match info.endpoints {
            Endpoints::Inline(specs) => {
                self.accepted.eds_name = None;
                self.publish(specs).await;
            }
            Endpoints::Eds(name) => {
                if self.accepted.eds_name.as_ref() != Some(&name) {
                    let eds = self.request(ENDPOINTS, &name, &self.accepted.eds_version, "");
                    self.accepted.eds_name = Some(name);
                    stream.send(eds).await;
                }
            }
        }
        Ok(Some(()))
    }

    /// An EDS response: the cluster's endpoints.
    async fn on_endpoints(&mut self, response: &DiscoveryResponse) -> Result<Option<()>, String> {
        let Some(want) = self.accepted.eds_name.clone() else {
            return Err("endpoints for a cluster lbkit did not ask for".into());
        };
        if let Some(specs) = decode::endpoints(&response.resources, &want)? {
            self.publish(specs).await;
        }
        Ok(Some(()))
    }

    /// Pass a whole set on, and save it when it has endpoints.
    async fn publish(&mut self, specs: Vec<EndpointSpec>) {
        let n = specs.len();
        if let (Some(cache), false) = (&self.cache, specs.is_empty()) {
            cache.send_replace(Arc::new(specs.clone()));
        }
        self.accepted.sent = true;
        self.status.send_modify(|s| {
            s.endpoints = n;
            s.from_cache = false;
        });
        let _ = self.tx.send(Ok(Update::Reset(specs))).await;
    }

    fn accept(&mut self, type_url: &str, version: &str) {
        match type_url {
            CLUSTER => self.accepted.cds_version = version.to_owned(),
            ENDPOINTS => self.accepted.eds_version = version.to_owned(),
            _ => {}
        }
        let versions = (
            self.accepted.cds_version.clone(),
            self.accepted.eds_version.clone(),
        );
        self.status.send_modify(|s| {
            s.acks += 1;
            s.versions = versions;
        });
    }

    /// The version last accepted for `type_url` (what a NACK carries).
    fn version_of(&self, type_url: &str) -> String {
        match type_url {
            CLUSTER => self.accepted.cds_version.clone(),
            ENDPOINTS => self.accepted.eds_version.clone(),
            _ => String::new(),
        }
    }

    /// The resource name this stream follows for `type_url`.
    fn name_for(&self, type_url: &str) -> String {
        match type_url {
            ENDPOINTS => self.accepted.eds_name.clone().unwrap_or_default(),
            _ => self.source.cluster.clone(),
        }
    }

    /// Report a failure to the consumer (the last set stays) and in the status.
    async fn report(&mut self, error: DiscoveryError) {
        if std::mem::replace(&mut self.failing, true) {
            tracing::debug!(error = %error, "xds: no stream; the last set stays");
        } else {
            tracing::warn!(error = %error, "xds: no stream; the last set stays (retrying with backoff; later failures at debug level)");
        }
        let text = error.to_string();
        self.status.send_modify(|s| s.last_error = Some(text));
        let _ = self.tx.send(Err(error)).await;
    }

    /// No set was ever sent: serve the cache file's once. False when the consumer is gone.
    async fn serve_cache(&mut self) -> bool {
        let Some(path) = self.source.cache.clone() else {
            return !self.tx.is_closed();
        };
        let read = tokio::task::spawn_blocking(move || cache::read_cache(&path)).await;
        if let Ok(Ok(Some(specs))) = read {
            tracing::warn!(
                endpoints = specs.len(),
                "xds: control plane unreachable: serving the cache file"
            );
            self.accepted.sent = true;
            let n = specs.len();
            self.status.send_modify(|s| {
                s.endpoints = n;
                s.from_cache = true;
            });
            return self.tx.send(Ok(Update::Reset(specs))).await.is_ok();
        }
        !self.tx.is_closed()
    }
}

impl Stream {
    async fn send(&self, request: DiscoveryRequest) {
        // A closed stream shows as the response side failing; nothing to do here.
        let _ = self.requests.send(request).await;
    }
}
