//! The web dashboard: static files, compiled into the binary, that the API
//! serves at `/ui/` (and `/` sends there), and the API's OpenAPI document
//! ([`crate::openapi`]), the other answer that needs no token.
//!
//! Owns: the files (`dashboard/index.html`, `app.js`, `style.css`) and the
//! headers they are served with. Must not touch: the cluster; the page
//! reads only the public REST API, with a token the user signs in with.
//!
//! Invariants: the files hold no data, so they are served without a token;
//! every answer carries a content security policy that lets the page load
//! only itself and talk only to this API (no CDN, no inline script), and
//! must be revalidated (a new binary's files are seen at once).

use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

/// Where the dashboard is.
pub const PATH: &str = "/ui/";

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const STYLE_CSS: &str = include_str!("dashboard/style.css");

/// What the page may load and where it may connect: itself only. Canvas
/// charts and the empty icon need `data:` images; nothing else does.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The dashboard's routes; they need no token.
pub fn router() -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to(PATH) }))
        .route("/ui", get(|| async { Redirect::to(PATH) }))
        .route(
            PATH,
            get(|| async { file("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { file("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/style.css",
            get(|| async { file("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route(
            crate::openapi::PATH,
            get(|| async { file("application/json", crate::openapi::document_text()) }),
        )
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}
