//! The fused forward on bf16 tensors: the f32 kernel's tiling and online softmax,
//! with both products taken on bf16 *pairs* ([`Simd::dot2`]), which AVX512-BF16
//! computes at twice the f32 rate (`vdpbf16ps`) and other instruction sets with
//! two fused multiply-adds, to the same sums. Attention runs it only where the
//! instruction set has bf16 products; elsewhere bf16 inputs are widened for the
//! f32 kernel, which is faster there (`attention::bf16`).
//!
//! `dot2` multiplies lane by lane two vectors of pairs adjacent along the sum, so
//! each product needs its operands paired along its own sum:
//!
//! * `Sᵀ = K Qᵀ` sums over the width `E`: `Qᵀ` is packed once per unit as pairs of
//!   adjacent columns, `[E/2][W]`, and each key row is read in place as pairs
//!   (`K`'s rows must be contiguous);
//! * `Oᵀ = Vᵀ Pᵀ` sums over keys: the tile's weights are rounded to bf16 once and
//!   packed as pairs of adjacent keys, `[BK/2][W]`, and the tile's values as pairs
//!   of adjacent rows, `[BK/2][Ev]`.
//!
//! Scores, the softmax statistics and the output accumulate in f32; the output is
//! rounded to bf16 as each unit writes it out. A width or tile of odd length ends
//! with a pair whose high half is zero.

use ndarray::{Array4, ArrayView2, ArrayView4, ArrayViewMut2, ShapeBuilder};
use rayon::prelude::*;

use super::{
    drive, exp_shifted, head_ptr, join_sums, masked_score, panel_maxima, query_vectors,
    register_block, running_max, score_blocks, seen_products, value_blocks,
};
use super::{MaskRows, Operands, RegisterBlocks, Stats, UnitAt, BK, EARLY_SLACK};
use crate::element::bf16;
use crate::isa::transpose::transpose;
use crate::isa::{bf16_to_f32, dispatch, IsaToken, Simd, SimdJob, LANES};
use crate::kernels::lse::LogSumExp;
use crate::kernels::scratch::carve;
use crate::kernels::tile::{Ahead, Rescale, Tile, PAIR_SUM_BLOCK};
use crate::problem::{Dims, Problem};

/// Pairs (two products each) a dot product sums in registers before it joins its
/// running total in memory. The f32 kernel joins every 32 products to keep long f32
/// sums accurate; here the output is rounded to bf16 (relative error up to 2⁻⁹),
/// which dwarfs the f32 rounding of a 64-product sum (64 · 2⁻²⁴ at worst), so one
/// chunk covers a 64-wide head and saves its partial sums the trip through memory
/// (with 16 products a chunk, those loads, adds and stores took about a tenth of
/// the samples of `perf record` at B1 H8 N2048 d64 on AVX512-BF16).
const PAIR_CHUNK: usize = 32;

/// Whether the bf16 kernel can read this problem's tensors in place: rows of `k`
/// and `v` contiguous (the caller copies them otherwise).
pub fn reads_in_place(p: &Problem<'_, bf16>) -> bool {
    let unit = |a: &ArrayView4<'_, bf16>| a.strides()[3] == 1 || a.shape()[3] <= 1;
    unit(&p.k) && unit(&p.v)
}

/// Pairs in a row of `n` elements.
pub(super) fn pairs(n: usize) -> usize {
    n.div_ceil(2)
}

/// Runs the bf16 fused forward on the current rayon pool with `isa`'s vectors,
/// returning the output `[B, Hq, L, Ev]` (accumulated in f32, each value rounded to
/// bf16 once) and the log-sum-exp `[B, Hq, L]`.
///
/// # Panics
/// If `!supports(p)` or `!reads_in_place(p)` (both checked by the caller).
pub(crate) fn run(p: &Problem<'_, bf16>, isa: IsaToken) -> (Array4<bf16>, LogSumExp) {
    assert!(reads_in_place(p), "bf16 fused kernel needs contiguous rows");
    let ops = Bf16Operands {
        p,
        scale: p.scale,
        values: ValuePairs::new(p, isa),
    };
    drive(&ops, isa)
}

/// A tile whose weights its score products make early ([`Operands::begin_tile`]):
/// its keys.
#[derive(Clone, Copy)]
struct Early {
    keys: (usize, usize),
}

/// The rows of `16·NQ` floats of a unit's early-weights scratch: each panel's sum
/// of the tile's early weights, its maximum score, and the maximum the weights are
/// made against (the stats' running maximum, −∞ raised to the lowest float as
/// [`super::running_max`] does, then raised to the tile's first block's largest
/// score where that is larger), set by [`Operands::begin_tile`] and the first
/// block's score products.
#[derive(Clone, Copy)]
enum EarlyStats {
    Sum = 0,
    Top = 1,
    Against = 2,
}

/// Row `row` of the early-weights scratch `stats`, panel `x`.
///
/// # Safety
/// `stats` valid for three rows of `16·NQ` floats.
#[inline(always)]
unsafe fn early_row<const NQ: usize>(stats: *mut f32, row: EarlyStats, x: usize) -> *mut f32 {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe { stats.add(row as usize * NQ * LANES + x * LANES) }
}

/// What one register block of score products needs for the early weights: the
/// tile's [`EarlyStats`] rows; the row of weight pairs the block's first key falls
/// in; and whether the block starts the tile (nothing before it to make weights
/// for) or ends it (it makes its own; every other block's are made during the next
/// block's products).
#[derive(Clone, Copy)]
struct EarlyRows {
    stats: *mut f32,
    pp: *mut u32,
    first: bool,
    last: bool,
    /// Keys in every block but the tile's last (which may have fewer).
    block: usize,
}

