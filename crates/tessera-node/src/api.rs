//! The REST API: [`ClusterControl`] over HTTP with JSON bodies.
//!
//! Owns: routes, status codes and the JSON error shape. Must not touch:
//! cluster logic; every handler is one call on [`ClusterControl`].
//!
//! Invariants:
//! - Every request presents a token (`Authorization: Bearer tsn_...`)
//!   whose role may do what it asks ([`crate::api_access::ROUTES`]) before
//!   any handler runs: without one, or with one the cluster does not
//!   accept, it gets 401; with a role that may not, 403; either way
//!   nothing changes.
//! - Every failure, including a malformed body, an unknown route and a
//!   wrong method, answers with `{"kind": "...", "message": "..."}` (the
//!   serde form of [`ControlError`]), so a client needs one error decoder.
//! - A request body is parsed here, before the control plane sees it: a body
//!   that is not the expected JSON is refused with 400 and changes nothing.
//!
//! Routes (all under `/v1`):
//!
//! | method | path | answer |
//! |---|---|---|
//! | GET | `/status` | 200 `StatusView` |
//! | GET | `/health` | 200 `HealthReport` |
//! | GET | `/settings` | 200 `ClusterSettings` |
//! | PATCH | `/settings` (`UpdateSettings`) | 200 `ClusterSettings` |
//! | GET | `/hosts/{id}/settings` | 200 `HostSettingsView` |
//! | PATCH | `/hosts/{id}/settings` (`UpdateHostSettings`) | 200 `HostSettingsView` |
//! | GET | `/hosts` | 200 `[HostView]` |
//! | GET | `/hosts/{id}` | 200 `HostView` |
//! | POST | `/hosts/{id}/stop` | 204 |
//! | POST | `/hosts/{id}/start` | 204 |
//! | GET | `/policies` | 200 `[Policy]` |
//! | POST | `/policies` (`CreatePolicy`) | 201 `Policy` |
//! | GET | `/policies/{name}` | 200 `Policy` |
//! | PATCH | `/policies/{name}` (`UpdatePolicy`) | 200 `Policy` |
//! | DELETE | `/policies/{name}` | 204 |
//! | GET | `/volumes` | 200 `[VolumeView]` |
//! | POST | `/volumes` (`CreateVolume`) | 201 `VolumeView` |
//! | GET | `/volumes/{name}` | 200 `VolumeView` |
//! | POST | `/volumes/{name}/resize` (`ResizeVolume`) | 200 `VolumeView` |
//! | POST | `/volumes/{name}/rename` (`RenameVolume`) | 200 `VolumeView` |
//! | DELETE | `/volumes/{name}[?force=true]` | 204 |
//! | GET | `/audit[?limit=N]` | 200 `[AuditRecord]` (the latest N, 100 by default, oldest first) |
//! | GET | `/volumes/{name}/access` | 200 `IscsiAccessView` |
//! | PUT | `/volumes/{name}/access` (`IscsiAccess`) | 200 `IscsiAccessView` |
//! | GET | `/volumes/{name}/snapshots` | 200 `[SnapshotView]` (oldest first) |
//! | POST | `/volumes/{name}/snapshots` (`CreateSnapshot`) | 201 `SnapshotView` |
//! | DELETE | `/volumes/{name}/snapshots/{snapshot}` | 204 (409 while a full clone is filled from it) |
//! | POST | `/volumes/{name}/snapshots/{snapshot}/clones` (`CloneVolume`) | 201 `VolumeView` (a linked clone; with `full`, a full clone being filled) |
//! | POST | `/volumes/{name}/revert` (`RevertVolume`) | 200 `VolumeView` |
//! | GET | `/objects/{name}` | 200 `ObjectView` |
//! | POST | `/objects/{name}/verify` | 200 `VerifyReport` |
//! | GET | `/events[?limit=N]` | 200 `[EventView]` (the latest N, 100 by default, oldest first) |
//! | GET | `/activity/hosts` | 200 `[HostActivity]` (each host's transport round trips and write logs) |
//! | GET | `/activity` | 200 `[VolumeActivity]` (what clients did to each volume, counted by its owner) |
//! | GET | `/activity/history[?after_ms=N]` | 200 `ActivityHistoryView` (the rates of each 5 s interval of the last hour, or of those that ended after N) |
//! | GET | `/resyncs` | 200 `[ResyncView]` |
//! | GET | `/scrubs` | 200 `[ScrubView]` |
//! | POST | `/hosts/{id}/scrub` | 202 `[ScrubView]` (a pass of every disk group starts) |
//! | GET | `/encryption` | 200 `[EncryptionView]` (every disk group) |
//! | POST | `/hosts/{id}/rekey` (`RekeyRequest`) | 202 `[EncryptionView]` (shallow: done; deep: started) |
//! | GET | `/tokens` | 200 `[TokenView]` |
//! | POST | `/tokens` (`CreateToken`) | 201 `CreatedToken` (the only answer that holds its secret) |
//! | DELETE | `/tokens/{id}` | 204 |
//!
//! And outside `/v1`: GET `/metrics`, 200, the Prometheus text format
//! ([`crate::metrics`]); GET `/ui/` (and `/`, which sends there), the web
//! dashboard ([`crate::dashboard`]), and GET `/v1/openapi.json`, the
//! OpenAPI document of every route ([`crate::openapi`]): the only routes
//! that need no token.
//!
//! The role each route needs is in [`crate::api_access::ROUTES`]: reads a
//! viewer's, changes to volumes an operator's, changes to the cluster and
//! every token route an admin's.

