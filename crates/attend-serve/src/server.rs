//! The server's life: bind, serve the probes while the model loads, serve
//! everything once it has, and on a shutdown signal stop accepting, let the
//! accepted requests finish within the drain timeout, and stop.
//!
//! Connections are served by hyper directly (not `axum::serve`) so that each
//! gets a time limit on its request head and a limit on its size: a client
//! trickling a byte a second holds nothing but its own socket and a timer.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use attend_core::attention::Precision;
use attend_core::kernels::Isa;
use attend_models::models::{model_name, SentenceEncoder};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cpus::{self, Cpus};
use crate::http::{router, AppState, Limits, ModelInfo};
use crate::metrics::Metrics;
use crate::options::ServeOptions;
use crate::prepare::Tokenization;
use crate::queue::{Batching, Queue};
use crate::rate;
use crate::scheduler;
use crate::service::Service;

/// Why a server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The model directory is missing something, or did not load.
    #[error("{0}")]
    Model(String),
    /// The address could not be bound (taken, or not this machine's).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// An option out of range.
    #[error("{0}")]
    Options(String),
    /// The runtime or a thread could not start.
    #[error("{0}")]
    Runtime(String),
}

/// What a running server serves, for its start-up line.
#[derive(Clone, Debug)]
pub struct Startup {
    /// The name clients use.
    pub model_name: String,
    /// Where it was loaded from.
    pub model_dir: std::path::PathBuf,
    /// `f32` or `bf16`.
    pub precision: &'static str,
    /// The instruction set the kernels run on.
    pub isa: Isa,
    /// Compute threads.
    pub threads: usize,
    /// What sized them.
    pub threads_source: String,
    /// Tokenization workers.
    pub tokenization_workers: usize,
    /// The queue's bound in tokens.
    pub max_queue_tokens: usize,
    /// Where the bound came from: the flag, or the rate measured at start.
    pub queue_source: String,
    /// The address it listens on.
    pub address: SocketAddr,
}

impl std::fmt::Display for Startup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "serving {} ({}) in {} on {} with {} compute threads (from {}) and {} tokenization workers; queue of {} tokens ({}); listening on http://{}",
            self.model_name,
            self.model_dir.display(),
            self.precision,
            self.isa,
            self.threads,
            self.threads_source,
            self.tokenization_workers,
            self.max_queue_tokens,
            self.queue_source,
            self.address
        )
    }
}

/// A bound server, not yet serving.
pub struct Server {
    options: ServeOptions,
    listener: std::net::TcpListener,
    address: SocketAddr,
    cpus: Cpus,
}