/// The bf16 problem, with what its units share.
struct Bf16Operands<'a, 'p> {
    p: &'a Problem<'p, bf16>,
    /// The scores' scale.
    scale: f32,
    values: ValuePairs,
}

/// A bf16 unit: its packed queries, the buffers for a tile's pairs, and where its
/// key/value head starts.
struct Bf16Unit<'s> {
    /// `Qᵀ` as pairs of columns, `[E/2][W]`.
    qp: &'s mut [u32],
    /// Weights as bf16 pairs of keys, `[BK/2][W]` (written by the score products'
    /// early weights as well as by [`Operands::weights`]).
    pp: *mut u32,
    /// The current tile's early weights, if it makes them ([`Operands::begin_tile`]).
    early: Option<Early>,
    /// The tile's early-weights rows ([`EarlyStats`]), `[3][W]`.
    early_stats: *mut f32,
    /// Whether the tile's rescale factors are all one (its early weights held).
    alpha_one: bool,
    /// Values as bf16 pairs of rows, `[BK/2][Evp]` (`Evp` = `Ev` rounded up to 16),
    /// for a tile that cannot read them from [`ValuePairs`].
    vp: &'s mut [u32],
    /// The current tile's value pairs: `vp` or the call's [`ValuePairs`].
    tile_values: *const u32,
    /// Whether every value of the unit's head is finite ([`ValuePairs::head_finite`]).
    head_finite: bool,
    /// The head's keys and values as bf16 bits: base pointer and row stride.
    k: (*const u16, isize),
    v: (*const u16, isize),
    /// The head width `E`, the value width `Ev` and `Ev` rounded up to 16 (the
    /// value pairs' row length), read once per unit rather than per register block.
    e: usize,
    ev: usize,
    evp: usize,
}

impl<'p> Operands<'p> for Bf16Operands<'_, 'p> {
    type Elem = bf16;
    type KvElem = bf16;
    type Out = bf16;
    type Unit<'s> = Bf16Unit<'s>;

    fn problem(&self) -> &Problem<'p, bf16> {
        self.p
    }

    /// Not narrowed to fit the register block as the f32 kernel's units are: on AVX2
    /// the pair products are bound by the shuffles that emulate them, not by loads,
    /// and one vector of queries measured 0.94× (docs/fused-forward.md). But banded
    /// units stay at most 2 vectors there: 4 measured 0.985× (causal N2048).
    fn query_vectors(&self, registers: usize) -> usize {
        let nq = query_vectors(self.p);
        if registers < 32 && self.p.is_banded() {
            nq.min(2)
        } else {
            nq
        }
    }

    fn scratch_len(d: &Dims, w: usize) -> usize {
        (2 * pairs(d.head_dim) + pairs(BK) + 3) * w
            + pairs(BK) * d.value_dim.next_multiple_of(LANES)
    }

    #[inline(always)]
    fn start<'s, I: Simd, const NQ: usize>(
        &self,
        isa: I,
        at: &UnitAt,
        rest: &mut &'s mut [f32],
    ) -> Bf16Unit<'s> {
        let w = NQ * LANES;
        let d = self.p.dims();
        let e = d.head_dim;
        let np = pairs(e);
        let qp = carve(rest, np * w);
        let rows = carve(rest, np * w);
        let pp = as_words(carve(rest, pairs(BK) * w)).as_mut_ptr();
        let early_stats = carve(rest, 3 * w).as_mut_ptr();
        let vp = as_words(carve(rest, pairs(BK) * d.value_dim.next_multiple_of(LANES)));
        pack_query_pairs(isa, self.p, at, (qp, rows), w);
        let qp = as_words(qp);
        let head = |a: &ArrayView4<'_, bf16>| {
            let (base, rs, _) = head_ptr(a, at.b, at.kvh);
            (base as *const u16, rs)
        };
        Bf16Unit {
            qp,
            pp,
            early: None,
            early_stats,
            alpha_one: false,
            vp,
            tile_values: std::ptr::null(),
            head_finite: self.values.head_finite((at.b, at.kvh)),
            k: head(&self.p.k),
            v: head(&self.p.v),
            e,
            ev: d.value_dim,
            evp: d.value_dim.next_multiple_of(LANES),
        }
    }

    /// Early weights pair the keys of each register block, so only where blocks are
    /// even.
    #[inline(always)]
    unsafe fn begin_tile<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &mut Bf16Unit<'_>,
        keys: (usize, usize),
        stats: Stats,
    ) {
        let early = self.register_block::<I, NQ>() % 2 == 0;
        u.early = early.then_some(Early { keys });
        if !early {
            return;
        }
        for x in 0..NQ {
            // SAFETY: `early_stats` holds three rows of `16·NQ` floats, `stats.m` one
            // (the caller's contract).
            unsafe {
                let at = |row| early_row::<NQ>(u.early_stats, row, x);
                let m = isa.load(stats.m.add(x * LANES));
                isa.store(at(EarlyStats::Sum), isa.splat(0.0));
                isa.store(at(EarlyStats::Top), isa.splat(f32::NEG_INFINITY));
                isa.store(at(EarlyStats::Against), isa.max(isa.splat(f32::MIN), m));
            }
        }
    }

    #[inline(always)]
    unsafe fn weights<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &mut Bf16Unit<'_>,
        at: &UnitAt,
        (j0, j1): (usize, usize),
        s: *mut f32,
        stats: Stats,
    ) {
        let nk = j1 - j0;
        // SAFETY: the caller upholds `s` and `stats`; `pp` holds `pairs(BK)` rows of
        // `16·NQ` pairs, `early_stats` three rows of `16·NQ` floats.
        unsafe {
            u.alpha_one = if u.early.is_some() && early_weights_hold::<I, NQ>(isa, u.early_stats) {
                keep_early_sums::<I, NQ>(isa, u.early_stats, stats)
            } else {
                softmax_pairs::<I, NQ>(isa, s, nk, u.pp, stats);
                false
            };
        }
        // The values as pairs of rows: packed for the whole call where the tile's
        // pairs are the head's, here otherwise.
        u.tile_values = match self.values.tile((at.b, at.kvh), (j0, j1)) {
            Some(pairs) => pairs.as_ptr(),
            None => {
                let (vp, vrs) = u.v;
                // SAFETY: value rows `j0..j1` are inside the head, `ev` contiguous
                // bf16 each (`reads_in_place`); `vp` holds `pairs(BK) ≥ pairs(nk)`
                // rows of `Evp ≥ ev` pairs.
                unsafe {
                    pack_value_pairs(
                        (vp.offset(j0 as isize * vrs), vrs),
                        (nk, u.ev),
                        u.vp.as_mut_ptr(),
                        u.evp,
                    )
                };
                u.vp.as_ptr()
            }
        };
    }

    #[inline(always)]
    fn values_finite<I: Simd>(&self, _: I, u: &Bf16Unit<'_>, (j0, j1): (usize, usize)) -> bool {
        // SAFETY: value rows `j0..j1` are inside the head (the caller's tile), `ev`
        // contiguous bf16 each (`reads_in_place`).
        u.head_finite
            || unsafe { rows_finite((u.v.0.offset(j0 as isize * u.v.1), u.v.1), (j1 - j0, u.ev)) }
    }

    #[inline(always)]
    unsafe fn value_cols_seen<I: Simd, const NQ: usize>(
        &self,
        _: I,
        u: &Bf16Unit<'_>,
        (j0, j1): (usize, usize),
        _: *const f32,
        ot: *mut f32,
        alpha: *const f32,
        mask: MaskRows,
    ) {
        let (vp, vrs) = u.v;
        // SAFETY: the caller upholds `Operands::value_cols_seen`'s contract; value
        // rows hold `ev` contiguous bf16 (`reads_in_place`), `pp` the tile's
        // weights (the last `weights` call).
        unsafe {
            seen_pair_products(
                ((vp, vrs, 1), u.ev),
                u.pp,
                NQ * LANES,
                (j0, j1),
                ot,
                alpha,
                mask,
            )
        }
    }

    #[inline(always)]
    unsafe fn score_tile<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &Self::Unit<'_>,
        keys: (usize, usize),
        s: *mut f32,
        mask: MaskRows,
    ) {
        // SAFETY: the caller upholds `Operands::score_tile`'s contract.
        unsafe { score_blocks::<I, NQ, Self>(self, isa, u, keys, s, mask) }
    }

    #[inline(always)]
    unsafe fn value_tile<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &Self::Unit<'_>,
        keys: (usize, usize),
        s: *const f32,
        ot: *mut f32,
        rescale: Rescale<'_>,
    ) {
        // SAFETY: the caller upholds `Operands::value_tile`'s contract.
        unsafe { value_blocks::<I, NQ, Self>(self, isa, u, keys, s, ot, rescale) }
    }
}

