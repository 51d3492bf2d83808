//! Pretrained models: BERT-family encoders (BERT, DistilBERT, RoBERTa,
//! XLM-RoBERTa, MPNet; see [`Family`]) loaded from Hugging Face checkpoint
//! directories (`config.json`, `model.safetensors`, `tokenizer.json`).
//!
//! * [`BertModel`] runs token ids through the encoder; its self-attention is the
//!   canonical [`MultiHeadAttention`](attend_core::nn::MultiHeadAttention) and goes through
//!   [`attention`](attend_core::attention::attention).
//! * [`SentenceEncoder`] adds the tokenizer and sentence-transformers' pooling, giving
//!   sentence embeddings ([`SentenceEncoder::embed`]) and, for one text, every
//!   layer's and head's Q, K, V, scores and attention weights
//!   ([`SentenceEncoder::trace`], [`SentenceTrace::head`]).

mod batch;
mod config;
mod encoder;
mod engine;
mod family;
mod forward;
mod modules;
mod pooling;
mod positions;
mod probe;
#[cfg(feature = "tokenizers")]
mod sentence;
#[cfg(feature = "tokenizers")]
pub mod tokenize;
mod trace;
mod weights;

pub use batch::TokenBatch;
pub use config::BertConfig;
pub use encoder::{BertEmbeddings, BertLayer, BertModel};
pub use engine::{Engine, Sequence};
pub use family::{Family, SUPPORTED_MODEL_TYPES};
pub use modules::{Dense, DenseActivation, SentenceModules};
pub use pooling::{pool, Pooling};
pub use probe::Timings;
pub use trace::BertTrace;

/// A checkpoint directory's last component, as a readable model name for titles.
pub fn model_name(dir: &std::path::Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}
#[cfg(feature = "tokenizers")]
pub use sentence::{Embeddings, HeadTrace, SentenceEncoder, SentenceTrace};
