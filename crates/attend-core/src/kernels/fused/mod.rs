//! The fused attention forward: tiled online softmax (FlashAttention-2 style) that
//! never materialises the `L × S` score matrix.
//!
//! # Layout of the work
//!
//! The work is split into *units*: one batch entry, one query head, and a block of
//! up to `W = 16·NQ` consecutive queries (`NQ ∈ {1, 2, 4}` vectors of 16 lanes).
//! Units run in parallel on the caller's rayon pool; each unit is computed by one
//! thread in a fixed order, so the result has the same bits whatever the thread
//! count. A single head with a long sequence still has many units, so both cores
//! stay busy when `B·H = 1`.
//!
//! Inside a unit everything is *transposed* so that the queries lie along the
//! vector lanes:
//!
//! * `Qᵀ` is packed once, `[E][W]`, multiplied by `scale`: the scaling costs a
//!   multiplication per query element instead of one per score. Scores stay in
//!   their own (natural) units, as PyTorch's math has them, and the softmax's
//!   `e^x` turns them into powers of two inside its reduction (`Simd::exp`): a
//!   factor of `log₂e` on the scores would overflow those beyond
//!   `f32::MAX / log₂e` (docs/design.md, "Masks");
//! * for each tile of keys (`tile_keys`: 128 or 64),
//!   `Sᵀ[j][·] = Σ_e K[j, e] · Qᵀ[e][·] (+ mask)`: broadcast one key
//!   element, multiply a row of queries (the library's register tile,
//!   `kernels::tile`, `MR` keys × `NQ` vectors in registers, or × one vector at a
//!   time where 16 registers cannot hold more), then add the mask
//!   term from the mask tiles. `K` is read in place
//!   through its strides, never copied;
//! * the online-softmax update works down the columns of `Sᵀ`, so the running
//!   max and sum per query are plain lane-wise vector operations (`softmax_tile`);
//! * `Oᵀ[c][·] = α·Oᵀ[c][·] + Σ_j V[j, c] · Pᵀ[j][·]`, on the same tile, again
//!   with `V` broadcast from its own strides.
//!
//! Tiles that causality or the window hide from every query of the unit are never
//! visited; tiles inside the band with no other mask skip all per-score masking;
//! a tile the band alone cuts through adds its terms from one short row
//! (`band_row`: whether a query sees a key depends only on their distance).
//! Fully masked rows end with a running max of −∞, and give 0 and a log-sum-exp
//! of −∞.
//!
//! # One driver, one implementation per element type
//!
//! The units, the tile sweep with its mask choice, the running statistics and the
//! write-out are written once (`drive`); what an element type does its own way is
//! the `Operands` trait: how a unit holds its queries, the two products, and the
//! form in which a tile's weights meet its values. `float` implements it for f32
//! tensors (the description above), `bf16` for bf16 tensors (products on pairs).
//! Each implementation is monomorphised into the driver and inlined, so the driver
//! costs nothing at run time; a new element type is one more implementation.

use std::mem::MaybeUninit;

use ndarray::{Array3, Array4, ArrayView4};
use rayon::prelude::*;

use crate::isa::{dispatch, IsaToken, Simd, SimdJob, LANES};
use crate::kernels::lse::{split, LogSumExp};
use crate::kernels::scratch::{carve, with_scratch};
use crate::kernels::tile::Rescale;
use crate::problem::{band_row, Dims, MaskTiles, Problem, SoftmaxAxis};
use output::{write_normalised, Output};

pub(crate) mod amx;
pub(crate) mod bf16;
mod float;
mod output;

pub(crate) use float::{run, Widened};

/// Keys per tile at most (the scratch is sized for it); see [`tile_keys`].
const BK: usize = 128;

/// Whether the fused kernel handles this problem (the reference covers the rest:
/// the softmax over queries, and empty value widths).
pub fn supports<Q, KV>(p: &Problem<'_, Q, KV>) -> bool {
    p.softmax_axis == SoftmaxAxis::Keys && p.dims().value_dim > 0
}

/// Vectors of 16 queries per unit (1, 2 or 4): as many as the queries fill, up to
/// 4 (a wider unit shares each key and value load among more queries). Where
/// causality or a window cuts the keys per query, a unit of `W` queries also
/// computes about `W²/2` scores per edge of the band only to mask them (an eighth
/// of a causal N512's work at `W = 64`; docs/fused-forward.md): there units are 4
/// vectors wide only while those scores stay within [`BAND_WASTE`] of the visible
/// ones, else at most 2.
fn query_vectors<Q, KV>(p: &Problem<'_, Q, KV>) -> usize {
    let widest = widest_unit(p.dims().q_len);
    if !p.is_banded() || (widest == 4 && band_waste(p, 4 * LANES) <= BAND_WASTE) {
        widest
    } else {
        widest.min(2)
    }
}

/// The share of masked scores a banded problem's widest units may compute: at 1/32
/// (a causal N2048's at 64 queries) the wider units' lower per-query costs win
/// (causal 1.6–3.4 % faster at N2048 and N4096, f32 and bf16, 2026-11-26); at N1024
/// (1/16) they were level, at N512 (1/8) 1 % slower.
const BAND_WASTE: f64 = 1.0 / 32.0;

/// Scores that units of `w` queries compute though the band hides them, as a share
/// of the visible scores: each unit computes its queries against the keys any of
/// them sees.
fn band_waste<Q, KV>(p: &Problem<'_, Q, KV>, w: usize) -> f64 {
    let q_len = p.dims().q_len;
    let (mut computed, mut visible) = (0, 0);
    for i0 in (0..q_len).step_by(w) {
        let i1 = (i0 + w).min(q_len);
        let (lo, hi) = p.block_key_range(i0, i1);
        computed += (i1 - i0) * (hi - lo);
        visible += (i0..i1)
            .map(|i| {
                let (lo, hi) = p.key_range(i);
                hi - lo
            })
            .sum::<usize>();
    }
    computed.saturating_sub(visible) as f64 / visible.max(1) as f64
}

