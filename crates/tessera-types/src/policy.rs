//! Storage policies: what a volume asks of the cluster.
//!
//! Owns: the [`Policy`] record and its validation. Must not touch: placement
//! decisions (which hosts can satisfy a policy is `tessera-placement`'s job).
//! Invariant: a [`Policy`] that passed [`Policy::validate`] has every field in
//! the range the rest of the system supports.

use crate::PolicyName;
use serde::{Deserialize, Serialize};

/// Highest failures-to-tolerate a policy may ask for (vSAN allows 3 with RAID-1).
pub const FTT_MAX: u8 = 3;
/// Widest stripe a policy may ask for (vSAN's limit).
pub const STRIPE_WIDTH_MAX: u8 = 12;

/// How an object tolerates failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FaultTolerance {
    /// Full copies of the data (RAID-1 mirroring), FTT+1 of them.
    #[default]
    Raid1,
}

/// A storage policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// The policy's name.
    pub name: PolicyName,
    /// Host, disk or fault-domain failures the object survives (0..=3).
    pub failures_to_tolerate: u8,
    /// How it survives them.
    #[serde(default)]
    pub fault_tolerance: FaultTolerance,
    /// Columns each copy is striped across (1..=12), each on its own disk group.
    pub stripe_width: u8,
    /// Percentage of the volume's size reserved up front (0 = thin, 100 = thick).
    pub space_reservation_pct: u8,
    /// Whether data is checksummed per 4 KiB block (on by default, as in vSAN 6.2).
    #[serde(default = "default_true")]
    pub checksum: bool,
}

fn default_true() -> bool {
    true
}

/// Why a policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// FTT outside 0..=3.
    #[error("policy {policy}: failures to tolerate must be 0 to {FTT_MAX}, not {value}")]
    FailuresToTolerate {
        /// Which policy.
        policy: String,
        /// The refused value.
        value: u8,
    },
    /// Stripe width outside 1..=12.
    #[error("policy {policy}: stripe width must be 1 to {STRIPE_WIDTH_MAX}, not {value}")]
    StripeWidth {
        /// Which policy.
        policy: String,
        /// The refused value.
        value: u8,
    },
    /// Reservation above 100 %.
    #[error("policy {policy}: space reservation must be 0 to 100 percent, not {value}")]
    SpaceReservation {
        /// Which policy.
        policy: String,
        /// The refused value.
        value: u8,
    },
}

impl Policy {
    /// A policy with the defaults `tessera up` uses: FTT=1, RAID-1, stripe
    /// width 1, thin, checksummed.
    pub fn new(name: PolicyName, failures_to_tolerate: u8) -> Policy {
        Policy {
            name,
            failures_to_tolerate,
            fault_tolerance: FaultTolerance::Raid1,
            stripe_width: 1,
            space_reservation_pct: 0,
            checksum: true,
        }
    }

    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let policy = self.name.to_string();
        if self.failures_to_tolerate > FTT_MAX {
            return Err(PolicyError::FailuresToTolerate {
                policy,
                value: self.failures_to_tolerate,
            });
        }
        if self.stripe_width == 0 || self.stripe_width > STRIPE_WIDTH_MAX {
            return Err(PolicyError::StripeWidth {
                policy,
                value: self.stripe_width,
            });
        }
        if self.space_reservation_pct > 100 {
            return Err(PolicyError::SpaceReservation {
                policy,
                value: self.space_reservation_pct,
            });
        }
        Ok(())
    }

    /// Copies of each stripe column the policy keeps.
    pub fn copies(&self) -> usize {
        self.failures_to_tolerate as usize + 1
    }
}
