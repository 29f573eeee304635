//! The REST API: [`ClusterControl`] over HTTP with JSON bodies.
//!
//! Owns: routes, status codes and the JSON error shape. Must not touch:
//! cluster logic; every handler is one call on [`ClusterControl`].

use crate::control::{ClusterControl, ControlError};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use std::sync::Arc;

type Control = Arc<dyn ClusterControl>;

/// The API's routes over `control`.
pub fn router(control: Control) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .with_state(control)
}

async fn status(State(control): State<Control>) -> Response {
    respond(control.status().await)
}

fn respond<T: serde::Serialize>(result: Result<T, ControlError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(e) => {
            let code = match &e {
                ControlError::NotFound(_) => StatusCode::NOT_FOUND,
                ControlError::Conflict(_) => StatusCode::CONFLICT,
                ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
                ControlError::Unsatisfiable(_) => StatusCode::UNPROCESSABLE_ENTITY,
                ControlError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                ControlError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (code, Json(e)).into_response()
        }
    }
}
