//! The dense layers' product in bf16: `y = act(x · wᵀ + bias)` with `x` and `w`
//! rounded to bf16 (to nearest, ties to even), products of bf16 numbers and f32
//! sums, as PyTorch's autocast to bf16 computes a `Linear`.
//!
//! [`Simd::dot2`] multiplies two vectors of bf16 *pairs* lane by lane, so both
//! operands are paired along the sum (`k`): the weight is rounded and packed once,
//! at load ([`PackedBf16`], `Linear::for_inference_with`), as the f32 product's
//! 16-output panels with each row a pair of adjacent `k` (`[k/2][16]` pairs, half
//! the bytes of the f32 panel); each call rounds the rows of `x` and packs them as
//! pairs of adjacent columns (`[m][k/2]`), and the 6 × 16 tile broadcasts one
//! pair of a row against a row of the panel. AVX512-BF16 does a pair in one
//! `vdpbf16ps`; the other instruction sets in two fused multiply-adds, to the same
//! sums (a product of bf16 numbers is exact in f32). An odd `k` ends with a pair
//! whose high half is zero in both operands.
//!
//! The blocking, the bias, the fused activation and the split into blocks are the
//! f32 product's, so a row's result depends neither on the batch nor on the thread
//! count; the partial sums run over a whole block of the sum (the f32 sum's error
//! is far below the bf16 operands' rounding).
//!
//! Where the instruction set has no bf16 products of its own
//! ([`Isa::has_bf16_products`](crate::isa::Isa::has_bf16_products)) and the rows
//! are more than a few, the pairs are widened to f32 once per call (a shift, exact)
//! and the f32 product runs on them ([`linear_widened`]): each pair's `dot2` there
//! is two fused multiply-adds behind the shifts that widen its pairs, which made
//! the bf16 layers 1.4× slower than f32 ones on AVX2. The widened product adds the
//! same products in the same order (each pair's high half first, the pairs'
//! partial sums and blocks), so every instruction set still gives the same bits;
//! the weight stays in bf16 between calls, widened for the call's duration.

use std::mem::MaybeUninit;

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use super::{bias_only, Epilogue, Init, Operands, Problem, Tile, FEW_ROWS, KC, NR, PARALLEL_MIN};
use crate::isa::{bf16_bits, dispatch, IsaToken, Scalar, Simd};
use crate::kernels::tile;
use crate::memory::LargePageArray;

/// Pairs in a row of `k` numbers.
fn pairs(k: usize) -> usize {
    k.div_ceil(2)
}

/// `act(x · wᵀ + bias)` in bf16 for `x [m, k]` (any strides) and the weight
/// packed in `w`, `bias [n]`. Runs on the best instruction set of this CPU,
/// whichever it is.
pub(crate) fn linear_bf16(
    x: ArrayView2<'_, f32>,
    w: &PackedBf16,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
) -> Array2<f32> {
    linear_bf16_on(IsaToken::best(), x, w, bias, epilogue)
}

/// [`linear_bf16`] on the instruction set `isa`.
fn linear_bf16_on(
    isa: IsaToken,
    x: ArrayView2<'_, f32>,
    w: &PackedBf16,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
) -> Array2<f32> {
    // A few rows read each weight once, from memory: there the pairs' half of the
    // f32 bytes outweighs their shifts.
    let widen = !isa.isa().has_bf16_products() && x.nrows() > FEW_ROWS;
    product(isa, x, w, bias, epilogue, widen)
}

/// [`linear_bf16_on`] on pairs, or with `widen` on the pairs widened to f32
/// ([`linear_widened`]): the same bits either way.
fn product(
    isa: IsaToken,
    x: ArrayView2<'_, f32>,
    w: &PackedBf16,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
    widen: bool,
) -> Array2<f32> {
    let (m, k) = x.dim();
    let n = w.n;
    assert_eq!(w.k, k, "inner dimensions");
    assert!(bias.is_none_or(|b| b.len() == n), "bias length");
    if m == 0 || n == 0 || k == 0 {
        return bias_only(m, n, bias, epilogue);
    }
    let parallel = m * n * k >= PARALLEL_MIN && rayon::current_num_threads() > 1;
    let xp = pack_rows(isa, x, parallel);
    if widen {
        return linear_widened(isa, (&xp, m), w, bias, epilogue, parallel);
    }
    let operands = PairOperands {
        x: &xp,
        lda: pairs(k),
        w,
    };
    let problem = Problem {
        n,
        bias,
        epilogue,
        operands: &operands,
    };
    problem.run(isa, m, parallel)
}

