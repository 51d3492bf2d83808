//! The corpus loop with a [`SentenceEncoder`]: read a chunk, embed it in length
//! order, write it, repeat.

use std::io::BufRead;

use rayon::prelude::*;

use super::{embed_in_length_order, TextReader, VectorSink};
use crate::models::tokenize::Tokenized;
use crate::models::{SentenceEncoder, Sequence};
use attend_core::{Error, Result};

/// How a corpus is cut up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CorpusOptions {
    /// Texts per forward pass.
    pub batch_size: usize,
    /// Texts read, sorted and held at once: the bound on memory.
    pub chunk_size: usize,
}

impl Default for CorpusOptions {
    /// Batches of 32 (sentence-transformers' default) from chunks of 4096 texts:
    /// long enough for the length sort to group texts well, a few megabytes of
    /// text and vectors.
    fn default() -> Self {
        CorpusOptions {
            batch_size: 32,
            chunk_size: 4096,
        }
    }
}

/// Where a run has got to, reported after every batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Texts embedded.
    pub texts_done: u64,
    /// Texts read (the current chunk included).
    pub texts_read: u64,
    /// Input bytes read.
    pub bytes_read: u64,
}

/// What a finished run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Texts embedded.
    pub texts: u64,
    /// Texts longer than the model's maximum, embedded truncated, as
    /// sentence-transformers does.
    pub truncated: u64,
    /// The first truncated text's line and token count.
    pub first_truncated: Option<(u64, usize)>,
}

/// Embeds every text `reader` yields into `sink`, chunk by chunk.
///
/// A bad line stops the run with an error naming it; what was written before is
/// the caller's to discard (write to a temporary file).
pub fn embed_corpus<R: BufRead>(
    encoder: &SentenceEncoder,
    reader: &mut TextReader<R>,
    sink: &mut dyn VectorSink,
    options: CorpusOptions,
    mut progress: impl FnMut(Progress) + Send,
) -> Result<Summary> {
    if options.batch_size == 0 || options.chunk_size == 0 {
        return Err(Error::value(format!(
            "batch size {} and chunk size {} must both be at least 1",
            options.batch_size, options.chunk_size
        )));
    }
    let width = encoder.dimension();
    let mut summary = Summary::default();
    let mut read = 0u64;
    loop {
        let chunk = reader.read_chunk(options.chunk_size)?;
        if chunk.is_empty() {
            return Ok(summary);
        }
        read += chunk.len() as u64;
        let bytes_read = reader.bytes_read();
        // Tokenised once, in parallel (the tokenizer is shared read-only): the
        // lengths order the batches and the tokens are what they embed.
        let tokens: Vec<Tokenized> = chunk
            .par_iter()
            .map(|r| encoder.tokenizer.encode(&r.text))
            .collect::<Result<_>>()?;
        for (r, t) in chunk.iter().zip(&tokens) {
            if let Some(n) = t.truncated_from {
                summary.truncated += 1;
                summary.first_truncated.get_or_insert((r.line, n));
            }
        }
        let lengths: Vec<usize> = tokens.iter().map(|t| t.ids.len()).collect();
        let mut done = summary.texts;
        let vectors = embed_in_length_order(
            &tokens,
            &lengths,
            options.batch_size,
            width,
            |batch| {
                let seqs: Vec<Sequence<'_>> = batch.iter().map(|&t| Sequence::from(t)).collect();
                encoder.engine().embed(&seqs)
            },
            |n| {
                done += n as u64;
                progress(Progress {
                    texts_done: done,
                    texts_read: read,
                    bytes_read,
                });
            },
        )?;
        sink.write_chunk(&chunk, vectors.view())?;
        summary.texts = done;
    }
}
