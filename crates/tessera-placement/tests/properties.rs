//! Property tests of placement over random clusters and policies.
//!
//! The checks here are written independently of the crate's own `check`
//! module: fault domains are compared by hand, quorum is tested by trying
//! every split of the layout's fault domains, and whether a refused policy
//! really cannot be satisfied is decided by a max-flow search written here.
//!
//! Case counts: `PLACEMENT_CASES` random placements, `REBUILD_CASES` random
//! failures and rebuilds, `BALANCE_CASES` clusters filled with many volumes.
//! Set `PROPTEST_CASES` to run more (e.g. `PROPTEST_CASES=100000`).

mod common;

use common::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use tessera_placement::{
    apply_rebuild, check_layout, place, rebuild_target, repair_plan, ClusterMap, DiskGroup,
    DiskGroupHealth, Host, HostLiveness, HostRole, PlacementError, RepairCause, RepairTiming,
};
use tessera_types::layout::{ComponentPlacement, ComponentRole, ComponentState, Layout};
use tessera_types::policy::Policy;
use tessera_types::{ComponentId, DiskGroupId, FaultDomainId, HostId};

const PLACEMENT_CASES: u32 = 10_000;
const REBUILD_CASES: u32 = 5_000;
const BALANCE_CASES: u32 = 64;

fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig::with_cases(n)
}

#[derive(Clone, Debug)]
struct DiskGroupSpec {
    capacity_gib: u64,
    used_pct: u64,
    reserved_pct: u64,
    failed: bool,
}

#[derive(Clone, Debug)]
struct HostSpec {
    fault_domain: usize,
    absent: bool,
    witness_only: bool,
    disk_groups: Vec<DiskGroupSpec>,
}

fn disk_group_spec() -> impl Strategy<Value = DiskGroupSpec> {
    (
        1u64..=64,
        prop_oneof![3 => Just(0u64), 4 => 0u64..=100],
        0u64..=100,
        prop::bool::weighted(0.08),
    )
        .prop_map(|(capacity_gib, used_pct, reserved, failed)| DiskGroupSpec {
            capacity_gib,
            used_pct,
            reserved_pct: reserved * (100 - used_pct) / 100 / 2,
            failed,
        })
}

fn host_spec(fault_domains: usize) -> impl Strategy<Value = HostSpec> {
    (
        0..fault_domains,
        prop::bool::weighted(0.08),
        prop::bool::weighted(0.15),
        prop::collection::vec(disk_group_spec(), 1..=3),
    )
        .prop_map(
            |(fault_domain, absent, witness_only, disk_groups)| HostSpec {
                fault_domain,
                absent,
                witness_only,
                disk_groups,
            },
        )
}

/// 1-12 hosts in 1-8 named fault domains, or (a third of the time) each host
/// in a fault domain of its own.
fn cluster() -> impl Strategy<Value = ClusterMap> {
    (1usize..=8, prop::bool::weighted(0.33))
        .prop_flat_map(|(fds, own)| (prop::collection::vec(host_spec(fds), 1..=12), Just(own)))
        .prop_map(|(specs, own)| {
            let hosts = specs
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let mut h = Host::new(HostId(format!("h{i:02}")));
                    if !own {
                        h = h.in_fault_domain(FaultDomainId(format!("fd{}", s.fault_domain)));
                    }
                    if s.absent {
                        h = h.with_liveness(HostLiveness::Absent);
                    }
                    if s.witness_only {
                        h = h.witness_only();
                    }
                    for (j, d) in s.disk_groups.iter().enumerate() {
                        let capacity = d.capacity_gib * GIB;
                        let mut dg = DiskGroup::new(DiskGroupId(format!("dg{j}")), capacity);
                        dg.used_bytes = capacity / 100 * d.used_pct;
                        dg.reserved_bytes = capacity / 100 * d.reserved_pct;
                        if d.failed {
                            dg.health = DiskGroupHealth::Failed;
                        }
                        h = h.with_disk_group(dg);
                    }
                    h
                })
                .collect();
            ClusterMap::new(hosts).unwrap()
        })
}

fn policy_strategy() -> impl Strategy<Value = Policy> {
    (
        0u8..=3,
        prop_oneof![2 => Just(1u8), 3 => 1u8..=12],
        prop_oneof![2 => Just(0u8), 1 => Just(100u8), 2 => 0u8..=100],
    )
        .prop_map(|(ftt, width, pct)| policy(ftt, width, pct))
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=(64 * GIB), (1u64..=64).prop_map(|g| g * GIB)]
}

// ---- an independent reading of the rules ----

/// Whether a disk group can take a component of `role`, written out from
/// the documented rule rather than calling the crate.
fn can_hold(host: &Host, dg: &DiskGroup, role: ComponentRole) -> bool {
    let live = host.liveness == HostLiveness::Live;
    let role_ok = role == ComponentRole::Witness || host.role == HostRole::Data;
    let healthy = dg.health == DiskGroupHealth::Healthy;
    let taken = dg.used_bytes as u128 + dg.reserved_bytes as u128;
    let not_full = taken * 100 < dg.capacity_bytes as u128 * 95;
    live && role_ok && healthy && not_full
}

