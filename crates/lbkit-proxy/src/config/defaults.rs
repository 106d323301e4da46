//! Default values of the configuration fields (serde needs functions).

use std::net::SocketAddr;

pub(super) fn default_admin_bind() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9901))
}
pub(super) fn default_max_header_bytes() -> usize {
    64 * 1024
}
pub(super) fn default_max_headers() -> usize {
    100
}
pub(super) fn default_header_read_timeout_ms() -> u64 {
    10_000
}
pub(super) fn default_idle_timeout_ms() -> u64 {
    60_000
}
pub(super) fn default_stream_idle_timeout_ms() -> u64 {
    300_000
}
pub(super) fn default_max_requests_per_connection() -> u64 {
    1_000
}
pub(super) fn default_max_premature_resets() -> u64 {
    100
}
pub(super) fn default_max_connections() -> usize {
    10_000
}
pub(super) fn default_drain_timeout_ms() -> u64 {
    10_000
}
pub(super) fn default_upgrade_protocols() -> Vec<String> {
    vec!["websocket".to_owned()]
}
pub(super) fn default_tcp_idle_ms() -> u64 {
    600_000
}

pub(super) fn default_tunnel_idle_ms() -> u64 {
    300_000
}
pub(super) fn default_zk_watch() -> String {
    "auto".to_owned()
}
pub(super) fn default_prefix() -> String {
    "/".to_owned()
}
pub(crate) fn default_route_timeout_ms() -> u64 {
    15_000
}
pub(super) fn default_strategy() -> String {
    "round-robin".to_owned()
}
pub(super) fn default_retries() -> u32 {
    2
}
pub(super) fn default_budget_percent() -> f32 {
    20.0
}
pub(super) fn default_budget_floor() -> u32 {
    10
}
pub(super) fn default_connect_timeout_ms() -> u64 {
    1_000
}
pub(super) fn default_upstream_idle_ms() -> u64 {
    50_000
}
pub(super) fn default_removal_share() -> f64 {
    0.5
}
pub(super) fn default_removal_window_ms() -> u64 {
    10_000
}
pub(super) fn default_removal_confirm_ms() -> u64 {
    120_000
}
pub(super) fn default_upstream_max_idle() -> usize {
    256
}
pub(super) fn default_zk_root() -> String {
    "dubbo".to_owned()
}
pub(super) fn default_zk_layout() -> String {
    "dubbo".to_owned()
}
pub(super) fn yes() -> bool {
    true
}
pub(super) fn default_outlier_interval_ms() -> u64 {
    10_000
}
pub(super) fn default_consecutive() -> u32 {
    5
}
pub(super) fn default_base_ejection_ms() -> u64 {
    30_000
}
pub(super) fn default_max_ejection_percent() -> u32 {
    10
}
pub(super) fn default_expect_status() -> u16 {
    200
}
pub(super) fn default_check_interval_ms() -> u64 {
    5_000
}
pub(super) fn default_rise() -> u32 {
    2
}
pub(super) fn default_fall() -> u32 {
    3
}
pub(super) fn default_true() -> bool {
    true
}

pub(super) fn default_tag_header() -> String {
    lbkit_core::route::TAG_KEY.to_owned()
}

pub(super) fn default_force_tag_header() -> String {
    lbkit_core::route::FORCE_TAG_KEY.to_owned()
}
