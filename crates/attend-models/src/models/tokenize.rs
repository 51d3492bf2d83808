//! Tokenisation with the Hugging Face `tokenizers` crate and a `tokenizer.json`.

use std::path::Path;

use attend_core::{Error, Result};

/// A `tokenizer.json` tokenizer that adds the special tokens (`[CLS] … [SEP]`) and
/// truncates to a maximum length, as sentence-transformers calls it.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    truncating: tokenizers::Tokenizer,
    max_len: usize,
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
        let mut truncating = inner.clone();
        truncating
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: max_len,
                ..Default::default()
            }))
            .map_err(|e| Error::value(format!("maximum length {max_len}: {e}")))?;
        Ok(Tokenizer {
            inner,
            truncating,
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
        let fail =
            |e: tokenizers::Error| Error::value(format!("cannot tokenise {:?}: {e}", short(text)));
        let full = self.inner.encode(text, true).map_err(fail)?;
        let (enc, truncated_from) = if full.len() > self.max_len {
            (
                self.truncating.encode(text, true).map_err(fail)?,
                Some(full.len()),
            )
        } else {
            (full, None)
        };
        Ok(Tokenized {
            ids: enc.get_ids().to_vec(),
            type_ids: enc.get_type_ids().to_vec(),
            tokens: enc.get_tokens().to_vec(),
            truncated_from,
        })
    }
}

/// The first 40 characters of `text`, for messages.
pub(crate) fn short(text: &str) -> String {
    let mut s: String = text.chars().take(40).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}
