//! What a request handler calls: inputs in, vectors out, through the
//! tokenization workers, the queue and the scheduler, with a time limit. It
//! knows nothing of HTTP; the routes map its outcomes onto each API.

use std::sync::Arc;
use std::time::Duration;

use ndarray::Array2;

use crate::metrics::Metrics;
use crate::prepare::{Input, Invalid, Preparation, Tokenization};
use crate::queue::{Queue, Refusal, Want};

/// A request's vectors and what producing them took.
#[derive(Debug)]
pub struct Embedded {
    /// One array per input: `[1, dimension]` or `[tokens, hidden]`.
    pub vectors: Vec<Array2<f32>>,
    /// Tokens computed (after truncation).
    pub tokens: usize,
    /// Characters of the texts.
    pub characters: usize,
    /// Time spent tokenising.
    pub tokenization: Duration,
    /// Time spent queued.
    pub queue: Duration,
    /// Time spent in forward passes.
    pub inference: Duration,
}

/// Why a request got no vectors.
#[derive(Debug)]
pub enum Failed {
    /// Its inputs were refused.
    Invalid(Invalid),
    /// The queue refused it.
    Refused(Refusal),
    /// It was not answered within the timeout, in seconds.
    Timeout(u64),
    /// The engine failed.
    Engine(String),
}

/// The loaded model's pipeline.
pub struct Service {
    /// The tokenization workers.
    pub tokenization: Tokenization,
    /// The queue the scheduler works off.
    pub queue: Arc<Queue>,
    /// How long a request may take.
    pub request_timeout: Duration,
    /// The server's metrics.
    pub metrics: Arc<Metrics>,
}

impl Service {
    /// The vectors `want` asks for of `inputs`.
    pub async fn embed(
        &self,
        inputs: Vec<Input>,
        how: Preparation,
        want: Want,
    ) -> Result<Embedded, Failed> {
        let run = async {
            let prepared = self
                .tokenization
                .prepare(inputs, how)
                .await
                .map_err(Failed::Invalid)?;
            self.metrics
                .tokenization_seconds
                .observe(prepared.took.as_secs_f64());
            let answer = self
                .queue
                .submit(want, prepared.texts)
                .map_err(Failed::Refused)?
                .await
                .map_err(|_| Failed::Engine("the scheduler stopped".into()))?
                .map_err(Failed::Engine)?;
            Ok(Embedded {
                vectors: answer.vectors,
                tokens: prepared.tokens,
                characters: prepared.characters,
                tokenization: prepared.took,
                queue: answer.queue,
                inference: answer.inference,
            })
        };
        // Dropping `run` at the deadline drops the queue's receiver with it, so
        // the scheduler skips the request's texts still waiting.
        tokio::time::timeout(self.request_timeout, run)
            .await
            .unwrap_or(Err(Failed::Timeout(self.request_timeout.as_secs())))
    }
}
