//! The dense layers' product in bf16: `y = act(x · wᵀ + bias)` with `x` and `w`
//! rounded to bf16 (to nearest, ties to even), products of bf16 numbers and f32
//! sums, as PyTorch's autocast to bf16 computes a `Linear`.
//!
//! [`Simd::dot2`](crate::isa::Simd::dot2) multiplies two vectors of bf16 *pairs* lane by lane, so both
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
//! are more than a few, the pairs are widened to f32 (a shift, exact) and the f32
//! tile runs on them ([`linear_widened`]): each pair's `dot2` there is two fused
//! multiply-adds behind the shifts that widen its pairs, which made the bf16
//! layers 1.4× slower than f32 ones on AVX2. The widened product adds the same
//! products in the same order (each pair's high half first, the pairs' partial
//! sums and blocks), so every instruction set still gives the same bits. The rows
//! of `x` are widened once per call; the weight stays in bf16 and each group of
//! its panels is widened into the thread's scratch just before the group's tiles
//! read it, so the weight is read at half the f32 product's bytes. (Widening the
//! whole weight per call instead wrote it in f32 and read it back: three times the
//! f32 product's weight traffic, which kept the bf16 encoder at 0.87–0.91× f32.)
//!
//! On AMX ([`Route::Tiles`]) the same pairs go to the tiles, whose `tdpbf16ps`
//! multiplies 16 rows × 16 outputs × 32 numbers an instruction, eight times
//! `vdpbf16ps`: the rows' pairs and the panels are already in the tiles' layout
//! ([`tiles`]), and each output is its tile sum plus its bias. The tiles add in
//! their own order, so their bits are not the other instruction sets', but a
//! row's bits still depend neither on the batch nor on the thread count.

use std::mem::MaybeUninit;

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use super::amx::{self as tiles, OnTiles};
use super::{bias_only, Block, Depth, Epilogue, Problem, Streams, FEW_ROWS, KC, NR, PARALLEL_MIN};
use crate::isa::amx::Product;
use crate::isa::{bf16_bits, bf16_to_f32, dispatch, Amx, IsaToken, Simd, SimdJob};
use crate::kernels::tile::{self, Ahead};
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
    let route = Route::of(isa, x.nrows(), w.k);
    product(isa, x, w, bias, epilogue, route)
}

/// How a bf16 product runs.
#[derive(Clone, Copy, Debug)]
enum Route {
    /// The pairs' register tile ([`Simd::dot2`](crate::isa::Simd::dot2)).
    Pairs,
    /// The pairs widened to f32 and the f32 register tile ([`linear_widened`]):
    /// the pairs' bits.
    Widened,
    /// The AMX tiles ([`tiles`]): `tdpbf16ps` adds the 32 products of a step
    /// in an order of its own, so these are not the pairs' bits, but they are
    /// the same whatever the batch and the thread count.
    Tiles(Amx),
}

impl Route {
    /// The fastest route on `isa` for `m` rows of depth `k`.
    fn of(isa: IsaToken, m: usize, k: usize) -> Route {
        if let Some(amx) = isa.amx().filter(|_| tiles::fits(pairs(k))) {
            return Route::Tiles(amx);
        }
        // A few rows read each weight once, from memory: there the pairs' half of
        // the f32 bytes outweighs their shifts.
        if !isa.isa().has_bf16_products() && m > FEW_ROWS {
            Route::Widened
        } else {
            Route::Pairs
        }
    }
}

/// [`linear_bf16_on`] by `route`.
fn product(
    isa: IsaToken,
    x: ArrayView2<'_, f32>,
    w: &PackedBf16,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
    route: Route,
) -> Array2<f32> {
    let (m, k) = x.dim();
    let n = w.n;
    assert_eq!(w.k, k, "inner dimensions");
    assert!(bias.is_none_or(|b| b.len() == n), "bias length");
    if m == 0 || n == 0 || k == 0 {
        return bias_only(m, n, bias, epilogue);
    }
    let parallel = m * n * k >= PARALLEL_MIN && rayon::current_num_threads() > 1;
    let (amx, pad) = match route {
        Route::Widened => return linear_widened(isa, x, w, bias, epilogue, parallel),
        Route::Pairs => (None, 0),
        Route::Tiles(amx) => (Some(amx), tiles::PAD_ROWS),
    };
    let operands = PairOperands {
        x: &pack_rows(isa, x, pairs(k), pad, parallel, pack_row),
        lda: pairs(k),
        w,
        amx,
    };
    let problem = Problem {
        n,
        bias,
        epilogue,
        operands: &operands,
    };
    problem.run(isa, m, parallel)
}

