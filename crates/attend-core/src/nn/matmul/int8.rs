//! The dense layers' product in int8: `y = act(x · wᵀ + bias)` with the weight
//! quantized once, at load, and each row of `x` at every call, products of bytes
//! summed exactly in i32 and the sums turned back into f32 with the bias, before
//! the f32 product's epilogues.
//!
//! - **Weights**: symmetric, one scale per output (`s_w[j] = max|w[j]| / 127`,
//!   `ŵ = round(w / s_w)` in −127 ..= 127), packed as the f32 product's 16-output
//!   panels with each row a *quad* of four adjacent `k` (`[k/4][16]` quads, a
//!   quarter of the f32 panel's bytes), zero past `n` and past `k`
//!   ([`PackedInt8`]). Each output's sum of its quantized weights is kept too.
//!   A *narrowed* packing on a CPU without VNNI quantizes to −63 ..= 63 instead
//!   (`s_w[j] = max|w[j]| / 63`), chosen once at load ([`weight_limit`]); with
//!   `C` weights corrected per output, `s_w[j]` is its (`C` + 1)-th largest
//!   magnitude over 63 and the weights beyond ±63 are packed clamped, each with
//!   its *residual* (full level less clamped) kept as a [`Correction`].
//! - **Inputs**: asymmetric, one scale and zero point per row (per token), chosen
//!   at run time from the row's range (dynamic quantization, no calibration):
//!   `s_x = (max − min) / 255` over the row and 0, `z = round(−min / s_x)`,
//!   `x̂ = clamp(round(x / s_x) + z, 0, 255)` ([`quantize_row`]). A row of
//!   activations after GELU is nearly all positive; its own zero point spends
//!   all 256 levels on its range where a symmetric scale would waste half.
//! - **Product**: [`Simd::dot4`] (`vpdpbusd` on AVX512-VNNI and AVX-VNNI,
//!   unsigned bytes of `x` against signed ones of `w`; exact 16-bit widening
//!   elsewhere), or for a ±63 packing without VNNI [`Simd::dot4_narrow`]
//!   (`vpmaddubsw`, which cannot saturate on such weights, and `vpmaddwd` by
//!   ones: twice the widening's rate on AVX2, which runs one `vpmaddwd` a cycle), sums
//!   `Σ x̂ ŵ` in i32 over the whole depth in one register tile, exactly (at most
//!   `255 · 127 · k`, far from overflow for any encoder's `k`). The zero point
//!   comes off in i32, `Σ x̂ ŵ − z · Σ ŵ`, and one rounding to f32 and a fused
//!   multiply-add give `y = f32(Σ (x̂ − z) ŵ) · (s_x · s_w) + bias`. A corrected
//!   packing's sums `Σ ŵ` are of the full levels, and its tile adds
//!   `Σ residual · x̂[column]` to each row's sum in i32 before the zero point
//!   comes off (scalar code in the epilogue: `16 · C` byte products per row and
//!   panel, against the tile's `k / 4` quads), so the sum is exact at the full
//!   levels.
//!
//! - **Outliers** (a layer made with some, [`linear_int8`]'s `outliers`): each
//!   row's `outliers` entries of largest magnitude are left out of its
//!   quantization (zero there, so its range is the rest's) and multiplied in f32
//!   by the quantized weights in the tile, after the integer sum:
//!   `share = Σ_t x_t · ŵ[·][c_t]` over the row's outliers in column order, and
//!   `y = (f32(Σ (x̂ − z) ŵ) · s_x + share) · s_w + bias`. The tile reads each
//!   outlier's weights from the quad row of its panel it has just streamed, as one
//!   more `dot4` by a quad holding a single 1 (exact on every instruction set). A
//!   LayerNorm's output has a few channels far larger than the rest, which would
//!   otherwise set each token's scale and leave the other channels a handful of
//!   levels; which channels they are is the row's own, so a row's output does not
//!   depend on the batch, and no calibration is needed.
//!
//! The integer sums are exact, so for a given packing the output is the same
//! bits on every instruction set, whatever the blocking, the batch or the thread
//! count; the tests check both packings against an i64 reference. (A narrowed
//! packing itself differs between CPUs with and without VNNI.) The error is the
//! quantization's:
//! each input moves by up to `s_x / 2` and each weight by `s_w / 2`.

use std::mem::MaybeUninit;

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use super::amx as tiles;
use super::{bias_only, Block, Depth, Epilogue, Init, Operands, Problem, TileAt, NR, PARALLEL_MIN};
use crate::isa::{dispatch, Amx, IsaToken, Simd, SimdJob, LANES, NARROW_LEVEL};
use crate::kernels::tile::{self, MR};
use crate::memory::LargePageArray;

mod amx;

/// Quads in a row of `k` numbers.
fn quads(k: usize) -> usize {
    k.div_ceil(4)
}

/// Largest quantized weight magnitude where the CPU multiplies bytes with
/// `vpdpbusd` (symmetric: −127 ..= 127, so that negating a weight keeps its size).
const WEIGHT_LEVELS: i8 = 127;
/// Levels of a quantized input: 0 ..= 255.
const INPUT_LEVELS: f32 = 255.0;
/// Rows a 16-register instruction set takes in one tile: three rows of one panel
/// are six accumulators of two halves, with the widened bytes beside them. Where
/// `dot4` is one instruction (AVX-VNNI) there are no widened bytes to hold, and
/// six rows (twelve accumulators) give `vpdpbusd` the independent sums its
/// latency needs: three gave 387 GOP/s on one Zen 5 thread against 512 with
/// twelve sums (`scripts/peak/int8-peak`, avxvnni_tile and avxvnni).
///
/// [`Simd::dot4_narrow`] without VNNI (`vpmaddubsw`, then `vpmaddwd` by ones)
/// holds no widened bytes either, only its pair sums and the ones beside the
/// twelve sums, the panel's two halves and the row's quad: it takes six rows too
/// (not compared with five; `dense_bench` ran 1.25-2.0x the widening's three-row
/// tile, loaded: docs/int8.md).
const fn rows_16<I: Simd>(narrow: bool) -> usize {
    if I::NATIVE_DOT4 || narrow {
        MR
    } else {
        3
    }
}
/// Steps ahead of the sum at which a tile asks for its panels' next lines.
const PREFETCH: usize = 16;

/// `act(x · wᵀ + bias)` in int8 for `x [m, k]` (any strides) and the weight
/// quantized and packed in `w`, `bias [n]`, with each row's `outliers` largest
/// magnitudes kept out of its quantization (the module docs). Runs on the best
/// instruction set of this CPU, whichever it is.
pub(crate) fn linear_int8(
    x: ArrayView2<'_, f32>,
    w: &PackedInt8,
    outliers: usize,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
) -> Array2<f32> {
    linear_int8_on(IsaToken::best(), x, w, outliers, bias, epilogue)
}

/// [`linear_int8`] on the instruction set `isa`.
fn linear_int8_on(
    isa: IsaToken,
    x: ArrayView2<'_, f32>,
    w: &PackedInt8,
    outliers: usize,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
) -> Array2<f32> {
    let (m, k) = x.dim();
    let n = w.n;
    assert_eq!(w.k, k, "inner dimensions");
    assert!(bias.is_none_or(|b| b.len() == n), "bias length");
    if m == 0 || n == 0 || k == 0 {
        return bias_only(m, n, bias, epilogue);
    }
    let parallel = m * n * k >= PARALLEL_MIN && rayon::current_num_threads() > 1;
    let amx = isa.amx().filter(|_| tiles::fits(quads(k)));
    let pad = if amx.is_some() { tiles::PAD_ROWS } else { 0 };
    let rows = QuantizedRows::new(isa, x, outliers, pad, parallel);
    let operands = QuadOperands { x: &rows, w, amx };
    let problem = Problem {
        n,
        bias,
        epilogue,
        operands: &operands,
    };
    problem.run(isa, m, parallel)
}

/// A row's quantization: `x ≈ scale · (x̂ − zero)`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RowScale {
    scale: f32,
    zero: i32,
}

