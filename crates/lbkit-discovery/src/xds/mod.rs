//! The xDS source (feature `xds`): one cluster's endpoints from an xDS control plane (`lbkit
//! xds`, Istio, go-control-plane, anything that serves Envoy) over the Aggregated Discovery
//! Service, state of the world: CDS for the cluster, then EDS for its endpoints.
//!
//! - Each accepted ClusterLoadAssignment becomes a `Reset` of the whole set: weights, health
//!   (`UNHEALTHY`/`TIMEOUT` unhealthy, `DRAINING` weight 0), zones from localities, priorities.
//! - Resources lbkit cannot use are NACKed with an `error_detail` naming the problem (an unknown
//!   `lb_policy`, an assignment for another cluster, a weight of 0 or weights above `u32`, a
//!   response above the size limit); the last good set stays, and the stream goes on. (A
//!   response above 4 × the limit is not read at all: the stream fails and is opened again.)
//! - The stream reconnects with backoff (100 ms doubling to 10 s) and asks again with the
//!   versions it accepted; until then the last set keeps serving.
//! - With [`XdsSource::with_cache`] the last non-empty set is saved (the registry cache's
//!   format) and served at start-up when the control plane cannot be reached.
//! - An empty set is passed on as it came; the [`Controller`](crate::Controller)'s empty-push
//!   protection holds the last one, as for every source.
//!
//! ```no_run
//! # async fn run() {
//! use lbkit_discovery::xds::XdsSource;
//! let (updates, status) = XdsSource::new("127.0.0.1:18000", "greeter")
//!     .with_cache("greeter.xds-cache.json")
//!     .spawn();
//! # drop((updates, status));
//! # }
//! ```

mod client;
mod decode;

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::source::{ChannelStream, Status, UpdateStream, SOURCE_QUEUE};

/// Type URL of a Listener.
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of a Cluster.
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of a ClusterLoadAssignment.
pub const ENDPOINTS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Largest response accepted by default: 16 MiB (a larger one is NACKed with its size, and
/// one above 4 × the limit fails the stream unread; the last good set stays either way).
pub const DEFAULT_MAX_RESPONSE: usize = 16 << 20;

/// What the source has seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XdsStatus {
    /// Whether a stream to the control plane is open.
    pub connected: bool,
    /// Streams opened after the first.
    pub reconnects: u64,
    /// The accepted CDS and EDS versions.
    pub versions: (String, String),
    /// Responses accepted.
    pub acks: u64,
    /// Responses rejected.
    pub nacks: u64,
    /// The last rejection's `error_detail`.
    pub last_nack: Option<String>,
    /// The last stream or connection error.
    pub last_error: Option<String>,
    /// The cluster's `lb_policy` (`ROUND_ROBIN`...): what the control plane asks for; the
    /// strategy lbkit runs is the one configured locally.
    pub policy: Option<String>,
    /// Endpoints in the last set sent.
    pub endpoints: usize,
    /// Whether the last set sent came from the cache file.
    pub from_cache: bool,
    /// Cache files written, and failed writes.
    pub cache_writes: u64,
    /// Cache writes that failed.
    pub cache_failures: u64,
}

/// One cluster of an xDS control plane, followed.
#[derive(Clone, Debug)]
pub struct XdsSource {
    server: String,
    cluster: String,
    node: String,
    cache: Option<PathBuf>,
    max_response: usize,
    retry: (Duration, Duration),
}

impl XdsSource {
    /// Follow cluster `cluster` of the control plane at `server` (`HOST:PORT`, plain-text
    /// HTTP/2), as node `lbkit`.
    pub fn new(server: impl Into<String>, cluster: impl Into<String>) -> Self {
        XdsSource {
            server: server.into(),
            cluster: cluster.into(),
            node: "lbkit".to_owned(),
            cache: None,
            max_response: DEFAULT_MAX_RESPONSE,
            retry: (Duration::from_millis(100), Duration::from_secs(10)),
        }
    }

    /// The node id sent to the control plane (default `lbkit`).
    pub fn with_node(mut self, id: impl Into<String>) -> Self {
        self.node = id.into();
        self
    }

    /// Save the last non-empty set to `path` and serve it at start-up when the control plane
    /// cannot be reached (see [`write_cache`](crate::cache::write_cache)).
    pub fn with_cache(mut self, path: impl Into<PathBuf>) -> Self {
        self.cache = Some(path.into());
        self
    }

    /// The largest response accepted, bytes (default [`DEFAULT_MAX_RESPONSE`]).
    pub fn with_max_response(mut self, bytes: usize) -> Self {
        self.max_response = bytes;
        self
    }

    /// Pauses between reconnections: from `min`, doubling, up to `max` (default 100 ms to
    /// 10 s).
    pub fn with_retry(mut self, min: Duration, max: Duration) -> Self {
        self.retry = (min, max);
        self
    }

    /// Start following on the current tokio runtime: the stream yields a `Reset` per accepted
    /// assignment and an `Err` per failed stream or rejected response; the task ends when the
    /// stream is dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(self) -> (UpdateStream, Status<XdsStatus>) {
        let (tx, rx) = mpsc::channel(SOURCE_QUEUE);
        let (status_tx, status_rx) = watch::channel(XdsStatus::default());
        tokio::spawn(client::Client::new(self, tx, status_tx).run());
        (ChannelStream::new(rx).boxed(), Status::new(status_rx))
    }
}
