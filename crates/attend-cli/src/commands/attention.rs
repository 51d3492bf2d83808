//! `attend attention`: one head's attention weights for a sentence, from a real model.

use std::path::PathBuf;

use attend::models::SentenceEncoder;
use attend::viz::AttentionMaps;

use crate::io::console::{errln, outln};
use crate::io::model_dir::{self, Format};
use crate::io::outputs::Outputs;

/// Flags of `attend attention`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (config.json, model.safetensors, tokenizer.json); defaults to
    /// $ATTEND_MODEL_DIR, then ~/.cache/attend/all-minilm-l6-v2 (scripts/fetch-model).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Layer, counted from 0.
    #[arg(long, required_unless_present = "all")]
    layer: Option<usize>,
    /// Head within the layer, counted from 0.
    #[arg(long, required_unless_present = "all")]
    head: Option<usize>,
    /// Print every layer and head as attention-maps JSON instead
    /// (`attend view --input-json FILE --html page.html` draws it).
    #[arg(long, conflicts_with_all = ["layer", "head", "format"])]
    all: bool,
    /// `text`: a table of weights (row = query token); `json`: {"tokens": [...], "weights": [[...]]}.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Also write that layer's heads as a picture: FILE.svg or FILE.png (with --all:
    /// layer 0, or --layer).
    #[arg(long, value_name = "FILE")]
    heatmap: Option<PathBuf>,
    /// The sentence.
    sentence: String,
}

/// Runs `attend attention`.
pub fn run(args: Args) -> Result<(), attend::Error> {
    let outputs = Outputs::new(&[("--heatmap", args.heatmap.as_deref())])?;
    let dir = model_dir::resolve(args.model)?;
    let encoder = SentenceEncoder::load(&dir)?;
    let trace = encoder.trace(&args.sentence)?;
    for w in &trace.warnings {
        errln!("warning: {w}");
    }
    let (layer, head) = (args.layer.unwrap_or(0), args.head.unwrap_or(0));
    // Checked before anything is written: a bad --head must not leave a picture.
    let weights = trace.weights(layer, head)?;
    let title = format!("{} — {}", attend::models::model_name(&dir), args.sentence);
    outputs.write("--heatmap", |path| {
        attend::viz::write_heatmap(&AttentionMaps::of_trace(&trace, &title)?, layer, path)
    })?;
    outputs.commit()?;
    if args.all {
        outln!("{}", AttentionMaps::of_trace(&trace, &title)?.to_json())?;
        return Ok(());
    }
    match args.format {
        Format::Json => {
            outln!(
                "{{\"layer\":{},\"head\":{},\"tokens\":{},\"weights\":{}}}",
                layer,
                head,
                serde_json::to_string(&trace.tokens).expect("strings serialise"),
                model_dir::json_matrix(weights.rows())
            )?;
        }
        Format::Text => {
            outln!(
                "layer {} head {}: row = query token, column = key token; each row sums to 1",
                layer,
                head
            )?;
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
            outln!("{header}")?;
            for (t, row) in trace.tokens.iter().zip(weights.rows()) {
                let mut line = format!("{t:<width$}");
                for w in row {
                    line.push_str(&format!(" {w:>width$.4}"));
                }
                outln!("{line}")?;
            }
        }
    }
    Ok(())
}
