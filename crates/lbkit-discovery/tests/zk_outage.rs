//! Outages against real ZooKeeper servers: a provider's session expiry, a server restart under
//! load, and the registry cache when the server is down at start-up.
#![cfg(feature = "zookeeper")]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{entries, has, unique, wait_status, OwnZk, Pipeline};
use lbkit_core::{Clock, FastRng, PickContext};
use lbkit_discovery::zookeeper::{
    expire_session, read_cache, Layout, Provider, ServicePath, ZkConfig, ZkRegistration, ZkSource,
};
use lbkit_discovery::ControllerConfig;

fn provider(address: &str) -> Provider {
    Provider::new(address)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_removes_the_provider_and_re_registration_brings_it_back() {
    let zk = ZkConfig::new(require_zk!());
    let path = ServicePath::new("dubbo", &unique("expiry"), Layout::Dubbo).unwrap();
    let mut pipeline = Pipeline::start(
        ZkSource::new(zk.clone(), path.clone()),
        ControllerConfig::default(),
    );
    let stay = ZkRegistration::spawn(zk.clone(), path.clone(), provider("10.5.0.1:20880")).unwrap();
    // Re-registration waits a moment after expiry, so the consumer sees the gap.
    let delay = Duration::from_millis(500);
    let victim = ZkRegistration::spawn_with_delay(
        zk.clone(),
        path.clone(),
        provider("10.5.0.2:20880"),
        delay,
    )
    .unwrap();
    pipeline.until("both providers", |s| s.len() == 2).await;
    wait_status(&mut victim.status(), "registered", |s| s.registered).await;
    let session = victim.session().expect("registered");

    expire_session(&zk, session.clone()).await.expect("expire");

    pipeline
        .until("the expired provider is gone", |s| {
            !has(s, "10.5.0.2:20880")
        })
        .await;
    let back = pipeline
        .until("re-registered", |s| has(s, "10.5.0.2:20880"))
        .await;
    assert_eq!(back.len(), 2);
    let st = wait_status(&mut victim.status(), "second registration", |s| {
        s.registrations == 2
    })
    .await;
    assert!(st.registered);
    assert_ne!(
        victim.session().map(|s| s.id()),
        Some(session.id()),
        "a new session"
    );
    let since_both = pipeline.history.iter().skip_while(|s| s.len() < 2);
    assert!(since_both.clone().count() >= 3, "both, one, both again");
    assert!(since_both.into_iter().all(|s| has(s, "10.5.0.1:20880")));
    victim.deregister().await;
    stay.deregister().await;
}

/// Picks on a thread until stopped; counts picks and failures.
struct Picker {
    stop: Arc<AtomicBool>,
    picks: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    smallest: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl Picker {
    fn start(balancer: Arc<lbkit_core::Balancer<common::Rr>>) -> Picker {
        let stop = Arc::new(AtomicBool::new(false));
        let picks = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let smallest = Arc::new(AtomicUsize::new(usize::MAX));
        let (s, p, f, m) = (
            stop.clone(),
            picks.clone(),
            failures.clone(),
            smallest.clone(),
        );
        let thread = std::thread::spawn(move || {
            let clock = Clock::System;
            let mut rng = FastRng::seed_from_u64(7);
            // Bounded: stops when told, and after 120 s whatever happens.
            let end = clock.now() + Duration::from_secs(120);
            while !s.load(Ordering::Relaxed) && clock.now() < end {
                let now = clock.now();
                m.fetch_min(balancer.snapshot().len(), Ordering::Relaxed);
                match balancer.pick(&mut PickContext::new(now, &mut rng)) {
                    Ok(guard) => guard.finish(lbkit_core::Outcome::Success),
                    Err(_) => {
                        f.fetch_add(1, Ordering::Relaxed);
                    }
                }
                p.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        Picker {
            stop,
            picks,
            failures,
            smallest,
            thread,
        }
    }

    fn finish(self) -> (u64, u64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("picker thread");
        (
            self.picks.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
            self.smallest.load(Ordering::Relaxed),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_restart_under_load_loses_nothing_and_never_publishes_an_empty_set() {
    let _ = require_zk!(); // the script and its package are there
    let server = OwnZk::start("restart").await;
    let zk = ZkConfig::new(server.addr.clone());
    let path = ServicePath::new("dubbo", &unique("restart"), Layout::Dubbo).unwrap();
    let addrs = ["10.6.0.1:20880", "10.6.0.2:20880", "10.6.0.3:20880"];
    let mut regs = Vec::new();
    for a in addrs {
        regs.push(ZkRegistration::spawn(zk.clone(), path.clone(), provider(a)).unwrap());
    }
    let mut pipeline = Pipeline::start(
        ZkSource::new(zk.clone(), path.clone()),
        ControllerConfig::default(),
    );
    pipeline
        .until("all three providers", |s| s.len() == 3)
        .await;
    let picker = Picker::start(pipeline.balancer.clone());
    let before = pipeline.status.get();

    server.restart().await;

    // The consumer reconnects (same session, or a new one) and lists the directory again.
    wait_status(&mut pipeline.status, "relisted after the restart", |s| {
        s.connected && s.listings > before.listings
    })
    .await;
    for r in &regs {
        wait_status(&mut r.status(), "provider registered", |s| s.registered).await;
    }
    let current = pipeline.balancer.snapshot();
    let (picks, failures, smallest) = picker.finish();
    assert_eq!(entries(&current).len(), 3, "{:?}", entries(&current));
    assert!(picks > 0);
    assert_eq!(failures, 0, "every pick found an endpoint");
    assert_eq!(smallest, 3, "the published set never shrank");
    let since_full = pipeline.history.iter().skip_while(|s| s.len() < 3);
    assert!(since_full.into_iter().all(|s| s.len() == 3));
    for r in regs {
        r.deregister().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_file_serves_the_last_set_when_zookeeper_is_down_at_start() {
    let _ = require_zk!();
    let server = OwnZk::start("cache").await;
    let zk = ZkConfig::new(server.addr.clone());
    let path = ServicePath::new("dubbo", &unique("cache"), Layout::Dubbo).unwrap();
    let cache_dir = common::temp_dir("cache-file");
    let cache = cache_dir.path().join("providers.cache.json");
    let regs = [
        ZkRegistration::spawn(zk.clone(), path.clone(), provider("10.7.0.1:20880")).unwrap(),
        ZkRegistration::spawn(zk.clone(), path.clone(), provider("10.7.0.2:20880")).unwrap(),
    ];
    {
        let mut first = Pipeline::start(
            ZkSource::new(zk.clone(), path.clone()).with_cache(&cache),
            ControllerConfig::default(),
        );
        let s = first.until("both providers", |s| s.len() == 2).await;
        let written = entries(&s);
        wait_status(&mut first.status, "cache written", |st| st.cached == 2).await;
        let saved = read_cache(&cache).unwrap().expect("cache file");
        let saved: Vec<_> = saved
            .iter()
            .map(|s| (s.address.clone(), s.weight))
            .collect();
        assert_eq!(saved, written);
    }
    for r in regs {
        r.deregister().await;
    }
    server.stop().await;

    let mut down = zk.clone();
    down.connect_timeout = Duration::from_secs(1);
    let mut second = Pipeline::start(
        ZkSource::new(down, path.clone()).with_cache(&cache),
        ControllerConfig::default(),
    );
    let s = second.until("the cached set", |_| true).await;
    assert_eq!(
        entries(&s),
        vec![
            ("10.7.0.1:20880".to_owned(), 100),
            ("10.7.0.2:20880".to_owned(), 100)
        ]
    );
    let st = second.status.get();
    assert!(st.from_cache && !st.connected, "{st:?}");
}
