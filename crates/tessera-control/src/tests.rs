//! The decisions of a host, event by event, and the invariants of the
//! module doc over random event sequences.

use super::*;
use proptest::prelude::*;
use tessera_types::layout::{ComponentPlacement, Mirror};
use tessera_types::{DiskGroupId, FaultDomainId};

const REPAIR: Duration = Duration::from_secs(60);
const BACKOFF: Duration = Duration::from_secs(5);
const TICK: Duration = Duration::from_millis(500);

fn host(n: u8) -> HostId {
    HostId(format!("host-{n}"))
}

fn volume(n: u8) -> VolumeId {
    VolumeId(format!("vol-{n}"))
}

fn placement(id: u64, role: ComponentRole, on: u8, state: ComponentState) -> ComponentPlacement {
    ComponentPlacement {
        id: ComponentId(id),
        role,
        host: host(on),
        disk_group: DiskGroupId("dg-0".into()),
        fault_domain: FaultDomainId(format!("fd-{on}")),
        votes: 1,
        size_bytes: if role == ComponentRole::Data {
            1 << 30
        } else {
            0
        },
        state,
    }
}

/// `volume`'s FTT=1 layout: data copies on hosts `a` and `b` (components
/// 1 and 2), a witness on `w` (component 3), in `states`.
fn layout(v: u8, a: u8, b: u8, w: u8, states: [ComponentState; 3], generation: u64) -> Layout {
    Layout {
        volume: volume(v),
        size_bytes: 1 << 30,
        stripe_unit_bytes: 1 << 20,
        columns: vec![Mirror {
            copies: vec![
                placement(u64::from(v) * 10 + 1, ComponentRole::Data, a, states[0]),
                placement(u64::from(v) * 10 + 2, ComponentRole::Data, b, states[1]),
            ],
        }],
        witnesses: vec![placement(
            u64::from(v) * 10 + 3,
            ComponentRole::Witness,
            w,
            states[2],
        )],
        generation,
    }
}

const ACTIVE: [ComponentState; 3] = [ComponentState::Active; 3];

fn core(n: u8) -> HostControl {
    HostControl::new(
        host(n),
        ControlConfig {
            repair_delay: REPAIR,
            resync_backoff: BACKOFF,
        },
    )
}

/// Hosts 1-3 live, volume 1 ready with its layout on hosts 1, 2 and 3.
fn cluster(me: u8) -> HostControl {
    let mut c = core(me);
    for h in 1..=3 {
        c.handle(Event::HostLiveness {
            host: host(h),
            live: true,
        });
    }
    c.handle(Event::VolumeRecorded {
        volume: volume(1),
        ready: true,
    });
    c.handle(Event::LayoutRecorded {
        layout: layout(1, 1, 2, 3, ACTIVE, 1),
    });
    c
}

/// `c` takes volume 1 at epoch 1 and coordinates it with `l`.
fn coordinate(c: &mut HostControl, l: Layout) {
    let me = c.host().clone();
    c.handle(Event::OwnerRecorded {
        volume: volume(1),
        host: me,
        epoch: Epoch(1),
    });
    c.handle(Event::Coordinating {
        volume: volume(1),
        epoch: Epoch(1),
        layout: l,
    });
}

fn tick(c: &mut HostControl, at: Duration) -> Vec<Action> {
    c.handle(Event::Tick { now: at })
}

#[test]
fn the_first_live_data_host_takes_an_ownerless_volume_at_once() {
    let mut first = cluster(1);
    assert_eq!(
        tick(&mut first, TICK),
        vec![Action::TakeOwnership { volume: volume(1) }]
    );
    // The other data host waits a tick, the witness host longer.
    let mut second = cluster(2);
    assert!(tick(&mut second, TICK).is_empty());
    assert_eq!(
        tick(&mut second, 2 * TICK),
        vec![Action::TakeOwnership { volume: volume(1) }]
    );
    let mut witness = cluster(3);
    for i in 1..ANY_HOST_TICKS {
        assert!(tick(&mut witness, TICK * i).is_empty(), "tick {i}");
    }
    assert_eq!(
        tick(&mut witness, TICK * ANY_HOST_TICKS),
        vec![Action::TakeOwnership { volume: volume(1) }]
    );
}

#[test]
fn a_volume_with_an_owner_or_not_ready_is_not_taken() {
    let mut c = cluster(1);
    c.handle(Event::OwnerRecorded {
        volume: volume(1),
        host: host(2),
        epoch: Epoch(4),
    });
    assert!(tick(&mut c, TICK).is_empty());
    c.handle(Event::OwnerRemoved { volume: volume(1) });
    c.handle(Event::VolumeRecorded {
        volume: volume(1),
        ready: false,
    });
    assert!(tick(&mut c, 2 * TICK).is_empty());
}