impl<'p> RegisterBlocks<'p> for Bf16Operands<'_, 'p> {
    /// All `NQ` panels in registers on every instruction set: the pair products'
    /// own register blocks (`qk_rows`, the tile of value pairs) take the unit's
    /// panels together. On 32 registers, 16 accumulators (four keys of four panels,
    /// eight of two) rather than 24: the score products then leave registers for
    /// the early weights made between their steps (docs/bf16.md; with 24, causal
    /// problems with units of two panels ran 16–19 % slower).
    fn register_block<I: Simd, const NQ: usize>(&self) -> usize {
        if I::REGISTERS >= 32 && NQ > 1 {
            16 / NQ
        } else {
            register_block(I::REGISTERS, NQ)
        }
    }
    #[inline(always)]
    unsafe fn score_rows<I: Simd, const NQ: usize, const MR: usize>(
        &self,
        isa: I,
        u: &Bf16Unit<'_>,
        j: usize,
        s: *mut f32,
        mask: MaskRows,
    ) {
        let (kp, krs) = u.k;
        // SAFETY: keys `j..j + MR` are inside the head (the caller's contract), rows
        // of `e` contiguous bf16 (`reads_in_place`) `krs` apart.
        unsafe {
            let k = (kp.offset(j as isize * krs), krs);
            let early = u.early.map(|e| EarlyRows {
                stats: u.early_stats,
                pp: u.pp.add((j - e.keys.0) / 2 * NQ * LANES),
                first: j == e.keys.0,
                last: j + MR == e.keys.1,
                block: self.register_block::<I, NQ>(),
            });
            qk_rows::<I, NQ, MR>(isa, (u.qp.as_ptr(), u.e), k, self.scale, s, mask, early)
        }
    }
    #[inline(always)]
    unsafe fn value_cols<I: Simd, const NQ: usize, const MC: usize>(
        &self,
        isa: I,
        u: &Bf16Unit<'_>,
        (j0, j1): (usize, usize),
        c0: usize,
        _: *const f32,
        ot: *mut f32,
        rescale: Rescale<'_>,
    ) {
        let w = NQ * LANES;
        // Oᵀ = α·Oᵀ + Vᵀ·Pᵀ over pairs of keys: value columns against the weights'
        // panels. SAFETY: `pp` holds `pairs(nk)` rows of `16·NQ` pairs and the
        // tile's values (either source) as many rows of `evp ≥ c0 + MC` pairs (the
        // caller's contract on `c0`); `ot` holds `MC` rows of `16·NQ` floats.
        unsafe {
            let tile = Tile {
                a: u.tile_values.add(c0),
                lda: 1,
                sa: u.evp as isize,
                b: u.pp.cast_const(),
                ldb: w,
                next: LANES,
                kc: pairs(j1 - j0),
                partial: PAIR_SUM_BLOCK,
                ahead: Ahead::NONE,
            };
            // α = 1 where the tile's early weights held: `o + Σ` is `fma(o, 1, Σ)`
            // bit for bit, on the adding pipes instead of the products'.
            let rescale = match rescale {
                Rescale::By(_) if u.alpha_one => Rescale::Add,
                other => other,
            };
            tile.rows::<I, MC, NQ, _, false>(isa, ot, w, rescale);
        }
    }
}

