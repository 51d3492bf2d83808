//! What operators and load balancers poll: `/health` (the process answers, never
//! behind inference: it reads no queue and takes no lock the scheduler holds),
//! `/ready` (false while loading and draining), `/metrics` and `/info`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::errors::{Problem, Shape};
use super::AppState;
use crate::queue::Depth;

/// `GET /health`: 200 while the process serves at all.
pub async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// `GET /ready`: 200 once the model is loaded, 503 before and while draining.
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let (status, why) = if state.draining.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading")
    };
    (status, Json(json!({"status": why}))).into_response()
}

/// `GET /metrics`: Prometheus' text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let depth = state
        .service
        .get()
        .map_or(Depth::default(), |s| s.queue.depth());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(depth),
    )
        .into_response()
}

/// `GET /info`: the model and the server's limits, in TEI's fields.
pub async fn info(State(state): State<Arc<AppState>>) -> Response {
    let Ok(model) = state.model() else {
        return Problem::Unavailable("the model is loading").respond(Shape::Tei);
    };
    Json(json!({
        "model_id": state.limits.model_name,
        "model_sha": null,
        "model_dtype": model.dtype,
        "model_type": {"embedding": {"pooling": model.pooling}},
        "dimension": model.dimension,
        "hidden_size": model.hidden_size,
        "max_input_length": model.max_input_length,
        "max_batch_tokens": model.max_batch_tokens,
        "max_batch_requests": null,
        "max_client_batch_size": model.max_client_batch_size,
        "max_queue_tokens": model.max_queue_tokens,
        "auto_truncate": state.limits.auto_truncate,
        "tokenization_workers": model.tokenization_workers,
        "version": env!("CARGO_PKG_VERSION"),
    }))
    .into_response()
}