#[test]
fn when_the_first_data_host_is_away_the_next_one_is_first() {
    let mut c = cluster(2);
    c.handle(Event::HostLiveness {
        host: host(1),
        live: false,
    });
    assert_eq!(
        tick(&mut c, TICK),
        vec![Action::TakeOwnership { volume: volume(1) }]
    );
}

#[test]
fn coordinators_stop_when_ownership_moves_the_volume_goes_or_a_higher_epoch_is_met() {
    let stop = vec![Action::StopCoordinating { volume: volume(1) }];
    // Owned elsewhere now.
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    assert!(tick(&mut c, TICK).is_empty());
    c.handle(Event::OwnerRecorded {
        volume: volume(1),
        host: host(2),
        epoch: Epoch(2),
    });
    assert_eq!(tick(&mut c, 2 * TICK), stop);
    assert_eq!(c.coordinating().count(), 0);
    // Deleted.
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    c.handle(Event::VolumeRemoved { volume: volume(1) });
    assert_eq!(tick(&mut c, TICK), stop);
    // Superseded.
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    c.handle(Event::CoordinatorSuperseded { volume: volume(1) });
    assert_eq!(tick(&mut c, TICK), stop);
    // Its owner record gone with a lease (and not taken back in the same tick).
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    c.handle(Event::OwnerRemoved { volume: volume(1) });
    let actions = tick(&mut c, TICK);
    assert_eq!(actions[0], stop[0]);
}

#[test]
fn a_take_over_holds_before_the_directory_reports_its_owner_record() {
    let mut c = cluster(1);
    assert_eq!(
        tick(&mut c, TICK),
        vec![Action::TakeOwnership { volume: volume(1) }]
    );
    c.handle(Event::Coordinating {
        volume: volume(1),
        epoch: Epoch(3),
        layout: layout(1, 1, 2, 3, ACTIVE, 1),
    });
    // The watch has not brought the owner record yet: still coordinating.
    assert!(tick(&mut c, 2 * TICK).is_empty());
    assert_eq!(c.coordinating().count(), 1);
}

#[test]
fn an_owner_record_naming_this_host_without_its_coordinator_is_released() {
    // Stepped down on older news (the previous owner's record going
    // away, heard after its own take-over), then its own record arrives.
    let mut c = cluster(1);
    c.handle(Event::OwnerRecorded {
        volume: volume(1),
        host: host(1),
        epoch: Epoch(3),
    });
    assert_eq!(
        tick(&mut c, TICK),
        vec![Action::ReleaseOwnership {
            volume: volume(1),
            epoch: Epoch(3)
        }]
    );
    c.handle(Event::OwnerRemoved { volume: volume(1) });
    assert_eq!(
        tick(&mut c, 2 * TICK),
        vec![Action::TakeOwnership { volume: volume(1) }]
    );
}

#[test]
fn a_lost_lease_drops_every_coordinator_and_asks_only_to_rejoin() {
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    assert_eq!(
        c.handle(Event::LeaseLost),
        vec![Action::DropAllCoordinators]
    );
    assert_eq!(c.coordinating().count(), 0);
    c.handle(Event::OwnerRemoved { volume: volume(1) });
    // Ownerless, and this host the first data host: still nothing but rejoin.
    assert_eq!(tick(&mut c, TICK), vec![Action::Rejoin]);
    assert_eq!(tick(&mut c, 2 * TICK), vec![Action::Rejoin]);
    // A take-over that completes after the lease lapsed is undone.
    assert_eq!(
        c.handle(Event::Coordinating {
            volume: volume(1),
            epoch: Epoch(2),
            layout: layout(1, 1, 2, 3, ACTIVE, 1),
        }),
        vec![Action::StopCoordinating { volume: volume(1) }]
    );
    c.handle(Event::LeaseHeld);
    assert_eq!(
        tick(&mut c, 3 * TICK),
        vec![Action::TakeOwnership { volume: volume(1) }]
    );
}