/// [`Operands::value_cols_seen`] with the tile's weights as pairs of keys (`pp`,
/// rows of `w` pairs) and the head's values read in place (base, row and column
/// strides, and `Ev`), for the kernels that make their weights so.
///
/// # Safety
/// As [`Operands::value_cols_seen`]'s: value rows `j0..j1` inside the head, `pp`
/// valid for `⌈(j1 − j0)/2⌉` rows of `w` pairs, the mask for `j1 − j0` rows, `ot`
/// for `Ev` rows and `alpha` for one, of `w` floats.
#[inline(always)]
pub(super) unsafe fn seen_pair_products(
    ((vp, vrs, vcs), ev): ((*const u16, isize, isize), usize),
    pp: *const u32,
    w: usize,
    (j0, j1): (usize, usize),
    ot: *mut f32,
    alpha: *const f32,
    mask: MaskRows,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        seen_products(
            (ev, w, j1 - j0),
            ot,
            alpha,
            mask,
            |j, c| bf16_to_f32(*vp.offset((j0 + j) as isize * vrs + c as isize * vcs)),
            |j, lane| bf16_to_f32((*pp.add(j / 2 * w + lane) >> (16 * (j % 2))) as u16),
        );
    }
}

/// Packs unit `at`'s queries as `Qᵀ` in pairs of adjacent columns, `[⌈E/2⌉][W]`
/// words in `qp` (lanes past the unit's last query zero), through `rows` (as
/// long as `qp`). Inlined, so that it is compiled with the instruction set's
/// features (as a function of its own it is not, and its transposes become calls).
#[inline(always)]
pub(super) fn pack_query_pairs<I: Simd>(
    isa: I,
    p: &Problem<'_, bf16>,
    at: &UnitAt,
    (qp, rows): (&mut [f32], &mut [f32]),
    w: usize,
) {
    let e = p.dims().head_dim;
    let np = pairs(e);
    // Qᵀ as pairs of adjacent columns: each query row's pairs, `[rows][E/2]`,
    // transposed as 32-bit words (moved, never computed on, so their bits are
    // kept) into `[E/2][W]`; lanes past the last query are zero. Written pair by
    // pair into the transposed layout, this took 8 % of a causal N512's time.
    // Pointers rather than ndarray slices: the slicing took 5 % of a unit's
    // time where a unit has one short tile (B1 H8 N2048 against 64 keys).
    let (q0, qrs, qcs) = head_ptr(&p.q, at.b, at.h);
    let rows = as_words(&mut rows[..at.rows * np]);
    for (r, dst) in rows.chunks_exact_mut(np).enumerate() {
        // SAFETY: query `i0 + r` is inside the head (`r < rows`), and its `e`
        // elements are `qcs` apart inside the view.
        unsafe {
            let row = q0.offset((at.i0 + r) as isize * qrs);
            if qcs != 1 {
                for (c, word) in dst.iter_mut().enumerate() {
                    let bits = |c: usize| (*row.offset(c as isize * qcs)).to_bits();
                    *word = pair(bits(2 * c), if 2 * c + 1 < e { bits(2 * c + 1) } else { 0 });
                }
                continue;
            }
            let two = std::slice::from_raw_parts(row, e).chunks_exact(2);
            if let [last] = two.remainder() {
                dst[np - 1] = pair(last.to_bits(), 0);
            }
            for (word, two) in dst.iter_mut().zip(two) {
                *word = pair(two[0].to_bits(), two[1].to_bits());
            }
        }
    }
    let rows = ArrayView2::from_shape((at.rows, np), as_floats(rows)).expect("rows·np words");
    transpose_into_lanes(isa, rows, qp, w);
}

/// Every head's values as bf16 pairs of adjacent rows (keys `2t` and `2t + 1`),
/// packed once per call and shared by every unit of the head, `[B·Hkv][⌈S/2⌉][Evp]`;
/// an odd last key is paired with zero. A tile whose keys start on an even key and
/// end on an even key (or the last) reads its pairs here; any other tile packs its
/// own, since pairs across its edge would multiply a key it must not see (a zero
/// weight times a NaN or infinite value is NaN).
struct ValuePairs {
    data: Vec<u32>,
    /// Pairs per head, `⌈S/2⌉ · Evp`.
    head: usize,
    /// Pairs per row, `Ev` rounded up to 16.
    evp: usize,
    /// Key/value heads `Hkv` and keys `S`.
    kv_heads: usize,
    keys: usize,
    /// Whether every value of head `b·Hkv + kvh` is finite, found while packing:
    /// its masked tiles then need no check of their own (`Operands::values_finite`),
    /// which took 3 % of a causal N512's time.
    finite: Vec<bool>,
}

