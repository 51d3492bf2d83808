//! How a unit's output, held transposed and unnormalised in its scratch (`Oᵀ`: one
//! value column per row, one query per lane), reaches the call's output in each
//! element type the fused forward writes: in one pass of 16 × 16 blocks, each
//! multiplied by its queries' reciprocal sums, transposed in registers and stored
//! in the output's type (f32 as it is, bf16 rounded). Three passes before (the
//! divisions in place, a transpose through a strip of scratch, the rounding) took
//! 2.4 % of a causal bf16 N2048's samples at one thread (docs/bf16.md).

use std::mem::MaybeUninit;

use crate::element::bf16;
use crate::isa::{Simd, LANES};
use crate::kernels::round::round_into;

/// An element type of the fused forward's output.
pub(crate) trait Output: Copy + Send + Sync + 'static {
    /// The output of a query that sees no key.
    const ZERO: Self;

    /// Stores the first `n ≤ 16` lanes of `x` at `p`, in this type.
    ///
    /// # Safety
    /// `p` valid for writing `n` elements.
    unsafe fn store<I: Simd>(isa: I, p: *mut MaybeUninit<Self>, x: I::V, n: usize);
}

impl Output for f32 {
    const ZERO: f32 = 0.0;

    #[inline(always)]
    unsafe fn store<I: Simd>(isa: I, p: *mut MaybeUninit<f32>, x: I::V, n: usize) {
        // SAFETY: `p` holds `n` floats (the caller's contract).
        unsafe {
            if n == LANES {
                isa.store(p.cast(), x);
            } else {
                isa.store_part(p.cast(), x, n);
            }
        }
    }
}

impl Output for bf16 {
    const ZERO: bf16 = bf16::ZERO;

    /// Rounded to nearest, ties to even, as `bf16::from_f32` rounds (subnormals
    /// kept).
    #[inline(always)]
    unsafe fn store<I: Simd>(isa: I, p: *mut MaybeUninit<bf16>, x: I::V, n: usize) {
        // SAFETY: `p` holds `n` bf16 (the caller's contract), each its `u16` bits.
        unsafe {
            if n == LANES {
                isa.store_bf16(p.cast(), x);
            } else {
                let mut wide = [0.0; LANES];
                isa.store(wide.as_mut_ptr(), x);
                round_into(isa, &wide[..n], std::slice::from_raw_parts_mut(p, n));
            }
        }
    }
}

