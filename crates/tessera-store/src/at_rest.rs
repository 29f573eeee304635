//! Encryption at rest: the keys of an encrypted disk group and the device
//! handles that encrypt every block it stores.
//!
//! Owns: key encryption keys (KEKs) as a host holds them, the group's data
//! keys (random, sealed by a KEK in every device's superblock), the AES-XTS
//! cipher of 4 KiB blocks, and [`EncryptedDisk`], which sits between the
//! store and a device. Must not touch: the store's structures. Everything
//! above this layer (log, checkpoints, index pages, data blocks, root
//! tables) is plaintext in memory and ciphertext on the device, so the
//! store's format, checksums and recovery are the same with or without
//! encryption: a CRC32C is computed over plaintext, and a bit flipped in the
//! ciphertext decrypts to a whole garbled block that fails it.
//!
//! Invariants:
//! - Only blocks 0 and 1 (the superblocks) of a device are stored in clear:
//!   they hold the sealed keys and the state of a rekey, never data.
//! - A block is encrypted with AES-256-XTS under its device's data key of
//!   the generation that covers it (below the device's rekey cursor the next
//!   generation, else the current one), the tweak being the device index
//!   and the block number: the same plaintext stored twice, or on two
//!   devices, gives different ciphertext.
//! - Which generation covers a block only changes while the deep rekey holds
//!   the lock of the piece of the device that holds it
//!   ([`EncryptedDisk::rekey_piece`]); every read and write holds that lock
//!   shared for the pieces it touches, so none sees a piece half rekeyed.
//! - A data key is sealed with AES-256-GCM, the disk group's identity and
//!   the key's generation bound in as associated data: a sealed key copied to
//!   another group, or passed off as another generation, fails to open.
//!
//! XTS is built here from the `aes` crate's block cipher (the mode is a few
//! lines: a tweak multiplied by x in GF(2^128) between blocks) because the
//! crates that offer the mode encrypt one 16-byte block at a time, about
//! 0.8 GB/s on these machines; handing all 256 blocks of a 4 KiB unit to
//! AES-NI at once runs several times faster. Tests hold it to the IEEE
//! 1619 vectors and to the `xts-mode` crate on random input.

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::{Aes256, Block};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use ring::aead;
use ring::rand::{SecureRandom, SystemRandom};
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tessera_env::{AlignedBuf, Disk, DiskError};
use tessera_format::{Superblock, WrappedKey, BLOCK, DATA_KEY_BYTES, SEALED_KEY_BYTES};
use zeroize::Zeroizing;

use crate::StoreError;

/// Bytes of a key encryption key (AES-256).
pub const KEK_BYTES: usize = 32;

/// Blocks at the start of every device stored in clear: the two superblocks.
pub(crate) const CLEAR_BLOCKS: u64 = 2;

/// Blocks rewritten under the next key in one step of a deep rekey, and the
/// size of the rekey journal area at the end of every encrypted device.
pub const REKEY_PIECE_BLOCKS: u64 = 256;

/// Locks guarding the pieces of a device during a deep rekey (piece `p` is
/// guarded by lock `p % REKEY_LOCKS`).
const REKEY_LOCKS: usize = 64;

fn fail(problem: impl Into<String>) -> StoreError {
    StoreError::Encryption(problem.into())
}

/// Fingerprint of a key encryption key: names it in superblocks and
/// messages without revealing it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KekId(pub [u8; 8]);

impl fmt::Display for KekId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KekId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KekId({self})")
    }
}

/// A key encryption key: seals the data keys of disk groups. Read from a
/// file the host's configuration names (an external key server is the
/// next source; it hands over the same 32 bytes by id).
#[derive(Clone)]
pub struct KeyEncryptionKey {
    id: KekId,
    key: Arc<Zeroizing<[u8; KEK_BYTES]>>,
}

impl fmt::Debug for KeyEncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyEncryptionKey({})", self.id)
    }
}

impl PartialEq for KeyEncryptionKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for KeyEncryptionKey {}

