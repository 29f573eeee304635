//! A blocking HTTP client for the REST API, and the CLI's error kinds.
//!
//! Owns: URLs, timeouts, and turning an HTTP answer into JSON or a
//! [`CliError`]. Must not touch: what the JSON means (that is `render` and
//! `verbs`).
//! Invariant: every failure is classified once, here, into the exit code the
//! user sees: a refusal by the API (1), a usage mistake (2), an API that
//! cannot be reached (3).

use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::time::Duration;
use tessera_node::control::ControlError;

/// Time to open a connection to the API: it runs on this machine or next to
/// it, so a slow connect means it is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for an ordinary request (creating a volume places and creates its
/// components on several hosts).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Time for `object verify`, which reads every copy of a whole volume.
pub const VERIFY_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// Exit code when the API refused or the command found a problem.
pub const EXIT_REFUSED: i32 = 1;
/// Exit code for a usage mistake (the same as clap's).
pub const EXIT_USAGE: i32 = 2;
/// Exit code when the API cannot be reached.
pub const EXIT_UNREACHABLE: i32 = 3;

/// Why a command failed.
#[derive(Debug)]
pub enum CliError {
    /// The API refused the request and said why.
    Refused(ControlError),
    /// The command line was wrong in a way clap could not see.
    Usage(String),
    /// No answer from the API at `url`.
    Unreachable {
        /// The API's base URL.
        url: String,
        /// What the connection attempt said.
        reason: String,
    },
    /// The API answered something that is not what it documents.
    BadAnswer {
        /// The request's URL.
        url: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The command ran and found a problem it has already printed
    /// (divergent copies, a damaged device).
    Found(String),
    /// A local failure (a daemon verb's error, an unwritable output).
    Local(String),
}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Unreachable { .. } => EXIT_UNREACHABLE,
            CliError::Refused(_)
            | CliError::BadAnswer { .. }
            | CliError::Found(_)
            | CliError::Local(_) => EXIT_REFUSED,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Refused(e) => write!(f, "{e}"),
            CliError::Usage(m) | CliError::Found(m) | CliError::Local(m) => f.write_str(m),
            CliError::Unreachable { url, reason } if reason.contains("certificate") => write!(
                f,
                "cannot reach the Tessera API at {url}: {reason}\n\
                 hint: the CLI does not trust the API's certificate: pass the cluster CA with \
                 --ca-cert (or TESSERA_CA_CERT); `tessera up` keeps it in \
                 DATA_DIR/tls/ca-cert.pem"
            ),
            CliError::Unreachable { url, reason } => write!(
                f,
                "cannot reach the Tessera API at {url}: {reason}\n\
                 hint: is `tessera up` running? (the CLI uses --api URL, else TESSERA_API, \
                 else {default})",
                default = crate::args::DEFAULT_API_URL
            ),
            CliError::BadAnswer { url, reason } => {
                write!(f, "unexpected answer from {url}: {reason}")
            }
        }
    }
}

/// The API at one base URL, with the token it presents.
pub struct ApiClient {
    base: String,
    agent: ureq::Agent,
    token: Option<String>,
}

/// What the CLI proves and trusts: the token it presents and the CA the
/// API's certificate must chain to.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// The API token.
    pub token: Option<String>,
    /// The CA certificate file (PEM); None: the system's roots.
    pub ca_cert: Option<std::path::PathBuf>,
}

/// The token ([`find_token`]) and the CA: `--ca-cert` (or
/// `TESSERA_CA_CERT`), else `tls/ca-cert.pem` beside the token file (where
/// `tessera up` keeps its CA), else `./tessera-data/tls/ca-cert.pem` if
/// that file is there.
pub fn find_credentials(
    token: Option<&str>,
    token_file: Option<&std::path::Path>,
    ca_cert: Option<&std::path::Path>,
) -> Result<Credentials, CliError> {
    let found = |dir: &std::path::Path| {
        let path = tessera_node::up::tls_dir(dir).join("ca-cert.pem");
        path.is_file().then_some(path)
    };
    let ca_cert = match ca_cert {
        Some(path) => Some(path.to_path_buf()),
        None => token_file
            .map(|f| f.parent().unwrap_or_else(|| std::path::Path::new(".")))
            .and_then(found)
            .or_else(|| found(std::path::Path::new(tessera_node::up::DEFAULT_DATA_DIR))),
    };
    Ok(Credentials {
        token: find_token(token, token_file)?,
        ca_cert,
    })
}

