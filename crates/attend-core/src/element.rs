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

use crate::isa::IsaToken;
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

/// `a` widened to f32, in standard layout; a contiguous `a` in vectorised chunks
/// on the current rayon pool.
pub fn to_f32<T: Element, D: Dimension>(a: ArrayView<'_, T, D>) -> Array<f32, D> {
    convert(IsaToken::best(), a, T::to_f32)
}

/// [`to_f32`] with `isa`'s vectors (a kernel's own instruction set, which a
/// caller may have capped below the best).
pub(crate) fn to_f32_on<T: Element, D: Dimension>(
    isa: IsaToken,
    a: ArrayView<'_, T, D>,
) -> Array<f32, D> {
    convert(isa, a, T::to_f32)
}

/// `a` rounded to `T` (to nearest, ties to even), in standard layout; a
/// contiguous `a` in vectorised chunks on the current rayon pool.
pub fn from_f32<T: Element, D: Dimension>(a: ArrayView<'_, f32, D>) -> Array<T, D> {
    convert(IsaToken::best(), a, T::from_f32)
}

/// [`from_f32`] with `isa`'s vectors, as [`to_f32_on`].
pub(crate) fn from_f32_on<T: Element, D: Dimension>(
    isa: IsaToken,
    a: ArrayView<'_, f32, D>,
) -> Array<T, D> {
    convert(isa, a, T::from_f32)
}

/// Elements converted per task: large enough that a task's overhead is nothing
/// beside it, small enough that both threads share a short tensor.
const CONVERT_CHUNK: usize = 1 << 14;

/// `a` mapped element by element through `f`, in standard layout. A contiguous
/// `a` is converted in chunks on the current rayon pool, each compiled for `isa`
/// so that the loop is vectorised: the bf16 backward of the
/// Python binding and of `attend bench` widens five tensors and rounds three
/// gradients, each a serial pass element by element before (docs/bf16.md).
fn convert<A, B, D>(isa: IsaToken, a: ArrayView<'_, A, D>, f: impl Fn(A) -> B + Sync) -> Array<B, D>
where
    A: Copy + Sync,
    B: Send,
    D: Dimension,
{
    use rayon::prelude::*;
    use std::mem::MaybeUninit;

    let Some(src) = a.as_slice() else {
        return a.mapv(f);
    };
    // Written uninitialised: every value is set below.
    let mut values: Vec<B> = Vec::with_capacity(src.len());
    values.spare_capacity_mut()[..src.len()]
        .par_chunks_mut(CONVERT_CHUNK)
        .zip(src.par_chunks(CONVERT_CHUNK))
        .for_each(|(dst, src): (&mut [MaybeUninit<B>], &[A])| {
            crate::isa::dispatch(
                isa,
                crate::isa::Scalar(|| {
                    for (d, &s) in dst.iter_mut().zip(src) {
                        d.write(f(s));
                    }
                }),
            )
        });
    // SAFETY: the chunks cover the first `src.len()` values, each written above.
    unsafe { values.set_len(src.len()) };
    Array::from_shape_vec(a.raw_dim(), values).expect("one value per element")
}

/// `a` rounded to bf16 and widened back: the f32 numbers a bf16 tensor holds
/// (PyTorch's `t.to(torch.bfloat16).float()`).
pub fn round_to_bf16<D: Dimension>(a: ArrayView<'_, f32, D>) -> Array<f32, D> {
    convert(IsaToken::best(), a, |x| bf16::from_f32(x).to_f32())
}

pub(crate) mod sealed {
    use ndarray::{Array3, Array4, ArrayView3, ArrayView4};

    use crate::config::Config;
    use crate::isa::IsaToken;
    use crate::problem::{Dropout, Problem};
    use crate::Result;

    /// Keeps [`super::Element`] to the types the kernels exist for, and carries the
    /// kernels of each (implemented beside the dispatch, in `crate::attention`).
    pub trait Sealed: Sized {
        /// Computes a checked problem: the attention output and the log-sum-exp,
        /// `[value, residual]` (`kernels::lse::LogSumExp`'s parts).
        fn compute(p: &Problem<'_, Self>, config: &Config) -> Result<Computed<Self>>;
        /// The fused backward of a checked problem on the current rayon pool
        /// (`kernels::backward::fused::run`, which reads this type).
        fn fused_backward(
            p: &Problem<'_, Self>,
            out: ArrayView4<'_, Self>,
            lse: (ArrayView3<'_, f32>, Option<ArrayView3<'_, f32>>),
            dout: ArrayView4<'_, Self>,
            dropout: Option<&Dropout>,
            want_ds: bool,
            isa: IsaToken,
        ) -> FusedBackward<Self>;
    }

    /// What [`Sealed::fused_backward`] returns: the gradients `[dq, dk, dv]` and,
    /// where asked for, the scores' gradient `[B, H, L, S]`.
    pub type FusedBackward<T> = ([Array4<T>; 3], Option<Array4<f32>>);

    /// What [`Sealed::compute`] returns.
    pub type Computed<T> = (Array4<T>, [Array3<f32>; 2]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{s, Array1, Array2};

    /// f32 numbers of every kind a bf16 rounding meets: ties either way, NaN,
    /// infinities, subnormals, the largest finite, and ordinary values, repeated
    /// past several chunks with an odd tail.
    fn numbers() -> Array1<f32> {
        let kinds = [
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            f32::from_bits(1),
            -f32::from_bits(0x007F_FFFF),
            f32::MAX,
            -0.0,
            0.1,
            -3.3e7,
        ];
        Array1::from_shape_fn(3 * CONVERT_CHUNK + 7, |i| {
            kinds[i % kinds.len()] * if i % 2 == 0 { 1.0 } else { 1.5 }
        })
    }

    fn same_bits(a: &[f32], b: impl Iterator<Item = f32>) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "element {i}");
        }
    }

    #[test]
    fn conversions_are_the_elements_own_in_every_chunk_and_layout() {
        let x = numbers();
        let rounded: Array1<bf16> = from_f32(x.view());
        assert_eq!(rounded.len(), x.len());
        for (i, (r, &v)) in rounded.iter().zip(&x).enumerate() {
            assert_eq!(r.to_bits(), bf16::from_f32(v).to_bits(), "element {i}");
        }
        let widened = to_f32(rounded.view());
        same_bits(
            widened.as_slice().unwrap(),
            rounded.iter().map(|r| r.to_f32()),
        );
        let both = round_to_bf16(x.view());
        same_bits(both.as_slice().unwrap(), widened.iter().copied());
        // A strided view (not contiguous) converts the same, into standard layout.
        let grid =
            Array2::from_shape_vec((x.len() / 3, 3), x.slice(s![..x.len() / 3 * 3]).to_vec())
                .unwrap();
        let column = grid.slice(s![.., 1]);
        let strided: Array1<bf16> = from_f32(column);
        for (r, &v) in strided.iter().zip(column.iter()) {
            assert_eq!(r.to_bits(), bf16::from_f32(v).to_bits());
        }
    }
}
