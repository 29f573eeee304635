//! Placement: where the components of a volume live (vSAN's CLOM).
//!
//! Owns: the [`ClusterMap`] as placement sees it, [`place()`] (policy + map ->
//! [`Layout`](tessera_types::layout::Layout)), [`rebuild_target`] and
//! [`repair_plan`] for lost components, [`evacuate`] for a host that leaves,
//! [`resize_layout`] for growing a
//! volume in place, and the rules every layout keeps
//! ([`check`]). Must not touch: I/O, the directory, clocks, randomness or an
//! async runtime. Everything here is a pure function of its arguments, so the
//! node, the simulator and the property tests get the same answers; ties are
//! broken by host and disk group ids.
//!
//! Invariants of every layout this crate returns (RAID-1, FTT = k):
//! - each stripe column has k+1 copies in k+1 different fault domains;
//! - every component votes, the vote total is odd, and the k fault domains
//!   with the most votes hold less than half of them: losing any k fault
//!   domains leaves quorum, a majority always spans more than k fault
//!   domains, and two sides of a partition can never both have quorum;
//! - data components sit on live data hosts, on healthy disk groups below
//!   [`DISK_GROUP_FULL_PCT`] full with their reservation free; witnesses on
//!   live hosts (witness-only hosts preferred) with no bytes.
//!
//! `docs/PLACEMENT.md` explains the rules with worked examples.

pub mod check;
pub mod cluster;
pub mod error;
pub mod place;
pub mod repair;
pub mod resize;

pub use check::{
    check_layout, copies_in_distinct_fault_domains, fault_domain_votes, has_quorum,
    tolerates_fault_domain_losses, total_votes, votes_allow_one_majority, LayoutViolation,
};
pub use cluster::{
    reservation_bytes, ClusterMap, ClusterMapError, DiskGroup, DiskGroupHealth, Host, HostLiveness,
    HostRole, DISK_GROUP_FULL_PCT,
};
pub use error::{CapacityShortfall, PlacementError};
pub use place::{components_that_fit, place, VOLUME_BYTES_MAX};
pub use repair::{
    apply_rebuild, evacuate, rebuild_target, repair_plan, ComponentMove, Repair, RepairCause,
    RepairPlan, RepairTiming,
};
pub use resize::resize_layout;
