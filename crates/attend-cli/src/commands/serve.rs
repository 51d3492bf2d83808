//! `attend serve`: sentence embeddings over HTTP (OpenAI's and
//! text-embeddings-inference's APIs), from the `attend-serve` crate.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use attend::Error;
use attend_serve::{shutdown_signal, ServeOptions, Server};

use crate::args::model::PrecisionArg;
use crate::io::model_dir;

/// Flags of `attend serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (config.json, model.safetensors, tokenizer.json); defaults to
    /// $ATTEND_MODEL_DIR, then ~/.cache/attend/all-minilm-l6-v2 (scripts/fetch-model).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// The name clients send as `model` (default: the directory's name).
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
    /// The address to listen on; loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// The port; 0 picks a free one (the start-up line names it).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Precision of the encoder's dense layers.
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    precision: PrecisionArg,
    /// Compute threads (default: the CPUs this process may use, from its cgroup
    /// quota and cpuset).
    #[arg(long, value_name = "N", value_parser = crate::args::flags::threads)]
    threads: Option<usize>,
    /// Tokens one forward pass holds at most, counted unpadded.
    #[arg(long, value_name = "N", default_value_t = 2_048)]
    max_batch_tokens: usize,
    /// Milliseconds the oldest queued text may wait for others to share its pass
    /// (0: a pass starts as soon as the engine is free).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    max_wait_ms: u64,
    /// Texts of one request one pass takes at most; a larger request is split
    /// across passes.
    #[arg(long, value_name = "N", default_value_t = 32)]
    max_client_batch_size: usize,
    /// Tokens queued at most; past it, requests get 429 with Retry-After. `auto`:
    /// five seconds of the engine's work at the rate measured at start (at most
    /// half of --request-timeout).
    #[arg(long, value_name = "N|auto", default_value = "auto", value_parser = queue_bound)]
    max_queue_tokens: QueueBound,
    /// Seconds before an unanswered request gets 503.
    #[arg(long, value_name = "S", default_value_t = 30)]
    request_timeout: u64,
    /// Seconds accepted requests have to finish after SIGTERM or SIGINT.
    #[arg(long, value_name = "S", default_value_t = 30)]
    drain_timeout: u64,
    /// Truncate texts over the model's maximum (as sentence-transformers does)
    /// unless a request says otherwise; `false` refuses them.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    auto_truncate: bool,
    /// Require `Authorization: Bearer KEY`; $ATTEND_API_KEY is read when this is
    /// not given (a key on the command line is visible to `ps`).
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// With a key: /health, /ready and /metrics need it too.
    #[arg(long)]
    protect_probes: bool,
    /// Allow cross-origin requests from ORIGIN (repeatable; `*` for any). Off by default.
    #[arg(long, value_name = "ORIGIN")]
    cors_allow_origin: Vec<String>,
    /// The largest request body in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 2 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Seconds a client has to send a request's head, and then its body.
    #[arg(long, value_name = "S", default_value_t = 10)]
    client_timeout: u64,
    /// Log lines on stderr as text or as JSON objects, one a line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Also log each request: method, route, status, failure reason, milliseconds.
    #[arg(long)]
    access_log: bool,
}

/// `--max-queue-tokens`: a count of tokens, or `auto` (`None`).
#[derive(Clone, Copy, Debug)]
struct QueueBound(Option<usize>);

fn queue_bound(value: &str) -> Result<QueueBound, String> {
    if value == "auto" {
        return Ok(QueueBound(None));
    }
    match value.parse::<usize>() {
        Ok(0) | Err(_) => Err(format!(
            "expected a positive number of tokens or `auto`, got {value:?}"
        )),
        Ok(n) => Ok(QueueBound(Some(n))),
    }
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// `2026-11-27T13:40:00.123Z  INFO attend_serve: …`.
    Text,
    /// `{"timestamp": …, "level": "INFO", "fields": {"message": …}, …}`.
    Json,
}

/// Log lines on stderr in `format`; requests only with `access_log`.
fn init_logging(format: LogFormat, access_log: bool) {
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    // Levels order by verbosity: INFO and everything more severe.
    let keep = filter_fn(move |meta| {
        *meta.level() <= tracing::Level::INFO
            && (access_log || meta.target() != "attend_serve::access")
    });
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let layer = match format {
        LogFormat::Text => layer.with_ansi(false).with_filter(keep).boxed(),
        LogFormat::Json => layer.json().with_filter(keep).boxed(),
    };
    // A second subscriber (tests that call run twice) keeps the first.
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// Runs `attend serve` until SIGTERM or SIGINT, then drains and returns.
pub fn run(args: Args) -> Result<(), Error> {
    args.precision.announce();
    let options = ServeOptions {
        model: model_dir::resolve(args.model)?,
        served_model_name: args.served_model_name,
        host: args.host,
        port: args.port,
        precision: args.precision.into(),
        threads: args.threads,
        max_batch_tokens: args.max_batch_tokens,
        max_wait: Duration::from_millis(args.max_wait_ms),
        max_client_batch_size: args.max_client_batch_size,
        max_queue_tokens: args.max_queue_tokens.0,
        request_timeout: Duration::from_secs(args.request_timeout),
        drain_timeout: Duration::from_secs(args.drain_timeout),
        auto_truncate: args.auto_truncate,
        api_key: args
            .api_key
            .or_else(|| std::env::var("ATTEND_API_KEY").ok()),
        protect_probes: args.protect_probes,
        cors_allow_origins: args.cors_allow_origin,
        max_body_bytes: args.max_body_bytes,
        max_header_bytes: 16 * 1024,
        client_timeout: Duration::from_secs(args.client_timeout),
    };
    let server = Server::bind(options).map_err(|e| Error::value(e.to_string()))?;
    init_logging(args.log_format, args.access_log);
    server
        .run(|startup| tracing::info!("{startup}"), async {
            shutdown_signal().await;
            tracing::info!("draining: accepted requests finish, new ones are refused");
        })
        .map_err(|e| Error::value(e.to_string()))?;
    tracing::info!("stopped");
    Ok(())
}