/// Quantizes `src` to bytes (see the module docs), written to all
/// `src.len().div_ceil(4)` quads of `dst` (the last one padded with zeros, which
/// meet zero weights), with the `kept.len()` entries of largest magnitude kept out
/// ([`select_outliers`]: written to `kept`, and quantized as zeros), and returns
/// the scale and zero point. A row that is all zeros gets scale 1; one holding an
/// infinity or a NaN gets a NaN scale, so that its outputs are NaN, as the f32
/// product's would be, and keeps nothing out.
///
/// The range in `isa`'s vectors (the lowest as the largest negation, a NaN or an
/// infinity caught by a sum of `x · 0`, which the maxima may drop), taken again
/// without the outliers when there are some; the levels in plain arithmetic that
/// the compiler vectorises (`vpmovdb` on AVX-512: in scalar code, a library call
/// per rounding, the quantization took longer than a 384-wide product). Compiled
/// inside an instruction set's entry point ([`QuantizeRows`]): as a closure handed
/// to `dispatch` it was left out of line, in SSE2, and took 13 % of the int8
/// corpus's time (a `perf` profile, MiniLM, 1,000 lines) against 31 % for the int8
/// products.
#[inline(always)]
fn quantize_row<I: Simd>(
    isa: I,
    src: &[f32],
    kept: &mut [Outlier],
    dst: &mut [MaybeUninit<u32>],
) -> RowScale {
    kept.fill(Outlier::NONE);
    let mut range = Range::of(isa, src, kept);
    if !kept.is_empty() && !range.poisoned {
        select_outliers(isa, src, range.lane_largest(isa), kept);
        if kept.iter().any(|o| o.value != 0.0) {
            range = Range::of(isa, src, kept);
        }
    }
    let (lo, hi) = (range.lo, range.hi);
    let span = hi - lo;
    let (scale, zero) = if range.poisoned || !span.is_finite() {
        (f32::NAN, 0)
    } else if span == 0.0 {
        (1.0, 0)
    } else {
        let scale = span / INPUT_LEVELS;
        (
            scale,
            (-lo / scale).round_ties_even().clamp(0.0, INPUT_LEVELS) as i32,
        )
    };
    let (inverse, zero_f) = (1.0 / scale, zero as f32);
    let level = |x: f32| {
        // Rounded to nearest, ties to even, by adding and taking away 1.5 · 2²³
        // (exact for |x / scale| ≤ 255): the same as `round_ties_even`, in two
        // vector additions.
        const ROUND: f32 = 12_582_912.0;
        let q = (x * inverse + ROUND) - ROUND + zero_f;
        // A NaN (the poisoned row's) fails the first comparison and becomes 0.
        let q = if q > 0.0 { q } else { 0.0 };
        let q = if q < INPUT_LEVELS { q } else { INPUT_LEVELS };
        // SAFETY: 0 ≤ q ≤ 255, a whole number.
        unsafe { q.to_int_unchecked::<i32>() as u8 }
    };
    // The quads' bytes in memory order (little-endian: the first of a quad is its
    // low byte), written one number at a time so that the compiler packs whole
    // vectors of them, then the last quad's padding.
    // SAFETY: `dst` is `dst.len()` initialised-or-not u32s, 4 bytes each.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<MaybeUninit<u8>>(), 4 * dst.len())
    };
    let (levels, padding) = bytes.split_at_mut(src.len());
    for (b, &x) in levels.iter_mut().zip(src) {
        b.write(level(x));
    }
    for b in padding {
        b.write(0);
    }
    // An outlier is quantized as a zero: the zero point (0 in a poisoned row).
    for o in kept.iter().filter(|o| o.value != 0.0) {
        levels[o.column as usize].write(zero as u8);
    }
    RowScale { scale, zero }
}

/// A row's range (0 included), in vectors: each lane's largest `x` and largest
/// `−x`, their maxima, and whether a NaN or an infinity is in the row.
struct Range<V> {
    highs: V,
    lows: V,
    lo: f32,
    hi: f32,
    poisoned: bool,
}

impl<V: Copy> Range<V> {
    /// The range of `src` without the entries `skip` names (zeros instead; unused
    /// slots, of value 0, name nothing).
    #[inline(always)]
    fn of<I: Simd<V = V>>(isa: I, src: &[f32], skip: &[Outlier]) -> Self {
        let zero = isa.splat(0.0);
        let (mut highs, mut lows, mut poison) = (zero, zero, zero);
        let mut take = |v: V| {
            highs = isa.max(highs, v);
            lows = isa.max(lows, isa.sub(zero, v));
            poison = isa.fma(v, zero, poison);
        };
        let mut skipped = skip.iter().filter(|o| o.value != 0.0).peekable();
        let chunks = src.chunks_exact(LANES);
        let rest = chunks.remainder();
        for (c, chunk) in chunks.enumerate() {
            if skipped
                .peek()
                .is_none_or(|o| o.column as usize / LANES != c)
            {
                // SAFETY: a chunk is 16 floats.
                take(unsafe { isa.load(chunk.as_ptr()) });
                continue;
            }
            let mut patched = [0.0f32; LANES];
            patched.copy_from_slice(chunk);
            while let Some(o) = skipped.next_if(|o| o.column as usize / LANES == c) {
                patched[o.column as usize % LANES] = 0.0;
            }
            // SAFETY: `patched` is 16 floats.
            take(unsafe { isa.load(patched.as_ptr()) });
        }
        if !rest.is_empty() {
            let mut patched = [0.0f32; LANES];
            patched[..rest.len()].copy_from_slice(rest);
            for o in skipped {
                patched[o.column as usize % LANES] = 0.0;
            }
            // SAFETY: `patched` is 16 floats, 0 past `rest`.
            take(unsafe { isa.load(patched.as_ptr()) });
        }
        Range {
            highs,
            lows,
            lo: -isa.max_lane(lows),
            hi: isa.max_lane(highs),
            poisoned: isa.sum(poison).is_nan(),
        }
    }

    /// Each lane's largest magnitude.
    #[inline(always)]
    fn lane_largest<I: Simd<V = V>>(&self, isa: I) -> [f32; LANES] {
        let mut largest = [0.0f32; LANES];
        // SAFETY: `largest` holds 16 floats.
        unsafe { isa.store(largest.as_mut_ptr(), isa.max(self.highs, self.lows)) };
        largest
    }
}

/// The rows of `x` quantized: bytes as quads `[m][k/4]` (and zero rows after
/// them, where asked), and each row's scale and zero point, and the entries each
/// row keeps out of its quantization.
struct QuantizedRows {
    quads: Vec<u32>,
    /// Quads per row.
    lda: usize,
    scales: Vec<RowScale>,
    /// Outliers per row.
    per_row: usize,
    /// Each row's, in column order, from `per_row · r` (`m` unused slots when
    /// there are none).
    outliers: Vec<Outlier>,
}

impl QuantizedRows {
    /// Quantizes every row of `x [m, k]`, each with its `per_row` largest
    /// magnitudes kept out, and keeps `pad` rows of zeros after them. `O(m·k)`
    /// against the product's `O(m·n·k)`: scalar code, vectorised by the
    /// compiler for `isa`.
    fn new(
        isa: IsaToken,
        x: ArrayView2<'_, f32>,
        per_row: usize,
        pad: usize,
        parallel: bool,
    ) -> Self {
        let (m, k) = x.dim();
        let lda = quads(k);
        // Written once, not zeroed first: every quad of every row is set below.
        let mut quads = Vec::with_capacity((m + pad) * lda);
        let mut scales = vec![
            RowScale {
                scale: 0.0,
                zero: 0
            };
            m
        ];
        // At least a slot a row, so that the chunks of slots pair with the rows'.
        let slots = per_row.max(1);
        let mut outliers = vec![Outlier::NONE; m * slots];
        let rows = &mut quads.spare_capacity_mut()[..m * lda];
        let job = |(chunk, ((dst, scales), outliers)): (usize, Chunk<'_>)| {
            let first = chunk * QUANTIZE_CHUNK;
            dispatch(
                isa,
                QuantizeRows {
                    x: x.slice(ndarray::s![first..first + scales.len(), ..]),
                    dst,
                    scales,
                    per_row,
                    outliers,
                },
            )
        };
        if lda > 0 && parallel {
            rows.par_chunks_mut(QUANTIZE_CHUNK * lda)
                .zip(scales.par_chunks_mut(QUANTIZE_CHUNK))
                .zip(outliers.par_chunks_mut(QUANTIZE_CHUNK * slots))
                .enumerate()
                .for_each(job);
        } else if lda > 0 {
            rows.chunks_mut(QUANTIZE_CHUNK * lda)
                .zip(scales.chunks_mut(QUANTIZE_CHUNK))
                .zip(outliers.chunks_mut(QUANTIZE_CHUNK * slots))
                .enumerate()
                .for_each(job);
        }
        // SAFETY: `quantize_row` wrote all `lda` quads of each of the `m` rows.
        unsafe { quads.set_len(m * lda) };
        quads.resize((m + pad) * lda, 0);
        QuantizedRows {
            quads,
            lda,
            scales,
            per_row,
            outliers,
        }
    }

