//! Request bodies read within a size limit and a time limit, then parsed as
//! JSON, every failure a [`Problem`] (so every error answer is JSON, a malformed
//! body's included).

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use http_body_util::{BodyExt, Limited};
use serde::de::DeserializeOwned;

use super::errors::Problem;

/// Reads `body` (at most `limit` bytes, within `timeout`) and parses it as `T`.
pub async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<T, Problem> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| {
            let m = m.trim().to_ascii_lowercase();
            m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
        });
    if !json {
        return Err(Problem::ContentType);
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Problem::BodyTooLarge(limit));
    }
    let bytes = match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Err(_) => return Err(Problem::BodyTimeout),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(Problem::BodyTooLarge(limit))
        }
        Ok(Err(e)) => return Err(Problem::Syntax(format!("the body could not be read: {e}"))),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => Problem::Schema(e.to_string()),
            _ => Problem::Syntax(e.to_string()),
        }
    })
}
