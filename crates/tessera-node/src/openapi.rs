//! The REST API's OpenAPI 3.1 document, served at [`PATH`].
//!
//! Owns: [`OPERATIONS`], each route with what it takes and answers, and
//! [`document`], which turns them into the document: the schemas come from
//! the API's own types (`schemars` reads their serde attributes and doc
//! comments), the role each route needs from [`crate::api_access`].
//! Must not touch: HTTP serving or the cluster.
//!
//! Invariants: the operations are exactly the routes of
//! [`crate::api_access::ROUTES`] and the routes that need no token (the
//! document itself and the dashboard's files); the CLI and the dashboard
//! call no path the document does not list (both are checked by tests).

use crate::activity_history::ActivityHistoryView;
use crate::api_access;
use crate::control::{AuditRecord, HostSettingsView};
use crate::control::{
    CloneVolume, ClusterSettings, ControlError, CreatePolicy, CreateSnapshot, CreateToken,
    CreateVolume, CreatedToken, EncryptionView, Evacuate, EvacuationView, EventView, HealthReport,
    HostActivity, HostView, InjectFault, IscsiAccess, IscsiAccessView, ObjectView, RekeyRequest,
    RenameVolume, ResizeVolume, ResyncView, RevertVolume, ScrubView, SnapshotDeleted, SnapshotView,
    StatusView, TokenView, UpdateHostSettings, UpdatePolicy, UpdateSettings, VerifyReport,
    VolumeActivity, VolumeView,
};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{json, Map, Value};
use tessera_types::policy::Policy;

/// Where the document is served (without a token: it describes the API,
/// it holds no data).
pub const PATH: &str = "/v1/openapi.json";

/// The schema of a body or an answer, by the type that carries it.
type SchemaOf = fn(&mut SchemaGenerator) -> Schema;