    /// Row `r`'s outliers, in column order (unused slots hold zeros).
    fn outliers(&self, r: usize) -> &[Outlier] {
        &self.outliers[r * self.per_row..(r + 1) * self.per_row]
    }
}

/// A chunk of rows to quantize: their quads, scales and outliers.
type Chunk<'a> = (
    (&'a mut [MaybeUninit<u32>], &'a mut [RowScale]),
    &'a mut [Outlier],
);

/// An input entry kept out of its row's quantization: its column and value.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Outlier {
    column: u32,
    value: f32,
}

impl Outlier {
    /// An unused slot: a zero adds nothing.
    const NONE: Outlier = Outlier {
        column: 0,
        value: 0.0,
    };
}

/// Fills `kept` (all unused on entry) with the entries of `src` of largest
/// magnitude (an earlier one kept over a later one of the same size; zeros never),
/// in column order, given each lane's largest magnitude over the row's vectors,
/// `lane_largest`. The row holds no NaN or infinity.
#[inline(always)]
fn select_outliers<I: Simd>(
    isa: I,
    src: &[f32],
    mut lane_largest: [f32; LANES],
    kept: &mut [Outlier],
) {
    let last = kept.len() - 1;
    // The `kept.len()` largest of the lanes' maxima are as many entries, so every
    // entry kept is at least the smallest of them, `floor`; few others are, and
    // only vectors holding one are looked at closer.
    lane_largest.sort_unstable_by(|a, b| b.total_cmp(a));
    let floor = lane_largest.get(last).copied().unwrap_or(0.0);
    let zero = isa.splat(0.0);
    for (v, chunk) in src.chunks(LANES).enumerate() {
        // SAFETY: `chunk` holds `chunk.len()` ≤ 16 floats; the other lanes are 0.
        let x = unsafe { isa.load_part(chunk.as_ptr(), chunk.len()) };
        if isa.max_lane(isa.max(x, isa.sub(zero, x))) < floor {
            continue;
        }
        for (i, &x) in chunk.iter().enumerate() {
            let size = x.abs();
            if size > kept[last].value.abs() {
                let at = kept
                    .iter()
                    .position(|o| size > o.value.abs())
                    .expect("larger than the last");
                kept.copy_within(at..last, at + 1);
                kept[at] = Outlier {
                    column: (v * LANES + i) as u32,
                    value: x,
                };
            }
        }
    }
    kept.sort_unstable_by_key(|o| o.column);
}

/// Rows a [`QuantizeRows`] job takes: enough to amortise a task, few enough that
/// two threads share a short text's rows.
const QUANTIZE_CHUNK: usize = 16;

/// Quantizes rows `x [rows, k]` into `dst` (`k.div_ceil(4)` quads a row) and their
/// `scales`: a job, so that [`quantize_row`] is compiled for the instruction set.
struct QuantizeRows<'a, 'x> {
    x: ArrayView2<'x, f32>,
    dst: &'a mut [MaybeUninit<u32>],
    scales: &'a mut [RowScale],
    /// Outliers per row, and the rows' slots for them.
    per_row: usize,
    outliers: &'a mut [Outlier],
}

impl SimdJob for QuantizeRows<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<I: Simd>(self, isa: I) {
        let lda = quads(self.x.ncols());
        let rows = self.x.rows().into_iter();
        for (i, ((row, dst), scale)) in rows
            .zip(self.dst.chunks_mut(lda))
            .zip(self.scales)
            .enumerate()
        {
            let strided;
            let src = match row.as_slice() {
                Some(src) => src,
                None => {
                    strided = row.to_vec();
                    &strided
                }
            };
            let kept = &mut self.outliers[i * self.per_row..(i + 1) * self.per_row];
            *scale = quantize_row(isa, src, kept, dst);
        }
    }
}

/// A weight `w [n, k]` quantized to int8 (symmetric, one scale per output) in
/// the product's layout: 16-output panels, each `[k/4][16]` quads (row `q`, lane
/// `j`: `ŵ[16p + j][4q ..= 4q + 3]`, the first in the low byte), zero past `n`
/// and past `k`; with each output's scale and sum of quantized weights, padded to
/// whole panels. A quarter of the f32 packing's bytes, on huge pages as it is
/// ([`LargePageArray`]).
pub(crate) struct PackedInt8 {
    n: usize,
    k: usize,
    /// The largest weight level: every `|ŵ| ≤ limit`.
    limit: i8,
    data: LargePageArray<u32>,
    /// `s_w[j]`, 0 past `n`.
    scales: Vec<f32>,
    /// `Σ_k ŵ[j][k]` of the full levels (corrections included), 0 past `n`.
    sums: Vec<i32>,
    /// Weights corrected per output (0 unless narrowed to ±63).
    corrected: usize,
    /// Output `j`'s corrections from `max(corrected, 1) · j` (unused slots:
    /// residual 0).
    corrections: Vec<Correction>,
}

/// A weight whose full level lies beyond the packing's limit: its column and
/// its residual, the full level less the packed (clamped) one, added in i32 as
/// `residual · x̂[column]` after the tile's sum.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Correction {
    column: u32,
    residual: i32,
}

impl Correction {
    /// An unused slot: a residual of 0 adds nothing.
    const NONE: Correction = Correction {
        column: 0,
        residual: 0,
    };
}

/// The largest full level of a corrected weight: its residual stays far from
/// overflowing the tile's i32 sums (`255 · 32,767` per correction).
const FULL_LEVELS: f32 = i16::MAX as f32;

impl std::fmt::Debug for PackedInt8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedInt8([{}, {}])", self.n, self.k)
    }
}

/// An output's levels, scale, sum and corrections, as the packing fills them.
type Output<'a> = (
    (&'a mut [i8], &'a mut f32),
    (&'a mut i32, &'a mut [Correction]),
);

/// Output `j`'s scale for weights of at most `limit` in magnitude, from its
/// weights' largest magnitude (1 for a row of zeros, whose weights all quantize to
/// 0 either way; NaN for one holding a NaN or an infinity, so that its outputs are
/// NaN).
///
/// With `corrected` weights corrected, from its (`corrected` + 1)-th largest
/// magnitude instead, so that the `corrected` largest may quantize beyond the
/// limit (their full levels kept at most [`FULL_LEVELS`]).
fn weight_scale(row: ndarray::ArrayView1<'_, f32>, limit: i8, corrected: usize) -> f32 {
    let largest = row.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    if row.iter().any(|x| !x.is_finite()) {
        f32::NAN
    } else if largest == 0.0 {
        1.0
    } else if corrected == 0 {
        largest / limit as f32
    } else {
        let mut sizes: Vec<f32> = row.iter().map(|x| x.abs()).collect();
        let at = corrected.min(sizes.len() - 1);
        let (_, &mut next, _) = sizes.select_nth_unstable_by(at, |a, b| b.total_cmp(a));
        (next / limit as f32).max(largest / FULL_LEVELS)
    }
}

/// `x` quantized with `scale` (symmetric, `−limit ..= limit`), rounded to
/// nearest, ties to even, by adding and taking away 1.5 · 2²³ as [`quantize_row`]
/// does (exact, since |x / scale| ≤ 127): `round_ties_even` is a library call
/// where the compiler may not assume SSE4.1, and made most of the weights'
/// quantization at load (`rintf` in a profile).
#[inline(always)]
fn weight_level(x: f32, scale: f32, limit: i8) -> i8 {
    full_level(x, scale).clamp(-limit as i32, limit as i32) as i8
}

/// `x` quantized with `scale`, unclamped (at most [`FULL_LEVELS`] in magnitude
/// for the scales of [`weight_scale`]), rounded as [`weight_level`] says.
#[inline(always)]
fn full_level(x: f32, scale: f32) -> i32 {
    const ROUND: f32 = 12_582_912.0;
    // A NaN (a poisoned row's) becomes 0 through `as`, as before.
    ((x / scale + ROUND) - ROUND) as i32
}

/// The weights' largest level (magnitude) for the product on `isa`: 127 where `dot4` is
/// `vpdpbusd`; elsewhere [`NARROW_LEVEL`] (63), so that the product can use
/// `vpmaddubsw`, whose 16-bit pair sums saturate beyond 2 · 255 · 63 (twice the
/// rate of the exact widening of bytes on AVX2: docs/int8.md).
fn weight_limit(isa: IsaToken) -> i8 {
    if isa.native_dot4() {
        WEIGHT_LEVELS
    } else {
        NARROW_LEVEL
    }
}

