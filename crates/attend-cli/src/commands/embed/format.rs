//! `attend embed --format`: the formats of sentences printed and of a corpus's
//! output file, shared by both paths of the command.

/// `--format`: the sentence formats and the corpus formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EmbedFormat {
    /// Sentences: one line of numbers per sentence.
    Text,
    /// Sentences: one JSON object.
    Json,
    /// --output: a float32 .npy array.
    Npy,
    /// --output: one JSON object per text.
    Jsonl,
}

impl EmbedFormat {
    /// The flag value naming the format.
    pub fn name(self) -> &'static str {
        match self {
            EmbedFormat::Text => "text",
            EmbedFormat::Json => "json",
            EmbedFormat::Npy => "npy",
            EmbedFormat::Jsonl => "jsonl",
        }
    }
}
