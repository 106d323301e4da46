//! # lbkit-discovery
//!
//! Where endpoints come from. For now: static lists ([`parse_static_list`]), endpoint files
//! ([`file`]: TOML, JSON, Dubbo provider URLs) and Dubbo's provider URL format ([`dubbo`]). Every
//! source produces [`EndpointSpec`](lbkit_core::EndpointSpec)s for a
//! [`SnapshotBuilder`](lbkit_core::SnapshotBuilder).
//!
//! ```
//! use lbkit_core::Timestamp;
//! use lbkit_discovery::file::{parse, Format};
//! let eps = parse("dubbo://10.0.0.1:20880/com.acme.Greeter?weight=200", Format::DubboUrls, "inline", Timestamp::ZERO).unwrap();
//! assert_eq!(eps[0].spec.weight, 200);
//! ```
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
pub mod dubbo;
mod error;
pub mod file;
mod static_list;

pub use address::check_address;
pub use error::{SourceError, UrlError};
pub use static_list::parse_static_list;