impl Server {
    /// Checks the options and the model directory, and binds the address:
    /// everything that can fail before a request is served.
    pub fn bind(options: ServeOptions) -> Result<Server, ServeError> {
        check(&options)?;
        let cpus = match options.threads {
            Some(n) => Cpus {
                threads: n,
                source: "--threads".into(),
            },
            None => cpus::available(),
        };
        let addr = SocketAddr::new(options.host, options.port);
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|source| ServeError::Bind { addr, source })?;
        let address = listener
            .local_addr()
            .map_err(|source| ServeError::Bind { addr, source })?;
        Ok(Server {
            options,
            listener,
            address,
            cpus,
        })
    }

    /// The address bound (with the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Serves until `shutdown` completes, then drains. `on_ready` hears once the
    /// model has loaded and every route answers.
    pub fn run(
        self,
        on_ready: impl FnOnce(&Startup) + Send,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("attend-http")
            .enable_all()
            .build()
            .map_err(|e| ServeError::Runtime(format!("cannot start the HTTP runtime: {e}")))?;
        runtime.block_on(self.serve(on_ready, shutdown))
    }

    async fn serve(
        self,
        on_ready: impl FnOnce(&Startup) + Send,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let o = &self.options;
        let model_name = o
            .served_model_name
            .clone()
            .unwrap_or_else(|| model_name(&o.model));
        let state = Arc::new(AppState {
            service: OnceLock::new(),
            model: OnceLock::new(),
            ready: false.into(),
            draining: false.into(),
            metrics: Arc::new(Metrics::new()),
            limits: Limits {
                max_body_bytes: o.max_body_bytes,
                body_timeout: o.client_timeout,
                auto_truncate: o.auto_truncate,
                api_key: o.api_key.clone(),
                protect_probes: o.protect_probes,
                cors_allow_origins: o.cors_allow_origins.clone(),
                model_name: model_name.clone(),
            },
        });
        let listener = TcpListener::from_std(self.listener)
            .map_err(|e| ServeError::Runtime(format!("cannot listen: {e}")))?;
        let (stop, stopped) = watch::channel(false);
        let connections = Connections {
            header_timeout: o.client_timeout,
            max_header_bytes: o.max_header_bytes,
        };
        let acceptor = tokio::spawn(accept(
            listener,
            router(Arc::clone(&state)),
            connections,
            stopped,
        ));

        let loaded = load(o, self.cpus.threads, Arc::clone(&state.metrics)).await;
        let (service, info, scheduler) = match loaded {
            Ok(parts) => parts,
            Err(e) => {
                let _ = stop.send(true);
                let _ = acceptor.await;
                return Err(e);
            }
        };
        let queue = Arc::clone(&service.queue);
        let _ = state.service.set(service);
        let _ = state.model.set(info.clone());
        state.ready.store(true, Ordering::Release);
        on_ready(&Startup {
            model_name,
            model_dir: o.model.clone(),
            precision: precision_names(o.precision).0,
            isa: Isa::detect(),
            threads: self.cpus.threads,
            threads_source: self.cpus.source.clone(),
            tokenization_workers: info.tokenization_workers,
            max_queue_tokens: info.max_queue_tokens,
            queue_source: info.queue_source.clone(),
            address: self.address,
        });

        shutdown.await;
        state.draining.store(true, Ordering::Release);
        state.ready.store(false, Ordering::Release);
        let _ = stop.send(true);
        let graceful = acceptor
            .await
            .map_err(|e| ServeError::Runtime(format!("the accept loop failed: {e}")))?;
        // Accepted requests finish (their connections close after the answer);
        // past the drain timeout the rest are cut off.
        let _ = tokio::time::timeout(o.drain_timeout, graceful.shutdown()).await;
        queue.close();
        let _ = tokio::task::spawn_blocking(move || scheduler.join()).await;
        Ok(())
    }
}

/// The server's checks of its options and model directory, before binding.
fn check(o: &ServeOptions) -> Result<(), ServeError> {
    if !o.model.is_dir() {
        return Err(ServeError::Model(format!(
            "{}: model directory not found (scripts/fetch-model fetches all-MiniLM-L6-v2; --model names another)",
            o.model.display()
        )));
    }
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        if !o.model.join(file).is_file() {
            return Err(ServeError::Model(format!(
                "{}: the model directory has no {file}",
                o.model.display()
            )));
        }
    }
    let positive = [
        ("--max-batch-tokens", o.max_batch_tokens),
        ("--max-client-batch-size", o.max_client_batch_size),
        ("--max-body-bytes", o.max_body_bytes),
    ];
    if let Some((flag, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(ServeError::Options(format!("{flag} must be at least 1")));
    }
    for (flag, value) in [
        ("--threads", o.threads),
        ("--max-queue-tokens", o.max_queue_tokens),
    ] {
        if value == Some(0) {
            return Err(ServeError::Options(format!("{flag} must be at least 1")));
        }
    }
    if o.api_key.as_deref().is_some_and(str::is_empty) {
        return Err(ServeError::Options("--api-key must not be empty".into()));
    }
    Ok(())
}

