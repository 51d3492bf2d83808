//! Texts read from a stream: one per line, or one JSON object per line with the
//! text in a named field. Every bad line is an error naming its number.
//!
//! Reads are bounded: a line is read in pieces and a text keeps at most
//! [`TextReader::with_max_text_bytes`] bytes (the rest is checked and dropped),
//! and a line longer than [`MAX_LINE_BYTES`] is refused, so an endless stream with
//! no newline (`/dev/zero`) ends with an error instead of filling memory.

use std::io::BufRead;

use serde_json::Value;

use attend_core::{Error, Result};

/// The longest line read (a JSONL line is held whole; a plain text line only up
/// to the text's limit).
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// How each input line holds its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputFormat {
    /// The whole line is the text.
    Lines,
    /// The line is a JSON object; the text is the string in this field.
    Jsonl {
        /// The field holding the text.
        field: String,
    },
}

/// One text of the corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its line number, from 1.
    pub line: u64,
    /// The text to embed.
    pub text: String,
    /// For JSONL input, the line itself (the object with all its fields, as the
    /// input spelled it), so that an output can keep them.
    pub object: Option<String>,
}

/// Reads a corpus in chunks of at most a given number of texts.
pub struct TextReader<R> {
    input: R,
    format: InputFormat,
    origin: String,
    line: u64,
    bytes: u64,
    buf: Vec<u8>,
    max_text: usize,
    cut: u64,
    first_cut: Option<u64>,
}

impl<R: BufRead> TextReader<R> {
    /// Reads `input`; `origin` names it in error messages (a path, or `<stdin>`).
    pub fn new(input: R, format: InputFormat, origin: impl Into<String>) -> Self {
        TextReader {
            input,
            format,
            origin: origin.into(),
            line: 0,
            bytes: 0,
            buf: Vec::new(),
            max_text: MAX_LINE_BYTES,
            cut: 0,
            first_cut: None,
        }
    }

    /// Keeps at most `max` bytes of each text (cut at a character boundary), e.g.
    /// [`Tokenizer::max_text_bytes`](crate::models::tokenize::Tokenizer::max_text_bytes):
    /// what the model cannot read is never held.
    pub fn with_max_text_bytes(mut self, max: usize) -> Self {
        self.max_text = max.clamp(4, MAX_LINE_BYTES);
        self
    }

    /// How many texts were cut to the limit, and the line of the first.
    pub fn texts_cut(&self) -> (u64, Option<u64>) {
        (self.cut, self.first_cut)
    }

    /// Bytes consumed so far (for progress against a file's size).
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    /// The next text, or `None` at the end of the input.
    pub fn next_record(&mut self) -> Result<Option<Record>> {
        let keep = match self.format {
            // Room for the line's end, stripped below.
            InputFormat::Lines => self.max_text + 2,
            InputFormat::Jsonl { .. } => MAX_LINE_BYTES,
        };
        let Some(n) = self.read_line(keep)? else {
            return Ok(None);
        };
        let mut raw = &self.buf[..];
        raw = raw.strip_suffix(b"\n").unwrap_or(raw);
        raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        // The whole line is valid UTF-8 (read_line checked it), so only the cut
        // can have split a character.
        let line = match std::str::from_utf8(raw) {
            Ok(line) => line,
            Err(e) => std::str::from_utf8(&raw[..e.valid_up_to()]).unwrap_or_default(),
        };
        if line.trim().is_empty() {
            return Err(self.bad("is empty: every line must hold a text".into()));
        }
        let (text, object) = match &self.format {
            InputFormat::Lines => (line.to_owned(), None),
            InputFormat::Jsonl { field } => (self.field(line, field)?, Some(line.to_owned())),
        };
        let text = self.cut_text(text, n);
        Ok(Some(Record {
            line: self.line,
            text,
            object,
        }))
    }

