//! How a unit's normalised output, held transposed in its scratch (`Oᵀ`: one value
//! column per row, one query per lane), reaches the call's output in each element
//! type the fused forward writes: f32 transposed straight into place, bf16 through
//! a short f32 strip rounded as it is stored (no f32 output of the whole call, and
//! no second pass over it to round).

use std::mem::MaybeUninit;

use ndarray::{s, ArrayView2, ArrayViewMut2};

use crate::element::bf16;
use crate::isa::transpose::transpose;
use crate::isa::{Simd, LANES};
use crate::kernels::round::round_into;

/// An element type of the fused forward's output.
pub(crate) trait Output: Copy + Send + Sync + 'static {
    /// The output of a query that sees no key.
    const ZERO: Self;

    /// Writes `ot` (`[Ev][rows]`) transposed into `out` (`[rows][Ev]`, row-major),
    /// every element of it; `spare` is scratch of at least `16 · 16` floats.
    ///
    /// # Panics
    /// If `out` does not hold `rows · Ev` elements or `spare` is shorter.
    fn write<I: Simd>(
        isa: I,
        ot: ArrayView2<'_, f32>,
        out: &mut [MaybeUninit<Self>],
        spare: &mut [f32],
    );
}

impl Output for f32 {
    const ZERO: f32 = 0.0;

    #[inline(always)]
    fn write<I: Simd>(
        isa: I,
        ot: ArrayView2<'_, f32>,
        out: &mut [MaybeUninit<f32>],
        _: &mut [f32],
    ) {
        let (ev, rows) = ot.dim();
        assert_eq!(out.len(), rows * ev, "an output of rows·ev floats");
        // SAFETY: `out` holds `rows·ev` floats (checked), contiguous, borrowed
        // mutably for the view's life; the transpose only writes through the view,
        // every element of it, so nothing uninitialised is read.
        let out = unsafe { ArrayViewMut2::from_shape_ptr((rows, ev), out.as_mut_ptr().cast()) };
        transpose(isa, ot, out);
    }
}

impl Output for bf16 {
    const ZERO: bf16 = bf16::ZERO;

    /// Sixteen queries at a time (as many value columns as `spare` holds for them):
    /// transposed into `spare`, then each query's row rounded into place.
    #[inline(always)]
    fn write<I: Simd>(
        isa: I,
        ot: ArrayView2<'_, f32>,
        out: &mut [MaybeUninit<bf16>],
        spare: &mut [f32],
    ) {
        let (ev, rows) = ot.dim();
        assert_eq!(out.len(), rows * ev, "an output of rows·ev values");
        let cols = spare.len() / LANES;
        assert!(cols >= LANES, "spare holds 16 rows of 16 floats");
        for r0 in (0..rows).step_by(LANES) {
            let nr = LANES.min(rows - r0);
            for c0 in (0..ev).step_by(cols) {
                let nc = cols.min(ev - c0);
                let strip = &mut spare[..nr * nc];
                let view = ArrayViewMut2::from_shape((nr, nc), &mut *strip).expect("nr·nc floats");
                transpose(isa, ot.slice(s![c0..c0 + nc, r0..r0 + nr]), view);
                for (r, row) in strip.chunks_exact(nc).enumerate() {
                    let at = (r0 + r) * ev + c0;
                    round_into(isa, row, &mut out[at..at + nc]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array2;

    use super::*;
    use crate::isa::{dispatch, Isa, SimdJob};

    /// Writes `ot` through `T::write` on `isa` with `spare` floats of scratch.
    struct Write<'a, T> {
        ot: ArrayView2<'a, f32>,
        spare: usize,
        out: &'a mut [MaybeUninit<T>],
    }

    impl<T: Output> SimdJob for Write<'_, T> {
        type Output = ();
        fn run<I: Simd>(self, isa: I) {
            T::write(isa, self.ot, self.out, &mut vec![0.0; self.spare]);
        }
    }

    /// Every element written, transposed and (for bf16) rounded as `bf16::from_f32`
    /// rounds, with odd shapes and a scratch of one 16 × 16 block, so that the
    /// queries come in strips with a short last one and the value columns in
    /// chunks with a short last one, on every instruction set.
    #[test]
    fn writes_every_element_transposed_on_every_isa() {
        let (ev, rows) = (40, 37);
        let ot = Array2::from_shape_fn((ev, rows), |(c, r)| {
            (c as f32 - 0.37 * r as f32) * 1.001_f32.powi((c * rows + r) as i32)
        });
        for isa in Isa::available() {
            let token = isa.token().expect("available");
            for spare in [LANES * LANES, 64 * LANES] {
                let mut out = vec![MaybeUninit::new(bf16::from_f32(f32::NAN)); rows * ev];
                dispatch(
                    token,
                    Write {
                        ot: ot.view(),
                        spare,
                        out: &mut out,
                    },
                );
                let mut wide = vec![MaybeUninit::new(f32::NAN); rows * ev];
                dispatch(
                    token,
                    Write {
                        ot: ot.view(),
                        spare,
                        out: &mut wide,
                    },
                );
                for r in 0..rows {
                    for c in 0..ev {
                        // SAFETY: initialised above, and written again by `write`.
                        let (got, wide) = unsafe {
                            (
                                out[r * ev + c].assume_init(),
                                wide[r * ev + c].assume_init(),
                            )
                        };
                        let want = ot[[c, r]];
                        assert_eq!(wide.to_bits(), want.to_bits(), "{isa:?} f32 ({r}, {c})");
                        assert_eq!(got, bf16::from_f32(want), "{isa:?} bf16 ({r}, {c})");
                    }
                }
            }
        }
    }
}
