//! A `tracing` span per attempt, with the pool, strategy, endpoint and attempt.

mod support;

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use lbkit_core::Availability;
use lbkit_strategy::RoundRobin;
use lbkit_tower::{BalanceLayer, CloneRequests, PoolBuilder};
use support::*;
use tower::{Layer, Service, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event as TraceEvent, Metadata, Subscriber};

/// Records the fields of every `lbkit.call` span as `k=v` text.
#[derive(Default)]
struct Spans {
    next: AtomicU64,
    #[allow(clippy::disallowed_types)] // test bookkeeping
    seen: std::sync::Mutex<Vec<String>>,
}

struct Fields(Vec<String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.push(format!("{}={:?}", field.name(), value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push(format!("{}={}", field.name(), value));
    }
}

#[derive(Clone)]
struct Shared(Arc<Spans>);

impl Subscriber for Shared {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        if span.metadata().name() == "lbkit.call" {
            let mut f = Fields(Vec::new());
            span.record(&mut f);
            self.0.seen.lock().unwrap().push(f.0.join(" "));
        }
        Id::from_u64(self.0.next.fetch_add(1, SeqCst) + 1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &TraceEvent<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn one_span_per_attempt() {
    let spans = Arc::new(Spans::default());
    let _default = tracing::subscriber::set_default(Shared(spans.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let farm = Farm::new(&["a", "b"]);
        farm.get("a").set(Behaviour::Fail);
        let pool = PoolBuilder::new(RoundRobin::default())
            .name("cart")
            .availability(Availability::OFF)
            .spawn_static(farm.specs(&["a", "b"]), farm.maker());
        let mut svc = BalanceLayer::new()
            .requests(CloneRequests::idempotent())
            .layer(pool);
        assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), "b");
    });
    let seen = spans.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "pool=cart strategy=round-robin endpoint=a attempt=0",
            "pool=cart strategy=round-robin endpoint=b attempt=1",
        ]
    );
}