impl ValuePairs {
    fn new(p: &Problem<'_, bf16>, isa: IsaToken) -> Self {
        let d = p.dims();
        let evp = d.value_dim.next_multiple_of(LANES);
        let head = pairs(d.kv_len) * evp;
        let mut data = vec![0u32; d.batch * d.kv_heads * head];
        let finite = data
            .par_chunks_mut(head.max(1))
            .enumerate()
            .map(|(bh, dst)| {
                let v =
                    p.v.slice(ndarray::s![bh / d.kv_heads, bh % d.kv_heads, .., ..]);
                dispatch(isa, PackValues { v, dst, evp })
            })
            .collect();
        ValuePairs {
            data,
            head,
            evp,
            kv_heads: d.kv_heads,
            keys: d.kv_len,
            finite,
        }
    }

    /// Whether every value of head `(b, kvh)` is finite (false for a head with no
    /// keys, which has no tiles to ask about).
    fn head_finite(&self, (b, kvh): (usize, usize)) -> bool {
        let at = b * self.kv_heads + kvh;
        self.finite.get(at).copied().unwrap_or(false)
    }

    /// The pairs of keys `j0..j1` of head `(b, kvh)`, if they can be read here.
    fn tile(&self, (b, kvh): (usize, usize), (j0, j1): (usize, usize)) -> Option<&[u32]> {
        let even = j0 % 2 == 0 && (j1 % 2 == 0 || j1 == self.keys);
        let at = (b * self.kv_heads + kvh) * self.head + j0 / 2 * self.evp;
        even.then(|| &self.data[at..at + pairs(j1 - j0) * self.evp])
    }
}

/// [`pack_value_pairs`] over one head's values `[S, Ev]`, for [`dispatch`]; tells
/// whether every value is finite.
struct PackValues<'v, 'd> {
    v: ndarray::ArrayView2<'v, bf16>,
    dst: &'d mut [u32],
    evp: usize,
}

impl SimdJob for PackValues<'_, '_> {
    type Output = bool;
    #[inline(always)]
    fn run<I: Simd>(self, _: I) -> bool {
        let (rows, ev) = self.v.dim();
        assert!(
            self.v.strides()[1] == 1 || ev <= 1,
            "value rows must be contiguous"
        );
        assert!(self.evp >= ev && self.dst.len() >= pairs(rows) * self.evp);
        let src = (self.v.as_ptr() as *const u16, self.v.strides()[0]);
        // SAFETY: `v` holds `rows` rows of `ev` contiguous bf16 (checked), `src.1`
        // apart (a bf16 is its `u16` bits); `dst` was checked to hold their pairs.
        unsafe { pack_value_pairs(src, (rows, ev), self.dst.as_mut_ptr(), self.evp) }
    }
}

/// `dst`, `[cols][w]` (rows of `w` lanes), set to `src`, `[rows][cols]`,
/// transposed, and zero in the lanes past `rows`: a unit's query pairs packed
/// along the lanes. (The f32 kernel keeps its own slices: through this function
/// its AVX2 causal N512 ran 3 % slower, though the work is the same.)
///
/// # Panics
/// If `dst` holds fewer than `cols · w` floats or `rows > w`.
#[inline(always)]
fn transpose_into_lanes<I: Simd>(isa: I, src: ArrayView2<'_, f32>, dst: &mut [f32], w: usize) {
    let (rows, cols) = src.dim();
    if cols == 0 {
        return; // a zero head width: nothing to pack
    }
    if rows < w {
        for lanes in dst.chunks_exact_mut(w).take(cols) {
            lanes[rows..].fill(0.0);
        }
    }
    let dst = ArrayViewMut2::from_shape((cols, rows).strides((w, 1)), dst).expect("cols rows of w");
    transpose(isa, src, dst);
}

/// A scratch slice of floats reused as 32-bit words.
pub(super) fn as_words(f: &mut [f32]) -> &mut [u32] {
    // SAFETY: f32 and u32 have the same size and alignment, and every bit pattern is
    // valid for both; the slice is borrowed mutably for the result's lifetime.
    unsafe { std::slice::from_raw_parts_mut(f.as_mut_ptr() as *mut u32, f.len()) }
}

/// Words of scratch seen as floats again, to be moved by the transposes.
fn as_floats(w: &[u32]) -> &[f32] {
    // SAFETY: u32 and f32 have the same size and alignment, and every bit pattern is
    // valid for both; the slice is borrowed for the result's lifetime.
    unsafe { std::slice::from_raw_parts(w.as_ptr() as *const f32, w.len()) }
}

/// The bits of a bf16 pair `(lo, hi)`, from the numbers' bits.
#[inline(always)]
pub(super) fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// The f32 kernel's online-softmax update (`softmax_tile`, the same operations in
/// the same order) that writes the weights, rounded to bf16, straight into pairs of
/// adjacent keys, `pp[t][·] = (p[2t][·], p[2t + 1][·])`, instead of back into `s`;
/// an odd tile's last pair has a zero weight in its high half. The running sum `l`
/// adds the unrounded weights.
///
/// # Safety
/// `s` valid for `nk` rows of `16·NQ` floats, `pp` for `⌈nk/2⌉` rows of `16·NQ`
/// pairs; `m`, `l`, `alpha` for `16·NQ` floats.
#[inline(always)]
pub(super) unsafe fn softmax_pairs<I: Simd, const NQ: usize>(
    isa: I,
    s: *const f32,
    nk: usize,
    pp: *mut u32,
    stats: Stats,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        let (m_use, alpha) = running_max::<I, NQ>(isa, s, nk, stats.m);
        let mut sum = [isa.splat(0.0); NQ];
        for t in 0..pairs(nk) {
            for (x, sum) in sum.iter_mut().enumerate() {
                let o = x * LANES;
                let scores = (s.add(2 * t * w + o), (2 * t + 1 < nk).then_some(w));
                *sum = weight_pair(isa, scores, m_use[x], *sum, pp.add(t * w + o)).0;
            }
        }
        join_sums::<I, NQ>(isa, sum, alpha, stats);
    }
}

