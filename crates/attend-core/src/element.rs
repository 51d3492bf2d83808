//! The element types attention takes: `f32` and bfloat16 ([`bf16`], from the
//! `half` crate).
//!
//! bf16 keeps f32's exponent range with an 8-bit significand, so a product of two
//! bf16 numbers is exact in f32. The bf16 kernels multiply bf16 numbers and add in
//! f32, as PyTorch's autocast does; the softmax statistics stay f32 and the output
//! is rounded to bf16 once, at the end (docs/design.md, "Precision").
//!
//! ```
//! use attend_core::attention::{attention, AttentionOptions};
//! use attend_core::element::bf16;
//! use ndarray::Array4;
//!
//! let q = Array4::from_elem((1, 2, 3, 4), bf16::from_f32(0.5));
//! let out = attention(q.view(), q.view(), q.view(), &AttentionOptions::default())?;
//! assert_eq!(out[[0, 1, 2, 3]], bf16::from_f32(0.5));
//! # Ok::<(), attend_core::Error>(())
//! ```

use ndarray::{Array, ArrayView, Dimension};

pub use half::bf16;

use crate::{Error, Result};

/// A tensor's element type, by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE single precision.
    #[default]
    F32,
    /// bfloat16: f32's exponent, 8 significant bits.
    Bf16,
}

impl Dtype {
    /// Every dtype.
    pub const ALL: [Dtype; 2] = [Dtype::F32, Dtype::Bf16];

    /// Lower-case name, as NumPy and PyTorch spell it (`float32`, `bfloat16`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::Bf16 => "bfloat16",
        }
    }

    /// The dtype named `name`: `f32`/`float32` or `bf16`/`bfloat16`; an error
    /// listing these otherwise.
    pub fn from_name(name: &str) -> Result<Dtype> {
        match name {
            "f32" | "float32" => Ok(Dtype::F32),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            _ => Err(Error::value(format!(
                "unknown dtype {name:?}; expected f32 (float32) or bf16 (bfloat16)"
            ))),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type the attention functions take: `f32` or [`bf16`].
///
/// Sealed: the kernels exist for these two only.
pub trait Element:
    Copy + Default + Send + Sync + std::fmt::Debug + PartialEq + 'static + sealed::Sealed
{
    /// This type's [`Dtype`].
    const DTYPE: Dtype;
    /// Widens to f32 (exact for both types).
    fn to_f32(self) -> f32;
    /// Rounds an f32 to this type: to nearest, ties to even (as PyTorch's
    /// `tensor.to(dtype)`).
    fn from_f32(x: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Element for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// `a` widened to f32, in standard layout.
pub fn to_f32<T: Element, D: Dimension>(a: ArrayView<'_, T, D>) -> Array<f32, D> {
    a.mapv(T::to_f32)
}

/// `a` rounded to `T` (to nearest, ties to even), in standard layout.
pub fn from_f32<T: Element, D: Dimension>(a: ArrayView<'_, f32, D>) -> Array<T, D> {
    a.mapv(T::from_f32)
}

/// `a` rounded to bf16 and widened back: the f32 numbers a bf16 tensor holds
/// (PyTorch's `t.to(torch.bfloat16).float()`).
pub fn round_to_bf16<D: Dimension>(a: ArrayView<'_, f32, D>) -> Array<f32, D> {
    a.mapv(|x| bf16::from_f32(x).to_f32())
}

pub(crate) mod sealed {
    use ndarray::{Array3, Array4};

    use crate::config::Config;
    use crate::problem::Problem;
    use crate::Result;

    /// Keeps [`super::Element`] to the types the kernels exist for, and carries the
    /// kernels of each (implemented beside the dispatch, in `crate::attention`).
    pub trait Sealed: Sized {
        /// Computes a checked problem: the attention output and the log-sum-exp,
        /// `[value, residual]` (`kernels::lse::LogSumExp`'s parts).
        fn compute(p: &Problem<'_, Self>, config: &Config) -> Result<Computed<Self>>;
    }

    /// What [`Sealed::compute`] returns.
    pub type Computed<T> = (Array4<T>, [Array3<f32>; 2]);
}
