//! The rules every placed layout keeps, as checks.
//!
//! Owns: [`check_layout`] and the single-rule predicates the tests and the
//! rebuild search use. Must not touch: the cluster map (these look at a
//! layout alone, so the coordinator can check a layout it reads from the
//! directory without knowing the cluster).
//!
//! The rules, for a layout that tolerates FTT failures with RAID-1:
//! - every column has FTT+1 copies, each in a different fault domain, so
//!   losing FTT fault domains leaves every column a copy;
//! - every component has at least one vote and the vote total is odd, so for
//!   any split of the cluster into two sides exactly one side holds a vote
//!   majority and two sides can never both write;
//! - the FTT fault domains with the most votes together hold less than half
//!   of the votes, so losing any FTT fault domains leaves a majority, and a
//!   majority always spans more than FTT fault domains.

use std::collections::{BTreeMap, BTreeSet};
use tessera_types::layout::{ComponentPlacement, ComponentRole, Layout};
use tessera_types::{ComponentId, FaultDomainId};

/// A rule a layout breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutViolation {
    /// A layout needs at least one column.
    #[error("layout has no columns")]
    NoColumns,
    /// A column with the wrong number of copies.
    #[error("column {column} has {copies} copies, the policy keeps {expected}")]
    CopyCount {
        /// The column.
        column: usize,
        /// Copies found.
        copies: usize,
        /// Copies expected (FTT+1).
        expected: usize,
    },
    /// A witness among the copies or a data component among the witnesses.
    #[error("component {component} is listed in the wrong role")]
    RoleMismatch {
        /// The component.
        component: ComponentId,
    },
    /// A data component with a size other than the column size, or a witness
    /// with a size.
    #[error("component {component} has {size_bytes} bytes, expected {expected}")]
    SizeMismatch {
        /// The component.
        component: ComponentId,
        /// Its size.
        size_bytes: u64,
        /// The size it should have.
        expected: u64,
    },
    /// One id used twice.
    #[error("component {component} appears twice")]
    DuplicateComponent {
        /// The component.
        component: ComponentId,
    },
    /// Two copies of one column in one fault domain.
    #[error("column {column} has two copies in fault domain {fault_domain}")]
    CopiesShareFaultDomain {
        /// The column.
        column: usize,
        /// The shared fault domain.
        fault_domain: FaultDomainId,
    },
    /// A component without a vote.
    #[error("component {component} has no vote")]
    ZeroVotes {
        /// The component.
        component: ComponentId,
    },
    /// An even vote total lets a split leave both sides without a majority
    /// (or, with a tie rule, lets the wrong one win).
    #[error("vote total {total} is even")]
    EvenVotes {
        /// The total.
        total: u64,
    },
    /// Losing these fault domains would take half or more of the votes.
    #[error("{} {votes} of {total} votes: losing {} loses the majority", holders(.fault_domains), if .fault_domains.len() == 1 { "it" } else { "them" })]
    FaultDomainsHoldHalf {
        /// The heaviest FTT fault domains.
        fault_domains: Vec<FaultDomainId>,
        /// Their votes.
        votes: u64,
        /// All votes.
        total: u64,
    },
}

fn holders(fds: &[FaultDomainId]) -> String {
    let v: Vec<&str> = fds.iter().map(|f| f.as_str()).collect();
    if v.len() == 1 {
        format!("fault domain {} holds", v[0])
    } else {
        format!("fault domains {} hold", v.join(", "))
    }
}

/// Sum of all votes, in 64 bits so that no layout read from elsewhere can
/// overflow it.
pub fn total_votes(layout: &Layout) -> u64 {
    layout.components().map(|c| u64::from(c.votes)).sum()
}

/// Votes per fault domain, data and witness components together.
pub fn fault_domain_votes(layout: &Layout) -> BTreeMap<FaultDomainId, u64> {
    let mut out = BTreeMap::new();
    for c in layout.components() {
        *out.entry(c.fault_domain.clone()).or_insert(0) += u64::from(c.votes);
    }
    out
}

/// The quorum rule of `Layout::has_quorum` (more than half of the votes on
/// components for which `usable` holds, and a usable copy of every column),
/// summed in 64 bits.
pub fn has_quorum(layout: &Layout, usable: impl Fn(&ComponentPlacement) -> bool) -> bool {
    let present: u64 = layout
        .components()
        .filter(|c| usable(c))
        .map(|c| u64::from(c.votes))
        .sum();
    let whole_copy = layout.columns.iter().all(|m| m.copies.iter().any(&usable));
    2 * present > total_votes(layout) && whole_copy
}

/// The `n` fault domains with the most votes (ties by name) and their votes.
pub fn heaviest_fault_domains(layout: &Layout, n: usize) -> (Vec<FaultDomainId>, u64) {
    let mut votes: Vec<(FaultDomainId, u64)> = fault_domain_votes(layout).into_iter().collect();
    votes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    votes.truncate(n);
    let sum = votes.iter().map(|(_, v)| v).sum();
    (votes.into_iter().map(|(f, _)| f).collect(), sum)
}