/// Vectors of 16 queries the queries fill, up to 4: the widest unit, which sizes
/// the scratch.
fn widest_unit(q_len: usize) -> usize {
    if q_len > 2 * LANES {
        4
    } else if q_len > LANES {
        2
    } else {
        1
    }
}

/// The register block for `registers` vector registers: as many accumulators as
/// fit in about three quarters of them (counted in 16-lane vectors), in keys of
/// `nq` vectors (panels held in registers together) each.
fn register_block(registers: usize, nq: usize) -> usize {
    (registers * 3 / 4 / nq).clamp(1, 12)
}

/// How far a tile's score may pass the running maximum its weights were made
/// against early ([`Operands::begin_tile`]): `8 ln 2`, weights up to `2^8`, which
/// lose nothing in f32 sums or bf16 weights; a tile whose score passes by more has
/// its weights made again against its own maximum.
const EARLY_SLACK: f32 = 8.0 * std::f32::consts::LN_2;

/// Keys per tile for an instruction set: [`BK`] where 32 vector registers keep
/// the products' loads few (a 128-key tile of scores fills the L1 cache, and the
/// longer tiles halve the per-tile work: the dot products' and outputs' tails, the
/// rescaling); half that on AVX2, where the larger tile ran 4 % slower with units of
/// 64 queries and measured within the noise (0.99–1.03×) with the 16 it has now
/// (docs/fused-forward.md).
fn tile_keys<I: Simd>() -> usize {
    if I::REGISTERS >= 32 {
        BK
    } else {
        BK / 2
    }
}

/// Calls `$ops.$f::<$I, $NQ, n>(args)` for a runtime `n` in `1..=12`.
macro_rules! with_block {
    ($n:expr, $ops:ident.$f:ident::<$I:ty, $NQ:ident>($($arg:expr),* $(,)?)) => {
        match $n {
            1 => $ops.$f::<$I, $NQ, 1>($($arg),*),
            2 => $ops.$f::<$I, $NQ, 2>($($arg),*),
            3 => $ops.$f::<$I, $NQ, 3>($($arg),*),
            4 => $ops.$f::<$I, $NQ, 4>($($arg),*),
            5 => $ops.$f::<$I, $NQ, 5>($($arg),*),
            6 => $ops.$f::<$I, $NQ, 6>($($arg),*),
            7 => $ops.$f::<$I, $NQ, 7>($($arg),*),
            8 => $ops.$f::<$I, $NQ, 8>($($arg),*),
            9 => $ops.$f::<$I, $NQ, 9>($($arg),*),
            10 => $ops.$f::<$I, $NQ, 10>($($arg),*),
            11 => $ops.$f::<$I, $NQ, 11>($($arg),*),
            12 => $ops.$f::<$I, $NQ, 12>($($arg),*),
            _ => unreachable!("register block out of range"),
        }
    };
}