use crate::api_access;
use crate::control::{
    ApiChange, ApiIdentity, CloneVolume, ClusterControl, ControlError, CreatePolicy,
    CreateSnapshot, CreateToken, CreateVolume, Evacuate, InjectFault, IscsiAccess, RekeyRequest,
    RenameVolume, ResizeVolume, RevertVolume, UpdateHostSettings, UpdatePolicy, UpdateSettings,
};
use axum::body::Bytes;
use axum::extract::{Extension, Path, Request, State};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;

type Control = Arc<dyn ClusterControl>;

/// The API's routes over `control`.
pub fn router(control: Control) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/health", get(health))
        .route("/v1/settings", get(settings).patch(update_settings))
        .route("/v1/hosts", get(hosts))
        .route("/v1/hosts/{id}", get(host))
        .route("/v1/hosts/{id}/stop", post(stop_host))
        .route("/v1/hosts/{id}/start", post(start_host))
        .route("/v1/hosts/{id}/faults", post(inject_fault))
        .route("/v1/hosts/{id}/scrub", post(scrub_now))
        .route("/v1/hosts/{id}/rekey", post(rekey))
        .route(
            "/v1/hosts/{id}/settings",
            get(host_settings).patch(update_host_settings),
        )
        .route("/v1/encryption", get(encryption))
        .route(
            "/v1/hosts/{id}/evacuation",
            post(evacuate).delete(end_evacuation),
        )
        .route("/v1/policies", get(policies).post(create_policy))
        .route(
            "/v1/policies/{name}",
            get(policy).patch(update_policy).delete(delete_policy),
        )
        .route("/v1/volumes", get(volumes).post(create_volume))
        .route("/v1/volumes/{name}", get(volume).delete(delete_volume))
        .route("/v1/volumes/{name}/resize", post(resize_volume))
        .route("/v1/volumes/{name}/rename", post(rename_volume))
        .route("/v1/volumes/{name}/revert", post(revert_volume))
        .route(
            "/v1/volumes/{name}/access",
            get(iscsi_access).put(set_iscsi_access),
        )
        .route(
            "/v1/volumes/{name}/snapshots",
            get(snapshots).post(create_snapshot),
        )
        .route(
            "/v1/volumes/{name}/snapshots/{snapshot}",
            axum::routing::delete(delete_snapshot),
        )
        .route(
            "/v1/volumes/{name}/snapshots/{snapshot}/clones",
            post(clone_volume),
        )
        .route("/v1/objects/{name}", get(object))
        .route("/v1/objects/{name}/verify", post(verify_object))
        .route("/v1/activity", get(activity))
        .route("/v1/activity/hosts", get(host_activity))
        .route("/v1/activity/history", get(activity_history))
        .route("/v1/events", get(events))
        .route("/metrics", get(metrics))
        .route("/v1/resyncs", get(resyncs))
        .route("/v1/scrubs", get(scrubs))
        .route("/v1/tokens", get(tokens).post(create_token))
        .route("/v1/tokens/{id}", axum::routing::delete(revoke_token))
        .route("/v1/audit", get(audit))
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&control),
            admit,
        ))
        .with_state(control)
        // The dashboard's files hold no data: served without a token, and
        // outside the audit of changes.
        .merge(crate::dashboard::router())
}

