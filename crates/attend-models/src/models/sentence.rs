//! Sentence embeddings and attention maps from a sentence-transformers directory.

use std::path::Path;

use ndarray::{s, Array2, ArrayView2, ArrayView3};
use serde_json::Value;

use super::modules::{read_json, SentenceModules};
use super::tokenize::{short, Tokenized, Tokenizer};
use super::{BertConfig, BertModel, BertTrace, Engine, Sequence, TokenBatch};
use attend_core::attention::Precision;
use attend_core::{Error, Result};

/// A BERT-family encoder (BERT, DistilBERT, RoBERTa, XLM-RoBERTa, MPNet) with its
/// tokenizer and sentence-transformers' modules: text in, sentence embeddings out.
///
/// ```no_run
/// use attend_models::models::SentenceEncoder;
///
/// let enc = SentenceEncoder::load("/path/to/all-minilm-l6-v2")?;
/// let out = enc.embed(&["A cat sat on the mat.", "Dogs bark."])?;
/// for w in &out.warnings {
///     eprintln!("warning: {w}");
/// }
/// assert_eq!(out.vectors.shape(), &[2, 384]);
///
/// // Layer 2, head 5 of one sentence: tokens, Q, K, V, scores, weights.
/// let trace = enc.trace("The bank raised its rates.")?;
/// let head = trace.head(2, 5)?;
/// println!("{:?} {:?}", trace.tokens, head.weights.shape());
/// # Ok::<(), attend_core::Error>(())
/// ```
#[derive(Debug)]
pub struct SentenceEncoder {
    /// The encoder.
    pub model: BertModel,
    /// The tokenizer, with the maximum sequence length.
    pub tokenizer: Tokenizer,
    /// How token vectors become one vector: pooling, Dense layers, normalisation.
    pub modules: SentenceModules,
}

/// Sentence embeddings and what was noticed on the way.
#[derive(Clone, Debug)]
pub struct Embeddings {
    /// `[texts, d]`.
    pub vectors: Array2<f32>,
    /// One line per remark: truncated texts, empty texts.
    pub warnings: Vec<String>,
}

/// Everything the encoder computed for one text.
#[derive(Clone, Debug)]
pub struct SentenceTrace {
    /// The tokens, special tokens included.
    pub tokens: Vec<String>,
    /// Truncation or empty-text remarks.
    pub warnings: Vec<String>,
    /// The encoder's intermediates (batch of one): `trace.attention[layer]` holds
    /// that layer's `q`, `k`, `v` `[1, H, T, head_dim]` and `attention.weights`
    /// `[1, H, T, T]`.
    pub trace: BertTrace,
}

/// One head of one layer for one text.
#[derive(Clone, Debug)]
pub struct HeadTrace {
    /// Layer input `[T, d]` (the hidden state the projections read).
    pub input: Array2<f32>,
    /// Queries `[T, head_dim]`.
    pub q: Array2<f32>,
    /// Keys `[T, head_dim]`.
    pub k: Array2<f32>,
    /// Values `[T, head_dim]`.
    pub v: Array2<f32>,
    /// Raw `q·kᵀ`, `[T, T]`.
    pub scores: Array2<f32>,
    /// MPNet's relative-position bias of this head, `[T, T]` (`None` for the
    /// other families).
    pub position_bias: Option<Array2<f32>>,
    /// Scores times `1/√head_dim`, plus the position bias if any (nothing is
    /// masked for a single text), `[T, T]`.
    pub scaled: Array2<f32>,
    /// Softmax over keys, `[T, T]`; row `i` is where token `i` looks.
    pub weights: Array2<f32>,
    /// `weights · v`, `[T, head_dim]`.
    pub output: Array2<f32>,
}

impl SentenceTrace {
    /// The attention weights `[T, T]` of `head` in `layer` (both from 0).
    pub fn weights(&self, layer: usize, head: usize) -> Result<ArrayView2<'_, f32>> {
        self.check(layer, head)?;
        Ok(self.trace.attention[layer]
            .attention
            .weights
            .slice(s![0, head, .., ..]))
    }

    /// Every intermediate of `head` in `layer` (both from 0).
    pub fn head(&self, layer: usize, head: usize) -> Result<HeadTrace> {
        self.check(layer, head)?;
        let m = &self.trace.attention[layer];
        let a = &m.attention;
        Ok(HeadTrace {
            input: self.trace.inputs[layer].slice(s![0, .., ..]).to_owned(),
            q: m.q.slice(s![0, head, .., ..]).to_owned(),
            k: m.k.slice(s![0, head, .., ..]).to_owned(),
            v: m.v.slice(s![0, head, .., ..]).to_owned(),
            scores: a.scores.slice(s![0, head, .., ..]).to_owned(),
            position_bias: self
                .trace
                .position_bias
                .as_ref()
                .map(|b| b.slice(s![0, head, .., ..]).to_owned()),
            scaled: a.scaled.slice(s![0, head, .., ..]).to_owned(),
            weights: a.weights.slice(s![0, head, .., ..]).to_owned(),
            output: a.output.slice(s![0, head, .., ..]).to_owned(),
        })
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.trace.attention.len()
    }

    /// Heads per layer.
    pub fn heads(&self) -> usize {
        self.trace.attention.first().map_or(0, |m| m.q.dim().1)
    }

    fn check(&self, layer: usize, head: usize) -> Result<()> {
        if layer >= self.layers() {
            return Err(Error::value(format!(
                "layer {layer} is out of range: the model has {} layers (0 to {})",
                self.layers(),
                self.layers().saturating_sub(1)
            )));
        }
        if head >= self.heads() {
            return Err(Error::value(format!(
                "head {head} is out of range: each layer has {} heads (0 to {})",
                self.heads(),
                self.heads().saturating_sub(1)
            )));
        }
        Ok(())
    }
}

