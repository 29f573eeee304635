//! Owner election: which host coordinates a volume's I/O, and at which epoch.
//!
//! Owns: the protocol over two keys per volume. `owners/<volume>` holds the
//! [`OwnerRecord`] and is attached to the owner's lease, so it vanishes when
//! the owner stops renewing; `owner-epochs/<volume>` holds the highest epoch
//! ever granted and has no lease.
//!
//! Must not touch: fencing itself. Replicas reject writes from an epoch below
//! the highest they have seen; this module only guarantees that epochs are
//! handed out once each and always upward.
//!
//! Invariants (held by one transaction per acquisition that requires the
//! owner key to be absent and the epoch key to be unchanged since it was
//! read):
//! - at most one live owner per volume at any revision;
//! - every acquisition gets an epoch strictly above every earlier one, even
//!   after the previous owner's key vanished with its lease.

use crate::keys::{self, Keyspace, OwnerEpochRecord, OwnerRecord};
use crate::{Directory, DirectoryError, LeaseId, Result, Txn};
use tessera_types::{Epoch, HostId, VolumeId};

/// Times [`acquire_owner`] re-reads and retries when another host changed the
/// owner keys between its read and its write.
pub const ACQUIRE_ATTEMPTS_MAX: u32 = 16;

/// Makes `host` the owner of `volume` with its key attached to `lease`, at
/// the highest epoch so far + 1, if no live owner exists. If `host` already
/// owns the volume under `lease`, returns the current record unchanged.
/// Fails with [`DirectoryError::OwnerHeld`] while another owner's lease
/// lives, and with [`DirectoryError::LeaseNotFound`] if `lease` is gone.
pub async fn acquire_owner(
    directory: &dyn Directory,
    keys: &Keyspace,
    volume: &VolumeId,
    host: &HostId,
    lease: LeaseId,
) -> Result<OwnerRecord> {
    let owner_key = keys.owner(volume);
    let epoch_key = keys.owner_epoch(volume);
    for _ in 0..ACQUIRE_ATTEMPTS_MAX {
        if let Some(current) = keys::get(directory, &owner_key).await? {
            let current = current.value;
            if current.host == *host && current.lease == lease {
                return Ok(current);
            }
            return Err(DirectoryError::OwnerHeld {
                volume: volume.to_string(),
                owner: current.host.to_string(),
                epoch: current.epoch,
            });
        }
        let highest = keys::get(directory, &epoch_key).await?;
        let epoch = highest
            .as_ref()
            .map_or(Epoch::default(), |r| r.value.epoch)
            .next();
        let epoch_unchanged = match &highest {
            Some(r) => epoch_key.at_revision(r.mod_revision),
            None => epoch_key.absent(),
        };
        let record = OwnerRecord {
            volume: volume.clone(),
            host: host.clone(),
            epoch,
            lease,
        };
        let txn = Txn::new()
            .when([owner_key.absent(), epoch_unchanged])
            .and_then([
                epoch_key.put_op(
                    &OwnerEpochRecord {
                        volume: volume.clone(),
                        epoch,
                    },
                    None,
                )?,
                owner_key.put_op(&record, Some(lease))?,
            ]);
        if directory.txn(txn).await?.succeeded {
            tracing::info!(%volume, %host, %epoch, "took ownership");
            return Ok(record);
        }
    }
    Err(DirectoryError::Contended {
        key: owner_key.to_string(),
        attempts: ACQUIRE_ATTEMPTS_MAX,
    })
}

/// The volume's live owner, if any.
pub async fn current_owner(
    directory: &dyn Directory,
    keys: &Keyspace,
    volume: &VolumeId,
) -> Result<Option<OwnerRecord>> {
    Ok(keys::get(directory, &keys.owner(volume))
        .await?
        .map(|r| r.value))
}

/// Gives up ownership described by `owner` (a clean hand-over); returns false
/// if that ownership had already ended. Never removes a successor's key.
pub async fn release_owner(
    directory: &dyn Directory,
    keys: &Keyspace,
    owner: &OwnerRecord,
) -> Result<bool> {
    let key = keys.owner(&owner.volume);
    let txn = Txn::new()
        .when([key.holds(owner)?])
        .and_then([key.delete_op()]);
    Ok(directory.txn(txn).await?.succeeded)
}