impl KeyEncryptionKey {
    /// The key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; KEK_BYTES]) -> KeyEncryptionKey {
        let digest = ring::digest::digest(
            &ring::digest::SHA256,
            &[b"tessera key encryption key id v1".as_slice(), &bytes].concat(),
        );
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest.as_ref()[..8]);
        KeyEncryptionKey {
            id: KekId(id),
            key: Arc::new(Zeroizing::new(bytes)),
        }
    }

    /// A new random key.
    pub fn generate() -> Result<KeyEncryptionKey, StoreError> {
        let mut bytes = [0u8; KEK_BYTES];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| fail("the system's random source failed"))?;
        let kek = KeyEncryptionKey::from_bytes(bytes);
        bytes.fill(0);
        Ok(kek)
    }

    /// Reads a key file: 64 hexadecimal digits (white space around them is
    /// ignored) or exactly 32 raw bytes. Refuses a file that users other
    /// than its owner may read or write.
    pub fn load(path: &Path) -> Result<KeyEncryptionKey, StoreError> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display();
        let meta = std::fs::metadata(path)
            .map_err(|e| fail(format!("cannot read the key file {shown}: {e}")))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(fail(format!(
                "the key file {shown} is open to other users (mode {:o}); chmod 600 it",
                meta.permissions().mode() & 0o777
            )));
        }
        let raw = Zeroizing::new(
            std::fs::read(path)
                .map_err(|e| fail(format!("cannot read the key file {shown}: {e}")))?,
        );
        let mut bytes = [0u8; KEK_BYTES];
        let text = std::str::from_utf8(&raw).map(str::trim).unwrap_or("");
        if text.len() == 2 * KEK_BYTES && text.bytes().all(|c| c.is_ascii_hexdigit()) {
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap_or(0);
            }
        } else if raw.len() == KEK_BYTES {
            bytes.copy_from_slice(&raw);
        } else {
            return Err(fail(format!(
                "the key file {shown} holds neither 64 hexadecimal digits nor 32 bytes"
            )));
        }
        let kek = KeyEncryptionKey::from_bytes(bytes);
        bytes.fill(0);
        Ok(kek)
    }

    /// Writes the key as 64 hexadecimal digits to a new file readable by its
    /// owner only; refuses to replace an existing file.
    pub fn save_new(&self, path: &Path) -> Result<(), StoreError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let shown = path.display();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| fail(format!("cannot create the key file {shown}: {e}")))?;
        let mut text = Zeroizing::new(String::with_capacity(2 * KEK_BYTES + 1));
        for b in self.key.iter() {
            text.push_str(&format!("{b:02x}"));
        }
        text.push('\n');
        file.write_all(text.as_bytes())
            .and_then(|_| file.sync_all())
            .map_err(|e| fail(format!("cannot write the key file {shown}: {e}")))
    }

    /// The key's fingerprint.
    pub fn id(&self) -> KekId {
        self.id
    }

    fn aead(&self) -> aead::LessSafeKey {
        aead::LessSafeKey::new(
            aead::UnboundKey::new(&aead::AES_256_GCM, &self.key[..])
                .expect("32 bytes are an AES-256 key"),
        )
    }
}

/// The key encryption keys a host holds: the current one seals new and
/// rewrapped data keys; retired ones still open data keys they sealed
/// (until a shallow rekey rewraps them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtRestKeys {
    /// Seals data keys.
    pub current: KeyEncryptionKey,
    /// Open data keys only.
    pub retired: Vec<KeyEncryptionKey>,
}

impl AtRestKeys {
    /// Only `current`.
    pub fn new(current: KeyEncryptionKey) -> AtRestKeys {
        AtRestKeys {
            current,
            retired: Vec::new(),
        }
    }

    fn find(&self, id: KekId) -> Option<&KeyEncryptionKey> {
        std::iter::once(&self.current)
            .chain(&self.retired)
            .find(|k| k.id == id)
    }
}

/// A disk group's data key of one generation: two AES-256 keys for XTS.
#[derive(Clone)]
pub(crate) struct DataKey {
    bytes: Arc<Zeroizing<[u8; DATA_KEY_BYTES]>>,
    cipher: Arc<Xts>,
}

fn seal_aad(group_uuid: u128, generation: u32) -> Vec<u8> {
    let mut aad = b"tessera data key v1".to_vec();
    aad.extend_from_slice(&group_uuid.to_le_bytes());
    aad.extend_from_slice(&generation.to_le_bytes());
    aad
}

impl DataKey {
    pub(crate) fn generate() -> Result<DataKey, StoreError> {
        let mut bytes = Zeroizing::new([0u8; DATA_KEY_BYTES]);
        SystemRandom::new()
            .fill(&mut bytes[..])
            .map_err(|_| fail("the system's random source failed"))?;
        Ok(DataKey::from_bytes(bytes))
    }

