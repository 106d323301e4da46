//! Signals a call carries on the wire, read and written in one place for every driver (the
//! tower layer, both proxy engines, the simulator): the caller's **deadline** and the server's
//! **pushback**. Plain functions of bytes and numbers, as [`crate::http`]: no HTTP library.
//!
//! * **Deadlines.** gRPC's `grpc-timeout` ([`parse_grpc_timeout`], [`GrpcTimeout`]: at most
//!   eight digits and a unit, `H`, `M`, `S`, `m`, `u`, `n`) and, for plain HTTP, a header of
//!   whole milliseconds that a service names (`x-request-timeout`, as Envoy's
//!   `x-envoy-upstream-rq-timeout-ms`: [`parse_timeout_ms`]). A call's deadline is the
//!   shorter of its route's and the caller's ([`Attempts::limit`](crate::Attempts::limit)); what
//!   is left of it when an attempt starts is what the upstream receives, so a deadline counts
//!   down hop by hop (Dubbo's `timeout-countdown`, gRPC's deadline propagation).
//! * **Pushback.** `429` and `503` with `Retry-After` (seconds or an HTTP date, RFC 9110
//!   §10.2.3) and gRPC's `grpc-retry-pushback-ms` (gRFC A6) ask the client to stay away for a
//!   while ([`pushback`]). The endpoint is passed over by picks until then
//!   ([`EndpointStats::push_back`](crate::EndpointStats::push_back), the
//!   [`Availability`](crate::Availability) filter), and a retry of the call waits that long
//!   before it is sent instead of hammering the next endpoint at once
//!   ([`Attempts::pushed_back`](crate::Attempts::pushed_back)); a negative or malformed
//!   `grpc-retry-pushback-ms` means "do not retry" (gRFC A6).

use std::time::{Duration, UNIX_EPOCH};

use crate::stats::EndpointStats;
use crate::time::Timestamp;

/// The longest an endpoint is passed over after one pushback, however long it asked for: a
/// misconfigured `Retry-After: 86400` must not take a server out of rotation for a day.
pub const MAX_ENDPOINT_PUSHBACK: Duration = Duration::from_secs(60);

/// The longest a retry waits for a pushback when the call has no deadline of its own; a
/// longer pushback ends the call with the answer that carried it.
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(10);

/// What a server's answer asked of the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushback {
    /// Stay away this long (from the moment the answer arrived).
    Wait(Duration),
    /// Do not retry the call at all (a negative or malformed `grpc-retry-pushback-ms`).
    Stop,
}

// === impl Pushback ===

impl Pushback {
    /// Record it against the endpoint whose answer it was, at `now`: picks pass the endpoint
    /// over for [`endpoint_wait`](Self::endpoint_wait).
    pub fn record(self, stats: &EndpointStats, now: Timestamp) {
        if let Some(wait) = self.endpoint_wait() {
            stats.push_back(now, wait);
        }
    }

    /// How long the endpoint is passed over: the wait, at most [`MAX_ENDPOINT_PUSHBACK`]
    /// (`Stop` asks nothing of the endpoint's other calls).
    pub fn endpoint_wait(self) -> Option<Duration> {
        match self {
            Pushback::Wait(d) if !d.is_zero() => Some(d.min(MAX_ENDPOINT_PUSHBACK)),
            _ => None,
        }
    }
}