/// [`linear_bf16_on`] through the f32 product: the rows' pairs `xp` (`m` rows) and
/// the weight's widened to f32, each pair's high half first as [`Simd::dot2`]
/// adds them, and summed in the pairs' partial sums and blocks
/// ([`WidenedOperands`]): the same additions in the same order, so the same bits
/// as the pairs' product.
fn linear_widened(
    isa: IsaToken,
    (xp, m): (&[u32], usize),
    w: &PackedBf16,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
    parallel: bool,
) -> Array2<f32> {
    let operands = WidenedOperands {
        // Rows of `x` pair by pair: `[m][2·⌈k/2⌉]`.
        x: &widen_words(isa, xp, 1, parallel),
        lda: 2 * pairs(w.k),
        // Each panel's row of 16 pairs becomes two rows of 16 floats, its highs
        // then its lows: `[panels][2·⌈k/2⌉][16]`.
        panels: &widen_words(isa, &w.data, NR, parallel),
    };
    debug_assert_eq!(operands.x.len(), m * operands.lda);
    let problem = Problem {
        n: w.n,
        bias,
        epilogue,
        operands: &operands,
    };
    problem.run(isa, m, parallel)
}

/// Words of bf16 pairs widened to f32 in runs of `run` words: each run becomes
/// its words' high halves, then their low halves (a run of 1 is a row's pair; a
/// run of 16 a panel's row). Exact: a mask and a shift.
fn widen_words(isa: IsaToken, words: &[u32], run: usize, parallel: bool) -> Vec<f32> {
    // Runs per task: enough that a task's overhead is nothing beside it.
    let chunk = (1 << 14) / run * run;
    let mut out = Vec::with_capacity(2 * words.len());
    let widen = |(dst, src): (&mut [MaybeUninit<f32>], &[u32])| {
        dispatch(
            isa,
            Scalar(|| {
                for (d, s) in dst.chunks_exact_mut(2 * run).zip(src.chunks_exact(run)) {
                    let (high, low) = d.split_at_mut(run);
                    for ((h, l), &word) in high.iter_mut().zip(low).zip(s) {
                        h.write(f32::from_bits(word & 0xFFFF_0000));
                        l.write(f32::from_bits(word << 16));
                    }
                }
            }),
        )
    };
    let dst = &mut out.spare_capacity_mut()[..2 * words.len()];
    if parallel {
        dst.par_chunks_mut(2 * chunk)
            .zip(words.par_chunks(chunk))
            .for_each(widen);
    } else {
        dst.chunks_mut(2 * chunk)
            .zip(words.chunks(chunk))
            .for_each(widen);
    }
    // SAFETY: `words.len()` is a whole number of runs (rows of pairs, panels of 16
    // lanes), each widened into `2·run` floats above.
    unsafe { out.set_len(2 * words.len()) };
    out
}

/// The rows of `x [m, k]` rounded to bf16, as pairs of adjacent columns
/// `[m][k/2]` (the low half the even column). Rounding is `O(m·k)` against the
/// product's `O(m·n·k)`, so it is scalar code ([`bf16_bits`], which
/// [`Simd::pack_bf16`] computes lane by lane), vectorised by the compiler.
fn pack_rows(isa: IsaToken, x: ArrayView2<'_, f32>, parallel: bool) -> Vec<u32> {
    let (m, k) = x.dim();
    let kp = pairs(k);
    // Written once, not zeroed first: every pair of every row is set below.
    let mut out = Vec::with_capacity(m * kp);
    let pack = |(i, dst): (usize, &mut [MaybeUninit<u32>])| {
        let row = x.row(i);
        match row.as_slice() {
            Some(src) => dispatch(isa, Scalar(|| pack_row(src, dst))),
            None => pack_row(&row.to_vec(), dst),
        }
    };
    let rows = &mut out.spare_capacity_mut()[..m * kp];
    if parallel {
        rows.par_chunks_mut(kp).enumerate().for_each(pack);
    } else {
        rows.chunks_mut(kp).enumerate().for_each(pack);
    }
    // SAFETY: `pack_row` wrote all `kp` pairs of each of the `m` rows.
    unsafe { out.set_len(m * kp) };
    out
}

