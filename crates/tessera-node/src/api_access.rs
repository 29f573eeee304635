//! Who may call the API: tokens, and the role each route needs.
//!
//! Owns: the token format (`tsn_<id>_<secret>`), hashing a secret,
//! checking a presented token against its record, and the table of routes
//! with the role each needs ([`ROUTES`]). Must not touch: the directory
//! (records come in and go out as values), HTTP (the API applies what
//! [`required_role`] answers).
//!
//! Invariants:
//! - a token's secret is never stored or logged: its record holds a BLAKE3
//!   hash, compared in constant time;
//! - every route needs a credential; a request that matches no route of
//!   the table needs the admin role (so a route added to the router but
//!   not to the table is closed, not open);
//! - an expired token is refused like an unknown one.

use axum::http::Method;
use tessera_directory::keys::{ApiRole, ApiTokenRecord};

/// What every token starts with, so a token pasted where it should not be
/// is recognisable (and secret scanners can find it).
pub const TOKEN_PREFIX: &str = "tsn_";

/// Hex digits of a token's id (8 random bytes).
const ID_HEX: usize = 16;
/// Hex digits of a token's secret (32 random bytes).
const SECRET_HEX: usize = 64;

/// A token just made: the only time its whole text exists.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    /// `tsn_<id>_<secret>`: what its holder presents.
    pub token: String,
    /// What the directory keeps of it.
    pub record: ApiTokenRecord,
}

/// Makes a token named `name` with `role`, from 40 bytes of `random`
/// (cryptographic randomness: the id's 8 bytes and the secret's 32).
pub fn issue(
    name: &str,
    role: ApiRole,
    random: [u8; 40],
    created_ms: u64,
    expires_ms: Option<u64>,
    created_by: Option<String>,
) -> IssuedToken {
    let id = hex(&random[..8]);
    let secret = hex(&random[8..]);
    IssuedToken {
        token: format!("{TOKEN_PREFIX}{id}_{secret}"),
        record: ApiTokenRecord {
            id,
            name: name.to_string(),
            role,
            secret_hash: secret_hash(&secret),
            created_ms,
            expires_ms,
            created_by,
        },
    }
}

/// The id and secret of `token`, if it has a token's shape.
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let rest = token.trim().strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hexdigits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hexdigits(id, ID_HEX) && hexdigits(secret, SECRET_HEX)).then_some((id, secret))
}

/// Why a presented token was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No token, or not a token's shape.
    Missing,
    /// No such token, or the secret does not match (not told apart, so a
    /// caller learns nothing of which ids exist).
    Unknown,
    /// Its time is past.
    Expired,
}

impl Refusal {
    /// What the caller is told.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Missing => "this API needs a token: send `Authorization: Bearer <token>` (the CLI reads --token, TESSERA_TOKEN, TESSERA_TOKEN_FILE, else ./tessera-data/admin.token, which `tessera up` writes)",
            Refusal::Unknown => "the token is not valid (unknown, revoked or mistyped)",
            Refusal::Expired => "the token has expired: ask an admin for a new one (`tessera token create`)",
        }
    }
}

/// The role `record` gives to a holder of `secret` at `now_ms`.
pub fn check(record: &ApiTokenRecord, secret: &str, now_ms: u64) -> Result<ApiRole, Refusal> {
    if !constant_time_eq(
        secret_hash(secret).as_bytes(),
        record.secret_hash.as_bytes(),
    ) {
        return Err(Refusal::Unknown);
    }
    if record.expires_ms.is_some_and(|end| now_ms >= end) {
        return Err(Refusal::Expired);
    }
    Ok(record.role)
}

