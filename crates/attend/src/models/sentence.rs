//! Sentence embeddings and attention maps from a sentence-transformers directory.

use std::path::Path;

use ndarray::{s, Array2, ArrayView2};
use serde_json::Value;

use super::tokenize::{short, Tokenized, Tokenizer};
use super::{pool, BertModel, BertTrace, Pooling, TokenBatch};
use crate::{Error, Result};

/// A BERT encoder with its tokenizer and pooling: text in, sentence embeddings out.
///
/// ```no_run
/// use attend::models::SentenceEncoder;
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
/// # Ok::<(), attend::Error>(())
/// ```
#[derive(Debug)]
pub struct SentenceEncoder {
    /// The encoder.
    pub model: BertModel,
    /// The tokenizer, with the maximum sequence length.
    pub tokenizer: Tokenizer,
    /// How token vectors become one vector.
    pub pooling: Pooling,
    /// Whether embeddings are L2-normalised (a `Normalize` module in `modules.json`).
    pub normalize: bool,
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
    /// Scores times `1/√head_dim` (nothing is masked for a single text), `[T, T]`.
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
            scaled: a.scaled.slice(s![0, head, .., ..]).to_owned(),
            weights: a.weights.slice(s![0, head, .., ..]).to_owned(),
            output: a.output.slice(s![0, head, .., ..]).to_owned(),
        })
    }

    /// Every layer's and head's weights as [`AttentionMaps`](crate::viz::AttentionMaps)
    /// (what the heatmaps and the HTML view draw; `attend view --input-json` reads
    /// its JSON form).
    pub fn attention_maps(&self, title: &str) -> Result<crate::viz::AttentionMaps> {
        let layers = self
            .trace
            .attention
            .iter()
            .map(|m| m.attention.weights.slice(s![0, .., .., ..]).to_owned())
            .collect();
        crate::viz::AttentionMaps::new(self.tokens.clone(), self.tokens.clone(), layers, title)
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

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::format(format!("{}: not valid JSON: {e}", path.display())))
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
        let dir = dir.as_ref();
        let model = BertModel::load(dir)?;
        let mut max_len = model.config.max_position_embeddings;
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
        let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"), max_len)?;
        let (pooling, normalize) = Self::read_modules(dir)?;
        Ok(SentenceEncoder {
            model,
            tokenizer,
            pooling,
            normalize,
        })
    }

    fn read_modules(dir: &Path) -> Result<(Pooling, bool)> {
        let path = dir.join("modules.json");
        let Some(modules) = read_json(&path)? else {
            return Ok((Pooling::Mean, false));
        };
        let list = modules.as_array().ok_or_else(|| {
            Error::format(format!("{}: expected a list of modules", path.display()))
        })?;
        let mut pooling = Pooling::Mean;
        let mut normalize = false;
        for m in list {
            let kind = m.get("type").and_then(Value::as_str).unwrap_or_default();
            let sub = m.get("path").and_then(Value::as_str).unwrap_or_default();
            match kind.rsplit('.').next().unwrap_or_default() {
                "Transformer" => {}
                "Normalize" => normalize = true,
                "Pooling" => {
                    let cfg_path = dir.join(sub).join("config.json");
                    let cfg = read_json(&cfg_path)?
                        .ok_or_else(|| Error::io(&cfg_path, "pooling config not found"))?;
                    let on = |k: &str| cfg.get(k).and_then(Value::as_bool).unwrap_or(false);
                    let chosen: Vec<Pooling> = [
                        ("pooling_mode_mean_tokens", Pooling::Mean),
                        ("pooling_mode_cls_token", Pooling::Cls),
                        ("pooling_mode_max_tokens", Pooling::Max),
                        ("pooling_mode_mean_sqrt_len_tokens", Pooling::MeanSqrtLen),
                    ]
                    .into_iter()
                    .filter(|(k, _)| on(k))
                    .map(|(_, p)| p)
                    .collect();
                    pooling = match chosen[..] {
                        [p] => p,
                        _ => {
                            return Err(Error::format(format!(
                                "{}: exactly one of mean, cls, max and mean_sqrt_len pooling must be on",
                                cfg_path.display()
                            )))
                        }
                    };
                }
                other => {
                    return Err(Error::format(format!(
                    "{}: module type {other:?} is not supported (Transformer, Pooling, Normalize)",
                    path.display()
                )))
                }
            }
        }
        Ok((pooling, normalize))
    }

    /// Tokenises `texts` and pads them into one batch, with a warning for each
    /// truncated or empty text.
    pub fn tokenize(&self, texts: &[&str]) -> Result<(Vec<Tokenized>, TokenBatch, Vec<String>)> {
        let mut warnings = Vec::new();
        let mut all = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let tok = self.tokenizer.encode(text)?;
            if text.trim().is_empty() {
                warnings.push(format!(
                    "text {i} is empty: it is encoded as [CLS] [SEP] alone, as sentence-transformers does"
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
        let pad = self.model.config.pad_token_id as u32;
        let seqs: Vec<(Vec<u32>, Vec<u32>)> = all
            .iter()
            .map(|t| (t.ids.clone(), t.type_ids.clone()))
            .collect();
        let batch = TokenBatch::from_sequences(&seqs, pad)?;
        Ok((all, batch, warnings))
    }

    /// Sentence embeddings `[texts.len(), d]`, all texts in one padded batch.
    pub fn embed(&self, texts: &[&str]) -> Result<Embeddings> {
        let (_, batch, warnings) = self.tokenize(texts)?;
        if texts.is_empty() {
            return Ok(Embeddings {
                vectors: Array2::zeros((0, self.model.config.hidden_size)),
                warnings,
            });
        }
        let hidden = self.model.forward(&batch)?;
        let vectors = pool(hidden.view(), &batch.lengths, self.pooling, self.normalize)?;
        Ok(Embeddings { vectors, warnings })
    }

    /// Runs one text through the reference path, keeping every layer's and head's
    /// Q, K, V, scores and attention weights.
    pub fn trace(&self, text: &str) -> Result<SentenceTrace> {
        let (mut toks, batch, warnings) = self.tokenize(&[text])?;
        let trace = self.model.trace(&batch)?;
        Ok(SentenceTrace {
            tokens: toks.remove(0).tokens,
            warnings,
            trace,
        })
    }
}