/// What an element type does its own way in the fused forward (docs/design.md,
/// "Element types"): how a unit holds its queries, the two products, and the form
/// in which a tile's weights and values meet. Everything else (the units, the tile
/// sweep and its mask choice, the running statistics, the write-out) is the one
/// driver, [`drive`], monomorphised for each implementation.
///
/// The products work on rows of `W = 16·NQ` queries along the vector lanes:
/// `s[r][·]` is key `r`'s scores for the unit's queries, `ot[c][·]` value
/// column `c` of their output.
trait Operands<'p>: Sync {
    /// The element type of `q`.
    type Elem: Sync + 'p;
    /// The element type of `k` and `v`.
    type KvElem: Sync + 'p;
    /// The output's element type.
    type Out: Output;
    /// A unit's own state: its packed queries, its buffers, where its head starts.
    type Unit<'s>;

    /// The problem the operands are for.
    fn problem(&self) -> &Problem<'p, Self::Elem, Self::KvElem>;

    /// Vectors of 16 queries per unit for an instruction set with `registers`
    /// vector registers.
    fn query_vectors(&self, registers: usize) -> usize;

    /// Floats of scratch [`Operands::start`] carves for a unit of `w` queries.
    fn scratch_len(d: &Dims, w: usize) -> usize;

    /// Starts a unit: carves its buffers from `rest` ([`Operands::scratch_len`]
    /// floats) and packs its queries; lanes past the unit's last query are zero.
    fn start<'s, I: Simd, const NQ: usize>(
        &self,
        isa: I,
        at: &UnitAt,
        rest: &mut &'s mut [f32],
    ) -> Self::Unit<'s>;

    /// Starts the tile of keys `keys.0..keys.1`. The operands may make the tile's
    /// weights while [`Operands::score_tile`] makes its scores, against
    /// the running maxima of `stats` as they stand (or a larger maximum the tile's
    /// first scores give) rather than the tile's own, and [`Operands::weights`]
    /// keep them where no score passed that maximum by more than [`EARLY_SLACK`].
    /// Does nothing by default.
    ///
    /// # Safety
    /// `stats` valid for `16·NQ` floats each.
    unsafe fn begin_tile<I: Simd, const NQ: usize>(
        &self,
        _isa: I,
        _u: &mut Self::Unit<'_>,
        _keys: (usize, usize),
        _stats: Stats,
    ) {
    }

    /// `s[r][·]`, the scaled scores of the tile's keys `keys.0 + r` (`r <
    /// keys.1 − keys.0`), with the mask term `mask.row(r)` added when there are
    /// terms ([`score_blocks`] for the register tiles).
    ///
    /// # Safety
    /// The keys must be inside the unit's head; `s` valid for `BK` rows of
    /// `16·NQ` floats and `mask` (unless none) for `keys.1 − keys.0` rows.
    unsafe fn score_tile<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &Self::Unit<'_>,
        keys: (usize, usize),
        s: *mut f32,
        mask: MaskRows,
    );

    /// Turns the scores `s` of keys `keys.0..keys.1` into the tile's weights with
    /// the online-softmax update of `stats` (see [`running_max`]), and makes ready
    /// whatever [`Operands::value_tile`] reads.
    ///
    /// # Safety
    /// `s` valid for `keys.1 − keys.0 ≤ BK` rows of `16·NQ` floats, `stats` for
    /// `16·NQ` floats each.
    unsafe fn weights<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &mut Self::Unit<'_>,
        at: &UnitAt,
        keys: (usize, usize),
        s: *mut f32,
        stats: Stats,
    );

    /// Whether every value of keys `keys.0..keys.1` is finite: where it is, a masked
    /// tile's value products may multiply the zero weight of a key a query does not
    /// see (docs/design.md, "NaN").
    fn values_finite<I: Simd>(&self, isa: I, u: &Self::Unit<'_>, keys: (usize, usize)) -> bool;

    /// [`Operands::value_tile`], one product at a time,
    /// skipping the keys the mask hides from each query (mask term −∞ in
    /// `mask.row(r)`), so that a NaN or infinite value never reaches a
    /// query that does not see its key: the exact path for masked tiles whose values
    /// are not all finite.
    ///
    /// # Safety
    /// As [`Operands::value_tile`]'s; `mask` valid for
    /// `keys.1 − keys.0` rows.
    #[allow(clippy::too_many_arguments)]
    unsafe fn value_cols_seen<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &Self::Unit<'_>,
        keys: (usize, usize),
        s: *const f32,
        ot: *mut f32,
        alpha: *const f32,
        mask: MaskRows,
    );

    /// `ot[c][·] = α · ot[c][·] + Σ_j v[j, c] · p[j][·]` for every value column
    /// `c` over the keys `keys.0..keys.1` of the last [`Operands::weights`] call,
    /// `rescale` saying how the sums meet `ot`: `By(α)`, or `None` where `ot` holds
    /// nothing yet (the unit's first products write it); [`value_blocks`] for the
    /// register tiles.
    ///
    /// # Safety
    /// `s` as for `weights`; `ot` valid for `Ev` rows of `16·NQ` floats.
    unsafe fn value_tile<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &Self::Unit<'_>,
        keys: (usize, usize),
        s: *const f32,
        ot: *mut f32,
        rescale: Rescale<'_>,
    );
}

/// Operands whose products run on the register tile (`kernels::tile`) a register
/// block at a time: [`score_blocks`] and [`value_blocks`] make their tiles' products
/// from these.
trait RegisterBlocks<'p>: Operands<'p> {
    /// Keys (score products) or value columns (value products) in one register
    /// block of a unit of `NQ` vectors of queries on `I`'s registers.
    fn register_block<I: Simd, const NQ: usize>(&self) -> usize;

    /// `s[r][·]`, the scaled scores of keys `j + r` for `r < MR`, with the mask
    /// term `mask.row(r)` added when there are terms.
    ///
    /// # Safety
    /// Keys `j..j + MR` must be inside the unit's head; `s` valid for `MR` rows of
    /// `16·NQ` floats and `mask` (unless none) for `MR` rows.
    unsafe fn score_rows<I: Simd, const NQ: usize, const MR: usize>(
        &self,
        isa: I,
        u: &Self::Unit<'_>,
        j: usize,
        s: *mut f32,
        mask: MaskRows,
    );

    /// `ot[c][·] = α · ot[c][·] + Σ_j v[j, c0 + c] · p[j][·]` for `c < MC` over the
    /// keys `keys.0..keys.1` of the last [`Operands::weights`] call, `rescale`
    /// saying how the sums meet `ot`: `By(α)`, or `None` where `ot` holds nothing
    /// yet (the unit's first products write it).
    ///
    /// # Safety
    /// Columns `c0..c0 + MC` must be inside the values; `s` as for `weights`; `ot`
    /// valid for `MC` rows of `16·NQ` floats.
    #[allow(clippy::too_many_arguments)]
    unsafe fn value_cols<I: Simd, const NQ: usize, const MC: usize>(
        &self,
        isa: I,
        u: &Self::Unit<'_>,
        keys: (usize, usize),
        c0: usize,
        s: *const f32,
        ot: *mut f32,
        rescale: Rescale<'_>,
    );
}

/// [`Operands::score_tile`] one register block after another.
///
/// # Safety
/// As [`Operands::score_tile`]'s.
#[inline(always)]
unsafe fn score_blocks<'p, I: Simd, const NQ: usize, O: RegisterBlocks<'p>>(
    ops: &O,
    isa: I,
    u: &O::Unit<'_>,
    (j0, j1): (usize, usize),
    s: *mut f32,
    mask: MaskRows,
) {
    let (mr, w) = (ops.register_block::<I, NQ>(), NQ * LANES);
    let mut r0 = 0;
    while r0 < j1 - j0 {
        let n = mr.min(j1 - j0 - r0);
        // SAFETY: the caller's contract, for keys `j0 + r0 .. j0 + r0 + n`.
        unsafe {
            let (sp, mask) = (s.add(r0 * w), mask.from(r0));
            with_block!(n, ops.score_rows::<I, NQ>(isa, u, j0 + r0, sp, mask));
        }
        r0 += n;
    }
}