    fn from_bytes(bytes: Zeroizing<[u8; DATA_KEY_BYTES]>) -> DataKey {
        let cipher = Arc::new(Xts::new(&bytes));
        DataKey {
            bytes: Arc::new(bytes),
            cipher,
        }
    }

    /// Seals the key with `kek` for generation `generation` of the group.
    pub(crate) fn wrap(
        &self,
        kek: &KeyEncryptionKey,
        group_uuid: u128,
        generation: u32,
    ) -> Result<WrappedKey, StoreError> {
        let mut nonce = [0u8; 12];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| fail("the system's random source failed"))?;
        let mut sealed = [0u8; SEALED_KEY_BYTES];
        sealed[..DATA_KEY_BYTES].copy_from_slice(&self.bytes[..]);
        let tag = kek
            .aead()
            .seal_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(seal_aad(group_uuid, generation)),
                &mut sealed[..DATA_KEY_BYTES],
            )
            .map_err(|_| fail("sealing a data key failed"))?;
        sealed[DATA_KEY_BYTES..].copy_from_slice(tag.as_ref());
        Ok(WrappedKey {
            kek_id: kek.id.0,
            nonce,
            sealed,
        })
    }

    /// Opens a sealed key with whichever of `keys` sealed it.
    pub(crate) fn unwrap(
        wrapped: &WrappedKey,
        keys: &AtRestKeys,
        group_uuid: u128,
        generation: u32,
    ) -> Result<DataKey, StoreError> {
        let id = KekId(wrapped.kek_id);
        let kek = keys.find(id).ok_or_else(|| {
            fail(format!(
                "the data key is sealed by key encryption key {id}; this host holds {}{}",
                keys.current.id,
                keys.retired
                    .iter()
                    .map(|k| format!(", {}", k.id))
                    .collect::<String>()
            ))
        })?;
        let mut sealed = Zeroizing::new(wrapped.sealed);
        let plain = kek
            .aead()
            .open_in_place(
                aead::Nonce::assume_unique_for_key(wrapped.nonce),
                aead::Aad::from(seal_aad(group_uuid, generation)),
                &mut sealed[..],
            )
            .map_err(|_| {
                fail(format!(
                    "the data key sealed by key encryption key {id} fails its check (damaged, \
                     or copied from another disk group)"
                ))
            })?;
        let mut bytes = Zeroizing::new([0u8; DATA_KEY_BYTES]);
        bytes.copy_from_slice(plain);
        Ok(DataKey::from_bytes(bytes))
    }
}

/// AES-256 in XTS mode (IEEE 1619) over whole 4 KiB blocks.
pub(crate) struct Xts {
    data: Aes256,
    tweak: Aes256,
}

/// Blocks of 16 bytes in one 4 KiB unit.
const LANES: usize = BLOCK / 16;

impl Xts {
    fn new(key: &[u8; DATA_KEY_BYTES]) -> Xts {
        Xts {
            data: Aes256::new_from_slice(&key[..32]).expect("32-byte key"),
            tweak: Aes256::new_from_slice(&key[32..]).expect("32-byte key"),
        }
    }

    /// The tweaks of the unit's 256 blocks: the encrypted unit number, then
    /// multiplied by x in GF(2^128) (little-endian) from block to block.
    fn tweaks(&self, unit: u128) -> [u128; LANES] {
        let mut t = Block::from(unit.to_le_bytes());
        self.tweak.encrypt_block(&mut t);
        let mut tweak = u128::from_le_bytes(t.into());
        let mut all = [0u128; LANES];
        for slot in all.iter_mut() {
            *slot = tweak;
            let carry = (tweak >> 127) as u8;
            tweak = (tweak << 1) ^ (0x87 * carry as u128);
        }
        all
    }

    fn xor_tweaks(blocks: &mut [Block], tweaks: &[u128; LANES]) {
        for (b, t) in blocks.iter_mut().zip(tweaks) {
            let v = u128::from_le_bytes((*b).into()) ^ t;
            *b = Block::from(v.to_le_bytes());
        }
    }