#[test]
fn an_absent_copy_is_recorded_then_rebuilt_after_the_repair_delay() {
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    c.handle(Event::HostLiveness {
        host: host(2),
        live: false,
    });
    let t0 = Duration::from_secs(100);
    assert_eq!(
        tick(&mut c, t0),
        vec![Action::RecordHostAbsent {
            volume: volume(1),
            host: host(2)
        }]
    );
    // The coordinator recorded it: from now on it waits for its host.
    use ComponentState::{Absent, Active};
    c.handle(Event::CoordinatorLayout {
        layout: layout(1, 1, 2, 3, [Active, Absent, Active], 2),
    });
    let waiting = Action::ResyncWaiting {
        volume: volume(1),
        component: ComponentId(12),
    };
    assert_eq!(tick(&mut c, t0 + TICK), vec![waiting.clone()]);
    assert_eq!(
        c.repair_in(&volume(1), ComponentId(12), t0 + TICK),
        Some(REPAIR)
    );
    assert_eq!(tick(&mut c, t0 + REPAIR - TICK), vec![waiting.clone()]);
    assert_eq!(
        tick(&mut c, t0 + REPAIR + TICK),
        vec![
            waiting,
            Action::Rebuild {
                volume: volume(1),
                component: ComponentId(12)
            }
        ]
    );
    // The rebuild replaced it with component 14 on host 4: filled at once.
    assert_eq!(
        c.handle(Event::Rebuilt {
            volume: volume(1),
            lost: ComponentId(12),
            replacement: Some((ComponentId(14), host(4))),
        }),
        vec![Action::StartResync {
            volume: volume(1),
            component: ComponentId(14),
            host: host(4),
            kind: ResyncKind::Rebuild,
        }]
    );
    assert!(c.is_resyncing(&volume(1), ComponentId(14)));
    assert_eq!(c.repair_in(&volume(1), ComponentId(12), t0), None);
}

#[test]
fn a_returning_copy_is_resynced_once_and_a_failed_resync_waits_its_backoff() {
    use ComponentState::{Absent, Active};
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, [Active, Absent, Active], 2));
    let start = Action::StartResync {
        volume: volume(1),
        component: ComponentId(12),
        host: host(2),
        kind: ResyncKind::Resync,
    };
    let t0 = Duration::from_secs(10);
    assert_eq!(tick(&mut c, t0), vec![start.clone()]);
    // Running: not started again.
    assert!(tick(&mut c, t0 + TICK).is_empty());
    c.handle(Event::ResyncEnded {
        volume: volume(1),
        component: ComponentId(12),
        ok: false,
    });
    let waiting = Action::ResyncWaiting {
        volume: volume(1),
        component: ComponentId(12),
    };
    assert_eq!(tick(&mut c, t0 + 2 * TICK), vec![waiting.clone()]);
    assert_eq!(tick(&mut c, t0 + TICK + BACKOFF - TICK), vec![waiting]);
    assert_eq!(tick(&mut c, t0 + TICK + BACKOFF), vec![start]);
    c.handle(Event::ResyncEnded {
        volume: volume(1),
        component: ComponentId(12),
        ok: true,
    });
    c.handle(Event::CoordinatorLayout {
        layout: layout(1, 1, 2, 3, ACTIVE, 3),
    });
    assert!(tick(&mut c, t0 + BACKOFF + 2 * TICK).is_empty());
}

#[test]
fn a_returning_witness_votes_again_and_a_failed_copy_is_rebuilt_at_once() {
    use ComponentState::{Absent, Active, Degraded};
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, [Active, Degraded, Absent], 2));
    assert_eq!(
        tick(&mut c, TICK),
        vec![
            Action::Rebuild {
                volume: volume(1),
                component: ComponentId(12)
            },
            Action::RecordWitnessPresent {
                volume: volume(1),
                host: host(3)
            },
        ]
    );
}

#[test]
fn a_copy_on_a_failed_disk_group_or_device_is_rebuilt_at_once_not_resynced() {
    let rebuild = |id| Action::Rebuild {
        volume: volume(1),
        component: ComponentId(id),
    };
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    // Host 2's disk group lost its cache device: its copy is gone though
    // the host is up.
    c.handle(Event::DiskGroupHealth {
        host: host(2),
        disk_group: DiskGroupId("dg-0".into()),
        failed: true,
        failed_components: BTreeSet::new(),
    });
    assert_eq!(tick(&mut c, TICK), vec![rebuild(12)]);
    // Marked absent by a failed write meanwhile: still rebuilt, never resynced.
    use ComponentState::{Absent, Active};
    c.handle(Event::CoordinatorLayout {
        layout: layout(1, 1, 2, 3, [Active, Absent, Active], 2),
    });
    assert_eq!(tick(&mut c, 2 * TICK), vec![rebuild(12)]);
    // A failed capacity device names the components it took.
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    c.handle(Event::DiskGroupHealth {
        host: host(1),
        disk_group: DiskGroupId("dg-0".into()),
        failed: false,
        failed_components: [ComponentId(11)].into(),
    });
    assert_eq!(tick(&mut c, TICK), vec![rebuild(11)]);
    // Healthy again (a replaced device): nothing more to do.
    c.handle(Event::DiskGroupHealth {
        host: host(1),
        disk_group: DiskGroupId("dg-0".into()),
        failed: false,
        failed_components: BTreeSet::new(),
    });
    assert!(tick(&mut c, 2 * TICK).is_empty());
}

