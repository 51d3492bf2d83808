//! Every way a request can fail, and how each API says it: OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` on `/v1/*`, text-embeddings-
//! inference's `{"error", "error_type"}` elsewhere. Every error is JSON.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::metrics::Failure;
use crate::prepare::Invalid;

/// Which API's error shape a response takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// OpenAI's, for `/v1/*`.
    OpenAi,
    /// text-embeddings-inference's, for everything else.
    Tei,
}

impl Shape {
    /// The shape of the API `path` belongs to.
    pub fn of_path(path: &str) -> Self {
        if path.starts_with("/v1/") {
            Shape::OpenAi
        } else {
            Shape::Tei
        }
    }
}

/// A failed request.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// The body is not JSON (400).
    Syntax(String),
    /// The body is JSON of the wrong form (OpenAI 400, TEI 422).
    Schema(String),
    /// A `Content-Type` other than JSON (415).
    ContentType,
    /// A body over the limit (413).
    BodyTooLarge(usize),
    /// The body did not arrive in time (408).
    BodyTimeout,
    /// The inputs were refused (400 for none, else 422; OpenAI 400).
    Invalid(Invalid),
    /// A parameter out of range (OpenAI 400, TEI 422).
    Parameter {
        /// The parameter's name.
        param: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// OpenAI's `model` names another model (404 `model_not_found`).
    ModelNotFound(String),
    /// A missing or wrong API key (401).
    Unauthorized,
    /// The queue is full (429, `Retry-After`).
    Overloaded {
        /// Tokens queued.
        queued: usize,
        /// The bound.
        limit: usize,
    },
    /// Not answered within the request timeout (503).
    Timeout(u64),
    /// Loading or draining (503).
    Unavailable(&'static str),
    /// The engine failed (TEI 424, OpenAI 500).
    Engine(String),
    /// No such route (404).
    NoRoute(String),
    /// A route without this method (405).
    Method,
}

impl Problem {
    /// The status code.
    pub fn status(&self, shape: Shape) -> StatusCode {
        match self {
            Problem::Syntax(_) => StatusCode::BAD_REQUEST,
            Problem::Schema(_) | Problem::Parameter { .. } => match shape {
                Shape::OpenAi => StatusCode::BAD_REQUEST,
                Shape::Tei => StatusCode::UNPROCESSABLE_ENTITY,
            },
            Problem::ContentType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Problem::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Problem::Invalid(Invalid::Empty) => StatusCode::BAD_REQUEST,
            Problem::Invalid(Invalid::Stopped) => StatusCode::SERVICE_UNAVAILABLE,
            Problem::Invalid(_) => match shape {
                Shape::OpenAi => StatusCode::BAD_REQUEST,
                Shape::Tei => StatusCode::UNPROCESSABLE_ENTITY,
            },
            Problem::ModelNotFound(_) | Problem::NoRoute(_) => StatusCode::NOT_FOUND,
            Problem::Unauthorized => StatusCode::UNAUTHORIZED,
            Problem::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            Problem::Timeout(_) | Problem::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Problem::Engine(_) => match shape {
                Shape::OpenAi => StatusCode::INTERNAL_SERVER_ERROR,
                Shape::Tei => StatusCode::FAILED_DEPENDENCY,
            },
            Problem::Method => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The reason counted in the metrics.
    pub fn failure(&self) -> Failure {
        match self {
            Problem::Unauthorized => Failure::Unauthorized,
            Problem::Overloaded { .. } => Failure::Overloaded,
            Problem::Timeout(_) => Failure::Timeout,
            Problem::Unavailable(_) | Problem::Invalid(Invalid::Stopped) => Failure::Unavailable,
            Problem::Engine(_) => Failure::Model,
            _ => Failure::Validation,
        }
    }

    /// The message, one line.
    pub fn message(&self) -> String {
        match self {
            Problem::Syntax(e) => format!("the body is not valid JSON: {e}"),
            Problem::Schema(e) => format!("the body does not fit the request's schema: {e}"),
            Problem::ContentType => "the body must be JSON (Content-Type: application/json)".into(),
            Problem::BodyTooLarge(limit) => {
                format!("the body is larger than the limit of {limit} bytes")
            }
            Problem::BodyTimeout => "the body did not arrive in time".into(),
            Problem::Invalid(i) => i.to_string(),
            Problem::Parameter { param, message } => format!("{param}: {message}"),
            Problem::ModelNotFound(m) => {
                format!("The model `{m}` does not exist or you do not have access to it.")
            }
            Problem::Unauthorized => {
                "missing or wrong API key: send it as `Authorization: Bearer <key>`".into()
            }
            Problem::Overloaded { queued, limit } => format!(
                "the server is overloaded: {queued} tokens queued of at most {limit}; retry later"
            ),
            Problem::Timeout(secs) => {
                format!("the request was not answered within the server's timeout of {secs} s")
            }
            Problem::Unavailable(why) => format!("the server is not ready: {why}"),
            Problem::Engine(e) => format!("the model failed: {e}"),
            Problem::NoRoute(p) => format!("no route {p}"),
            Problem::Method => "this route does not take that method".into(),
        }
    }

    /// The parameter at fault, for OpenAI's `param`.
    fn param(&self) -> Option<&'static str> {
        match self {
            Problem::Invalid(Invalid::UnknownPrompt { .. }) => Some("prompt_name"),
            Problem::Invalid(_) => Some("input"),
            Problem::Parameter { param, .. } => Some(param),
            Problem::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    /// OpenAI's `type` and `code`.
    fn openai_kind(&self) -> (&'static str, Option<&'static str>) {
        match self {
            Problem::ModelNotFound(_) => ("invalid_request_error", Some("model_not_found")),
            Problem::Unauthorized => ("invalid_request_error", Some("invalid_api_key")),
            Problem::Overloaded { .. } => ("rate_limit_error", Some("rate_limit_exceeded")),
            Problem::Invalid(Invalid::TooLong { .. }) => {
                ("invalid_request_error", Some("context_length_exceeded"))
            }
            Problem::Timeout(_) | Problem::Unavailable(_) | Problem::Engine(_) => {
                ("server_error", None)
            }
            Problem::Invalid(Invalid::Stopped) => ("server_error", None),
            _ => ("invalid_request_error", None),
        }
    }

    /// TEI's `error_type`.
    fn tei_kind(&self) -> &'static str {
        match self {
            Problem::Invalid(Invalid::Empty) => "Empty",
            Problem::Invalid(Invalid::Tokenizer(_)) => "Tokenizer",
            Problem::Invalid(Invalid::Stopped) | Problem::Timeout(_) | Problem::Unavailable(_) => {
                "Unhealthy"
            }
            Problem::Overloaded { .. } => "Overloaded",
            Problem::Engine(_) => "Backend",
            Problem::Unauthorized => "Unauthorized",
            Problem::NoRoute(_) | Problem::Method => "NotFound",
            _ => "Validation",
        }
    }

    /// The response in `shape`.
    pub fn respond(&self, shape: Shape) -> Response {
        let body = match shape {
            Shape::OpenAi => {
                let (kind, code) = self.openai_kind();
                json!({"error": {
                    "message": self.message(),
                    "type": kind,
                    "param": self.param(),
                    "code": code,
                }})
            }
            Shape::Tei => json!({"error": self.message(), "error_type": self.tei_kind()}),
        };
        let mut response = (self.status(shape), axum::Json(body)).into_response();
        if let Problem::Overloaded { .. } = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Problem::Unauthorized = self {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response.extensions_mut().insert(self.failure());
        response
    }
}