/// The weights `e^(s − m)` of one panel's scores of two adjacent keys (`scores.0`;
/// the second key's row `scores.1` floats further, if there is one), added in key
/// order to `sum` and stored as a bf16 pair at `pp`; returns the new sum and the
/// larger of the two scores. (No closure for a key's weight: a closure is a
/// function of its own, compiled without the instruction set's features unless
/// inlined.)
///
/// # Safety
/// `scores.0` valid for 16 floats (and 16 more `scores.1` further), `pp` for 16
/// pairs.
#[inline(always)]
unsafe fn weight_pair<I: Simd>(
    isa: I,
    scores: (*const f32, Option<usize>),
    m: I::V,
    sum: I::V,
    pp: *mut u32,
) -> (I::V, I::V) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let lo_score = isa.load(scores.0);
        let lo = exp_shifted(isa, lo_score, m);
        let mut sum = isa.add(sum, lo);
        let (hi, top) = match scores.1 {
            Some(next) => {
                let hi_score = isa.load(scores.0.add(next));
                let hi = exp_shifted(isa, hi_score, m);
                sum = isa.add(sum, hi);
                (hi, isa.max(lo_score, hi_score))
            }
            None => (isa.splat(0.0), lo_score),
        };
        isa.store_pairs(pp, isa.pack_bf16(lo, hi));
        (sum, top)
    }
}

/// Whether a tile's early weights hold: no score (each panel's maximum score in
/// the [`EarlyStats`] rows) passed the running maximum it was weighed against by
/// more than [`EARLY_SLACK`]. A NaN maximum fails.
///
/// # Safety
/// `stats` valid for the three rows of [`EarlyStats`].
#[inline(always)]
unsafe fn early_weights_hold<I: Simd, const NQ: usize>(isa: I, stats: *mut f32) -> bool {
    let zero = isa.splat(0.0);
    let mut over = zero;
    for x in 0..NQ {
        // SAFETY: the caller upholds this function's contract (see # Safety).
        unsafe {
            let against = isa.load(early_row::<NQ>(stats, EarlyStats::Against, x));
            let limit = isa.add(against, isa.splat(EARLY_SLACK));
            let top = isa.load(early_row::<NQ>(stats, EarlyStats::Top, x));
            // max(0, d) keeps a NaN d (second operand), which the sum then keeps.
            over = isa.add(over, isa.max(zero, isa.sub(top, limit)));
        }
    }
    isa.sum(over) == 0.0
}

/// Joins a tile's early weights (the [`EarlyStats`] rows `early`) to the running
/// statistics: the running maximum becomes the one the weights were made against
/// (unless the tile saw no score), what came before is rescaled by `α = e^(m − m')`
/// (1 where the maximum stayed, 0 where nothing came before) and the tile's sums
/// are added. Returns whether every `α` is 1, so that the output needs no rescaling.
///
/// # Safety
/// `early` valid for the rows of [`EarlyStats`], the stats for `16·NQ` floats.
#[inline(always)]
unsafe fn keep_early_sums<I: Simd, const NQ: usize>(isa: I, early: *mut f32, stats: Stats) -> bool {
    let one = isa.splat(1.0);
    // α ≤ 1 (the maximum only rises), so the sum of α − 1 is 0 only where every α
    // is 1; a NaN keeps it from 0.
    let mut below_one = isa.splat(0.0);
    let (mut sum, mut alpha) = ([one; NQ], [one; NQ]);
    for x in 0..NQ {
        // SAFETY: the caller upholds this function's contract (see # Safety).
        unsafe {
            let row = |r| isa.load(early_row::<NQ>(early, r, x));
            let (top, against) = (row(EarlyStats::Top), row(EarlyStats::Against));
            let m = isa.load(stats.m.add(x * LANES));
            // A tile that saw no score (top −∞) leaves the maximum as it was; else it
            // is the one the weights were made against (never below `m`).
            isa.store(stats.m.add(x * LANES), isa.max(m, isa.masked(against, top)));
            sum[x] = row(EarlyStats::Sum);
            alpha[x] = exp_shifted(isa, m, against);
            below_one = isa.add(below_one, isa.sub(alpha[x], one));
        }
    }
    // SAFETY: the stats hold `16·NQ` floats each (the caller's contract).
    unsafe { join_sums::<I, NQ>(isa, sum, alpha, stats) };
    isa.sum(below_one) == 0.0
}

/// One step of the early weights: the weights of keys `2t` and `2t + 1` (the second
/// only where `hi`) of one panel `x` of a block's scores `s`, against the running
/// maximum of the [`EarlyStats`] rows, packed as a pair into `pp`; their sum and
/// the scores' maximum join the panel's in those rows.
///
/// # Safety
/// `s` valid for rows `2t, 2t + 1` of `16·NQ` floats, `pp` for row `t` of pairs,
/// `e.stats` for the rows of [`EarlyStats`].
#[inline(always)]
unsafe fn early_pair<I: Simd, const NQ: usize>(
    isa: I,
    e: &EarlyRows,
    (s, pp): (*const f32, *mut u32),
    (x, t): (usize, usize),
    hi: bool,
) {
    let w = NQ * LANES;
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let [sum, top, against] = [EarlyStats::Sum, EarlyStats::Top, EarlyStats::Against]
            .map(|row| early_row::<NQ>(e.stats, row, x));
        let (sum_before, top_before) = (isa.load(sum), isa.load(top));
        let scores = (s.add(2 * t * w + x * LANES), hi.then_some(w));
        let pp = pp.add(t * w + x * LANES);
        let (acc, pair_top) = weight_pair(isa, scores, isa.load(against), sum_before, pp);
        isa.store(sum, acc);
        isa.store(top, isa.max(top_before, pair_top));
    }
}