/// Lets a request on only if it presents a token whose role may do what
/// it asks; the handlers find who it is in the request's extensions. Every
/// request that may change something (any method but GET and HEAD) is kept
/// in the audit log with its answer, refused ones included.
async fn admit(State(control): State<Control>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    if matches!(method, Method::GET | Method::HEAD) {
        return admitted(&control, request, next).await.0;
    }
    let path = request.uri().path().to_string();
    let (response, identity) = admitted(&control, request, next).await;
    let change = ApiChange {
        identity,
        method: method.to_string(),
        path,
        status: response.status().as_u16(),
    };
    if let Err(e) = control.record_change(change).await {
        tracing::error!(error = %e, "the audit log could not keep a change");
    }
    response
}

/// [`admit`]'s checks and the handler's answer, with who asked when a token
/// was accepted.
async fn admitted(
    control: &Control,
    mut request: Request,
    next: Next,
) -> (Response, Option<ApiIdentity>) {
    // The scheme's name is case-insensitive (RFC 7235).
    let presented = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim());
    let identity = match control.authenticate(presented).await {
        Ok(identity) => identity,
        Err(e) => {
            let mut response = error_response(e);
            // What a 401 asks for (RFC 6750).
            if response.status() != StatusCode::UNAUTHORIZED {
                return (response, None);
            }
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"tessera\""),
            );
            return (response, None);
        }
    };
    let needed = api_access::required_role(request.method(), request.uri().path());
    if !identity.role.allows(needed) {
        let refusal = error_response(ControlError::Forbidden(format!(
            "token {} ({}) has the {} role: {} {} needs the {} role",
            identity.token_id,
            identity.name,
            identity.role,
            request.method(),
            request.uri().path(),
            needed,
        )));
        return (refusal, Some(identity));
    }
    request.extensions_mut().insert(identity.clone());
    (next.run(request).await, Some(identity))
}

/// The query of a request, or why it is refused (saying what it may hold).
fn parse_query<T: DeserializeOwned>(
    method: &str,
    uri: &Uri,
    allowed: &str,
) -> Result<T, ControlError> {
    serde_urlencoded::from_str(uri.query().unwrap_or("")).map_err(|e| {
        ControlError::Invalid(format!(
            "bad query on {method} {}: {e} (the only parameter is {allowed})",
            uri.path()
        ))
    })
}

async fn audit(State(control): State<Control>, uri: Uri) -> Response {
    match listing_limit(&uri) {
        Ok(limit) => respond(StatusCode::OK, control.audit(limit).await),
        Err(refused) => error_response(refused),
    }
}

/// The `limit` a listing's query asks for ([`LIST_DEFAULT_LIMIT`] when it
/// names none); any other parameter is refused.
fn listing_limit(uri: &Uri) -> Result<usize, ControlError> {
    let query: LimitQuery = parse_query("GET", uri, "limit=N")?;
    Ok(query.limit.unwrap_or(LIST_DEFAULT_LIMIT))
}

/// Entries `GET /v1/audit` and `GET /v1/events` answer unless `limit` says.
const LIST_DEFAULT_LIMIT: usize = 100;

/// The query of `GET /v1/audit` and `GET /v1/events`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitQuery {
    /// The latest entries to answer.
    limit: Option<usize>,
}

async fn tokens(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.tokens().await)
}

async fn create_token(
    State(control): State<Control>,
    Extension(by): Extension<ApiIdentity>,
    body: Bytes,
) -> Response {
    match parse_body::<CreateToken>(&body) {
        Ok(request) => respond(
            StatusCode::CREATED,
            control.create_token(Some(&by), request).await,
        ),
        Err(e) => error_response(e),
    }
}

async fn revoke_token(State(control): State<Control>, Path(id): Path<String>) -> Response {
    respond_empty(control.revoke_token(&id).await)
}

/// Serves the API on `listener` until `shutdown` completes; requests in
/// flight are finished before it returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    control: Arc<dyn ClusterControl>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "REST API listening");
    }
    axum::serve(listener, router(control))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves the API over HTTPS (TLS 1.3, `tls`'s certificate) on
/// `listener` until `shutdown` completes.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    control: Arc<dyn ClusterControl>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "REST API listening (HTTPS)");
    }
    let listener = crate::api_tls::TlsListener::new(listener, tls);
    axum::serve(listener, router(control))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn status(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.status().await)
}

async fn hosts(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.hosts().await)
}

async fn stop_host(State(control): State<Control>, Path(id): Path<String>) -> Response {
    respond_empty(control.stop_host(&id).await)
}

async fn start_host(State(control): State<Control>, Path(id): Path<String>) -> Response {
    respond_empty(control.start_host(&id).await)
}

async fn inject_fault(
    State(control): State<Control>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    match parse_body::<InjectFault>(&body) {
        Ok(fault) => respond_empty(control.inject_fault(&id, fault).await),
        Err(e) => error_response(e),
    }
}