    /// Encrypts one 4 KiB unit in place.
    pub(crate) fn encrypt(&self, unit: u128, buf: &mut [u8]) {
        let tweaks = self.tweaks(unit);
        let (blocks, rest) = Block::slice_as_chunks_mut(buf);
        debug_assert!(rest.is_empty() && blocks.len() == LANES);
        Self::xor_tweaks(blocks, &tweaks);
        self.data.encrypt_blocks(blocks);
        Self::xor_tweaks(blocks, &tweaks);
    }

    /// Decrypts one 4 KiB unit in place.
    pub(crate) fn decrypt(&self, unit: u128, buf: &mut [u8]) {
        let tweaks = self.tweaks(unit);
        let (blocks, rest) = Block::slice_as_chunks_mut(buf);
        debug_assert!(rest.is_empty() && blocks.len() == LANES);
        Self::xor_tweaks(blocks, &tweaks);
        self.data.decrypt_blocks(blocks);
        Self::xor_tweaks(blocks, &tweaks);
    }
}

/// The XTS unit number of a block of a device.
fn unit(device: u8, block: u64) -> u128 {
    ((device as u128) << 64) | block as u128
}

/// Which data keys cover a device's blocks.
struct DeviceKeys {
    current: DataKey,
    generation: u32,
    /// During a deep rekey: the next key, covering blocks below `cursor`.
    next: Option<DataKey>,
}

/// A device of an encrypted disk group: encrypts what the store writes and
/// decrypts what it reads. Offsets and lengths must be whole blocks.
pub(crate) struct EncryptedDisk {
    inner: Arc<dyn Disk>,
    device: u8,
    keys: RwLock<DeviceKeys>,
    cursor: AtomicU64,
    pieces: Vec<RwLock<()>>,
    /// The device's superblock as last written (rekeys rewrite it).
    superblock: Mutex<Superblock>,
}

impl EncryptedDisk {
    fn misaligned(&self, op: &'static str, offset: u64, len: usize) -> DiskError {
        DiskError::from_io(
            &self.inner.name(),
            op,
            offset,
            len as u64,
            &std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "an encrypted device is read and written in whole 4 KiB blocks",
            ),
        )
    }

    /// Shared locks of the pieces `blocks` touches, in lock order.
    fn lock_pieces(&self, first: u64, blocks: u64) -> Vec<RwLockReadGuard<'_, ()>> {
        let first_piece = first / REKEY_PIECE_BLOCKS;
        let last_piece = (first + blocks.max(1) - 1) / REKEY_PIECE_BLOCKS;
        let mut locks: Vec<usize> = (first_piece..=last_piece)
            .map(|p| (p % REKEY_LOCKS as u64) as usize)
            .collect();
        locks.sort_unstable();
        locks.dedup();
        locks.into_iter().map(|i| self.pieces[i].read()).collect()
    }

    /// Runs `f` on each encrypted block of `buf` (at device block `first`)
    /// with the key that covers it.
    fn each_block(&self, first: u64, buf: &mut [u8], f: impl Fn(&Xts, u128, &mut [u8])) {
        let keys = self.keys.read();
        let cursor = self.cursor.load(Ordering::Acquire);
        for (i, chunk) in buf.chunks_exact_mut(BLOCK).enumerate() {
            let block = first + i as u64;
            if block < CLEAR_BLOCKS {
                continue;
            }
            let key = match &keys.next {
                Some(next) if block < cursor => next,
                _ => &keys.current,
            };
            f(&key.cipher, unit(self.device, block), chunk);
        }
    }

    fn encrypted_write(
        &self,
        buf: &[u8],
        offset: u64,
        op: &'static str,
        write: impl FnOnce(&[u8], u64) -> Result<(), DiskError>,
    ) -> Result<(), DiskError> {
        if offset % BLOCK as u64 != 0 || buf.len() % BLOCK != 0 {
            return Err(self.misaligned(op, offset, buf.len()));
        }
        let first = offset / BLOCK as u64;
        let _pieces = self.lock_pieces(first, (buf.len() / BLOCK) as u64);
        let mut sealed = AlignedBuf::copy_of(buf);
        self.each_block(first, sealed.as_mut_slice(), |x, u, b| x.encrypt(u, b));
        write(sealed.as_slice(), offset)
    }
}