/// The hash a record keeps of `secret`.
fn secret_hash(secret: &str) -> String {
    blake3::hash(secret.as_bytes()).to_hex().to_string()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every route of the API: method, path (`{x}` matches one segment) and
/// the role it needs. Reads need a viewer, changes to volumes and their
/// snapshots an operator, changes to the cluster (and every token route,
/// reads included: they list who may do what) an admin.
pub const ROUTES: &[(&str, &str, ApiRole)] = &[
    ("GET", "/v1/status", ApiRole::Viewer),
    ("GET", "/v1/health", ApiRole::Viewer),
    ("GET", "/v1/settings", ApiRole::Viewer),
    ("PATCH", "/v1/settings", ApiRole::Admin),
    ("GET", "/v1/hosts", ApiRole::Viewer),
    ("GET", "/v1/hosts/{id}", ApiRole::Viewer),
    ("POST", "/v1/hosts/{id}/stop", ApiRole::Admin),
    ("POST", "/v1/hosts/{id}/start", ApiRole::Admin),
    ("POST", "/v1/hosts/{id}/faults", ApiRole::Admin),
    ("POST", "/v1/hosts/{id}/scrub", ApiRole::Admin),
    ("POST", "/v1/hosts/{id}/rekey", ApiRole::Admin),
    ("GET", "/v1/hosts/{id}/settings", ApiRole::Viewer),
    ("PATCH", "/v1/hosts/{id}/settings", ApiRole::Admin),
    ("GET", "/v1/encryption", ApiRole::Viewer),
    ("POST", "/v1/hosts/{id}/evacuation", ApiRole::Admin),
    ("DELETE", "/v1/hosts/{id}/evacuation", ApiRole::Admin),
    ("GET", "/v1/policies", ApiRole::Viewer),
    ("POST", "/v1/policies", ApiRole::Admin),
    ("GET", "/v1/policies/{name}", ApiRole::Viewer),
    ("PATCH", "/v1/policies/{name}", ApiRole::Admin),
    ("DELETE", "/v1/policies/{name}", ApiRole::Admin),
    ("GET", "/v1/volumes", ApiRole::Viewer),
    ("POST", "/v1/volumes", ApiRole::Operator),
    ("GET", "/v1/volumes/{name}", ApiRole::Viewer),
    ("DELETE", "/v1/volumes/{name}", ApiRole::Operator),
    ("POST", "/v1/volumes/{name}/resize", ApiRole::Operator),
    ("POST", "/v1/volumes/{name}/rename", ApiRole::Operator),
    ("POST", "/v1/volumes/{name}/revert", ApiRole::Operator),
    ("GET", "/v1/volumes/{name}/access", ApiRole::Viewer),
    ("PUT", "/v1/volumes/{name}/access", ApiRole::Operator),
    ("GET", "/v1/volumes/{name}/snapshots", ApiRole::Viewer),
    ("POST", "/v1/volumes/{name}/snapshots", ApiRole::Operator),
    (
        "DELETE",
        "/v1/volumes/{name}/snapshots/{snapshot}",
        ApiRole::Operator,
    ),
    (
        "POST",
        "/v1/volumes/{name}/snapshots/{snapshot}/clones",
        ApiRole::Operator,
    ),
    ("GET", "/v1/objects/{name}", ApiRole::Viewer),
    ("POST", "/v1/objects/{name}/verify", ApiRole::Operator),
    ("GET", "/v1/activity", ApiRole::Viewer),
    ("GET", "/v1/activity/hosts", ApiRole::Viewer),
    ("GET", "/v1/activity/history", ApiRole::Viewer),
    ("GET", "/v1/events", ApiRole::Viewer),
    ("GET", "/metrics", ApiRole::Viewer),
    ("GET", "/v1/resyncs", ApiRole::Viewer),
    ("GET", "/v1/scrubs", ApiRole::Viewer),
    ("GET", "/v1/tokens", ApiRole::Admin),
    ("POST", "/v1/tokens", ApiRole::Admin),
    ("DELETE", "/v1/tokens/{id}", ApiRole::Admin),
    ("GET", "/v1/audit", ApiRole::Admin),
];

/// The role a request for `path` with `method` needs: its route's, or
/// admin for a request that matches no route.
pub fn required_role(method: &Method, path: &str) -> ApiRole {
    ROUTES
        .iter()
        .find(|(m, pattern, _)| *m == method.as_str() && matches(pattern, path))
        .map_or(ApiRole::Admin, |(_, _, role)| *role)
}

/// Whether `path` fits `pattern`, whose `{x}` segments match any one
/// non-empty segment.
fn matches(pattern: &str, path: &str) -> bool {
    let mut want = pattern.split('/');
    let mut have = path.split('/');
    loop {
        match (want.next(), have.next()) {
            (None, None) => return true,
            (Some(w), Some(h)) if w.starts_with('{') && w.ends_with('}') => {
                if h.is_empty() {
                    return false;
                }
            }
            (Some(w), Some(h)) if w == h => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn random(seed: u8) -> [u8; 40] {
        std::array::from_fn(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
    }

    #[test]
    fn an_issued_token_checks_against_its_record_and_nothing_else() {
        let issued = issue("ci", ApiRole::Operator, random(1), 1_000, None, None);
        let (id, secret) = parse(&issued.token).expect("a token's shape");
        assert_eq!(id, issued.record.id);
        assert!(!issued.record.secret_hash.contains(secret));
        assert_eq!(check(&issued.record, secret, 2_000), Ok(ApiRole::Operator));
        let other = issue("ci", ApiRole::Operator, random(2), 1_000, None, None);
        let (_, other_secret) = parse(&other.token).unwrap();
        assert_eq!(
            check(&issued.record, other_secret, 2_000),
            Err(Refusal::Unknown)
        );
    }

    #[test]
    fn a_token_past_its_time_is_refused() {
        let issued = issue(
            "short",
            ApiRole::Viewer,
            random(3),
            1_000,
            Some(5_000),
            None,
        );
        let (_, secret) = parse(&issued.token).unwrap();
        assert_eq!(check(&issued.record, secret, 4_999), Ok(ApiRole::Viewer));
        assert_eq!(check(&issued.record, secret, 5_000), Err(Refusal::Expired));
    }

    #[test]
    fn malformed_tokens_are_not_parsed() {
        let good = issue("x", ApiRole::Admin, random(4), 0, None, None).token;
        assert!(parse(&good).is_some());
        let bad = [
            String::new(),
            "tsn_".to_string(),
            "Bearer x".to_string(),
            good[..good.len() - 1].to_string(),
            good.replacen("tsn_", "tsx_", 1),
            format!("{good}0"),
            good.replacen('_', "-", 2),
            format!("tsn_{}_{}", "g".repeat(16), "0".repeat(64)),
        ];
        for b in &bad {
            assert!(parse(b).is_none(), "{b:?}");
        }
    }

    #[test]
    fn each_route_needs_its_role_and_an_unknown_one_needs_admin() {
        let get = Method::GET;
        assert_eq!(required_role(&get, "/v1/volumes"), ApiRole::Viewer);
        assert_eq!(
            required_role(&Method::POST, "/v1/volumes"),
            ApiRole::Operator
        );
        assert_eq!(
            required_role(&Method::DELETE, "/v1/volumes/vm1/snapshots/s1"),
            ApiRole::Operator
        );
        assert_eq!(
            required_role(&Method::POST, "/v1/hosts/host-2/stop"),
            ApiRole::Admin
        );
        assert_eq!(required_role(&get, "/v1/tokens"), ApiRole::Admin);
        assert_eq!(required_role(&get, "/v1/nothing"), ApiRole::Admin);
        assert_eq!(required_role(&get, "/v1/volumes/"), ApiRole::Admin);
        assert_eq!(required_role(&get, "/v1/volumes/a/b"), ApiRole::Admin);
        assert_eq!(required_role(&Method::PUT, "/v1/volumes"), ApiRole::Admin);
    }

    #[test]
    fn roles_are_ordered_and_parse_from_their_names() {
        assert!(ApiRole::Admin.allows(ApiRole::Operator));
        assert!(ApiRole::Operator.allows(ApiRole::Viewer));
        assert!(!ApiRole::Viewer.allows(ApiRole::Operator));
        for role in [ApiRole::Viewer, ApiRole::Operator, ApiRole::Admin] {
            assert_eq!(role.as_str().parse::<ApiRole>(), Ok(role));
        }
        assert!("root".parse::<ApiRole>().is_err());
    }

    proptest! {
        #[test]
        fn no_wrong_secret_passes(seed in any::<u8>(), other in any::<[u8; 32]>()) {
            let issued = issue("p", ApiRole::Admin, random(seed), 0, None, None);
            let guess = hex(&other);
            let (_, secret) = parse(&issued.token).unwrap();
            prop_assume!(guess != secret);
            prop_assert_eq!(check(&issued.record, &guess, 0), Err(Refusal::Unknown));
        }
    }
}
