//! What a server is told: the model, where to listen, and the limits that keep
//! it responsive under load.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use attend_core::attention::Precision;

/// Everything `attend serve` takes. [`Default`] gives the command's defaults
/// except the model directory, which the caller names.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// A sentence-transformers checkpoint directory.
    pub model: PathBuf,
    /// The name clients send as `model` (OpenAI) and `/info` reports; by default
    /// the directory's last component.
    pub served_model_name: Option<String>,
    /// The address to listen on (loopback unless told otherwise).
    pub host: IpAddr,
    /// The port; 0 picks a free one (the bound address is reported).
    pub port: u16,
    /// The encoder's dense products in f32, bf16 or int8.
    pub precision: Precision,
    /// Compute threads; `None` sizes them from the CPUs this process may use
    /// (its cgroup quota and cpuset, [`crate::cpus`]).
    pub threads: Option<usize>,
    /// Tokens one forward pass holds at most, counted unpadded (the sum of the
    /// texts' lengths).
    pub max_batch_tokens: usize,
    /// How long the scheduler holds the oldest queued text for more to join its
    /// pass while the pass is below its budget; zero starts a pass as soon as the
    /// engine is free.
    pub max_wait: Duration,
    /// Texts one request may carry into a single pass; a larger request is split
    /// across passes, not refused.
    pub max_client_batch_size: usize,
    /// Tokens waiting in the queue at most; a request that would pass it is
    /// answered 429 with `Retry-After`. `None` makes it [`crate::rate::QUEUE_WORK`]
    /// of the engine's work at the rate measured at start ([`crate::rate`]).
    pub max_queue_tokens: Option<usize>,
    /// A request not answered by then gets 503.
    pub request_timeout: Duration,
    /// After SIGTERM or SIGINT, how long accepted requests have to finish.
    pub drain_timeout: Duration,
    /// Texts over the model's maximum are truncated (sentence-transformers'
    /// behaviour) unless a request says otherwise; `false` refuses them.
    pub auto_truncate: bool,
    /// A Bearer token every request must carry.
    pub api_key: Option<String>,
    /// Whether `/health`, `/ready` and `/metrics` also need the key.
    pub protect_probes: bool,
    /// Origins allowed by CORS; empty means no CORS headers at all.
    pub cors_allow_origins: Vec<String>,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// The largest request head (request line and headers), in bytes.
    pub max_header_bytes: usize,
    /// How long a client has to send a request's head, and then its body: a
    /// client that trickles bytes is cut off.
    pub client_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            model: PathBuf::new(),
            served_model_name: None,
            host: IpAddr::from([127, 0, 0, 1]),
            port: 8080,
            precision: Precision::F32,
            threads: None,
            max_batch_tokens: 2_048,
            max_wait: Duration::ZERO,
            max_client_batch_size: 32,
            max_queue_tokens: None,
            request_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            auto_truncate: true,
            api_key: None,
            protect_probes: false,
            cors_allow_origins: Vec::new(),
            max_body_bytes: 2 * 1024 * 1024,
            max_header_bytes: 16 * 1024,
            client_timeout: Duration::from_secs(10),
        }
    }
}
