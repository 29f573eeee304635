//! What a user reads when placement refuses: one row per refusal, cluster and
//! policy in, the exact message out.

mod common;

use common::*;
use tessera_placement::{
    place, rebuild_target, ClusterMap, DiskGroupHealth, HostLiveness, PlacementError,
};
use tessera_types::{ComponentId, DiskGroupId, HostId};

struct Case {
    name: &'static str,
    map: ClusterMap,
    ftt: u8,
    width: u8,
    reservation_pct: u8,
    size_bytes: u64,
    message: &'static str,
}

fn cases() -> Vec<Case> {
    let absent = |mut m: ClusterMap, h: &str| {
        m.host_mut(&HostId(h.into())).unwrap().liveness = HostLiveness::Absent;
        m
    };
    vec![
        Case {
            name: "ftt2 on four hosts",
            map: hosts(4, TIB),
            ftt: 2,
            width: 1,
            reservation_pct: 0,
            size_bytes: 10 * GIB,
            message: "FTT=2 with RAID-1 needs 5 fault domains, cluster has 4; \
                      RAID-1 keeps 3 copies and 2 witnesses in separate fault domains",
        },
        Case {
            name: "ftt1 on two hosts",
            map: hosts(2, TIB),
            ftt: 1,
            width: 1,
            reservation_pct: 0,
            size_bytes: 10 * GIB,
            message: "FTT=1 with RAID-1 needs 3 fault domains, cluster has 2; \
                      RAID-1 keeps 2 copies and 1 witness in separate fault domains",
        },
        Case {
            name: "ftt3 on six hosts in three racks",
            map: ClusterMap::new(vec![
                host_in("h1", "rack-a", &[TIB]),
                host_in("h2", "rack-a", &[TIB]),
                host_in("h3", "rack-b", &[TIB]),
                host_in("h4", "rack-b", &[TIB]),
                host_in("h5", "rack-c", &[TIB]),
                host_in("h6", "rack-c", &[TIB]),
            ])
            .unwrap(),
            ftt: 1 + 2,
            width: 1,
            reservation_pct: 0,
            size_bytes: GIB,
            message: "FTT=3 with RAID-1 needs 7 fault domains, cluster has 3; \
                      RAID-1 keeps 4 copies and 3 witnesses in separate fault domains",
        },
        Case {
            name: "one of three hosts absent",
            map: absent(hosts(3, TIB), "h2"),
            ftt: 1,
            width: 1,
            reservation_pct: 0,
            size_bytes: GIB,
            message: "FTT=1 with RAID-1 needs 3 fault domains, cluster has 2 usable \
                      (1 more has no live host with a healthy disk group below 95% full); \
                      RAID-1 keeps 2 copies and 1 witness in separate fault domains",
        },
        Case {
            name: "empty cluster, ftt0",
            map: ClusterMap::default(),
            ftt: 0,
            width: 1,
            reservation_pct: 0,
            size_bytes: GIB,
            message: "FTT=0 with RAID-1 needs 1 fault domain, cluster has 0",
        },
        Case {
            name: "two data hosts and a witness host cannot keep three copies",
            map: ClusterMap::new(vec![
                host("a", &[TIB]),
                host("b", &[TIB]),
                host("w1", &[GIB]).witness_only(),
                host("w2", &[GIB]).witness_only(),
                host("w3", &[GIB]).witness_only(),
            ])
            .unwrap(),
            ftt: 2,
            width: 1,
            reservation_pct: 0,
            size_bytes: GIB,
            message: "FTT=2 with RAID-1 keeps 3 copies in different fault domains, \
                      but only 2 fault domains have a live data host with a healthy disk group below 95% full",
        },
        Case {
            name: "thick volume larger than any disk group",
            map: ClusterMap::new(vec![
                host("h1", &[TIB + TIB / 2]),
                host("h2", &[TIB]),
                host("h3", &[TIB]),
            ])
            .unwrap(),
            ftt: 1,
            width: 1,
            reservation_pct: 100,
            size_bytes: 2 * TIB,
            message: "volume vm1: a thick volume of 2.0 TiB needs 2.0 TiB free per copy; \
                      the largest free space is 1.5 TiB (host h1, disk group dg0)",
        },
        Case {
            name: "half-reserved striped volume",
            map: hosts(3, 100 * GIB),
            ftt: 1,
            width: 2,
            reservation_pct: 50,
            size_bytes: 800 * GIB,
            message: "volume vm1: a volume of 800.0 GiB with 50% space reservation needs \
                      200.0 GiB free on each of 2 disk groups per copy; \
                      the largest free space is 100.0 GiB (host h1, disk group dg0)",
        },
        Case {
            name: "thick volume fits one copy but not two fault domains",
            map: ClusterMap::new(vec![
                host("h1", &[3 * TIB]),
                host("h2", &[TIB]),
                host("h3", &[TIB]),
            ])
            .unwrap(),
            ftt: 1,
            width: 1,
            reservation_pct: 100,
            size_bytes: 2 * TIB,
            message: "volume vm1: a thick volume of 2.0 TiB needs 2.0 TiB free per copy, \
                      2 copies in different fault domains; free space holds only 1 of the 2 \
                      components (largest free space 3.0 TiB on host h1, disk group dg0)",
        },
        Case {
            name: "absurd size",
            map: hosts(3, TIB),
            ftt: 1,
            width: 1,
            reservation_pct: 0,
            size_bytes: u64::MAX,
            message: "volume vm1: 16777216.0 TiB is larger than the largest volume, 1024.0 TiB",
        },
        Case {
            name: "zero size",
            map: hosts(3, TIB),
            ftt: 1,
            width: 1,
            reservation_pct: 0,
            size_bytes: 0,
            message: "volume vm1: size must be more than 0 bytes",
        },
        Case {
            name: "stripe width out of range",
            map: hosts(3, TIB),
            ftt: 1,
            width: 13,
            reservation_pct: 0,
            size_bytes: GIB,
            message: "policy p: stripe width must be 1 to 12, not 13",
        },
        Case {
            name: "ftt out of range",
            map: hosts(9, TIB),
            ftt: 4,
            width: 1,
            reservation_pct: 0,
            size_bytes: GIB,
            message: "policy p: failures to tolerate must be 0 to 3, not 4",
        },
    ]
}

