//! # lbkit-discovery
//!
//! Where endpoints come from, and how they reach a [`Balancer`](lbkit_core::Balancer).
//!
//! * Formats (always available): static lists ([`parse_static_list`]), endpoint files
//!   ([`mod@file`]: TOML, JSON, Dubbo provider URLs) and Dubbo's provider URL ([`dubbo`]).
//! * Sources (feature `runtime`): every source is a stream of
//!   [`Update`](lbkit_core::Update)s (`source`): a static list, a watched file
//!   (`file::FileSource`), ZooKeeper (`zookeeper`, feature `zookeeper`).
//! * The `Controller` (feature `runtime`) consumes a source, rebuilds one snapshot per batch
//!   of updates (endpoints that stay keep their statistics), holds back empty pushes, keeps the
//!   last good snapshot when the source fails, and publishes.
//!
//! ```
//! use lbkit_core::Timestamp;
//! use lbkit_discovery::file::{parse, Format};
//! let eps = parse("dubbo://10.0.0.1:20880/com.acme.Greeter?weight=200", Format::DubboUrls, "inline", Timestamp::ZERO).unwrap();
//! assert_eq!(eps[0].spec.weight, 200);
//! ```
//!
//! ## Features
//! * `controller`: tokio, the `source` stream types, the `Controller` (the one control loop:
//!   updates, empty-push protection, health overlay, outlier ejection, slow start, ticks),
//!   logging with `tracing`.
//! * `runtime` (implies `controller`): `file::FileSource` (`notify`).
//! * `zookeeper` (implies `runtime`): `zookeeper`, on `zookeeper-client`.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod address;
#[cfg(feature = "runtime")]
pub mod cache;
#[cfg(feature = "controller")]
mod controller;
pub mod dubbo;
mod error;
pub mod file;
pub mod governance;
#[cfg(feature = "controller")]
pub mod source;
pub mod stages;
mod static_list;
#[cfg(feature = "xds")]
pub mod xds;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub use address::check_address;
#[cfg(feature = "controller")]
pub use controller::{
    error_chain, publisher, Confirmed, Controller, ControllerConfig, ControllerMetrics, Publisher,
    RemovalEvent, RemovalProtection, Target,
};
pub use error::{DiscoveryError, SourceError, UrlError};
pub use static_list::parse_static_list;
