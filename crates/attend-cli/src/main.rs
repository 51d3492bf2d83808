//! The `attend` command-line tool.
//!
//! Every subcommand lives in its own module; errors print as one line on stderr
//! and exit with code 2, like clap's own usage errors.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};

mod args;
mod commands;
mod io;

use commands::{attention, bench, embed, explain, sdpa, serve, train, view};

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
    /// Scaled dot-product attention on .npy files (PyTorch SDPA's shapes).
    Sdpa(sdpa::Args),
    /// Time the fused attention forward, or forward + backward (pairs with scripts/bench/py/torch_sdpa.py).
    Bench(bench::Args),
    /// Sentence embeddings from a BERT-family model (e.g. all-MiniLM-L6-v2), of sentences or a whole corpus (--input).
    Embed(embed::Args),
    /// One head's attention weights for a sentence, from a BERT-family model.
    Attention(attention::Args),
    /// Train a small attention model to reverse digit sequences.
    Train(train::Args),
    /// Serve sentence embeddings over HTTP: OpenAI's /v1/embeddings and text-embeddings-inference's /embed.
    Serve(serve::Args),
}

fn main() -> ExitCode {
    attend::memory::keep_freed_memory();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err)
            if matches!(
                err.kind(),
                ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            let names: Vec<String> = Cli::command()
                .get_subcommands()
                .map(|c| c.get_name().to_owned())
                .filter(|n| n != "help")
                .collect();
            eprintln!(
                "error: attend needs a subcommand: {} (attend --help describes them)",
                names.join(", ")
            );
            return ExitCode::from(2);
        }
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
    // An instruction-set cap the kernels would ignore is refused up front.
    if let Err(err) = attend::kernels::Isa::env_cap() {
        eprintln!("error: {err}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Explain(args) => explain::run(args),
        Command::View(args) => view::run(args),
        Command::Sdpa(args) => sdpa::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Embed(args) => embed::run(args),
        Command::Attention(args) => attention::run(args),
        Command::Train(args) => train::run(args),
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}
