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
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum FaultTolerance {
    /// Full copies of the data (RAID-1 mirroring), FTT+1 of them.
    #[default]
    Raid1,
}

/// A storage policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// The I/O each volume of the policy may use and is guaranteed, as its
    /// owner enforces it (none of either by default).
    #[serde(default, skip_serializing_if = "VolumeQos::is_unlimited")]
    pub qos: VolumeQos,
}

/// Highest IOPS a QoS limit or minimum may name.
pub const QOS_IOPS_MAX: u32 = 10_000_000;
/// Highest bandwidth in MiB/s a QoS limit may name.
pub const QOS_BANDWIDTH_MAX_MIB_S: u32 = 1_000_000;

/// A volume's quality of service: what its owner lets it use at most and
/// what it keeps however busy the host is. 0 means none.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct VolumeQos {
    /// Operations per second the volume may not exceed (0: no limit).
    #[serde(default)]
    pub iops_limit: u32,
    /// MiB per second the volume may not exceed (0: no limit).
    #[serde(default)]
    pub bandwidth_limit_mib_s: u32,
    /// Operations per second the volume is served first when it asks for
    /// them, however busy its owner is (0: no minimum).
    #[serde(default)]
    pub iops_minimum: u32,
}

impl VolumeQos {
    /// No limit and no minimum.
    pub fn is_unlimited(&self) -> bool {
        *self == VolumeQos::default()
    }
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
    /// A QoS figure out of range, or a minimum above the limit.
    #[error("policy {policy}: {reason}")]
    Qos {
        /// Which policy.
        policy: String,
        /// What is wrong, in the user's words.
        reason: String,
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
            qos: VolumeQos::default(),
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
        self.validate_qos()
    }

    fn validate_qos(&self) -> Result<(), PolicyError> {
        let q = &self.qos;
        let reason = if q.iops_limit > QOS_IOPS_MAX {
            format!(
                "the IOPS limit must be at most {QOS_IOPS_MAX}, not {}",
                q.iops_limit
            )
        } else if q.iops_minimum > QOS_IOPS_MAX {
            format!(
                "the IOPS minimum must be at most {QOS_IOPS_MAX}, not {}",
                q.iops_minimum
            )
        } else if q.bandwidth_limit_mib_s > QOS_BANDWIDTH_MAX_MIB_S {
            format!(
                "the bandwidth limit must be at most {QOS_BANDWIDTH_MAX_MIB_S} MiB/s, not {}",
                q.bandwidth_limit_mib_s
            )
        } else if q.iops_limit != 0 && q.iops_minimum > q.iops_limit {
            format!(
                "the IOPS minimum ({}) cannot be above the IOPS limit ({})",
                q.iops_minimum, q.iops_limit
            )
        } else {
            return Ok(());
        };
        Err(PolicyError::Qos {
            policy: self.name.to_string(),
            reason,
        })
    }

    /// Copies of each stripe column the policy keeps.
    pub fn copies(&self) -> usize {
        self.failures_to_tolerate as usize + 1
    }
}
