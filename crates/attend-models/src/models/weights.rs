//! Reading an encoder's tensors from a checkpoint by name, under the prefix the
//! checkpoint stores them with (`bert.`, `roberta.`, … for a task model's file,
//! none for a bare encoder's), each checked against the shape the configuration
//! gives it.

use ndarray::Array2;

use super::family::{self, Family};
use attend_core::io::safetensors::{SafeTensors, Scope};
use attend_core::nn::state_dict::{load_layer_norm, load_linear};
use attend_core::nn::{LayerNorm, Linear};
use attend_core::{Error, Result};

/// A checkpoint's tensors of one family's encoder (or of a part of it), named
/// from the encoder's root: a scope of the file whose readers check shapes.
pub(crate) struct Weights<'a> {
    scope: Scope<'a>,
}

impl<'a> Weights<'a> {
    /// The encoder of `family` in `file`, with or without a task model's prefix;
    /// every tensor the encoder reads (embeddings and layers) is checked to be
    /// finite: NaN or infinite weights would give NaN embeddings that look like
    /// results.
    pub(crate) fn new(file: &'a SafeTensors, family: Family) -> Result<Self> {
        let scope = [file.scope(""), file.scope(family.prefix())]
            .into_iter()
            .find(|s| s.contains(family::WORD_EMBEDDINGS))
            .ok_or_else(|| {
                Error::format(format!(
                    "{}: no tensor {}: not a {} checkpoint",
                    file.origin(),
                    family::WORD_EMBEDDINGS,
                    family.model_type()
                ))
            })?;
        let layers_root = family.names().layers.split('.').next().unwrap_or_default();
        for part in [
            scope.at("embeddings."),
            scope.at(&format!("{layers_root}.")),
        ] {
            for name in part.names() {
                part.check_finite(name)?;
            }
        }
        Ok(Weights { scope })
    }

    /// The part of the encoder under `prefix` (with its trailing dot).
    pub(crate) fn at(&self, prefix: &str) -> Weights<'a> {
        Weights {
            scope: self.scope.at(prefix),
        }
    }

    /// The file's name, for messages.
    pub(crate) fn origin(&self) -> &str {
        self.scope.origin()
    }

    /// Whether the file has the tensor `name`.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.scope.contains(name)
    }

    /// The matrix `name`, which must be `[rows, cols]`.
    pub(crate) fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Array2<f32>> {
        Ok(self
            .scope
            .tensor_shaped(name, &[rows, cols])?
            .into_dimensionality()
            .expect("shape checked"))
    }

    /// The LayerNorm `name` of width `d`.
    pub(crate) fn norm(&self, name: &str, d: usize, eps: f32) -> Result<LayerNorm> {
        load_layer_norm(&self.scope.at(&format!("{name}.")), d, eps)
    }

    /// The dense layer `name` (`name.weight`, `name.bias`), which must be
    /// `out × inp` with a bias.
    pub(crate) fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Linear> {
        let scope = self.scope.at(&format!("{name}."));
        let l = load_linear(&scope)?;
        if l.weight.dim() != (out, inp) || l.bias.is_none() {
            return Err(Error::shape(format!(
                "{}: {} has shape {:?}, expected [{out}, {inp}] with a bias",
                self.origin(),
                scope.name("weight"),
                l.weight.shape()
            )));
        }
        Ok(l)
    }
}