async fn evacuate(State(control): State<Control>, Path(id): Path<String>, body: Bytes) -> Response {
    match parse_body::<Evacuate>(&body) {
        Ok(e) => respond(
            StatusCode::ACCEPTED,
            control.evacuate(&id, e.disk_group.as_deref()).await,
        ),
        Err(e) => error_response(e),
    }
}

async fn encryption(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.encryption().await)
}

async fn rekey(State(control): State<Control>, Path(id): Path<String>, body: Bytes) -> Response {
    match parse_body::<RekeyRequest>(&body) {
        Ok(request) => respond(StatusCode::ACCEPTED, control.rekey(&id, request).await),
        Err(e) => error_response(e),
    }
}

async fn end_evacuation(State(control): State<Control>, Path(id): Path<String>) -> Response {
    respond_empty(control.end_evacuation(&id).await)
}

async fn policies(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.policies().await)
}

async fn create_policy(State(control): State<Control>, body: Bytes) -> Response {
    match parse_body::<CreatePolicy>(&body) {
        Ok(request) => respond(StatusCode::CREATED, control.create_policy(request).await),
        Err(e) => error_response(e),
    }
}

async fn volumes(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.volumes().await)
}

async fn create_volume(State(control): State<Control>, body: Bytes) -> Response {
    match parse_body::<CreateVolume>(&body) {
        Ok(request) => respond(StatusCode::CREATED, control.create_volume(request).await),
        Err(e) => error_response(e),
    }
}

async fn resize_volume(
    State(control): State<Control>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    match parse_body::<ResizeVolume>(&body) {
        Ok(request) => respond(StatusCode::OK, control.resize_volume(&name, request).await),
        Err(e) => error_response(e),
    }
}

async fn rename_volume(
    State(control): State<Control>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    match parse_body::<RenameVolume>(&body) {
        Ok(request) => respond(StatusCode::OK, control.rename_volume(&name, request).await),
        Err(e) => error_response(e),
    }
}

async fn snapshots(State(control): State<Control>, Path(name): Path<String>) -> Response {
    respond(StatusCode::OK, control.snapshots(&name).await)
}

async fn create_snapshot(
    State(control): State<Control>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    match parse_body::<CreateSnapshot>(&body) {
        Ok(request) => respond(
            StatusCode::CREATED,
            control.create_snapshot(&name, request).await,
        ),
        Err(e) => error_response(e),
    }
}

async fn revert_volume(
    State(control): State<Control>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    match parse_body::<RevertVolume>(&body) {
        Ok(request) => respond(StatusCode::OK, control.revert_volume(&name, request).await),
        Err(e) => error_response(e),
    }
}

async fn clone_volume(
    State(control): State<Control>,
    Path((name, snapshot)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    match parse_body::<CloneVolume>(&body) {
        Ok(request) => respond(
            StatusCode::CREATED,
            control.clone_volume(&name, &snapshot, request).await,
        ),
        Err(e) => error_response(e),
    }
}

async fn delete_snapshot(
    State(control): State<Control>,
    Path((name, snapshot)): Path<(String, String)>,
) -> Response {
    respond(
        StatusCode::OK,
        control.delete_snapshot(&name, &snapshot).await,
    )
}

async fn iscsi_access(State(control): State<Control>, Path(name): Path<String>) -> Response {
    respond(StatusCode::OK, control.iscsi_access(&name).await)
}

async fn set_iscsi_access(
    State(control): State<Control>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    match parse_body::<IscsiAccess>(&body) {
        Ok(access) => respond(
            StatusCode::OK,
            control.set_iscsi_access(&name, access).await,
        ),
        Err(e) => error_response(e),
    }
}

/// Query of `DELETE /v1/volumes/{name}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    #[serde(default)]
    force: bool,
}

async fn delete_volume(
    State(control): State<Control>,
    Path(name): Path<String>,
    uri: Uri,
) -> Response {
    let query: DeleteQuery = match parse_query("DELETE", &uri, "force=true") {
        Ok(q) => q,
        Err(refused) => return error_response(refused),
    };
    respond_empty(control.delete_volume(&name, query.force).await)
}

async fn volume(State(control): State<Control>, Path(name): Path<String>) -> Response {
    respond(StatusCode::OK, control.volume(&name).await)
}

async fn health(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.health().await)
}

async fn settings(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.settings().await)
}

async fn update_settings(State(control): State<Control>, body: Bytes) -> Response {
    match parse_body::<UpdateSettings>(&body) {
        Ok(change) => respond(StatusCode::OK, control.update_settings(change).await),
        Err(e) => error_response(e),
    }
}