/// `src` rounded to bf16 as pairs of adjacent numbers (a last odd one paired
/// with zero), written to all `src.len().div_ceil(2)` entries of `dst`.
#[inline(always)]
fn pack_row(src: &[f32], dst: &mut [MaybeUninit<u32>]) {
    let (whole, tail) = src.split_at(src.len() & !1);
    for (d, s) in dst.iter_mut().zip(whole.chunks_exact(2)) {
        d.write(pair(s[0], s[1]));
    }
    if let [last] = tail {
        dst[whole.len() / 2].write(pair(*last, 0.0));
    }
}

/// The pair `(low, high)` rounded to bf16.
#[inline(always)]
fn pair(low: f32, high: f32) -> u32 {
    bf16_bits(low) as u32 | (bf16_bits(high) as u32) << 16
}

/// A weight `w [n, k]` rounded to bf16 in the product's layout: 16-output panels,
/// each `[k/2][16]` pairs (row `q`, lane `j`: `w[16p + j][2q]` low,
/// `w[16p + j][2q + 1]` high), zero past `n` and past `k`. Half the bytes of the
/// f32 packing, and on huge pages as it is ([`LargePageArray`]).
pub(crate) struct PackedBf16 {
    n: usize,
    k: usize,
    data: LargePageArray<u32>,
}

impl std::fmt::Debug for PackedBf16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedBf16([{}, {}])", self.n, self.k)
    }
}

impl PackedBf16 {
    /// Rounds and packs `w [n, k]` (any strides), in parallel if `parallel`.
    pub(crate) fn new(w: ArrayView2<'_, f32>, parallel: bool) -> Self {
        let (n, k) = w.dim();
        let panel = pairs(k) * NR;
        let len = n.div_ceil(NR) * panel;
        // Not zeroed first (as the f32 packing): each panel writes all of its part,
        // zeros in the lanes past `n`.
        let fill = |(p, dst): (usize, &mut [MaybeUninit<u32>])| {
            for lane in 0..NR {
                let j = p * NR + lane;
                let slots = dst.iter_mut().skip(lane).step_by(NR);
                if j >= n {
                    slots.for_each(|slot| {
                        slot.write(0);
                    });
                    continue;
                }
                let row = w.row(j);
                for (q, slot) in slots.enumerate() {
                    let high = if 2 * q + 1 < k { row[2 * q + 1] } else { 0.0 };
                    slot.write(pair(row[2 * q], high));
                }
            }
        };
        // SAFETY: every panel's lanes are all written (or `len` is 0).
        let data = unsafe {
            LargePageArray::filled(len, |dst| {
                if panel > 0 && parallel {
                    dst.par_chunks_mut(panel).enumerate().for_each(fill);
                } else if panel > 0 {
                    dst.chunks_mut(panel).enumerate().for_each(fill);
                }
            })
        };
        PackedBf16 { n, k, data }
    }

    /// `[n, k]`.
    pub(crate) fn dim(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The packed weight `[n, k]`, widened to f32 (exact).
    pub(crate) fn unpack(&self) -> Array2<f32> {
        Array2::from_shape_fn((self.n, self.k), |(j, kk)| self.at(j, kk))
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<u32>()
    }

    /// The packed number `w[j, kk]`, widened to f32.
    fn at(&self, j: usize, kk: usize) -> f32 {
        let word = self.data[((j / NR) * pairs(self.k) + kk / 2) * NR + j % NR];
        crate::isa::bf16_to_f32((word >> (16 * (kk % 2))) as u16)
    }

    /// Whether this is still `w`'s packing: the shape, and 64 entries spread over
    /// the matrix rounding to the packed numbers (as `PackedWeight::matches`: a
    /// weight changed in place after packing is noticed, at a cost that does not
    /// grow with the weight).
    pub(crate) fn matches(&self, w: ArrayView2<'_, f32>) -> bool {
        if w.dim() != (self.n, self.k) {
            return false;
        }
        if self.n == 0 || self.k == 0 {
            return true;
        }
        (0..64).all(|i| {
            let (j, kk) = (i * self.n / 64, (i * 7919 + self.k - 1) % self.k);
            let packed = self.at(j, kk);
            let want = crate::isa::bf16_to_f32(bf16_bits(w[[j, kk]]));
            packed.to_bits() == want.to_bits() || (packed.is_nan() && want.is_nan())
        })
    }
}

/// The bf16 product's operands: the rows of `x` as pairs and the packed weight.
struct PairOperands<'a> {
    x: &'a [u32],
    /// Pairs per row of `x`.
    lda: usize,
    w: &'a PackedBf16,
}