/// [`linear_bf16_on`] through the f32 product: the rows of `x` and the weight's
/// pairs widened to f32, each pair's high half first as [`dot2`](crate::isa::Simd::dot2) adds them,
/// and summed in the pairs' partial sums and blocks ([`WidenedOperands`]): the
/// same additions in the same order, so the same bits as the pairs' product.
fn linear_widened(
    isa: IsaToken,
    x: ArrayView2<'_, f32>,
    w: &PackedBf16,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
    parallel: bool,
) -> Array2<f32> {
    let operands = WidenedOperands {
        x: &pack_rows(isa, x, 2 * pairs(w.k), 0, parallel, widen_row),
        lda: 2 * pairs(w.k),
        w,
    };
    let problem = Problem {
        n: w.n,
        bias,
        epilogue,
        operands: &operands,
    };
    problem.run(isa, x.nrows(), parallel)
}

/// The rows of `x [m, k]` (`k > 0`) packed by `write` (a row of `x`, all `width`
/// entries of its packed row), then `pad` rows of zeros: `[m + pad][width]`.
/// Packing is `O(m·k)` against the product's `O(m·n·k)`, so it is scalar code,
/// vectorised by the compiler.
fn pack_rows<T: Send + Default + Clone>(
    isa: IsaToken,
    x: ArrayView2<'_, f32>,
    width: usize,
    pad: usize,
    parallel: bool,
    write: impl Fn(&[f32], &mut [MaybeUninit<T>]) + Copy + Sync,
) -> Vec<T> {
    let m = x.nrows();
    // Written once, not zeroed first: every entry of every row is set below.
    let mut out = Vec::with_capacity((m + pad) * width);
    let pack = |(i, dst): (usize, &mut [MaybeUninit<T>])| {
        let row = x.row(i);
        match row.as_slice() {
            Some(src) => dispatch(isa, PackRow { write, src, dst }),
            None => write(&row.to_vec(), dst),
        }
    };
    let rows = &mut out.spare_capacity_mut()[..m * width];
    if parallel {
        rows.par_chunks_mut(width).enumerate().for_each(pack);
    } else {
        rows.chunks_mut(width).enumerate().for_each(pack);
    }
    // SAFETY: `write` wrote all `width` entries of each of the `m` rows.
    unsafe { out.set_len(m * width) };
    out.resize((m + pad) * width, T::default());
    out
}

/// One row of [`pack_rows`], for [`dispatch`]: `write` is inlined into the
/// instruction set's code. (Through a closure job, `Scalar(|| write(src, dst))`,
/// the closure was compiled apart, without the instruction set's vectors: `perf`
/// showed the widened product's row packing as such a call, 3 % of a bf16
/// encoder's time on AVX-512.)
struct PackRow<'a, W, T> {
    write: W,
    src: &'a [f32],
    dst: &'a mut [MaybeUninit<T>],
}

impl<W: Fn(&[f32], &mut [MaybeUninit<T>]), T> SimdJob for PackRow<'_, W, T> {
    type Output = ();
    #[inline(always)]
    fn run<I: Simd>(self, _isa: I) {
        (self.write)(self.src, self.dst)
    }
}

/// `src` rounded to bf16 and widened back, each pair of adjacent numbers high
/// then low (a last odd one paired with zero), as [`WidenedOperands`] reads a
/// row: all `2·⌈len/2⌉` entries of `dst`.
#[inline(always)]
fn widen_row(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    let rounded = |v: f32| bf16_to_f32(bf16_bits(v));
    let (whole, tail) = src.split_at(src.len() & !1);
    for (d, s) in dst.chunks_exact_mut(2).zip(whole.chunks_exact(2)) {
        d[0].write(rounded(s[1]));
        d[1].write(rounded(s[0]));
    }
    if let [last] = tail {
        dst[whole.len()].write(0.0);
        dst[whole.len() + 1].write(rounded(*last));
    }
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

    /// Words of one panel: `⌈k/2⌉` rows of 16 pairs.
    fn panel_len(&self) -> usize {
        pairs(self.k) * NR
    }

    /// Row `q` (pairs `2q`, `2q + 1`) of panel `p`.
    #[inline(always)]
    fn pair_row(&self, p: usize, q: usize) -> *const u32 {
        self.data[p * self.panel_len() + q * NR..].as_ptr()
    }

    /// The lines of panel `p` from its row `q` on, for a tile to fetch ahead
    /// ([`Ahead`]), `step` words further per step of the tile.
    #[inline(always)]
    fn ahead(&self, p: usize, q: usize, step: usize) -> Ahead {
        let size = std::mem::size_of::<u32>();
        Ahead {
            at: self.pair_row(p, q).cast(),
            next: self.panel_len() * size,
            step: step * size,
        }
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

/// The bf16 product's operands: the rows of `x` as pairs and the packed weight,
/// and the AMX tiles where they multiply them ([`Route::Tiles`]).
struct PairOperands<'a> {
    x: &'a [u32],
    /// Pairs per row of `x`.
    lda: usize,
    w: &'a PackedBf16,
    amx: Option<Amx>,
}

impl Depth for PairOperands<'_> {
    /// 384 pairs: a panel block is 24 KiB, as the f32 product's.
    const BLOCK: usize = KC;

    fn depth(&self) -> usize {
        self.lda
    }

    #[inline(always)]
    unsafe fn whole_block<I: Simd>(
        &self,
        isa: I,
        block: &Block,
        n: usize,
        bias: Option<&[f32]>,
        out: *mut f32,
    ) -> bool {
        // SAFETY: the caller's guarantees.
        unsafe { tiles::whole_block(self, isa, block, n, bias, out) }
    }
}

