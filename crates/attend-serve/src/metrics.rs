//! The Prometheus metrics of one server, in a registry of its own (two servers in
//! one process, as in the tests, keep theirs apart). Every family exists from the
//! start, and the failure reasons are counted from zero, so the first scrape
//! already shows every series a dashboard or an alert names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::queue::Depth;

/// A request's route and the status it was answered with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route (`/v1/embeddings`, `/embed`, …; `other` for unknown paths).
    pub route: String,
    /// The HTTP status.
    pub status: u16,
}

/// Why a request failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// One of [`Failure::ALL`]'s names.
    pub reason: String,
}

/// The reasons a request fails, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Malformed or invalid input (400, 404, 413, 415, 422).
    Validation,
    /// A missing or wrong API key (401).
    Unauthorized,
    /// The queue was full (429).
    Overloaded,
    /// Not answered within the request timeout (503).
    Timeout,
    /// Not ready: loading or draining (503).
    Unavailable,
    /// The engine failed (424).
    Model,
}

impl Failure {
    /// Every reason, for the zero series at start.
    pub const ALL: [Failure; 6] = [
        Failure::Validation,
        Failure::Unauthorized,
        Failure::Overloaded,
        Failure::Timeout,
        Failure::Unavailable,
        Failure::Model,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Failure::Validation => "validation",
            Failure::Unauthorized => "unauthorized",
            Failure::Overloaded => "overloaded",
            Failure::Timeout => "timeout",
            Failure::Unavailable => "unavailable",
            Failure::Model => "model",
        }
    }
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    failures: Family<FailureLabels, Counter>,
    queue_requests: Gauge,
    queue_tokens: Gauge,
    /// Tokens per forward pass (unpadded).
    pub batch_tokens: Histogram,
    /// Texts per forward pass.
    pub batch_texts: Histogram,
    /// Time to tokenise one request.
    pub tokenization_seconds: Histogram,
    /// Time from admission to a request's first pass.
    pub queue_seconds: Histogram,
    /// Time of each forward pass.
    pub inference_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every family registered, failure reasons at zero.
    pub fn new() -> Self {
        let seconds = || Histogram::new(exponential_buckets(0.000_125, 2.0, 18));
        let m = Metrics {
            registry: Registry::with_prefix("attend"),
            requests: Family::default(),
            failures: Family::default(),
            queue_requests: Gauge::default(),
            queue_tokens: Gauge::default(),
            batch_tokens: Histogram::new(exponential_buckets(8.0, 2.0, 14)),
            batch_texts: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            tokenization_seconds: seconds(),
            queue_seconds: seconds(),
            inference_seconds: seconds(),
        };
        for f in Failure::ALL {
            let _ = m.failures.get_or_create(&FailureLabels {
                reason: f.name().into(),
            });
        }
        let mut registry = m.registry;
        registry.register(
            "requests",
            "Requests answered, by route and status",
            m.requests.clone(),
        );
        registry.register(
            "request_failures",
            "Requests that failed, by reason",
            m.failures.clone(),
        );
        registry.register(
            "queue_requests",
            "Requests admitted and not yet answered",
            m.queue_requests.clone(),
        );
        registry.register(
            "queue_tokens",
            "Tokens admitted and not yet computed",
            m.queue_tokens.clone(),
        );
        registry.register(
            "batch_tokens",
            "Tokens per forward pass (unpadded)",
            m.batch_tokens.clone(),
        );
        registry.register(
            "batch_texts",
            "Texts per forward pass",
            m.batch_texts.clone(),
        );
        registry.register(
            "tokenization_seconds",
            "Time to tokenise a request",
            m.tokenization_seconds.clone(),
        );
        registry.register(
            "queue_seconds",
            "Time from admission to a request's first forward pass",
            m.queue_seconds.clone(),
        );
        registry.register(
            "inference_seconds",
            "Time of a forward pass",
            m.inference_seconds.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Counts a request answered with `status` on `route`.
    pub fn answered(&self, route: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.into(),
                status,
            })
            .inc();
    }

    /// Counts a failure.
    pub fn failed(&self, reason: Failure) {
        self.failures
            .get_or_create(&FailureLabels {
                reason: reason.name().into(),
            })
            .inc();
    }

    /// The text exposition, with the queue's `depth` now.
    pub fn render(&self, depth: Depth) -> String {
        self.queue_requests.set(depth.requests as i64);
        self.queue_tokens.set(depth.tokens as i64);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
