//! Tensor names under a prefix, for reading ([`Scope`]) and for writing
//! ([`ScopeMut`] into a [`StateDict`]).
//!
//! A checkpoint names a module's tensors by its path in the model
//! (`bert.encoder.layer.0.attention.self.query.weight`), and a module's reader
//! should not need to know that path: it is handed a scope and asks for `weight`.
//! Both sides compose prefixes here and nowhere else, the prefix including its
//! trailing dot (`"encoder.layer.0."`), so `""` is the root.

use ndarray::{Array1, Array2, ArrayD, ArrayViewD};

use super::SafeTensors;
use crate::Result;

/// The tensors of a [`SafeTensors`] file under one prefix, named without it.
///
/// A scope answers like the file would for the full names, so every error names
/// the file and the full tensor name.
///
/// ```
/// use attend_core::io::safetensors::{self, SafeTensors};
/// use ndarray::array;
///
/// let w = array![[1.0f32, 2.0]].into_dyn();
/// let bytes = safetensors::serialize(&[("bert.pooler.dense.weight", w.view())], None)?;
/// let file = SafeTensors::from_bytes(bytes, "memory")?;
/// let dense = file.scope("bert.").at("pooler.dense.");
/// assert_eq!(dense.tensor2("weight")?, array![[1.0f32, 2.0]]);
/// assert_eq!(dense.name("bias"), "bert.pooler.dense.bias");
/// let err = dense.tensor1("bias").unwrap_err().to_string();
/// assert_eq!(err, "memory: has no tensor named \"bert.pooler.dense.bias\"");
/// # Ok::<(), attend_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Scope<'a> {
    file: &'a SafeTensors,
    prefix: String,
}

impl SafeTensors {
    /// The tensors whose names start with `prefix`, named without it.
    pub fn scope(&self, prefix: &str) -> Scope<'_> {
        Scope {
            file: self,
            prefix: prefix.to_owned(),
        }
    }
}

impl<'a> Scope<'a> {
    /// The scope `prefix` inside this one.
    pub fn at(&self, prefix: &str) -> Scope<'a> {
        self.file.scope(&self.name(prefix))
    }

    /// The whole prefix, from the file's root.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The full name in the file of this scope's tensor `name`, for messages.
    pub fn name(&self, name: &str) -> String {
        join(&self.prefix, name)
    }

    /// Where the tensors came from (the file's [`origin`](SafeTensors::origin)).
    pub fn origin(&self) -> &'a str {
        self.file.origin()
    }

    /// Names of the tensors under the prefix, without it, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.file
            .names()
            .filter_map(|n| n.strip_prefix(self.prefix.as_str()))
    }

    /// Whether the tensor `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.file.contains(&self.name(name))
    }

    /// [`SafeTensors::check_finite`] of the tensor `name`.
    pub fn check_finite(&self, name: &str) -> Result<()> {
        self.file.check_finite(&self.name(name))
    }

    /// [`SafeTensors::tensor_shaped`] of the tensor `name`.
    pub fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<ArrayD<f32>> {
        self.file.tensor_shaped(&self.name(name), shape)
    }

    /// [`SafeTensors::tensor1`] of the tensor `name`.
    pub fn tensor1(&self, name: &str) -> Result<Array1<f32>> {
        self.file.tensor1(&self.name(name))
    }

    /// [`SafeTensors::tensor2`] of the tensor `name`.
    pub fn tensor2(&self, name: &str) -> Result<Array2<f32>> {
        self.file.tensor2(&self.name(name))
    }
}

/// Named tensors gathered to be written, in the order they were put.
///
/// ```
/// use attend_core::io::safetensors::{self, SafeTensors, StateDict};
/// use ndarray::array;
///
/// let mut dict = StateDict::default();
/// let mut encoder = dict.scope("bert.");
/// encoder.at("pooler.dense.").push("weight", array![[1.0f32, 2.0]].into_dyn());
/// let bytes = safetensors::serialize(&dict.views(), None)?;
/// let file = SafeTensors::from_bytes(bytes, "memory")?;
/// assert_eq!(file.names().collect::<Vec<_>>(), ["bert.pooler.dense.weight"]);
/// # Ok::<(), attend_core::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct StateDict {
    tensors: Vec<(String, ArrayD<f32>)>,
}

impl StateDict {
    /// A scope that puts tensors into this dict under `prefix`.
    pub fn scope(&mut self, prefix: &str) -> ScopeMut<'_> {
        ScopeMut {
            dict: self,
            prefix: prefix.to_owned(),
        }
    }

    /// The tensors by name, as [`serialize`](super::serialize) and
    /// [`write`](super::write) take them.
    pub fn views(&self) -> Vec<(&str, ArrayViewD<'_, f32>)> {
        self.tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.view()))
            .collect()
    }
}

/// Where a module's writer puts its tensors: a [`StateDict`] under one prefix.
#[derive(Debug)]
pub struct ScopeMut<'a> {
    dict: &'a mut StateDict,
    prefix: String,
}

impl ScopeMut<'_> {
    /// The scope `prefix` inside this one.
    pub fn at(&mut self, prefix: &str) -> ScopeMut<'_> {
        ScopeMut {
            prefix: join(&self.prefix, prefix),
            dict: &mut *self.dict,
        }
    }

    /// Puts `tensor` under the name `name` in this scope. Names are checked to be
    /// unique when the dict is [serialized](super::serialize).
    pub fn push(&mut self, name: &str, tensor: ArrayD<f32>) {
        self.dict.tensors.push((join(&self.prefix, name), tensor));
    }
}

/// The one way a prefix and a name make a full name: the prefix carries its
/// own separator, so the root is `""` and nothing is ever doubled or dropped.
fn join(prefix: &str, name: &str) -> String {
    format!("{prefix}{name}")
}