    /// Reads the next line into `buf`, keeping its first `keep` bytes, checking
    /// that all of it is UTF-8; returns its length, `None` at the end.
    fn read_line(&mut self, keep: usize) -> Result<Option<usize>> {
        self.buf.clear();
        let mut utf8 = Utf8Check::default();
        let mut total = 0usize;
        loop {
            let available = self
                .input
                .fill_buf()
                .map_err(|e| Error::io(&self.origin, e))?;
            if available.is_empty() {
                break;
            }
            let (piece, ends) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (&available[..=i], true),
                None => (available, false),
            };
            let n = piece.len();
            let room = keep.saturating_sub(self.buf.len()).min(n);
            self.buf.extend_from_slice(&piece[..room]);
            let checked = utf8.feed(piece);
            self.input.consume(n);
            if total == 0 {
                self.line += 1;
            }
            total += n;
            self.bytes += n as u64;
            if let Err(column) = checked {
                return Err(self.bad(format!("is not valid UTF-8 (bad byte at column {column})")));
            }
            if total > MAX_LINE_BYTES {
                return Err(self.bad(format!(
                    "runs past {} MiB without a newline: a corpus holds one text per line",
                    MAX_LINE_BYTES >> 20
                )));
            }
            if ends {
                break;
            }
        }
        if total == 0 {
            return Ok(None);
        }
        if let Err(column) = utf8.finish() {
            return Err(self.bad(format!("is not valid UTF-8 (bad byte at column {column})")));
        }
        Ok(Some(total))
    }

    /// `text` cut to the text limit at a character boundary, counted when cut;
    /// `line_bytes` is the whole line's length.
    fn cut_text(&mut self, mut text: String, line_bytes: usize) -> String {
        let lines_cut = matches!(self.format, InputFormat::Lines) && line_bytes > self.buf.len();
        if text.len() > self.max_text || lines_cut {
            let mut end = self.max_text.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            self.cut += 1;
            self.first_cut.get_or_insert(self.line);
        }
        text
    }

    /// Up to `max` texts; an empty chunk means the input is exhausted.
    pub fn read_chunk(&mut self, max: usize) -> Result<Vec<Record>> {
        let mut chunk = Vec::with_capacity(max.min(1 << 16));
        while chunk.len() < max {
            match self.next_record()? {
                Some(r) => chunk.push(r),
                None => break,
            }
        }
        Ok(chunk)
    }

    fn field(&self, line: &str, field: &str) -> Result<String> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| self.bad(format!("is not valid JSON: {e}")))?;
        let Value::Object(mut object) = value else {
            return Err(self.bad(format!(
                "is a JSON {}, not an object with a {field:?} field",
                kind(&value)
            )));
        };
        match object.remove(field) {
            Some(Value::String(s)) if s.trim().is_empty() => {
                Err(self.bad(format!("has an empty {field:?} field")))
            }
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(self.bad(format!(
                "has a {} in its {field:?} field, not a string",
                kind(&other)
            ))),
            None => Err(self.bad(format!("has no {field:?} field"))),
        }
    }

    fn bad(&self, what: String) -> Error {
        Error::format(format!("{}: line {} {what}", self.origin, self.line))
    }
}

/// UTF-8 checked piece by piece: the bytes of a character split between two
/// pieces are carried over to the next.
#[derive(Default)]
struct Utf8Check {
    carry: Vec<u8>,
    checked: usize,
}

impl Utf8Check {
    /// Checks `piece`; a bad byte is `Err` with its column (from 1).
    fn feed(&mut self, piece: &[u8]) -> std::result::Result<(), usize> {
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(piece);
        match std::str::from_utf8(&bytes) {
            Ok(_) => self.checked += bytes.len(),
            Err(e) if e.error_len().is_none() => {
                self.checked += e.valid_up_to();
                self.carry = bytes[e.valid_up_to()..].to_vec();
            }
            Err(e) => return Err(self.checked + e.valid_up_to() + 1),
        }
        Ok(())
    }

