//! OpenAI's embeddings API: `POST /v1/embeddings` and `GET /v1/models`, as the
//! `openai` client and LangChain's and LlamaIndex's OpenAI classes call them.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::body::read_json;
use super::errors::{Problem, Shape};
use super::inputs::{check_dimensions, finish_rows, Inputs};
use super::{timing_headers, AppState};
use crate::prepare::Preparation;
use crate::queue::Want;
use attend_models::models::tokenize::Truncation;

/// The body of `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
struct EmbeddingsRequest {
    input: Inputs,
    model: Option<String>,
    #[serde(default)]
    encoding_format: EncodingFormat,
    dimensions: Option<usize>,
}

/// How the vectors are written.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum EncodingFormat {
    /// JSON numbers.
    #[default]
    Float,
    /// The float32 values' little-endian bytes in base64.
    Base64,
}

/// The answer of `POST /v1/embeddings` (typed, so that each `f32` is written in
/// its shortest form rather than widened to `f64`).
#[derive(Serialize)]
struct EmbeddingsResponse<'a> {
    object: &'static str,
    data: Vec<Embedding>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct Embedding {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match embed(&state, &headers, body).await {
        Ok(response) => response,
        Err(problem) => problem.respond(Shape::OpenAi),
    }
}

async fn embed(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Response, Problem> {
    let started = Instant::now();
    let limits = &state.limits;
    let request: EmbeddingsRequest =
        read_json(headers, body, limits.max_body_bytes, limits.body_timeout).await?;
    if let Some(m) = request.model.as_deref().filter(|m| *m != limits.model_name) {
        return Err(Problem::ModelNotFound(m.to_owned()));
    }
    let model = state.model()?;
    check_dimensions(request.dimensions, model.dimension)?;
    let how = Preparation {
        truncation: if limits.auto_truncate {
            Truncation::Right
        } else {
            Truncation::Off
        },
        prompt_name: None,
    };
    let mut done = state
        .service()?
        .embed(request.input.into_inputs(), how, Want::Sentence)
        .await?;
    let renormalise = request.dimensions.is_some_and(|k| k < model.dimension);
    let rows = finish_rows(
        std::mem::take(&mut done.vectors),
        request.dimensions,
        renormalise,
    );
    let data = rows
        .into_iter()
        .enumerate()
        .map(|(index, v)| Embedding {
            object: "embedding",
            index,
            embedding: match request.encoding_format {
                EncodingFormat::Float => Vector::Float(v),
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            },
        })
        .collect();
    let mut response = Json(EmbeddingsResponse {
        object: "list",
        data,
        model: &limits.model_name,
        usage: Usage {
            prompt_tokens: done.tokens,
            total_tokens: done.tokens,
        },
    })
    .into_response();
    timing_headers(&mut response, &done, started);
    Ok(response)
}

/// `GET /v1/models`.
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.limits.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "attend",
        }],
    }))
    .into_response()
}
