//! Matrix transposes between a kernel's packed, lane-major scratch and the
//! caller's row-major tensors: the fused forward packs `Qᵀ` with one and writes
//! `Oᵀ` out with another, and its mask tiles are transposed with one.

use ndarray::{ArrayView2, ArrayViewMut2};

use crate::{Simd, LANES};

/// `dst[c, r] = src[r, c]` for an `R × C` `src` and a `C × R` `dst`, any strides.
///
/// When both sides have unit column strides, every block of up to 16 × 16 goes
/// through [`Simd::transpose16`], the edge blocks with partial loads and stores:
/// element by element, packing and writing out took about 5 % of the fused
/// forward's time at B1 H8 N512 d64 (docs/fused-forward.md), and the edges alone as
/// much at the 22-token sequences of a sentence encoder. Views with other strides
/// are copied one element at a time.
///
/// # Panics
/// If `dst`'s shape is not `src`'s reversed.
#[inline(always)]
pub fn transpose<I: Simd>(isa: I, src: ArrayView2<'_, f32>, mut dst: ArrayViewMut2<'_, f32>) {
    let (rows, cols) = src.dim();
    assert_eq!(dst.dim(), (cols, rows), "a transpose's shapes must match");
    if src.strides()[1] != 1 || dst.strides()[1] != 1 {
        for ((r, c), &x) in src.indexed_iter() {
            dst[[c, r]] = x;
        }
        return;
    }
    let (srs, drs) = (src.strides()[0], dst.strides()[0]);
    let zero = isa.splat(0.0);
    for r0 in (0..rows).step_by(LANES) {
        let nr = LANES.min(rows - r0);
        for c0 in (0..cols).step_by(LANES) {
            let nc = LANES.min(cols - c0);
            // SAFETY: rows `r0..r0 + nr` and columns `c0..c0 + nc` are inside `src`,
            // and rows `c0..c0 + nc`, columns `r0..r0 + nr` inside `dst`; both have
            // unit column strides, so each block row is `nc` (or `nr`) contiguous
            // floats, and only those are read or written.
            unsafe {
                let sp = src.as_ptr().offset(r0 as isize * srs + c0 as isize);
                let mut block: [I::V; LANES] = std::array::from_fn(|i| {
                    let row = sp.offset(i as isize * srs);
                    match (i < nr, nc == LANES) {
                        (false, _) => zero,
                        (true, true) => isa.load(row),
                        (true, false) => isa.load_part(row, nc),
                    }
                });
                isa.transpose16(&mut block);
                let dp = dst.as_mut_ptr().offset(c0 as isize * drs + r0 as isize);
                for (i, &v) in block.iter().enumerate().take(nc) {
                    let row = dp.offset(i as isize * drs);
                    if nr == LANES {
                        isa.store(row, v);
                    } else {
                        isa.store_part(row, v, nr);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{s, Array2};

    use super::*;
    use crate::{dispatch, Isa, SimdJob};

    /// Transposes `src` into a `dst` whose columns are `step` apart.
    struct Transpose<'a> {
        src: ArrayView2<'a, f32>,
        step: usize,
    }

    impl SimdJob for Transpose<'_> {
        type Output = Array2<f32>;
        #[inline(always)]
        fn run<I: Simd>(self, isa: I) -> Array2<f32> {
            let (r, c) = self.src.dim();
            let mut wide = Array2::from_elem((c, r * self.step), f32::NAN);
            transpose(isa, self.src, wide.slice_mut(s![.., ..;self.step]));
            wide.slice(s![.., ..;self.step]).to_owned()
        }
    }

    #[test]
    fn transposes_whole_blocks_edges_and_strided_views() {
        let big = Array2::from_shape_fn((37, 53), |(r, c)| (r * 100 + c) as f32);
        let views = [
            big.view(),
            big.slice(s![..32, ..48]),
            big.slice(s![3..35, 1..50]),
            big.slice(s![.., ..;2]),
            big.t(),
            big.slice(s![..0, ..]),
        ];
        for isa in Isa::available() {
            let token = isa.token().expect("available");
            for src in &views {
                for step in [1, 2] {
                    let got = dispatch(token, Transpose { src: *src, step });
                    assert_eq!(got, src.t(), "{isa:?}, {:?}, step {step}", src.dim());
                }
            }
        }
    }
}
