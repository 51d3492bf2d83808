//! The engine: token sequences in, vectors out. It is the one call every front
//! end makes once it has token ids — `attend embed` (sentences and corpora), the
//! Python `SentenceEncoder` and `attend serve`'s batching scheduler — so how a
//! batch is computed (packed rows, sequence groups over the thread pool, pooling)
//! is decided here and nowhere else. It needs no tokenizer: a server tokenises
//! on threads of its own and hands the engine whole batches.

use ndarray::{s, Array2};

use super::{BertModel, SentenceModules, TokenBatch};
use attend_core::{Error, Result};

/// One tokenised text: its ids and token-type ids, special tokens included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sequence<'a> {
    /// Token ids.
    pub ids: &'a [u32],
    /// Token-type (segment) ids, as many as `ids`.
    pub type_ids: &'a [u32],
}

/// An encoder and the sentence-transformers modules after it, borrowed: what
/// turns batches of [`Sequence`]s into sentence vectors or token vectors.
///
/// ```no_run
/// use attend_models::models::{Engine, Sequence, SentenceEncoder};
///
/// let encoder = SentenceEncoder::load("/path/to/all-minilm-l6-v2")?;
/// let engine: Engine<'_> = encoder.engine();
/// let tok = encoder.tokenizer.encode("A cat sat on the mat.")?;
/// let vectors = engine.embed(&[Sequence::from(&tok)])?;
/// assert_eq!(vectors.shape(), &[1, engine.dimension()]);
/// # Ok::<(), attend_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Engine<'a> {
    /// The encoder.
    pub model: &'a BertModel,
    /// Pooling, Dense layers and normalisation.
    pub modules: &'a SentenceModules,
}

impl Engine<'_> {
    /// The width of the sentence vectors.
    pub fn dimension(&self) -> usize {
        self.modules.dimension(self.model.config.hidden_size)
    }

    /// The width of the token vectors (the encoder's hidden size).
    pub fn hidden_size(&self) -> usize {
        self.model.config.hidden_size
    }

    /// Sentence vectors `[seqs.len(), dimension]`: the encoder on the sequences'
    /// real tokens only (a sequence's vector does not depend on the others in
    /// the batch), then pooling, the Dense layers and normalisation.
    pub fn embed(&self, seqs: &[Sequence<'_>]) -> Result<Array2<f32>> {
        if seqs.is_empty() {
            return Ok(Array2::zeros((0, self.dimension())));
        }
        let batch = self.batch(seqs)?;
        let hidden = self.model.forward(&batch)?;
        self.modules.apply(hidden.view(), &batch.lengths)
    }

    /// The last hidden state of each sequence, `[len, hidden_size]` each, before
    /// any pooling (TEI's `/embed_all`).
    pub fn token_vectors(&self, seqs: &[Sequence<'_>]) -> Result<Vec<Array2<f32>>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let batch = self.batch(seqs)?;
        let hidden = self.model.forward(&batch)?;
        Ok(batch
            .lengths
            .iter()
            .enumerate()
            .map(|(i, &len)| hidden.slice(s![i, ..len, ..]).to_owned())
            .collect())
    }

    /// The sequences as one batch padded with the model's padding id, as
    /// [`BertModel::forward`] and [`BertModel::trace`] take it; a sequence without
    /// tokens is refused (pooling over nothing has no value).
    pub fn batch(&self, seqs: &[Sequence<'_>]) -> Result<TokenBatch> {
        if let Some(i) = seqs.iter().position(|s| s.ids.is_empty()) {
            return Err(Error::value(format!(
                "sequence {i} has no tokens: every sequence needs at least one"
            )));
        }
        let owned: Vec<(Vec<u32>, Vec<u32>)> = seqs
            .iter()
            .map(|s| (s.ids.to_vec(), s.type_ids.to_vec()))
            .collect();
        TokenBatch::from_sequences(&owned, self.model.config.pad_token_id as u32)
    }
}
