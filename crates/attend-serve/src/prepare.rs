//! Requests' inputs made into token ids, on threads of their own (the
//! tokenization workers) so that tokenising the next requests overlaps the
//! engine's pass, or for short inputs on the HTTP thread that received them:
//! prompts prefixed, texts over the model's maximum truncated or refused, token
//! ids checked against the vocabulary. Nothing here knows HTTP.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use attend_models::models::tokenize::{Piece, Truncation};
use attend_models::models::SentenceEncoder;
use tokio::sync::oneshot;

use crate::queue::TokenIds;
use crate::workers::Workers;

/// One input of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A text, tokenised here.
    Text(String),
    /// Token ids of the model's own tokenizer, special tokens included (as
    /// `/tokenize` gives them); used as they are.
    Ids(Vec<u32>),
}

/// How a request's inputs are prepared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preparation {
    /// Which tokens of a text over the maximum are kept; [`Truncation::Off`]
    /// refuses such a text.
    pub truncation: Truncation,
    /// A prompt name from `config_sentence_transformers.json`, or the model's
    /// default prompt when `None`.
    pub prompt_name: Option<String>,
}

/// A request's inputs as token ids.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// One per input, in order.
    pub texts: Vec<TokenIds>,
    /// Their tokens, after truncation.
    pub tokens: usize,
    /// Characters of the texts (token-id inputs count none).
    pub characters: usize,
    /// How long tokenisation took.
    pub took: Duration,
}

/// Why a request's inputs were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// No inputs.
    Empty,
    /// Input `index` has `tokens` tokens, more than `max`, and truncation is off.
    TooLong {
        /// Which input.
        index: usize,
        /// Its tokens.
        tokens: usize,
        /// The model's maximum.
        max: usize,
    },
    /// Input `index` holds token id `id`, outside a vocabulary of `vocab`.
    TokenId {
        /// Which input.
        index: usize,
        /// The id.
        id: u32,
        /// The vocabulary's size.
        vocab: usize,
    },
    /// A prompt name the model does not have.
    UnknownPrompt {
        /// The name asked for.
        name: String,
        /// The names it has.
        known: Vec<String>,
    },
    /// The tokenizer refused a text.
    Tokenizer(String),
    /// The tokenization workers are gone (the server is stopping).
    Stopped,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Invalid::Empty => write!(f, "the input is empty: give at least one text"),
            Invalid::TooLong { index, tokens, max } => write!(
                f,
                "input {index} has {tokens} tokens, more than the model's maximum of {max} (ask for truncation, or send a shorter text)"
            ),
            Invalid::TokenId { index, id, vocab } => write!(
                f,
                "input {index} holds token id {id}, outside the model's vocabulary of {vocab}"
            ),
            Invalid::UnknownPrompt { name, known } if known.is_empty() => {
                write!(f, "prompt_name {name:?} is unknown: the model defines no prompts")
            }
            Invalid::UnknownPrompt { name, known } => write!(
                f,
                "prompt_name {name:?} is unknown: the model defines {}",
                known.join(", ")
            ),
            Invalid::Tokenizer(e) => write!(f, "{e}"),
            Invalid::Stopped => write!(f, "the server is stopping"),
        }
    }
}

/// Inputs of at most this many bytes of text (or token ids) are prepared on the
/// caller's thread: tokenising a short sentence takes tens of microseconds, less
/// than handing it to a worker and being woken back, and every such hand-over
/// interrupts the compute threads of a pass running on the same CPUs.
const INLINE_BYTES: usize = 256;

/// Whether `inputs` are small enough to prepare without a worker.
fn inline(inputs: &[Input]) -> bool {
    let size: usize = inputs
        .iter()
        .map(|i| match i {
            Input::Text(t) => t.len(),
            Input::Ids(ids) => ids.len(),
        })
        .sum();
    size <= INLINE_BYTES
}

/// The tokenization workers and what they need.
pub struct Tokenization {
    encoder: Arc<SentenceEncoder>,
    workers: Workers,
    prompts: BTreeMap<String, String>,
    default_prompt: Option<String>,
}

impl Tokenization {
    /// `workers` threads tokenising for `encoder`, loaded from `model_dir` (whose
    /// `config_sentence_transformers.json` may name prompts).
    pub fn new(
        encoder: Arc<SentenceEncoder>,
        model_dir: &Path,
        workers: usize,
    ) -> Result<Self, String> {
        let (prompts, default_prompt) = read_prompts(model_dir)?;
        let workers = Workers::new(workers, "attend-tokenize")
            .map_err(|e| format!("cannot start the tokenization workers: {e}"))?;
        Ok(Tokenization {
            encoder,
            workers,
            prompts,
            default_prompt,
        })
    }

    /// The most tokens of one text the model takes.
    pub fn max_tokens(&self) -> usize {
        self.encoder.tokenizer.max_len()
    }