impl Disk for EncryptedDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        if offset % BLOCK as u64 != 0 || buf.len() % BLOCK != 0 {
            return Err(self.misaligned("read", offset, buf.len()));
        }
        let first = offset / BLOCK as u64;
        let _pieces = self.lock_pieces(first, (buf.len() / BLOCK) as u64);
        self.inner.read_at(buf, offset)?;
        self.each_block(first, buf, |x, u, b| x.decrypt(u, b));
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.encrypted_write(buf, offset, "write", |b, o| self.inner.write_at(b, o))
    }

    fn write_uncached_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.encrypted_write(buf, offset, "write", |b, o| {
            self.inner.write_uncached_at(b, o)
        })
    }

    fn sync(&self) -> Result<(), DiskError> {
        self.inner.sync()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn name(&self) -> String {
        self.inner.name()
    }
}

/// Writes a superblock over its older copy (the copy its new sequence
/// selects) and syncs: the other copy stays sound whatever happens to this
/// write.
pub(crate) fn rewrite_superblock(disk: &dyn Disk, sb: &mut Superblock) -> Result<(), StoreError> {
    sb.sequence += 1;
    let buf = AlignedBuf::copy_of(&sb.encode());
    disk.write_at(buf.as_slice(), (sb.sequence % 2) * BLOCK as u64)?;
    disk.sync()?;
    Ok(())
}

/// An encrypted disk group's devices, opened.
pub(crate) struct GroupCipher {
    pub(crate) devices: Vec<Arc<EncryptedDisk>>,
    pub(crate) group_uuid: u128,
}

impl GroupCipher {
    /// Wraps the raw devices of a group whose superblocks `sbs` say it is
    /// encrypted, after putting back any piece a deep rekey was rewriting
    /// when it stopped.
    pub(crate) fn open(
        raw: &[Arc<dyn Disk>],
        sbs: Vec<Superblock>,
        keys: &AtRestKeys,
    ) -> Result<GroupCipher, StoreError> {
        let group_uuid = sbs[0].group_uuid;
        let mut devices = Vec::new();
        for (disk, mut sb) in raw.iter().zip(sbs) {
            let Some(enc) = sb.encryption.clone() else {
                return Err(StoreError::BadDevice {
                    device: disk.name(),
                    problem: "is not encrypted, but its disk group is".into(),
                });
            };
            let current = DataKey::unwrap(&enc.key, keys, group_uuid, enc.generation)?;
            let next = match &enc.next {
                Some(w) => Some(DataKey::unwrap(w, keys, group_uuid, enc.generation + 1)?),
                None => None,
            };
            if let Some(j) = enc.journal {
                restore_journal(disk.as_ref(), &mut sb, j)?;
            }
            devices.push(Arc::new(EncryptedDisk {
                inner: disk.clone(),
                device: sb.device_index,
                keys: RwLock::new(DeviceKeys {
                    current,
                    generation: enc.generation,
                    next,
                }),
                cursor: AtomicU64::new(enc.rekey_cursor),
                pieces: (0..REKEY_LOCKS).map(|_| RwLock::new(())).collect(),
                superblock: Mutex::new(sb),
            }));
        }
        Ok(GroupCipher {
            devices,
            group_uuid,
        })
    }

    /// The devices as the store uses them.
    pub(crate) fn disks(&self) -> Vec<Arc<dyn Disk>> {
        self.devices
            .iter()
            .map(|d| d.clone() as Arc<dyn Disk>)
            .collect()
    }
}

