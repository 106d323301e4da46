//! What the balance needs to know about requests and responses, as two small traits:
//!
//! * [`RequestPolicy`]: the request's hash key, whether it is idempotent, and how to copy it for
//!   another attempt (failover, forking, broadcast, failback). [`HttpRequests`](crate::http::HttpRequests)
//!   covers `http::Request`; [`CloneRequests`] and [`KeyedRequests`] cover typed requests.
//! * [`ResponsePolicy`]: whether a response is a success or a failure, how an error failed, and
//!   when the call ends ([`Completion`]). [`HttpResponses`](crate::http::HttpResponses) covers
//!   HTTP and gRPC; [`AnyResponse`] counts every response as a success.

mod classify;

use std::time::Duration;

use lbkit_core::signal::Pushback;
use lbkit_core::{Outcome, Route};
use lbkit_strategy::{KeyExtractor, KeySource};

use crate::completion::Completion;

#[cfg(feature = "http")]
pub use classify::http2_unprocessed;
pub use classify::{default_error_outcome, grpc_code_kind, GrpcCodes};

/// What the balance asks of a request.
///
/// Every method has a conservative default: no key, not idempotent, not replayable.
pub trait RequestPolicy<Req>: Send + Sync + 'static {
    /// Run `pick` with the request's consistent-hash key (see [`KeyExtractor`]), or `None`.
    /// A callback rather than a return value, so a key borrowed from a wrapper around the
    /// request costs no copy.
    fn with_hash_key<R>(&self, req: &Req, pick: impl FnOnce(Option<&[u8]>) -> R) -> R {
        let _ = req;
        pick(None)
    }

    /// Run `pick` with the request's [`Route`]: its hash key (by default
    /// [`with_hash_key`](Self::with_hash_key)'s) and its routing tag (by default none; see
    /// `lbkit_core::route`). What the balance calls.
    fn with_route<R>(&self, req: &Req, pick: impl FnOnce(Route<'_>) -> R) -> R {
        self.with_hash_key(req, |key| pick(Route::key(key)))
    }

    /// Whether the request may be sent again after it reached a server (failover retries only
    /// these, or failures known not to have reached the server).
    fn is_idempotent(&self, req: &Req) -> bool {
        let _ = req;
        false
    }

    /// A copy of the request for another attempt, or `None` when it cannot be copied.
    fn replay(&self, req: &Req) -> Option<Req> {
        let _ = req;
        None
    }

    /// The caller's deadline the request carries, counted from now (gRPC's `grpc-timeout`, a
    /// header of milliseconds): the call's overall deadline is cut to it, no attempt starts
    /// past it, and one that has passed fails the call at once with
    /// [`ErrorKind::DeadlineExceeded`](crate::ErrorKind::DeadlineExceeded). Default none.
    fn deadline(&self, req: &Req) -> Option<Duration> {
        let _ = req;
        None
    }

    /// Tell the endpoint how long it has (`left`: this attempt's time, inside the call's
    /// deadline), just before the attempt is sent. Default: nothing.
    fn tell_deadline(&self, req: &mut Req, left: Duration) {
        let _ = (req, left);
    }
}

/// What the balance asks of a response.
pub trait ResponsePolicy<Resp>: Send + Sync + 'static {
    /// What the balance returns: the response, possibly with its body wrapped.
    type Output: Send + 'static;

    /// The outcome as far as the response head tells: [`Outcome::Success`] or a failure.
    fn classify(&self, resp: &Resp) -> Outcome;

    /// The outcome of a call that returned `err`: a failure and its kind, or
    /// [`Outcome::Success`] when the error is an answer rather than the endpoint's fault (a
    /// gRPC NOT_FOUND). The caller gets the error either way. Defaults to
    /// [`default_error_outcome`].
    fn classify_error(&self, err: &(dyn std::error::Error + 'static)) -> Outcome {
        default_error_outcome(err)
    }

    /// Take note of what the answer, classified as `outcome`, says beyond its outcome, for
    /// `call`'s endpoint: a load report (recorded against it), and a pushback — to leave the
    /// endpoint alone for a while, or not to retry (`lbkit_core::signal`) — recorded against
    /// it (picks pass it over meanwhile) and returned, so that a retry waits it out. The
    /// balance calls this for every answer, the ones it retries included, before
    /// [`complete`](Self::complete). Default: nothing.
    fn signals(&self, resp: &Resp, outcome: Outcome, call: &Completion) -> Option<Pushback> {
        let _ = (resp, outcome, call);
        None
    }

    /// Hand the response out and decide when the call ends: finish `call` now with `outcome`,
    /// or move it into the response (a body wrapper) to finish later.
    fn complete(&self, resp: Resp, outcome: Outcome, call: Completion) -> Self::Output;
}

