//! A tower `Pool` following the providers of a Dubbo interface in ZooKeeper: the library's own
//! path from a registry to picks, the one `lbkit proxy` runs, without the proxy.
//! `scripts/bench-scale.py zk --via pool` times changes through it, and `tests/zk_pool.rs` runs
//! it against a real ZooKeeper.
//!
//! ```sh
//! eval "$(scripts/zookeeper.sh start)"
//! LBKIT_LOG=warn,lbkit_discovery::controller=debug \
//!   cargo run --release -p lbkit --example zk_pool -- "$LBKIT_ZK" com.acme.Scale round-robin
//! ```
//!
//! With that `LBKIT_LOG`, each set the pool publishes is logged once its strategy has prepared
//! it, with the endpoints it changed. Ctrl-C stops it.

use lbkit::discovery::zookeeper::{Layout, ServicePath, ZkConfig, ZkSource};
use lbkit::strategy::catalog::{build, Params};
use lbkit::Endpoint;
use lbkit_tower::{Pool, PoolBuilder};

/// A pool picking with `strategy` among the providers of `interface` (Dubbo's layout under
/// `/dubbo`) in the ZooKeeper at `servers`. Its services are the endpoints' addresses: this
/// example calls nothing, a real client makes a connection there (see `lbkit_tower::Pool`).
///
/// # Errors
/// A malformed server list or interface, or an unknown strategy.
///
/// # Panics
/// Outside a tokio runtime.
pub fn follow(servers: &str, interface: &str, strategy: &str) -> anyhow::Result<Pool<String>> {
    let zk = ZkConfig::new(servers);
    zk.validate()?;
    let path = ServicePath::new("dubbo", interface, Layout::Dubbo)?;
    let (updates, _status) = ZkSource::new(zk, path).spawn();
    let strategy = build(strategy, Params::new())?;
    let make = |e: &Endpoint| e.address().to_owned();
    Ok(PoolBuilder::new(strategy).spawn(updates, make))
}

#[allow(dead_code)] // the test includes this file for `follow` alone
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let log = std::env::var("LBKIT_LOG").unwrap_or_else(|_| "warn".into());
    let targets: tracing_subscriber::filter::Targets = log.parse()?;
    {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::TRACE)
            .with_target(false)
            .finish()
            .with(targets)
            .try_init()?;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [servers, interface, rest @ ..] = args.as_slice() else {
        eprintln!("usage: zk_pool ZK_HOST:PORT INTERFACE [STRATEGY]");
        std::process::exit(2);
    };
    let strategy = rest.first().map_or("round-robin", String::as_str);
    let pool = follow(servers, interface, strategy).unwrap_or_else(|e| {
        eprintln!("zk_pool: {e:#}");
        std::process::exit(2);
    });
    eprintln!("zk_pool: following /dubbo/{interface}/providers with {strategy}");
    tokio::signal::ctrl_c().await?;
    drop(pool);
    Ok(())
}
