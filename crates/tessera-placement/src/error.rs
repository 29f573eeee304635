//! Why a placement or a rebuild was refused, worded for the person who asked.
//!
//! Owns: [`PlacementError`] and its messages. Every variant carries the
//! numbers behind the refusal (fault domains needed and available, bytes
//! needed and free, where the largest free space is) so the CLI can print the
//! message as is and the API can return the fields.

use crate::check::LayoutViolation;
use crate::cluster::DISK_GROUP_FULL_PCT;
use tessera_types::layout::ComponentRole;
use tessera_types::policy::PolicyError;
use tessera_types::{format_size, ComponentId, DiskGroupId, FaultDomainId, HostId, VolumeId};

/// The numbers behind a refusal for lack of space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityShortfall {
    /// The volume.
    pub volume: VolumeId,
    /// Its size.
    pub size_bytes: u64,
    /// Its space reservation in percent.
    pub reservation_pct: u8,
    /// Columns per copy.
    pub stripe_width: usize,
    /// Copies per column.
    pub copies: usize,
    /// Bytes each data component reserves.
    pub component_reserve_bytes: u64,
    /// Data components the volume needs (width x copies).
    pub components_needed: usize,
    /// How many of them the cluster's free space can hold while keeping the
    /// copies of each column in different fault domains.
    pub components_fit: usize,
    /// The largest free space of any disk group that may hold data.
    pub largest_free_bytes: u64,
    /// Where that is.
    pub largest_free_at: Option<(HostId, DiskGroupId)>,
}

/// Why placement refused a volume or a rebuild.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The policy itself is out of range.
    #[error(transparent)]
    InvalidPolicy(#[from] PolicyError),

    /// A volume must have some bytes.
    #[error("volume {volume}: size must be more than 0 bytes")]
    EmptyVolume {
        /// The volume.
        volume: VolumeId,
    },

    /// Larger than [`crate::place::VOLUME_BYTES_MAX`].
    #[error("volume {volume}: {} is larger than the largest volume, {}", format_size(*.size_bytes), format_size(crate::place::VOLUME_BYTES_MAX))]
    VolumeTooLarge {
        /// The volume.
        volume: VolumeId,
        /// The size asked for.
        size_bytes: u64,
    },

    /// Fewer fault domains can hold a component than the policy's copies
    /// and witnesses need (2 * FTT + 1 for RAID-1).
    #[error("{}", not_enough_fault_domains(*.ftt, *.needed, *.usable, *.total))]
    NotEnoughFaultDomains {
        /// Failures to tolerate asked for.
        ftt: u8,
        /// Fault domains the policy needs.
        needed: usize,
        /// Fault domains with a live host and a disk group that takes components.
        usable: usize,
        /// Fault domains in the cluster map.
        total: usize,
    },

    /// Enough fault domains for the votes, but too few can hold data.
    #[error("FTT={ftt} with RAID-1 keeps {copies} copies in different fault domains, but only {usable} {} a live data host with a healthy disk group below {DISK_GROUP_FULL_PCT}% full", if *.usable == 1 { "fault domain has" } else { "fault domains have" })]
    NotEnoughDataFaultDomains {
        /// Failures to tolerate asked for.
        ftt: u8,
        /// Copies the policy keeps.
        copies: usize,
        /// Fault domains that can hold data.
        usable: usize,
    },

    /// The reserved space of the volume does not fit.
    #[error("{0}")]
    CapacityShortfall(Box<CapacityShortfall>),

    /// Volumes only grow.
    #[error("volume {volume}: cannot shrink from {} to {}; volumes only grow", format_size(*.size_bytes), format_size(*.new_size_bytes))]
    ShrinkRefused {
        /// The volume.
        volume: VolumeId,
        /// Its size now.
        size_bytes: u64,
        /// The size asked for.
        new_size_bytes: u64,
    },

    /// A component that cannot grow now (its host or disk group is down).
    #[error("volume {volume}: cannot resize while component {component} on host {host} is unreachable; retry when it is back or rebuilt")]
    ResizeNeedsEveryComponent {
        /// The volume.
        volume: VolumeId,
        /// The unreachable component.
        component: ComponentId,
        /// Its host.
        host: HostId,
    },

    /// A disk group holding the volume lacks room for the larger reservation.
    #[error("volume {volume}: growing to {} needs {} more free on host {host}, disk group {disk_group}, which has {}", format_size(*.new_size_bytes), format_size(*.needed_bytes), format_size(*.free_bytes))]
    GrowthShortfall {
        /// The volume.
        volume: VolumeId,
        /// The size asked for.
        new_size_bytes: u64,
        /// The host.
        host: HostId,
        /// The disk group.
        disk_group: DiskGroupId,
        /// Extra reservation its components of this volume need.
        needed_bytes: u64,
        /// Its free space.
        free_bytes: u64,
    },

    /// The layout has no component with this id.
    #[error("volume {volume} has no component {component}")]
    UnknownComponent {
        /// The volume.
        volume: VolumeId,
        /// The id asked for.
        component: ComponentId,
    },

    /// The layout handed in breaks the placement rules already.
    #[error("volume {volume}: {violation}")]
    InvalidLayout {
        /// The volume.
        volume: VolumeId,
        /// What is wrong with it.
        violation: LayoutViolation,
    },

    /// No disk group can take a replacement without breaking the rules.
    #[error("{}", no_rebuild_target(self))]
    NoRebuildTarget {
        /// The volume.
        volume: VolumeId,
        /// The lost component.
        component: ComponentId,
        /// Its role.
        role: ComponentRole,
        /// Its column, for data components.
        column: Option<usize>,
        /// Bytes a replacement must reserve.
        reserve_bytes: u64,
        /// Fault domains with a live host and a disk group that could take it.
        fault_domains_with_room: usize,
        /// Fault domains ruled out because they hold another copy of the column.
        fault_domains_holding_column: Vec<FaultDomainId>,
    },
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

fn not_enough_fault_domains(ftt: u8, needed: usize, usable: usize, total: usize) -> String {
    let mut text = format!(
        "FTT={ftt} with RAID-1 needs {}, cluster has {usable}",
        plural(needed, "fault domain", "fault domains")
    );
    if total > usable {
        text.push_str(&format!(
            " usable ({} no live host with a healthy disk group below {DISK_GROUP_FULL_PCT}% full)",
            plural(total - usable, "more has", "more have")
        ));
    }
    if ftt > 0 {
        text.push_str(&format!(
            "; RAID-1 keeps {} and {} in separate fault domains",
            plural(usize::from(ftt) + 1, "copy", "copies"),
            plural(usize::from(ftt), "witness", "witnesses")
        ));
    }
    text
}

impl std::fmt::Display for CapacityShortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&capacity_shortfall(self))
    }
}

