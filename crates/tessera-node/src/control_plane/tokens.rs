//! API tokens: made, listed, revoked and checked against the directory.
//!
//! Owns: the `api-tokens/<id>` records and the first admin token a new
//! cluster gets. Must not touch: how a token looks or is checked (that is
//! [`crate::api_access`]'s), HTTP.
//!
//! Invariants:
//! - a token is checked against its record as the directory holds it at
//!   each request, so a revoked token is refused from the next request on;
//! - the secret leaves this module once, in the answer that made it.

use super::{internal, ControlPlane};
use crate::api_access::{self, Refusal};
use crate::control::{ApiIdentity, ControlError, CreateToken, CreatedToken, TokenView};
use tessera_directory::keys::{self, ApiRole};

/// Longest a token name may be.
const NAME_MAX: usize = 64;

impl ControlPlane {
    pub(super) async fn authenticate_token(
        &self,
        token: &str,
    ) -> Result<ApiIdentity, ControlError> {
        let refused = |r: Refusal| ControlError::Unauthenticated(r.message().to_string());
        if token.is_empty() {
            return Err(refused(Refusal::Missing));
        }
        let (id, secret) = api_access::parse(token).ok_or(refused(Refusal::Unknown))?;
        let record = keys::get(self.directory.as_ref(), &self.keys.api_token(id))
            .await
            .map_err(internal)?
            .ok_or(refused(Refusal::Unknown))?
            .value;
        let role = api_access::check(&record, secret, self.clock.wall_ms()).map_err(refused)?;
        Ok(ApiIdentity {
            token_id: record.id,
            name: record.name,
            role,
        })
    }

    pub(super) async fn make_token(
        &self,
        by: Option<&ApiIdentity>,
        request: CreateToken,
    ) -> Result<CreatedToken, ControlError> {
        let name = request.name.trim();
        let fits = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@');
        if name.is_empty() || name.len() > NAME_MAX || !name.bytes().all(fits) {
            return Err(ControlError::Invalid(format!(
                "token name {name:?}: 1 to {NAME_MAX} letters, digits, '.', '_', '-' or '@'"
            )));
        }
        if request.expires_in_s == Some(0) {
            return Err(ControlError::Invalid(
                "a token that expires at once is of no use: give --expires-in more than 0".into(),
            ));
        }
        let now = self.clock.wall_ms();
        let expires_ms = request
            .expires_in_s
            .map(|s| now.saturating_add(s.saturating_mul(1000)));
        let issued = api_access::issue(
            name,
            request.role,
            random_bytes()?,
            now,
            expires_ms,
            by.map(|i| i.token_id.clone()),
        );
        let created = keys::cas(
            self.directory.as_ref(),
            &self.keys.api_token(&issued.record.id),
            None,
            &issued.record,
            None,
        )
        .await
        .map_err(internal)?;
        if !created.succeeded {
            return Err(ControlError::Internal(
                "a new token's id was taken already; try again".into(),
            ));
        }
        tracing::info!(token = %issued.record.id, name = %issued.record.name, role = %issued.record.role, by = ?by.map(|i| &i.token_id), "API token made");
        Ok(CreatedToken {
            token: issued.token,
            view: TokenView::of(&issued.record),
        })
    }

    pub(super) async fn token_views(&self) -> Result<Vec<TokenView>, ControlError> {
        let mut views: Vec<TokenView> =
            keys::list(self.directory.as_ref(), &self.keys.api_tokens())
                .await
                .map_err(internal)?
                .records
                .iter()
                .map(|r| TokenView::of(&r.value))
                .collect();
        views.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        Ok(views)
    }

    pub(super) async fn remove_token(&self, id: &str) -> Result<(), ControlError> {
        let missing = || ControlError::NotFound(format!("no API token with id {id}"));
        // Only an id's shape names a key (an id is never a path).
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(missing());
        }
        let existed = keys::delete(self.directory.as_ref(), &self.keys.api_token(id))
            .await
            .map_err(internal)?;
        if !existed {
            return Err(missing());
        }
        tracing::info!(token = %id, "API token revoked");
        Ok(())
    }

    /// Makes the first admin token of a cluster that has none, named
    /// `admin`; None when the cluster has tokens already (the one made at
    /// its first start, or others).
    pub async fn first_admin_token(&self) -> Result<Option<String>, ControlError> {
        if !self.token_views().await?.is_empty() {
            return Ok(None);
        }
        let made = self
            .make_token(
                None,
                CreateToken {
                    name: "admin".into(),
                    role: ApiRole::Admin,
                    expires_in_s: None,
                },
            )
            .await?;
        Ok(Some(made.token))
    }
}

/// What [`ControlPlane::write_first_admin_token`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminTokenFile {
    /// The cluster had no token: an admin token was made and written there.
    Written(std::path::PathBuf),
    /// The cluster has tokens and the file is there (from its first start).
    Kept(std::path::PathBuf),
    /// The cluster has tokens but the file is not there: nothing written
    /// (an admin hands out tokens with `tessera token create`).
    Absent(std::path::PathBuf),
}

impl ControlPlane {
    /// On a cluster with no API token yet, makes an admin token and writes
    /// it to `path`, readable by this user alone (0600), for the CLI to
    /// find; otherwise says whether `path` is there.
    pub async fn write_first_admin_token(
        &self,
        path: &std::path::Path,
    ) -> Result<AdminTokenFile, String> {
        let token = self
            .first_admin_token()
            .await
            .map_err(|e| format!("cannot make the first admin token: {e}"))?;
        let Some(token) = token else {
            return Ok(if path.exists() {
                AdminTokenFile::Kept(path.to_path_buf())
            } else {
                AdminTokenFile::Absent(path.to_path_buf())
            });
        };
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| {
                // A file that was there keeps its mode: make it 0600 too.
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                f.write_all(format!("{token}\n").as_bytes())?;
                f.sync_all()
            });
        if let Err(e) = written {
            // A token no one can read is no use, and the next start makes
            // one again only if the cluster has none.
            if let Some((id, _)) = api_access::parse(&token) {
                let _ = self.remove_token(id).await;
            }
            return Err(format!(
                "cannot write the admin token to {}: {e}",
                path.display()
            ));
        }
        Ok(AdminTokenFile::Written(path.to_path_buf()))
    }
}

/// 40 bytes from the operating system's cryptographic random source.
fn random_bytes() -> Result<[u8; 40], ControlError> {
    let mut bytes = [0u8; 40];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| ControlError::Internal(format!("no randomness for a token: {e}")))?;
    Ok(bytes)
}
