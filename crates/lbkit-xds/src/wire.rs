//! The ADS service on the wire: the generated service's routing, with a codec that decodes a
//! client's `node` from the first request of a stream only.
//!
//! Envoy sends its `Node` on every request of a stream, ACKs included, and its node lists every
//! extension the binary was built with: several hundred messages, each with strings to
//! allocate. Decoding and dropping them was about 30 % of `lbkit xds`'s CPU per change with 50
//! Envoys subscribed (`perf`, BENCHMARKS.md), for a field the server reads once. Later
//! requests skip it unread; every other field decodes as prost's own codec does.

use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use prost::bytes::Buf;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, Service, StdError};
use tonic::{Request, Response, Status, Streaming};

const SOTW: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// An ADS request: where its `node` is, and whether it carried one.
pub trait NodeField {
    /// The field number of `node`.
    const NODE: u32;
    /// Whether this request carried a node.
    fn has_node(&self) -> bool;
}

impl NodeField for DiscoveryRequest {
    const NODE: u32 = 2;
    fn has_node(&self) -> bool {
        self.node.is_some()
    }
}

impl NodeField for DeltaDiscoveryRequest {
    const NODE: u32 = 1;
    fn has_node(&self) -> bool {
        self.node.is_some()
    }
}

/// prost's codec, but a stream's decoder skips `node` once a request has carried one.
struct NodeOnce<E, D>(PhantomData<fn() -> (E, D)>);

impl<E, D> Codec for NodeOnce<E, D>
where
    E: Message + Send + 'static,
    D: Message + Default + NodeField + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = Plain<E>;
    type Decoder = NodeOnceDecoder<D>;

    fn encoder(&mut self) -> Plain<E> {
        Plain(PhantomData)
    }

    fn decoder(&mut self) -> NodeOnceDecoder<D> {
        NodeOnceDecoder {
            node_seen: false,
            _pd: PhantomData,
        }
    }
}

struct Plain<E>(PhantomData<fn() -> E>);

impl<E: Message> Encoder for Plain<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a response: {e}")))
    }
}

/// Decodes one stream's requests (tonic makes one per stream).
pub struct NodeOnceDecoder<D> {
    node_seen: bool,
    _pd: PhantomData<fn() -> D>,
}

impl<D: Message + Default + NodeField> NodeOnceDecoder<D> {
    /// A decoder for a new stream.
    pub fn new() -> Self {
        NodeOnceDecoder {
            node_seen: false,
            _pd: PhantomData,
        }
    }

    /// One request from its bytes (prost's own field decoding, `node` skipped after the first).
    ///
    /// # Errors
    /// The bytes are not a request.
    pub fn decode_request(&mut self, buf: &mut impl Buf) -> Result<D, prost::DecodeError> {
        use prost::encoding::{decode_key, skip_field, DecodeContext};
        let mut request = D::default();
        while buf.has_remaining() {
            // The functions prost's generated `merge` calls, field by field.
            let (tag, wire_type) = decode_key(buf)?;
            if tag == D::NODE && self.node_seen {
                skip_field(wire_type, tag, buf, DecodeContext::default())?;
            } else {
                request.merge_field(tag, wire_type, buf, DecodeContext::default())?;
            }
        }
        self.node_seen |= request.has_node();
        Ok(request)
    }
}

impl<D: Message + Default + NodeField> Default for NodeOnceDecoder<D> {
    fn default() -> Self {
        NodeOnceDecoder::new()
    }
}

impl<D: Message + Default + NodeField> Decoder for NodeOnceDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        self.decode_request(buf)
            .map(Some)
            .map_err(|e| Status::internal(format!("a malformed request: {e}")))
    }
}

/// The ADS gRPC service over any [`AggregatedDiscoveryService`] (`lbkit xds`'s, a test's),
/// decoding with [`NodeOnceDecoder`]; requests above `max_request` bytes end their stream
/// with `OUT_OF_RANGE`.
#[derive(Debug)]
pub struct AdsServer<T> {
    inner: Arc<T>,
    max_request: usize,
}

impl<T> Clone for AdsServer<T> {
    fn clone(&self) -> Self {
        AdsServer {
            inner: self.inner.clone(),
            max_request: self.max_request,
        }
    }
}

impl<T: AggregatedDiscoveryService> AdsServer<T> {
    /// Serve `inner`, accepting requests of up to `max_request` bytes.
    pub fn new(inner: T, max_request: usize) -> Self {
        AdsServer {
            inner: Arc::new(inner),
            max_request,
        }
    }
}

/// One ADS method as tonic's streaming service: `open` answers a stream of requests.
struct Method<T, Q, R, F> {
    inner: Arc<T>,
    open: F,
    _pd: PhantomData<fn(Q) -> R>,
}

impl<T, Q, R, F> Method<T, Q, R, F> {
    fn new(inner: Arc<T>, open: F) -> Self {
        Method {
            inner,
            open,
            _pd: PhantomData,
        }
    }
}

/// Serve one ADS stream of `method`, its requests decoded node-once and at most `max` bytes.
async fn stream<Q, M, B>(
    method: M,
    req: http::Request<B>,
    max: usize,
) -> http::Response<tonic::body::Body>
where
    Q: Message + Default + NodeField + Send + 'static,
    M: tonic::server::StreamingService<Q> + Send,
    M::Response: Message + Send + 'static,
    M::ResponseStream: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send,
{
    let codec = NodeOnce::<M::Response, Q>(PhantomData);
    let mut grpc =
        tonic::server::Grpc::new(codec).apply_max_message_size_config(Some(max), Some(usize::MAX));
    grpc.streaming(method, req).await
}

impl<T, Q, R, S, F, Fut> tonic::server::StreamingService<Q> for Method<T, Q, R, F>
where
    T: Send + Sync + 'static,
    Q: Send + 'static,
    R: Send + 'static,
    S: futures_core::Stream<Item = Result<R, Status>> + Send + 'static,
    F: Fn(Arc<T>, Request<Streaming<Q>>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<S>, Status>> + Send + 'static,
{
    type Response = R;
    type ResponseStream = S;
    type Future = BoxFuture<Response<S>, Status>;

    fn call(&mut self, request: Request<Streaming<Q>>) -> Self::Future {
        Box::pin((self.open)(self.inner.clone(), request))
    }
}

impl<T, B> Service<http::Request<B>> for AdsServer<T>
where
    T: AggregatedDiscoveryService,
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (inner, max) = (self.inner.clone(), self.max_request);
        match req.uri().path() {
            SOTW => Box::pin(async move {
                let open = |ads: Arc<T>, r| async move { ads.stream_aggregated_resources(r).await };
                Ok(stream(Method::new(inner, open), req, max).await)
            }),
            DELTA => Box::pin(async move {
                let open = |ads: Arc<T>, r| async move { ads.delta_aggregated_resources(r).await };
                Ok(stream(Method::new(inner, open), req, max).await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

#[cfg(test)]
mod tests;
