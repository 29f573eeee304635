//! CHAP with MD5 (RFC 1994, as RFC 7143 section 12.1.3 uses it): the
//! response computation and the binary value encodings.
//!
//! Owns: `CHAP_R = MD5(CHAP_I || secret || CHAP_C)` and the `0x`/`0b`
//! encodings of binary values. Must not touch: login stages (the login
//! state machine in [`crate::login`] drives the exchange).
//! Invariants: decoding is total and bounded; responses are compared in
//! constant time.

use md5::{Digest, Md5};

/// CHAP_A value of MD5, the only algorithm offered.
pub const CHAP_MD5: &str = "5";
/// Bytes of a challenge the target sends.
pub const CHALLENGE_BYTES: usize = 16;
/// Bytes of an MD5 response.
pub const RESPONSE_BYTES: usize = 16;
/// Smallest challenge accepted from an initiator, in bytes.
pub const MIN_CHALLENGE_BYTES: usize = 8;
/// Largest challenge accepted from an initiator, in bytes (RFC 7143 caps
/// binary values of CHAP_C at 1024 bytes).
pub const MAX_CHALLENGE_BYTES: usize = 1024;

/// The response to a challenge.
pub fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; RESPONSE_BYTES] {
    let mut md5 = Md5::new();
    md5.update([id]);
    md5.update(secret);
    md5.update(challenge);
    md5.finalize().into()
}

/// Whether two byte strings are equal, in time independent of where they
/// differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Decodes a binary value: `0x` + hex digits or `0b` + base64.
pub fn decode_binary(value: &str) -> Option<Vec<u8>> {
    if let Some(hex) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        if hex.is_empty() || hex.len() % 2 != 0 {
            return None;
        }
        hex.as_bytes()
            .chunks(2)
            .map(|pair| {
                let s = std::str::from_utf8(pair).ok()?;
                u8::from_str_radix(s, 16).ok()
            })
            .collect()
    } else if let Some(b64) = value
        .strip_prefix("0b")
        .or_else(|| value.strip_prefix("0B"))
    {
        decode_base64(b64)
    } else {
        None
    }
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    if text.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// Encodes a binary value as `0x` + lower-case hex.
pub fn encode_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 + bytes.len() * 2);
    out.push_str("0x");
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Parses CHAP_I: a decimal (or 0x hex) number 0..=255.
pub fn parse_identifier(value: &str) -> Option<u8> {
    if let Some(hex) = value.strip_prefix("0x") {
        return u8::from_str_radix(hex, 16).ok();
    }
    if value.is_empty() || value.len() > 3 {
        return None;
    }
    value.parse::<u8>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_matches_rfc1994_md5_of_id_secret_challenge() {
        // MD5(0x01 || "secret" || 0x00..0x0f), computed independently.
        let challenge: Vec<u8> = (0u8..16).collect();
        let r = response(1, b"secret", &challenge);
        let mut md5 = Md5::new();
        md5.update([1u8]);
        md5.update(b"secret");
        md5.update(&challenge);
        assert_eq!(r.to_vec(), md5.finalize().to_vec());
        assert_ne!(response(2, b"secret", &challenge), r);
    }

    #[test]
    fn binary_values_decode_in_both_encodings() {
        assert_eq!(decode_binary("0x00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(decode_binary("0xABcd"), Some(vec![0xab, 0xcd]));
        assert_eq!(decode_binary("0x0"), None);
        assert_eq!(decode_binary("0xzz"), None);
        assert_eq!(decode_binary("00ff"), None);
        assert_eq!(decode_binary("0bAP8Q"), Some(vec![0, 255, 16]));
        assert_eq!(decode_binary("0b"), None);
        assert_eq!(encode_hex(&[0, 255, 16]), "0x00ff10");
    }

    #[test]
    fn identifiers_are_bytes() {
        assert_eq!(parse_identifier("0"), Some(0));
        assert_eq!(parse_identifier("255"), Some(255));
        assert_eq!(parse_identifier("256"), None);
        assert_eq!(parse_identifier("-1"), None);
        assert_eq!(parse_identifier(""), None);
    }

    #[test]
    fn comparison_is_exact() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
