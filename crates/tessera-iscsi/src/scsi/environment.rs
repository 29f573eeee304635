//! What a logical unit needs from the host it runs on: state shared by every
//! host and path (reservations), the ALUA layout of target ports, other
//! units (EXTENDED COPY targets), datastore space and which VAAI offloads
//! the host offers.
//!
//! Owns: the [`UnitEnvironment`] trait and [`MemoryEnvironment`], the
//! implementation single-host servers and tests use. A cluster host
//! implements the trait over the directory.
//! Invariant: reservation state is replaced only by compare-and-swap on its
//! version, so two hosts applying PR OUT at once never lose either update.

use super::reservations::ReservationState;
use async_trait::async_trait;
use parking_lot::Mutex;
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, MemoryDevice};

/// Asymmetric access state of a target port group (SPC-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AluaState {
    /// 0x0: the owner's host.
    ActiveOptimized,
    /// 0x1: every other host.
    ActiveNonOptimized,
    /// 0x2
    Standby,
    /// 0x3
    Unavailable,
    /// 0xF: ownership is moving.
    Transitioning,
}

impl AluaState {
    /// The ASYMMETRIC ACCESS STATE code.
    pub fn code(self) -> u8 {
        match self {
            AluaState::ActiveOptimized => 0x0,
            AluaState::ActiveNonOptimized => 0x1,
            AluaState::Standby => 0x2,
            AluaState::Unavailable => 0x3,
            AluaState::Transitioning => 0xF,
        }
    }
}

/// One target port group: the ports of one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPortGroup {
    /// Group identifier (non-zero).
    pub id: u16,
    /// Its access state.
    pub state: AluaState,
    /// Relative target port identifiers in the group.
    pub ports: Vec<u16>,
}

/// Datastore space, for the thin-provisioning soft threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatastoreSpace {
    /// Bytes in use.
    pub used_bytes: u64,
    /// Bytes the datastore can hold.
    pub capacity_bytes: u64,
    /// Percent in use past which units raise THIN PROVISIONING SOFT
    /// THRESHOLD REACHED, when the datastore sets it (a cluster setting a
    /// user may change at any time); None: each unit's
    /// [`super::UnitSettings::soft_threshold_percent`].
    pub soft_threshold_percent: Option<u8>,
}

/// The VAAI offloads a unit offers. Each can be turned off while units
/// serve (as an array lets its administrator do when an initiator's use of
/// one misbehaves): a unit then says it lacks the command everywhere an
/// initiator looks (standard INQUIRY, VPD pages, REPORT SUPPORTED
/// OPERATION CODES) and refuses it with INVALID COMMAND OPERATION CODE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offloads {
    /// COMPARE AND WRITE (ATS, the hardware-assisted lock).
    pub compare_and_write: bool,
    /// EXTENDED COPY and RECEIVE COPY RESULTS (XCOPY, clone).
    pub extended_copy: bool,
    /// WRITE SAME (10) and (16) (block zeroing, and unmapping through it).
    pub write_same: bool,
    /// UNMAP (space reclamation, "dead space" deletion).
    pub unmap: bool,
}

impl Offloads {
    /// Every offload offered: the default.
    pub const ALL: Offloads = Offloads {
        compare_and_write: true,
        extended_copy: true,
        write_same: true,
        unmap: true,
    };

    /// Whether the command with operation code `opcode` is offered (every
    /// command that is not an offload is).
    pub fn offers(&self, opcode: u8) -> bool {
        use super::cdb::op;
        match opcode {
            op::COMPARE_AND_WRITE => self.compare_and_write,
            op::EXTENDED_COPY | op::RECEIVE_COPY_RESULTS => self.extended_copy,
            op::WRITE_SAME_10 | op::WRITE_SAME_16 => self.write_same,
            op::UNMAP => self.unmap,
            _ => true,
        }
    }
}

impl Default for Offloads {
    fn default() -> Self {
        Offloads::ALL
    }
}

/// A version of the shared reservation state.
#[derive(Debug, Clone)]
pub struct VersionedReservations {
    /// Changes on every store.
    pub version: u64,
    /// The state.
    pub state: Arc<ReservationState>,
}

/// Why the environment could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvironmentError {
    /// The shared store (the directory) is out of reach.
    #[error("reservation store unavailable: {0}")]
    Unavailable(String),
}

/// State and services a host gives one logical unit.
#[async_trait]
pub trait UnitEnvironment: Send + Sync + 'static {
    /// The reservation state every host and path sees. Called for every
    /// command that a reservation could refuse, so it should be served from
    /// a cache the host keeps current.
    async fn reservations(&self) -> Result<VersionedReservations, EnvironmentError>;

    /// The reservation state as it is now, read at its source rather than
    /// from a cache: for reservation commands and for commands that are not
    /// data transfers, so a registration or reset made through another host
    /// is seen by the very next such command. The default is
    /// [`UnitEnvironment::reservations`].
    async fn reservations_now(&self) -> Result<VersionedReservations, EnvironmentError> {
        self.reservations().await
    }

    /// Replaces the state if its version is still `version`; `Ok(false)`
    /// when another writer got there first (the caller reloads and retries).
    async fn store_reservations(
        &self,
        version: u64,
        state: ReservationState,
    ) -> Result<bool, EnvironmentError>;

    /// Target port groups that serve this unit.
    fn port_groups(&self) -> Vec<TargetPortGroup>;

    /// Another unit of the datastore by the designator of its VPD 0x83 NAA
    /// descriptor (the bytes after the 4-byte descriptor header).
    fn resolve_designator(&self, designator: &[u8]) -> Option<Arc<dyn BlockDevice>>;

    /// Datastore space, when the host knows it.
    fn datastore_space(&self) -> Option<DatastoreSpace>;

    /// The offloads the unit offers now; asked on every command, so it
    /// should be a read of state the host keeps current. Every offload
    /// unless the host says otherwise.
    fn offloads(&self) -> Offloads {
        Offloads::ALL
    }
}

