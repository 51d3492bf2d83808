//! Where a corpus's vectors go: a `.npy` file of rows, or JSON lines.

use std::io::{Seek, Write};
use std::path::Path;

use ndarray::ArrayView2;
use serde_json::{Map, Value};

use super::Record;
use attend_core::io::npy::RowWriter;
use attend_core::{Error, Result};

/// The field JSONL output puts each vector in.
pub const EMBEDDING_FIELD: &str = "embedding";

/// The kinds of file a corpus's vectors can be written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// A float32 `.npy` array `[texts, width]`, row `i` for input text `i`.
    Npy,
    /// One JSON object per input text, in input order: the input's own object with
    /// an `"embedding"` field added (JSONL input), or `{"embedding": [...]}` alone
    /// (plain-text input).
    Jsonl,
}

impl OutputFormat {
    /// The format a file's extension names: `.npy`, or `.jsonl` / `.ndjson`.
    pub fn from_extension(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "npy" => Some(OutputFormat::Npy),
            "jsonl" | "ndjson" => Some(OutputFormat::Jsonl),
            _ => None,
        }
    }
}

/// Takes each chunk's records and their vectors (row `i` for `records[i]`).
pub trait VectorSink {
    /// Writes one chunk.
    fn write_chunk(&mut self, records: &[Record], vectors: ArrayView2<'_, f32>) -> Result<()>;
}

impl<W: Write + Seek> VectorSink for RowWriter<W> {
    fn write_chunk(&mut self, _records: &[Record], vectors: ArrayView2<'_, f32>) -> Result<()> {
        self.append(vectors)
    }
}

/// Writes one JSON object per text (see [`OutputFormat::Jsonl`]).
pub struct JsonlWriter<W: Write> {
    out: W,
    origin: String,
    line: String,
}

impl<W: Write> JsonlWriter<W> {
    /// Writes to `out`; `origin` names it in error messages.
    pub fn new(out: W, origin: impl Into<String>) -> Self {
        JsonlWriter {
            out,
            origin: origin.into(),
            line: String::new(),
        }
    }

    /// Flushes and hands back the output.
    pub fn finish(mut self) -> Result<W> {
        self.out.flush().map_err(|e| Error::io(&self.origin, e))?;
        Ok(self.out)
    }

    /// The output line for one record: its object with the vector spliced in before
    /// the closing brace, so that its fields keep the input's order and spelling.
    fn format(&mut self, record: &Record, vector: ndarray::ArrayView1<'_, f32>) -> Result<()> {
        use std::fmt::Write as _;
        self.line.clear();
        match &record.object {
            Some(object) => {
                let fields: Map<String, Value> = serde_json::from_str(object)
                    .map_err(|e| Error::format(format!("line {}: {e}", record.line)))?;
                if fields.contains_key(EMBEDDING_FIELD) {
                    return Err(Error::value(format!(
                        "line {} already has an {EMBEDDING_FIELD:?} field, which the output would overwrite",
                        record.line
                    )));
                }
                let object = object.trim();
                // A valid object with at least the text's field: `{ ... }`.
                self.line.push_str(&object[..object.len() - 1]);
                self.line.push(',');
            }
            None => self.line.push('{'),
        }
        let _ = write!(self.line, "\"{EMBEDDING_FIELD}\":[");
        for (j, x) in vector.iter().enumerate() {
            if j > 0 {
                self.line.push(',');
            }
            // Shortest round-trip form of the f32; JSON has no NaN or infinity.
            if x.is_finite() {
                let _ = write!(self.line, "{x}");
            } else {
                self.line.push_str("null");
            }
        }
        self.line.push_str("]}\n");
        Ok(())
    }
}

impl<W: Write> VectorSink for JsonlWriter<W> {
    fn write_chunk(&mut self, records: &[Record], vectors: ArrayView2<'_, f32>) -> Result<()> {
        for (record, vector) in records.iter().zip(vectors.rows()) {
            self.format(record, vector)?;
            self.out
                .write_all(self.line.as_bytes())
                .map_err(|e| Error::io(&self.origin, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn record(line: u64, object: Option<&str>) -> Record {
        Record {
            line,
            text: "t".into(),
            object: object.map(str::to_owned),
        }
    }

    #[test]
    fn jsonl_keeps_the_input_object_or_writes_the_vector_alone() {
        let mut w = JsonlWriter::new(Vec::new(), "out.jsonl");
        let records = [
            record(1, Some(" {\"id\": 2, \"text\": \"t\"} ")),
            record(2, None),
        ];
        w.write_chunk(&records, array![[0.5f32, -1.0e-8], [f32::NAN, 3.0]].view())
            .unwrap();
        let text = String::from_utf8(w.finish().unwrap()).unwrap();
        assert_eq!(
            text,
            "{\"id\": 2, \"text\": \"t\",\"embedding\":[0.5,-0.00000001]}\n{\"embedding\":[null,3]}\n"
        );
        for line in text.lines() {
            serde_json::from_str::<Value>(line).unwrap();
        }
    }

    #[test]
    fn an_existing_embedding_field_is_refused() {
        let mut w = JsonlWriter::new(Vec::new(), "out.jsonl");
        let records = [record(4, Some("{\"text\": \"t\", \"embedding\": 1}"))];
        let err = w
            .write_chunk(&records, array![[1.0f32]].view())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 4 already has an \"embedding\" field, which the output would overwrite"
        );
    }

    #[test]
    fn formats_by_extension() {
        let f = |p: &str| OutputFormat::from_extension(Path::new(p));
        assert_eq!(f("a/b.NPY"), Some(OutputFormat::Npy));
        assert_eq!(f("b.jsonl"), Some(OutputFormat::Jsonl));
        assert_eq!(f("b.ndjson"), Some(OutputFormat::Jsonl));
        assert_eq!(f("b.csv"), None);
        assert_eq!(f("b"), None);
    }
}
