//! CRC32C (Castagnoli, CRC-32/ISCSI): the one checksum every layer agrees on.
//!
//! Owns: how a CRC32C is computed, for the store's blocks and structures,
//! the host-to-host frames and iSCSI digests. Must not touch: I/O.
//! Invariant: the values are those of RFC 3720's CRC32C (what the on-disk
//! formats and the wire already hold); only the speed of computing them is
//! chosen here. `crc-fast` folds with carry-less multiplication
//! (VPCLMULQDQ on AVX-512 machines, PCLMULQDQ on older x86, PMULL on ARM),
//! about twice the speed of the SSE 4.2 `crc32` instruction on the
//! data path's 4 KiB blocks and 256 KiB payloads; a mirrored 256 KiB write
//! checksums its payload four times (block CRCs on each copy's host, the
//! frame's CRC when it is sent and when it is received).

use crc_fast::{CrcAlgorithm, Digest};

/// The CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// The CRC32C of the bytes whose CRC32C is `crc`, followed by `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // The finished value is the register inverted: undo that to go on.
    let mut digest = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(data);
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bit by bit, from the polynomial: an implementation that shares
    /// nothing with the one under test.
    fn reference(seed: u32, data: &[u8]) -> u32 {
        let mut crc = !seed;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn known_values() {
        // The check value of CRC-32/ISCSI, and RFC 3720's 32 bytes of zeros.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[]), 0);
        assert_eq!(crc32c_append(crc32c(b"12345"), b"6789"), 0xe306_9283);
    }

    #[test]
    fn whole_blocks_and_payloads_match_the_reference() {
        let data: Vec<u8> = (0..256 * 1024u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in [4096, 8192, 64 * 1024, 256 * 1024] {
            assert_eq!(
                crc32c(&data[..len]),
                reference(0, &data[..len]),
                "{len} bytes"
            );
            assert_eq!(
                crc32c(&data[1..len]),
                reference(0, &data[1..len]),
                "{len} bytes off by one"
            );
        }
    }

    proptest! {
        #[test]
        fn matches_the_reference(data in proptest::collection::vec(any::<u8>(), 0..9000)) {
            prop_assert_eq!(crc32c(&data), reference(0, &data));
        }

        #[test]
        fn append_is_the_crc_of_both(
            data in proptest::collection::vec(any::<u8>(), 0..9000),
            split in any::<prop::sample::Index>(),
        ) {
            let at = split.index(data.len() + 1);
            prop_assert_eq!(crc32c_append(crc32c(&data[..at]), &data[at..]), crc32c(&data));
        }

        #[test]
        fn append_goes_on_from_any_value(seed in any::<u32>(), data in proptest::collection::vec(any::<u8>(), 0..600)) {
            prop_assert_eq!(crc32c_append(seed, &data), reference(seed, &data));
        }
    }
}
