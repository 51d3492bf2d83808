//! `attend embed`: sentence embeddings from a BERT-family model.

use std::path::PathBuf;

use attend::models::SentenceEncoder;

use crate::model_dir::{self, Format};

/// Flags of `attend embed`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (config.json, model.safetensors, tokenizer.json); defaults to
    /// $ATTEND_MODEL_DIR, then ~/.cache/attend/all-minilm-l6-v2 (scripts/fetch-model).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// `text`: one line of numbers per sentence; `json`: {"embeddings": [[...], ...]}.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// The sentences, embedded together in one padded batch.
    #[arg(required = true, value_name = "SENTENCE")]
    sentences: Vec<String>,
}

/// Runs `attend embed`.
pub fn run(args: Args) -> Result<(), attend::Error> {
    let encoder = SentenceEncoder::load(model_dir::resolve(args.model))?;
    let texts: Vec<&str> = args.sentences.iter().map(String::as_str).collect();
    let out = encoder.embed(&texts)?;
    for w in &out.warnings {
        eprintln!("warning: {w}");
    }
    match args.format {
        Format::Json => {
            println!(
                "{{\"embeddings\":{}}}",
                model_dir::json_matrix(out.vectors.rows())
            );
        }
        Format::Text => {
            for row in out.vectors.rows() {
                let line: Vec<String> = row.iter().map(|x| x.to_string()).collect();
                println!("{}", line.join(" "));
            }
        }
    }
    Ok(())
}
