//! The REST API's HTTP mapping: routes, status codes, the JSON error shape
//! and refusal of malformed bodies, over the in-memory control plane of
//! `support` (the cluster logic itself is tested where it lives).

mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use support::MemoryControl;
use tessera_node::api;
use tessera_node::control::ClusterControl;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

/// Bound on any one test's wait for the server.
const TEST_WAIT: Duration = Duration::from_secs(10);

struct Answer {
    status: StatusCode,
    body: Value,
    raw: Vec<u8>,
}

/// Calls the API with the admin token.
async fn call(
    control: &Arc<MemoryControl>,
    method: Method,
    path: &str,
    body: Option<&str>,
) -> Answer {
    let token = control.admin_token().to_string();
    call_with(control, Some(&token), method, path, body).await
}

/// Calls the API presenting `token` (none: no `Authorization` header).
async fn call_with(
    control: &Arc<MemoryControl>,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<&str>,
) -> Answer {
    let control: Arc<dyn ClusterControl> = control.clone();
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .expect("request");
    let response = api::router(control)
        .oneshot(request)
        .await
        .expect("router answers");
    let status = response.status();
    let json = response
        .headers()
        .get("content-type")
        .is_none_or(|t| t.as_bytes().starts_with(b"application/json"));
    let raw = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body")
        .to_vec();
    let body = if raw.is_empty() {
        Value::Null
    } else if json {
        serde_json::from_slice(&raw).expect("every JSON answer parses")
    } else {
        // `/metrics`: the Prometheus text format.
        Value::String(String::from_utf8(raw.clone()).expect("text answers are UTF-8"))
    };
    Answer { status, body, raw }
}

fn assert_error(answer: &Answer, status: StatusCode, kind: &str, words: &str) {
    assert_eq!(answer.status, status, "body: {}", answer.body);
    assert_eq!(answer.body["kind"], kind, "body: {}", answer.body);
    let message = answer.body["message"].as_str().expect("message is text");
    assert!(
        message.contains(words),
        "message {message:?} should say {words:?}"
    );
    assert_eq!(
        answer.body.as_object().map(|o| o.len()),
        Some(2),
        "only kind and message"
    );
}

#[tokio::test]
async fn status_and_hosts_answer_with_their_views() {
    let control = Arc::new(MemoryControl::new());
    let status = call(&control, Method::GET, "/v1/status", None).await;
    assert_eq!(status.status, StatusCode::OK);
    assert_eq!(status.body["health"], "healthy");
    assert_eq!(status.body["hosts"].as_array().map(Vec::len), Some(4));
    assert!(status.body["capacity"]["total_bytes"].as_u64() > Some(0));

    let hosts = call(&control, Method::GET, "/v1/hosts", None).await;
    assert_eq!(hosts.status, StatusCode::OK);
    assert_eq!(hosts.body[1]["id"], "host-2");
    assert_eq!(hosts.body[1]["state"], "present");
}