#[test]
fn an_evacuated_disk_group_is_emptied_one_move_at_a_time_and_only_from_a_whole_volume() {
    use ComponentState::{Absent, Active};
    let mut c = cluster(1);
    c.handle(Event::HostLiveness {
        host: host(4),
        live: true,
    });
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    let evacuating = |c: &mut HostControl, on: bool| {
        c.handle(Event::DiskGroupEvacuating {
            host: host(2),
            disk_group: DiskGroupId("dg-0".into()),
            evacuating: on,
        })
    };
    evacuating(&mut c, true);
    let evacuate = Action::Evacuate {
        volume: volume(1),
        component: ComponentId(12),
    };
    assert_eq!(tick(&mut c, TICK), vec![evacuate.clone()]);
    // A new copy was added beside it: it is filled, and nothing else moves
    // until it is.
    let fill = c.handle(Event::Evacuated {
        volume: volume(1),
        component: ComponentId(12),
        added: Some((ComponentId(14), host(4))),
    });
    assert_eq!(
        fill,
        vec![Action::StartResync {
            volume: volume(1),
            component: ComponentId(14),
            host: host(4),
            kind: ResyncKind::Evacuate,
        }]
    );
    let mut with_new = layout(1, 1, 2, 3, ACTIVE, 2);
    let mut new = with_new.columns[0].copies[0].clone();
    new.id = ComponentId(14);
    new.host = host(4);
    new.state = ComponentState::Resyncing;
    with_new.columns[0].copies.push(new);
    c.handle(Event::CoordinatorLayout { layout: with_new });
    assert!(tick(&mut c, 2 * TICK).is_empty(), "the fill runs");
    c.handle(Event::ResyncEnded {
        volume: volume(1),
        component: ComponentId(14),
        ok: true,
    });
    let mut filled = c.coordinating[&volume(1)].layout.clone();
    filled.generation = 3;
    filled.columns[0].copies[2].state = Active;
    c.handle(Event::CoordinatorLayout { layout: filled });
    assert_eq!(
        tick(&mut c, 3 * TICK),
        vec![evacuate],
        "now the old copy goes"
    );
    // A volume missing a copy elsewhere is repaired first, not evacuated.
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, [Active, Active, Absent], 1));
    evacuating(&mut c, true);
    assert!(!tick(&mut c, TICK)
        .iter()
        .any(|a| matches!(a, Action::Evacuate { .. })));
    // An evacuation that ends stops the moves.
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 1));
    evacuating(&mut c, true);
    evacuating(&mut c, false);
    assert!(tick(&mut c, TICK).is_empty());
}

#[test]
fn an_older_coordinator_layout_changes_nothing() {
    use ComponentState::{Absent, Active};
    let mut c = cluster(1);
    coordinate(&mut c, layout(1, 1, 2, 3, ACTIVE, 5));
    c.handle(Event::CoordinatorLayout {
        layout: layout(1, 1, 2, 3, [Active, Absent, Active], 4),
    });
    assert!(tick(&mut c, TICK).is_empty());
}

// --- invariants over random event sequences --------------------------------

const HOSTS: u8 = 4;
const VOLUMES: u8 = 3;

fn any_state() -> impl Strategy<Value = ComponentState> {
    prop_oneof![
        Just(ComponentState::Active),
        Just(ComponentState::Absent),
        Just(ComponentState::Resyncing),
        Just(ComponentState::Degraded),
    ]
}

fn any_layout() -> impl Strategy<Value = Layout> {
    (
        1..=VOLUMES,
        1..=HOSTS,
        1..=HOSTS,
        1..=HOSTS,
        [any_state(), any_state(), any_state()],
        0..8u64,
    )
        .prop_map(|(v, a, b, w, states, g)| layout(v, a, b, w, states, g))
}

