//! Secrets the cluster keeps in its directory (CHAP secrets), sealed with
//! a key only the hosts hold.
//!
//! Owns: the cluster's secrets key (32 random bytes in a 0600 file beside
//! the CA) and sealing and opening one secret with it (AES-256-GCM through
//! ring, a random 96-bit nonce per seal, bound to what the secret is for).
//! Must not touch: where sealed secrets are stored; callers keep the text.
//! Invariant: a sealed secret names its format (`sealed-v1:`), so a record
//! written before sealing existed (plain text) is still read, and a
//! record whose seal does not open (another cluster's key, a changed byte)
//! is an error, never a wrong secret.

use crate::TlsError;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::path::Path;

/// How a sealed secret starts.
pub const SEALED_PREFIX: &str = "sealed-v1:";
/// Bytes of a secrets key.
const KEY_BYTES: usize = 32;

/// The cluster's secrets key.
pub struct SecretsKey {
    key: LessSafeKey,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(<hidden>)")
    }
}

impl SecretsKey {
    /// A new random key.
    pub fn generate() -> Result<(Self, [u8; KEY_BYTES]), TlsError> {
        let mut bytes = [0u8; KEY_BYTES];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| TlsError::Config("no randomness for a secrets key".into()))?;
        Ok((Self::from_bytes(&bytes)?, bytes))
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, TlsError> {
        let key = UnboundKey::new(&AES_256_GCM, bytes)
            .map_err(|_| TlsError::Config("a secrets key has 32 bytes".into()))?;
        Ok(Self {
            key: LessSafeKey::new(key),
        })
    }

    /// The key kept in `path` (hex, as [`crate::ClusterCredentials`]
    /// writes it).
    pub fn load(path: &Path) -> Result<Self, TlsError> {
        let text = crate::read(path)?;
        let bytes = decode_hex(text.trim())
            .filter(|b| b.len() == KEY_BYTES)
            .ok_or_else(|| TlsError::Pem {
                what: path.display().to_string(),
                reason: format!("not a secrets key ({} hex digits)", 2 * KEY_BYTES),
            })?;
        Self::from_bytes(&bytes)
    }

    /// `secret` sealed for `purpose` (e.g. `chap/<volume>/initiator`): it
    /// opens only with this key and the same purpose.
    pub fn seal(&self, purpose: &str, secret: &str) -> Result<String, TlsError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| TlsError::Config("no randomness for a nonce".into()))?;
        let mut sealed = secret.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(purpose.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| TlsError::Config("sealing a secret failed".into()))?;
        let mut out = String::from(SEALED_PREFIX);
        out.push_str(&encode_hex(&nonce));
        out.push_str(&encode_hex(&sealed));
        Ok(out)
    }

    /// The secret `stored` holds: opened when sealed, as it is when it was
    /// stored before sealing existed.
    pub fn open(&self, purpose: &str, stored: &str) -> Result<String, TlsError> {
        let Some(hex) = stored.strip_prefix(SEALED_PREFIX) else {
            return Ok(stored.to_owned());
        };
        let unreadable = || {
            TlsError::Config(format!(
                "a sealed secret ({purpose}) does not open with this cluster's secrets key"
            ))
        };
        let bytes = decode_hex(hex).ok_or_else(unreadable)?;
        if bytes.len() < NONCE_LEN {
            return Err(unreadable());
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| unreadable())?;
        let mut sealed = sealed.to_vec();
        let opened = self
            .key
            .open_in_place(nonce, Aad::from(purpose.as_bytes()), &mut sealed)
            .map_err(|_| unreadable())?;
        String::from_utf8(opened.to_vec()).map_err(|_| unreadable())
    }
}

pub(crate) fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_with_its_key_and_purpose() {
        let (key, _) = SecretsKey::generate().unwrap();
        let sealed = key.seal("chap/db/initiator", "alice-secret-12").unwrap();
        assert!(sealed.starts_with(SEALED_PREFIX));
        assert!(!sealed.contains("alice-secret-12"));
        assert_eq!(
            key.open("chap/db/initiator", &sealed).unwrap(),
            "alice-secret-12"
        );
        assert_ne!(
            sealed,
            key.seal("chap/db/initiator", "alice-secret-12").unwrap()
        );
        assert!(key.open("chap/db/target", &sealed).is_err());
        let (other, _) = SecretsKey::generate().unwrap();
        assert!(other.open("chap/db/initiator", &sealed).is_err());
        let mut flipped = sealed.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert!(key
            .open("chap/db/initiator", std::str::from_utf8(&flipped).unwrap())
            .is_err());
        // Stored before sealing existed: read as it is.
        assert_eq!(
            key.open("chap/db/initiator", "plain-secret-12").unwrap(),
            "plain-secret-12"
        );
    }
}