/// Puts back the blocks a deep rekey saved before rewriting them: the
/// rewrite did not finish, so the piece returns to the current key.
fn restore_journal(
    disk: &dyn Disk,
    sb: &mut Superblock,
    journal: tessera_format::RekeyJournal,
) -> Result<(), StoreError> {
    let enc = sb.encryption.as_mut().expect("encrypted superblock");
    let mut saved = AlignedBuf::zeroed((journal.blocks * BLOCK as u64) as usize);
    disk.read_at(saved.as_mut_slice(), enc.journal_start * BLOCK as u64)?;
    if tessera_format::block_crc(saved.as_slice()) != journal.crc {
        return Err(StoreError::BadDevice {
            device: disk.name(),
            problem: format!(
                "the rekey journal saving blocks {}..{} fails its checksum",
                journal.start,
                journal.start + journal.blocks
            ),
        });
    }
    disk.write_at(saved.as_slice(), journal.start * BLOCK as u64)?;
    disk.sync()?;
    enc.journal = None;
    rewrite_superblock(disk, sb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn key_of(k1: &[u8], k2: &[u8]) -> [u8; DATA_KEY_BYTES] {
        let mut key = [0u8; DATA_KEY_BYTES];
        key[..32].copy_from_slice(k1);
        key[32..].copy_from_slice(k2);
        key
    }

    /// IEEE 1619-2007 vector 10 (XTS-AES-256, data unit 0xff, 512 bytes):
    /// its first 512 bytes are checked by running the mode over a 4 KiB unit
    /// whose first 512 bytes are the vector's plaintext.
    #[test]
    fn ieee_1619_vector_10_matches() {
        let k1 = hex("2718281828459045235360287471352662497757247093699959574966967627");
        let k2 = hex("3141592653589793238462643383279502884197169399375105820974944592");
        let xts = Xts::new(&key_of(&k1, &k2));
        let mut buf = vec![0u8; BLOCK];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = i as u8;
        }
        xts.encrypt(0xff, &mut buf);
        let expected_start = hex("1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b");
        assert_eq!(&buf[..32], &expected_start[..]);
        let expected_end = hex("773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151");
        // Blocks 16..32 of the vector (bytes 480..512).
        assert_eq!(&buf[480..512], &expected_end[..]);
        xts.decrypt(0xff, &mut buf);
        assert!(buf.iter().enumerate().all(|(i, b)| *b == i as u8));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn matches_the_xts_mode_crate(seed: u64, unit_no: u128) {
            use xts_mode::Xts128;
            let mut key = [0u8; DATA_KEY_BYTES];
            let mut data = vec![0u8; BLOCK];
            let mut x = seed | 1;
            for b in key.iter_mut().chain(data.iter_mut()) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let ours = Xts::new(&key);
            let reference = Xts128::new(
                Aes256::new_from_slice(&key[..32]).unwrap(),
                Aes256::new_from_slice(&key[32..]).unwrap(),
            );
            let mut a = data.clone();
            ours.encrypt(unit_no, &mut a);
            let mut b = data.clone();
            reference.encrypt_sector(&mut b, unit_no.to_le_bytes().into());
            prop_assert_eq!(&a, &b);
            ours.decrypt(unit_no, &mut a);
            prop_assert_eq!(a, data);
        }
    }

    #[test]
    fn a_sealed_key_opens_only_for_its_group_generation_and_kek() {
        let kek = KeyEncryptionKey::generate().unwrap();
        let other = KeyEncryptionKey::generate().unwrap();
        let dk = DataKey::generate().unwrap();
        let w = dk.wrap(&kek, 42, 1).unwrap();
        let keys = AtRestKeys::new(kek.clone());
        let opened = DataKey::unwrap(&w, &keys, 42, 1).unwrap();
        assert_eq!(opened.bytes[..], dk.bytes[..]);
        assert!(DataKey::unwrap(&w, &keys, 43, 1).is_err());
        assert!(DataKey::unwrap(&w, &keys, 42, 2).is_err());
        let err = DataKey::unwrap(&w, &AtRestKeys::new(other.clone()), 42, 1)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(&kek.id().to_string()), "{err}");
        let retired = AtRestKeys {
            current: other,
            retired: vec![kek],
        };
        assert!(DataKey::unwrap(&w, &retired, 42, 1).is_ok());
        let mut bad = w.clone();
        bad.sealed[3] ^= 1;
        assert!(DataKey::unwrap(&bad, &keys, 42, 1).is_err());
    }

    #[test]
    fn key_files_are_read_as_hex_or_raw_and_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let kek = KeyEncryptionKey::generate().unwrap();
        let path = dir.path().join("kek");
        kek.save_new(&path).unwrap();
        assert_eq!(KeyEncryptionKey::load(&path).unwrap().id(), kek.id());
        assert!(kek.save_new(&path).is_err(), "an existing key file is replaced");
        let raw = dir.path().join("raw");
        std::fs::write(&raw, [7u8; KEK_BYTES]).unwrap();
        std::fs::set_permissions(&raw, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            KeyEncryptionKey::load(&raw).unwrap().id(),
            KeyEncryptionKey::from_bytes([7u8; KEK_BYTES]).id()
        );
        std::fs::set_permissions(&raw, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = KeyEncryptionKey::load(&raw).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        let short = dir.path().join("short");
        std::fs::write(&short, b"abcd").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(KeyEncryptionKey::load(&short).is_err());
    }
}