/// [`Operands::value_tile`] one register block after another.
///
/// # Safety
/// As [`Operands::value_tile`]'s.
#[inline(always)]
unsafe fn value_blocks<'p, I: Simd, const NQ: usize, O: RegisterBlocks<'p>>(
    ops: &O,
    isa: I,
    u: &O::Unit<'_>,
    keys: (usize, usize),
    s: *const f32,
    ot: *mut f32,
    rescale: Rescale<'_>,
) {
    let (mr, w) = (ops.register_block::<I, NQ>(), NQ * LANES);
    let ev = ops.problem().dims().value_dim;
    let mut c0 = 0;
    while c0 < ev {
        let n = mr.min(ev - c0);
        // SAFETY: the caller's contract, for columns `c0..c0 + n`.
        unsafe {
            let op = ot.add(c0 * w);
            with_block!(n, ops.value_cols::<I, NQ>(isa, u, keys, c0, s, op, rescale));
        }
        c0 += n;
    }
}

/// Where a unit's queries are: batch `b`, query head `h` (reading key/value head
/// `kvh`), queries `i0..i0 + rows`.
struct UnitAt {
    b: usize,
    h: usize,
    kvh: usize,
    i0: usize,
    rows: usize,
}

/// A unit's running maximum, running sum and a tile's rescale factor,
/// `16·NQ` floats each.
#[derive(Clone, Copy)]
struct Stats {
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
}

/// A tile's mask terms, one row of `16·NQ` queries per key: key `r`'s row
/// starts `r · stride` floats after the first. The stride is negative for the
/// band's terms, whose rows shift by one query per key ([`band_row`]).
#[derive(Clone, Copy)]
struct MaskRows {
    /// Null where the tile has no terms.
    first: *const f32,
    stride: isize,
}

impl MaskRows {
    /// No terms: nothing masks the tile's scores one by one.
    const NONE: MaskRows = MaskRows {
        first: std::ptr::null(),
        stride: 0,
    };

    fn is_none(self) -> bool {
        self.first.is_null()
    }

    /// The rows from key `r` on (none stay none).
    ///
    /// # Safety
    /// Unless none, key `r` must be one of the tile's.
    unsafe fn from(self, r: usize) -> MaskRows {
        MaskRows {
            // SAFETY: inside the rows (the caller's contract).
            first: unsafe { self.row(r) },
            ..self
        }
    }

    /// Key `r`'s row.
    ///
    /// # Safety
    /// Key `r` must be one of the tile's.
    unsafe fn row(self, r: usize) -> *const f32 {
        // SAFETY: inside the rows (the caller's contract).
        unsafe { self.first.offset(r as isize * self.stride) }
    }
}

/// Floats of scratch one unit of work (16, 32 or 64 queries of one head) needs:
/// the operands' own buffers, a tile of scores and one of mask terms, `Oᵀ` and the
/// running statistics.
fn scratch_len<'p, O: Operands<'p>>(d: &Dims) -> usize {
    let w = widest_unit(d.q_len) * LANES;
    O::scratch_len(d, w) + (2 * BK + d.value_dim + 3) * w
}

/// Runs the fused forward of `ops` on the current rayon pool with `isa`'s vectors,
/// returning the f32 output `[B, Hq, L, Ev]` and the log-sum-exp `[B, Hq, L]`.
///
/// # Panics
/// If `!supports(p)` (checked by [`crate::attention::attention_with`]).
fn drive<'p, O: Operands<'p>>(ops: &O, isa: IsaToken) -> (Array4<O::Out>, LogSumExp) {
    let p = ops.problem();
    assert!(supports(p), "fused kernel does not support this problem");
    let d = p.dims();
    // Left uninitialised: the units write every element (`write_out`), and zeroing
    // first was a serial pass over the whole output (1.4 % of a causal bf16 N2048).
    let mut out = Array4::<O::Out>::uninit((d.batch, d.heads, d.q_len, d.value_dim));
    let mut lse = Array3::<f32>::uninit((d.batch, d.heads, d.q_len));
    let mut residual = Array3::<f32>::uninit((d.batch, d.heads, d.q_len));
    // An empty output has nothing to write: with a value width above zero
    // (`supports`) it has no batch, head or query, nor has `lse`.
    if !out.is_empty() {
        run_units(ops, isa, &mut out, [&mut lse, &mut residual]);
    }
    // SAFETY: the units partition the output and the log-sum-exp, and each unit's
    // `write_out` writes all of its part.
    unsafe {
        let (value, residual) = (lse.assume_init(), residual.assume_init());
        (out.assume_init(), LogSumExp { value, residual })
    }
}

/// Runs every unit of `ops`'s problem, which write all of `out` and `lse`.
fn run_units<'p, O: Operands<'p>>(
    ops: &O,
    isa: IsaToken,
    out: &mut Array4<MaybeUninit<O::Out>>,
    lse: [&mut Array3<MaybeUninit<f32>>; 2],
) {
    let p = ops.problem();
    let d = p.dims();
    let plan = Plan {
        group: d.heads / d.kv_heads,
        nq: ops.query_vectors(isa.registers()),
        masks: p.mask_tiles(isa),
    };
    let units = units(&d, plan.nq * LANES, out, lse);
    let len = scratch_len::<O>(&d);
    units.into_par_iter().for_each(|unit| {
        with_scratch(len, |scratch| {
            dispatch(
                isa,
                UnitJob {
                    p,
                    ops,
                    plan: &plan,
                    unit,
                    scratch,
                },
            )
        })
    });
}