fn free(dg: &DiskGroup) -> u64 {
    dg.capacity_bytes
        .saturating_sub(dg.used_bytes.saturating_add(dg.reserved_bytes))
}

fn reserve_of(component_bytes: u64, pct: u8) -> u64 {
    ((component_bytes as u128 * pct as u128).div_ceil(100)) as u64
}

/// Maximum flow source -> column (copies) -> fault domain (1) -> sink (room),
/// by breadth-first augmenting paths.
fn max_components(width: usize, copies: usize, room: &[u64]) -> usize {
    let n = 2 + width + room.len();
    let (s, t) = (0, n - 1);
    let mut cap = vec![vec![0u64; n]; n];
    for c in 0..width {
        cap[s][1 + c] = copies as u64;
        for f in 0..room.len() {
            cap[1 + c][1 + width + f] = 1;
        }
    }
    for (f, &r) in room.iter().enumerate() {
        cap[1 + width + f][t] = r.min((width * copies) as u64);
    }
    let mut flow = 0;
    loop {
        let mut prev = vec![usize::MAX; n];
        prev[s] = s;
        let mut queue = VecDeque::from([s]);
        while let Some(u) = queue.pop_front() {
            for v in 0..n {
                if prev[v] == usize::MAX && cap[u][v] > 0 {
                    prev[v] = u;
                    queue.push_back(v);
                }
            }
        }
        if prev[t] == usize::MAX {
            return flow;
        }
        let mut v = t;
        while v != s {
            let u = prev[v];
            cap[u][v] -= 1;
            cap[v][u] += 1;
            v = u;
        }
        flow += 1;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Placeable,
    TooFewFaultDomains,
    TooFewDataFaultDomains,
    NoSpace,
}

fn verdict(map: &ClusterMap, p: &Policy, size_bytes: u64) -> Verdict {
    let k = usize::from(p.failures_to_tolerate);
    let width = usize::from(p.stripe_width);
    let column = Layout::column_bytes(size_bytes, width, tessera_types::layout::STRIPE_UNIT_BYTES);
    let reserve = reserve_of(column, p.space_reservation_pct);
    let mut any: BTreeSet<&FaultDomainId> = BTreeSet::new();
    let mut data_room: BTreeMap<&FaultDomainId, u64> = BTreeMap::new();
    for h in map.hosts() {
        for dg in &h.disk_groups {
            if can_hold(h, dg, ComponentRole::Witness) {
                any.insert(&h.fault_domain);
            }
            if can_hold(h, dg, ComponentRole::Data) {
                let room = free(dg)
                    .checked_div(reserve)
                    .unwrap_or((width * (k + 1)) as u64);
                *data_room.entry(&h.fault_domain).or_insert(0) += room;
            }
        }
    }
    if any.len() < 2 * k + 1 {
        return Verdict::TooFewFaultDomains;
    }
    if data_room.len() < k + 1 {
        return Verdict::TooFewDataFaultDomains;
    }
    let room: Vec<u64> = data_room.values().copied().collect();
    if max_components(width, k + 1, &room) < width * (k + 1) {
        return Verdict::NoSpace;
    }
    Verdict::Placeable
}

/// Every rule a placed layout keeps, checked from first principles.
fn assert_layout_rules(
    layout: &Layout,
    map: &ClusterMap,
    p: &Policy,
    size_bytes: u64,
) -> Result<(), TestCaseError> {
    let k = usize::from(p.failures_to_tolerate);
    let width = usize::from(p.stripe_width);
    let column = Layout::column_bytes(size_bytes, width, layout.stripe_unit_bytes);
    prop_assert_eq!(layout.columns.len(), width);
    prop_assert_eq!(layout.size_bytes, size_bytes);
    prop_assert!(column * width as u64 >= size_bytes);

    // No two copies of one column in one fault domain.
    for m in &layout.columns {
        prop_assert_eq!(m.copies.len(), k + 1);
        let fds: BTreeSet<&FaultDomainId> = m.copies.iter().map(|c| &c.fault_domain).collect();
        prop_assert_eq!(fds.len(), k + 1, "copies share a fault domain");
        for c in &m.copies {
            prop_assert_eq!(c.role, ComponentRole::Data);
            prop_assert_eq!(c.size_bytes, column);
        }
    }
    for w in &layout.witnesses {
        prop_assert_eq!(w.role, ComponentRole::Witness);
        prop_assert_eq!(w.size_bytes, 0);
    }
    let ids: BTreeSet<ComponentId> = layout.components().map(|c| c.id).collect();
    prop_assert_eq!(ids.len(), layout.components().count());

    // Votes: all positive, odd total.
    prop_assert!(layout.components().all(|c| c.votes >= 1));
    let total = layout.total_votes();
    prop_assert_eq!(total % 2, 1, "even vote total {}", total);

    // Where components went: live hosts, usable disk groups, with room.
    let mut reserved: BTreeMap<(HostId, DiskGroupId), u64> = BTreeMap::new();
    for c in layout.components() {
        let host = map.host(&c.host).expect("component on a host of the map");
        let dg = host
            .disk_group(&c.disk_group)
            .expect("disk group of the host");
        prop_assert_eq!(&c.fault_domain, &host.fault_domain);
        prop_assert!(
            can_hold(host, dg, c.role),
            "{} on an unusable disk group",
            c.id
        );
        if c.role == ComponentRole::Data {
            *reserved
                .entry((c.host.clone(), c.disk_group.clone()))
                .or_insert(0) += reserve_of(c.size_bytes, p.space_reservation_pct);
        }
    }
    for ((h, d), bytes) in reserved {
        let dg = map.disk_group(&h, &d).unwrap();
        prop_assert!(
            bytes <= free(dg),
            "{h}/{d}: reserved {bytes} of {} free",
            free(dg)
        );
    }

    // Quorum over every split of the layout's fault domains.
    let fds: Vec<FaultDomainId> = layout
        .components()
        .map(|c| c.fault_domain.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if k > 0 {
        prop_assert!(fds.len() > 2 * k, "{} fault domains for FTT={k}", fds.len());
    }
    prop_assert!(fds.len() <= 16, "too many fault domains to enumerate");
    for mask in 0u32..(1 << fds.len()) {
        let side: BTreeSet<&FaultDomainId> = fds
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, f)| f)
            .collect();
        let in_side = |c: &ComponentPlacement| side.contains(&c.fault_domain);
        let here = layout.has_quorum(in_side);
        prop_assert_eq!(here, tessera_placement::has_quorum(layout, in_side));
        let there = layout.has_quorum(|c| !in_side(c));
        prop_assert!(!(here && there), "both sides of a split have quorum");
        let votes_here: u32 = layout
            .components()
            .filter(|c| in_side(c))
            .map(|c| c.votes)
            .sum();
        prop_assert!(
            (2 * votes_here > total) != (2 * (total - votes_here) > total),
            "exactly one side holds a vote majority"
        );
        let lost = fds.len() - side.len();
        if lost <= k {
            prop_assert!(here, "losing {lost} fault domains lost quorum (FTT={k})");
        }
        if here {
            prop_assert!(side.len() > k, "a majority in {} fault domains", side.len());
        }
    }
    Ok(())
}