/// The token the CLI presents: `--token` (or `TESSERA_TOKEN`), else the
/// file of `--token-file` (or `TESSERA_TOKEN_FILE`), else `tessera up`'s
/// admin token in `./tessera-data/admin.token` if that file is there.
/// None: the API will say what it needs.
pub fn find_token(
    token: Option<&str>,
    token_file: Option<&std::path::Path>,
) -> Result<Option<String>, CliError> {
    if let Some(t) = token.map(str::trim).filter(|t| !t.is_empty()) {
        return Ok(Some(t.to_string()));
    }
    let read =
        |path: &std::path::Path| std::fs::read_to_string(path).map(|text| text.trim().to_string());
    if let Some(path) = token_file {
        return read(path).map(Some).map_err(|e| {
            CliError::Usage(format!(
                "cannot read the API token file {}: {e}",
                path.display()
            ))
        });
    }
    let default = tessera_node::up::admin_token_path(std::path::Path::new(
        tessera_node::up::DEFAULT_DATA_DIR,
    ));
    Ok(read(&default).ok().filter(|t| !t.is_empty()))
}

impl ApiClient {
    /// A client for the API at `base` (`https://host:port` or
    /// `http://host:port`, with or without a trailing slash), trusting the
    /// CA in `ca_cert` (else the system's roots) for HTTPS.
    pub fn new(base: &str, ca_cert: Option<&std::path::Path>) -> Result<ApiClient, CliError> {
        let base = base.trim().trim_end_matches('/').to_string();
        let Some(rest) = base
            .strip_prefix("https://")
            .or_else(|| base.strip_prefix("http://"))
        else {
            return Err(CliError::Usage(format!(
                "API URL {base:?} must start with https:// or http:// (for example {})",
                crate::args::DEFAULT_API_URL
            )));
        };
        if rest.is_empty() || rest.contains('/') {
            return Err(CliError::Usage(format!(
                "API URL {base:?} must be https://HOST:PORT without a path"
            )));
        }
        let mut agent = ureq::AgentBuilder::new().timeout_connect(CONNECT_TIMEOUT);
        if let Some(path) = ca_cert {
            let tls = tessera_tls::TrustedRoots::load(path)
                .and_then(|roots| tessera_tls::client_config(&roots, None))
                .map_err(|e| CliError::Usage(format!("the API's CA certificate: {e}")))?;
            agent = agent.tls_config(tls);
        }
        let agent = agent.build();
        Ok(ApiClient {
            base,
            agent,
            token: None,
        })
    }

    /// The same client presenting `token` with every request.
    pub fn with_token(mut self, token: Option<String>) -> ApiClient {
        self.token = token;
        self
    }

    /// A request of `method` for `url`, with the token and `timeout`.
    fn request(&self, method: &str, url: &str, timeout: Duration) -> ureq::Request {
        let request = self.agent.request(method, url).timeout(timeout);
        match &self.token {
            Some(t) => request.set("Authorization", &format!("Bearer {t}")),
            None => request,
        }
    }

    /// GET `path` (under the base URL).
    pub fn get(&self, path: &str) -> Result<Value, CliError> {
        let url = self.url(path);
        self.finish(&url, self.request("GET", &url, REQUEST_TIMEOUT).call())
    }

    /// POST `body` (or nothing) to `path`, waiting up to `timeout`.
    pub fn post(
        &self,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Value, CliError> {
        let url = self.url(path);
        let request = self.request("POST", &url, timeout);
        let result = match body {
            Some(b) => request.send_json(b),
            None => request.call(),
        };
        self.finish(&url, result)
    }

    /// POST with the ordinary timeout.
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        self.post(path, Some(body), REQUEST_TIMEOUT)
    }

    /// PUT `body` to `path`.
    pub fn put_json(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        let url = self.url(path);
        self.finish(
            &url,
            self.request("PUT", &url, REQUEST_TIMEOUT).send_json(body),
        )
    }

    /// PATCH `path` with `body` (a partial change).
    pub fn patch_json(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        let url = self.url(path);
        self.finish(
            &url,
            self.request("PATCH", &url, REQUEST_TIMEOUT).send_json(body),
        )
    }

