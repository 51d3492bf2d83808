//! `attend embed`: sentence embeddings from a BERT-family model, of the sentences
//! on the command line (printed, or written to `--output`) or of a whole corpus
//! (`--input`, see [`corpus`]).

use std::path::{Path, PathBuf};

use attend::corpus::Record;
use attend::models::{Embeddings, SentenceEncoder};
use attend::Error;

use crate::args::model::PrecisionArg;
use crate::io::model_dir::{self, Format};
use crate::io::outputs::Outputs;

mod corpus;
mod format;

use crate::io::console::{errln, outln};
use format::EmbedFormat;

/// Flags of `attend embed`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory (config.json, model.safetensors, tokenizer.json); defaults to
    /// $ATTEND_MODEL_DIR, then ~/.cache/attend/all-minilm-l6-v2 (scripts/fetch-model).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Precision of the encoder's dense layers: `bf16` keeps their weights in bf16
    /// (half the model's memory) and multiplies bf16 numbers with f32 sums; `int8`
    /// quantizes their weights to int8 (a quarter) and each input row to bytes at
    /// run time, with i32 sums.
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
    /// Where the vectors go instead of standard output (required with --input):
    /// `.npy` (float32 [texts, dim]) or `.jsonl` (one object per text, in input
    /// order). Written in full or not at all.
    #[arg(long, value_name = "FILE")]
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
    args.precision.announce();
    if let (Some(input), Some(output)) = (&args.input, &args.output) {
        let job = corpus::Job {
            model: model_dir::resolve(args.model)?,
            precision: args.precision.into(),
            input: input.clone(),
            field: args.field,
            output: output.clone(),
            format: args.format,
            batch_size: args.batch_size,
            chunk_size: args.chunk_size,
        };
        return corpus::run(job);
    }
    if let Some(output) = &args.output {
        return sentences_to_file(&args, output);
    }
    let format = match args.format {
        None | Some(EmbedFormat::Text) => Format::Text,
        Some(EmbedFormat::Json) => Format::Json,
        Some(other) => {
            return Err(Error::value(format!(
                "--format {} is for --output (sentences may go to a file too); printed sentences are text or json",
                other.name()
            )))
        }
    };
    let out = embed(&args)?;
    match format {
        Format::Json => {
            outln!(
                "{{\"embeddings\":{}}}",
                model_dir::json_matrix(out.vectors.rows())
            )?;
        }
        Format::Text => {
            for row in out.vectors.rows() {
                let line: Vec<String> = row.iter().map(|x| x.to_string()).collect();
                outln!("{}", line.join(" "))?;
            }
        }
    }
    Ok(())
}

/// The sentences' embeddings, warnings printed.
fn embed(args: &Args) -> Result<Embeddings, Error> {
    let encoder = SentenceEncoder::load_with(
        model_dir::resolve(args.model.clone())?,
        args.precision.into(),
    )?;
    let texts: Vec<&str> = args.sentences.iter().map(String::as_str).collect();
    let out = encoder.embed(&texts)?;
    for w in &out.warnings {
        errln!("warning: {w}");
    }
    Ok(out)
}

/// `attend embed --output FILE SENTENCE…`: the sentences' vectors written as a
/// corpus's are, one record per sentence.
fn sentences_to_file(args: &Args, output: &Path) -> Result<(), Error> {
    let format = corpus::output_format(args.format, output)?;
    let outputs = Outputs::new(&[("--output", Some(output))])?;
    let out = embed(args)?;
    let records: Vec<Record> = (1..)
        .zip(&args.sentences)
        .map(|(line, text)| Record {
            line,
            text: text.clone(),
            object: None,
        })
        .collect();
    outputs.write("--output", |temp| {
        corpus::write_file(format, temp, out.vectors.ncols(), |sink| {
            sink.write_chunk(&records, out.vectors.view())
        })
    })?;
    outputs.commit()
}