impl Streams for PairOperands<'_> {
    type Step = u32;
    const PARTIAL: usize = tile::PAIR_SUM_BLOCK;

    #[inline(always)]
    fn row(&self, r: usize, s: usize) -> (*const u32, usize) {
        (self.x[r * self.lda + s..].as_ptr(), self.lda)
    }

    #[inline(always)]
    fn panels(
        &self,
        p: usize,
        _count: usize,
        s: usize,
        _staged: &[f32],
    ) -> (*const u32, usize, usize) {
        (self.w.pair_row(p, s), NR, self.w.panel_len())
    }

    #[inline(always)]
    fn ahead(&self, p: usize, s: usize) -> Ahead {
        self.w.ahead(p, s, NR)
    }
}

impl OnTiles for PairOperands<'_> {
    /// `product` packs the rows for the tiles exactly where it sets `amx`.
    fn amx(&self) -> Option<Amx> {
        self.amx
    }

    const PRODUCT: Product = Product::Pairs;
    type Sum = f32;
    const ZERO: f32 = 0.0;
    type Row<I: Simd> = ();
    type Panel<I: Simd> = I::V;

    fn rows(&self) -> (&[u32], usize) {
        (self.x, self.lda)
    }

    fn panel(&self, p: usize) -> *const u32 {
        self.w.pair_row(p, 0)
    }

    /// The outputs' bias.
    #[inline(always)]
    fn finish_panel<I: Simd>(&self, isa: I, _p: usize, bias: &[f32; NR]) -> I::V {
        // SAFETY: `bias` is 16 floats.
        unsafe { isa.load(bias.as_ptr()) }
    }

    #[inline(always)]
    fn finish_row<I: Simd>(&self, _isa: I, _r: usize) {}

    #[inline(always)]
    unsafe fn finish<I: Simd>(&self, isa: I, _row: &(), bias: &I::V, sums: *const f32) -> I::V {
        // SAFETY: the caller's guarantee: 16 sums.
        isa.add(unsafe { isa.load(sums) }, *bias)
    }
}

/// The pairs' product widened to f32 ([`linear_widened`]): the rows of `x`
/// widened once per call, and each group of the weight's panels widened as its
/// tiles are about to run, into this thread's scratch ([`Depth::stage`]),
/// each pair two f32 steps, high then low, in blocks and partial sums of as many
/// pairs as the pairs' own. The weight is read in bf16, half the f32 product's
/// bytes; only a group's panels over one block of the sum (at most 192 KiB) are
/// ever f32, in cache.
struct WidenedOperands<'a> {
    x: &'a [f32],
    /// Steps per row of `x` and per panel: twice the pairs.
    lda: usize,
    w: &'a PackedBf16,
}

impl Depth for WidenedOperands<'_> {
    /// [`PairOperands`]' block of pairs, two steps each.
    const BLOCK: usize = 2 * KC;

    fn depth(&self) -> usize {
        self.lda
    }

    fn staged_len(&self, count: usize, sc: usize) -> usize {
        count * sc * NR
    }

    #[inline(always)]
    fn stage<I: Simd>(
        &self,
        isa: I,
        p: usize,
        count: usize,
        (s0, sc): (usize, usize),
        staged: &mut [f32],
    ) {
        // Blocks and the depth are whole pairs: `s0` and `sc` are even. Each row of
        // 16 pairs becomes two rows of 16 floats, its highs, then its lows.
        debug_assert!(s0 % 2 == 0 && sc % 2 == 0);
        for (q, dst) in staged.chunks_exact_mut(sc * NR).take(count).enumerate() {
            let start = ((p + q) * (self.lda / 2) + s0 / 2) * NR;
            let src = &self.w.data[start..start + sc / 2 * NR];
            for (d, s) in dst.chunks_exact_mut(2 * NR).zip(src.chunks_exact(NR)) {
                // SAFETY: `s` holds 16 pairs and `d` 32 floats.
                unsafe {
                    let (high, low) = isa.widen_pairs(isa.load_pairs(s.as_ptr()));
                    isa.store(d.as_mut_ptr(), high);
                    isa.store(d.as_mut_ptr().add(NR), low);
                }
            }
        }
    }
}

