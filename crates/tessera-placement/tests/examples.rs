//! The worked examples of docs/PLACEMENT.md, checked: if placement changes
//! its choices, the documentation changes with it.

mod common;

use common::*;
use tessera_placement::{
    check_layout, place, rebuild_target, repair_plan, ClusterMap, DiskGroupHealth, HostLiveness,
    RepairTiming,
};
use tessera_types::layout::{ComponentRole, Layout};
use tessera_types::{DiskGroupId, HostId};

fn layout_of(map: &ClusterMap, ftt: u8, width: u8) -> Layout {
    let layout = place(
        &policy(ftt, width, 0),
        &volume("vm1"),
        10 * GIB,
        map,
        &mut ids(),
    )
    .unwrap();
    check_layout(&layout, ftt).unwrap();
    layout
}

/// Marks the data components of `layout` as written in full.
fn write_all(map: &mut ClusterMap, layout: &Layout) {
    for c in layout
        .components()
        .filter(|c| c.role == ComponentRole::Data)
    {
        map.disk_group_mut(&c.host, &c.disk_group)
            .unwrap()
            .used_bytes += c.size_bytes;
    }
}

#[test]
fn ftt1_on_three_hosts() {
    let layout = layout_of(&hosts(3, TIB), 1, 1);
    assert_eq!(
        render(&layout),
        "column 0: h1/dg0, h2/dg0\n\
         witness: h3/dg0"
    );
    assert_eq!(layout.total_votes(), 3);
}

#[test]
fn ftt1_on_four_hosts_spreads_volumes() {
    let mut map = hosts(4, TIB);
    let vm1 = layout_of(&map, 1, 1);
    assert_eq!(render(&vm1), "column 0: h1/dg0, h2/dg0\nwitness: h3/dg0");
    write_all(&mut map, &vm1);
    let vm2 = place(&policy(1, 1, 0), &volume("vm2"), 10 * GIB, &map, &mut ids()).unwrap();
    assert_eq!(render(&vm2), "column 0: h3/dg0, h4/dg0\nwitness: h1/dg0");
}

#[test]
fn ftt1_width2() {
    let four = layout_of(&hosts(4, TIB), 1, 2);
    assert_eq!(
        render(&four),
        "column 0: h1/dg0, h2/dg0\n\
         column 1: h3/dg0, h4/dg0\n\
         witness: h1/dg0"
    );
    assert_eq!(four.total_votes(), 5);
    let three = layout_of(&hosts(3, TIB), 1, 2);
    assert_eq!(
        render(&three),
        "column 0: h1/dg0, h2/dg0\n\
         column 1: h3/dg0, h1/dg0\n\
         witness: h2/dg0"
    );
    // Each column is 5 GiB: 10 GiB over two columns of 1 MiB stripe units.
    assert_eq!(three.columns[0].copies[0].size_bytes, 5 * GIB);
}

#[test]
fn ftt2_on_five_hosts() {
    let layout = layout_of(&hosts(5, TIB), 2, 1);
    assert_eq!(
        render(&layout),
        "column 0: h1/dg0, h2/dg0, h3/dg0\n\
         witness: h4/dg0, h5/dg0"
    );
    assert_eq!(layout.total_votes(), 5);
}

#[test]
fn stretched_cluster_puts_the_witness_on_the_witness_host() {
    let map = ClusterMap::new(vec![
        host_in("a1", "site-a", &[TIB]),
        host_in("a2", "site-a", &[TIB]),
        host_in("b1", "site-b", &[TIB]),
        host_in("b2", "site-b", &[TIB]),
        host("w", &[GIB]).witness_only(),
    ])
    .unwrap();
    let layout = layout_of(&map, 1, 1);
    assert_eq!(render(&layout), "column 0: a1/dg0, b1/dg0\nwitness: w/dg0");
}

