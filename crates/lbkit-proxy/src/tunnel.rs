//! HTTP/1.1 upgrades (WebSocket's handshake, RFC 9110 §7.8): the request keeps `Upgrade` and
//! `Connection: upgrade` for the upstream, and its `101 Switching Protocols` turns the client's
//! and the upstream's connections into a byte tunnel.
//!
//! Only what is safe to tunnel is: a GET without a body, on HTTP/1.1, to protocols listed in
//! `limits.upgrade_protocols` (default `websocket`; never `h2c`, whose tunnel would let a
//! client speak HTTP/2 to the upstream past routing and forwarding headers), not while the
//! proxy drains. Anything else goes upstream as a plain request (`Upgrade` removed). A 101 to a
//! protocol the client did not ask for is refused (502).
//!
//! A tunnel keeps the client connection's slot under `max_connections`; a drain waits for it
//! (bounded by `drain_timeout_ms`), and it is closed when the proxy is gone. It ends when both
//! directions have closed (a half-close is passed on), on an error, after
//! `tunnel_idle_timeout_ms` without a byte either way (checked every quarter of it), or when
//! the client stops reading (the connection's write-stall limit).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, CONNECTION, UPGRADE};
use http::{HeaderValue, Method, Request, Response, Version};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::body::ProxyBody;
use crate::headers;
use crate::hub::ConnHold;
use crate::idle::{quiet_for, Counted};

/// An upgrade the client asked for, to be passed on.
pub(crate) struct Ask {
    protocol: HeaderValue,
    client: OnUpgrade,
    hold: ConnHold,
}

impl std::fmt::Debug for Ask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ask")
            .field("protocol", &self.protocol)
            .finish()
    }
}

/// The upgrade `req` asks for, if it may be tunnelled (see the module docs).
pub(crate) fn asked(req: &mut Request<crate::body::Inbound>) -> Option<Ask> {
    if req.version() != Version::HTTP_11
        || req.method() != Method::GET
        || !req.body().is_end_stream()
        || !headers::connection_names(req.headers(), "upgrade")
    {
        return None;
    }
    let hold = req.extensions_mut().remove::<ConnHold>()?;
    let protocol = req.headers().get(UPGRADE)?.clone();
    if hold.draining() || !all_allowed(&protocol, &hold.limits().upgrade_protocols) {
        return None;
    }
    Some(Ask {
        protocol,
        client: hyper::upgrade::on(req),
        hold,
    })
}

/// Whether `offered` names at least one protocol, and only `allowed` ones.
fn all_allowed(offered: &HeaderValue, allowed: &[String]) -> bool {
    let mut offered = headers::tokens(offered.as_bytes()).peekable();
    offered.peek().is_some() && offered.all(|p| allowed.iter().any(|a| same_protocol(a, p)))
}

/// Whether `chosen` is one protocol, one of `offered`'s (by name).
fn offered_one(offered: &HeaderValue, chosen: &HeaderValue) -> bool {
    let mut chosen = headers::tokens(chosen.as_bytes());
    let (Some(token), None) = (chosen.next(), chosen.next()) else {
        return false;
    };
    headers::tokens(offered.as_bytes()).any(|t| base(t).eq_ignore_ascii_case(base(token)))
}

/// A protocol token's name (`name` or `name/version`).
fn base(token: &[u8]) -> &[u8] {
    token.split(|&b| b == b'/').next().unwrap_or(token)
}

/// Whether an offered or chosen protocol token is `name`.
fn same_protocol(name: &str, token: &[u8]) -> bool {
    base(token).eq_ignore_ascii_case(name.as_bytes())
}

impl Ask {
    /// Put the upgrade back on the request for the upstream (after hop-by-hop removal).
    pub(crate) fn ask_upstream(&self, headers: &mut HeaderMap) {
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, self.protocol.clone());
    }

    /// The client's 101, the tunnel started behind it; `Err` when the upstream switched to a
    /// protocol the client did not offer (its connection is dropped).
    pub(crate) fn accept(self, mut resp: Response<Incoming>) -> Result<Response<ProxyBody>, ()> {
        let chosen = resp.headers().get(UPGRADE).cloned().ok_or(())?;
        if !offered_one(&self.protocol, &chosen) {
            return Err(());
        }
        let upstream = hyper::upgrade::on(&mut resp);
        let (mut parts, _) = resp.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers);
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(UPGRADE, chosen);
        let Ask { client, hold, .. } = self;
        let idle = Duration::from_millis(hold.limits().tunnel_idle_timeout_ms);
        tokio::spawn(async move {
            let (Ok(client), Ok(upstream)) = tokio::join!(client, upstream) else {
                return;
            };
            let moved = AtomicU64::new(0);
            let mut client = Counted::new(TokioIo::new(client), &moved);
            let mut upstream = Counted::new(TokioIo::new(upstream), &moved);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                () = quiet_for(&moved, idle) => {}
                () = hold.proxy_gone() => {}
            }
        });
        Ok(Response::from_parts(parts, ProxyBody::local(Bytes::new())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_compare_by_name_without_case_or_version() {
        assert!(same_protocol("websocket", b"WebSocket"));
        assert!(same_protocol("spdy", b"SPDY/3.1"));
        assert!(!same_protocol("websocket", b"h2c"));
        assert!(!same_protocol("websocket", b"websockets"));
    }

    #[test]
    fn only_allowed_offers_and_offered_answers_pass() {
        let v = HeaderValue::from_static;
        let allowed = ["websocket".to_owned()];
        assert!(all_allowed(&v("websocket"), &allowed));
        assert!(all_allowed(&v("WebSocket/13"), &allowed));
        assert!(!all_allowed(&v("h2c"), &allowed));
        assert!(!all_allowed(&v("websocket, h2c"), &allowed));
        assert!(!all_allowed(&v(" , "), &allowed));
        assert!(offered_one(&v("websocket"), &v("WEBSOCKET")));
        assert!(!offered_one(&v("websocket"), &v("h2c")));
        assert!(!offered_one(&v("websocket"), &v("websocket, h2c")));
        assert!(!offered_one(&v("websocket"), &v("")));
    }
}