/// Interleaves `rows` rows of `ev` bf16 values into pairs of adjacent rows,
/// `dst[t][c] = (v[2t][c], v[2t + 1][c])`, `evp` pairs apart; an odd last row is
/// paired with zero. Returns whether every value is finite, found in the same pass.
/// Integer code the compiler vectorises: the bits are moved, never converted
/// (through f32 and back, with a check of its own, this took 1.5 % of a causal
/// N2048's samples).
///
/// # Safety
/// `v.0` must be valid for `rows` rows of `ev` contiguous bf16, `v.1` elements
/// apart, and `dst` for `⌈rows/2⌉` rows of `evp ≥ ev` pairs, apart from `v`.
#[inline(always)]
unsafe fn pack_value_pairs(
    v: (*const u16, isize),
    (rows, ev): (usize, usize),
    dst: *mut u32,
    evp: usize,
) -> bool {
    let mut carries = 0;
    for t in 0..pairs(rows) {
        // SAFETY: rows `2t` and `2t + 1 < rows` hold `ev` bf16 each and `dst` row
        // `t` `ev` pairs, not overlapping them (the caller's contract).
        let (lo, out) = unsafe {
            let lo = v.0.offset(2 * t as isize * v.1);
            (
                std::slice::from_raw_parts(lo, ev),
                std::slice::from_raw_parts_mut(dst.add(t * evp), ev),
            )
        };
        if 2 * t + 1 < rows {
            // SAFETY: as above.
            let hi = unsafe { std::slice::from_raw_parts(lo.as_ptr().offset(v.1), ev) };
            for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
                carries |= exponent_carry(l) | exponent_carry(h);
                *o = pair(l, h);
            }
        } else {
            for (o, &l) in out.iter_mut().zip(lo) {
                carries |= exponent_carry(l);
                *o = pair(l, 0);
            }
        }
    }
    carries & 0x8000 == 0
}

/// A bf16 number's exponent bits plus one unit of the exponent: they carry into
/// bit 15 only where they are all set, an infinity or a NaN.
#[inline(always)]
fn exponent_carry(bits: u16) -> u16 {
    (bits & 0x7f80) + 0x0080
}

/// Whether every one of `rows` rows of `ev` bf16 values (`v.1` elements apart) is
/// finite.
///
/// # Safety
/// `v.0` must be valid for `rows` rows of `ev` contiguous bf16, `v.1` elements apart.
#[inline(always)]
pub(super) unsafe fn rows_finite(v: (*const u16, isize), (rows, ev): (usize, usize)) -> bool {
    let mut carries = 0;
    for j in 0..rows {
        // SAFETY: row `j < rows` holds `ev` contiguous bf16 (the caller's contract).
        let row = unsafe { std::slice::from_raw_parts(v.0.offset(j as isize * v.1), ev) };
        carries |= row.iter().fold(0, |c, &x| c | exponent_carry(x));
    }
    carries & 0x8000 == 0
}