impl Streams for WidenedOperands<'_> {
    type Step = f32;
    const PARTIAL: usize = 2 * tile::PAIR_SUM_BLOCK;

    #[inline(always)]
    fn row(&self, r: usize, s: usize) -> (*const f32, usize) {
        (self.x[r * self.lda + s..].as_ptr(), self.lda)
    }

    #[inline(always)]
    fn panels(
        &self,
        _p: usize,
        count: usize,
        _s: usize,
        staged: &[f32],
    ) -> (*const f32, usize, usize) {
        (staged.as_ptr(), NR, staged.len() / count)
    }

    #[inline(always)]
    fn ahead(&self, p: usize, s: usize) -> Ahead {
        // A row of 16 pairs (one line) holds two steps.
        self.w.ahead(p, s / 2, NR / 2)
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
        // depths across a block of pairs (384 pairs = 768 numbers); on AMX, depths
        // of whole steps of 32 (the tiles') with one and two tiles of rows and of
        // panels, partial ones, and several blocks of each.
        for &(m, k, n) in &[
            (1, 32, 1),
            (17, 64, 17),
            (33, 96, 50),
            (250, 128, 50),
            (40, 3072, 33),
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
        // `vdpbf16ps` on AVX512-BF16, which differs only on subnormals). The AMX
        // tiles, which add in their own order, take only depths of whole steps
        // of 32 pairs: this one is not.
        let (x, w, bias) = operands(29, 515, 50);
        assert!(!tiles::fits(pairs(515)));
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
                let run = |route| {
                    let gelu = Epilogue::Act(Activation::Gelu);
                    product(token, x.view(), &packed, Some(&bias), gelu, route)
                };
                assert_eq!(run(Route::Widened), run(Route::Pairs), "{isa} {m}x{k}x{n}");
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_in_a_batch_and_strided() {
        // On AMX the second shape runs on the tiles, whose blocks are 16 or 32
        // rows: a row's bits must not depend on where it falls in them.
        for &(k, n) in &[(400, 40), (1536, 48)] {
            let (x, w, bias) = operands(40, k, n);
            let packed = PackedBf16::new(w.view(), false);
            let all = linear_bf16(x.view(), &packed, Some(&bias), Epilogue::None);
            for m in [1, 5, 6, 7, 12, 13, 16, 17, 30, 33, 40] {
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
    fn same_bits_whatever_the_thread_count_on_every_instruction_set() {
        // One row block, and three (`MC`); blocks of whole rows (a residual and
        // LayerNorm after the product) are a few rows each, whose tiles run the
        // whole depth. The widened product stages each group of panels per block.
        let norm = crate::nn::LayerNorm::new(
            ndarray::Array1::from_iter((0..384).map(|j| 1.0 + j as f32 / 384.0)),
            ndarray::Array1::from_iter((0..384).map(|j| j as f32 / 768.0)),
            1e-5,
        )
        .unwrap();
        for m in [5, 200, 3 * super::super::MC - 7] {
            let (x, w, bias) = operands(m, 1536, 384);
            let residual = numbers(m * 384, 4);
            let packed = PackedBf16::new(w.view(), true);
            for isa in Isa::available() {
                let token = isa.token().unwrap();
                for whole_rows in [false, true] {
                    let epilogue = if whole_rows {
                        Epilogue::ResidualNorm {
                            residual: &residual,
                            norm: &norm,
                        }
                    } else {
                        Epilogue::None
                    };
                    let run = |threads: usize| {
                        crate::threads::pool(threads).unwrap().install(|| {
                            linear_bf16_on(token, x.view(), &packed, Some(&bias), epilogue)
                        })
                    };
                    let one = run(1);
                    assert_eq!(run(2), one, "{isa} {m} rows, whole rows {whole_rows}");
                    assert_eq!(run(3), one, "{isa} {m} rows, whole rows {whole_rows}");
                }
            }
        }
    }

    #[test]
    fn amx_takes_the_tiles_for_every_depth_of_whole_steps_and_nothing_else_does() {
        for isa in Isa::available() {
            let token = isa.token().unwrap();
            for (m, k) in [(1, 32), (7, 384), (300, 1536), (300, 30), (300, 500)] {
                let route = Route::of(token, m, k);
                let tiled = matches!(route, Route::Tiles(_));
                let want = isa == Isa::Amx && k % 32 == 0;
                assert_eq!(tiled, want, "{isa} {m}x{k}: {route:?}");
            }
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