impl PackedInt8 {
    /// Quantizes and packs `w [n, k]` (any strides) to ±127, in parallel if
    /// `parallel`; with `narrow` (`Some(corrected)`), to this CPU's best
    /// instruction set's [`weight_limit`] instead, and where that is ±63 (no
    /// VNNI) each output's `corrected` largest weights corrected (the module
    /// docs).
    pub(crate) fn new(w: ArrayView2<'_, f32>, narrow: Option<usize>, parallel: bool) -> Self {
        match narrow {
            Some(corrected) if weight_limit(IsaToken::best()) < WEIGHT_LEVELS => {
                Self::with_limit(w, NARROW_LEVEL, corrected, parallel)
            }
            _ => Self::with_limit(w, WEIGHT_LEVELS, 0, parallel),
        }
    }

    /// Quantizes `w [n, k]` to `−limit ..= limit`, each output's `corrected`
    /// largest weights corrected to their full levels, and packs it. Every
    /// instruction set multiplies any packing exactly; where `limit` ≤
    /// [`NARROW_LEVEL`] those without VNNI use [`Simd::dot4_narrow`].
    fn with_limit(w: ArrayView2<'_, f32>, limit: i8, corrected: usize, parallel: bool) -> Self {
        let (n, k) = w.dim();
        let panels = n.div_ceil(NR);
        let mut scales = vec![0.0f32; panels * NR];
        let mut sums = vec![0i32; panels * NR];
        // At least a slot an output while quantizing, so that the chunks of slots
        // pair with the outputs' (one unused when none are corrected).
        let stride = corrected.max(1);
        let mut corrections = vec![Correction::NONE; panels * NR * stride];
        // Each output's levels once, row by row, then packed from them.
        let mut levels = vec![0i8; n * k];
        let quantize = |(j, ((level, scale), (sum, fixes))): (usize, Output<'_>)| {
            let row = w.row(j);
            *scale = weight_scale(row, limit, corrected);
            for (l, &x) in level.iter_mut().zip(row) {
                *l = weight_level(x, *scale, limit);
            }
            *sum = level.iter().map(|&l| l as i32).sum();
            // The weights beyond the limit are at most the `corrected` largest
            // (the scale is the next one's), in column order.
            let beyond = row.iter().enumerate().filter_map(|(column, &x)| {
                let residual = full_level(x, *scale) - level[column] as i32;
                (residual != 0).then_some(Correction {
                    column: column as u32,
                    residual,
                })
            });
            for (slot, fix) in fixes[..corrected].iter_mut().zip(beyond) {
                *slot = fix;
                *sum += fix.residual;
            }
        };
        if k > 0 && parallel {
            levels
                .par_chunks_mut(k)
                .zip(scales[..n].par_iter_mut())
                .zip(
                    sums[..n]
                        .par_iter_mut()
                        .zip(corrections.par_chunks_mut(stride)),
                )
                .enumerate()
                .for_each(quantize);
        } else if k > 0 {
            levels
                .chunks_mut(k)
                .zip(scales[..n].iter_mut())
                .zip(sums[..n].iter_mut().zip(corrections.chunks_mut(stride)))
                .enumerate()
                .for_each(quantize);
        } else {
            // No weights: every row is all zeros.
            scales[..n].fill(1.0);
        }
        // Without corrections the unused slots go: a weight stays about a byte.
        corrections.truncate(panels * NR * corrected);
        corrections.shrink_to_fit();
        let panel = quads(k) * NR;
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
                let row = &levels[j * k..(j + 1) * k];
                for (q, slot) in slots.enumerate() {
                    let byte = |t: usize| row.get(4 * q + t).map_or(0, |&l| l as u8);
                    slot.write(u32::from_le_bytes([byte(0), byte(1), byte(2), byte(3)]));
                }
            }
        };
        // SAFETY: every panel's lanes are all written (or `panel` is 0).
        let data = unsafe {
            LargePageArray::filled(panels * panel, |dst| {
                if panel > 0 && parallel {
                    dst.par_chunks_mut(panel).enumerate().for_each(fill);
                } else if panel > 0 {
                    dst.chunks_mut(panel).enumerate().for_each(fill);
                }
            })
        };
        PackedInt8 {
            n,
            k,
            limit,
            data,
            scales,
            sums,
            corrected,
            corrections,
        }
    }

    /// As [`new`](Self::new) takes it: `Some(corrected)` if the weights were
    /// quantized to fewer levels than ±127, `None` if not.
    pub(crate) fn narrowing(&self) -> Option<usize> {
        (self.limit < WEIGHT_LEVELS).then_some(self.corrected)
    }

    /// `[n, k]`.
    pub(crate) fn dim(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The quantized weight `[n, k]`, dequantized to f32 (`ŵ · s_w`, corrected
    /// weights at their full levels).
    pub(crate) fn unpack(&self) -> Array2<f32> {
        Array2::from_shape_fn((self.n, self.k), |(j, kk)| {
            self.full_level(j, kk) as f32 * self.scales[j]
        })
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<u32>()
            + self.scales.len() * std::mem::size_of::<f32>()
            + self.sums.len() * std::mem::size_of::<i32>()
            + self.corrections.len() * std::mem::size_of::<Correction>()
    }

    /// Output `j`'s corrections.
    fn corrections(&self, j: usize) -> &[Correction] {
        &self.corrections[j * self.corrected..(j + 1) * self.corrected]
    }

    /// The weight `[j, kk]`'s full level: its packed one, plus its correction's
    /// residual if it has one.
    fn full_level(&self, j: usize, kk: usize) -> i32 {
        let residual = self
            .corrections(j)
            .iter()
            .find(|c| c.column as usize == kk && c.residual != 0);
        self.level(j, kk) as i32 + residual.map_or(0, |c| c.residual)
    }

    /// The quantized weight `ŵ[j, kk]`.
    fn level(&self, j: usize, kk: usize) -> i8 {
        let word = self.data[((j / NR) * quads(self.k) + kk / 4) * NR + j % NR];
        (word >> (8 * (kk % 4))) as u8 as i8
    }
}

/// The int8 product's operands: the quantized rows of `x` and the packed weight,
/// and the AMX tiles where they multiply them ([`amx`], [`tiles`]).
struct QuadOperands<'a> {
    x: &'a QuantizedRows,
    w: &'a PackedInt8,
    amx: Option<Amx>,
}

/// What [`QuadOperands::dequantize`] needs of one panel of 16 outputs from `j0`:
/// the sums of their levels, their scales and bias, and the packed panel.
pub(super) struct Dequantize<I: Simd> {
    j0: usize,
    sums: I::P,
    scales: I::V,
    bias: I::V,
    weights: *const u32,
}

/// What [`QuadOperands::dequantize`] needs of row `r`: its scale and zero
/// point, splatted.
pub(super) struct Row<I: Simd> {
    r: usize,
    scale: I::V,
    zero: I::P,
}

impl<I: Simd> Dequantize<I> {
    /// Panel `j0 / 16` of `w` (packed at `weights`), its outputs' `bias`.
    #[inline(always)]
    fn new(isa: I, w: &PackedInt8, j0: usize, weights: *const u32, bias: &[f32; NR]) -> Self {
        // SAFETY: sums and scales are kept for whole panels (padded past `n`).
        unsafe {
            Dequantize {
                j0,
                sums: isa.load_pairs(w.sums[j0..j0 + NR].as_ptr().cast()),
                scales: isa.load(w.scales[j0..j0 + NR].as_ptr()),
                bias: isa.load(bias.as_ptr()),
                weights,
            }
        }
    }
}