impl Operands for PairOperands<'_> {
    /// 384 pairs: a panel block is 24 KiB, as the f32 product's.
    const BLOCK: usize = KC;

    fn depth(&self) -> usize {
        self.lda
    }

    #[inline(always)]
    unsafe fn tile<I: Simd, const P: usize>(
        &self,
        isa: I,
        r: usize,
        rows: usize,
        p: usize,
        s0: usize,
        sc: usize,
        c: *mut f32,
        ldc: usize,
        init: [Init<'_>; P],
        ahead: Option<(usize, usize)>,
    ) {
        // Step `s` of panel `p`: the packing keeps each panel's `depth` rows of 16
        // pairs together.
        let at = |p: usize, s: usize| self.w.data[(p * self.lda + s) * NR..].as_ptr();
        let tile = Tile {
            a: self.x[r * self.lda + s0..].as_ptr(),
            lda: self.lda as isize,
            sa: 1,
            b: at(p, s0),
            ldb: NR,
            next: self.lda * NR,
            kc: sc,
            partial: tile::PAIR_SUM_BLOCK,
            ahead: ahead.map_or(std::ptr::null(), |(p, s)| at(p, s)),
        };
        // SAFETY: the caller's guarantees (rows of `x`, panels of `w`, steps within
        // the depth) are the tile's.
        unsafe { tile.run::<I, P>(isa, rows, c, ldc, init) }
    }
}

/// The pairs' product widened to f32 ([`linear_widened`]): the rows and panels of
/// [`PairOperands`], each pair two f32 steps, high then low, in blocks and partial
/// sums of as many pairs as the pairs' own.
struct WidenedOperands<'a> {
    x: &'a [f32],
    /// Steps per row of `x` and per panel: twice the pairs.
    lda: usize,
    panels: &'a [f32],
}

