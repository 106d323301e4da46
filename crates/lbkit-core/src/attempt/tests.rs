use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::{EndpointIdx, EndpointSpec, ManualClock, Picker, Snapshot};

/// Counts deposits and withdrawals; refuses withdrawals once `allow` are spent.
#[derive(Default)]
struct Counting {
    deposits: AtomicU32,
    withdrawals: AtomicU32,
    allow: u32,
}

impl Counting {
    fn allowing(allow: u32) -> Self {
        Counting {
            allow,
            ..Counting::default()
        }
    }
}

impl Budget for Counting {
    fn deposit(&self, _: Timestamp) {
        self.deposits.fetch_add(1, Relaxed);
    }
    fn withdraw(&self, _: Timestamp) -> bool {
        if self.withdrawals.load(Relaxed) >= self.allow {
            return false;
        }
        self.withdrawals.fetch_add(1, Relaxed);
        true
    }
}

/// Picks the first eligible endpoint not tried, or the first one when all were tried.
struct FirstUntried;
struct FirstUntriedPicker(Arc<Snapshot>);

impl Picker for FirstUntriedPicker {
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let s = &self.0;
        let e = s.eligible();
        Ok(e.iter()
            .copied()
            .find(|&i| !cx.tried.contains(s.endpoint(i)))
            .unwrap_or(e[0]))
    }
}

impl Strategy for FirstUntried {
    type Picker = FirstUntriedPicker;
    fn name(&self) -> &str {
        "first-untried"
    }
    fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> FirstUntriedPicker {
        FirstUntriedPicker(s.clone())
    }
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_millis(1_000 + ms)
}

fn policy(retries: u32) -> AttemptPolicy {
    AttemptPolicy {
        retries,
        per_try: None,
        overall: None,
    }
}

#[test]
fn the_table() {
    use FailureKind::*;
    use RetryWhen::*;
    let rows = [
        (Observed::ConnectFailed, Outcome::Failure(Connect), Always),
        (
            Observed::ResetBeforeResponse,
            Outcome::Failure(Other),
            Idempotent,
        ),
        (Observed::ResetAfterResponse, Outcome::Failure(Other), Never),
        (Observed::Timeout, Outcome::Failure(Timeout), Idempotent),
        (Observed::Status(500), Outcome::Failure(Server), Idempotent),
        (Observed::Status(502), Outcome::Failure(Server), Idempotent),
        (Observed::Status(503), Outcome::Failure(Server), Idempotent),
        (Observed::Status(504), Outcome::Failure(Timeout), Idempotent),
        (Observed::Status(429), Outcome::Success, Never),
        (Observed::Status(404), Outcome::Success, Never),
        (Observed::Status(200), Outcome::Success, Never),
        (Observed::Status(101), Outcome::Success, Never),
        (Observed::Done, Outcome::Success, Never),
        (Observed::ClientGone, Outcome::Cancelled, Never),
    ];
    for (observed, outcome, retry) in rows {
        assert_eq!(
            observed.classify(),
            Classified { outcome, retry },
            "{observed:?}"
        );
    }
    // Typed classifications follow the same rows.
    assert_eq!(
        Classified::error(Outcome::Failure(Connect), Some(false)),
        Observed::ConnectFailed.classify()
    );
    assert_eq!(
        Classified::error(Outcome::Failure(Timeout), None),
        Observed::Timeout.classify()
    );
    assert_eq!(
        Classified::answer(Outcome::Failure(Server)),
        Observed::Status(503).classify()
    );
    assert_eq!(
        Classified::answer(Outcome::Success),
        Observed::Status(200).classify()
    );
}