/// Loads the model on the compute threads and starts the pipeline.
async fn load(
    o: &ServeOptions,
    threads: usize,
    metrics: Arc<Metrics>,
) -> Result<(Service, ModelInfo, std::thread::JoinHandle<()>), ServeError> {
    let compute =
        attend_core::threads::pool(threads).map_err(|e| ServeError::Options(e.to_string()))?;
    let (dir, precision) = (o.model.clone(), o.precision);
    let pool = Arc::clone(&compute);
    let encoder = tokio::task::spawn_blocking(move || {
        pool.install(|| SentenceEncoder::load_with(&dir, precision))
    })
    .await
    .map_err(|e| ServeError::Runtime(format!("loading the model failed: {e}")))?
    .map_err(|e| ServeError::Model(e.to_string()))?;
    let encoder = Arc::new(encoder);
    let workers = threads;
    let tokenization =
        Tokenization::new(Arc::clone(&encoder), &o.model, workers).map_err(ServeError::Model)?;
    let max_batch_tokens = o.max_batch_tokens.max(tokenization.max_tokens());
    let (max_queue_tokens, queue_source) = match o.max_queue_tokens {
        Some(n) => (n, "--max-queue-tokens".to_string()),
        None => {
            let (encoder, pool) = (Arc::clone(&encoder), Arc::clone(&compute));
            let rate = tokio::task::spawn_blocking(move || rate::measure(&encoder, &pool))
                .await
                .map_err(|e| ServeError::Runtime(format!("measuring the engine failed: {e}")))?
                .map_err(ServeError::Model)?;
            let bound = rate::queue_bound(rate, o.request_timeout, max_batch_tokens);
            let seconds = bound as f64 / rate;
            (
                bound,
                format!("{seconds:.1} s of work at the {rate:.0} tokens/s measured at start"),
            )
        }
    };
    let info = ModelInfo {
        dimension: encoder.dimension(),
        hidden_size: encoder.model.config.hidden_size,
        normalizes: encoder.normalizes(),
        max_input_length: tokenization.max_tokens(),
        dtype: precision_names(precision).1,
        pooling: encoder
            .modules
            .pooling
            .iter()
            .map(|p| format!("{p:?}").to_lowercase())
            .collect::<Vec<_>>()
            .join("+"),
        max_batch_tokens,
        max_client_batch_size: o.max_client_batch_size,
        tokenization_workers: workers,
        max_queue_tokens,
        queue_source,
    };
    let queue = Arc::new(Queue::new(max_queue_tokens));
    let scheduler = scheduler::spawn(
        Arc::clone(&queue),
        encoder,
        compute,
        Batching {
            max_batch_tokens,
            max_client_batch_size: o.max_client_batch_size,
            max_wait: o.max_wait,
        },
        Arc::clone(&metrics),
    )
    .map_err(|e| ServeError::Runtime(format!("cannot start the scheduler: {e}")))?;
    let service = Service {
        tokenization,
        queue,
        request_timeout: o.request_timeout,
        metrics,
    };
    Ok((service, info, scheduler))
}

/// `--precision`'s name of `p`, and the dtype `/info` reports for it.
fn precision_names(p: Precision) -> (&'static str, &'static str) {
    match p {
        Precision::F32 => ("f32", "float32"),
        Precision::Bf16 => ("bf16", "bfloat16"),
        Precision::Int8 => ("int8", "int8"),
    }
}

/// How each connection is served.
#[derive(Clone, Copy)]
struct Connections {
    header_timeout: Duration,
    max_header_bytes: usize,
}

/// Accepts connections until `stop`, each served on a task of its own; returns
/// the watch over the open ones for the drain.
async fn accept(
    listener: TcpListener,
    router: Router,
    how: Connections,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown {
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let service = TowerToHyperService::new(router.clone());
                    let mut builder = http1::Builder::new();
                    builder
                        .timer(TokioTimer::new())
                        .header_read_timeout(how.header_timeout)
                        // hyper's smallest buffer is 8 KiB.
                        .max_buf_size(how.max_header_bytes.max(8192));
                    let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                }
                // Out of file descriptors, or a connection reset before it was
                // accepted: the listener itself is fine, so wait a moment and go on.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
    graceful
}

/// Completes on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
