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
    pub truncated_from: Option<TokenCount>,
}

/// How many tokens a truncated text had: exactly, or at least (a long text is
/// tokenised only as far as the model reads, see [`Tokenizer::encode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenCount {
    /// The whole text was tokenised.
    Exactly(usize),
    /// A prefix of the text was tokenised and had this many.
    AtLeast(usize),
}

impl std::fmt::Display for TokenCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenCount::Exactly(n) => write!(f, "{n}"),
            TokenCount::AtLeast(n) => write!(f, "at least {n}"),
        }
    }
}

/// Bytes of text tokenised first per token the model reads: English averages
/// about five bytes a token, so the first prefix nearly always holds more tokens
/// than the model reads; when it does not, it is doubled.
const FIRST_BYTES_PER_TOKEN: usize = 32;

/// Bytes of text worth keeping per token the model reads (see
/// [`Tokenizer::max_text_bytes`]).
const KEPT_BYTES_PER_TOKEN: usize = 256;

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

    /// The longest prefix of a text worth keeping, in bytes: `max_len` tokens of
    /// 256 bytes each, far more than any text of words and punctuation needs
    /// (a WordPiece token covers at most 100 characters: a longer word is one
    /// `[UNK]`). A reader of an endless or huge text keeps this much and drops
    /// the rest; only a text padded with long runs of whitespace between its first
    /// tokens could embed differently from its whole.
    pub fn max_text_bytes(&self) -> usize {
        self.max_len.saturating_mul(KEPT_BYTES_PER_TOKEN)
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokenises `text`, truncating it (and saying so in
    /// [`Tokenized::truncated_from`]) when it is too long.
    ///
    /// A long text is tokenised only as far as the model reads: a prefix ending
    /// before a whitespace character (where every tokenizer of this family starts
    /// a new word, so the prefix's tokens are the text's first tokens), doubled
    /// until it holds more than `max_len` tokens or is the whole text. The tokens
    /// of a 10 MB line are never all held at once. A first word longer than the
    /// prefix is cut inside the word.
    pub fn encode(&self, text: &str) -> Result<Tokenized> {
        self.encode_with(text, Truncation::Right)
    }

    /// [`encode`](Self::encode) keeping the tokens `truncation` says of a text
    /// over the maximum length ([`Truncation::Off`]: all of them).
    ///
    /// Truncating, a long text is tokenised only as far as the model reads: a
    /// prefix ending before a whitespace character (a suffix starting at one, for
    /// [`Truncation::Left`]), where every tokenizer of this family starts a new
    /// word, so that its tokens are the text's first (last) tokens; doubled until
    /// it holds more than `max_len` tokens or is the whole text. The tokens of a
    /// 10 MB line are never all held at once. A word longer than the prefix is cut
    /// inside the word.
    pub fn encode_with(&self, text: &str, truncation: Truncation) -> Result<Tokenized> {
        let fail = |e: tokenizers::Error| tokenise_error(text, e);
        let mut cut = match truncation {
            Truncation::Off => usize::MAX,
            Truncation::Right | Truncation::Left => {
                self.max_len.saturating_mul(FIRST_BYTES_PER_TOKEN)
            }
        };
        loop {
            let (part, whole) = match truncation {
                Truncation::Left => suffix(text, cut),
                Truncation::Right | Truncation::Off => prefix(text, cut),
            };
            let full = self.inner.encode(part, true).map_err(fail)?;
            if full.len() <= self.max_len && !whole {
                cut = cut.saturating_mul(2);
                continue;
            }
            let truncating = match truncation {
                _ if full.len() <= self.max_len => None,
                Truncation::Right => Some(&self.truncating),
                Truncation::Left => Some(&self.truncating_left),
                Truncation::Off => None,
            };
            let count = match whole {
                true => TokenCount::Exactly(full.len()),
                false => TokenCount::AtLeast(full.len()),
            };
            let (enc, truncated_from) = match truncating {
                Some(t) => (t.encode(part, true).map_err(fail)?, Some(count)),
                None => (full, None),
            };
            return Ok(Tokenized {
                ids: enc.get_ids().to_vec(),
                type_ids: enc.get_type_ids().to_vec(),
                tokens: enc.get_tokens().to_vec(),
                truncated_from,
            });
        }
    }
}

/// The text up to `max` bytes, ended before its last whitespace character there
/// (at a character boundary when there is none), and whether that is all of it.
fn prefix(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, true);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let part = &text[..end];
    match part.rfind(char::is_whitespace) {
        Some(space) if space > 0 => (&text[..space], false),
        _ => (part, false),
    }
}

/// The text's last `max` bytes at most, started at its first whitespace character
/// there (at a character boundary when there is none), and whether that is all
/// of it.
fn suffix(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, true);
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let part = &text[start..];
    match part.find(char::is_whitespace) {
        Some(space) => (&part[space..], false),
        None => (part, false),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_end_before_whitespace_on_a_character_boundary() {
        assert_eq!(prefix("ab cd", 10), ("ab cd", true));
        assert_eq!(prefix("ab cd ef", 6), ("ab cd", false));
        assert_eq!(prefix("ab cdef", 6), ("ab", false));
        // No whitespace: cut at the last whole character (é is two bytes).
        assert_eq!(prefix("abcé", 4), ("abc", false));
        assert_eq!(prefix(" abcdef", 4), (" abc", false));
    }

    #[test]
    fn suffixes_start_at_whitespace_on_a_character_boundary() {
        assert_eq!(suffix("ab cd", 10), ("ab cd", true));
        assert_eq!(suffix("ab cd ef", 6), (" cd ef", false));
        assert_eq!(suffix("abcd ef", 4), (" ef", false));
        // No whitespace: start at the first whole character (é is two bytes).
        assert_eq!(suffix("éabc", 4), ("abc", false));
    }
}