#[test]
fn every_call_that_may_retry_deposits_once_and_only_retries_withdraw() {
    let budget = Counting::allowing(10);
    let clock = Clock::System;
    for _ in 0..3 {
        let mut call = Attempts::start(policy(2), &budget, true, true, t(0));
        let ok = Observed::Status(200).classify();
        assert_eq!(call.after(ok, &budget, &clock), Next::Answer(Stop::Final));
    }
    assert_eq!(budget.deposits.load(Relaxed), 3);
    assert_eq!(budget.withdrawals.load(Relaxed), 0);
    let mut call = Attempts::start(policy(2), &budget, true, true, t(0));
    assert_eq!(
        call.after(Observed::Status(502).classify(), &budget, &clock),
        Next::Retry
    );
    assert_eq!(
        (
            budget.deposits.load(Relaxed),
            budget.withdrawals.load(Relaxed)
        ),
        (4, 1)
    );
}

#[test]
fn retries_need_attempts_a_copy_idempotency_time_and_budget() {
    let clock = Clock::Manual(Arc::new(ManualClock::new(t(0))));
    let snap = Arc::new(Snapshot::from_specs(
        (0..4)
            .map(|i| EndpointSpec::new(format!("h{i}:1")))
            .collect(),
        t(0),
    ));
    let balancer = Balancer::new(FirstUntried, snap, t(0));
    let mut rng = FastRng::seed_from_u64(1);
    let budget = Counting::allowing(100);
    let fail = Observed::Status(503).classify();

    // Idempotent, two retries: three attempts on three endpoints, then no attempts left.
    let mut call = Attempts::start(policy(2), &budget, true, true, t(0));
    let mut seen = Vec::new();
    loop {
        let g = call
            .pick(&balancer, t(0), Route::default(), &mut rng)
            .expect("pick");
        seen.push(g.endpoint().address().to_owned());
        g.finish_at(fail.outcome, t(0));
        match call.after(fail, &budget, &clock) {
            Next::Retry => continue,
            Next::Answer(stop) => {
                assert_eq!(stop, Stop::NoAttemptsLeft);
                break;
            }
        }
    }
    assert_eq!(seen, ["h0:1", "h1:1", "h2:1"]);
    assert_eq!(budget.withdrawals.load(Relaxed), 2);

    // Not idempotent: a 503 is final, a refused connection is retried.
    let mut call = Attempts::start(policy(2), &budget, false, true, t(0));
    let g = call
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .expect("pick");
    g.finish_at(fail.outcome, t(0));
    assert_eq!(call.after(fail, &budget, &clock), Next::Answer(Stop::Final));
    let refused = Observed::ConnectFailed.classify();
    assert_eq!(call.after(refused, &budget, &clock), Next::Retry);

    // No copy of the request.
    let mut call = Attempts::start(policy(2), &budget, true, false, t(0));
    let g = call
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .expect("pick");
    g.finish_at(fail.outcome, t(0));
    assert_eq!(
        call.after(fail, &budget, &clock),
        Next::Answer(Stop::NotReplayable)
    );

    // The budget is spent.
    let empty = Counting::allowing(0);
    let mut call = Attempts::start(policy(2), &empty, true, true, t(0));
    let g = call
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .expect("pick");
    g.finish_at(fail.outcome, t(0));
    assert_eq!(
        call.after(fail, &empty, &clock),
        Next::Answer(Stop::BudgetExhausted)
    );
    assert_eq!(empty.deposits.load(Relaxed), 1);
}

#[test]
fn a_retry_goes_to_an_untried_endpoint_or_nowhere() {
    let snap = Arc::new(Snapshot::from_specs(
        vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")],
        t(0),
    ));
    let balancer = Balancer::new(FirstUntried, snap, t(0));
    let budget = Counting::allowing(100);
    let mut rng = FastRng::seed_from_u64(1);
    let mut call = Attempts::start(policy(5), &budget, true, true, t(0));
    for want in ["a:1", "b:1"] {
        let g = call
            .pick(&balancer, t(0), Route::default(), &mut rng)
            .expect("pick");
        assert_eq!(g.endpoint().address(), want);
        g.finish_at(Outcome::Success, t(0));
    }
    assert_eq!(call.next_attempt(), 2);
    let err = call
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .unwrap_err();
    assert_eq!(err, PickError::AllTried);
    assert_eq!(call.begun(), 2, "a refused pick begins nothing");
    for e in balancer.snapshot().endpoints() {
        assert_eq!(e.stats().in_flight(), 0);
        assert_eq!(e.stats().cancellations(), 0, "no guard was made for it");
    }
}

