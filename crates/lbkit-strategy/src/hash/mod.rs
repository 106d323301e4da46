//! Consistent-hashing strategies (Dubbo's ring, nginx ketama, Maglev, rendezvous).

use crate::catalog::{Family, StrategyInfo};

pub(crate) const FAMILY: Family = Family {
    infos: INFOS,
    build: |_, _| None,
};

const INFOS: &[StrategyInfo] = &[];