async fn host_settings(State(control): State<Control>, Path(id): Path<String>) -> Response {
    respond(StatusCode::OK, control.host_settings(&id).await)
}

async fn update_host_settings(
    State(control): State<Control>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    match parse_body::<UpdateHostSettings>(&body) {
        Ok(change) => respond(
            StatusCode::OK,
            control.update_host_settings(&id, change).await,
        ),
        Err(e) => error_response(e),
    }
}

async fn host(State(control): State<Control>, Path(id): Path<String>) -> Response {
    respond(StatusCode::OK, control.host(&id).await)
}

async fn policy(State(control): State<Control>, Path(name): Path<String>) -> Response {
    respond(StatusCode::OK, control.policy(&name).await)
}

async fn update_policy(
    State(control): State<Control>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    match parse_body::<UpdatePolicy>(&body) {
        Ok(change) => respond(StatusCode::OK, control.update_policy(&name, change).await),
        Err(e) => error_response(e),
    }
}

async fn delete_policy(State(control): State<Control>, Path(name): Path<String>) -> Response {
    respond_empty(control.delete_policy(&name).await)
}

async fn object(State(control): State<Control>, Path(name): Path<String>) -> Response {
    respond(StatusCode::OK, control.object(&name).await)
}

async fn verify_object(State(control): State<Control>, Path(name): Path<String>) -> Response {
    respond(StatusCode::OK, control.verify_object(&name).await)
}

async fn events(State(control): State<Control>, uri: Uri) -> Response {
    match listing_limit(&uri) {
        Ok(limit) => respond(StatusCode::OK, control.events(limit).await),
        Err(refused) => error_response(refused),
    }
}

async fn host_activity(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.host_activity().await)
}

async fn activity(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.activity().await)
}

async fn activity_history(State(control): State<Control>, uri: Uri) -> Response {
    match parse_query::<HistoryQuery>("GET", &uri, "after_ms=N") {
        Ok(query) => respond(
            StatusCode::OK,
            control.activity_history(query.after_ms).await,
        ),
        Err(refused) => error_response(refused),
    }
}

/// The query of `GET /v1/activity/history`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    /// Only intervals that ended after this (ms since the Unix epoch).
    after_ms: Option<u64>,
}

async fn metrics(State(control): State<Control>) -> Response {
    match crate::metrics::scrape(control.as_ref()).await {
        Ok(text) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                crate::metrics::CONTENT_TYPE,
            )],
            text,
        )
            .into_response(),
        Err(e) => error_response(e),
    }
}

async fn resyncs(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.resyncs().await)
}

async fn scrubs(State(control): State<Control>) -> Response {
    respond(StatusCode::OK, control.scrubs().await)
}

async fn scrub_now(State(control): State<Control>, Path(id): Path<String>) -> Response {
    respond(StatusCode::ACCEPTED, control.scrub_now(&id).await)
}

async fn unknown_route(method: Method, uri: Uri) -> Response {
    error_response(ControlError::NotFound(format!(
        "no API route {method} {}",
        uri.path()
    )))
}

async fn wrong_method(method: Method, uri: Uri) -> Response {
    let mut response = error_response(ControlError::Invalid(format!(
        "method {method} is not allowed on {}",
        uri.path()
    )));
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}

/// Parses a JSON request body. The content type is not insisted on: a body
/// is judged by what it holds, so `curl -d` works without a header.
fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ControlError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ControlError::Invalid(
            "request body is empty; expected a JSON object".to_string(),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ControlError::Invalid(format!("malformed JSON request body: {e}")))
}

fn respond<T: serde::Serialize>(ok: StatusCode, result: Result<T, ControlError>) -> Response {
    match result {
        Ok(value) => (ok, Json(value)).into_response(),
        Err(e) => error_response(e),
    }
}

fn respond_empty(result: Result<(), ControlError>) -> Response {
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error_response(e),
    }
}

/// The HTTP status of each refusal kind.
pub fn status_code(error: &ControlError) -> StatusCode {
    match error {
        ControlError::NotFound(_) => StatusCode::NOT_FOUND,
        ControlError::Conflict(_) => StatusCode::CONFLICT,
        ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
        ControlError::Unsatisfiable(_) => StatusCode::UNPROCESSABLE_ENTITY,
        ControlError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        ControlError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        ControlError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        ControlError::Forbidden(_) => StatusCode::FORBIDDEN,
    }
}

fn error_response(error: ControlError) -> Response {
    let code = status_code(&error);
    if code.is_server_error() {
        tracing::warn!(%error, status = code.as_u16(), "control operation failed");
    }
    (code, Json(error)).into_response()
}
