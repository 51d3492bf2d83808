//! The `attend` command-line tool.
//!
//! Every subcommand lives in its own module; errors print as one line on stderr
//! and exit with code 2, like clap's own usage errors.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod explain;
mod sdpa;

/// Self-attention, faithful to PyTorch and fast on CPU.
#[derive(Parser)]
#[command(name = "attend", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Walk through one attention computation step by step, as the notebooks do.
    Explain(explain::Args),
    /// Scaled dot-product attention on .npy files (PyTorch SDPA's shapes).
    Sdpa(sdpa::Args),
    /// Time the fused attention forward (pairs with shared/bench/torch_sdpa.py).
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Explain(args) => explain::run(args),
        Command::Sdpa(args) => sdpa::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}