/// Events from a small cluster (4 hosts, 3 volumes), including ones that
/// make no sense for the moment they arrive (a resync end never started, a
/// layout of a volume not coordinated): the core must stay within its
/// invariants whatever the directory and the host tell it.
fn any_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0..3_000u64).prop_map(|ms| Event::Tick { now: Duration::from_millis(ms * 100) }),
        1 => Just(Event::LeaseLost),
        1 => Just(Event::LeaseHeld),
        2 => (1..=HOSTS, any::<bool>()).prop_map(|(h, live)| Event::HostLiveness { host: host(h), live }),
        1 => (1..=HOSTS, any::<bool>(), proptest::collection::btree_set(1..40u64, 0..3)).prop_map(|(h, failed, ids)| Event::DiskGroupHealth {
            host: host(h),
            disk_group: DiskGroupId("dg-0".into()),
            failed,
            failed_components: ids.into_iter().map(ComponentId).collect(),
        }),
        2 => (1..=VOLUMES, any::<bool>()).prop_map(|(v, ready)| Event::VolumeRecorded { volume: volume(v), ready }),
        1 => (1..=VOLUMES).prop_map(|v| Event::VolumeRemoved { volume: volume(v) }),
        2 => (1..=VOLUMES, 1..=HOSTS, 1..4u64).prop_map(|(v, h, e)| Event::OwnerRecorded { volume: volume(v), host: host(h), epoch: Epoch(e) }),
        1 => (1..=VOLUMES).prop_map(|v| Event::OwnerRemoved { volume: volume(v) }),
        2 => any_layout().prop_map(|layout| Event::LayoutRecorded { layout }),
        2 => (1..4u64, any_layout()).prop_map(|(e, layout)| Event::Coordinating { volume: layout.volume.clone(), epoch: Epoch(e), layout }),
        2 => any_layout().prop_map(|layout| Event::CoordinatorLayout { layout }),
        1 => (1..=VOLUMES).prop_map(|v| Event::CoordinatorSuperseded { volume: volume(v) }),
        1 => (1..=VOLUMES, 1..4u64, proptest::option::of((1..4u64, 1..=HOSTS))).prop_map(|(v, c, r)| Event::Rebuilt {
            volume: volume(v),
            lost: ComponentId(u64::from(v) * 10 + c),
            replacement: r.map(|(id, h)| (ComponentId(u64::from(v) * 10 + 3 + id), host(h))),
        }),
        2 => (1..=VOLUMES, 1..7u64, any::<bool>()).prop_map(|(v, c, ok)| Event::ResyncEnded { volume: volume(v), component: ComponentId(u64::from(v) * 10 + c), ok }),
        1 => (1..=HOSTS, any::<bool>()).prop_map(|(h, evacuating)| Event::DiskGroupEvacuating {
            host: host(h),
            disk_group: DiskGroupId("dg-0".into()),
            evacuating,
        }),
        1 => (1..=VOLUMES, 1..4u64, proptest::option::of((1..4u64, 1..=HOSTS))).prop_map(|(v, c, added)| Event::Evacuated {
            volume: volume(v),
            component: ComponentId(u64::from(v) * 10 + c),
            added: added.map(|(id, h)| (ComponentId(u64::from(v) * 10 + 3 + id), host(h))),
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `handle` checks the module's invariants on every action (and panics
    /// on a breach); this also follows the resyncs the core starts and its
    /// lease from the outside.
    #[test]
    fn invariants_hold_over_any_event_sequence(events in proptest::collection::vec(any_event(), 1..200)) {
        let mut c = core(1);
        let mut running: BTreeSet<(VolumeId, ComponentId)> = BTreeSet::new();
        let mut lease = true;
        let mut now = Duration::ZERO;
        for event in events {
            // Time as the host sends it: never backwards.
            let event = match event {
                Event::Tick { now: t } => { now = now.max(t); Event::Tick { now } }
                e => e,
            };
            match &event {
                Event::LeaseLost => lease = false,
                Event::LeaseHeld => lease = true,
                Event::ResyncEnded { volume, component, .. } => {
                    running.remove(&(volume.clone(), *component));
                }
                _ => {}
            }
            for action in c.handle(event) {
                if !lease {
                    prop_assert!(matches!(action, Action::DropAllCoordinators | Action::Rejoin | Action::StopCoordinating { .. }), "{action:?} without a lease");
                }
                if let Action::StartResync { volume, component, .. } = action {
                    prop_assert!(running.insert((volume, component)), "a second resync of one component");
                }
            }
            if !lease {
                prop_assert_eq!(c.coordinating().count(), 0);
            }
        }
    }

    /// The same events give the same actions: what lets one seed replay a
    /// whole cluster.
    #[test]
    fn the_same_events_give_the_same_actions(events in proptest::collection::vec(any_event(), 1..100)) {
        let (mut a, mut b) = (core(2), core(2));
        for event in events {
            prop_assert_eq!(a.handle(event.clone()), b.handle(event));
        }
    }
}
