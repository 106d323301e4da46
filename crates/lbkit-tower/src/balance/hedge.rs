//! Failover with a hedge (`BalanceLayer::hedge`): the first attempt, and when it has no
//! answer after the hedge delay, a second one on an endpoint not tried yet; the first answer
//! that is not a failure wins and the other attempt is dropped (recorded as cancelled, not as
//! its endpoint's failure). A failure while the other attempt is still out waits for it; the
//! last failure goes on to failover's retries. The rules of the hedge are lbkit-core's
//! `Attempts` (`may_hedge`, the budget's grant once the hedge has an endpoint).

use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use lbkit_core::{Attempts, FastRng, Strategy};
use tower::Service;

use super::cluster::{failover, Again};
use super::Shared;
use crate::error::BoxError;
use crate::policy::{RequestPolicy, ResponsePolicy};
use crate::pool::Selected;

type Output<R, Resp> = <R as ResponsePolicy<Resp>>::Output;

/// Send `req` to `first`; hedge it after `delay` while `attempts` allows, with `spare` (a
/// copy) — then failover from whichever result ends the race.
pub(crate) async fn hedged<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    first: Selected<Svc>,
    req: Req,
    mut spare: Option<Req>,
    mut attempts: Attempts,
    delay: Duration,
) -> Result<Output<R, Svc::Response>, BoxError>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
{
    let mut racing = FuturesUnordered::new();
    racing.push(s.send(first, req, attempts.timeout(attempts.started())));
    let timer = tokio::time::sleep(delay);
    tokio::pin!(timer);
    let mut hedge_due = true;
    loop {
        tokio::select! {
            () = &mut timer, if hedge_due => {
                hedge_due = false;
                if let Some((sel, copy, limit)) = hedge(s, &mut spare, &mut attempts) {
                    racing.push(s.send(sel, copy, limit));
                }
            }
            Some(sent) = racing.next() => {
                if !sent.is_failure() || racing.is_empty() {
                    // The winner, or the last one out: the other attempt (if any) is dropped
                    // with `racing`, which records it as cancelled.
                    drop(racing);
                    return failover(s, sent, spare, attempts).await;
                }
                // A failure while the other attempt may still answer; its pushback holds for
                // a retry after the race (with the other's, the stronger).
                if let Some(p) = sent.pushback() {
                    attempts.pushed_back(p);
                }
                sent.discard();
            }
        }
    }
}

/// The hedge to send: an endpoint not tried yet, picked as a hedge, once `attempts` allows
/// one and the budget grants it, with `spare` (replaced by a new copy for a later retry) and
/// its time limit.
fn hedge<Req, Svc, Q, R, S: Strategy, F>(
    s: &Shared<Svc, Q, R, S, F>,
    spare: &mut Option<Req>,
    attempts: &mut Attempts,
) -> Option<(Selected<Svc>, Req, Option<Duration>)>
where
    Svc: Service<Req> + Clone,
    Svc::Error: Into<BoxError>,
    Q: RequestPolicy<Req>,
{
    let now = s.clock().now();
    if !attempts.may_hedge(now) {
        return None;
    }
    let req = spare.take()?;
    let mut rng = FastRng::seed_from_u64(now.as_nanos() ^ s.next_seed());
    let again = Again {
        attempt: attempts.next_attempt(),
        tried: attempts.tried(),
        trace: attempts.trace(),
        hedge: true,
    };
    let sel: Selected<Svc> = match s.repick(&req, now, again, &mut rng) {
        Ok(sel) => sel,
        Err(_) => {
            *spare = Some(req);
            return None;
        }
    };
    if Attempts::grant(&*s.budget, now).is_err() {
        sel.call.abandon();
        *spare = Some(req);
        return None;
    }
    crate::telemetry::inc(&s.pool.inner.metrics.hedges);
    attempts.begin(sel.call.endpoint());
    *spare = s.requests.replay(&req);
    attempts.set_replayable(spare.is_some());
    Some((sel, req, attempts.timeout(now)))
}