#[test]
fn refusals_read_as_documented() {
    let mut failures = Vec::new();
    for case in cases() {
        let p = policy(case.ftt, case.width, case.reservation_pct);
        match place(&p, &volume("vm1"), case.size_bytes, &case.map, &mut ids()) {
            Ok(layout) => failures.push(format!(
                "{}: placed, expected a refusal:\n{}",
                case.name,
                render(&layout)
            )),
            Err(e) if e.to_string() != case.message => failures.push(format!(
                "{}:\n  got:      {e}\n  expected: {}",
                case.name, case.message
            )),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn shortfall_carries_its_numbers() {
    let map = ClusterMap::new(vec![
        host("h1", &[3 * TIB]),
        host("h2", &[TIB]),
        host("h3", &[TIB]),
    ])
    .unwrap();
    let err = place(
        &policy(1, 1, 100),
        &volume("vm1"),
        2 * TIB,
        &map,
        &mut ids(),
    )
    .unwrap_err();
    let PlacementError::CapacityShortfall(s) = err else {
        panic!("expected a capacity shortfall, got {err:?}");
    };
    assert_eq!(s.component_reserve_bytes, 2 * TIB);
    assert_eq!((s.components_needed, s.components_fit), (2, 1));
    assert_eq!(s.largest_free_bytes, 3 * TIB);
}

#[test]
fn rebuild_refusal_names_the_blocking_fault_domains() {
    // FTT=1 on exactly three hosts: when h1 fails for good there is nowhere
    // left for its copy (h2 holds the other copy, h3 the witness, and moving
    // the copy next to the witness would give h3 two of three votes).
    let mut map = hosts(3, TIB);
    let layout = place(&policy(1, 1, 0), &volume("vm1"), GIB, &map, &mut ids()).unwrap();
    map.disk_group_mut(&HostId("h1".into()), &DiskGroupId("dg0".into()))
        .unwrap()
        .health = DiskGroupHealth::Failed;
    let err =
        rebuild_target(&policy(1, 1, 0), &layout, ComponentId(1), &map, &mut ids()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "volume vm1: no rebuild target for data component c0000000000000001 of column 0: \
         2 fault domains have a live host with a usable disk group, and each already holds \
         a copy of the column (h2) or would give its fault domain too many votes"
    );
    let err =
        rebuild_target(&policy(1, 1, 0), &layout, ComponentId(99), &map, &mut ids()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "volume vm1 has no component c0000000000000063"
    );
}

#[test]
fn layout_violations_read_as_documented() {
    use tessera_placement::check_layout;
    use tessera_types::layout::{ComponentRole, Layout};
    use tessera_types::FaultDomainId;

    let map = hosts(5, TIB);
    let good = place(&policy(1, 2, 0), &volume("vm1"), 4 * GIB, &map, &mut ids()).unwrap();
    check_layout(&good, 1).unwrap();
    type Break = fn(&mut Layout);
    let table: Vec<(&str, Break, u8, &str)> = vec![
        (
            "copies share a fault domain",
            |l| l.columns[1].copies[1].fault_domain = l.columns[1].copies[0].fault_domain.clone(),
            1,
            "column 1 has two copies in fault domain h3",
        ),
        (
            "even votes",
            |l| l.witnesses[0].votes = 2,
            1,
            "vote total 6 is even",
        ),
        (
            "heavy fault domain",
            |l| {
                l.witnesses[0].votes = 3;
                l.witnesses[0].fault_domain = FaultDomainId("h1".into());
            },
            1,
            "fault domain h1 holds 4 of 7 votes: losing it loses the majority",
        ),
        (
            "zero votes",
            |l| l.columns[0].copies[0].votes = 0,
            1,
            "component c0000000000000001 has no vote",
        ),
        (
            "wrong copy count for the policy",
            |_| {},
            2,
            "column 0 has 2 copies, the policy keeps 3",
        ),
        (
            "witness with bytes",
            |l| l.witnesses[0].size_bytes = 1,
            1,
            "component c0000000000000005 has 1 bytes, expected 0",
        ),
        (
            "data in the witness list",
            |l| l.witnesses[0].role = ComponentRole::Data,
            1,
            "component c0000000000000005 is listed in the wrong role",
        ),
        (
            "duplicate id",
            |l| l.witnesses[0].id = l.columns[0].copies[0].id,
            1,
            "component c0000000000000001 appears twice",
        ),
        (
            "no columns",
            |l| l.columns.clear(),
            1,
            "layout has no columns",
        ),
    ];
    let mut failures = Vec::new();
    for (name, breaks, ftt, message) in table {
        let mut layout = good.clone();
        breaks(&mut layout);
        match check_layout(&layout, ftt) {
            Ok(()) => failures.push(format!("{name}: accepted")),
            Err(v) if v.to_string() != message => {
                failures.push(format!("{name}:\n  got:      {v}\n  expected: {message}"))
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn resize_refusals_read_as_documented() {
    use tessera_placement::resize_layout;
    let mut map = hosts(3, 100 * GIB);
    let thick = policy(1, 1, 100);
    let layout = place(&thick, &volume("vm1"), 40 * GIB, &map, &mut ids()).unwrap();
    map.reserve_layout(&layout, 100);

    let grown = resize_layout(&thick, &layout, 50 * GIB, &map).unwrap();
    assert_eq!(grown.columns[0].copies[0].size_bytes, 50 * GIB);
    assert_eq!(grown.generation, layout.generation + 1);
    assert_eq!(
        resize_layout(&thick, &layout, 40 * GIB, &map).unwrap(),
        layout
    );

    let table: Vec<(u64, &str)> = vec![
        (
            20 * GIB,
            "volume vm1: cannot shrink from 40.0 GiB to 20.0 GiB; volumes only grow",
        ),
        (
            120 * GIB,
            "volume vm1: growing to 120.0 GiB needs 80.0 GiB more free on host h1, \
             disk group dg0, which has 60.0 GiB",
        ),
    ];
    for (size, message) in table {
        let err = resize_layout(&thick, &layout, size, &map).unwrap_err();
        assert_eq!(err.to_string(), message);
    }
    // A thin volume grows without free space, but not while a copy is away.
    let thin = policy(1, 1, 0);
    assert!(resize_layout(&thin, &layout, 120 * GIB, &map).is_ok());
    map.host_mut(&HostId("h2".into())).unwrap().liveness = HostLiveness::Absent;
    let err = resize_layout(&thin, &layout, 120 * GIB, &map).unwrap_err();
    assert_eq!(
        err.to_string(),
        "volume vm1: cannot resize while component c0000000000000002 on host h2 is unreachable; \
         retry when it is back or rebuilt"
    );
}
