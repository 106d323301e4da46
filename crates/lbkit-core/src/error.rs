//! Errors of the core crate. Hot-path errors are `Copy` and never allocate.

/// Why a pick found no endpoint.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PickError {
    /// The snapshot holds no endpoints at all.
    #[error("no endpoints")]
    NoEndpoints,
    /// Endpoints exist but none may be picked.
    #[error("no eligible endpoint ({unhealthy} marked down, {drained} with weight 0, {ejected} ejected)")]
    AllIneligible {
        /// Endpoints marked down.
        unhealthy: u32,
        /// Healthy endpoints with weight 0.
        drained: u32,
        /// Endpoints ejected by outlier detection.
        ejected: u32,
    },
    /// A retry found only endpoints this call already tried.
    #[error("every eligible endpoint was already tried")]
    AllTried,
    /// The request's tag matches no eligible provider and it may not fall back to untagged
    /// ones (`dubbo.force.tag`, or the tag rule's `force`).
    #[error("no eligible endpoint carries the request's tag, and the tag is forced")]
    NoTagMatch,
    /// The request has no tag and every eligible endpoint is reserved for a tag.
    #[error("every eligible endpoint is tagged, and the request has no tag")]
    AllTagged,
    /// No subset matches the request's attributes, and the subset fallback is `none`
    /// ([`stage`](crate::stage)).
    #[error("no subset matches the request's attributes, and the subset fallback is none")]
    NoSubset,
    /// The request's subset has no eligible endpoint (down, ejected or drained), and the
    /// subset fallback is `none`.
    #[error("the request's subset has no eligible endpoint (down, ejected or drained), and the subset fallback is none")]
    SubsetUnavailable,
    /// No subset serves the request and the default subset has no eligible endpoint.
    #[error("no subset serves the request, and the default subset has no eligible endpoint")]
    DefaultSubsetEmpty,
    /// A user-defined picker refused to choose.
    #[error("the strategy declined to pick: {0}")]
    Declined(&'static str),
}