// `retry` is `after` plus the pick, at the moment the decision read the clock; each way of
// not retrying is the same `Stop` as `after`'s, and an allowed retry with no endpoint left is
// `AllTried` and withdraws nothing from the budget.
#[test]
fn retry_decides_as_after_does_then_picks_at_the_decision_time() {
    let snap = Arc::new(Snapshot::from_specs(
        vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")],
        t(0),
    ));
    let balancer = Balancer::new(FirstUntried, snap, t(0));
    let (clock, _hand) = Clock::manual(t(5));
    let budget = Counting::allowing(100);
    let mut rng = FastRng::seed_from_u64(1);
    let mut call = Attempts::start(policy(5), &budget, true, true, t(0));
    let first = call
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .expect("pick");
    let fail = Observed::Status(503).classify();
    let (second, at) = call
        .retry(fail, &budget, &balancer, &clock, Route::default(), &mut rng)
        .expect("a retry");
    assert_eq!((second.endpoint().address(), at), ("b:1", t(5)));
    first.finish_at(fail.outcome, at);
    assert_eq!(budget.withdrawals.load(Relaxed), 1);
    let again = call.retry(fail, &budget, &balancer, &clock, Route::default(), &mut rng);
    assert_eq!(again.err(), Some(Stop::AllTried));
    assert_eq!(
        budget.withdrawals.load(Relaxed),
        1,
        "a retry with nowhere to go spends no budget"
    );
    second.finish_at(fail.outcome, at);
    // Not retried: the same reasons as `after`.
    let ok = Observed::Status(200).classify();
    let mut fresh = Attempts::start(policy(5), &budget, true, true, t(0));
    let g = fresh
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .expect("pick");
    let got = fresh.retry(ok, &budget, &balancer, &clock, Route::default(), &mut rng);
    assert_eq!(got.err(), Some(Stop::Final));
    assert_eq!(fresh.after(ok, &budget, &clock), Next::Answer(Stop::Final));
    g.finish_at(ok.outcome, t(0));
    let spent = Counting::allowing(0);
    let mut poor = Attempts::start(policy(5), &spent, true, true, t(0));
    let g = poor
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .expect("pick");
    let got = poor.retry(fail, &spent, &balancer, &clock, Route::default(), &mut rng);
    assert_eq!(got.err(), Some(Stop::BudgetExhausted));
    assert_eq!(poor.begun(), 1, "a refused retry begins nothing");
    g.finish_at(fail.outcome, t(0));
}

#[test]
fn the_attempt_deadline_sits_inside_the_overall_one() {
    let budget = Counting::allowing(100);
    let both = AttemptPolicy {
        retries: 3,
        per_try: Some(Duration::from_millis(300)),
        overall: Some(Duration::from_millis(1_000)),
    };
    let call = Attempts::start(both, &budget, true, true, t(0));
    assert_eq!(call.timeout(t(0)), Some(Duration::from_millis(300)));
    assert_eq!(call.timeout(t(800)), Some(Duration::from_millis(200)));
    assert_eq!(call.timeout(t(1_500)), Some(Duration::ZERO));
    assert!(!call.deadline_passed(t(999)) && call.deadline_passed(t(1_000)));
    let per_try_only = AttemptPolicy {
        overall: None,
        ..both
    };
    let call = Attempts::start(per_try_only, &budget, true, true, t(0));
    assert_eq!(call.timeout(t(5_000)), Some(Duration::from_millis(300)));
    let none = Attempts::start(policy(1), &budget, true, true, t(0));
    assert_eq!(none.timeout(t(0)), None);
}

