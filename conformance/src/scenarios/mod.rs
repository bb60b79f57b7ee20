//! The catalogue: every scenario, grouped by what it checks. Ids are stable; the order here is
//! the order of the reports.
use crate::scenario::Scenario;

pub mod cm;
pub mod ext;
pub mod hdr;
pub mod msg;
pub mod psn;
pub mod rc;
pub mod rdma;
pub mod req;
pub mod reqx;
pub mod resp;
pub mod roce;
pub mod sec;
pub mod states;
pub mod ucud;
pub mod verbs;

/// Every scenario, in report order.
pub fn catalogue() -> Vec<Scenario> {
    [
        hdr::SCENARIOS,
        roce::SCENARIOS,
        psn::SCENARIOS,
        msg::SCENARIOS,
        rdma::SCENARIOS,
        req::SCENARIOS,
        reqx::SCENARIOS,
        rc::SCENARIOS,
        resp::SCENARIOS,
        ucud::SCENARIOS,
        verbs::SCENARIOS,
        states::SCENARIOS,
        cm::SCENARIOS,
        ext::SCENARIOS,
        sec::SCENARIOS,
    ]
    .concat()
}

/// The scenarios whose id contains `pattern` (all of them for an empty pattern). A pattern may
/// list several alternatives separated by commas.
pub fn select(pattern: &str) -> Vec<Scenario> {
    let pats: Vec<&str> = pattern
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    catalogue()
        .into_iter()
        .filter(|s| pats.is_empty() || pats.iter().any(|p| s.id.contains(p)))
        .collect()
}

/// Finds a scenario by its exact id.
pub fn by_id(id: &str) -> Option<Scenario> {
    catalogue().into_iter().find(|s| s.id == id)
}
