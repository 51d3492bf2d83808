//! The HTTP layer: routes, request and response types, error shapes, the API
//! key, CORS and per-request metrics. It calls the [`Service`] and never reaches
//! into the scheduler or the kernels.

mod body;
mod errors;
mod inputs;
mod openai;
mod probes;
mod tei;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use subtle::ConstantTimeEq;
use tower_http::cors::{AllowOrigin, CorsLayer};

pub use errors::{Problem, Shape};

use crate::metrics::{Failure, Metrics};
use crate::service::{Embedded, Service};

/// What the routes share.
pub struct AppState {
    /// The pipeline, once the model has loaded.
    pub service: OnceLock<Service>,
    /// What `/info` and `/v1/models` report, once loaded.
    pub model: OnceLock<ModelInfo>,
    /// False while loading and while draining.
    pub ready: AtomicBool,
    /// Set once shutdown has begun.
    pub draining: AtomicBool,
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
    /// The limits requests are held to.
    pub limits: Limits,
}

/// The request limits and API options the routes apply.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The largest body.
    pub max_body_bytes: usize,
    /// How long a body may take to arrive.
    pub body_timeout: Duration,
    /// Whether over-long texts are truncated unless a request says otherwise.
    pub auto_truncate: bool,
    /// The Bearer token, if one is required.
    pub api_key: Option<String>,
    /// Whether the probes need the key too.
    pub protect_probes: bool,
    /// CORS origins; empty for none.
    pub cors_allow_origins: Vec<String>,
    /// The model's name as clients give it.
    pub model_name: String,
}

/// The served model, as `/info` describes it.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The width of the sentence vectors.
    pub dimension: usize,
    /// The width of the token vectors.
    pub hidden_size: usize,
    /// Whether the model normalises its sentence vectors itself.
    pub normalizes: bool,
    /// The most tokens of one text.
    pub max_input_length: usize,
    /// `float32` or `bfloat16`.
    pub dtype: &'static str,
    /// The pooling, as sentence-transformers names it.
    pub pooling: String,
    /// Tokens per pass at most.
    pub max_batch_tokens: usize,
    /// Texts of one request per pass at most.
    pub max_client_batch_size: usize,
    /// Tokenization workers.
    pub tokenization_workers: usize,
    /// Queue bound in tokens.
    pub max_queue_tokens: usize,
    /// Where the bound came from: the flag, or the rate measured at start.
    pub queue_source: String,
}

impl AppState {
    /// The pipeline, or 503 while it loads or after draining began.
    fn service(&self) -> Result<&Service, Problem> {
        if self.draining.load(Ordering::Acquire) {
            return Err(Problem::Unavailable("shutting down"));
        }
        self.service
            .get()
            .ok_or(Problem::Unavailable("the model is loading"))
    }

    fn model(&self) -> Result<&ModelInfo, Problem> {
        self.model
            .get()
            .ok_or(Problem::Unavailable("the model is loading"))
    }
}

/// Every route, with the API key, CORS and metrics layers.
pub fn router(state: Arc<AppState>) -> Router {
    let cors = cors(&state.limits.cors_allow_origins);
    let router = Router::new()
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/models", get(openai::models))
        .route("/embed", post(tei::embed))
        .route("/embed_all", post(tei::embed_all))
        .route("/tokenize", post(tei::tokenize))
        .route("/info", get(probes::info))
        .route("/health", get(probes::health))
        .route("/ready", get(probes::ready))
        .route("/metrics", get(probes::metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            authorize,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), count));
    let router = match cors {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router.with_state(state)
}

/// CORS for the given origins (`*` for any); none when the list is empty.
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION]),
    )
}

async fn no_route(request: Request) -> Response {
    let path = request.uri().path().to_owned();
    Problem::NoRoute(path.clone()).respond(Shape::of_path(&path))
}

async fn wrong_method(request: Request) -> Response {
    Problem::Method.respond(Shape::of_path(request.uri().path()))
}

/// The probes a load balancer polls, which need no key unless asked.
fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/ready" | "/metrics")
}

/// Refuses a request without the API key (compared in constant time).
async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let Some(key) = &state.limits.api_key else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    if is_probe(path) && !state.limits.protect_probes || request.method() == Method::OPTIONS {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    if bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
        next.run(request).await
    } else {
        Problem::Unauthorized.respond(Shape::of_path(path))
    }
}

/// Counts each answer by route and status, and each failure by reason, and
/// reports it as an event of the `attend_serve::access` target.
async fn count(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().clone();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    state.metrics.answered(&route, status);
    let failure = response.extensions().get::<Failure>().copied();
    if let Some(failure) = failure {
        state.metrics.failed(failure);
    }
    tracing::info!(
        target: "attend_serve::access",
        method = %method,
        route = %route,
        status,
        failure = failure.map(Failure::name),
        millis = started.elapsed().as_secs_f64() * 1e3,
        "request"
    );
    response
}

/// text-embeddings-inference's timing headers (milliseconds), on every answer
/// with vectors.
fn timing_headers(response: &mut Response, done: &Embedded, started: Instant) {
    let ms = |d: Duration| HeaderValue::from(d.as_millis() as u64);
    let h = response.headers_mut();
    let compute = done.tokenization + done.queue + done.inference;
    h.insert("x-compute-type", HeaderValue::from_static("cpu"));
    h.insert("x-compute-time", ms(compute));
    h.insert(
        "x-compute-characters",
        HeaderValue::from(done.characters as u64),
    );
    h.insert("x-compute-tokens", HeaderValue::from(done.tokens as u64));
    h.insert("x-total-time", ms(started.elapsed()));
    h.insert("x-tokenization-time", ms(done.tokenization));
    h.insert("x-queue-time", ms(done.queue));
    h.insert("x-inference-time", ms(done.inference));
}