impl Depth for QuadOperands<'_> {
    /// The whole sum in one block: the i32 sums are exact only until they are
    /// turned into f32, which needs them whole. A tile's panels (`k/4 × 64`
    /// bytes each, 24 KiB at `k = 1536`) then come from L2, which keeps up with
    /// a tile's `vpdpbusd` (four panel loads per 24 of them).
    const BLOCK: usize = usize::MAX;

    fn depth(&self) -> usize {
        self.x.lda
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

impl Operands for QuadOperands<'_> {
    #[inline(always)]
    unsafe fn tile<I: Simd, const P: usize>(
        &self,
        isa: I,
        at: TileAt,
        _staged: &[f32],
        c: *mut f32,
        ldc: usize,
        init: [Init<'_>; P],
    ) {
        debug_assert!(
            at.s0 == 0 && at.sc == self.x.lda,
            "one block holds the whole sum"
        );
        const ZERO: [f32; NR] = [0.0; NR];
        let bias = init.map(|i| match i {
            Init::Bias(b) => b,
            Init::Zero => &ZERO,
            Init::Add => unreachable!("the sum is never split"),
        });
        // SAFETY: the caller's guarantees. Where `dot4` is `vpdpbusd` it is
        // exact for any packing, and the narrow product is the same instruction.
        unsafe {
            if !I::NATIVE_DOT4 && self.w.limit <= NARROW_LEVEL {
                self.tile_with::<I, P, true>(isa, at, c, ldc, bias)
            } else {
                self.tile_with::<I, P, false>(isa, at, c, ldc, bias)
            }
        }
    }
}

impl QuadOperands<'_> {
    /// [`Operands::tile`] with each quad's bytes multiplied by
    /// [`Simd::dot4_narrow`] if `NARROW`, by [`Simd::dot4`] if not.
    ///
    /// # Safety
    /// As [`Operands::tile`]'s; with `NARROW`, every weight level is at most
    /// [`NARROW_LEVEL`] in magnitude.
    #[inline(always)]
    unsafe fn tile_with<I: Simd, const P: usize, const NARROW: bool>(
        &self,
        isa: I,
        at: TileAt,
        c: *mut f32,
        ldc: usize,
        bias: [&[f32; NR]; P],
    ) {
        let TileAt { r, rows, p, .. } = at;
        let wide = I::NATIVE_DOT4 || NARROW;
        // SAFETY: the caller's guarantees (rows of `x`, panels of `w`, `c`'s rows),
        // split by panel and by rows below for 16-register instruction sets (no
        // recursion: it could not be inlined into the instruction set's entry point).
        unsafe {
            if I::REGISTERS < 32 {
                for (q, bias) in bias.iter().enumerate() {
                    for top in (0..rows).step_by(rows_16::<I>(NARROW)) {
                        let (r, c) = (r + top, c.add(top * ldc + q * NR));
                        let bias = [*bias];
                        match (rows - top).min(rows_16::<I>(NARROW)) {
                            1 => self.rows::<I, 1, 1, NARROW>(isa, r, p + q, c, ldc, bias),
                            2 => self.rows::<I, 2, 1, NARROW>(isa, r, p + q, c, ldc, bias),
                            3 => self.rows::<I, 3, 1, NARROW>(isa, r, p + q, c, ldc, bias),
                            4 if wide => self.rows::<I, 4, 1, NARROW>(isa, r, p + q, c, ldc, bias),
                            5 if wide => self.rows::<I, 5, 1, NARROW>(isa, r, p + q, c, ldc, bias),
                            _ if wide => self.rows::<I, 6, 1, NARROW>(isa, r, p + q, c, ldc, bias),
                            _ => unreachable!("at most rows_16 rows"),
                        }
                    }
                }
                return;
            }
            if rows > MR {
                debug_assert!(P == 2 && tile::tall::<I>(rows));
                let bias = [bias[0], bias[P - 1]];
                match rows {
                    12 => self.rows::<I, 12, 2, NARROW>(isa, r, p, c, ldc, bias),
                    11 => self.rows::<I, 11, 2, NARROW>(isa, r, p, c, ldc, bias),
                    10 => self.rows::<I, 10, 2, NARROW>(isa, r, p, c, ldc, bias),
                    9 => self.rows::<I, 9, 2, NARROW>(isa, r, p, c, ldc, bias),
                    8 => self.rows::<I, 8, 2, NARROW>(isa, r, p, c, ldc, bias),
                    _ => self.rows::<I, 7, 2, NARROW>(isa, r, p, c, ldc, bias),
                }
                return;
            }
            match rows {
                6 => self.rows::<I, 6, P, NARROW>(isa, r, p, c, ldc, bias),
                5 => self.rows::<I, 5, P, NARROW>(isa, r, p, c, ldc, bias),
                4 => self.rows::<I, 4, P, NARROW>(isa, r, p, c, ldc, bias),
                3 => self.rows::<I, 3, P, NARROW>(isa, r, p, c, ldc, bias),
                2 => self.rows::<I, 2, P, NARROW>(isa, r, p, c, ldc, bias),
                _ => self.rows::<I, 1, P, NARROW>(isa, r, p, c, ldc, bias),
            }
        }
    }

    /// `c[R, 16·P]` = rows `r .. r + R` of `x` times panels `p .. p + P`, the
    /// whole sum, dequantized, plus `bias`. `R · P ≤ 24` (`R ≤ 6`, or `P = 2` and
    /// `R ≤ tile::TALL_ROWS`) on 32-register instruction sets, `P = 1` and
    /// `R ≤ rows_16` elsewhere, so that the accumulators stay in registers; the
    /// bytes multiplied as [`tile_with`](Self::tile_with) says.
    ///
    /// # Safety
    /// Rows `r .. r + R` of `x` and panels `p .. p + P` of `w` must exist, and `c`
    /// be writable for `R` rows of `16·P` floats `ldc` apart; with `NARROW`, every
    /// weight level is at most [`NARROW_LEVEL`] in magnitude.
    #[inline(always)]
    unsafe fn rows<I: Simd, const R: usize, const P: usize, const NARROW: bool>(
        &self,
        isa: I,
        r: usize,
        p: usize,
        c: *mut f32,
        ldc: usize,
        bias: [&[f32; NR]; P],
    ) {
        debug_assert!(R * P <= 2 * tile::TALL_ROWS && (R <= MR || P <= 2));
        let (lda, x, w) = (self.x.lda, self.x, self.w);
        // SAFETY: every read is inside rows `r .. r + R` of `x` (`lda` quads each)
        // and the `lda` rows of 16 quads of panels `p .. p + P`; every write inside
        // the caller's `R` rows of `c`.
        unsafe {
            let a: [*const u32; R] = std::array::from_fn(|i| x.quads.as_ptr().add((r + i) * lda));
            let panel = |q: usize| w.data.as_ptr().add((p + q) * lda * NR);
            let b: [*const u32; P] = std::array::from_fn(panel);
            let mut acc = [[isa.splat_pair(0); R]; P];
            for s in 0..lda {
                // The weights stream from memory (a short text) or L2: asking for
                // each panel's line ahead keeps more reads in flight. A prefetch
                // past the panel is harmless (no fault, no UB with `wrapping_add`).
                #[cfg(target_arch = "x86_64")]
                for bq in &b {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch::<_MM_HINT_T0>(bq.wrapping_add((s + PREFETCH) * NR).cast());
                }
                let bv: [I::P; P] = std::array::from_fn(|q| isa.load_pairs(b[q].add(s * NR)));
                // Indices, not iterators: they keep the accumulators in registers
                // (as in `Tile::rows`).
                #[allow(clippy::needless_range_loop)]
                for i in 0..R {
                    let ai = isa.splat_pair(*a[i].add(s));
                    for q in 0..P {
                        acc[q][i] = if NARROW {
                            isa.dot4_narrow(acc[q][i], ai, bv[q])
                        } else {
                            isa.dot4(acc[q][i], ai, bv[q])
                        };
                    }
                }
            }
            let row: [Row<I>; R] = std::array::from_fn(|i| self.row(isa, r + i));
            #[allow(clippy::needless_range_loop)]
            for q in 0..P {
                let j0 = (p + q) * NR;
                let panel = Dequantize::new(isa, w, j0, b[q], bias[q]);
                for i in 0..R {
                    let y = self.dequantize::<I, NARROW>(isa, &panel, &row[i], acc[q][i]);
                    isa.store(c.add(i * ldc + q * NR), y);
                }
            }
        }
    }

    /// Row `r`'s quantization, splatted for [`dequantize`](Self::dequantize):
    /// once a row, not once a panel.
    #[inline(always)]
    fn row<I: Simd>(&self, isa: I, r: usize) -> Row<I> {
        let RowScale { scale, zero } = self.x.scales[r];
        Row {
            r,
            scale: isa.splat(scale),
            zero: isa.splat_pair(zero as u32),
        }
    }

    /// `row`'s 16 outputs of `panel` from their byte products' sum `acc`
    /// (`Σ x̂ ŵ`, exact): the zero point off in i32, then scales, outliers and
    /// bias in f32, as the module docs say.
    ///
    /// # Safety
    /// As [`outliers_share`](Self::outliers_share)'s for `panel.weights`.
    #[inline(always)]
    unsafe fn dequantize<I: Simd, const NARROW: bool>(
        &self,
        isa: I,
        panel: &Dequantize<I>,
        row: &Row<I>,
        acc: I::P,
    ) -> I::V {
        let (x, w, j0, r) = (self.x, self.w, panel.j0, row.r);
        let exact = if w.corrected > 0 {
            // `Σ x̂ ŵ + Σ residual · x̂[column] − z · Σ ŵ`, the last two in scalar
            // code, lane by lane.
            let offsets = self.corrected_offsets(isa, r, j0, x.scales[r].zero);
            isa.mul_sub_i32(acc, isa.splat_pair(1), offsets)
        } else {
            isa.mul_sub_i32(acc, row.zero, panel.sums)
        };
        let exact = isa.i32_to_f32(exact);
        if x.per_row == 0 {
            isa.fma(exact, isa.mul(row.scale, panel.scales), panel.bias)
        } else {
            // SAFETY: the caller's guarantee.
            let share = unsafe { self.outliers_share::<I, NARROW>(isa, r, j0, panel.weights) };
            isa.fma(isa.fma(exact, row.scale, share), panel.scales, panel.bias)
        }
    }

    /// `z · Σ ŵ[j] − Σ residual · x̂[r][column]` over the corrections of the 16
    /// outputs from `j0`, for row `r` of zero point `zero`: what comes off the
    /// tile's sum of a corrected packing, exact in i32.
    #[inline(always)]
    fn corrected_offsets<I: Simd>(&self, isa: I, r: usize, j0: usize, zero: i32) -> I::P {
        let (x, w) = (self.x, self.w);
        // SAFETY: the row's `lda` quads are `4 · lda` initialised bytes.
        let row = unsafe {
            std::slice::from_raw_parts(x.quads.as_ptr().add(r * x.lda).cast::<u8>(), 4 * x.lda)
        };
        let offsets: [u32; NR] = std::array::from_fn(|lane| {
            let fixes = w.corrections(j0 + lane);
            let share = fixes.iter().fold(0i32, |s, c| {
                s.wrapping_add(c.residual.wrapping_mul(row[c.column as usize] as i32))
            });
            zero.wrapping_mul(w.sums[j0 + lane]).wrapping_sub(share) as u32
        });
        // SAFETY: `offsets` is 16 u32s.
        unsafe { isa.load_pairs(offsets.as_ptr()) }
    }

    /// Row `r`'s outliers times the 16 quantized weights of their columns of the
    /// panel of outputs from `j0`, as f32, summed in column order from 0: each
    /// weight the `dot4` of its quad row (`panel`, 16 quads) with a quad of a
    /// single 1 at its byte, plus its correction's residual if it has one, exact,
    /// so the same on every instruction set.
    ///
    /// # Safety
    /// `panel` must point to a whole panel of `w`; with `NARROW`, every weight
    /// level is at most [`NARROW_LEVEL`] in magnitude.
    #[inline(always)]
    unsafe fn outliers_share<I: Simd, const NARROW: bool>(
        &self,
        isa: I,
        r: usize,
        j0: usize,
        panel: *const u32,
    ) -> I::V {
        let none = isa.splat_pair(0);
        let mut share = isa.splat(0.0);
        for o in self.x.outliers(r) {
            let column = o.column as usize;
            let one = isa.splat_pair(1 << (8 * (column % 4)));
            // SAFETY: the column is inside the row, so its quad row is in the panel.
            let quads = unsafe { isa.load_pairs(panel.add(column / 4 * NR)) };
            let weight = if NARROW {
                isa.dot4_narrow(none, one, quads)
            } else {
                isa.dot4(none, one, quads)
            };
            let mut weight = isa.i32_to_f32(weight);
            if self.w.corrected > 0 {
                // A corrected weight at its full level (sums of small integers:
                // exact in f32).
                let residuals: [u32; NR] = std::array::from_fn(|lane| {
                    let fixes = self.w.corrections(j0 + lane);
                    let fix = fixes.iter().find(|c| c.column == o.column);
                    fix.map_or(0, |c| c.residual) as u32
                });
                // SAFETY: `residuals` is 16 u32s.
                let residuals = unsafe { isa.load_pairs(residuals.as_ptr()) };
                weight = isa.add(weight, isa.i32_to_f32(residuals));
            }
            share = isa.fma(isa.splat(o.value), weight, share);
        }
        share
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::nn::Activation;
    use ndarray::{s, Array};

    /// Numbers of a few sizes and both signs, from a fixed generator; `shift`
    /// moves them (rows of one sign, as after a GELU).
    fn numbers(len: usize, seed: u64, shift: f32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 40) as f32 / (1u64 << 24) as f32;
                let scale = [0.03, 0.5, 2.0][(state >> 8) as usize % 3];
                (u - 0.5) * scale + shift
            })
            .collect()
    }

    fn operands(m: usize, k: usize, n: usize) -> (Array2<f32>, Array2<f32>, Vec<f32>) {
        let x = Array::from_shape_vec((m, k), numbers(m * k, 1 + m as u64, 0.1)).unwrap();
        let w = Array::from_shape_vec((n, k), numbers(n * k, 2 + k as u64, 0.0)).unwrap();
        (x, w, numbers(n, 3, 0.0))
    }

    /// The row's `count` outliers by their definition (the entries of largest
    /// magnitude, the earlier of two the same size; no zero, NaN or infinity, and
    /// none at all in a row with an infinity), as (column, value) in column order.
    fn outliers_of(row: &[f32], count: usize) -> Vec<(usize, f32)> {
        if row.iter().any(|x| x.is_infinite()) {
            return Vec::new();
        }
        let mut order: Vec<usize> = (0..row.len()).filter(|&c| row[c].abs() > 0.0).collect();
        order.sort_by(|&a, &b| row[b].abs().total_cmp(&row[a].abs()).then(a.cmp(&b)));
        let mut kept: Vec<(usize, f32)> =
            order.into_iter().take(count).map(|c| (c, row[c])).collect();
        kept.sort_by_key(|&(c, _)| c);
        kept
    }

    /// Each row of `x` quantized in the portable code with its `count` outliers
    /// left out (as zeros), its scale and its outliers: every instruction set's
    /// product is held to these levels.
    #[allow(clippy::type_complexity)]
    fn quantized(
        x: &Array2<f32>,
        count: usize,
    ) -> (Vec<Vec<u8>>, Vec<RowScale>, Vec<Vec<(usize, f32)>>) {
        let IsaToken::Portable(portable) = Isa::Portable.token().unwrap() else {
            unreachable!("the portable token")
        };
        let (mut levels, mut scales, mut kept) = (Vec::new(), Vec::new(), Vec::new());
        for row in x.rows() {
            let mut src = row.to_vec();
            let outliers = outliers_of(&src, count);
            for &(c, _) in &outliers {
                src[c] = 0.0;
            }
            let mut dst = vec![MaybeUninit::new(0u32); quads(src.len())];
            scales.push(quantize_row(portable, &src, &mut [], &mut dst));
            // SAFETY: `quantize_row` wrote every quad.
            let words = dst.iter().map(|d| unsafe { d.assume_init() });
            levels.push(words.flat_map(u32::to_le_bytes).take(src.len()).collect());
            kept.push(outliers);
        }
        (levels, scales, kept)
    }

    /// The int8 product by its definition: the sums of products of the quantized
    /// numbers in i64, less the zero point's share, then the one rounding to f32
    /// and the fused multiply-adds of the module docs (with outliers, their share
    /// summed in column order and added before the weight's scale). The exact answer every instruction set
    /// must give, bit for bit.
    fn reference(x: &Array2<f32>, w: &PackedInt8, count: usize, bias: &[f32]) -> Array2<f32> {
        let (levels, scales, kept) = quantized(x, count);
        Array2::from_shape_fn((x.nrows(), w.n), |(i, j)| {
            let sum: i64 = (0..x.ncols())
                .map(|kk| {
                    (levels[i][kk] as i64 - scales[i].zero as i64) * w.full_level(j, kk) as i64
                })
                .sum();
            let exact = i32::try_from(sum).expect("fits i32");
            if count == 0 {
                return (exact as f32).mul_add(scales[i].scale * w.scales[j], bias[j]);
            }
            let share = kept[i]
                .iter()
                .fold(0.0f32, |s, &(c, v)| v.mul_add(w.full_level(j, c) as f32, s));
            (exact as f32)
                .mul_add(scales[i].scale, share)
                .mul_add(w.scales[j], bias[j])
        })
    }

    /// `x` with `count` entries a row far larger than the rest (of both signs,
    /// spread over the row, in other columns in each row), as a LayerNorm's
    /// outlier channels.
    fn with_outliers(mut x: Array2<f32>, count: usize) -> Array2<f32> {
        let k = x.ncols();
        for (i, mut row) in x.rows_mut().into_iter().enumerate() {
            for t in 0..count.min(k) {
                let c = (i * 7 + t * (k / count.max(1)).max(1) + k - 1) % k;
                row[c] = if t % 2 == 0 {
                    40.0 + t as f32
                } else {
                    -25.0 - t as f32
                };
            }
        }
        x
    }

    /// The outlier counts the tests run: none, and the encoders'.
    const COUNTS: [usize; 2] = [0, 4];

    /// The weights' packings, as (limit, weights corrected per output): bytes of
    /// ±127 (`vpdpbusd`, or widened to 16 bits), and of ±63 (`vpmaddubsw`
    /// without VNNI), uncorrected and with the encoders' corrections.
    const PACKINGS: [(i8, usize); 3] = [(WEIGHT_LEVELS, 0), (NARROW_LEVEL, 0), (NARROW_LEVEL, 4)];

    #[test]
    fn the_bits_of_the_i64_reference_on_every_edge_and_instruction_set() {
        // Row counts on both sides of the 6-row tile, of the two-panel tile of up
        // to 12 rows and of the 3-row one of 16-register instruction sets; partial
        // panels; depths not a multiple of 4; depths of the encoders. AMX's tiles
        // (depths of whole 64-byte steps): 16 and 32 rows, one or two panels,
        // partial ones, and blocks of rows that each dequantize the one before
        // while they sum, across panel pairs and row blocks.
        for &(m, k, n) in &[
            (1, 1, 1),
            (1, 4, 16),
            (2, 5, 17),
            (3, 7, 31),
            (5, 33, 16),
            (6, 384, 64),
            (7, 385, 40),
            (12, 768, 48),
            (13, 769, 33),
            (50, 1000, 70),
            (97, 1536, 384),
            (487, 130, 40),
            (17, 64, 33),
            (40, 320, 70),
            (33, 256, 16),
            (250, 128, 50),
        ] {
            let (x, w, bias) = operands(m, k, n);
            for (limit, corrected) in PACKINGS {
                // Three weights an output far beyond the rest for the corrections.
                let w = with_outliers(w.clone(), if corrected > 0 { 3 } else { 0 });
                let packed = PackedInt8::with_limit(w.view(), limit, corrected, false);
                for count in COUNTS {
                    let x = with_outliers(x.clone(), count);
                    let want = reference(&x, &packed, count, &bias);
                    for isa in Isa::available() {
                        let token = isa.token().unwrap();
                        let y = linear_int8_on(
                            token,
                            x.view(),
                            &packed,
                            count,
                            Some(&bias),
                            Epilogue::None,
                        );
                        assert_eq!(
                            y, want,
                            "{isa} {m}x{k}x{n}, ±{limit} {corrected} corrected, {count} outliers"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn outliers_are_the_largest_magnitudes_earliest_first() {
        let IsaToken::Portable(portable) = Isa::Portable.token().unwrap() else {
            unreachable!("the portable token")
        };
        // The row's outliers, and its levels, against those of the row with
        // zeros in the outliers' places, quantized without outliers.
        let split = |row: &[f32], slots: usize| {
            let mut kept = vec![Outlier::NONE; slots];
            let mut dst = vec![MaybeUninit::new(0u32); quads(row.len())];
            let scale = quantize_row(portable, row, &mut kept, &mut dst);
            let mut zeroed = row.to_vec();
            for o in kept.iter().filter(|o| o.value != 0.0) {
                zeroed[o.column as usize] = 0.0;
            }
            let mut want = vec![MaybeUninit::new(0u32); quads(row.len())];
            let want_scale = quantize_row(portable, &zeroed, &mut [], &mut want);
            let words = |d: &[MaybeUninit<u32>]| -> Vec<u32> {
                // SAFETY: `quantize_row` wrote every quad of both.
                d.iter().map(|w| unsafe { w.assume_init() }).collect()
            };
            assert_eq!(words(&dst), words(&want), "{row:?}");
            assert_eq!(scale.zero, want_scale.zero, "{row:?}");
            assert!(
                scale.scale == want_scale.scale
                    || (scale.scale.is_nan() && want_scale.scale.is_nan())
            );
            kept
        };
        let at = |column, value| Outlier { column, value };
        let row = [0.5, -3.0, 2.0, 3.0, 0.0, -2.0, 0.25, 1.0];
        assert_eq!(split(&row, 3), [at(1, -3.0), at(2, 2.0), at(3, 3.0)]);
        // Fewer non-zero entries than slots: the rest stay unused.
        assert_eq!(
            split(&[0.0, 1.5, 0.0], 3),
            [Outlier::NONE, Outlier::NONE, at(1, 1.5)]
        );
        // An infinity or a NaN keeps nothing out.
        assert_eq!(split(&[9.0, f32::INFINITY, 1.0], 3), [Outlier::NONE; 3]);
        assert_eq!(split(&[9.0, f32::NAN, 1.0], 2), [Outlier::NONE; 2]);
        // Across vectors, in a row longer than one, the first of two the same size.
        let long: Vec<f32> = (0..70)
            .map(|i| match i {
                65 => -9.0,
                3 | 40 => 8.0,
                _ => 0.1 * (i % 7) as f32 - 0.3,
            })
            .collect();
        assert_eq!(split(&long, 2), [at(3, 8.0), at(65, -9.0)]);
        assert_eq!(split(&long, 3), [at(3, 8.0), at(40, 8.0), at(65, -9.0)]);
        // Several in one vector.
        let mut dense = long.clone();
        dense[66] = 7.0;
        assert_eq!(split(&dense, 3), [at(3, 8.0), at(40, 8.0), at(65, -9.0)]);
        assert_eq!(
            split(&dense, 4),
            [at(3, 8.0), at(40, 8.0), at(65, -9.0), at(66, 7.0)]
        );
    }

    #[test]
    fn within_the_quantization_error_of_the_f64_product() {
        // Each input moves by at most half its row's step (`s_x / 2`, the f32
        // arithmetic of the quantization adding a few ulps of 255 steps: 0.51),
        // each weight by half its output's (`s_w / 2`, likewise 0.51), so
        // |y − x·w| ≤ Σ_k 0.51 s_x |ŵ_k s_w| + |x_k| · 0.51 s_w, plus the final
        // f32 roundings of a few ulps of the sum's terms (four, and one more for
        // each outlier's term). An outlier is not quantized: no `s_x` term for
        // it, and `s_x` is the step of the rest of its row. Rows with outliers
        // forty times the rest hold the product to that smaller step, which
        // quantizing them would multiply by about forty.
        for (&(m, k, n), (limit, corrected)) in [(3, 64, 20), (13, 768, 48), (40, 1536, 33)]
            .iter()
            .flat_map(|shape| PACKINGS.map(|packing| (shape, packing)))
        {
            let (x, w, bias) = operands(m, k, n);
            let packed = PackedInt8::with_limit(w.view(), limit, corrected, false);
            let dequantized = packed.unpack();
            for count in COUNTS {
                let x = with_outliers(x.clone(), 4);
                let y = linear_int8(x.view(), &packed, count, Some(&bias), Epilogue::None);
                let (_, scales, kept) = quantized(&x, count);
                for i in 0..m {
                    let exact_input = |kk: usize| kept[i].iter().any(|&(c, _)| c == kk);
                    for j in 0..n {
                        let exact = (0..k).fold(bias[j] as f64, |s, kk| {
                            s + x[[i, kk]] as f64 * w[[j, kk]] as f64
                        });
                        let s_x = scales[i].scale as f64;
                        let s_w = packed.scales[j] as f64;
                        let (mut bound, mut size) = (0.0f64, bias[j].abs() as f64);
                        for kk in 0..k {
                            let (xv, wv) =
                                (x[[i, kk]].abs() as f64, dequantized[[j, kk]].abs() as f64);
                            let step = if exact_input(kk) { 0.0 } else { s_x };
                            bound += 0.51 * step * wv + xv * 0.51 * s_w;
                            size += (xv + step) * wv;
                        }
                        let roundings = 4.0 + kept[i].len() as f64;
                        let bound = bound + roundings * f32::EPSILON as f64 * size;
                        let err = (y[[i, j]] as f64 - exact).abs();
                        assert!(
                            err <= bound,
                            "{m}x{k}x{n}, {count} outliers [{i}, {j}]: {err:e} > {bound:e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_is_quantized_within_half_a_step_with_zero_exact() {
        let rows = [
            numbers(37, 5, 0.0),
            numbers(64, 6, 1.5),
            numbers(9, 7, -3.0),
            vec![0.0; 5],
            vec![0.25; 6],
        ];
        for src in rows {
            let x = Array2::from_shape_vec((1, src.len()), src.clone()).unwrap();
            let (levels, scales, _) = quantized(&x, 0);
            let RowScale { scale, zero } = scales[0];
            assert!((0..=255).contains(&zero));
            for (&v, &q) in src.iter().zip(&levels[0]) {
                let back = scale * (q as f32 - zero as f32);
                assert!((back - v).abs() <= 0.51 * scale, "{v} -> {q} -> {back}");
                if v == 0.0 {
                    assert_eq!(q as i32, zero, "zero is a level");
                }
            }
        }
    }

    #[test]
    fn a_non_finite_input_or_weight_gives_nan_outputs() {
        // An infinity, a NaN in a whole vector of the row and a −∞ in its last,
        // partial one, on every instruction set.
        let (mut x, mut w, bias) = operands(5, 37, 20);
        x[[1, 4]] = f32::INFINITY;
        x[[3, 20]] = f32::NAN;
        x[[4, 36]] = f32::NEG_INFINITY;
        w[[5, 2]] = f32::NAN;
        let packed = PackedInt8::new(w.view(), None, false);
        for isa in Isa::available() {
            let token = isa.token().unwrap();
            for count in COUNTS {
                let y =
                    linear_int8_on(token, x.view(), &packed, count, Some(&bias), Epilogue::None);
                for ((i, j), v) in y.indexed_iter() {
                    let poisoned = matches!(i, 1 | 3 | 4) || j == 5;
                    assert_eq!(
                        v.is_nan(),
                        poisoned,
                        "{isa}, {count} outliers [{i}, {j}] = {v}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_in_a_batch_and_strided() {
        for (&(k, n), count) in [(400, 40), (1536, 48)].iter().zip(COUNTS.iter().rev()) {
            let (x, w, bias) = operands(30, k, n);
            let x = with_outliers(x, *count);
            let packed = PackedInt8::new(w.view(), None, false);
            let product = |x| linear_int8(x, &packed, *count, Some(&bias), Epilogue::None);
            let all = product(x.view());
            for m in [1, 5, 6, 7, 12, 13, 30] {
                let y = product(x.slice(s![..m, ..]));
                assert_eq!(y, all.slice(s![..m, ..]), "{m} rows of {k}x{n}");
            }
            let xt = x.t().as_standard_layout().into_owned();
            assert_eq!(product(xt.t()), all);
        }
    }

    #[test]
    fn same_bits_whatever_the_thread_count() {
        // One row block, and three (`MC`).
        for m in [5, 200, 3 * super::super::MC - 7] {
            let (x, w, bias) = operands(m, 1536, 384);
            for (limit, corrected) in PACKINGS {
                let packed = PackedInt8::with_limit(w.view(), limit, corrected, true);
                for (isa, count) in Isa::available().into_iter().zip(COUNTS.iter().cycle()) {
                    let token = isa.token().unwrap();
                    let x = with_outliers(x.clone(), *count);
                    let run = |threads: usize| {
                        crate::threads::pool(threads).unwrap().install(|| {
                            linear_int8_on(
                                token,
                                x.view(),
                                &packed,
                                *count,
                                Some(&bias),
                                Epilogue::None,
                            )
                        })
                    };
                    let one = run(1);
                    assert_eq!(run(2), one, "{isa} ±{limit}, {count} outliers");
                    assert_eq!(run(3), one, "{isa} ±{limit}, {count} outliers");
                }
            }
        }
    }

    #[test]
    fn the_fused_activation_equals_the_separate_one() {
        for (m, count) in [(3, 0), (40, 0), (40, 4)] {
            let (x, w, bias) = operands(m, 64, 50);
            let x = with_outliers(x, count);
            let packed = PackedInt8::new(w.view(), None, false);
            let product = |epilogue| linear_int8(x.view(), &packed, count, Some(&bias), epilogue);
            let fused = product(Epilogue::Act(Activation::Gelu));
            let mut separate = product(Epilogue::None);
            Activation::Gelu.apply(separate.as_slice_mut().unwrap());
            assert_eq!(fused, separate, "{m} rows, {count} outliers");
        }
    }

    #[test]
    fn packing_keeps_levels_scales_sums_and_corrections() {
        // A row of zeros, and rows with three weights far larger than the rest.
        let (_, w, _) = operands(1, 21, 24);
        let mut w = with_outliers(w, 3);
        w.row_mut(7).fill(0.0);
        for (limit, corrected) in PACKINGS {
            let packed = PackedInt8::with_limit(w.view(), limit, corrected, false);
            let (mut extremes, mut beyond) = (0, 0);
            for j in 0..24 {
                let mut sizes: Vec<f32> = w.row(j).iter().map(|v| v.abs()).collect();
                sizes.sort_by(|a, b| b.total_cmp(a));
                let scale = packed.scales[j];
                if sizes[0] == 0.0 {
                    assert_eq!(scale, 1.0);
                } else if corrected == 0 {
                    assert_eq!(scale, sizes[0] / limit as f32);
                } else {
                    // The (corrected + 1)-th largest at the limit.
                    assert_eq!(scale, sizes[corrected] / limit as f32);
                }
                let mut sum = 0;
                for kk in 0..21 {
                    let full = (w[[j, kk]] / scale).round_ties_even();
                    let level = packed.level(j, kk);
                    assert_eq!(level as f32, full.clamp(-limit as f32, limit as f32));
                    assert_eq!(packed.full_level(j, kk) as f32, full, "[{j}, {kk}]");
                    extremes += (level.abs() == limit) as usize;
                    beyond += (full.abs() > limit as f32) as usize;
                    sum += full as i32;
                }
                assert_eq!(packed.sums[j], sum);
            }
            // Each non-zero output's largest weight reaches the limit; with
            // corrections, its three large ones go beyond it.
            assert!(extremes >= 23, "±{limit}: {extremes}");
            assert!(packed.sums[24..].iter().all(|&s| s == 0));
            let corrections = packed.corrections.iter().filter(|c| c.residual != 0);
            assert_eq!(corrections.count(), beyond);
            assert!(beyond <= corrected * 23 && beyond >= corrected.min(3) * 23);
        }
    }

    #[test]
    fn the_packing_follows_the_instruction_set() {
        // ±127 where `vpdpbusd` multiplies, ±63 (`vpmaddubsw`) elsewhere.
        for isa in Isa::available() {
            let want = match isa {
                Isa::Avx2Vnni | Isa::Avx512Bf16 | Isa::Amx => 127,
                Isa::Portable | Isa::Avx2 | Isa::Avx512 => 63,
            };
            assert_eq!(weight_limit(isa.token().unwrap()), want, "{isa}");
        }
        let (_, w, _) = operands(1, 40, 16);
        let narrowed = PackedInt8::new(w.view(), Some(0), false);
        assert_eq!(narrowed.limit, weight_limit(IsaToken::best()));
        assert_eq!(PackedInt8::new(w.view(), None, false).limit, 127);
    }

    #[test]
    fn no_rows_no_depth_and_no_bias() {
        let (x, w, bias) = operands(4, 0, 5);
        let packed = PackedInt8::new(w.view(), None, false);
        let y = linear_int8(x.view(), &packed, 4, Some(&bias), Epilogue::None);
        assert_eq!(y, Array2::from_shape_fn((4, 5), |(_, j)| bias[j]));
        let (x, w, _) = operands(0, 9, 5);
        let packed = PackedInt8::new(w.view(), None, false);
        assert_eq!(
            linear_int8(x.view(), &packed, 4, None, Epilogue::None).dim(),
            (0, 5)
        );
        let (x, w, _) = operands(3, 9, 5);
        let packed = PackedInt8::new(w.view(), None, false);
        for count in COUNTS {
            let y = linear_int8(x.view(), &packed, count, None, Epilogue::None);
            assert_eq!(y, reference(&x, &packed, count, &[0.0; 5]));
        }
    }
}