/// Writes `out[r][c] = ot[c][r] · (1 / l[r])` for the unit's `rows` queries and `Ev =
/// out.len() / rows` value columns, every element of `out` (`[rows][Ev]`,
/// row-major), in its element type; `ot` holds `Ev` rows of `w` lanes and `l` `w`
/// sums.
///
/// One division per 16 queries, then a multiplication per element: dividing every
/// element took 2–3 % of a causal bf16 N2048 at one thread (a product differs from
/// the quotient by at most two f32 units in the last place). Each 16 × 16 block is scaled
/// whole, then transposed in registers: whole vectors, so that a unit of 22 queries
/// leaves no scalar tail (one took a tenth of such a unit's time). Lanes past the
/// last query and columns past the last are computed but never stored.
///
/// # Panics
/// If `ot` or `l` is shorter than that, `w` is not a multiple of 16 or `rows > w`.
#[inline(always)]
pub(crate) fn write_normalised<I: Simd, T: Output>(
    isa: I,
    (ot, w): (&[f32], usize),
    l: &[f32],
    rows: usize,
    out: &mut [MaybeUninit<T>],
) {
    let ev = out.len() / rows.max(1);
    assert!(
        w % LANES == 0 && rows <= w,
        "rows within whole vectors of lanes"
    );
    assert!(
        ot.len() >= ev * w && l.len() >= w,
        "Ev rows of w lanes and w sums"
    );
    assert_eq!(out.len(), rows * ev, "an output of rows·Ev elements");
    let to = out.as_mut_ptr();
    for r0 in (0..rows).step_by(LANES) {
        let nr = LANES.min(rows - r0);
        // SAFETY: lanes `r0..r0 + 16` are inside `l` and each row of `ot` (`w` is a
        // whole number of vectors past `r0 < rows ≤ w`), rows `c0 + k < Ev` inside
        // `ot`, and the stores cover columns `c0..c0 + nc < Ev` of rows `r0 + k <
        // rows` of `out` (all checked above).
        unsafe {
            let inv = isa.div(isa.splat(1.0), isa.load(l.as_ptr().add(r0)));
            for c0 in (0..ev).step_by(LANES) {
                let nc = LANES.min(ev - c0);
                let column = ot.as_ptr().add(c0 * w + r0);
                let row = to.add(r0 * ev + c0);
                // Whole blocks apart, with loops of fixed length: the block stays in
                // registers (loops of `nc` and `nr` kept it on the stack). No
                // closures: each is a function of its own, compiled without the
                // instruction set's features unless inlined (on AVX2 they were not).
                if nc == LANES && nr == LANES {
                    let mut block = [isa.splat(0.0); LANES];
                    for (k, v) in block.iter_mut().enumerate() {
                        *v = isa.mul(isa.load(column.add(k * w)), inv);
                    }
                    isa.transpose16(&mut block);
                    for (k, v) in block.into_iter().enumerate() {
                        T::store(isa, row.add(k * ev), v, LANES);
                    }
                } else {
                    let mut block = [isa.splat(0.0); LANES];
                    for (k, v) in block.iter_mut().enumerate().take(nc) {
                        *v = isa.mul(isa.load(column.add(k * w)), inv);
                    }
                    isa.transpose16(&mut block);
                    for (k, v) in block.into_iter().enumerate().take(nr) {
                        T::store(isa, row.add(k * ev), v, nc);
                    }
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

    /// Writes `ot` (`[Ev][w]`) normalised by `l` through [`write_normalised`] for
    /// `rows` queries.
    struct Write<'a, T> {
        ot: &'a Array2<f32>,
        l: &'a [f32],
        out: &'a mut [MaybeUninit<T>],
    }

    impl<T: Output> SimdJob for Write<'_, T> {
        type Output = ();
        fn run<I: Simd>(self, isa: I) {
            let (ev, w) = self.ot.dim();
            let rows = self.out.len() / ev;
            let ot = self.ot.as_slice().expect("standard layout");
            write_normalised(isa, (ot, w), self.l, rows, self.out);
        }
    }

    /// Every element written, times its query's reciprocal sum, transposed and (for bf16)
    /// rounded as `bf16::from_f32` rounds, on every instruction set: 37 queries
    /// (a short last strip of 16) of 40 value columns (a short last block), with
    /// lanes past the last query whose zero sums must not reach the output.
    #[test]
    fn writes_every_element_normalised_and_transposed_on_every_isa() {
        let (ev, rows, w) = (40, 37, 48);
        let ot = Array2::from_shape_fn((ev, w), |(c, r)| {
            (c as f32 - 0.37 * r as f32) * 1.001_f32.powi((c * w + r) as i32)
        });
        let l: Vec<f32> = (0..w)
            .map(|r| if r < rows { 0.75 + r as f32 / 7.0 } else { 0.0 })
            .collect();
        for isa in Isa::available() {
            let token = isa.token().expect("available");
            let mut out = vec![MaybeUninit::new(bf16::from_f32(f32::NAN)); rows * ev];
            dispatch(
                token,
                Write {
                    ot: &ot,
                    l: &l,
                    out: &mut out,
                },
            );
            let mut wide = vec![MaybeUninit::new(f32::NAN); rows * ev];
            dispatch(
                token,
                Write {
                    ot: &ot,
                    l: &l,
                    out: &mut wide,
                },
            );
            for r in 0..rows {
                for c in 0..ev {
                    // SAFETY: initialised above, and written again by `write_normalised`.
                    let (got, wide) = unsafe {
                        (
                            out[r * ev + c].assume_init(),
                            wide[r * ev + c].assume_init(),
                        )
                    };
                    let want = ot[[c, r]] * (1.0 / l[r]);
                    assert_eq!(wide.to_bits(), want.to_bits(), "{isa:?} f32 ({r}, {c})");
                    assert_eq!(got, bf16::from_f32(want), "{isa:?} bf16 ({r}, {c})");
                }
            }
        }
    }
}