#[test]
fn a_timeout_is_retried_only_while_the_overall_deadline_has_time_left() {
    let manual = Arc::new(ManualClock::new(t(0)));
    let clock = Clock::Manual(manual.clone());
    let budget = Counting::allowing(100);
    let p = AttemptPolicy {
        retries: 3,
        per_try: Some(Duration::from_millis(300)),
        overall: Some(Duration::from_millis(1_000)),
    };
    let snap = Arc::new(Snapshot::from_specs(
        (0..4)
            .map(|i| EndpointSpec::new(format!("h{i}:1")))
            .collect(),
        t(0),
    ));
    let balancer = Balancer::new(FirstUntried, snap, t(0));
    let mut rng = FastRng::seed_from_u64(1);
    let timeout = Observed::Timeout.classify();
    let mut call = Attempts::start(p, &budget, true, true, t(0));
    let g = call
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .expect("pick");
    manual.set(t(300));
    g.finish_at(timeout.outcome, t(300));
    assert_eq!(
        call.after(timeout, &budget, &clock),
        Next::Retry,
        "per-try timeout"
    );
    let g = call
        .pick(&balancer, t(300), Route::default(), &mut rng)
        .expect("pick");
    manual.set(t(1_000));
    g.finish_at(timeout.outcome, t(1_000));
    assert_eq!(
        call.after(timeout, &budget, &clock),
        Next::Answer(Stop::DeadlinePassed)
    );
    // A timeout of a request that is not idempotent is final.
    let mut call = Attempts::start(p, &budget, false, true, t(0));
    let g = call
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .expect("pick");
    g.finish_at(timeout.outcome, t(0));
    assert_eq!(
        call.after(timeout, &budget, &clock),
        Next::Answer(Stop::Final)
    );
}

#[test]
fn the_state_is_small_and_allocation_free() {
    // A driver keeps it in its future for the whole call (200 bytes since it carries the
    // request's tracing decision, 8 of them; 208 with the last answer's pushback).
    assert!(
        std::mem::size_of::<Attempts>() <= 208,
        "{}",
        std::mem::size_of::<Attempts>()
    );
    fn copy<T: Copy + Send + Sync + 'static>() {}
    copy::<Attempts>();
}

#[test]
fn a_callers_deadline_cuts_every_attempt_and_stops_retries() {
    let budget = Counting::allowing(10);
    let with_overall = AttemptPolicy {
        retries: 3,
        per_try: Some(Duration::from_millis(400)),
        overall: Some(Duration::from_secs(5)),
    };
    let mut call = Attempts::start(with_overall, &budget, true, true, t(0));
    call.limit(Duration::from_millis(500));
    assert_eq!(call.timeout(t(0)), Some(Duration::from_millis(400)));
    assert_eq!(call.timeout(t(300)), Some(Duration::from_millis(200)));
    let (clock, hand) = Clock::manual(t(500));
    let c = Observed::Timeout.classify();
    assert_eq!(
        call.after(c, &budget, &clock),
        Next::Answer(Stop::DeadlinePassed)
    );
    hand.set(t(499));
    assert_eq!(call.after(c, &budget, &clock), Next::Retry);
    // Without a route deadline the caller's is the call's.
    let mut bare = Attempts::resume(policy(1), true, true, t(0));
    bare.limit(Duration::from_millis(50));
    assert_eq!(bare.timeout(t(20)), Some(Duration::from_millis(30)));
    assert!(bare.deadline_passed(t(50)));
}