fn capacity_shortfall(e: &CapacityShortfall) -> String {
    let CapacityShortfall {
        volume,
        size_bytes,
        reservation_pct,
        stripe_width,
        copies,
        component_reserve_bytes,
        components_needed,
        components_fit,
        largest_free_bytes,
        largest_free_at,
    } = e;
    let kind = if *reservation_pct >= 100 {
        format!("a thick volume of {}", format_size(*size_bytes))
    } else {
        format!(
            "a volume of {} with {reservation_pct}% space reservation",
            format_size(*size_bytes)
        )
    };
    let need = if *stripe_width == 1 {
        format!("{} free per copy", format_size(*component_reserve_bytes))
    } else {
        format!(
            "{} free on each of {stripe_width} disk groups per copy",
            format_size(*component_reserve_bytes)
        )
    };
    let place = largest_free_at
        .as_ref()
        .map(|(host, dg)| format!("host {host}, disk group {dg}"));
    if largest_free_bytes < component_reserve_bytes {
        let at = place.map(|p| format!(" ({p})")).unwrap_or_default();
        format!(
            "volume {volume}: {kind} needs {need}; the largest free space is {}{at}",
            format_size(*largest_free_bytes)
        )
    } else {
        let at = place.map(|p| format!(" on {p}")).unwrap_or_default();
        format!(
            "volume {volume}: {kind} needs {need}, {copies} copies in different fault domains; \
             free space holds only {components_fit} of the {components_needed} components \
             (largest free space {}{at})",
            format_size(*largest_free_bytes)
        )
    }
}

fn no_rebuild_target(e: &PlacementError) -> String {
    let PlacementError::NoRebuildTarget {
        volume,
        component,
        role,
        column,
        reserve_bytes,
        fault_domains_with_room,
        fault_domains_holding_column,
    } = e
    else {
        return String::new();
    };
    let what = match (role, column) {
        (ComponentRole::Data, Some(col)) => format!("data component {component} of column {col}"),
        (ComponentRole::Data, None) => format!("data component {component}"),
        (ComponentRole::Witness, _) => format!("witness component {component}"),
    };
    let room = if *reserve_bytes > 0 {
        format!(" with {} free", format_size(*reserve_bytes))
    } else {
        String::new()
    };
    let mut text = format!(
        "volume {volume}: no rebuild target for {what}: {} a live host with a usable disk group{room}",
        plural(
            *fault_domains_with_room,
            "fault domain has",
            "fault domains have"
        )
    );
    if *fault_domains_with_room > 0 {
        text.push_str(", and each ");
        if fault_domains_holding_column.is_empty() {
            text.push_str("would give its fault domain too many votes");
        } else {
            let names: Vec<&str> = fault_domains_holding_column
                .iter()
                .map(|f| f.as_str())
                .collect();
            text.push_str(&format!(
                "already holds a copy of the column ({}) or would give its fault domain too many votes",
                names.join(", ")
            ));
        }
    }
    text
}
