//! Embedding a corpus with bounded memory.
//!
//! The texts are read in chunks ([`TextReader`]); each chunk is sorted by token
//! length and embedded in batches of similar length, so a batch pads little
//! ([`embed_in_length_order`]); its vectors are put back in input order and
//! written out ([`VectorSink`]: a `.npy` [`RowWriter`](attend_core::io::npy::RowWriter)
//! or a [`JsonlWriter`]) before the next chunk is read. Memory is bounded by the
//! chunk, whatever the corpus's size. [`embed_corpus`] runs the whole loop with a
//! [`SentenceEncoder`](crate::models::SentenceEncoder).

mod batches;
#[cfg(feature = "tokenizers")]
mod driver;
mod input;
mod output;

pub use batches::{embed_in_length_order, length_sorted_batches};
#[cfg(feature = "tokenizers")]
pub use driver::{embed_corpus, CorpusOptions, Progress, Summary};
pub use input::{InputFormat, Record, TextReader};
pub use output::{JsonlWriter, OutputFormat, VectorSink, EMBEDDING_FIELD};