#[test]
fn a_pushback_delays_the_retry_or_ends_the_call() {
    let budget = Counting::allowing(10);
    let (clock, _hand) = Clock::manual(t(0));
    let c = Observed::Status(503).classify();
    let deadline = AttemptPolicy {
        retries: 2,
        per_try: None,
        overall: Some(Duration::from_millis(1_000)),
    };
    let mut call = Attempts::start(deadline, &budget, true, true, t(0));
    call.pushed_back(Pushback::Wait(Duration::from_millis(200)));
    assert_eq!(call.may_retry(c, &clock), Ok(t(0)));
    assert_eq!(call.retry_wait(), Duration::from_millis(200));
    // A wait that outlasts the deadline: answer now.
    call.pushed_back(Pushback::Wait(Duration::from_millis(1_000)));
    assert_eq!(call.may_retry(c, &clock), Err(Stop::DeadlinePassed));
    call.pushed_back(Pushback::Stop);
    assert_eq!(
        call.after(c, &budget, &clock),
        Next::Answer(Stop::PushedBack)
    );
    // Without a deadline, up to MAX_RETRY_WAIT.
    let mut open = Attempts::start(policy(2), &budget, true, true, t(0));
    open.pushed_back(Pushback::Wait(crate::signal::MAX_RETRY_WAIT));
    assert!(open.may_retry(c, &clock).is_ok());
    open.pushed_back(Pushback::Wait(crate::signal::MAX_RETRY_WAIT * 2));
    assert_eq!(open.may_retry(c, &clock), Err(Stop::PushedBack));
    // The next attempt starts clean.
    let snap = Arc::new(Snapshot::from_specs(
        vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")],
        t(0),
    ));
    let balancer = Balancer::new(FirstUntried, snap, t(0));
    let mut rng = FastRng::seed_from_u64(1);
    let g = open
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .unwrap();
    assert_eq!(open.retry_wait(), Duration::ZERO);
    g.finish(Outcome::Success);
}

#[test]
fn a_hedge_goes_to_an_untried_endpoint_and_draws_on_the_budget() {
    let snap = Arc::new(Snapshot::from_specs(
        vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")],
        t(0),
    ));
    let balancer = Balancer::new(FirstUntried, snap, t(0));
    let mut rng = FastRng::seed_from_u64(3);
    let budget = Counting::allowing(1);
    let mut call = Attempts::start(policy(2), &budget, true, true, t(0));
    let first = call
        .pick(&balancer, t(0), Route::default(), &mut rng)
        .unwrap();
    assert!(call.may_hedge(t(5)));
    let hedge = call
        .hedge(&budget, &balancer, t(5), Route::default(), &mut rng)
        .unwrap();
    assert_ne!(hedge.endpoint().key(), first.endpoint().key());
    assert_eq!((call.begun(), budget.withdrawals.load(Relaxed)), (2, 1));
    // Nowhere left to go: no budget spent.
    let none = call.hedge(&budget, &balancer, t(6), Route::default(), &mut rng);
    assert_eq!(none.err(), Some(Stop::AllTried));
    assert_eq!(budget.withdrawals.load(Relaxed), 1);
    // The winner finishes, the other attempt is cancelled: not its endpoint's failure.
    hedge.finish_at(Outcome::Success, t(7));
    first.finish_at(Outcome::Cancelled, t(7));
    assert_eq!(balancer.snapshot().endpoints()[0].stats().failures(), 0);
    // A request that may not be sent twice is never hedged.
    let once = Attempts::start(policy(2), &budget, false, true, t(0));
    assert!(!once.may_hedge(t(5)));
}

#[test]
fn a_pushback_waited_out_is_not_counted_twice() {
    let budget = Counting::allowing(10);
    let (clock, hand) = Clock::manual(t(0));
    let c = Observed::Status(503).classify();
    let deadline = AttemptPolicy {
        retries: 2,
        per_try: None,
        overall: Some(Duration::from_millis(1_000)),
    };
    let mut call = Attempts::start(deadline, &budget, true, true, t(0));
    call.pushed_back(Pushback::Wait(Duration::from_millis(600)));
    assert!(call.may_retry(c, &clock).is_ok());
    // The driver waits 600 ms; the retry's decision then reads the clock once more.
    hand.set(t(600));
    assert_eq!(
        call.may_retry(c, &clock),
        Err(Stop::DeadlinePassed),
        "counted twice"
    );
    call.waited();
    assert_eq!(call.may_retry(c, &clock), Ok(t(600)));
    // A "do not retry" stays.
    call.pushed_back(Pushback::Stop);
    call.waited();
    assert_eq!(call.may_retry(c, &clock), Err(Stop::PushedBack));
}
