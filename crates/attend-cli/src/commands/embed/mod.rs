//! `attend embed`: sentence embeddings from a BERT-family model, of the sentences
//! on the command line or of a whole corpus (`--input`, see [`corpus`]).

use std::path::PathBuf;

use attend::models::SentenceEncoder;
use attend::Error;

use crate::args::model::PrecisionArg;
use crate::io::model_dir::{self, Format};

mod corpus;
mod format;

use format::EmbedFormat;

/// Flags of `attend embed`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (config.json, model.safetensors, tokenizer.json); defaults to
    /// $ATTEND_MODEL_DIR, then ~/.cache/attend/all-minilm-l6-v2 (scripts/fetch-model).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Precision of the encoder's dense layers: `bf16` keeps their weights in bf16
    /// (half the model's memory) and multiplies bf16 numbers with f32 sums.
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    precision: PrecisionArg,
    /// Sentences: `text` (one line of numbers per sentence) or `json`
    /// ({"embeddings": [[...], ...]}). With --output: `npy` or `jsonl` (default: the
    /// output's extension).
    #[arg(long, value_enum)]
    format: Option<EmbedFormat>,
    /// The sentences, embedded together in one padded batch.
    #[arg(
        required_unless_present = "input",
        conflicts_with = "input",
        value_name = "SENTENCE"
    )]
    sentences: Vec<String>,
    /// A corpus to embed, one text per line (or, with --field, one JSON object per
    /// line); `-` reads standard input.
    #[arg(long, value_name = "FILE|-", requires = "output")]
    input: Option<PathBuf>,
    /// With --input: each line is a JSON object and its text is in this field.
    #[arg(long, value_name = "NAME", requires = "input")]
    field: Option<String>,
    /// With --input: where the vectors go, `.npy` (float32 [texts, dim]) or `.jsonl`
    /// (one object per text, in input order). Written in full or not at all.
    #[arg(long, value_name = "FILE", requires = "input")]
    output: Option<PathBuf>,
    /// With --input: texts per forward pass (texts of similar length share one).
    #[arg(long, value_name = "N", default_value_t = 32, requires = "input")]
    batch_size: usize,
    /// With --input: texts read and sorted at once; memory is bounded by this, not
    /// by the corpus.
    #[arg(long, value_name = "N", default_value_t = 4096, requires = "input")]
    chunk_size: usize,
}

/// Runs `attend embed`.
pub fn run(args: Args) -> Result<(), Error> {
    if let (Some(input), Some(output)) = (args.input, args.output) {
        let job = corpus::Job {
            model: model_dir::resolve(args.model),
            precision: args.precision.into(),
            input,
            field: args.field,
            output,
            format: args.format,
            batch_size: args.batch_size,
            chunk_size: args.chunk_size,
        };
        return corpus::run(job);
    }
    let format = match args.format {
        None | Some(EmbedFormat::Text) => Format::Text,
        Some(EmbedFormat::Json) => Format::Json,
        Some(other) => {
            return Err(Error::value(format!(
                "--format {} is for --input/--output; sentences print as text or json",
                other.name()
            )))
        }
    };
    let encoder =
        SentenceEncoder::load_with(model_dir::resolve(args.model), args.precision.into())?;
    let texts: Vec<&str> = args.sentences.iter().map(String::as_str).collect();
    let out = encoder.embed(&texts)?;
    for w in &out.warnings {
        eprintln!("warning: {w}");
    }
    match format {
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
