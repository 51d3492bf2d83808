//! Tokenisation with the Hugging Face `tokenizers` crate and a `tokenizer.json`.

use std::path::Path;

use attend_core::{Error, Result};

/// A `tokenizer.json` tokenizer that adds the special tokens (`[CLS] … [SEP]`) and
/// truncates to a maximum length, as sentence-transformers calls it.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    truncating: tokenizers::Tokenizer,
    /// Truncating from the start instead (TEI's `truncation_direction: "Left"`).
    truncating_left: tokenizers::Tokenizer,
    max_len: usize,
}

/// Which tokens of a text over the maximum length are kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Truncation {
    /// The first tokens (sentence-transformers' truncation).
    #[default]
    Right,
    /// The last tokens.
    Left,
    /// None: the text is tokenised whole, however long, for a caller that refuses
    /// texts over the maximum.
    Off,
}

/// One token of a text with where it came from (TEI's `/tokenize`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The token id.
    pub id: u32,
    /// The token as a string.
    pub text: String,
    /// Whether the tokenizer added it (`[CLS]`, `[SEP]`, …).
    pub special: bool,
    /// The byte offsets in the text it was read from (`0..0` for special tokens).
    pub span: std::ops::Range<usize>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

/// One tokenised text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokenized {
    /// Token ids, special tokens included.
    pub ids: Vec<u32>,
    /// Token-type (segment) ids.
    pub type_ids: Vec<u32>,
    /// The tokens as strings (`"[CLS]"`, `"hello"`, `"##ing"`, …).
    pub tokens: Vec<String>,
    /// The number of tokens before truncation, if the text was truncated.
    pub truncated_from: Option<usize>,
}

impl Tokenizer {
    /// Reads `tokenizer.json`; texts are cut to at most `max_len` tokens (special
    /// tokens included). The file's own padding and truncation settings are ignored.
    pub fn from_file(path: impl AsRef<Path>, max_len: usize) -> Result<Self> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(Error::io(path, "tokenizer file not found"));
        }
        let mut inner = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            Error::format(format!(
                "{}: not a valid tokenizer.json: {e}",
                path.display()
            ))
        })?;
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| Error::format(format!("{}: {e}", path.display())))?;
        if max_len < 2 {
            return Err(Error::value(format!(
                "maximum length {max_len} leaves no room for [CLS] and [SEP]"
            )));
        }
        let truncating_to = |direction| -> Result<tokenizers::Tokenizer> {
            let mut t = inner.clone();
            t.with_truncation(Some(tokenizers::TruncationParams {
                max_length: max_len,
                direction,
                ..Default::default()
            }))
            .map_err(|e| Error::value(format!("maximum length {max_len}: {e}")))?;
            Ok(t)
        };
        Ok(Tokenizer {
            truncating: truncating_to(tokenizers::TruncationDirection::Right)?,
            truncating_left: truncating_to(tokenizers::TruncationDirection::Left)?,
            inner,
            max_len,
        })
    }

    /// The maximum number of tokens of one text, special tokens included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokenises `text`, truncating it (and saying so in
    /// [`Tokenized::truncated_from`]) when it is too long.
    pub fn encode(&self, text: &str) -> Result<Tokenized> {
        self.encode_with(text, Truncation::Right)
    }

    /// [`encode`](Self::encode) keeping the tokens `truncation` says of a text
    /// over the maximum length ([`Truncation::Off`]: all of them).
    pub fn encode_with(&self, text: &str, truncation: Truncation) -> Result<Tokenized> {
        let full = self
            .inner
            .encode(text, true)
            .map_err(|e| tokenise_error(text, e))?;
        let truncating = match truncation {
            _ if full.len() <= self.max_len => None,
            Truncation::Right => Some(&self.truncating),
            Truncation::Left => Some(&self.truncating_left),
            Truncation::Off => None,
        };
        let (enc, truncated_from) = match truncating {
            Some(t) => (
                t.encode(text, true).map_err(|e| tokenise_error(text, e))?,
                Some(full.len()),
            ),
            None => (full, None),
        };
        Ok(Tokenized {
            ids: enc.get_ids().to_vec(),
            type_ids: enc.get_type_ids().to_vec(),
            tokens: enc.get_tokens().to_vec(),
            truncated_from,
        })
    }
}

impl Tokenizer {
    /// Every token of `text`, with the special tokens if `special_tokens`, and
    /// where each came from; never truncated.
    pub fn pieces(&self, text: &str, special_tokens: bool) -> Result<Vec<Piece>> {
        let enc = self
            .inner
            .encode(text, special_tokens)
            .map_err(|e| tokenise_error(text, e))?;
        Ok(enc
            .get_ids()
            .iter()
            .zip(enc.get_tokens())
            .zip(enc.get_special_tokens_mask())
            .zip(enc.get_offsets())
            .map(|(((&id, token), &special), &(start, stop))| Piece {
                id,
                text: token.clone(),
                special: special == 1,
                span: start..stop,
            })
            .collect())
    }
}

fn tokenise_error(text: &str, e: tokenizers::Error) -> Error {
    Error::value(format!("cannot tokenise {:?}: {e}", short(text)))
}

/// The first 40 characters of `text`, for messages.
pub(crate) fn short(text: &str) -> String {
    let mut s: String = text.chars().take(40).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}
