//! Reading an encoder's tensors from a checkpoint by name, under the prefix the
//! checkpoint stores them with (`bert.`, `roberta.`, … for a task model's file,
//! none for a bare encoder's), each checked against the shape the configuration
//! gives it.

use ndarray::{Array1, Array2};

use super::family::{self, Family};
use attend_core::io::safetensors::SafeTensors;
use attend_core::nn::state_dict::load_linear;
use attend_core::nn::{LayerNorm, Linear};
use attend_core::{Error, Result};

/// A checkpoint's tensors of one family's encoder, named without the prefix.
pub(crate) struct Weights<'a> {
    file: &'a SafeTensors,
    /// What precedes the encoder's names in the file: `""` or the family's prefix.
    root: &'static str,
}

impl<'a> Weights<'a> {
    /// The encoder of `family` in `file`, with or without a task model's prefix;
    /// every tensor the encoder reads (embeddings and layers) is checked to be
    /// finite: NaN or infinite weights would give NaN embeddings that look like
    /// results.
    pub(crate) fn new(file: &'a SafeTensors, family: Family) -> Result<Self> {
        let root = if file.contains(family::WORD_EMBEDDINGS) {
            ""
        } else if file.contains(&format!("{}{}", family.prefix(), family::WORD_EMBEDDINGS)) {
            family.prefix()
        } else {
            return Err(Error::format(format!(
                "{}: no tensor {}: not a {} checkpoint",
                file.origin(),
                family::WORD_EMBEDDINGS,
                family.model_type()
            )));
        };
        let layers_root = family.names().layers.split('.').next().unwrap_or_default();
        let used = [
            format!("{root}embeddings."),
            format!("{root}{layers_root}."),
        ];
        for name in file.names() {
            if used.iter().any(|p| name.starts_with(p.as_str())) {
                file.check_finite(name)?;
            }
        }
        Ok(Weights { file, root })
    }

    /// The file's name, for messages.
    pub(crate) fn origin(&self) -> &str {
        self.file.origin()
    }

    /// Whether the file has the tensor `name`.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.file.contains(&format!("{}{name}", self.root))
    }

    /// The matrix `name`, which must be `[rows, cols]`.
    pub(crate) fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Array2<f32>> {
        let full = format!("{}{name}", self.root);
        self.file
            .tensor_shaped(&full, &[rows, cols])?
            .into_dimensionality()
            .map_err(|_| Error::shape(format!("{}: {full}: expected two axes", self.origin())))
    }

    /// The vector `name`, which must have `len` entries.
    fn vector(&self, name: &str, len: usize) -> Result<Array1<f32>> {
        Ok(self
            .file
            .tensor_shaped(name, &[len])?
            .into_dimensionality()
            .expect("checked"))
    }

    /// The LayerNorm `prefix` of width `d`.
    pub(crate) fn norm(&self, prefix: &str, d: usize, eps: f32) -> Result<LayerNorm> {
        // Old checkpoints call the LayerNorm parameters gamma and beta.
        let pick = |a: &str, b: &str| {
            let first = format!("{}{prefix}.{a}", self.root);
            if self.file.contains(&first) {
                first
            } else {
                format!("{}{prefix}.{b}", self.root)
            }
        };
        let w = self.vector(&pick("weight", "gamma"), d)?;
        let b = self.vector(&pick("bias", "beta"), d)?;
        // LayerNorm's own checks know the tensors but not the file.
        LayerNorm::new(w, b, eps).map_err(|e| e.context(self.origin()))
    }

    /// The dense layer `prefix` (`prefix.weight`, `prefix.bias`), which must be
    /// `out × inp` with a bias.
    pub(crate) fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
        let root = self.root;
        let l = load_linear(self.file, &format!("{root}{prefix}."))?;
        if l.weight.dim() != (out, inp) || l.bias.is_none() {
            return Err(Error::shape(format!(
                "{}: {root}{prefix}.weight has shape {:?}, expected [{out}, {inp}] with a bias",
                self.origin(),
                l.weight.shape()
            )));
        }
        Ok(l)
    }
}