/// The units of a call, `w` queries wide, each with the part of the fresh output
/// `out` and log-sum-exp `lse` (value and residual) it writes.
fn units<'o, T>(
    d: &Dims,
    w: usize,
    out: &'o mut Array4<MaybeUninit<T>>,
    lse: [&'o mut Array3<MaybeUninit<f32>>; 2],
) -> Vec<Unit<'o, T>> {
    let mut units = Vec::new();
    let outs = out.as_slice_mut().expect("fresh array is contiguous");
    let [values, residuals] = lse.map(|a| a.as_slice_mut().expect("fresh array is contiguous"));
    let head_chunks = outs.chunks_mut(d.q_len * d.value_dim).zip(
        values
            .chunks_mut(d.q_len)
            .zip(residuals.chunks_mut(d.q_len)),
    );
    for (bh, (o, (l, r))) in head_chunks.enumerate() {
        let blocks = o
            .chunks_mut(w * d.value_dim)
            .zip(l.chunks_mut(w).zip(r.chunks_mut(w)));
        for (qb, (o, (l, r))) in blocks.enumerate() {
            units.push(Unit {
                b: bh / d.heads,
                h: bh % d.heads,
                i0: qb * w,
                out: o,
                lse: l,
                residual: r,
            });
        }
    }
    units
}

/// Choices made once per call.
struct Plan {
    group: usize,
    /// Vectors of 16 queries per unit.
    nq: usize,
    /// The per-score masks, combined and transposed once.
    masks: MaskTiles,
}

/// One block of queries of one head, and the part of the output it writes.
struct Unit<'o, T> {
    b: usize,
    h: usize,
    i0: usize,
    /// `[rows, Ev]`, uninitialised until [`write_out`] writes all of it.
    out: &'o mut [MaybeUninit<T>],
    /// `[rows]`, likewise: the log-sum-exps' f32 values and residuals.
    lse: &'o mut [MaybeUninit<f32>],
    residual: &'o mut [MaybeUninit<f32>],
}

/// The buffers every unit has, carved from the thread's scratch after the
/// operands' own.
struct UnitScratch<'s> {
    /// Scores, then weights, `[BK][W]`.
    s: &'s mut [f32],
    /// Additive mask tile, `[BK][W]`.
    mb: &'s mut [f32],
    /// `Oᵀ`, `[Ev][W]`.
    ot: &'s mut [f32],
    /// Running max, running sum, and this tile's rescale factor, `[W]`.
    m: &'s mut [f32],
    l: &'s mut [f32],
    alpha: &'s mut [f32],
}

impl<'s> UnitScratch<'s> {
    /// Carves the buffers for units `w` queries wide with `ev` value columns. Every
    /// buffer is a whole number of 16-float rows, so each starts on a cache line as
    /// the scratch does.
    fn new(rest: &mut &'s mut [f32], ev: usize, w: usize) -> Self {
        UnitScratch {
            s: carve(rest, BK * w),
            mb: carve(rest, BK * w),
            ot: carve(rest, ev * w),
            m: carve(rest, w),
            l: carve(rest, w),
            alpha: carve(rest, w),
        }
    }
}

/// One unit of work, for [`dispatch`].
struct UnitJob<'a, 'p, 'o, 's, O: Operands<'p>> {
    p: &'a Problem<'p, O::Elem, O::KvElem>,
    ops: &'a O,
    plan: &'a Plan,
    unit: Unit<'o, O::Out>,
    scratch: &'s mut [f32],
}

impl<'p, O: Operands<'p>> SimdJob for UnitJob<'_, 'p, '_, '_, O> {
    type Output = ();
    #[inline(always)]
    fn run<I: Simd>(self, isa: I) {
        let UnitJob {
            p,
            ops,
            plan,
            unit: u,
            scratch,
        } = self;
        match plan.nq {
            1 => unit::<I, 1, O>(isa, (p, ops), plan, u, scratch),
            2 => unit::<I, 2, O>(isa, (p, ops), plan, u, scratch),
            _ => unit::<I, 4, O>(isa, (p, ops), plan, u, scratch),
        }
    }
}

/// Base pointer of head `(b, h)` of a `[B, H, T, D]` view, and its row and column
/// strides in elements.
fn head_ptr<T>(a: &ArrayView4<'_, T>, b: usize, h: usize) -> (*const T, isize, isize) {
    let st = a.strides();
    // SAFETY (of later reads): indices are within the view's shape.
    let base = a
        .as_ptr()
        .wrapping_offset(b as isize * st[0] + h as isize * st[1]);
    (base, st[2], st[3])
}

