//! One request's passage through the proxy, the same on both HTTP engines: the route (by host
//! and path) gives the service and the call's policy; the [`Envelope`] counts the request in
//! its service's metrics from start to end; the call runs under lbkit-core's `Attempts`
//! (`Service::pick` and `Service::retry`); a call that gets no answer ends in the answer
//! [`failure_answer`] gives. The body limits both engines respect live here too.

use std::sync::Arc;

use lbkit_core::{Observed, Stop, Timestamp};

use crate::service::Service;
use crate::state::RouteEntry;

pub use crate::body::{MAX_BUFFERED_RESPONSE, MAX_REPLAY_BODY};

/// A request in flight on its route: counted as started in its service's metrics when opened,
/// and as ended when closed with its status — or, when the request is dropped unanswered (the
/// client went away), at the drop.
#[derive(Debug)]
pub(crate) struct Envelope<'a> {
    route: &'a RouteEntry,
    started: Timestamp,
    open: bool,
}

impl<'a> Envelope<'a> {
    /// A request on `route` starts now.
    #[inline]
    pub(crate) fn open(route: &'a RouteEntry) -> Self {
        let service = &route.service;
        service.metrics().start();
        Envelope {
            route,
            started: service.clock().now(),
            open: true,
        }
    }

    /// The route.
    #[inline]
    pub(crate) fn route(&self) -> &'a RouteEntry {
        self.route
    }

    /// The route's service.
    #[inline]
    pub(crate) fn service(&self) -> &'a Arc<Service> {
        &self.route.service
    }

    /// When the request started, on the service's clock.
    #[inline]
    pub(crate) fn started(&self) -> Timestamp {
        self.started
    }

    /// The request was answered with `status`; it ended at `ended` (read now when `None`). It
    /// failed when the status stands for a failure by lbkit-core's one rule (5xx).
    #[inline]
    pub(crate) fn close(mut self, status: u16, ended: Option<Timestamp>) {
        self.end(lbkit_core::status_failure(status).is_some(), ended);
    }

    fn end(&mut self, failed: bool, ended: Option<Timestamp>) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let service = self.service();
        let ended = ended.unwrap_or_else(|| service.clock().now());
        let latency = ended.saturating_duration_since(self.started);
        service.metrics().finish(latency, failed);
    }
}

impl Drop for Envelope<'_> {
    fn drop(&mut self) {
        self.end(false, None);
    }
}

/// The proxy's answer to a call whose last attempt got no answer (`observed`) and stopped for
/// `stop`: 504 after a timeout or once the deadline passed, else 502, saying when the retry
/// budget or the deadline was the reason.
pub(crate) fn failure_answer(observed: Observed, stop: Stop) -> (u16, &'static str) {
    let code = if observed == Observed::Timeout || stop == Stop::DeadlinePassed {
        504
    } else {
        502
    };
    let text = match stop {
        Stop::BudgetExhausted => "upstream failed (retry budget exhausted)\n",
        Stop::DeadlinePassed => "deadline exceeded\n",
        _ => "upstream failed\n",
    };
    (code, text)
}
