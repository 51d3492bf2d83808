//! `attend embed --input FILE|- --output FILE`: a whole corpus, streamed.
//!
//! The library does the work ([`attend::corpus`]); this module opens the files,
//! picks the output format, and writes through [`Outputs`] so that the output
//! appears only when every line has been embedded: a bad line leaves an existing
//! file as it was and no temporary file behind. A line keeps only the bytes the
//! model can read (a warning counts the lines cut), and a line with no end is
//! refused, so `--input /dev/zero` ends.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, IsTerminal};
use std::path::{Path, PathBuf};

use attend::corpus::{
    embed_corpus, CorpusOptions, InputFormat, JsonlWriter, OutputFormat, Summary, TextReader,
    VectorSink,
};
use attend::io::npy::RowWriter;
use attend::models::SentenceEncoder;
use attend::Error;

use super::format::EmbedFormat;
use crate::io::console::errln;
use crate::io::outputs::Outputs;
use crate::io::progress::ProgressBar;

/// One corpus run, from the flags.
pub struct Job {
    /// The model directory.
    pub model: PathBuf,
    /// `--precision`.
    pub precision: attend::attention::Precision,
    /// `--input` (`-` for standard input).
    pub input: PathBuf,
    /// `--field`.
    pub field: Option<String>,
    /// `--output`.
    pub output: PathBuf,
    /// `--format`, if given.
    pub format: Option<EmbedFormat>,
    /// `--batch-size`.
    pub batch_size: usize,
    /// `--chunk-size`.
    pub chunk_size: usize,
}

/// Embeds the corpus, writing the output all or nothing.
pub fn run(job: Job) -> Result<(), Error> {
    let format = output_format(job.format, &job.output)?;
    for (flag, n) in [
        ("--batch-size", job.batch_size),
        ("--chunk-size", job.chunk_size),
    ] {
        if n == 0 {
            return Err(Error::value(format!("{flag} must be at least 1")));
        }
    }
    let outputs = Outputs::new(&[("--output", Some(&job.output))])?;
    let (input, origin, size): (Box<dyn BufRead>, String, Option<u64>) =
        if job.input.as_os_str() == "-" {
            (Box::new(std::io::stdin().lock()), "<stdin>".into(), None)
        } else {
            let f = File::open(&job.input).map_err(|e| Error::io(&job.input, e))?;
            let size = f.metadata().ok().map(|m| m.len());
            let origin = job.input.display().to_string();
            (Box::new(BufReader::new(f)), origin, size)
        };
    let encoder = SentenceEncoder::load_with(&job.model, job.precision)?;
    let input_format = match job.field {
        Some(field) => InputFormat::Jsonl { field },
        None => InputFormat::Lines,
    };
    let mut reader = TextReader::new(input, input_format, origin)
        .with_max_text_bytes(encoder.tokenizer.max_text_bytes());
    let options = CorpusOptions {
        batch_size: job.batch_size,
        chunk_size: job.chunk_size,
    };
    let mut bar = std::io::stderr()
        .is_terminal()
        .then(|| ProgressBar::new(size));
    let mut summary = Summary::default();
    let written = outputs.write("--output", |temp| {
        summary = write_file(format, temp, encoder.dimension(), |sink| {
            embed_corpus(&encoder, &mut reader, sink, options, |p| {
                if let Some(bar) = bar.as_mut() {
                    bar.update(p);
                }
            })
        })?;
        Ok(())
    });
    if let (Err(_), Some(bar)) = (&written, &bar) {
        bar.clear(); // the error gets a line of its own
    }
    written?;
    outputs.commit()?;
    if let Some(bar) = bar {
        bar.finish(summary.texts, &job.output);
    }
    if let (cut, Some(line)) = reader.texts_cut() {
        errln!(
            "warning: {cut} line(s) were cut to their first {} bytes before tokenizing: the model reads at most {} tokens (the first: line {line})",
            encoder.tokenizer.max_text_bytes(),
            encoder.tokenizer.max_len()
        );
    }
    if let Some((line, tokens)) = summary.first_truncated {
        errln!(
            "warning: {} text(s) longer than the model's maximum of {} tokens were truncated, as sentence-transformers does (the first: line {line}, {tokens} tokens)",
            summary.truncated,
            encoder.tokenizer.max_len()
        );
    }
    Ok(())
}

/// Writes a new `format` file at `path` (`width` numbers a vector) with what `fill`
/// puts into its sink, and returns what `fill` returned.
pub fn write_file<T>(
    format: OutputFormat,
    path: &Path,
    width: usize,
    fill: impl FnOnce(&mut dyn VectorSink) -> Result<T, Error>,
) -> Result<T, Error> {
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let out = BufWriter::new(file);
    let origin = path.display().to_string();
    match format {
        OutputFormat::Npy => {
            let mut sink = RowWriter::new(out, width, origin)?;
            let filled = fill(&mut sink)?;
            flush(sink.finish()?, path)?;
            Ok(filled)
        }
        OutputFormat::Jsonl => {
            let mut sink = JsonlWriter::new(out, origin);
            let filled = fill(&mut sink)?;
            flush(sink.finish()?, path)?;
            Ok(filled)
        }
    }
}

/// `--format`, else the output's extension.
pub fn output_format(flag: Option<EmbedFormat>, output: &Path) -> Result<OutputFormat, Error> {
    match flag {
        Some(EmbedFormat::Npy) => Ok(OutputFormat::Npy),
        Some(EmbedFormat::Jsonl) => Ok(OutputFormat::Jsonl),
        Some(other) => Err(Error::value(format!(
            "--format {} is for sentences; --output takes npy or jsonl",
            other.name()
        ))),
        None => OutputFormat::from_extension(output).ok_or_else(|| {
            Error::value(format!(
                "--output {}: the extension says neither .npy nor .jsonl; name one or pass --format npy|jsonl",
                output.display()
            ))
        }),
    }
}

/// Flushes the buffered file (`Outputs::commit` syncs it to disk).
fn flush(out: BufWriter<File>, path: &Path) -> Result<(), Error> {
    out.into_inner()
        .map(drop)
        .map_err(|e| Error::io(path, e.into_error()))
}
