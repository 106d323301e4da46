//! The ADS stream of one [`XdsSource`]: connect, ask for the cluster, then for its endpoints,
//! ACK or NACK every response, and open the stream again with backoff when it fails.

use std::collections::HashSet;
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
    /// Every EDS name asked for (an assignment for one of them still in flight is no error).
    asked: HashSet<String>,
    sent: bool,
    /// Sets sent so far (a stream that delivered one resets the backoff).
    published: u64,
}

/// The latest nonce of each type on the open stream (what a request on it carries).
#[derive(Debug, Default)]
struct Nonces {
    clusters: String,
    endpoints: String,
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

/// One open stream: where requests go, and the latest nonces.
struct Stream {
    requests: mpsc::Sender<DiscoveryRequest>,
    nonces: Nonces,
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
            let published = self.accepted.published;
            self.stream().await;
            self.status.send_modify(|s| s.connected = false);
            if !self.accepted.sent && !self.serve_cache().await {
                return;
            }
            // Only a stream that delivered a set resets the pause: a control plane that
            // answers and then fails every stream is not asked again every 100 ms.
            if self.accepted.published > published {
                backoff.reset();
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// One stream, until it fails.
    async fn stream(&mut self) {
        let server = self.source.server.clone();
        let fail = |reason: String| DiscoveryError::Xds {
            server: server.clone(),
            reason,
        };
        let (mut stream, mut responses) = match self.open().await {
            Ok(opened) => opened,
            Err(reason) => return self.report(fail(reason)).await,
        };
        self.status.send_modify(|s| s.connected = true);
        if std::mem::take(&mut self.failing) {
            tracing::info!(server = %self.source.server, "xds: stream open again");
        }
        loop {
            let reason = match responses.message().await {
                Ok(Some(response)) => {
                    if self.on_response(&mut stream, response).await {
                        continue;
                    }
                    return;
                }
                Ok(None) => "the control plane closed the stream".to_owned(),
                Err(status) => format!("stream failed: {} {}", status.code(), status.message()),
            };
            return self.report(fail(reason)).await;
        }
    }

    /// Connect and ask for the cluster (and its endpoints, when known from before). HTTP/2
    /// PINGs every 30 s find a control plane that went silent (no answer in 10 s: the stream
    /// fails and is opened again).
    async fn open(&mut self) -> Result<(Stream, tonic::Streaming<DiscoveryResponse>), String> {
        let uri = format!("http://{}", self.source.server);
        let endpoint = tonic::transport::Endpoint::from_shared(uri)
            .map_err(|e| format!("bad server address: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("cannot connect: {}", crate::controller::error_chain(&e)))?;
        // Decoded up to 4 × the limit, so that a response above the limit is NACKed with its
        // size (the control plane hears why) rather than failing the stream; beyond that the
        // stream fails without reading it.
        let hard = self.source.max_response.saturating_mul(4);
        let mut client =
            AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(hard);
        let (requests, rx) = mpsc::channel(8);
        let stream = Stream {
            requests,
            nonces: Nonces::default(),
        };
        let cds = self.request(CLUSTER, &self.accepted.cds_version, "");
        stream.send(cds).await;
        if self.accepted.eds_name.is_some() {
            stream
                .send(self.request(ENDPOINTS, &self.accepted.eds_version, ""))
                .await;
        }
        let opened = client.stream_aggregated_resources(ReceiverStream::new(rx));
        let responses = tokio::time::timeout(CONNECT_TIMEOUT, opened)
            .await
            .map_err(|_| format!("no answer to the stream within {CONNECT_TIMEOUT:?}"))?
            .map_err(|s| format!("stream refused: {} {}", s.code(), s.message()))?
            .into_inner();
        Ok((stream, responses))
    }

    /// A request of `type_url` for what this source follows of it (the cluster; its EDS name,
    /// or nothing when its endpoints come inline).
    fn request(&self, type_url: &str, version: &str, nonce: &str) -> DiscoveryRequest {
        let resource_names = match type_url {
            ENDPOINTS => self.accepted.eds_name.iter().cloned().collect(),
            _ => vec![self.source.cluster.clone()],
        };
        DiscoveryRequest {
            version_info: version.to_owned(),
            node: Some(Node {
                id: self.source.node.clone(),
                user_agent_name: "lbkit".to_owned(),
                ..Node::default()
            }),
            resource_names,
            type_url: type_url.to_owned(),
            response_nonce: nonce.to_owned(),
            ..DiscoveryRequest::default()
        }
    }

    /// One response: ACK or NACK it, and pass on what it changed. False when the consumer is
    /// gone. A type this source did not ask for is passed over, unanswered.
    async fn on_response(&mut self, stream: &mut Stream, response: DiscoveryResponse) -> bool {
        let size = prost::Message::encoded_len(&response);
        match response.type_url.as_str() {
            CLUSTER => stream.nonces.clusters = response.nonce.clone(),
            ENDPOINTS => stream.nonces.endpoints = response.nonce.clone(),
            _ => return !self.tx.is_closed(),
        }
        let result = match response.type_url.as_str() {
            CLUSTER | ENDPOINTS if size > self.source.max_response => {
                let limit = self.source.max_response;
                Err(format!(
                    "a response of {size} bytes, above the limit of {limit}"
                ))
            }
            CLUSTER => self.on_clusters(stream, &response).await,
            _ => self.on_endpoints(&response).await,
        };
        let type_url = response.type_url.as_str();
        let reply = match result {
            Ok(()) => {
                self.accept(type_url, &response.version_info);
                self.request(type_url, &response.version_info, &response.nonce)
            }
            Err(why) => match self.reject(type_url, &response.nonce, why).await {
                Some(nack) => nack,
                None => return false,
            },
        };
        stream.send(reply).await;
        !self.tx.is_closed()
    }

    /// A NACK of the response `nonce` of `type_url` for `why`, also reported to the consumer
    /// and in the status; `None` when the consumer is gone.
    async fn reject(
        &mut self,
        type_url: &str,
        nonce: &str,
        why: String,
    ) -> Option<DiscoveryRequest> {
        tracing::warn!(server = %self.source.server, type_url, reason = %why, "xds: NACK");
        self.status.send_modify(|s| {
            s.nacks += 1;
            s.last_nack = Some(why.clone());
        });
        let kind = if type_url == CLUSTER {
            "clusters"
        } else {
            "endpoints"
        };
        let rejected = DiscoveryError::Rejected {
            server: self.source.server.clone(),
            kind,
            reason: why.clone(),
        };
        let mut nack = self.request(type_url, &self.version_of(type_url), nonce);
        nack.error_detail = Some(RpcStatus {
            code: tonic::Code::InvalidArgument as i32,
            message: why,
            details: Vec::new(),
        });
        self.tx.send(Err(rejected)).await.ok().map(|()| nack)
    }

    /// A CDS response: the cluster's endpoints inline, or its EDS name (subscribed to when new;
    /// an EDS subscription no longer needed is dropped).
    async fn on_clusters(
        &mut self,
        stream: &Stream,
        response: &DiscoveryResponse,
    ) -> Result<(), String> {
        let Some(info) = decode::cluster(&response.resources, &self.source.cluster)? else {
            tracing::warn!(cluster = %self.source.cluster, "xds: the control plane does not list the cluster; the last set stays");
            return Ok(());
        };
        self.status
            .send_modify(|s| s.policy = Some(info.policy.to_owned()));
        let eds_name = match &info.endpoints {
            Endpoints::Inline(_) => None,
            Endpoints::Eds(name) => Some(name.clone()),
        };
        if eds_name != self.accepted.eds_name {
            self.accepted.eds_name = eds_name;
            self.accepted.asked.extend(self.accepted.eds_name.clone());
            let eds = self.request(
                ENDPOINTS,
                &self.accepted.eds_version,
                &stream.nonces.endpoints,
            );
            stream.send(eds).await;
        }
        if let Endpoints::Inline(specs) = info.endpoints {
            self.publish(specs).await;
        }
        Ok(())
    }

    /// An EDS response: the cluster's endpoints (nothing, when they come inline).
    async fn on_endpoints(&mut self, response: &DiscoveryResponse) -> Result<(), String> {
        let Some(want) = self.accepted.eds_name.clone() else {
            return Ok(());
        };
        if let Some(specs) = decode::endpoints(&response.resources, &want, &self.accepted.asked)? {
            self.publish(specs).await;
        }
        Ok(())
    }

    /// Pass a whole set on, and save it when it has endpoints.
    async fn publish(&mut self, specs: Vec<EndpointSpec>) {
        let n = specs.len();
        if let (Some(cache), false) = (&self.cache, specs.is_empty()) {
            cache.send_replace(Arc::new(specs.clone()));
        }
        self.accepted.sent = true;
        self.accepted.published += 1;
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
