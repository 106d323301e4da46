//! [`BufferRequest`]: collects a streamed request body (hyper's `Incoming`, tonic's `Body`) into
//! `Full<Bytes>`, so the balance behind it can replay the request (failover, forking,
//! broadcast, failback).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use tower::{Layer, Service, ServiceExt};

use crate::error::BoxError;

/// Largest body buffered by default: 4 MiB, gRPC's default maximum message size.
pub const DEFAULT_BUFFER_LIMIT: usize = 4 * 1024 * 1024;

/// Buffers request bodies of up to `limit` bytes; see [`BufferRequest`].
#[derive(Clone, Copy, Debug)]
pub struct BufferRequestLayer {
    limit: usize,
}

impl BufferRequestLayer {
    /// Buffer up to `limit` bytes per request body.
    pub fn new(limit: usize) -> Self {
        BufferRequestLayer { limit }
    }
}

impl Default for BufferRequestLayer {
    fn default() -> Self {
        BufferRequestLayer::new(DEFAULT_BUFFER_LIMIT)
    }
}

impl<S> Layer<S> for BufferRequestLayer {
    type Service = BufferRequest<S>;

    fn layer(&self, inner: S) -> BufferRequest<S> {
        BufferRequest {
            inner,
            limit: self.limit,
        }
    }
}

/// Reads the whole request body (at most `limit` bytes, else the call fails) and passes the
/// request on with a `Full<Bytes>` body, which [`HttpRequests`](super::HttpRequests) replays.
/// Trailers of the request body are dropped.
#[derive(Clone, Debug)]
pub struct BufferRequest<S> {
    inner: S,
    limit: usize,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for BufferRequest<S>
where
    S: Service<http::Request<Full<Bytes>>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The ready clone takes this call; the fresh clone waits for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.limit;
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = Limited::new(body, limit).collect().await?.to_bytes();
            let req = http::Request::from_parts(parts, Full::new(bytes));
            inner.ready().await.map_err(Into::into)?;
            inner.call(req).await.map_err(Into::into)
        })
    }
}