/// One unit: pack the queries, sweep the key tiles, normalise and write out.
#[inline(always)]
fn unit<'p, I: Simd, const NQ: usize, O: Operands<'p>>(
    isa: I,
    (p, ops): (&Problem<'p, O::Elem, O::KvElem>, &O),
    plan: &Plan,
    u: Unit<'_, O::Out>,
    mut scratch: &mut [f32],
) {
    let w = NQ * LANES;
    let ev = p.dims().value_dim;
    let at = UnitAt {
        b: u.b,
        h: u.h,
        kvh: u.h / plan.group,
        i0: u.i0,
        rows: u.lse.len(),
    };
    let (b, h, i0, rows) = (at.b, at.h, at.i0, at.rows);
    prefetch_queries(p, (b, h), i0 + w..i0 + 2 * w);
    let mut own = ops.start::<I, NQ>(isa, &at, &mut scratch);
    let scr = UnitScratch::new(&mut scratch, ev, w);
    // `Oᵀ` is left as the scratch holds it until the first value products write it
    // (zeroing it first was 0.4 % of a causal bf16 N2048's samples).
    let mut ot_written = false;
    scr.m.fill(f32::NEG_INFINITY);
    scr.l.fill(0.0);
    let stats = Stats {
        m: scr.m.as_mut_ptr(),
        l: scr.l.as_mut_ptr(),
        alpha: scr.alpha.as_mut_ptr(),
    };

    let (jlo, jhi) = p.block_key_range(i0, i0 + rows);
    let bk = tile_keys::<I>();
    let mut t = jlo / bk;
    while t * bk < jhi {
        let j0 = (t * bk).max(jlo);
        let j1 = ((t + 1) * bk).min(jhi);
        t += 1;
        if j0 >= j1 {
            continue; // no key visible to any query of the block
        }
        let nk = j1 - j0;
        // The additive mask terms of the tile: read in place where neither the
        // causal/window band nor key padding cuts through the tile; where the band is
        // all that cuts, one row of band terms read at a shifting offset; else a copy
        // with the cuts made. The band leaves every key of `jlo..jhi` visible to some
        // query of the unit, so no tile is skipped for it.
        let cut = plan.masks.needs_copy(p, b, (i0, rows), (j0, nk));
        // Asked once, and only of a tile something masks (the NaN rule's concern).
        let finite = !(cut || plan.masks.has_masks()) || ops.values_finite(isa, &own, (j0, j1));
        let mask = if cut && plan.masks.band_only(p) {
            band_row(p, i0, (j0, nk), w, scr.mb);
            MaskRows {
                // SAFETY: the row holds `w + nk − 1` floats.
                first: unsafe { scr.mb.as_ptr().add(nk - 1) },
                stride: -1,
            }
        } else if cut {
            if !plan.masks.tile(p, (b, h), (i0, rows), (j0, nk), scr.mb, w) {
                continue; // every score of the tile is masked
            }
            for jj in 0..nk {
                scr.mb[jj * w + rows..(jj + 1) * w].fill(0.0);
            }
            MaskRows {
                first: scr.mb.as_ptr(),
                stride: w as isize,
            }
        } else if plan.masks.has_masks() {
            let (rows_from, stride) = plan.masks.rows((b, h), i0, j0, (nk, w));
            MaskRows {
                first: rows_from.as_ptr(),
                stride: stride as isize,
            }
        } else {
            MaskRows::NONE
        };

        // SAFETY: the statistics hold `w` floats each.
        unsafe { ops.begin_tile::<I, NQ>(isa, &mut own, (j0, j1), stats) };

        // Sᵀ = K Qᵀ (+ mask). SAFETY: the tile's keys are inside the head (`j1 ≤
        // S`); `s` holds `BK ≥ nk` rows and the mask (a tile copy, a band row or
        // `MaskTiles` rows) `nk` rows of `w` floats.
        unsafe { ops.score_tile::<I, NQ>(isa, &own, (j0, j1), scr.s.as_mut_ptr(), mask) };

        // SAFETY: `s` holds `nk ≤ BK` rows of `w` floats, the statistics `w` each.
        unsafe { ops.weights::<I, NQ>(isa, &mut own, &at, (j0, j1), scr.s.as_mut_ptr(), stats) };

        // A key the mask hides from a query must not reach it, not even as its zero
        // weight times a NaN value: a masked tile with a non-finite value takes the
        // exact path.
        if !mask.is_none() && !finite {
            if !ot_written {
                scr.ot.fill(0.0);
                ot_written = true;
            }
            let (sp, op, ap) = (scr.s.as_ptr(), scr.ot.as_mut_ptr(), scr.alpha.as_ptr());
            // SAFETY: as for the products below, for every column; the mask holds
            // `nk` rows.
            unsafe { ops.value_cols_seen::<I, NQ>(isa, &own, (j0, j1), sp, op, ap, mask) };
            continue;
        }

        // Oᵀ = α Oᵀ + Vᵀ Pᵀ.
        let rescale = if ot_written {
            // SAFETY: `alpha` holds `NQ` vectors of 16 floats.
            Rescale::By(unsafe { std::slice::from_raw_parts(scr.alpha.as_ptr().cast(), NQ) })
        } else {
            Rescale::None
        };
        ot_written = true;
        // SAFETY: `ot` holds `ev` rows of `w` floats, `s` `nk` rows.
        unsafe {
            let (sp, op) = (scr.s.as_ptr(), scr.ot.as_mut_ptr());
            ops.value_tile::<I, NQ>(isa, &own, (j0, j1), sp, op, rescale);
        }
    }

    if !ot_written {
        scr.ot.fill(0.0); // no tile: every query's output is zero
    }
    write_out(isa, scr.ot, (scr.m, scr.l), w, u);
}

/// Asks for the query rows `rows` of head `(b, h)` (those inside it) in the level-2
/// cache: the next block of the head, usually the thread's next unit, whose query
/// packing otherwise waits on the rows' loads.
#[inline(always)]
fn prefetch_queries<Q, KV>(
    p: &Problem<'_, Q, KV>,
    (b, h): (usize, usize),
    rows: std::ops::Range<usize>,
) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, (b, h), rows);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let (q, rs, cs) = head_ptr(&p.q, b, h);
        let d = p.dims();
        if cs != 1 {
            return; // rows that are not contiguous: left to the hardware
        }
        let bytes = d.head_dim.saturating_sub(1) * std::mem::size_of::<Q>();
        for i in rows.start..rows.end.min(d.q_len) {
            let row = q.wrapping_offset(i as isize * rs).cast::<u8>();
            for at in (0..=bytes).step_by(64) {
                // SAFETY: a prefetch never faults; the address is inside the view.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(row.wrapping_add(at).cast()) };
            }
        }
    }
}