/// The pushback an answer carries: `grpc-retry-pushback-ms` (any status: gRPC sends it in
/// trailers with a failing `grpc-status`) wins over `Retry-After`, which counts on `429` and
/// `503` only. `now` (lbkit's clock reads Unix time) dates an HTTP-date `Retry-After`; a date
/// in the past is no wait.
///
/// ```
/// use std::time::Duration;
/// use lbkit_core::{signal::{pushback, Pushback}, Timestamp};
/// let now = Timestamp::ZERO;
/// assert_eq!(pushback(503, Some(b"2"), None, now), Some(Pushback::Wait(Duration::from_secs(2))));
/// assert_eq!(pushback(200, Some(b"2"), None, now), None);
/// assert_eq!(pushback(200, None, Some(b"150"), now), Some(Pushback::Wait(Duration::from_millis(150))));
/// assert_eq!(pushback(200, None, Some(b"-1"), now), Some(Pushback::Stop));
/// ```
pub fn pushback(
    status: u16,
    retry_after: Option<&[u8]>,
    grpc_pushback_ms: Option<&[u8]>,
    now: Timestamp,
) -> Option<Pushback> {
    if let Some(ms) = grpc_pushback_ms {
        return Some(match parse_u64(trim(ms)) {
            Some(ms) => Pushback::Wait(Duration::from_millis(ms)),
            None => Pushback::Stop,
        });
    }
    if !matches!(status, 429 | 503) {
        return None;
    }
    parse_retry_after(retry_after?, now).map(Pushback::Wait)
}

/// A `Retry-After` value: delay-seconds, or an HTTP date (its distance from `now`, zero
/// when past). `None` when it is neither.
///
/// ```
/// use std::time::Duration;
/// use lbkit_core::{signal::parse_retry_after, Timestamp};
/// let now = Timestamp::from_millis(784_111_770_000);
/// assert_eq!(parse_retry_after(b"120", now), Some(Duration::from_secs(120)));
/// assert_eq!(parse_retry_after(b"Sun, 06 Nov 1994 08:49:37 GMT", now), Some(Duration::from_secs(7)));
/// assert_eq!(parse_retry_after(b"soon", now), None);
/// ```
pub fn parse_retry_after(value: &[u8], now: Timestamp) -> Option<Duration> {
    let value = trim(value);
    if let Some(secs) = parse_u64(value) {
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(std::str::from_utf8(value).ok()?).ok()?;
    let wall_now = UNIX_EPOCH + Duration::from_nanos(now.as_nanos());
    Some(date.duration_since(wall_now).unwrap_or(Duration::ZERO))
}

/// A `grpc-timeout` value (gRPC's HTTP/2 protocol: `TimeoutValue TimeoutUnit`, at most eight
/// digits; units `H`ours, `M`inutes, `S`econds, `m`illiseconds, `u` microseconds,
/// `n`anoseconds). `None` when malformed.
///
/// ```
/// use std::time::Duration;
/// use lbkit_core::signal::parse_grpc_timeout;
/// assert_eq!(parse_grpc_timeout(b"250m"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
/// assert_eq!(parse_grpc_timeout(b"123456789S"), None); // nine digits
/// assert_eq!(parse_grpc_timeout(b"5"), None);
/// ```
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n = parse_u64(digits)?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A deadline header of whole milliseconds (`x-request-timeout: 250`). `None` when it is not
/// a plain number.
///
/// ```
/// use std::time::Duration;
/// use lbkit_core::signal::parse_timeout_ms;
/// assert_eq!(parse_timeout_ms(b" 250 "), Some(Duration::from_millis(250)));
/// assert_eq!(parse_timeout_ms(b"1s"), None);
/// ```
pub fn parse_timeout_ms(value: &[u8]) -> Option<Duration> {
    parse_u64(trim(value)).map(Duration::from_millis)
}

/// A `grpc-timeout` value for a duration, in the finest unit that fits eight digits (rounded
/// up, so the upstream never gets more time than is left), without allocating.
///
/// ```
/// use std::time::Duration;
/// use lbkit_core::signal::GrpcTimeout;
/// assert_eq!(GrpcTimeout::new(Duration::from_millis(250)).as_str(), "250000u");
/// assert_eq!(GrpcTimeout::new(Duration::from_secs(3600 * 24)).as_str(), "86400000m");
/// assert_eq!(GrpcTimeout::new(Duration::ZERO).as_str(), "0n");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcTimeout {
    buf: [u8; 9],
    len: u8,
}

// === impl GrpcTimeout ===