fn of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// What a route answers when it succeeds.
#[derive(Clone, Copy)]
pub enum Answer {
    /// JSON of a type, with this status.
    Json(u16, SchemaOf),
    /// 204, no body.
    Empty,
    /// 200, a text body of this content type.
    Text(&'static str),
}

/// A query parameter.
#[derive(Clone, Copy)]
pub struct QueryParam {
    /// Its name.
    pub name: &'static str,
    /// "integer" or "boolean".
    pub kind: &'static str,
    /// What it does.
    pub description: &'static str,
}

/// One route of the API.
#[derive(Clone, Copy)]
pub struct Operation {
    /// HTTP method.
    pub method: &'static str,
    /// Path, `{x}` standing for one segment.
    pub path: &'static str,
    /// One line: what it does.
    pub summary: &'static str,
    /// Its query parameters.
    pub query: &'static [QueryParam],
    /// Its JSON body, if it takes one.
    pub body: Option<SchemaOf>,
    /// What it answers.
    pub answer: Answer,
    /// Whether it is served without a token.
    pub public: bool,
}

const fn op(
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    body: Option<SchemaOf>,
    answer: Answer,
) -> Operation {
    Operation {
        method,
        path,
        summary,
        query: &[],
        body,
        answer,
        public: false,
    }
}

const LIMIT: &[QueryParam] = &[QueryParam {
    name: "limit",
    kind: "integer",
    description: "The latest entries to answer (100 by default), oldest first.",
}];

/// Every route of the API.
pub const OPERATIONS: &[Operation] = &[
    op(
        "GET",
        "/v1/status",
        "Health checks, capacity, hosts, volumes and resyncs.",
        None,
        Answer::Json(200, of::<StatusView>),
    ),
    op(
        "GET",
        "/v1/health",
        "Overall health and each check with its code and remedy.",
        None,
        Answer::Json(200, of::<HealthReport>),
    ),
    op(
        "GET",
        "/v1/settings",
        "The cluster's settings.",
        None,
        Answer::Json(200, of::<ClusterSettings>),
    ),
    op(
        "PATCH",
        "/v1/settings",
        "Changes settings; the rest keep their values.",
        Some(of::<UpdateSettings>),
        Answer::Json(200, of::<ClusterSettings>),
    ),
    op(
        "GET",
        "/v1/hosts",
        "Every host with its disk groups.",
        None,
        Answer::Json(200, of::<Vec<HostView>>),
    ),
    op(
        "GET",
        "/v1/hosts/{id}",
        "One host.",
        None,
        Answer::Json(200, of::<HostView>),
    ),
    op(
        "POST",
        "/v1/hosts/{id}/stop",
        "Stops a host's services, as a failure would (tessera up only).",
        None,
        Answer::Empty,
    ),
    op(
        "POST",
        "/v1/hosts/{id}/start",
        "Starts a stopped host again (tessera up only).",
        None,
        Answer::Empty,
    ),
    op(
        "POST",
        "/v1/hosts/{id}/faults",
        "Injects a device or network fault into a host that accepts them.",
        Some(of::<InjectFault>),
        Answer::Empty,
    ),
    op(
        "POST",
        "/v1/hosts/{id}/scrub",
        "Starts a scrub pass of every disk group of a host.",
        None,
        Answer::Json(202, of::<Vec<ScrubView>>),
    ),
    op(
        "GET",
        "/v1/hosts/{id}/settings",
        "The settings a host follows, and which of them are its own.",
        None,
        Answer::Json(200, of::<HostSettingsView>),
    ),
    op(
        "PATCH",
        "/v1/hosts/{id}/settings",
        "Sets a host's own values of settings (null follows the cluster again).",
        Some(of::<UpdateHostSettings>),
        Answer::Json(200, of::<HostSettingsView>),
    ),
    op(
        "POST",
        "/v1/hosts/{id}/rekey",
        "Rekeys a host's encrypted disk groups (shallow now, deep in the background).",
        Some(of::<RekeyRequest>),
        Answer::Json(202, of::<Vec<EncryptionView>>),
    ),
    op(
        "GET",
        "/v1/encryption",
        "Every disk group's encryption at rest.",
        None,
        Answer::Json(200, of::<Vec<EncryptionView>>),
    ),
    op(
        "POST",
        "/v1/hosts/{id}/evacuation",
        "Starts moving every component off a host or one of its disk groups.",
        Some(of::<Evacuate>),
        Answer::Json(202, of::<EvacuationView>),
    ),
    op(
        "DELETE",
        "/v1/hosts/{id}/evacuation",
        "Ends a host's evacuation: its disk groups take components again.",
        None,
        Answer::Empty,
    ),
    op(
        "GET",
        "/v1/policies",
        "Every storage policy.",
        None,
        Answer::Json(200, of::<Vec<Policy>>),
    ),
    op(
        "POST",
        "/v1/policies",
        "Creates a storage policy.",
        Some(of::<CreatePolicy>),
        Answer::Json(201, of::<Policy>),
    ),
    op(
        "GET",
        "/v1/policies/{name}",
        "One storage policy.",
        None,
        Answer::Json(200, of::<Policy>),
    ),
    op(
        "PATCH",
        "/v1/policies/{name}",
        "Changes a storage policy.",
        Some(of::<UpdatePolicy>),
        Answer::Json(200, of::<Policy>),
    ),
    op(
        "DELETE",
        "/v1/policies/{name}",
        "Deletes a policy no volume uses.",
        None,
        Answer::Empty,
    ),
    op(
        "GET",
        "/v1/volumes",
        "Every volume.",
        None,
        Answer::Json(200, of::<Vec<VolumeView>>),
    ),
    op(
        "POST",
        "/v1/volumes",
        "Creates a volume, placed by its policy.",
        Some(of::<CreateVolume>),
        Answer::Json(201, of::<VolumeView>),
    ),
    op(
        "GET",
        "/v1/volumes/{name}",
        "One volume.",
        None,
        Answer::Json(200, of::<VolumeView>),
    ),
    Operation {
        query: &[QueryParam {
            name: "force",
            kind: "boolean",
            description: "Delete even while clients have it open (they fail at once).",
        }],
        ..op(
            "DELETE",
            "/v1/volumes/{name}",
            "Deletes a volume and its snapshots.",
            None,
            Answer::Empty,
        )
    },
    op(
        "POST",
        "/v1/volumes/{name}/resize",
        "Grows a volume.",
        Some(of::<ResizeVolume>),
        Answer::Json(200, of::<VolumeView>),
    ),
    op(
        "POST",
        "/v1/volumes/{name}/rename",
        "Renames a volume no client has open.",
        Some(of::<RenameVolume>),
        Answer::Json(200, of::<VolumeView>),
    ),
    op(
        "POST",
        "/v1/volumes/{name}/revert",
        "Returns a volume to one of its snapshots.",
        Some(of::<RevertVolume>),
        Answer::Json(200, of::<VolumeView>),
    ),
    op(
        "GET",
        "/v1/volumes/{name}/access",
        "Who may use a volume over iSCSI and NBD (never a secret).",
        None,
        Answer::Json(200, of::<IscsiAccessView>),
    ),
    op(
        "PUT",
        "/v1/volumes/{name}/access",
        "Replaces who may use a volume.",
        Some(of::<IscsiAccess>),
        Answer::Json(200, of::<IscsiAccessView>),
    ),
    op(
        "GET",
        "/v1/volumes/{name}/snapshots",
        "A volume's snapshots, oldest first.",
        None,
        Answer::Json(200, of::<Vec<SnapshotView>>),
    ),
    op(
        "POST",
        "/v1/volumes/{name}/snapshots",
        "Takes a snapshot (of a consistency group with `group`).",
        Some(of::<CreateSnapshot>),
        Answer::Json(201, of::<SnapshotView>),
    ),
    op(
        "DELETE",
        "/v1/volumes/{name}/snapshots/{snapshot}",
        "Deletes a snapshot, freeing what only it held.",
        None,
        Answer::Json(200, of::<SnapshotDeleted>),
    ),
    op(
        "POST",
        "/v1/volumes/{name}/snapshots/{snapshot}/clones",
        "Makes a volume from a snapshot: a linked clone, or a full clone filled in the background.",
        Some(of::<CloneVolume>),
        Answer::Json(201, of::<VolumeView>),
    ),
    op(
        "GET",
        "/v1/objects/{name}",
        "A volume's component tree.",
        None,
        Answer::Json(200, of::<ObjectView>),
    ),
    op(
        "POST",
        "/v1/objects/{name}/verify",
        "Compares every active copy of a volume block by block.",
        None,
        Answer::Json(200, of::<VerifyReport>),
    ),
    op(
        "GET",
        "/v1/activity",
        "What clients did to each volume, counted by its owner.",
        None,
        Answer::Json(200, of::<Vec<VolumeActivity>>),
    ),
    op(
        "GET",
        "/v1/activity/hosts",
        "Each host's transport round trips and write logs.",
        None,
        Answer::Json(200, of::<Vec<HostActivity>>),
    ),
    Operation {
        query: &[QueryParam {
            name: "after_ms",
            kind: "integer",
            description: "Only intervals that ended after this (ms since the Unix epoch).",
        }],
        ..op(
            "GET",
            "/v1/activity/history",
            "The rates of each 5 s interval of the last hour.",
            None,
            Answer::Json(200, of::<ActivityHistoryView>),
        )
    },
    Operation {
        query: LIMIT,
        ..op(
            "GET",
            "/v1/events",
            "What the cluster did and why.",
            None,
            Answer::Json(200, of::<Vec<EventView>>),
        )
    },
    op(
        "GET",
        "/metrics",
        "Prometheus metrics, text format 0.0.4.",
        None,
        Answer::Text(crate::metrics::CONTENT_TYPE),
    ),
    op(
        "GET",
        "/v1/resyncs",
        "Resyncs and rebuilds, running and recent.",
        None,
        Answer::Json(200, of::<Vec<ResyncView>>),
    ),
    op(
        "GET",
        "/v1/scrubs",
        "Each disk group's scrubbing.",
        None,
        Answer::Json(200, of::<Vec<ScrubView>>),
    ),
    op(
        "GET",
        "/v1/tokens",
        "Every API token (never a secret).",
        None,
        Answer::Json(200, of::<Vec<TokenView>>),
    ),
    op(
        "POST",
        "/v1/tokens",
        "Makes a token; the answer holds its secret, shown this once.",
        Some(of::<CreateToken>),
        Answer::Json(201, of::<CreatedToken>),
    ),
    op(
        "DELETE",
        "/v1/tokens/{id}",
        "Revokes a token.",
        None,
        Answer::Empty,
    ),
    Operation {
        query: LIMIT,
        ..op(
            "GET",
            "/v1/audit",
            "Changes asked of the API and their answers.",
            None,
            Answer::Json(200, of::<Vec<AuditRecord>>),
        )
    },
    Operation {
        public: true,
        ..op(
            "GET",
            PATH,
            "This document.",
            None,
            Answer::Text("application/json"),
        )
    },
    Operation {
        public: true,
        ..op(
            "GET",
            crate::dashboard::PATH,
            "The web dashboard.",
            None,
            Answer::Text("text/html; charset=utf-8"),
        )
    },
];

/// The document, as JSON.
pub fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    let error = Value::from(of::<ControlError>(&mut generator));
    let mut paths = Map::new();
    for o in OPERATIONS {
        let mut operation = Map::new();
        operation.insert("summary".into(), o.summary.into());
        operation.insert(
            "operationId".into(),
            format!("{} {}", o.method, o.path).into(),
        );
        let mut parameters: Vec<Value> = o
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        parameters.extend(o.query.iter().map(|q| {
            json!({"name": q.name, "in": "query", "required": false,
                   "description": q.description, "schema": {"type": q.kind}})
        }));
        if !parameters.is_empty() {
            operation.insert("parameters".into(), parameters.into());
        }
        if let Some(body) = o.body {
            let schema = Value::from(body(&mut generator));
            operation.insert(
                "requestBody".into(),
                json!({"required": true, "content": {"application/json": {"schema": schema}}}),
            );
        }
        let mut responses = Map::new();
        match o.answer {
            Answer::Json(status, answer) => {
                let schema = Value::from(answer(&mut generator));
                responses.insert(
                    status.to_string(),
                    json!({"description": "Done.", "content": {"application/json": {"schema": schema}}}),
                );
            }
            Answer::Empty => {
                responses.insert("204".into(), json!({"description": "Done."}));
            }
            Answer::Text(content_type) => {
                responses.insert(
                    "200".into(),
                    json!({"description": "Done.", "content": {content_type: {}}}),
                );
            }
        }
        if o.public {
            operation.insert("security".into(), json!([]));
        } else {
            let method = o.method.parse().unwrap_or(axum::http::Method::GET);
            let role = api_access::required_role(&method, o.path);
            operation.insert("x-tessera-role".into(), role.as_str().into());
            operation.insert(
                "description".into(),
                format!("Needs a token of the role {} or above.", role.as_str()).into(),
            );
            responses.insert(
                "default".into(),
                json!({"description": "Refused: `kind` says why (invalid 400, unauthenticated 401, forbidden 403, not-found 404, conflict 409, unsatisfiable 422, internal 500, unavailable 503), `message` in words.",
                       "content": {"application/json": {"schema": error}}}),
            );
        }
        operation.insert("responses".into(), responses.into());
        let item = paths
            .entry(o.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(item) = item {
            item.insert(o.method.to_ascii_lowercase(), operation.into());
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tessera REST API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Manage a Tessera cluster: hosts, policies, volumes, snapshots, access, tokens; see its health, activity and history. Every route but this document and the dashboard needs a bearer token (`tessera token create`).",
        },
        "paths": paths,
        "components": {
            "schemas": generator.take_definitions(true),
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer", "description": "An API token, `tsn_...`."}},
        },
        "security": [{"token": []}],
    })
}

/// [`document`] as served: made once.
pub fn document_text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| document().to_string())
}
