//! text-embeddings-inference's API: `POST /embed`, `/embed_all` and `/tokenize`,
//! as its clients (LangChain's and LlamaIndex's TEI classes, `huggingface_hub`'s
//! `InferenceClient`) call them.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::body::read_json;
use super::errors::{Problem, Shape};
use super::inputs::{check_dimensions, finish_rows, Inputs};
use super::{timing_headers, AppState};
use crate::prepare::Preparation;
use crate::queue::Want;
use attend_models::models::tokenize::Truncation;

/// Which end of an over-long text is cut.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
enum Direction {
    /// Keep the first tokens.
    #[default]
    #[serde(alias = "right")]
    Right,
    /// Keep the last tokens.
    #[serde(alias = "left")]
    Left,
}

/// The fields `/embed` and `/embed_all` share.
#[derive(Debug, Deserialize)]
struct Common {
    inputs: Inputs,
    truncate: Option<bool>,
    #[serde(default)]
    truncation_direction: Direction,
    prompt_name: Option<String>,
}

impl Common {
    fn preparation(&self, auto_truncate: bool) -> Preparation {
        Preparation {
            truncation: match (
                self.truncate.unwrap_or(auto_truncate),
                self.truncation_direction,
            ) {
                (false, _) => Truncation::Off,
                (true, Direction::Right) => Truncation::Right,
                (true, Direction::Left) => Truncation::Left,
            },
            prompt_name: self.prompt_name.clone(),
        }
    }
}

/// The body of `POST /embed`.
#[derive(Debug, Deserialize)]
struct EmbedRequest {
    #[serde(flatten)]
    common: Common,
    #[serde(default = "yes")]
    normalize: bool,
    dimensions: Option<usize>,
}

fn yes() -> bool {
    true
}

/// The body of `POST /tokenize`.
#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    inputs: Texts,
    #[serde(default = "yes")]
    add_special_tokens: bool,
    prompt_name: Option<String>,
}

/// A text or texts.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
enum Texts {
    One(String),
    Many(Vec<String>),
}

/// `POST /embed`: one sentence vector per input.
pub async fn embed(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    answer(embed_vectors(&state, &headers, body).await)
}

/// `POST /embed_all`: every token's vector of each input.
pub async fn embed_all(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(token_vectors(&state, &headers, body).await)
}

/// `POST /tokenize`: each input's tokens with their ids and offsets.
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(pieces(&state, &headers, body).await)
}

fn answer(result: Result<Response, Problem>) -> Response {
    result.unwrap_or_else(|p| p.respond(Shape::Tei))
}

async fn embed_vectors(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let started = Instant::now();
    let limits = &state.limits;
    let request: EmbedRequest =
        read_json(headers, body, limits.max_body_bytes, limits.body_timeout).await?;
    let model = state.model()?;
    check_dimensions(request.dimensions, model.dimension)?;
    let how = request.common.preparation(limits.auto_truncate);
    // normalize: false skips the model's own Normalize module; true normalises
    // even a model without one (TEI's meaning of the flag).
    let want = if request.normalize || !model.normalizes {
        Want::Sentence
    } else {
        Want::Unnormalized
    };
    let mut done = state
        .service()?
        .embed(request.common.inputs.into_inputs(), how, want)
        .await?;
    let truncated = request.dimensions.is_some_and(|k| k < model.dimension);
    let renormalise = request.normalize && (truncated || !model.normalizes);
    let rows = finish_rows(
        std::mem::take(&mut done.vectors),
        request.dimensions,
        renormalise,
    );
    let mut response = Json(rows).into_response();
    timing_headers(&mut response, &done, started);
    Ok(response)
}

async fn token_vectors(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let started = Instant::now();
    let limits = &state.limits;
    let request: Common =
        read_json(headers, body, limits.max_body_bytes, limits.body_timeout).await?;
    let how = request.preparation(limits.auto_truncate);
    let mut done = state
        .service()?
        .embed(request.inputs.into_inputs(), how, Want::Tokens)
        .await?;
    let tokens: Vec<Vec<Vec<f32>>> = std::mem::take(&mut done.vectors)
        .into_iter()
        .map(|t| t.rows().into_iter().map(|r| r.to_vec()).collect())
        .collect();
    let mut response = Json(tokens).into_response();
    timing_headers(&mut response, &done, started);
    Ok(response)
}

async fn pieces(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Response, Problem> {
    let limits = &state.limits;
    let request: TokenizeRequest =
        read_json(headers, body, limits.max_body_bytes, limits.body_timeout).await?;
    let texts = match request.inputs {
        Texts::One(t) => vec![t],
        Texts::Many(ts) => ts,
    };
    let all = state
        .service()?
        .tokenization
        .pieces(texts, request.add_special_tokens, request.prompt_name)
        .await
        .map_err(Problem::Invalid)?;
    let body: Vec<Vec<serde_json::Value>> = all
        .into_iter()
        .map(|pieces| {
            pieces
                .into_iter()
                .map(|p| {
                    json!({
                        "id": p.id,
                        "text": p.text,
                        "special": p.special,
                        "start": if p.special { None } else { Some(p.span.start) },
                        "stop": if p.special { None } else { Some(p.span.end) },
                    })
                })
                .collect()
        })
        .collect();
    Ok(Json(body).into_response())
}