    /// The end of the line: a character left incomplete is bad.
    fn finish(&self) -> std::result::Result<(), usize> {
        match self.carry.is_empty() {
            true => Ok(()),
            false => Err(self.checked + 1),
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(input: &[u8], format: InputFormat) -> Result<Vec<Record>> {
        let mut r = TextReader::new(input, format, "in");
        let mut all = Vec::new();
        loop {
            let chunk = r.read_chunk(2)?;
            if chunk.is_empty() {
                return Ok(all);
            }
            all.extend(chunk);
        }
    }

    fn err(input: &[u8], format: InputFormat) -> String {
        read_all(input, format).unwrap_err().to_string()
    }

    #[test]
    fn lines_in_chunks_with_any_line_ending() {
        let got = read_all(b"a b\r\nc\nd", InputFormat::Lines).unwrap();
        let texts: Vec<(u64, &str)> = got.iter().map(|r| (r.line, r.text.as_str())).collect();
        assert_eq!(texts, [(1, "a b"), (2, "c"), (3, "d")]);
        assert!(read_all(b"", InputFormat::Lines).unwrap().is_empty());
    }

    #[test]
    fn jsonl_keeps_the_object() {
        let field = InputFormat::Jsonl {
            field: "body".into(),
        };
        let got = read_all(b"{\"id\": 7, \"body\": \"caf\\u00e9\"}\n", field).unwrap();
        assert_eq!(got[0].text, "café");
        assert_eq!(
            got[0].object.as_deref(),
            Some("{\"id\": 7, \"body\": \"caf\\u00e9\"}")
        );
    }

    #[test]
    fn bad_lines_are_named_by_number() {
        let lines = InputFormat::Lines;
        assert_eq!(
            err(b"a\n\nb\n", lines.clone()),
            "in: line 2 is empty: every line must hold a text"
        );
        assert_eq!(
            err(b"a\nb\n  \t\n", lines.clone()),
            "in: line 3 is empty: every line must hold a text"
        );
        assert_eq!(
            err(b"ok\nab\xff\n", lines),
            "in: line 2 is not valid UTF-8 (bad byte at column 3)"
        );
        let field = || InputFormat::Jsonl {
            field: "text".into(),
        };
        assert_eq!(
            err(b"{\"text\": \"x\"}\n{\"text\": 3}\n", field()),
            "in: line 2 has a number in its \"text\" field, not a string"
        );
        assert_eq!(
            err(b"{\"txt\": \"x\"}\n", field()),
            "in: line 1 has no \"text\" field"
        );
        assert_eq!(
            err(b"[1]\n", field()),
            "in: line 1 is a JSON array, not an object with a \"text\" field"
        );
        assert_eq!(
            err(b"{\"text\": \"\"}\n", field()),
            "in: line 1 has an empty \"text\" field"
        );
        assert!(err(b"{\"text\": \"x\"\n", field())
            .starts_with("in: line 1 is not valid JSON: EOF while parsing an object"));
    }

    #[test]
    fn long_texts_keep_their_first_bytes_and_are_counted() {
        // Pieces of 3 bytes: characters and line ends split between reads.
        let input = std::io::BufReader::with_capacity(3, "ab\ncafé au lait\r\nxy\n".as_bytes());
        let mut r = TextReader::new(input, InputFormat::Lines, "in").with_max_text_bytes(4);
        let texts: Vec<String> = r
            .read_chunk(10)
            .unwrap()
            .into_iter()
            .map(|r| r.text)
            .collect();
        assert_eq!(texts, ["ab", "caf", "xy"]);
        assert_eq!(r.texts_cut(), (1, Some(2)));
        let field = InputFormat::Jsonl { field: "t".into() };
        let mut r =
            TextReader::new(&b"{\"t\": \"abcdef\"}\n"[..], field, "in").with_max_text_bytes(4);
        let got = r.read_chunk(10).unwrap();
        assert_eq!(got[0].text, "abcd");
        assert_eq!(got[0].object.as_deref(), Some("{\"t\": \"abcdef\"}"));
        assert_eq!(r.texts_cut(), (1, Some(1)));
        // A bad byte past the kept part is still found, in a split character too.
        let input = std::io::BufReader::with_capacity(3, &b"okay then\xc3\n"[..]);
        let mut r = TextReader::new(input, InputFormat::Lines, "in").with_max_text_bytes(4);
        assert_eq!(
            r.read_chunk(10).unwrap_err().to_string(),
            "in: line 1 is not valid UTF-8 (bad byte at column 10)"
        );
    }

    #[test]
    fn an_endless_line_is_refused_without_holding_it() {
        let endless = std::io::BufReader::new(std::io::repeat(b'a'));
        let mut r = TextReader::new(endless, InputFormat::Lines, "in").with_max_text_bytes(64);
        assert_eq!(
            r.read_chunk(10).unwrap_err().to_string(),
            "in: line 1 runs past 64 MiB without a newline: a corpus holds one text per line"
        );
        assert!(r.buf.capacity() < 1 << 20, "{}", r.buf.capacity());
    }
}
