//! Texts read from a stream: one per line, or one JSON object per line with the
//! text in a named field. Every bad line is an error naming its number.

use std::io::BufRead;

use serde_json::Value;

use attend_core::{Error, Result};

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
        }
    }

    /// Bytes consumed so far (for progress against a file's size).
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    /// The next text, or `None` at the end of the input.
    pub fn next_record(&mut self) -> Result<Option<Record>> {
        self.buf.clear();
        let n = self
            .input
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| Error::io(&self.origin, e))?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        self.bytes += n as u64;
        let mut raw = &self.buf[..];
        raw = raw.strip_suffix(b"\n").unwrap_or(raw);
        raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = std::str::from_utf8(raw).map_err(|e| {
            self.bad(format!(
                "is not valid UTF-8 (bad byte at column {})",
                e.valid_up_to() + 1
            ))
        })?;
        if line.trim().is_empty() {
            return Err(self.bad("is empty: every line must hold a text".into()));
        }
        let (text, object) = match &self.format {
            InputFormat::Lines => (line.to_owned(), None),
            InputFormat::Jsonl { field } => (self.field(line, field)?, Some(line.to_owned())),
        };
        Ok(Some(Record {
            line: self.line,
            text,
            object,
        }))
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
}