    /// Runs `f` on a worker and waits for it without blocking the caller's thread.
    async fn on_worker<T: Send + 'static>(
        &self,
        f: impl FnOnce(&SentenceEncoder) -> T + Send + 'static,
    ) -> Result<T, Invalid> {
        let (tx, rx) = oneshot::channel();
        let encoder = Arc::clone(&self.encoder);
        self.workers.spawn(move || {
            let _ = tx.send(f(&encoder));
        });
        rx.await.map_err(|_| Invalid::Stopped)
    }

    /// The inputs as token ids.
    pub async fn prepare(&self, inputs: Vec<Input>, how: Preparation) -> Result<Prepared, Invalid> {
        if inputs.is_empty() {
            return Err(Invalid::Empty);
        }
        let prompt = self.prompt(how.prompt_name.as_deref())?;
        if inline(&inputs) {
            return prepare_all(&self.encoder, inputs, how.truncation, prompt);
        }
        self.on_worker(move |encoder| prepare_all(encoder, inputs, how.truncation, prompt))
            .await?
    }

    /// Every token of each text, for `/tokenize`.
    pub async fn pieces(
        &self,
        texts: Vec<String>,
        special_tokens: bool,
        prompt_name: Option<String>,
    ) -> Result<Vec<Vec<Piece>>, Invalid> {
        if texts.is_empty() {
            return Err(Invalid::Empty);
        }
        let prompt = self.prompt(prompt_name.as_deref())?;
        self.on_worker(move |encoder| {
            texts
                .iter()
                .map(|t| {
                    encoder
                        .tokenizer
                        .pieces(&with_prompt(prompt.as_deref(), t), special_tokens)
                        .map_err(|e| Invalid::Tokenizer(e.to_string()))
                })
                .collect()
        })
        .await?
    }

    /// The prompt text `name` asks for (the default prompt when `None`).
    fn prompt(&self, name: Option<&str>) -> Result<Option<String>, Invalid> {
        match name.or(self.default_prompt.as_deref()) {
            None => Ok(None),
            Some(n) => {
                self.prompts
                    .get(n)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| Invalid::UnknownPrompt {
                        name: n.to_owned(),
                        known: self.prompts.keys().cloned().collect(),
                    })
            }
        }
    }
}

fn with_prompt(prompt: Option<&str>, text: &str) -> String {
    match prompt {
        Some(p) => format!("{p}{text}"),
        None => text.to_owned(),
    }
}

fn prepare_all(
    encoder: &SentenceEncoder,
    inputs: Vec<Input>,
    truncation: Truncation,
    prompt: Option<String>,
) -> Result<Prepared, Invalid> {
    let start = Instant::now();
    let max = encoder.tokenizer.max_len();
    let vocab = encoder.model.config.vocab_size;
    let mut texts = Vec::with_capacity(inputs.len());
    let (mut tokens, mut characters) = (0, 0);
    for (index, input) in inputs.into_iter().enumerate() {
        let ids = match input {
            Input::Text(text) => {
                characters += text.chars().count();
                let text = with_prompt(prompt.as_deref(), &text);
                let tok = encoder
                    .tokenizer
                    .encode_with(&text, truncation)
                    .map_err(|e| Invalid::Tokenizer(e.to_string()))?;
                TokenIds {
                    ids: tok.ids,
                    type_ids: tok.type_ids,
                }
            }
            Input::Ids(mut ids) => {
                if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
                    return Err(Invalid::TokenId { index, id, vocab });
                }
                if ids.len() > max {
                    match truncation {
                        Truncation::Right => ids.truncate(max),
                        Truncation::Left => {
                            ids.drain(..ids.len() - max);
                        }
                        Truncation::Off => {}
                    }
                }
                let n = ids.len();
                TokenIds {
                    ids,
                    type_ids: vec![0; n],
                }
            }
        };
        if ids.ids.len() > max {
            return Err(Invalid::TooLong {
                index,
                tokens: ids.ids.len(),
                max,
            });
        }
        if ids.ids.is_empty() {
            return Err(Invalid::Tokenizer(format!("input {index} has no tokens")));
        }
        tokens += ids.ids.len();
        texts.push(ids);
    }
    Ok(Prepared {
        texts,
        tokens,
        characters,
        took: start.elapsed(),
    })
}

/// The `prompts` and `default_prompt_name` of `config_sentence_transformers.json`,
/// if the model has one.
fn read_prompts(dir: &Path) -> Result<(BTreeMap<String, String>, Option<String>), String> {
    let path = dir.join("config_sentence_transformers.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok((BTreeMap::new(), None));
    };
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not valid JSON: {e}", path.display()))?;
    let mut prompts = BTreeMap::new();
    if let Some(map) = json.get("prompts").and_then(|p| p.as_object()) {
        for (name, value) in map {
            let prompt = value
                .as_str()
                .ok_or_else(|| format!("{}: prompt {name:?} is not a string", path.display()))?;
            prompts.insert(name.clone(), prompt.to_owned());
        }
    }
    let default = json
        .get("default_prompt_name")
        .and_then(|d| d.as_str())
        .map(str::to_owned);
    if let Some(d) = &default {
        if !prompts.contains_key(d) {
            return Err(format!(
                "{}: default_prompt_name {d:?} is not among its prompts",
                path.display()
            ));
        }
    }
    Ok((prompts, default))
}