impl SentenceEncoder {
    /// Loads a checkpoint directory: `config.json`, `model.safetensors`,
    /// `tokenizer.json`, and, if present, sentence-transformers' `modules.json`,
    /// `1_Pooling/config.json` and `sentence_bert_config.json` (`max_seq_length`).
    ///
    /// Without `modules.json` the encoder mean-pools and does not normalise. The
    /// maximum length is `max_seq_length`, else the tokenizer config's
    /// `model_max_length`, never more than the position embeddings allow.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(dir, Precision::F32)
    }

    /// [`load`](Self::load) with the encoder's dense products in `precision`:
    /// [`Precision::Bf16`] keeps their weights in bf16 and multiplies in bf16 with
    /// f32 sums ([`BertModel::load_with`]); pooling and the Dense modules stay f32.
    pub fn load_with(dir: impl AsRef<Path>, precision: Precision) -> Result<Self> {
        let dir = dir.as_ref();
        // The weights and the tokenizer load on both threads at once: each is
        // about half of loading a small model.
        let (model, tokenizer) = rayon::join(
            || BertModel::load_with(dir, precision),
            || -> Result<Tokenizer> {
                let config = BertConfig::from_file(dir.join("config.json"))?;
                let mut max_len = config.max_tokens();
                let st_config = read_json(&dir.join("sentence_bert_config.json"))?;
                let tok_config = read_json(&dir.join("tokenizer_config.json"))?;
                let limit = st_config
                    .as_ref()
                    .and_then(|c| c.get("max_seq_length"))
                    .or_else(|| tok_config.as_ref().and_then(|c| c.get("model_max_length")))
                    .and_then(Value::as_u64);
                if let Some(l) = limit {
                    max_len = max_len.min(l as usize);
                }
                Tokenizer::from_file(dir.join("tokenizer.json"), max_len)
            },
        );
        let model = model?;
        let tokenizer = tokenizer?;
        let modules = SentenceModules::load(dir, model.config.hidden_size)?;
        Ok(SentenceEncoder {
            model,
            tokenizer,
            modules,
        })
    }

    /// The width of the sentence vectors (the last Dense layer's, else the
    /// encoder's times the number of pooling modes).
    pub fn dimension(&self) -> usize {
        self.modules.dimension(self.model.config.hidden_size)
    }

    /// Whether the vectors are L2-normalised (a `Normalize` module).
    pub fn normalizes(&self) -> bool {
        self.modules.normalize
    }

    /// Sentence vectors from the encoder's last hidden state `[B, T, d]` of
    /// sequences of the given lengths: pooling, Dense layers, normalisation.
    pub fn pool(&self, hidden: ArrayView3<'_, f32>, lengths: &[usize]) -> Result<Array2<f32>> {
        self.modules.apply(hidden, lengths)
    }

    /// Tokenises `texts`, with a warning for each truncated or empty text.
    pub fn tokenize(&self, texts: &[&str]) -> Result<(Vec<Tokenized>, Vec<String>)> {
        let mut warnings = Vec::new();
        let mut all = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let tok = self.tokenizer.encode(text)?;
            if text.trim().is_empty() {
                warnings.push(format!(
                    "text {i} is empty: it is encoded as {} alone, as sentence-transformers does",
                    tok.tokens.join(" ")
                ));
            }
            if let Some(n) = tok.truncated_from {
                warnings.push(format!(
                    "text {i} ({:?}) has {n} tokens, more than the maximum of {}: truncated to {} tokens",
                    short(text),
                    self.tokenizer.max_len(),
                    tok.ids.len()
                ));
            }
            all.push(tok);
        }
        Ok((all, warnings))
    }

    /// The encoder and its modules as an [`Engine`]: token sequences in, vectors
    /// out, for callers that tokenise by themselves.
    pub fn engine(&self) -> Engine<'_> {
        Engine {
            model: &self.model,
            modules: &self.modules,
        }
    }

    /// `texts` tokenised into one padded batch, for [`BertModel::forward`] and
    /// [`BertModel::trace`].
    pub fn token_batch(&self, texts: &[&str]) -> Result<TokenBatch> {
        let (toks, _) = self.tokenize(texts)?;
        let seqs: Vec<Sequence<'_>> = toks.iter().map(Sequence::from).collect();
        self.engine().batch(&seqs)
    }

    /// Sentence embeddings `[texts.len(), d]`, all texts in one batch.
    pub fn embed(&self, texts: &[&str]) -> Result<Embeddings> {
        let (toks, warnings) = self.tokenize(texts)?;
        let seqs: Vec<Sequence<'_>> = toks.iter().map(Sequence::from).collect();
        let vectors = self.engine().embed(&seqs)?;
        Ok(Embeddings { vectors, warnings })
    }

    /// Runs one text through the reference path, keeping every layer's and head's
    /// Q, K, V, scores and attention weights.
    pub fn trace(&self, text: &str) -> Result<SentenceTrace> {
        let (mut toks, warnings) = self.tokenize(&[text])?;
        let batch = self.engine().batch(&[Sequence::from(&toks[0])])?;
        let trace = self.model.trace(&batch)?;
        Ok(SentenceTrace {
            tokens: toks.remove(0).tokens,
            warnings,
            trace,
        })
    }
}

impl<'a> From<&'a Tokenized> for Sequence<'a> {
    fn from(tok: &'a Tokenized) -> Self {
        Sequence {
            ids: &tok.ids,
            type_ids: &tok.type_ids,
        }
    }
}