/// Every response is a success and ends the call at once; errors are classified by
/// [`default_error_outcome`]. For typed (message-level) services.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnyResponse;

impl<Resp: Send + 'static> ResponsePolicy<Resp> for AnyResponse {
    type Output = Resp;

    fn classify(&self, _: &Resp) -> Outcome {
        Outcome::Success
    }

    fn complete(&self, resp: Resp, outcome: Outcome, call: Completion) -> Resp {
        call.finish(outcome);
        resp
    }
}

/// Requests that are not idempotent and cannot be copied: one attempt each (connection
/// failures are not retried either, since the request is gone).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoReplay;

impl<Req> RequestPolicy<Req> for NoReplay {}

/// Typed requests that are `Clone`: replayed by cloning; idempotent or not as configured
/// (default: not, so only connection failures are retried).
#[derive(Clone, Copy, Debug, Default)]
pub struct CloneRequests {
    /// Whether every request may be retried after it reached a server. Default `false`.
    pub idempotent: bool,
}

// === impl CloneRequests ===

impl CloneRequests {
    /// Requests that may all be retried after reaching a server.
    pub fn idempotent() -> Self {
        CloneRequests { idempotent: true }
    }

    /// Also take a hash key from each request (which implements [`KeySource`]).
    pub fn with_key(self, extractor: KeyExtractor) -> KeyedRequests {
        KeyedRequests {
            extractor,
            idempotent: self.idempotent,
        }
    }
}

impl<Req: Clone + Send + 'static> RequestPolicy<Req> for CloneRequests {
    fn is_idempotent(&self, _: &Req) -> bool {
        self.idempotent
    }

    fn replay(&self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

/// Typed requests that are `Clone` and implement [`KeySource`] (RPC arguments, metadata), with
/// a hash key taken by a [`KeyExtractor`].
#[derive(Clone, Debug)]
pub struct KeyedRequests {
    /// Where the key comes from.
    pub extractor: KeyExtractor,
    /// Whether every request may be retried after it reached a server.
    pub idempotent: bool,
}

impl<Req: Clone + KeySource + Send + 'static> RequestPolicy<Req> for KeyedRequests {
    fn with_hash_key<R>(&self, req: &Req, pick: impl FnOnce(Option<&[u8]>) -> R) -> R {
        pick(self.extractor.extract(req).as_deref())
    }

    fn is_idempotent(&self, _: &Req) -> bool {
        self.idempotent
    }

    fn replay(&self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Get {
        user: &'static str,
    }

    impl KeySource for Get {
        fn argument(&self, index: usize) -> Option<&[u8]> {
            (index == 0).then_some(self.user.as_bytes())
        }
    }

    #[test]
    fn typed_policies() {
        let req = Get { user: "u-7" };
        let p = CloneRequests::idempotent().with_key("arg:0".parse().unwrap());
        let key = p.with_hash_key(&req, |k| k.map(<[u8]>::to_vec));
        assert_eq!(key.as_deref(), Some(&b"u-7"[..]));
        assert!(p.is_idempotent(&req));
        assert!(p.replay(&req).is_some());
        assert!(!RequestPolicy::<Get>::is_idempotent(&NoReplay, &req));
        assert!(RequestPolicy::<Get>::replay(&NoReplay, &req).is_none());
        assert!(!CloneRequests::default().is_idempotent(&req));
    }
}
