//! [`SetOrigin`]: sends each request to one endpoint's address, for clients that route by the
//! request URI (hyper-util's legacy client).

use std::task::{Context, Poll};

use http::uri::{Authority, Scheme, Uri};
use tower::Service;

use crate::error::BoxError;

/// Rewrites the scheme and authority of every request URI (keeping path and query), so one
/// shared client reaches the endpoint this service was made for.
///
/// ```
/// use lbkit_tower::http::SetOrigin;
/// let svc = SetOrigin::http(tower::service_fn(|_: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(())
/// }), "127.0.0.1:8080").unwrap();
/// assert_eq!(svc.authority().as_str(), "127.0.0.1:8080");
/// ```
#[derive(Clone, Debug)]
pub struct SetOrigin<S> {
    inner: S,
    scheme: Scheme,
    authority: Authority,
}

// === impl SetOrigin ===

impl<S> SetOrigin<S> {
    /// Send requests to `http://{address}`.
    ///
    /// # Errors
    /// When `address` is not a valid URI authority (`host:port`).
    pub fn http(inner: S, address: &str) -> Result<Self, BoxError> {
        SetOrigin::new(inner, Scheme::HTTP, address)
    }

    /// Send requests to `{scheme}://{address}`.
    ///
    /// # Errors
    /// When `address` is not a valid URI authority.
    pub fn new(inner: S, scheme: Scheme, address: &str) -> Result<Self, BoxError> {
        let authority: Authority = address.parse()?;
        Ok(SetOrigin {
            inner,
            scheme,
            authority,
        })
    }

    /// The authority requests are sent to.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

impl<S, B> Service<http::Request<B>> for SetOrigin<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> S::Future {
        let mut parts = std::mem::take(req.uri_mut()).into_parts();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        // Scheme, authority and path are all set, so the parts always form a URI.
        *req.uri_mut() = Uri::from_parts(parts).unwrap_or_default();
        self.inner.call(req)
    }
}