impl Operands for WidenedOperands<'_> {
    /// [`PairOperands::BLOCK`]'s pairs, two steps each.
    const BLOCK: usize = 2 * KC;

    fn depth(&self) -> usize {
        self.lda
    }

    #[inline(always)]
    unsafe fn tile<I: Simd, const P: usize>(
        &self,
        isa: I,
        r: usize,
        rows: usize,
        p: usize,
        s0: usize,
        sc: usize,
        c: *mut f32,
        ldc: usize,
        init: [Init<'_>; P],
        ahead: Option<(usize, usize)>,
    ) {
        let at = |p: usize, s: usize| self.panels[(p * self.lda + s) * NR..].as_ptr();
        let tile = Tile {
            a: self.x[r * self.lda + s0..].as_ptr(),
            lda: self.lda as isize,
            sa: 1,
            b: at(p, s0),
            ldb: NR,
            next: self.lda * NR,
            kc: sc,
            partial: 2 * tile::PAIR_SUM_BLOCK,
            ahead: ahead.map_or(std::ptr::null(), |(p, s)| at(p, s)),
        };
        // SAFETY: the caller's guarantees (rows of `x`, panels of `w`, steps within
        // the depth) are the tile's.
        unsafe { tile.run::<I, P>(isa, rows, c, ldc, init) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::nn::Activation;
    use ndarray::{s, Array};

    /// Numbers of a few sizes and both signs, from a fixed generator.
    fn numbers(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 40) as f32 / (1u64 << 24) as f32;
                let scale = [0.03, 0.5, 2.0][(state >> 8) as usize % 3];
                (u - 0.5) * scale
            })
            .collect()
    }

    fn operands(m: usize, k: usize, n: usize) -> (Array2<f32>, Array2<f32>, Vec<f32>) {
        let x = Array::from_shape_vec((m, k), numbers(m * k, 1 + m as u64)).unwrap();
        let w = Array::from_shape_vec((n, k), numbers(n * k, 2 + k as u64)).unwrap();
        (x, w, numbers(n, 3))
    }

    fn rounded(a: &Array2<f32>) -> Array2<f32> {
        crate::element::round_to_bf16(a.view())
    }

    /// `x · wᵀ + bias` in f64 on the bf16-rounded operands: the exact answer the
    /// bf16 product approximates.
    fn exact(x: &Array2<f32>, w: &Array2<f32>, bias: &[f32]) -> Array2<f64> {
        let (x, w) = (rounded(x), rounded(w));
        Array2::from_shape_fn((x.nrows(), w.nrows()), |(i, j)| {
            (0..x.ncols()).fold(bias[j] as f64, |s, kk| {
                s + x[[i, kk]] as f64 * w[[j, kk]] as f64
            })
        })
    }

    /// The naive bf16 product of docs/design.md's rule: the bf16 products (exact
    /// in f32) summed one by one in f32, then the bias added.
    fn naive(x: &Array2<f32>, w: &Array2<f32>, bias: &[f32]) -> Array2<f32> {
        let (x, w) = (rounded(x), rounded(w));
        Array2::from_shape_fn((x.nrows(), w.nrows()), |(i, j)| {
            let sum = (0..x.ncols()).fold(0.0f32, |s, kk| s + x[[i, kk]] * w[[j, kk]]);
            sum + bias[j]
        })
    }

    fn max_err(a: &Array2<f32>, exact: &Array2<f64>) -> f64 {
        a.iter()
            .zip(exact.iter())
            .fold(0.0f64, |e, (&a, &b)| e.max((a as f64 - b).abs()))
    }

    #[test]
    fn within_twice_the_naive_error_on_every_edge_and_instruction_set() {
        // Row counts on both sides of the tile, partial panels, odd depths, and
        // depths across a block of pairs (384 pairs = 768 numbers).
        for &(m, k, n) in &[
            (1, 1, 1),
            (1, 2, 16),
            (5, 7, 17),
            (6, 33, 16),
            (7, 385, 40),
            (13, 768, 48),
            (13, 769, 33),
            (50, 1000, 70),
            (97, 1536, 384),
            (487, 130, 40),
        ] {
            let (x, w, bias) = operands(m, k, n);
            let want = exact(&x, &w, &bias);
            let naive_err = max_err(&naive(&x, &w, &bias), &want);
            // The f32 rounding floor: a few ulps of the largest output.
            let vmax = want.iter().fold(0.0f64, |a, &b| a.max(b.abs()));
            let floor = 4.0 * f32::EPSILON as f64 * vmax;
            let packed = PackedBf16::new(w.view(), false);
            for isa in Isa::available() {
                let token = isa.token().unwrap();
                let y = linear_bf16_on(token, x.view(), &packed, Some(&bias), Epilogue::None);
                let err = max_err(&y, &want);
                assert!(
                    err <= 2.0 * naive_err + floor,
                    "{isa} {m}x{k}x{n}: error {err:e} > 2 × naive {naive_err:e} + floor {floor:e}"
                );
            }
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        // `dot2` is two fused multiply-adds in a fixed order everywhere (one
        // `vdpbf16ps` on AVX512-BF16, which differs only on subnormals).
        let (x, w, bias) = operands(29, 515, 50);
        let packed = PackedBf16::new(w.view(), false);
        let run = |isa: Isa| {
            let token = isa.token().unwrap();
            linear_bf16_on(
                token,
                x.view(),
                &packed,
                Some(&bias),
                Epilogue::Act(Activation::Gelu),
            )
        };
        let portable = run(Isa::Portable);
        for isa in Isa::available() {
            assert_eq!(run(isa), portable, "{isa}");
        }
    }

    /// The pairs widened to f32 (the product of instruction sets without bf16
    /// products, beyond a few rows) give the pairs' own bits: odd depths, depths
    /// across a block of pairs and past one partial sum (384 pairs), partial panels,
    /// few rows and many, with the fused activation.
    #[test]
    fn the_widened_product_gives_the_pairs_bits_on_every_instruction_set() {
        for &(m, k, n) in &[(3, 9, 5), (29, 515, 50), (40, 1537, 33), (250, 800, 64)] {
            let (x, w, bias) = operands(m, k, n);
            let packed = PackedBf16::new(w.view(), false);
            for isa in Isa::available() {
                let token = isa.token().unwrap();
                let run = |widen| {
                    let gelu = Epilogue::Act(Activation::Gelu);
                    product(token, x.view(), &packed, Some(&bias), gelu, widen)
                };
                assert_eq!(run(true), run(false), "{isa} {m}x{k}x{n}");
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_in_a_batch_and_strided() {
        for &(k, n) in &[(400, 40), (1536, 48)] {
            let (x, w, bias) = operands(30, k, n);
            let packed = PackedBf16::new(w.view(), false);
            let all = linear_bf16(x.view(), &packed, Some(&bias), Epilogue::None);
            for m in [1, 5, 6, 7, 12, 13, 30] {
                let y = linear_bf16(x.slice(s![..m, ..]), &packed, Some(&bias), Epilogue::None);
                assert_eq!(y, all.slice(s![..m, ..]), "{m} rows of {k}x{n}");
            }
            // A transposed input (rows not contiguous) is copied, not misread.
            let xt = x.t().as_standard_layout().into_owned();
            assert_eq!(
                linear_bf16(xt.t(), &packed, Some(&bias), Epilogue::None),
                all
            );
        }
    }

    #[test]
    fn same_bits_whatever_the_thread_count() {
        // One row block, and three (`MC`).
        for m in [5, 200, 3 * super::super::MC - 7] {
            let (x, w, bias) = operands(m, 1536, 384);
            let packed = PackedBf16::new(w.view(), true);
            let run = |threads: usize| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap()
                    .install(|| linear_bf16(x.view(), &packed, Some(&bias), Epilogue::None))
            };
            let one = run(1);
            assert_eq!(run(2), one);
            assert_eq!(run(3), one);
        }
    }

    #[test]
    fn the_fused_activation_equals_the_separate_one() {
        for m in [3, 40] {
            let (x, w, bias) = operands(m, 64, 50);
            let packed = PackedBf16::new(w.view(), false);
            let fused = linear_bf16(
                x.view(),
                &packed,
                Some(&bias),
                Epilogue::Act(Activation::Gelu),
            );
            let mut separate = linear_bf16(x.view(), &packed, Some(&bias), Epilogue::None);
            Activation::Gelu.apply(separate.as_slice_mut().unwrap());
            assert_eq!(fused, separate);
        }
    }

    #[test]
    fn packing_rounds_to_nearest_even_and_notices_a_changed_weight() {
        let (_, mut w, _) = operands(1, 21, 24);
        // Halfway between 1 and 1 + 2^-7: rounds to the even 1.
        w[[3, 4]] = 1.0 + 1.0 / 256.0;
        let packed = PackedBf16::new(w.view(), false);
        assert_eq!(packed.at(3, 4), 1.0);
        for j in 0..24 {
            for kk in 0..21 {
                assert_eq!(packed.at(j, kk), half::bf16::from_f32(w[[j, kk]]).to_f32());
            }
        }
        assert!(packed.matches(w.view()));
        assert!(packed.matches(rounded(&w).view()));
        assert!(!packed.matches(w.slice(s![..23, ..])));
        w.mapv_inplace(|v| v * 1.5 + 0.01);
        assert!(!packed.matches(w.view()));
    }

    #[test]
    fn no_rows_no_depth_and_no_bias() {
        let (x, w, bias) = operands(4, 0, 5);
        let packed = PackedBf16::new(w.view(), false);
        let y = linear_bf16(x.view(), &packed, Some(&bias), Epilogue::None);
        assert_eq!(y, Array2::from_shape_fn((4, 5), |(_, j)| bias[j]));
        let (x, w, _) = operands(0, 9, 5);
        let packed = PackedBf16::new(w.view(), false);
        assert_eq!(
            linear_bf16(x.view(), &packed, None, Epilogue::None).dim(),
            (0, 5)
        );
        let (x, w, _) = operands(3, 9, 5);
        let packed = PackedBf16::new(w.view(), false);
        let y = linear_bf16(x.view(), &packed, None, Epilogue::None);
        let want = exact(&x, &w, &[0.0; 5]);
        let naive_err = max_err(&naive(&x, &w, &[0.0; 5]), &want);
        let floor = 4.0 * f32::EPSILON as f64 * want.iter().fold(0.0f64, |a, &b| a.max(b.abs()));
        assert!(max_err(&y, &want) <= 2.0 * naive_err + floor);
    }
}