/// Units of one in-memory datastore, for EXTENDED COPY between them and the
/// space they use together.
#[derive(Default)]
pub struct MemoryDatastore {
    units: Mutex<Vec<Arc<dyn BlockDevice>>>,
    capacity_bytes: Mutex<Option<u64>>,
    soft_threshold_percent: Mutex<Option<u8>>,
}

impl MemoryDatastore {
    /// An empty datastore.
    pub fn new() -> Arc<Self> {
        Arc::new(MemoryDatastore::default())
    }

    /// Makes `device` reachable by its NAA designator.
    pub fn add(&self, device: Arc<dyn BlockDevice>) {
        self.units.lock().push(device);
    }

    /// Sets the capacity the soft threshold is measured against.
    pub fn set_capacity(&self, bytes: u64) {
        *self.capacity_bytes.lock() = Some(bytes);
    }

    /// Sets the datastore's soft threshold (None: the units' own).
    pub fn set_soft_threshold(&self, percent: Option<u8>) {
        *self.soft_threshold_percent.lock() = percent;
    }

    fn resolve(&self, designator: &[u8]) -> Option<Arc<dyn BlockDevice>> {
        self.units
            .lock()
            .iter()
            .find(|d| super::inquiry::naa_designator(d.info().serial)[..] == *designator)
            .cloned()
    }

    fn space(&self) -> Option<DatastoreSpace> {
        let capacity = (*self.capacity_bytes.lock())?;
        let used = self
            .units
            .lock()
            .iter()
            .map(|d| match d.as_any().downcast_ref::<MemoryDevice>() {
                // Blocks shared by EXTENDED COPY count once.
                Some(memory) => memory.physical_bytes(),
                None => d.space().allocated_bytes,
            })
            .sum();
        Some(DatastoreSpace {
            used_bytes: used,
            capacity_bytes: capacity,
            soft_threshold_percent: *self.soft_threshold_percent.lock(),
        })
    }
}

/// Reservations kept in one process's memory, changed by compare-and-swap
/// on their version: for a unit whose reservations no other process shares.
pub struct LocalReservations(Mutex<VersionedReservations>);

impl Default for LocalReservations {
    fn default() -> Self {
        LocalReservations(Mutex::new(VersionedReservations {
            version: 0,
            state: Arc::new(ReservationState::default()),
        }))
    }
}

impl LocalReservations {
    /// The reservations now, with their version.
    pub fn current(&self) -> VersionedReservations {
        self.0.lock().clone()
    }

    /// Replaces them with `state` if they are still at `version`; false
    /// (nothing changed) otherwise.
    pub fn store(&self, version: u64, state: ReservationState) -> bool {
        let mut current = self.0.lock();
        if current.version != version {
            return false;
        }
        *current = VersionedReservations {
            version: version + 1,
            state: Arc::new(state),
        };
        true
    }
}

/// Reservations, port groups and datastore of a unit served by one process.
pub struct MemoryEnvironment {
    reservations: LocalReservations,
    port_groups: Mutex<Vec<TargetPortGroup>>,
    datastore: Arc<MemoryDatastore>,
    offloads: Mutex<Offloads>,
}

impl MemoryEnvironment {
    /// One port group (id 1, active/optimized) holding relative port 1, in
    /// `datastore`.
    pub fn new(datastore: Arc<MemoryDatastore>) -> Self {
        MemoryEnvironment {
            reservations: LocalReservations::default(),
            port_groups: Mutex::new(vec![TargetPortGroup {
                id: 1,
                state: AluaState::ActiveOptimized,
                ports: vec![1],
            }]),
            datastore,
            offloads: Mutex::new(Offloads::ALL),
        }
    }

    /// Replaces the port groups (ownership moved, a host joined).
    pub fn set_port_groups(&self, groups: Vec<TargetPortGroup>) {
        *self.port_groups.lock() = groups;
    }

    /// Changes the offloads the unit offers from its next command on.
    pub fn set_offloads(&self, offloads: Offloads) {
        *self.offloads.lock() = offloads;
    }
}

#[async_trait]
impl UnitEnvironment for MemoryEnvironment {
    async fn reservations(&self) -> Result<VersionedReservations, EnvironmentError> {
        Ok(self.reservations.current())
    }

    async fn store_reservations(
        &self,
        version: u64,
        state: ReservationState,
    ) -> Result<bool, EnvironmentError> {
        Ok(self.reservations.store(version, state))
    }

    fn port_groups(&self) -> Vec<TargetPortGroup> {
        self.port_groups.lock().clone()
    }

    fn resolve_designator(&self, designator: &[u8]) -> Option<Arc<dyn BlockDevice>> {
        self.datastore.resolve(designator)
    }

    fn datastore_space(&self) -> Option<DatastoreSpace> {
        self.datastore.space()
    }

    fn offloads(&self) -> Offloads {
        *self.offloads.lock()
    }
}
