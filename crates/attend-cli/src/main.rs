//! The `attend` command-line tool.
//!
//! Every subcommand lives in its own module; errors print as one line on stderr
//! and exit with code 2, like clap's own usage errors.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench_decode;
mod explain;
mod json_input;

/// Self-attention, faithful to PyTorch and fast on CPU.
#[derive(Parser)]
#[command(name = "attend", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Walk through one attention computation step by step, as the notebooks do.
    Explain(explain::Args),
    /// Time decoding (`attend bench --decode` once the bench command lands).
    #[command(hide = true)]
    BenchDecode(bench_decode::DecodeArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if err.use_stderr() => {
            // clap's first paragraph names the problem; the usage block after it
            // is noise for a one-line error.
            let text = err.render().to_string();
            let problem: Vec<&str> = text
                .lines()
                .take_while(|l| !l.is_empty())
                .map(str::trim)
                .collect();
            eprintln!("{}", problem.join(" "));
            return ExitCode::from(2);
        }
        Err(err) => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
    };
    let result = match cli.command {
        Command::Explain(args) => explain::run(args),
        Command::BenchDecode(args) => bench_decode::run(&args).map(|record| println!("{record}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}