/// `s[r][·] = scale · Σ_c k[r, c] · q[c][·] (+ mask.row(r)[·])`, the scores of
/// `MR` keys, over pairs of columns. The bf16
/// queries are not pre-scaled as the f32 kernel's are: that would round them again.
///
/// Not on the register tile (`kernels::tile`), unlike the other products: the
/// key pairs are read in place from rows of bf16 that need not start on a pair
/// (an odd row stride), the last pair of an odd width has a zero half, and the
/// scale joins at the end; the tile's operand `a` is whole steps at fixed strides.
///
/// # Safety
/// `k.0` must be valid for `MR` rows of `e` contiguous bf16, `k.1` elements apart;
/// `qp` (of `(qp, e)`) for `⌈e/2⌉` rows of `16·NQ` pairs; `s` and (unless none)
/// `mask` for `MR` rows of `16·NQ` floats; with `early`,
/// `s` and its `pp` also for the block before, as [`EarlyRows`] says.
#[inline(always)]
unsafe fn qk_rows<I: Simd, const NQ: usize, const MR: usize>(
    isa: I,
    (qp, e): (*const u32, usize),
    k: (*const u16, isize),
    scale: f32,
    s: *mut f32,
    mask: MaskRows,
    early: Option<EarlyRows>,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        let (kp, krs) = k;
        // The early weights of the block before this one (its `block` scores just
        // below `s`, its pairs just below `pp`): one pair of keys of one panel
        // before every `spacing`-th step of this block's products, where they use
        // the adding pipes the products leave idle (made after them, they did not
        // overlap: docs/bf16.md). Spread over the whole dot product rather than
        // packed into its first steps, they leave each step fewer instructions to
        // issue beside its products (2–3 % at B1 H8 N2048 d64). A block that starts
        // the tile has none before it.
        let before = |er: &EarlyRows| {
            (
                s.sub(er.block * w).cast_const(),
                er.pp.sub(er.block / 2 * w),
            )
        };
        let pending = early.filter(|er| !er.first);
        let steps = pending.map_or(0, |er| er.block / 2 * NQ);
        let np = pairs(e);
        // Product steps per early step, and the early steps made so far.
        let spacing = (np / steps.max(1)).max(1);
        let (mut made, mut next_early) = (0, 0);
        let zero = isa.splat(0.0);
        // Key `r`'s pair `c`; the last pair of an odd width has a zero high half.
        let key_pair = |r: usize, c: usize| {
            let at = kp.offset(r as isize * krs).add(2 * c);
            if 2 * c + 1 < e {
                (at as *const u32).read_unaligned()
            } else {
                *at as u32
            }
        };
        // Blocked summation: chunks of `PAIR_CHUNK` pairs summed in registers, then
        // added to the running total in `s`.
        let chunk = PAIR_CHUNK;
        let mut c0 = 0;
        while c0 < np.max(1) {
            let c1 = (c0 + chunk).min(np);
            let mut acc = [[zero; NQ]; MR];
            for c in c0..c1 {
                if let Some(er) = pending.filter(|_| c == next_early && made < steps) {
                    early_pair::<I, NQ>(isa, &er, before(&er), (made % NQ, made / NQ), true);
                    made += 1;
                    next_early += spacing;
                }
                let mut qv = [isa.splat_pair(0); NQ];
                for (x, q) in qv.iter_mut().enumerate() {
                    *q = isa.load_pairs(qp.add(c * w + x * LANES));
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let kb = isa.splat_pair(key_pair(r, c));
                    for x in 0..NQ {
                        row[x] = isa.dot2(row[x], qv[x], kb);
                    }
                }
            }
            let (first, last) = (c0 == 0, c1 >= np);
            for (r, row) in acc.iter().enumerate() {
                for (x, &val) in row.iter().enumerate() {
                    let off = r * w + x * LANES;
                    let mut val = val;
                    if !first {
                        val = isa.add(isa.load(s.add(off)), val);
                    }
                    if last {
                        val = isa.mul(val, isa.splat(scale));
                        if !mask.is_none() {
                            let add = isa.load(mask.row(r).add(x * LANES));
                            val = masked_score(isa, val, add);
                        }
                    }
                    isa.store(s.add(off), val);
                }
            }
            c0 = c1.max(c0 + 1);
        }
        // The early weights are made against the running maximum, raised to the
        // first block's largest score where that is larger: so a unit's first tile
        // (no running maximum yet) makes them too, and a tile that opens above the
        // running maximum keeps them more often. Read back from `s`: kept in the
        // epilogue above, the maxima pushed the accumulators out of registers.
        if let Some(er) = early.filter(|er| er.first) {
            let against = |x| early_row::<NQ>(er.stats, EarlyStats::Against, x);
            let from = std::array::from_fn(|x| isa.load(against(x)));
            for (x, top) in panel_maxima::<I, NQ>(isa, s, MR, from)
                .into_iter()
                .enumerate()
            {
                isa.store(against(x), top);
            }
        }
        // Steps a short dot product had too few steps for; then the tile's last
        // block makes its own.
        if let Some(er) = pending {
            for k in made..steps {
                early_pair::<I, NQ>(isa, &er, before(&er), (k % NQ, k / NQ), true);
            }
        }
        if let Some(er) = early.filter(|er| er.last) {
            for t in 0..MR.div_ceil(2) {
                for x in 0..NQ {
                    early_pair::<I, NQ>(isa, &er, (s, er.pp), (x, t), 2 * t + 1 < MR);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array4;

    use super::*;
    use crate::isa::Isa;
    use crate::problem::AttentionOptions;

    /// The value pairs are the values' bits (subnormals, the largest finite
    /// numbers, a NaN's payload), an odd last key paired with zero, and each head's
    /// finiteness is found in the same pass: head 0 holds only finite numbers, head 1
    /// an infinity, head 2 a NaN in its last (unpaired) key's last column.
    #[test]
    fn value_pairs_move_bits_and_find_the_heads_with_non_finite_values() {
        let (keys, ev) = (7, 19);
        let specials = [0x0001, 0x807f, 0x7f7f, 0xff7f, 0x8000, 0x3f80];
        let mut v = Array4::from_shape_fn((1, 3, keys, ev), |(_, h, j, c)| {
            bf16::from_bits(specials[(h + j * ev + c) % specials.len()])
        });
        v[[0, 1, 2, 5]] = bf16::from_bits(0x7f80);
        v[[0, 2, keys - 1, ev - 1]] = bf16::from_bits(0x7fc1);
        let q = Array4::from_elem((1, 3, 4, 8), bf16::from_f32(0.5));
        let k = Array4::from_elem((1, 3, keys, 8), bf16::from_f32(0.25));
        let opts = AttentionOptions::default();
        let p = Problem::new(q.view(), k.view(), v.view(), &opts).expect("valid problem");
        for isa in Isa::available() {
            let pairs_of = ValuePairs::new(&p, isa.token().expect("available"));
            let finite: Vec<bool> = (0..3).map(|h| pairs_of.head_finite((0, h))).collect();
            assert_eq!(finite, [true, false, false], "{isa:?}");
            for h in 0..3 {
                let head = pairs_of.tile((0, h), (0, keys)).expect("the head's pairs");
                for t in 0..pairs(keys) {
                    for c in 0..ev {
                        let hi = if 2 * t + 1 < keys {
                            v[[0, h, 2 * t + 1, c]].to_bits()
                        } else {
                            0
                        };
                        let want = pair(v[[0, h, 2 * t, c]].to_bits(), hi);
                        assert_eq!(
                            head[t * pairs_of.evp + c],
                            want,
                            "{isa:?} head {h} ({t}, {c})"
                        );
                    }
                }
                let rows = (
                    v.slice(ndarray::s![0, h, .., ..]).as_ptr() as *const u16,
                    ev as isize,
                );
                // SAFETY: the head holds `keys` contiguous rows of `ev` bf16.
                let rows_finite = unsafe { rows_finite(rows, (keys, ev)) };
                assert_eq!(rows_finite, finite[h], "{isa:?} head {h}");
            }
        }
    }
}
