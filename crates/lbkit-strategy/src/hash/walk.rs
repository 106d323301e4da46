//! Walking a strategy's preference order: the `probe`-th distinct endpoint the load bound
//! admits, without allocating.

use lbkit_core::EndpointIdx;

use super::bounded::{Bound, LoadCheck};

/// Endpoints counted during one walk. Fixed capacity, on the stack; beyond it (a probe of 32 or
/// more, twice what [`TriedSet`](lbkit_core::TriedSet) remembers) an endpoint may be counted
/// twice.
#[derive(Debug)]
struct Counted {
    items: [usize; Counted::CAPACITY],
    len: usize,
}

// === impl Counted ===

impl Counted {
    const CAPACITY: usize = 32;

    #[inline]
    fn new() -> Self {
        Counted {
            items: [0; Counted::CAPACITY],
            len: 0,
        }
    }

    #[inline]
    fn contains(&self, idx: EndpointIdx) -> bool {
        self.items[..self.len].contains(&idx.get())
    }

    #[inline]
    fn insert(&mut self, idx: EndpointIdx) {
        if self.len < Counted::CAPACITY {
            self.items[self.len] = idx.get();
            self.len += 1;
        }
    }
}

/// The `probe`-th (0-based) distinct candidate of `candidates` that `load` admits. Overloaded
/// candidates are skipped without being counted.
pub(crate) fn nth_admitted(
    candidates: impl Iterator<Item = EndpointIdx>,
    probe: u32,
    load: &mut LoadCheck<'_>,
) -> Option<EndpointIdx> {
    let mut counted = Counted::new();
    let mut left = probe;
    for c in candidates {
        if counted.contains(c) || !load.admits(c) {
            continue;
        }
        if left == 0 {
            return Some(c);
        }
        counted.insert(c);
        left -= 1;
    }
    None
}

/// Walk a cycle of owners (ring points, table entries) from where `from` starts it; `first` is
/// the owner there.
///
/// `distinct` is the number of distinct owners in the cycle: `probe` is taken modulo it, so a
/// walk never runs the full circle looking for an endpoint that does not exist. When the bound
/// admits too few (stale counts), the walk is repeated without it.
pub(crate) fn walk_cyclic<I: Iterator<Item = EndpointIdx>>(
    from: impl Fn() -> I,
    first: EndpointIdx,
    probe: u32,
    distinct: u32,
    bound: Option<&Bound>,
) -> EndpointIdx {
    let probe = probe % distinct.max(1);
    nth_admitted(from(), probe, &mut LoadCheck::new(bound))
        .or_else(|| nth_admitted(from(), probe, &mut LoadCheck::new(None)))
        .unwrap_or(first)
}

/// The owners of a cyclic array from `start`, once around.
pub(crate) fn from_slice(
    owners: &[EndpointIdx],
    start: usize,
) -> impl Iterator<Item = EndpointIdx> + '_ {
    owners[start..].iter().chain(&owners[..start]).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(v: &[usize]) -> Vec<EndpointIdx> {
        v.iter().map(|&i| EndpointIdx::new(i)).collect()
    }

    #[test]
    fn walks_distinct_owners_in_order_and_wraps() {
        let owners = idx(&[0, 0, 1, 0, 2, 1, 3]);
        let walk = |start: usize, probe| {
            walk_cyclic(|| from_slice(&owners, start), owners[start], probe, 4, None).get()
        };
        assert_eq!((0..4).map(|p| walk(0, p)).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!((0..4).map(|p| walk(5, p)).collect::<Vec<_>>(), [1, 3, 0, 2]);
        // A probe past the number of endpoints wraps around the distinct ones.
        assert_eq!(walk(5, 4), 1);
        assert_eq!(walk(5, 6), 0);
    }
}