/// True when the copies of every column are in distinct fault domains, the
/// vote total is odd, and every loss of up to `k` of the layout's fault
/// domains leaves quorum: tried one loss set at a time.
fn survives_any_losses(layout: &Layout, k: usize) -> bool {
    let distinct = layout.columns.iter().all(|m| {
        m.copies
            .iter()
            .map(|c| &c.fault_domain)
            .collect::<BTreeSet<_>>()
            .len()
            == m.copies.len()
    });
    let fds: Vec<&FaultDomainId> = layout
        .components()
        .map(|c| &c.fault_domain)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let odd = layout.total_votes() % 2 == 1;
    let quorum_everywhere = (0u32..(1 << fds.len()))
        .filter(|mask| mask.count_ones() as usize <= k)
        .all(|mask| {
            layout.has_quorum(|c| {
                let i = fds.iter().position(|f| *f == &c.fault_domain).unwrap_or(0);
                mask & (1 << i) == 0
            })
        });
    distinct && odd && quorum_everywhere
}

fn allocator() -> impl FnMut() -> ComponentId {
    ids()
}

proptest! {
    #![proptest_config(cases(PLACEMENT_CASES))]

    /// Placement succeeds exactly when the cluster can satisfy the policy,
    /// and what it builds keeps every rule.
    #[test]
    fn placement_keeps_the_rules_or_refuses_rightly(
        map in cluster(),
        p in policy_strategy(),
        size_bytes in size_strategy(),
    ) {
        let expected = verdict(&map, &p, size_bytes);
        match place(&p, &volume("v"), size_bytes, &map, &mut allocator()) {
            Ok(layout) => {
                prop_assert_eq!(expected, Verdict::Placeable);
                assert_layout_rules(&layout, &map, &p, size_bytes)?;
                prop_assert!(check_layout(&layout, p.failures_to_tolerate).is_ok());
                let ids: Vec<u64> = layout.components().map(|c| c.id.0).collect();
                prop_assert_eq!(ids, (1..=layout.components().count() as u64).collect::<Vec<_>>());
                prop_assert!(layout.components().all(|c| c.state == ComponentState::Active));
                if p.stripe_width == 1 && p.failures_to_tolerate > 0 {
                    // The classic vSAN shape: FTT+1 copies, FTT witnesses, one vote each.
                    prop_assert_eq!(layout.witnesses.len(), usize::from(p.failures_to_tolerate));
                    prop_assert!(layout.components().all(|c| c.votes == 1));
                }
                if p.failures_to_tolerate == 0 {
                    prop_assert!(layout.witnesses.is_empty());
                }
            }
            Err(e) => {
                let matches = matches!(
                    (&expected, &e),
                    (Verdict::TooFewFaultDomains, PlacementError::NotEnoughFaultDomains { .. })
                        | (Verdict::TooFewDataFaultDomains, PlacementError::NotEnoughDataFaultDomains { .. })
                        | (Verdict::NoSpace, PlacementError::CapacityShortfall(_))
                );
                prop_assert!(matches, "refused with {e} but the verdict is {expected:?}");
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Fault {
    HostAbsent,
    DiskGroupFailed,
    HostRemoved,
    ComponentDegraded,
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        Just(Fault::HostAbsent),
        Just(Fault::DiskGroupFailed),
        Just(Fault::HostRemoved),
        Just(Fault::ComponentDegraded),
    ]
}

proptest! {
    #![proptest_config(cases(REBUILD_CASES))]

    /// After one fault, the repair plan lists exactly the lost components,
    /// the object stays accessible while the fault is within FTT, and every
    /// replacement placement finds keeps the rules; when none is found, no
    /// disk group in the cluster would have kept them.
    #[test]
    fn rebuilds_keep_the_rules(
        map in cluster(),
        p in policy_strategy(),
        size_bytes in size_strategy(),
        pick in any::<prop::sample::Index>(),
        what in fault(),
    ) {
        let Ok(mut layout) = place(&p, &volume("v"), size_bytes, &map, &mut allocator()) else {
            return Ok(());
        };
        let mut next = 1000;
        let mut next_id = || { next += 1; ComponentId(next) };
        let all: Vec<ComponentPlacement> = layout.components().cloned().collect();
        let victim = pick.get(&all).clone();
        let mut faulty = map.clone();
        let lost: Vec<ComponentId> = match what {
            Fault::HostAbsent => {
                faulty.host_mut(&victim.host).unwrap().liveness = HostLiveness::Absent;
                all.iter().filter(|c| c.host == victim.host).map(|c| c.id).collect()
            }
            Fault::DiskGroupFailed => {
                faulty.disk_group_mut(&victim.host, &victim.disk_group).unwrap().health =
                    DiskGroupHealth::Failed;
                all.iter()
                    .filter(|c| c.host == victim.host && c.disk_group == victim.disk_group)
                    .map(|c| c.id)
                    .collect()
            }
            Fault::HostRemoved => {
                let hosts: Vec<Host> = faulty
                    .hosts()
                    .iter()
                    .filter(|h| h.id != victim.host)
                    .cloned()
                    .collect();
                faulty = ClusterMap::new(hosts).unwrap();
                all.iter().filter(|c| c.host == victim.host).map(|c| c.id).collect()
            }
            Fault::ComponentDegraded => {
                for c in layout.components_mut() {
                    if c.id == victim.id {
                        c.state = ComponentState::Degraded;
                    }
                }
                vec![victim.id]
            }
        };
        let plan = repair_plan(&layout, &faulty);
        let listed: Vec<ComponentId> = plan.repairs.iter().map(|r| r.component).collect();
        prop_assert_eq!(&listed, &lost);
        for r in &plan.repairs {
            let timing = if matches!(r.cause, RepairCause::HostAbsent) {
                RepairTiming::AfterRepairDelay
            } else {
                RepairTiming::Immediate
            };
            prop_assert_eq!(r.timing, timing);
        }
        if p.failures_to_tolerate >= 1 {
            prop_assert!(plan.accessible, "one fault domain lost with FTT>=1: still accessible");
        }

        let ftt = p.failures_to_tolerate;
        for id in lost {
            let old = layout.component(id).unwrap().clone();
            match rebuild_target(&p, &layout, id, &faulty, &mut next_id) {
                Ok(new) => {
                    prop_assert!(new.id.0 > 1000);
                    prop_assert_eq!(new.role, old.role);
                    prop_assert_eq!(new.votes, old.votes);
                    prop_assert_eq!(new.size_bytes, old.size_bytes);
                    prop_assert_eq!(new.state, ComponentState::Resyncing);
                    prop_assert!(!(new.host == old.host && new.disk_group == old.disk_group));
                    let host = faulty.host(&new.host).unwrap();
                    let dg = host.disk_group(&new.disk_group).unwrap();
                    prop_assert!(can_hold(host, dg, new.role));
                    if new.role == ComponentRole::Data {
                        prop_assert!(free(dg) >= reserve_of(new.size_bytes, p.space_reservation_pct));
                    }
                    let generation = layout.generation;
                    prop_assert!(apply_rebuild(&mut layout, id, new));
                    prop_assert_eq!(layout.generation, generation + 1);
                    prop_assert!(check_layout(&layout, ftt).is_ok());
                    prop_assert!(survives_any_losses(&layout, usize::from(ftt)));
                }
                Err(e) => {
                    prop_assert!(matches!(e, PlacementError::NoRebuildTarget { .. }), "{e}");
                    // No disk group anywhere would have done.
                    for h in faulty.hosts() {
                        for dg in &h.disk_groups {
                            let reserve = if old.role == ComponentRole::Data {
                                reserve_of(old.size_bytes, p.space_reservation_pct)
                            } else {
                                0
                            };
                            if !can_hold(h, dg, old.role) || free(dg) < reserve
                                || (h.id == old.host && dg.id == old.disk_group)
                            {
                                continue;
                            }
                            let mut trial = layout.clone();
                            let mut c = old.clone();
                            c.host = h.id.clone();
                            c.disk_group = dg.id.clone();
                            c.fault_domain = h.fault_domain.clone();
                            apply_rebuild(&mut trial, id, c);
                            prop_assert!(
                                !survives_any_losses(&trial, usize::from(ftt)),
                                "{}/{} would have kept the rules", h.id, dg.id
                            );
                        }
                    }
                    return Ok(());
                }
            }
        }
        // Everything replaced: nothing left to repair once the new
        // components have caught up.
        for c in layout.components_mut() {
            c.state = ComponentState::Active;
        }
        let after = repair_plan(&layout, &faulty);
        prop_assert!(after.repairs.is_empty(), "{:?}", after.repairs);
        prop_assert!(after.accessible);
    }
}

proptest! {
    #![proptest_config(cases(BALANCE_CASES))]

    /// Filling a cluster of equal disk groups with many volumes keeps the
    /// used space level: the gap between the fullest and the emptiest disk
    /// group stays within a small multiple of the largest component, and
    /// their ratio near 1 once the cluster is well used.
    #[test]
    fn load_spreads_evenly(
        host_count in 3usize..=8,
        groups in 1usize..=3,
        volumes in prop::collection::vec((0u8..=1, 1u8..=4, 1u64..=16, prop::bool::ANY), 150..=250),
    ) {
        let mut map = ClusterMap::new(
            (0..host_count)
                .map(|i| host(&format!("h{i}"), &vec![4 * TIB; groups]))
                .collect(),
        )
        .unwrap();
        let mut largest = 0;
        let mut next = 0;
        let mut next_id = || { next += 1; ComponentId(next) };
        for (i, &(ftt, width, gib, thick)) in volumes.iter().enumerate() {
            let p = policy(ftt, width, if thick { 100 } else { 0 });
            let layout = place(&p, &volume(&format!("v{i}")), gib * GIB, &map, &mut next_id)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            map.reserve_layout(&layout, p.space_reservation_pct);
            // Thin volumes get written in full; thick ones turn their
            // reservation into used bytes.
            for c in layout.components().filter(|c| c.role == ComponentRole::Data) {
                largest = largest.max(c.size_bytes);
                let dg = map.disk_group_mut(&c.host, &c.disk_group).unwrap();
                dg.used_bytes += c.size_bytes;
                dg.reserved_bytes -= reserve_of(c.size_bytes, p.space_reservation_pct);
            }
        }
        let used: Vec<u64> = map
            .hosts()
            .iter()
            .flat_map(|h| h.disk_groups.iter().map(|d| d.used_bytes))
            .collect();
        let max = *used.iter().max().unwrap();
        let min = *used.iter().min().unwrap();
        prop_assert!(max - min <= 2 * largest, "used spread {max}..{min}, largest component {largest}");
        prop_assert!(min > 0);
        prop_assert!(max as f64 / min as f64 <= 1.5, "max/min used {}", max as f64 / min as f64);
    }
}

#[test]
fn flow_search_matches_the_closed_form() {
    // The oracle above and the crate's closed form must agree on small inputs.
    for width in 1..=4 {
        for copies in 1..=3 {
            for a in 0..=4u64 {
                for b in 0..=4u64 {
                    for c in 0..=4u64 {
                        let room = [a, b, c];
                        assert_eq!(
                            max_components(width, copies, &room),
                            tessera_placement::components_that_fit(width, copies, &room),
                            "width {width} copies {copies} room {room:?}"
                        );
                    }
                }
            }
        }
    }
}

/// The random clusters are not mostly hopeless or mostly easy: a fixed
/// sample of them hits every verdict, success for every FTT, and rebuilds
/// that both succeed and fail, so the properties above are not vacuous.
#[test]
fn generators_cover_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let mut rebuilds = [0u32; 2];
    let strategy = (cluster(), policy_strategy(), size_strategy());
    let mut verdicts: BTreeMap<String, u32> = BTreeMap::new();
    let mut placed_by_ftt = [0u32; 4];
    let mut widest_placed = 0;
    let mut thick_placed = 0;
    const SAMPLE: u32 = 4000;
    for _ in 0..SAMPLE {
        let (map, p, size_bytes) = strategy.new_tree(&mut runner).unwrap().current();
        let v = verdict(&map, &p, size_bytes);
        *verdicts.entry(format!("{v:?}")).or_insert(0) += 1;
        if v == Verdict::Placeable {
            placed_by_ftt[usize::from(p.failures_to_tolerate)] += 1;
            widest_placed = widest_placed.max(p.stripe_width);
            if p.space_reservation_pct == 100 {
                thick_placed += 1;
            }
            // Lose the host of the first copy for good: can it be rebuilt?
            let layout = place(&p, &volume("v"), size_bytes, &map, &mut ids()).unwrap();
            let first = layout.columns[0].copies[0].clone();
            let hosts: Vec<Host> = map
                .hosts()
                .iter()
                .filter(|h| h.id != first.host)
                .cloned()
                .collect();
            let map = ClusterMap::new(hosts).unwrap();
            let ok = rebuild_target(&p, &layout, first.id, &map, &mut ids()).is_ok();
            rebuilds[usize::from(ok)] += 1;
        }
    }
    println!("verdicts over {SAMPLE} random cases: {verdicts:?}");
    println!("placeable by FTT 0..3: {placed_by_ftt:?}, thick: {thick_placed}");
    println!(
        "rebuild after losing a copy's host: {} found, {} refused",
        rebuilds[1], rebuilds[0]
    );
    assert!(rebuilds.iter().all(|&n| n * 100 >= SAMPLE), "{rebuilds:?}");

    // The tight clusters of the exhaustive search both fit and do not.
    let mut fits = [0u32; 2];
    for _ in 0..SAMPLE {
        let map = tight_cluster().new_tree(&mut runner).unwrap().current();
        let ok = place(&policy(1, 2, 100), &volume("v"), 20 * GIB, &map, &mut ids()).is_ok();
        let found = data_fits_by_search(&map, 2, 2, 10 * GIB);
        fits[usize::from(found)] += 1;
        assert!(!ok || found);
    }
    println!(
        "tight clusters, FTT=1 width 2 thick: {} fit, {} do not",
        fits[1], fits[0]
    );
    assert!(fits.iter().all(|&n| n * 10 >= SAMPLE), "{fits:?}");
    for v in [
        "Placeable",
        "TooFewFaultDomains",
        "TooFewDataFaultDomains",
        "NoSpace",
    ] {
        let n = verdicts.get(v).copied().unwrap_or(0);
        assert!(n * 200 >= SAMPLE, "{v}: only {n} of {SAMPLE}");
    }
    assert!(
        placed_by_ftt.iter().all(|&n| n * 100 >= SAMPLE),
        "{placed_by_ftt:?}"
    );
    assert_eq!(widest_placed, 12);
    assert!(thick_placed * 100 >= SAMPLE);
}

/// Tries every way to put `width` x `copies` data components on the disk
/// groups of `map` (one at a time, backtracking), with each column's copies
/// in distinct fault domains and each disk group's reservations within its
/// free space. Knows nothing of fault-domain "room" or flows.
fn data_fits_by_search(map: &ClusterMap, width: usize, copies: usize, reserve: u64) -> bool {
    let slots: Vec<(&Host, &DiskGroup)> = map
        .hosts()
        .iter()
        .flat_map(|h| h.disk_groups.iter().map(move |d| (h, d)))
        .filter(|(h, d)| can_hold(h, d, ComponentRole::Data))
        .collect();
    let mut left: Vec<u64> = slots.iter().map(|(_, d)| free(d)).collect();
    let mut columns: Vec<Vec<usize>> = vec![Vec::new(); width];
    fn search(
        slots: &[(&Host, &DiskGroup)],
        left: &mut [u64],
        columns: &mut [Vec<usize>],
        n: usize,
        copies: usize,
        reserve: u64,
    ) -> bool {
        if n == columns.len() * copies {
            return true;
        }
        let col = n / copies;
        // Copies of a column are interchangeable: take slots in increasing
        // order within a column to avoid trying permutations.
        let start = columns[col].last().map_or(0, |&s| s + 1);
        for s in start..slots.len() {
            let fd = &slots[s].0.fault_domain;
            if left[s] < reserve || columns[col].iter().any(|&o| &slots[o].0.fault_domain == fd) {
                continue;
            }
            left[s] -= reserve;
            columns[col].push(s);
            if search(slots, left, columns, n + 1, copies, reserve) {
                return true;
            }
            columns[col].pop();
            left[s] += reserve;
        }
        false
    }
    search(&slots, &mut left, &mut columns, 0, copies, reserve)
}

/// Small clusters with tight space, for the exhaustive search.
fn tight_cluster() -> impl Strategy<Value = ClusterMap> {
    prop::collection::vec((0usize..4, prop::collection::vec(0u64..=5, 1..=2)), 1..=5).prop_map(
        |specs| {
            let hosts = specs
                .iter()
                .enumerate()
                .map(|(i, (fd, dgs))| {
                    let mut h = Host::new(HostId(format!("h{i}")))
                        .in_fault_domain(FaultDomainId(format!("fd{fd}")));
                    for (j, &units) in dgs.iter().enumerate() {
                        // Capacity in whole 10 GiB units, with headroom so that
                        // only the reservations decide.
                        h = h.with_disk_group(DiskGroup::new(
                            DiskGroupId(format!("dg{j}")),
                            units * 10 * GIB + GIB,
                        ));
                    }
                    h
                })
                .collect();
            ClusterMap::new(hosts).unwrap()
        },
    )
}

proptest! {
    #![proptest_config(cases(PLACEMENT_CASES / 5))]

    /// On small, tight clusters the exhaustive search and placement agree
    /// on whether thick data fits.
    #[test]
    fn thick_data_fits_exactly_when_a_search_finds_room(
        map in tight_cluster(),
        ftt in 0u8..=1,
        width in 1u8..=3,
    ) {
        let p = policy(ftt, width, 100);
        let copies = usize::from(ftt) + 1;
        let size = 10 * GIB * u64::from(width);
        let fits = data_fits_by_search(&map, usize::from(width), copies, 10 * GIB);
        match place(&p, &volume("v"), size, &map, &mut allocator()) {
            Ok(layout) => {
                prop_assert!(fits, "placed what the search says cannot fit");
                assert_layout_rules(&layout, &map, &p, size)?;
            }
            Err(PlacementError::CapacityShortfall(_))
            | Err(PlacementError::NotEnoughDataFaultDomains { .. }) => {
                prop_assert!(!fits, "refused what the search fits");
            }
            Err(PlacementError::NotEnoughFaultDomains { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected refusal {e}"),
        }
    }
}

proptest! {
    #![proptest_config(cases(REBUILD_CASES))]

    /// Losing up to FTT whole fault domains (every host in them absent)
    /// leaves the object accessible, the plan lists exactly the components
    /// there (all after the repair delay), and rebuilding them one by one,
    /// as far as the cluster allows, keeps the rules at every step.
    #[test]
    fn losing_ftt_fault_domains_keeps_quorum(
        map in cluster(),
        p in policy_strategy(),
        size_bytes in size_strategy(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..=3),
    ) {
        let Ok(mut layout) = place(&p, &volume("v"), size_bytes, &map, &mut allocator()) else {
            return Ok(());
        };
        let ftt = p.failures_to_tolerate;
        let fds: Vec<FaultDomainId> = layout
            .components()
            .map(|c| c.fault_domain.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let lost_fds: BTreeSet<&FaultDomainId> = picks
            .iter()
            .take(usize::from(ftt))
            .map(|i| i.get(&fds))
            .collect();
        let mut faulty = map.clone();
        let absent: Vec<HostId> = faulty
            .hosts()
            .iter()
            .filter(|h| lost_fds.contains(&h.fault_domain))
            .map(|h| h.id.clone())
            .collect();
        for h in &absent {
            faulty.host_mut(h).unwrap().liveness = HostLiveness::Absent;
        }
        let plan = repair_plan(&layout, &faulty);
        prop_assert!(plan.accessible, "lost {} of FTT={ftt} fault domains", lost_fds.len());
        let expected: Vec<ComponentId> = layout
            .components()
            .filter(|c| lost_fds.contains(&c.fault_domain))
            .map(|c| c.id)
            .collect();
        let listed: Vec<ComponentId> = plan.repairs.iter().map(|r| r.component).collect();
        prop_assert_eq!(listed, expected);
        prop_assert!(plan.repairs.iter().all(|r| r.timing == RepairTiming::AfterRepairDelay));

        let mut next = 1000;
        let mut next_id = || { next += 1; ComponentId(next) };
        for r in &plan.repairs {
            if let Ok(new) = rebuild_target(&p, &layout, r.component, &faulty, &mut next_id) {
                prop_assert!(!absent.contains(&new.host));
                apply_rebuild(&mut layout, r.component, new);
                prop_assert!(check_layout(&layout, ftt).is_ok());
                prop_assert!(survives_any_losses(&layout, usize::from(ftt)));
            }
        }
    }
}

/// Disk groups with any numbers at all, as a confused or hostile store might
/// report them.
fn wild_cluster() -> impl Strategy<Value = ClusterMap> {
    prop::collection::vec(
        (
            0usize..4,
            prop::bool::weighted(0.2),
            prop::collection::vec(
                (
                    prop_oneof![any::<u64>(), 0u64..(1 << 40)],
                    prop_oneof![Just(0u64), any::<u64>()],
                    prop_oneof![Just(0u64), any::<u64>()],
                ),
                0..=2,
            ),
        ),
        0..=6,
    )
    .prop_map(|specs| {
        let hosts = specs
            .iter()
            .enumerate()
            .map(|(i, (fd, witness, dgs))| {
                let mut h = Host::new(HostId(format!("h{i}")))
                    .in_fault_domain(FaultDomainId(format!("fd{fd}")));
                if *witness {
                    h = h.witness_only();
                }
                for (j, &(capacity, used, reserved)) in dgs.iter().enumerate() {
                    let mut dg = DiskGroup::new(DiskGroupId(format!("dg{j}")), capacity);
                    dg.used_bytes = used;
                    dg.reserved_bytes = reserved;
                    h = h.with_disk_group(dg);
                }
                h
            })
            .collect();
        ClusterMap::new(hosts).unwrap()
    })
}

proptest! {
    #![proptest_config(cases(REBUILD_CASES))]

    /// Out-of-range policies, absurd sizes and capacities, and layouts with
    /// scrambled votes, fault domains and copies give answers, never panics;
    /// whatever is placed or rebuilt still keeps the rules.
    #[test]
    fn hostile_input_gets_an_answer(
        map in wild_cluster(),
        ftt in any::<u8>(),
        width in any::<u8>(),
        pct in any::<u8>(),
        size_bytes in prop_oneof![any::<u64>(), 1u64..(1 << 42)],
        votes in prop::collection::vec(any::<u32>(), 0..4),
        drop_copy in any::<bool>(),
        pick in any::<prop::sample::Index>(),
    ) {
        let mut p = policy(ftt % 5, width % 14, pct);
        if p.validate().is_err() {
            prop_assert!(matches!(
                place(&p, &volume("v"), size_bytes, &map, &mut allocator()),
                Err(PlacementError::InvalidPolicy(_))
            ));
            p = policy(ftt % 4, width % 12 + 1, pct % 101);
        }
        let placed = place(&p, &volume("v"), size_bytes, &map, &mut allocator());
        if size_bytes > tessera_placement::VOLUME_BYTES_MAX {
            prop_assert!(matches!(placed, Err(PlacementError::VolumeTooLarge { .. })), "{placed:?}");
        }
        let Ok(layout) = placed else {
            return Ok(());
        };
        prop_assert!(check_layout(&layout, p.failures_to_tolerate).is_ok());
        let mut scrambled = layout.clone();
        for (c, v) in scrambled.components_mut().zip(votes.iter()) {
            c.votes = *v;
        }
        if drop_copy {
            if let Some(m) = scrambled.columns.last_mut() {
                m.copies.pop();
            }
        }
        let all: Vec<ComponentId> = layout.components().map(|c| c.id).collect();
        let victim = *pick.get(&all);
        let _ = repair_plan(&scrambled, &map);
        let mut next = 1_000_000;
        let mut fresh = || { next += 1; ComponentId(next) };
        // An allocator handing out ids the layout already has is refused.
        let reused = rebuild_target(&p, &scrambled, victim, &map, &mut || all[0]);
        if all[0] != victim {
            prop_assert!(reused.is_err());
        }
        let _ = tessera_placement::resize_layout(&p, &scrambled, size_bytes.saturating_mul(2), &map);
        if let Ok(new) = rebuild_target(&p, &scrambled, victim, &map, &mut fresh) {
            let mut rebuilt = scrambled.clone();
            prop_assert!(apply_rebuild(&mut rebuilt, victim, new));
            let ftt = rebuilt.columns[0].copies.len() as u8 - 1;
            prop_assert!(check_layout(&rebuilt, ftt).is_ok());
        }
    }
}

proptest! {
    #![proptest_config(cases(REBUILD_CASES))]

    /// Growing a placed volume keeps its components where they are, gives
    /// them the new column size, and is refused only when some disk group
    /// lacks room for the larger reservation.
    #[test]
    fn growth_keeps_components_and_respects_space(
        map in cluster(),
        p in policy_strategy(),
        size_bytes in size_strategy(),
        grow_gib in 0u64..=64,
    ) {
        let Ok(layout) = place(&p, &volume("v"), size_bytes, &map, &mut allocator()) else {
            return Ok(());
        };
        let mut map = map;
        map.reserve_layout(&layout, p.space_reservation_pct);
        let new_size = size_bytes + grow_gib * GIB;
        let width = layout.columns.len();
        let old_column = layout.columns[0].copies[0].size_bytes;
        let new_column = Layout::column_bytes(new_size, width, layout.stripe_unit_bytes);
        let extra = reserve_of(new_column, p.space_reservation_pct)
            - reserve_of(old_column, p.space_reservation_pct);
        let mut need: BTreeMap<(HostId, DiskGroupId), u64> = BTreeMap::new();
        for c in layout.components().filter(|c| c.role == ComponentRole::Data) {
            *need.entry((c.host.clone(), c.disk_group.clone())).or_insert(0) += extra;
        }
        let room = need
            .iter()
            .all(|((h, d), bytes)| *bytes <= free(map.disk_group(h, d).unwrap()));
        match tessera_placement::resize_layout(&p, &layout, new_size, &map) {
            Ok(grown) => {
                prop_assert!(room || new_size == size_bytes);
                prop_assert!(check_layout(&grown, p.failures_to_tolerate).is_ok());
                prop_assert_eq!(grown.size_bytes, new_size);
                for (a, b) in grown.components().zip(layout.components()) {
                    prop_assert_eq!((&a.id, &a.host, &a.disk_group), (&b.id, &b.host, &b.disk_group));
                    if a.role == ComponentRole::Data {
                        prop_assert_eq!(a.size_bytes, new_column);
                    }
                }
            }
            Err(e) => {
                prop_assert!(matches!(e, PlacementError::GrowthShortfall { .. }), "{e}");
                prop_assert!(!room);
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(REBUILD_CASES))]

    /// Evacuating a host either moves every component off it, leaving a
    /// layout that keeps the rules with nothing on that host, or names a
    /// component that has nowhere to go.
    #[test]
    fn evacuation_empties_the_host(
        map in cluster(),
        p in policy_strategy(),
        size_bytes in size_strategy(),
        pick in any::<prop::sample::Index>(),
    ) {
        let Ok(layout) = place(&p, &volume("v"), size_bytes, &map, &mut allocator()) else {
            return Ok(());
        };
        let hosts: Vec<HostId> = layout.components().map(|c| c.host.clone()).collect();
        let host = pick.get(&hosts).clone();
        let mut next = 1000;
        let mut next_id = || { next += 1; ComponentId(next) };
        match tessera_placement::evacuate(&p, &layout, &host, &map, &mut next_id) {
            Ok(moves) => {
                let mut after = layout.clone();
                for m in &moves {
                    prop_assert!(m.to.host != host);
                    prop_assert!(apply_rebuild(&mut after, m.from, m.to.clone()));
                }
                prop_assert!(after.components().all(|c| c.host != host));
                prop_assert!(check_layout(&after, p.failures_to_tolerate).is_ok());
                prop_assert!(survives_any_losses(&after, usize::from(p.failures_to_tolerate)));
            }
            Err(e) => prop_assert!(matches!(e, PlacementError::NoRebuildTarget { .. }), "{e}"),
        }
    }
}
