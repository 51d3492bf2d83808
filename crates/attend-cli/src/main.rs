//! The `attend` command-line tool.
//!
//! Every subcommand lives in its own module; errors print as one line on stderr
//! and exit with code 2, like clap's own usage errors.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod explain;
mod view;

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
    /// Look at attention weights: terminal heatmap, SVG/PNG picture, or HTML view.
    View(view::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Explain(args) => explain::run(args),
        Command::View(args) => view::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}