#[test]
fn rebuild_after_a_host_loss() {
    let mut map = hosts(4, TIB);
    let layout = layout_of(&map, 1, 1);
    map.host_mut(&HostId("h1".into())).unwrap().liveness = HostLiveness::Absent;
    let plan = repair_plan(&layout, &map);
    assert!(plan.accessible);
    assert_eq!(plan.repairs.len(), 1);
    assert_eq!(plan.repairs[0].timing, RepairTiming::AfterRepairDelay);
    let new = rebuild_target(
        &policy(1, 1, 0),
        &layout,
        plan.repairs[0].component,
        &map,
        &mut ids(),
    )
    .unwrap();
    assert_eq!((new.host.as_str(), new.disk_group.as_str()), ("h4", "dg0"));

    // A failed disk group is rebuilt at once, on the same host if another
    // disk group there keeps the rules.
    let mut map = ClusterMap::new(vec![
        host("h1", &[TIB, TIB]),
        host("h2", &[TIB]),
        host("h3", &[TIB]),
    ])
    .unwrap();
    let layout = layout_of(&map, 1, 1);
    let lost = layout.columns[0].copies[0].clone();
    assert_eq!(
        (lost.host.as_str(), lost.disk_group.as_str()),
        ("h1", "dg0")
    );
    map.disk_group_mut(&HostId("h1".into()), &DiskGroupId("dg0".into()))
        .unwrap()
        .health = DiskGroupHealth::Failed;
    let plan = repair_plan(&layout, &map);
    assert_eq!(plan.repairs[0].timing, RepairTiming::Immediate);
    let new = rebuild_target(&policy(1, 1, 0), &layout, lost.id, &map, &mut ids()).unwrap();
    assert_eq!((new.host.as_str(), new.disk_group.as_str()), ("h1", "dg1"));
}

#[test]
fn many_volumes_fill_equal_disk_groups_evenly() {
    // Six hosts with two 4 TiB disk groups each; 400 FTT=1 volumes of
    // 1-16 GiB with widths 1-4, each written in full after placement.
    let mut map = ClusterMap::new(
        (1..=6)
            .map(|i| host(&format!("h{i}"), &[4 * TIB, 4 * TIB]))
            .collect(),
    )
    .unwrap();
    let mut next = ids();
    for i in 0..400u64 {
        let width = (i % 4 + 1) as u8;
        let size = (i * 7 % 16 + 1) * GIB;
        let layout = place(
            &policy(1, width, 0),
            &volume(&format!("v{i}")),
            size,
            &map,
            &mut next,
        )
        .unwrap();
        write_all(&mut map, &layout);
    }
    let used: Vec<u64> = map
        .hosts()
        .iter()
        .flat_map(|h| h.disk_groups.iter().map(|d| d.used_bytes))
        .collect();
    let (max, min) = (*used.iter().max().unwrap(), *used.iter().min().unwrap());
    let ratio = max as f64 / min as f64;
    println!("used per disk group: min {min} max {max} ratio {ratio:.4}");
    // The spread stays under one component of the largest volume (16 GiB).
    assert!(max - min <= 16 * GIB, "spread {} GiB", (max - min) / GIB);
    assert!(ratio < 1.02, "max/min used {ratio}");
}

#[test]
fn evacuating_a_host_before_maintenance() {
    let map = hosts(4, TIB);
    let layout = layout_of(&map, 1, 1);
    let moves = tessera_placement::evacuate(
        &policy(1, 1, 0),
        &layout,
        &HostId("h1".into()),
        &map,
        &mut ids(),
    )
    .unwrap();
    assert_eq!(moves.len(), 1);
    assert_eq!(moves[0].to.host.as_str(), "h4");
    // On three hosts nothing can leave h1 without losing protection.
    let map = hosts(3, TIB);
    let layout = layout_of(&map, 1, 1);
    assert!(tessera_placement::evacuate(
        &policy(1, 1, 0),
        &layout,
        &HostId("h1".into()),
        &map,
        &mut ids()
    )
    .is_err());
}