/// True when no column has two copies in one fault domain.
pub fn copies_in_distinct_fault_domains(layout: &Layout) -> bool {
    layout.columns.iter().all(|m| {
        let fds: BTreeSet<&FaultDomainId> = m.copies.iter().map(|c| &c.fault_domain).collect();
        fds.len() == m.copies.len()
    })
}

/// True when every component votes and the total is odd: then for every
/// split of the components into two sides exactly one side holds more than
/// half of the votes, so at most one side can ever reach quorum.
pub fn votes_allow_one_majority(layout: &Layout) -> bool {
    layout.components().all(|c| c.votes > 0) && total_votes(layout) % 2 == 1
}

/// True when losing any `n` fault domains leaves quorum: a vote majority and
/// a copy of every column.
pub fn tolerates_fault_domain_losses(layout: &Layout, n: usize) -> bool {
    let (_, heaviest) = heaviest_fault_domains(layout, n);
    let votes_ok = 2 * heaviest < total_votes(layout);
    let copies_ok = layout.columns.iter().all(|m| {
        let fds: BTreeSet<&FaultDomainId> = m.copies.iter().map(|c| &c.fault_domain).collect();
        fds.len() > n
    });
    votes_ok && copies_ok
}

/// Checks every rule for a RAID-1 layout that tolerates `ftt` failures.
pub fn check_layout(layout: &Layout, ftt: u8) -> Result<(), LayoutViolation> {
    let expected = usize::from(ftt) + 1;
    if layout.columns.is_empty() {
        return Err(LayoutViolation::NoColumns);
    }
    let column_bytes = layout.columns[0]
        .copies
        .first()
        .map(|c| c.size_bytes)
        .unwrap_or(0);
    let mut ids = BTreeSet::new();
    for c in layout.components() {
        if !ids.insert(c.id) {
            return Err(LayoutViolation::DuplicateComponent { component: c.id });
        }
        if c.votes == 0 {
            return Err(LayoutViolation::ZeroVotes { component: c.id });
        }
    }
    for (column, m) in layout.columns.iter().enumerate() {
        if m.copies.len() != expected {
            return Err(LayoutViolation::CopyCount {
                column,
                copies: m.copies.len(),
                expected,
            });
        }
        let mut fds = BTreeSet::new();
        for c in &m.copies {
            if c.role != ComponentRole::Data {
                return Err(LayoutViolation::RoleMismatch { component: c.id });
            }
            if c.size_bytes != column_bytes {
                return Err(LayoutViolation::SizeMismatch {
                    component: c.id,
                    size_bytes: c.size_bytes,
                    expected: column_bytes,
                });
            }
            if !fds.insert(&c.fault_domain) {
                return Err(LayoutViolation::CopiesShareFaultDomain {
                    column,
                    fault_domain: c.fault_domain.clone(),
                });
            }
        }
    }
    for w in &layout.witnesses {
        if w.role != ComponentRole::Witness {
            return Err(LayoutViolation::RoleMismatch { component: w.id });
        }
        if w.size_bytes != 0 {
            return Err(LayoutViolation::SizeMismatch {
                component: w.id,
                size_bytes: w.size_bytes,
                expected: 0,
            });
        }
    }
    let total = total_votes(layout);
    if total.is_multiple_of(2) {
        return Err(LayoutViolation::EvenVotes { total });
    }
    let (fault_domains, votes) = heaviest_fault_domains(layout, usize::from(ftt));
    if 2 * votes >= total {
        return Err(LayoutViolation::FaultDomainsHoldHalf {
            fault_domains,
            votes,
            total,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_types::layout::{ComponentState, Mirror};
    use tessera_types::{ComponentId, DiskGroupId, HostId, VolumeId};

    fn component(id: u64, fd: &str, votes: u32) -> ComponentPlacement {
        ComponentPlacement {
            id: ComponentId(id),
            role: ComponentRole::Data,
            host: HostId(fd.into()),
            disk_group: DiskGroupId("dg0".into()),
            fault_domain: FaultDomainId(fd.into()),
            votes,
            size_bytes: 0,
            state: ComponentState::Active,
        }
    }

    #[test]
    fn huge_votes_from_elsewhere_are_judged_without_overflow() {
        let layout = Layout {
            volume: VolumeId("v".into()),
            size_bytes: 1,
            stripe_unit_bytes: 1 << 20,
            columns: vec![Mirror {
                copies: vec![component(1, "a", u32::MAX), component(2, "b", u32::MAX)],
            }],
            witnesses: vec![],
            generation: 1,
        };
        assert_eq!(total_votes(&layout), 2 * u64::from(u32::MAX));
        assert!(!votes_allow_one_majority(&layout));
        assert!(has_quorum(&layout, |_| true));
        assert!(!has_quorum(&layout, |c| c.id == ComponentId(1)));
        assert!(!tolerates_fault_domain_losses(&layout, 1));
        assert!(matches!(
            check_layout(&layout, 1),
            Err(LayoutViolation::EvenVotes { .. })
        ));
    }
}
