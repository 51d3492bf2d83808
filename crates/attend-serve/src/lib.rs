//! `attend serve`: sentence embeddings over HTTP.
//!
//! A server speaks OpenAI's embeddings API (`POST /v1/embeddings`, `GET
//! /v1/models`) and text-embeddings-inference's (`POST /embed`, `/embed_all`,
//! `/tokenize`, `GET /info`), with `/health`, `/ready` and `/metrics` for the
//! machinery around it. Behind the routes:
//!
//! * [`prepare`]: inputs tokenised on worker threads of their own (short ones
//!   on the HTTP thread);
//! * [`queue`]: one entry per text, bounded in tokens (past the bound, 429);
//!   each pass takes the texts in the order they came, within
//!   `--max-batch-tokens` tokens counted unpadded;
//! * [`rate`]: the engine's speed measured at start, which sizes the queue's
//!   bound when none is given;
//! * [`scheduler`]: one thread taking those passes and running them through the
//!   engine ([`attend_models::models::Engine`], the same
//!   call `attend embed` and the Python package make) on the compute threads;
//! * [`http`]: routes, error shapes, the API key, CORS, metrics per request;
//! * [`Server`]: binding, per-connection limits, graceful drain on SIGTERM.
//!
//! ```no_run
//! use attend_serve::{Server, ServeOptions};
//!
//! let server = Server::bind(ServeOptions {
//!     model: "/path/to/all-minilm-l6-v2".into(),
//!     port: 0,
//!     ..ServeOptions::default()
//! })?;
//! server.run(|s| eprintln!("{s}"), attend_serve::shutdown_signal())?;
//! # Ok::<(), attend_serve::ServeError>(())
//! ```

pub mod cpus;
pub mod http;
pub mod metrics;
mod options;
pub mod prepare;
pub mod queue;
pub mod rate;
pub mod scheduler;
mod server;
pub mod service;
mod workers;

pub use options::ServeOptions;
pub use server::{shutdown_signal, ServeError, Server, Startup};
