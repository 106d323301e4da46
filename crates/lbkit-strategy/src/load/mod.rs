//! Load-aware strategies (least active, least request, P2C, shortest response, best available,
//! adaptive).

use crate::catalog::{Family, StrategyInfo};

pub(crate) const FAMILY: Family = Family {
    infos: INFOS,
    build: |_, _| None,
};

const INFOS: &[StrategyInfo] = &[];