/// Normalises a unit's `Oᵀ` (`[Ev][w]`) by the running sums `l` and writes it out
/// `[rows, Ev]` in the output's element type ([`write_normalised`]), with the
/// log-sum-exp from the running maxima `m`, in its two parts.
#[inline(always)]
fn write_out<I: Simd, T: Output>(
    isa: I,
    ot: &[f32],
    (m, l): (&[f32], &[f32]),
    w: usize,
    u: Unit<'_, T>,
) {
    let rows = u.lse.len();
    let ev = u.out.len() / rows.max(1);
    write_normalised(isa, (ot, w), l, rows, u.out);
    let parts = u.lse.iter_mut().zip(u.residual.iter_mut());
    for ((lse, residual), (&m, &l)) in parts.zip(m.iter().zip(l)) {
        let (value, rest) = split(f64::from(m), ln_sum(l));
        lse.write(value);
        residual.write(rest);
    }
    for ii in 0..rows {
        let (m, l) = (m[ii], l[ii]);
        // A running max of −∞ means no score was seen, unless a NaN score came
        // first and a masked −∞ after it replaced it (`max` keeps only a NaN in its
        // second operand); the NaN is still in the sum then.
        if m == f32::NEG_INFINITY && !l.is_nan() {
            u.out[ii * ev..(ii + 1) * ev].fill(MaybeUninit::new(T::ZERO));
            u.lse[ii].write(f32::NEG_INFINITY);
            u.residual[ii].write(0.0);
        } else if !l.is_normal() {
            let (value, rest) = split(f64::from(m), f64::from(l).ln());
            u.lse[ii].write(value);
            u.residual[ii].write(rest);
        }
    }
}

/// `ln l` in f64 for a normal running sum `l` (the sums of seen scores are at least
/// 1; the caller takes the others apart). No call to `ln`: 64 of them took 6 % of a
/// unit's time against 64 keys; this code has no branch, so the compiler computes a
/// unit's queries a vector at a time.
///
/// `l = 2^e · f` with `f` in `[√½, √2)`, and `ln f = 2 atanh(s)` with `s = (f − 1) /
/// (f + 1)`, `|s| < 0.172`: the series to `s²¹` leaves out less than `2 s²³/23 <
/// 3·10⁻¹⁹`, below the f64 roundings of the two terms, so that the result is as
/// good as `ln`'s.
#[inline(always)]
fn ln_sum(l: f32) -> f64 {
    let bits = l.to_bits();
    let mantissa = f64::from(f32::from_bits(bits & 0x007f_ffff | 0x3f80_0000));
    let halve = mantissa > std::f64::consts::SQRT_2;
    let f = if halve { mantissa * 0.5 } else { mantissa };
    let e = ((bits >> 23) & 0xff) as i32 - 127 + i32::from(halve);
    let s = (f - 1.0) / (f + 1.0);
    let s2 = s * s;
    let odd = [21.0, 19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0]
        .iter()
        .fold(0.0, |acc, k| (acc + 2.0 / k) * s2);
    let ln_f = s * (2.0 + odd);
    f64::from(e) * std::f64::consts::LN_2 + ln_f
}

/// The running maxima of a unit's `NQ` panels of 16 queries updated with a tile's
/// `nk` scores (rows of `16·NQ` floats from `s`) and stored in `m`; returns, per
/// panel, the maximum to subtract from the tile's scores and `e^(m_old − m)`, the
/// factor that rescales what came before.
///
/// Key by key across the panels: each panel's maximum is a chain of dependent
/// `max`es, and the panels' chains side by side keep the vector units busy where
/// one chain at a time would wait on each `max`'s latency (the softmax's sums
/// likewise). Each panel's maxima are taken in the same order either way.
///
/// # Safety
/// `s` valid for `nk` rows of `16·NQ` floats, `m` for `16·NQ` floats.
#[inline(always)]
unsafe fn running_max<I: Simd, const NQ: usize>(
    isa: I,
    s: *const f32,
    nk: usize,
    m: *mut f32,
) -> ([I::V; NQ], [I::V; NQ]) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let mut m_old = [isa.splat(0.0); NQ];
        for (x, v) in m_old.iter_mut().enumerate() {
            *v = isa.load(m.add(x * LANES));
        }
        let mx = panel_maxima::<I, NQ>(isa, s, nk, m_old);
        let (mut m_use, mut alpha) = (mx, mx);
        for x in 0..NQ {
            isa.store(m.add(x * LANES), mx[x]);
            // While every score so far is masked the max is −∞; subtract the lowest
            // finite float instead, so that masked scores give 0 rather than NaN (max
            // keeps a NaN in its second operand).
            m_use[x] = isa.max(isa.splat(f32::MIN), mx[x]);
            alpha[x] = exp_shifted(isa, m_old[x], m_use[x]);
        }
        (m_use, alpha)
    }
}

/// Each panel's maximum of `from` and the scores of `nk` keys (rows of `16·NQ`
/// floats from `s`), key by key across the panels as [`running_max`] says.
///
/// # Safety
/// `s` valid for `nk` rows of `16·NQ` floats.
#[inline(always)]
unsafe fn panel_maxima<I: Simd, const NQ: usize>(
    isa: I,
    s: *const f32,
    nk: usize,
    from: [I::V; NQ],
) -> [I::V; NQ] {
    let w = NQ * LANES;
    let mut mx = from;
    for j in 0..nk {
        for (x, v) in mx.iter_mut().enumerate() {
            // SAFETY: row `j < nk` of `s` holds `16·NQ` floats (the caller's contract).
            *v = isa.max(*v, unsafe { isa.load(s.add(j * w + x * LANES)) });
        }
    }
    mx
}