    /// DELETE `path`.
    pub fn delete(&self, path: &str) -> Result<Value, CliError> {
        let url = self.url(path);
        self.finish(&url, self.request("DELETE", &url, REQUEST_TIMEOUT).call())
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn finish(
        &self,
        url: &str,
        result: Result<ureq::Response, ureq::Error>,
    ) -> Result<Value, CliError> {
        match result {
            Ok(response) => {
                let text = response.into_string().map_err(|e| CliError::BadAnswer {
                    url: url.to_string(),
                    reason: format!("cannot read the body: {e}"),
                })?;
                if text.trim().is_empty() {
                    return Ok(Value::Null);
                }
                serde_json::from_str(&text).map_err(|e| CliError::BadAnswer {
                    url: url.to_string(),
                    reason: format!("the body is not JSON: {e}"),
                })
            }
            Err(ureq::Error::Status(code, response)) => {
                let text = response.into_string().unwrap_or_default();
                Err(refusal(url, code, &text))
            }
            Err(ureq::Error::Transport(t)) => {
                // ureq's own text repeats the URL; say what failed once.
                let mut reason = t.kind().to_string();
                if let Some(m) = t.message() {
                    reason = format!("{reason}: {m}");
                }
                if let Some(source) = std::error::Error::source(&t) {
                    reason = format!("{reason}: {source}");
                }
                Err(CliError::Unreachable {
                    url: self.base.clone(),
                    reason,
                })
            }
        }
    }
}

/// The error an HTTP refusal carries: the API's own `{kind, message}` when
/// it sent one, else the status and whatever came back.
pub fn refusal(url: &str, code: u16, body: &str) -> CliError {
    match serde_json::from_str::<ControlError>(body) {
        Ok(e) => CliError::Refused(e),
        Err(_) => CliError::BadAnswer {
            url: url.to_string(),
            reason: format!("HTTP {code}: {}", body.trim()),
        },
    }
}

/// Decodes an API answer into its view type.
pub fn decode<T: DeserializeOwned>(what: &str, value: Value) -> Result<T, CliError> {
    serde_json::from_value(value).map_err(|e| CliError::BadAnswer {
        url: what.to_string(),
        reason: format!("the JSON does not match the documented shape: {e}"),
    })
}

/// Escapes a name for use as one path segment, so a name with `/` or `?`
/// reaches the API as the name the user typed (and is refused there).
pub fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_urls_must_be_https_or_http_host_and_port() {
        assert!(ApiClient::new("http://127.0.0.1:9480", None).is_ok());
        assert!(ApiClient::new("https://127.0.0.1:9480/", None).is_ok());
        for bad in ["127.0.0.1:9480", "ftp://h:1", "https://", "https://h:1/v1"] {
            let e = ApiClient::new(bad, None).err().expect("refused");
            assert_eq!(e.exit_code(), EXIT_USAGE, "{bad}");
        }
    }

    #[test]
    fn the_api_error_shape_becomes_its_message_with_exit_1() {
        let e = refusal(
            "u",
            409,
            r#"{"kind":"conflict","message":"volume vol1 already exists"}"#,
        );
        assert_eq!(e.to_string(), "volume vol1 already exists");
        assert_eq!(e.exit_code(), EXIT_REFUSED);
        let other = refusal("u", 502, "Bad Gateway");
        assert_eq!(
            other.to_string(),
            "unexpected answer from u: HTTP 502: Bad Gateway"
        );
        assert_eq!(other.exit_code(), EXIT_REFUSED);
    }

    #[test]
    fn unreachable_says_how_to_start_the_cluster_and_exits_3() {
        let e = CliError::Unreachable {
            url: "http://127.0.0.1:1".into(),
            reason: "Connection refused".into(),
        };
        assert_eq!(e.exit_code(), EXIT_UNREACHABLE);
        assert!(e.to_string().contains("is `tessera up` running?"));
    }

    #[test]
    fn names_are_escaped_as_one_path_segment() {
        assert_eq!(segment("vol-1.a_b"), "vol-1.a_b");
        assert_eq!(segment("a/b?c d"), "a%2Fb%3Fc%20d");
    }
}