#[tokio::test]
async fn policies_are_created_listed_and_refused_with_the_right_codes() {
    let control = Arc::new(MemoryControl::new());
    let created = call(
        &control,
        Method::POST,
        "/v1/policies",
        Some(r#"{"name": "gold", "failures_to_tolerate": 1, "stripe_width": 2}"#),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["name"], "gold");
    assert_eq!(created.body["stripe_width"], 2);
    assert_eq!(
        created.body["space_reservation_pct"], 0,
        "absent fields take their defaults"
    );

    let list = call(&control, Method::GET, "/v1/policies", None).await;
    let names: Vec<&str> = list
        .body
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["default", "gold"]);

    let duplicate = call(
        &control,
        Method::POST,
        "/v1/policies",
        Some(r#"{"name": "gold", "failures_to_tolerate": 0}"#),
    )
    .await;
    assert_error(
        &duplicate,
        StatusCode::CONFLICT,
        "conflict",
        "already exists",
    );

    let unsatisfiable = call(
        &control,
        Method::POST,
        "/v1/policies",
        Some(r#"{"name": "ftt2", "failures_to_tolerate": 2}"#),
    )
    .await;
    assert_error(
        &unsatisfiable,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unsatisfiable",
        "needs 5 fault domains",
    );

    let out_of_range = call(
        &control,
        Method::POST,
        "/v1/policies",
        Some(r#"{"name": "wide", "failures_to_tolerate": 1, "stripe_width": 13}"#),
    )
    .await;
    assert_error(
        &out_of_range,
        StatusCode::BAD_REQUEST,
        "invalid",
        "stripe width",
    );
    let list_after = call(&control, Method::GET, "/v1/policies", None).await;
    assert_eq!(
        list_after.body, list.body,
        "refused requests change nothing"
    );
}

#[tokio::test]
async fn malformed_bodies_are_refused_with_400_in_the_error_shape() {
    let control = Arc::new(MemoryControl::new());
    let cases = [
        ("/v1/policies", "{not json"),
        ("/v1/policies", r#"{"name": "x"}"#),
        (
            "/v1/policies",
            r#"{"name": "x", "failures_to_tolerate": "one"}"#,
        ),
        (
            "/v1/policies",
            r#"{"name": "x", "failures_to_tolerate": 300}"#,
        ),
        ("/v1/volumes", r#"{"name": "v", "size_bytes": -1}"#),
        ("/v1/volumes", "[]"),
        ("/v1/volumes/v/resize", r#"{"size": 4096}"#),
    ];
    for (path, body) in cases {
        let answer = call(&control, Method::POST, path, Some(body)).await;
        assert_error(
            &answer,
            StatusCode::BAD_REQUEST,
            "invalid",
            "malformed JSON request body",
        );
    }
    let empty = call(&control, Method::POST, "/v1/volumes", None).await;
    assert_error(&empty, StatusCode::BAD_REQUEST, "invalid", "empty");

    let volumes = call(&control, Method::GET, "/v1/volumes", None).await;
    assert_eq!(volumes.body, json!([]), "nothing was created");
}

#[tokio::test]
async fn unknown_fields_are_refused_by_name_and_change_nothing() {
    let control = Arc::new(MemoryControl::new());
    let cases = [
        (
            Method::POST,
            "/v1/volumes",
            r#"{"name":"x3","size_bytes":4096,"polcy":"gold"}"#,
            "polcy",
        ),
        (
            Method::POST,
            "/v1/policies",
            r#"{"name":"p","failures_to_tolerate":1,"stripe":2}"#,
            "stripe",
        ),
        (
            Method::PUT,
            "/v1/volumes/x3/access",
            r#"{"allowed_initiator":["iqn.2026-01.x:y"]}"#,
            "allowed_initiator",
        ),
        (
            Method::PATCH,
            "/v1/settings",
            r#"{"max_overcommit":2}"#,
            "max_overcommit",
        ),
        (Method::PATCH, "/v1/policies/default", r#"{"ftt":2}"#, "ftt"),
        (
            Method::POST,
            "/v1/volumes/vm/snapshots/s1/clones",
            r#"{"name":"copy","full":true,"ful":true}"#,
            "ful",
        ),
        (
            Method::POST,
            "/v1/hosts/host-2/faults",
            r#"{"kind":"fail-device","disk_group":"dg0","device":0,"now":true}"#,
            "now",
        ),
    ];
    for (method, path, body, field) in cases {
        let answer = call(&control, method.clone(), path, Some(body)).await;
        assert_error(
            &answer,
            StatusCode::BAD_REQUEST,
            "invalid",
            &format!("unknown field `{field}`"),
        );
    }
    let bad_query = call(&control, Method::DELETE, "/v1/volumes/x3?forse=true", None).await;
    assert_error(&bad_query, StatusCode::BAD_REQUEST, "invalid", "forse");
    let volumes = call(&control, Method::GET, "/v1/volumes", None).await;
    assert_eq!(volumes.body, json!([]), "nothing was created");
    let settings = call(&control, Method::GET, "/v1/settings", None).await;
    assert_eq!(settings.body["max_overcommit_ratio"], json!(4.0));
}

#[tokio::test]
async fn every_listed_resource_answers_get_on_its_own() {
    let control = Arc::new(MemoryControl::new());
    let created = call(
        &control,
        Method::POST,
        "/v1/volumes",
        Some(r#"{"name":"vm1","size_bytes":1048576}"#),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    for (path, key, value) in [
        ("/v1/volumes/vm1", "name", "vm1"),
        ("/v1/policies/default", "name", "default"),
        ("/v1/hosts/host-2", "id", "host-2"),
    ] {
        let answer = call(&control, Method::GET, path, None).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {}", answer.body);
        assert_eq!(answer.body[key], value, "{path}");
    }
    let health = call(&control, Method::GET, "/v1/health", None).await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.body["health"], "healthy");
    for path in ["/v1/volumes/nope", "/v1/policies/nope", "/v1/hosts/nope"] {
        let answer = call(&control, Method::GET, path, None).await;
        assert_error(&answer, StatusCode::NOT_FOUND, "not-found", "nope");
    }
}

#[tokio::test]
async fn volumes_are_created_resized_deleted_and_refused() {
    let control = Arc::new(MemoryControl::new());
    let created = call(
        &control,
        Method::POST,
        "/v1/volumes",
        Some(r#"{"name": "vol1", "size_bytes": 1073741824}"#),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["policy"], "default");
    assert_eq!(created.body["state"], "healthy");

    let unknown_policy = call(
        &control,
        Method::POST,
        "/v1/volumes",
        Some(r#"{"name": "vol2", "size_bytes": 4096, "policy": "platinum"}"#),
    )
    .await;
    assert_error(
        &unknown_policy,
        StatusCode::NOT_FOUND,
        "not-found",
        "platinum",
    );

    let duplicate = call(
        &control,
        Method::POST,
        "/v1/volumes",
        Some(r#"{"name": "vol1", "size_bytes": 4096}"#),
    )
    .await;
    assert_error(&duplicate, StatusCode::CONFLICT, "conflict", "vol1");

    let resized = call(
        &control,
        Method::POST,
        "/v1/volumes/vol1/resize",
        Some(r#"{"size_bytes": 2147483648}"#),
    )
    .await;
    assert_eq!(resized.status, StatusCode::OK, "{}", resized.body);
    assert_eq!(resized.body["size_bytes"], 2_147_483_648_u64);

    let shrink = call(
        &control,
        Method::POST,
        "/v1/volumes/vol1/resize",
        Some(r#"{"size_bytes": 4096}"#),
    )
    .await;
    assert_error(&shrink, StatusCode::BAD_REQUEST, "invalid", "not below");

    let missing = call(
        &control,
        Method::POST,
        "/v1/volumes/nope/resize",
        Some(r#"{"size_bytes": 4096}"#),
    )
    .await;
    assert_error(&missing, StatusCode::NOT_FOUND, "not-found", "nope");

    let deleted = call(&control, Method::DELETE, "/v1/volumes/vol1", None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert!(deleted.raw.is_empty());
    let again = call(&control, Method::DELETE, "/v1/volumes/vol1", None).await;
    assert_error(&again, StatusCode::NOT_FOUND, "not-found", "vol1");
}

#[tokio::test]
async fn objects_verify_and_resyncs_answer_with_their_views() {
    let control = Arc::new(MemoryControl::new());
    let created = call(
        &control,
        Method::POST,
        "/v1/volumes",
        Some(r#"{"name": "vol1", "size_bytes": 8192}"#),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);

    let object = call(&control, Method::GET, "/v1/objects/vol1", None).await;
    assert_eq!(object.status, StatusCode::OK);
    assert_eq!(object.body["components"].as_array().map(Vec::len), Some(3));
    assert_eq!(object.body["components"][2]["role"], "witness");

    let verify = call(&control, Method::POST, "/v1/objects/vol1/verify", None).await;
    assert_eq!(verify.status, StatusCode::OK);
    assert_eq!(verify.body["identical"], true);
    control.make_divergent("vol1");
    let verify = call(&control, Method::POST, "/v1/objects/vol1/verify", None).await;
    assert_eq!(
        verify.status,
        StatusCode::OK,
        "divergence is a finding, not a refusal"
    );
    assert_eq!(verify.body["identical"], false);
    assert_eq!(verify.body["divergences"][0]["component_offset"], 8192);

    let missing = call(&control, Method::GET, "/v1/objects/nope", None).await;
    assert_error(&missing, StatusCode::NOT_FOUND, "not-found", "nope");

    let resyncs = call(&control, Method::GET, "/v1/resyncs", None).await;
    assert_eq!(resyncs.status, StatusCode::OK);
    assert_eq!(resyncs.body, json!([]));
}

#[tokio::test]
async fn hosts_stop_and_start_with_conflicts_for_repeats() {
    let control = Arc::new(MemoryControl::new());
    let stopped = call(&control, Method::POST, "/v1/hosts/host-2/stop", None).await;
    assert_eq!(stopped.status, StatusCode::NO_CONTENT);
    let hosts = call(&control, Method::GET, "/v1/hosts", None).await;
    assert_eq!(hosts.body[1]["state"], "stopped");

    let twice = call(&control, Method::POST, "/v1/hosts/host-2/stop", None).await;
    assert_error(&twice, StatusCode::CONFLICT, "conflict", "already stopped");
    let unknown = call(&control, Method::POST, "/v1/hosts/host-9/start", None).await;
    assert_error(&unknown, StatusCode::NOT_FOUND, "not-found", "host-9");

    let started = call(&control, Method::POST, "/v1/hosts/host-2/start", None).await;
    assert_eq!(started.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn faults_are_refused_where_they_are_not_accepted_and_unknown_kinds_by_name() {
    let control = Arc::new(MemoryControl::new());
    let refused = call(
        &control,
        Method::POST,
        "/v1/hosts/host-2/faults",
        Some(r#"{"kind":"fail-device","disk_group":"dg0","device":0}"#),
    )
    .await;
    assert_error(
        &refused,
        StatusCode::BAD_REQUEST,
        "invalid",
        "does not accept fault injection",
    );
    let unknown = call(
        &control,
        Method::POST,
        "/v1/hosts/host-2/faults",
        Some(r#"{"kind":"melt-down"}"#),
    )
    .await;
    assert_error(
        &unknown,
        StatusCode::BAD_REQUEST,
        "invalid",
        "unknown variant `melt-down`",
    );
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_answer_in_the_error_shape() {
    let control = Arc::new(MemoryControl::new());
    let unknown = call(&control, Method::GET, "/v1/nothing", None).await;
    assert_error(
        &unknown,
        StatusCode::NOT_FOUND,
        "not-found",
        "GET /v1/nothing",
    );
    let wrong = call(&control, Method::DELETE, "/v1/status", None).await;
    assert_error(
        &wrong,
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid",
        "DELETE is not allowed on /v1/status",
    );
}

#[test]
fn every_refusal_kind_has_its_status_code() {
    use tessera_node::control::ControlError as E;
    let cases = [
        (E::NotFound(String::new()), 404),
        (E::Conflict(String::new()), 409),
        (E::Invalid(String::new()), 400),
        (E::Unsatisfiable(String::new()), 422),
        (E::Unavailable(String::new()), 503),
        (E::Internal(String::new()), 500),
        (E::Unauthenticated(String::new()), 401),
        (E::Forbidden(String::new()), 403),
    ];
    for (error, code) in cases {
        assert_eq!(api::status_code(&error).as_u16(), code, "{error:?}");
    }
}

#[tokio::test]
async fn serve_answers_over_tcp_and_stops_on_shutdown() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let memory = Arc::new(MemoryControl::new());
    let token = memory.admin_token().to_string();
    let control: Arc<dyn ClusterControl> = memory;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(api::serve(listener, control, async {
        let _ = stopped.await;
    }));

    let mut stream = tokio::time::timeout(TEST_WAIT, tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    stream
        .write_all(
            format!("GET /v1/hosts HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("send");
    let mut answer = Vec::new();
    tokio::time::timeout(TEST_WAIT, stream.read_to_end(&mut answer))
        .await
        .expect("answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"host-4\""), "{text}");

    stop.send(()).expect("server still running");
    tokio::time::timeout(TEST_WAIT, server)
        .await
        .expect("server stops in time")
        .expect("server task")
        .expect("serve returns Ok");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed after shutdown"
    );
}

/// Everything a caller could change, as one value to compare.
async fn everything(control: &Arc<MemoryControl>) -> Value {
    let mut all = serde_json::Map::new();
    for path in [
        "/v1/status",
        "/v1/settings",
        "/v1/policies",
        "/v1/volumes",
        "/v1/volumes/vol1/snapshots",
        "/v1/volumes/vol1/access",
        "/v1/tokens",
    ] {
        all.insert(
            path.into(),
            call(control, Method::GET, path, None).await.body,
        );
    }
    Value::Object(all)
}

/// A request for `route` of the route table: its `{x}` segments filled
/// with names that exist, and a body its handler would accept.
fn request_for(method: &str, pattern: &str) -> (Method, String, Option<&'static str>) {
    let path = pattern
        .replace("{id}", "host-2")
        .replace("{name}", "vol1")
        .replace("{snapshot}", "s1");
    let body = match (method, pattern) {
        ("POST", "/v1/volumes") => Some(r#"{"name":"vol2","size_bytes":1048576}"#),
        ("POST", "/v1/policies") => Some(r#"{"name":"p2","failures_to_tolerate":1}"#),
        ("POST", "/v1/tokens") => Some(r#"{"name":"more","role":"admin"}"#),
        ("POST", "/v1/volumes/{name}/snapshots") => Some(r#"{"name":"s2"}"#),
        ("PATCH", _) | ("PUT", _) | ("POST", _) => Some("{}"),
        _ => None,
    };
    (method.parse().expect("a method"), path, body)
}

#[tokio::test]
async fn every_route_refuses_a_caller_without_a_good_token_or_the_role_and_changes_nothing() {
    use tessera_node::api_access::ROUTES;
    use tessera_node::control::ApiRole;
    let control = Arc::new(MemoryControl::new());
    call(
        &control,
        Method::POST,
        "/v1/volumes",
        Some(r#"{"name":"vol1","size_bytes":1048576}"#),
    )
    .await;
    call(
        &control,
        Method::POST,
        "/v1/volumes/vol1/snapshots",
        Some(r#"{"name":"s1"}"#),
    )
    .await;
    let viewer = control.token(ApiRole::Viewer, None);
    let operator = control.token(ApiRole::Operator, None);
    let expiring = control.token(ApiRole::Admin, Some(60_000));
    let revoked = control.token(ApiRole::Admin, None);
    let revoked_id = revoked[4..20].to_string();
    let gone = call(
        &control,
        Method::DELETE,
        &format!("/v1/tokens/{revoked_id}"),
        None,
    )
    .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT, "{}", gone.body);
    control.advance_ms(60_000);
    let mut wrong = control.admin_token().to_string();
    let last = wrong.pop().expect("a character");
    wrong.push(if last == '0' { '1' } else { '0' });
    let before = everything(&control).await;
    let audited = control.audit(usize::MAX).await.unwrap().len();
    let mut refused_changes = 0;

    for &(method, pattern, needed) in ROUTES {
        let changes = method != "GET";
        let (m, path, body) = request_for(method, pattern);
        for (who, token) in [
            ("no token", None),
            ("an empty token", Some("")),
            ("a wrong secret", Some(wrong.as_str())),
            ("an expired token", Some(expiring.as_str())),
            ("a revoked token", Some(revoked.as_str())),
            ("not a token", Some("letmein")),
        ] {
            let answer = call_with(&control, token, m.clone(), &path, body).await;
            assert_eq!(
                answer.status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {who}: {}",
                answer.body
            );
            assert_eq!(answer.body["kind"], "unauthenticated");
            refused_changes += usize::from(changes);
        }
        for (role, token) in [(ApiRole::Viewer, &viewer), (ApiRole::Operator, &operator)] {
            if role.allows(needed) {
                continue;
            }
            let answer = call_with(&control, Some(token), m.clone(), &path, body).await;
            assert_eq!(
                answer.status,
                StatusCode::FORBIDDEN,
                "{method} {path} as {role}: {}",
                answer.body
            );
            assert_eq!(answer.body["kind"], "forbidden");
            refused_changes += usize::from(changes);
        }
    }
    assert_eq!(
        everything(&control).await,
        before,
        "a refused call changed something"
    );
    // Every refused change is in the audit log, and no read is.
    let log = control.audit(usize::MAX).await.unwrap();
    let refused = &log[audited..];
    assert_eq!(refused.len(), refused_changes);
    for entry in refused {
        assert_ne!(entry.method, "GET");
        match entry.status {
            401 => assert!(entry.token_id.is_none(), "{entry:?}"),
            403 => assert!(entry.role.is_some_and(|r| r != ApiRole::Admin), "{entry:?}"),
            other => panic!("a refused change answered {other}: {entry:?}"),
        }
    }

    // What a role may do, it is let do (the answer is the handler's own).
    for &(method, pattern, needed) in ROUTES {
        let (m, path, body) = request_for(method, pattern);
        for (role, token) in [(ApiRole::Viewer, &viewer), (ApiRole::Operator, &operator)] {
            if !role.allows(needed) {
                continue;
            }
            let answer = call_with(&control, Some(token), m.clone(), &path, body).await;
            assert!(
                answer.status != StatusCode::FORBIDDEN && answer.status != StatusCode::UNAUTHORIZED,
                "{method} {path} as {role}: {} {}",
                answer.status,
                answer.body
            );
        }
    }
}

#[tokio::test]
async fn an_admin_makes_lists_and_revokes_tokens_and_the_secret_is_shown_once() {
    let control = Arc::new(MemoryControl::new());
    let made = call(
        &control,
        Method::POST,
        "/v1/tokens",
        Some(r#"{"name":"backup","role":"viewer","expires_in_s":3600}"#),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let token = made.body["token"].as_str().expect("the token").to_string();
    let id = made.body["id"].as_str().expect("its id").to_string();
    assert_eq!(made.body["role"], "viewer");
    assert!(token.starts_with("tsn_") && token.contains(&id));
    let list = call(&control, Method::GET, "/v1/tokens", None).await;
    let text = list.body.to_string();
    assert!(text.contains(&id) && text.contains("backup"), "{text}");
    assert!(
        !text.contains(&token[21..]),
        "a list shows no secret: {text}"
    );
    let seen = call_with(&control, Some(&token), Method::GET, "/v1/volumes", None).await;
    assert_eq!(seen.status, StatusCode::OK);
    let bad = call(
        &control,
        Method::POST,
        "/v1/tokens",
        Some(r#"{"name":"x","role":"root"}"#),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    let revoked = call(&control, Method::DELETE, &format!("/v1/tokens/{id}"), None).await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT);
    let refused = call_with(&control, Some(&token), Method::GET, "/v1/volumes", None).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let again = call(&control, Method::DELETE, &format!("/v1/tokens/{id}"), None).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn every_change_through_the_api_is_in_the_audit_log_with_who_and_how_it_ended() {
    use tessera_node::control::ApiRole;
    let control = Arc::new(MemoryControl::new());
    let operator = control.token(ApiRole::Operator, None);
    let viewer = control.token(ApiRole::Viewer, None);
    // The same create twice: made, then refused as taken.
    for expected in [StatusCode::CREATED, StatusCode::CONFLICT] {
        let made = call_with(
            &control,
            Some(&operator),
            Method::POST,
            "/v1/volumes",
            Some(r#"{"name":"db","size_bytes":1048576}"#),
        )
        .await;
        assert_eq!(made.status, expected, "{}", made.body);
    }
    // A CHAP secret in a body is never kept.
    let access = call_with(
        &control,
        Some(&operator),
        Method::PUT,
        "/v1/volumes/db/access",
        Some(r#"{"initiator_chap":{"user":"alice","secret":"audit-secret-12"}}"#),
    )
    .await;
    assert_eq!(access.status, StatusCode::OK, "{}", access.body);
    let read = call_with(&control, Some(&operator), Method::GET, "/v1/volumes", None).await;
    assert_eq!(read.status, StatusCode::OK);

    let log = call(&control, Method::GET, "/v1/audit", None).await;
    assert_eq!(log.status, StatusCode::OK);
    assert!(
        !log.body.to_string().contains("audit-secret-12"),
        "{}",
        log.body
    );
    let entries = log.body.as_array().expect("a list").clone();
    let seen: Vec<(String, String, u64, String)> = entries
        .iter()
        .map(|e| {
            (
                e["method"].as_str().unwrap_or_default().to_string(),
                e["path"].as_str().unwrap_or_default().to_string(),
                e["status"].as_u64().unwrap_or_default(),
                e["role"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let operator_entry = |method: &str, path: &str, status: u64| {
        (
            method.to_string(),
            path.to_string(),
            status,
            "operator".to_string(),
        )
    };
    assert_eq!(
        seen,
        [
            operator_entry("POST", "/v1/volumes", 201),
            operator_entry("POST", "/v1/volumes", 409),
            operator_entry("PUT", "/v1/volumes/db/access", 200),
        ],
        "{}",
        log.body
    );
    assert_eq!(entries[0]["token_id"], operator[4..20]);
    assert!(entries[0]["at_ms"].as_u64().is_some_and(|t| t > 0));

    let latest = call(&control, Method::GET, "/v1/audit?limit=1", None).await;
    assert_eq!(latest.body.as_array().map(Vec::len), Some(1));
    assert_eq!(latest.body[0]["path"], "/v1/volumes/db/access");
    let bad = call(&control, Method::GET, "/v1/audit?limit=many", None).await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid", "limit=N");
    let hidden = call_with(&control, Some(&viewer), Method::GET, "/v1/audit", None).await;
    assert_eq!(hidden.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_activity_history_refuses_a_bad_query_and_names_the_one_it_takes() {
    let control = Arc::new(MemoryControl::new());
    let all = call(&control, Method::GET, "/v1/activity/history", None).await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(all.body["sample_interval_s"], 5);
    assert_eq!(all.body["capacity"], 720);
    let after = call(
        &control,
        Method::GET,
        "/v1/activity/history?after_ms=1",
        None,
    )
    .await;
    assert_eq!(after.status, StatusCode::OK);
    for bad in ["after_ms=soon", "since=1"] {
        let path = format!("/v1/activity/history?{bad}");
        let refused = call(&control, Method::GET, &path, None).await;
        assert_error(&refused, StatusCode::BAD_REQUEST, "invalid", "after_ms=N");
    }
}