impl GrpcTimeout {
    /// `left` in gRPC's encoding.
    pub fn new(left: Duration) -> Self {
        const MAX: u128 = 99_999_999;
        const UNITS: [(u128, u8); 6] = [
            (1, b'n'),
            (1_000, b'u'),
            (1_000_000, b'm'),
            (1_000_000_000, b'S'),
            (60_000_000_000, b'M'),
            (3_600_000_000_000, b'H'),
        ];
        let nanos = left.as_nanos();
        let (n, unit) = UNITS
            .iter()
            .map(|&(per, unit)| (nanos.div_ceil(per), unit))
            .find(|&(n, _)| n <= MAX)
            .unwrap_or((MAX, b'H'));
        let mut buf = [0u8; 9];
        let mut digits = [0u8; 8];
        let mut len = 0;
        let mut rest = n;
        loop {
            digits[len] = b'0' + (rest % 10) as u8;
            len += 1;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        for (i, d) in digits[..len].iter().rev().enumerate() {
            buf[i] = *d;
        }
        buf[len] = unit;
        GrpcTimeout {
            buf,
            len: len as u8 + 1,
        }
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and a unit letter were written.
        std::str::from_utf8(self.as_bytes()).unwrap_or("0n")
    }

    /// The header value's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

fn trim(v: &[u8]) -> &[u8] {
    v.trim_ascii()
}

/// A plain decimal number (digits only, no sign), `None` on overflow.
fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grpc_timeout_units_and_limits() {
        for (v, d) in [
            ("1n", Duration::from_nanos(1)),
            ("99999999u", Duration::from_micros(99_999_999)),
            ("2S", Duration::from_secs(2)),
            ("3M", Duration::from_secs(180)),
            ("0m", Duration::ZERO),
        ] {
            assert_eq!(parse_grpc_timeout(v.as_bytes()), Some(d), "{v}");
        }
        for v in ["", "m", "1x", "-1m", "1.5S", " 1S", "1S "] {
            assert_eq!(parse_grpc_timeout(v.as_bytes()), None, "{v:?}");
        }
    }

    #[test]
    fn pushback_rules() {
        let now = Timestamp::from_millis(1_000_000);
        assert_eq!(
            pushback(429, Some(b"3"), None, now),
            Some(Pushback::Wait(Duration::from_secs(3)))
        );
        assert_eq!(pushback(502, Some(b"3"), None, now), None);
        assert_eq!(pushback(503, Some(b"later"), None, now), None);
        assert_eq!(pushback(503, None, None, now), None);
        // grpc-retry-pushback-ms wins, and a malformed one stops retries.
        assert_eq!(
            pushback(503, Some(b"3"), Some(b"20"), now),
            Some(Pushback::Wait(Duration::from_millis(20)))
        );
        assert_eq!(pushback(200, None, Some(b"x"), now), Some(Pushback::Stop));
        // A date in the past is no wait.
        assert_eq!(
            parse_retry_after(b"Thu, 01 Jan 1970 00:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            Pushback::Wait(Duration::from_secs(86_400)).endpoint_wait(),
            Some(MAX_ENDPOINT_PUSHBACK)
        );
        assert_eq!(Pushback::Wait(Duration::ZERO).endpoint_wait(), None);
        assert_eq!(Pushback::Stop.endpoint_wait(), None);
    }

    proptest! {
        /// What is written parses back, never to less time than was left, and to at most the
        /// next unit's rounding more.
        #[test]
        fn grpc_timeout_round_trips(nanos in 0u64..u64::MAX) {
            let left = Duration::from_nanos(nanos);
            let t = GrpcTimeout::new(left);
            prop_assert!(t.as_bytes().len() <= 9);
            let back = parse_grpc_timeout(t.as_bytes()).unwrap();
            prop_assert!(back >= left);
            prop_assert!(back - left < Duration::from_secs(3600));
            if left < Duration::from_millis(99) {
                prop_assert_eq!(back, left);
            }
        }

        #[test]
        fn parsers_never_panic(v in proptest::collection::vec(any::<u8>(), 0..24)) {
            let _ = parse_grpc_timeout(&v);
            let _ = parse_timeout_ms(&v);
            let _ = parse_retry_after(&v, Timestamp::ZERO);
            let _ = pushback(503, Some(&v), Some(&v), Timestamp::ZERO);
        }
    }
}