/// Adds each panel's tile sum to its running sum `l` rescaled by `alpha`, and
/// leaves `alpha` in the stats for the output's rescaling.
///
/// # Safety
/// `stats.l` and `stats.alpha` valid for `16·NQ` floats.
#[inline(always)]
unsafe fn join_sums<I: Simd, const NQ: usize>(
    isa: I,
    sum: [I::V; NQ],
    alpha: [I::V; NQ],
    stats: Stats,
) {
    for x in 0..NQ {
        // SAFETY: the caller upholds this function's contract (see # Safety).
        unsafe {
            let (l, a) = (stats.l.add(x * LANES), stats.alpha.add(x * LANES));
            isa.store(l, isa.fma(isa.load(l), alpha[x], sum[x]));
            isa.store(a, alpha[x]);
        }
    }
}

/// `ot[c][·] = α · ot[c][·] + Σ_j v(j, c) · p(j, ·)` for the `ev` value columns over
/// the `nk` keys of a tile, one product at a time and only over the pairs that see
/// each other (mask term in `mask.row(j)` not −∞): the exact path of
/// [`Operands::value_cols_seen`], the same for every element type but for how a
/// value `v(j, c)` and a weight `p(j, lane)` are read.
///
/// # Safety
/// `ot` must be valid for `ev` rows and `alpha` for one row of `w` floats, `mask`
/// for `nk` rows.
#[inline(always)]
unsafe fn seen_products(
    (ev, w, nk): (usize, usize, usize),
    ot: *mut f32,
    alpha: *const f32,
    mask: MaskRows,
    value: impl Fn(usize, usize) -> f32,
    weight: impl Fn(usize, usize) -> f32,
) {
    // SAFETY: every access is inside the caller's rows (see # Safety).
    unsafe {
        for c in 0..ev {
            for lane in 0..w {
                let o = ot.add(c * w + lane);
                let mut acc = *o * *alpha.add(lane);
                for j in 0..nk {
                    if *mask.row(j).add(lane) != f32::NEG_INFINITY {
                        acc += value(j, c) * weight(j, lane);
                    }
                }
                *o = acc;
            }
        }
    }
}

/// `e^(x − m)`: the difference first, which is exact for the scores that matter,
/// so huge scores lose nothing (scores of `f32::MIN`'s size included: equal ones
/// give 1).
#[inline(always)]
fn exp_shifted<I: Simd>(isa: I, x: I::V, m: I::V) -> I::V {
    isa.exp(isa.sub(x, m))
}

/// A score with its mask term (the term from [`MaskTiles`]):
/// `score + mask`, −∞ where the mask is −∞ even if `score` is NaN.
#[inline(always)]
fn masked_score<I: Simd>(isa: I, score: I::V, mask: I::V) -> I::V {
    isa.masked(isa.add(score, mask), mask)
}

#[cfg(test)]
mod tests {
    use ndarray::Array4;

    use super::*;
    use crate::problem::{AttentionOptions, Causal};

    /// The unit width [`query_vectors`] picks for `l` queries against `s` keys.
    fn width(l: usize, s: usize, opts: &AttentionOptions<'_>) -> usize {
        let q = Array4::<f32>::zeros((1, 1, l, 8));
        let kv = Array4::<f32>::zeros((1, 1, s, 8));
        let p = Problem::new(q.view(), kv.view(), kv.view(), opts).expect("valid problem");
        query_vectors(&p)
    }

    /// The log of a running sum without `ln` against f64's `ln`: within a few f64
    /// roundings (`ln_sum`'s doc), for sums from 1 to 2³⁰ (powers of two, both
    /// sides of the √2 split) and between. (The series cut at `s¹³` is 10⁻¹³ off
    /// and fails.)
    #[test]
    fn ln_sum_matches_f64_ln() {
        let mut sums: Vec<f32> = (0..=30).map(|e| 2f32.powi(e)).collect();
        let sqrt2 = std::f32::consts::SQRT_2;
        sums.extend([
            sqrt2,
            f32::from_bits(sqrt2.to_bits() + 1),
            1.0 + f32::EPSILON,
        ]);
        sums.extend((0..2000).map(|i| 1.0 + i as f32 * 0.7331 + (i * i) as f32 * 13.1));
        for &l in &sums {
            let want = (l as f64).ln();
            let got = ln_sum(l);
            // A few f64 roundings of the result, and of `e · ln 2` where it and
            // `ln f` cancel.
            let bound = 1e-15 * want.abs() + 2.0 * f64::EPSILON;
            assert!((got - want).abs() <= bound, "l {l}: {got} against {want}");
        }
    }

    #[test]
    fn banded_units_are_wide_only_where_little_is_masked() {
        let top_left = AttentionOptions {
            causal: Some(Causal::TopLeft),
            ..Default::default()
        };
        let bottom_right = AttentionOptions {
            causal: Some(Causal::BottomRight),
            ..Default::default()
        };
        let window = AttentionOptions {
            window: Some((256, 256)),
            ..Default::default()
        };
        // Units of 64 queries mask 1/8 of a causal N512's scores, 1/16 at N1024,
        // under 1/32 from N2048.
        assert_eq!(width(512, 512, &top_left), 2);
        assert_eq!(width(1024, 1024, &top_left), 2);
        assert_eq!(width(2048, 2048, &top_left), 4);
        // A short prompt's queries against a long cache see nearly every key.
        assert_eq!(width(90, 1000, &bottom_right), 4);
        assert_eq!(width(90, 150, &bottom_right), 2);
        // A window has two edges: 64 queries across a 513-key band mask ~1/8.
        assert_eq!(width(4096, 4096, &window), 2);
        // Unbanded problems take what their queries fill.
        assert_eq!(width(512, 512, &AttentionOptions::default()), 4);
        assert_eq!(width(20, 512, &top_left), 2);
        assert_eq!(width(10, 512, &top_left), 1);
    }
}
