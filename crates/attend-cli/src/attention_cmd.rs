//! `attend attention`: one head's attention weights for a sentence, from a real model.

use std::path::PathBuf;

use attend::models::SentenceEncoder;

use crate::model_dir::{self, Format};

/// Flags of `attend attention`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (config.json, model.safetensors, tokenizer.json); defaults to
    /// $ATTEND_MODEL_DIR, then ~/.cache/attend/all-minilm-l6-v2 (scripts/fetch-model).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Layer, counted from 0.
    #[arg(long)]
    layer: usize,
    /// Head within the layer, counted from 0.
    #[arg(long)]
    head: usize,
    /// `text`: a table of weights (row = query token); `json`: {"tokens": [...], "weights": [[...]]}.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// The sentence.
    sentence: String,
}

/// Runs `attend attention`.
pub fn run(args: Args) -> Result<(), attend::Error> {
    let encoder = SentenceEncoder::load(model_dir::resolve(args.model))?;
    let trace = encoder.trace(&args.sentence)?;
    for w in &trace.warnings {
        eprintln!("warning: {w}");
    }
    let weights = trace.weights(args.layer, args.head)?;
    match args.format {
        Format::Json => {
            println!(
                "{{\"layer\":{},\"head\":{},\"tokens\":{},\"weights\":{}}}",
                args.layer,
                args.head,
                serde_json::to_string(&trace.tokens).expect("strings serialise"),
                model_dir::json_matrix(weights.rows())
            );
        }
        Format::Text => {
            println!(
                "layer {} head {}: row = query token, column = key token; each row sums to 1",
                args.layer, args.head
            );
            let width = trace
                .tokens
                .iter()
                .map(|t| t.chars().count())
                .max()
                .unwrap_or(0)
                .max(6);
            let mut header = format!("{:width$}", "");
            for t in &trace.tokens {
                header.push_str(&format!(" {t:>width$}"));
            }
            println!("{header}");
            for (t, row) in trace.tokens.iter().zip(weights.rows()) {
                let mut line = format!("{t:<width$}");
                for w in row {
                    line.push_str(&format!(" {w:>width$.4}"));
                }
                println!("{line}");
            }
        }
    }
    Ok(())
}
