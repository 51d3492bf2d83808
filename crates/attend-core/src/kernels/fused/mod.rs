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
//! * `Qᵀ` is packed once, `[E][W]`, multiplied by `scale·log₂e`: scores are kept
//!   in base 2, so that the softmax needs only `2^x`, and the scaling costs a
//!   multiplication per query element instead of one per score;
//! * for each tile of keys (`tile_keys`: 128 or 64),
//!   `Sᵀ[j][·] = Σ_e K[j, e] · Qᵀ[e][·] (+ log₂e · mask)`: broadcast one key
//!   element, multiply a row of queries (`qk_rows`, `MR` keys × `NQ` vectors in
//!   registers), then add the mask term, which the mask tiles hold in base 2
//!   already. `K` is read in place through its strides, never copied;
//! * the online-softmax update works down the columns of `Sᵀ`, so the running
//!   max and sum per query are plain lane-wise vector operations (`softmax_tile`);
//! * `Oᵀ[c][·] = α·Oᵀ[c][·] + Σ_j V[j, c] · Pᵀ[j][·]` (`pv_cols`), again with `V`
//!   broadcast from its own strides.
//!
//! Tiles that causality or the window hide from every query of the unit are never
//! visited; tiles inside the band with no other mask skip all per-score masking.
//! Fully masked rows end with a running max of −∞, and give 0 and a log-sum-exp
//! of −∞.

use std::f32::consts::LOG2_E;

use ndarray::{Array3, Array4, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use crate::isa::transpose::transpose;
use crate::isa::{dispatch, IsaToken, Simd, SimdJob, LANES};
use crate::kernels::scratch::{carve, with_scratch};
use crate::problem::{Dims, Dropout, MaskTiles, Problem, SoftmaxAxis};

/// Keys per tile at most (the scratch is sized for it); see [`tile_keys`].
const BK: usize = 128;

/// Products summed in registers before joining a dot product's running total: the
/// blocks keep long dot products (E = 128, 256) well below the naive sum's error,
/// and each join costs a load, an add and a store per accumulator (32 rather than
/// 16 halved those at E = 64; docs/fused-forward.md).
const DOT_CHUNK: usize = 32;

/// Whether the fused kernel handles this problem (the reference covers the rest:
/// the softmax over queries, and empty value widths).
pub fn supports<T>(p: &Problem<'_, T>) -> bool {
    p.softmax_axis == SoftmaxAxis::Keys && p.dims().value_dim > 0
}

/// Keys a register block holds at least where the unit can be narrowed for it
/// (see [`fit_register_block`]).
const MIN_BLOCK: usize = 6;

/// Vectors of 16 queries per unit (1, 2 or 4) for `q_len` queries, `banded` when
/// causality or a window cuts the keys per query: as many as the queries fill, up
/// to 4 (a wider unit shares each key and value load among more queries), but at
/// most 2 in a banded problem, where a unit of `W` queries computes about `W²/2`
/// scores across the band's edge only to mask them (an eighth of a causal N512's
/// work at `W = 64`; docs/fused-forward.md).
fn query_vectors(q_len: usize, banded: bool) -> usize {
    widest_unit(q_len).min(if banded { 2 } else { 4 })
}

/// `nq` vectors of queries, halved until the register block for `registers` vector
/// registers holds at least [`MIN_BLOCK`] keys: with AVX2's 16 registers, four
/// vectors left the f32 products' blocks one key deep, each multiply-add waiting on
/// a load of its own, and one vector ran 1.05–1.26× faster.
fn fit_register_block(mut nq: usize, registers: usize) -> usize {
    while nq > 1 && register_block(registers, nq) < MIN_BLOCK {
        nq /= 2;
    }
    nq
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

/// Floats of scratch one unit of work (16, 32 or 64 queries of one head) needs:
/// `Qᵀ`, a tile of scores and one of mask terms, `Oᵀ` and the running statistics.
pub fn scratch_len(d: &Dims) -> usize {
    let w = widest_unit(d.q_len) * LANES;
    (d.head_dim + 2 * BK + d.value_dim + 3) * w
}

/// Runs the fused forward on the current rayon pool with `isa`'s vectors,
/// returning the output `[B, Hq, L, Ev]` and the log-sum-exp `[B, Hq, L]`.
///
/// With `dropout` (training's forward) the output is `Σ_j softmax_j · z_j · v_j`
/// with `z` the [`Dropout`] factors, and the log-sum-exp that of the weights before
/// dropout, as the backward expects.
///
/// # Panics
/// If `!supports(p)` (checked by [`crate::attention::attention_with`]).
pub(crate) fn run(
    p: &Problem<'_>,
    isa: IsaToken,
    dropout: Option<&Dropout>,
) -> (Array4<f32>, Array3<f32>) {
    assert!(supports(p), "fused kernel does not support this problem");
    let d = p.dims();
    let mut out = Array4::<f32>::zeros((d.batch, d.heads, d.q_len, d.value_dim));
    let mut lse = Array3::<f32>::zeros((d.batch, d.heads, d.q_len));
    if out.is_empty() {
        return (out, lse);
    }
    let nq = fit_register_block(query_vectors(d.q_len, p.is_banded()), isa.registers());
    let w = nq * LANES;
    let plan = Plan {
        group: d.heads / d.kv_heads,
        scale: p.scale * LOG2_E,
        nq,
        masks: p.mask_tiles(LOG2_E, isa),
        dropout: dropout.copied(),
    };

    let units = units(&d, w, &mut out, &mut lse);
    let len = scratch_len(&d);
    units.into_par_iter().for_each(|unit| {
        with_scratch(len, |scratch| {
            dispatch(
                isa,
                UnitJob {
                    p,
                    plan: &plan,
                    unit,
                    scratch,
                },
            )
        })
    });
    (out, lse)
}

/// The units of a call, `w` queries wide, each with the part of the fresh output
/// `out` and log-sum-exp `lse` it writes.
fn units<'o>(
    d: &Dims,
    w: usize,
    out: &'o mut Array4<f32>,
    lse: &'o mut Array3<f32>,
) -> Vec<Unit<'o>> {
    let mut units = Vec::new();
    let outs = out.as_slice_mut().expect("fresh array is contiguous");
    let lses = lse.as_slice_mut().expect("fresh array is contiguous");
    let head_chunks = outs
        .chunks_mut(d.q_len * d.value_dim)
        .zip(lses.chunks_mut(d.q_len));
    for (bh, (o, l)) in head_chunks.enumerate() {
        let blocks = o.chunks_mut(w * d.value_dim).zip(l.chunks_mut(w));
        for (qb, (o, l)) in blocks.enumerate() {
            units.push(Unit {
                b: bh / d.heads,
                h: bh % d.heads,
                i0: qb * w,
                out: o,
                lse: l,
            });
        }
    }
    units
}

/// Choices made once per call.
struct Plan {
    group: usize,
    /// `scale · log₂e`: scores are kept in base 2.
    scale: f32,
    /// Vectors of 16 queries per unit.
    nq: usize,
    /// The per-score masks, combined and transposed once.
    masks: MaskTiles,
    dropout: Option<Dropout>,
}

/// One block of queries of one head, and the part of the output it writes.
struct Unit<'o> {
    b: usize,
    h: usize,
    i0: usize,
    /// `[rows, Ev]`.
    out: &'o mut [f32],
    /// `[rows]`.
    lse: &'o mut [f32],
}

/// A unit's buffers, carved from the thread's scratch.
struct UnitScratch<'s> {
    /// `Qᵀ`, `[E][W]`.
    qt: &'s mut [f32],
    /// Scores, then probabilities, `[BK][W]`.
    s: &'s mut [f32],
    /// Additive mask tile, `[BK][W]`.
    mb: &'s mut [f32],
    /// `Oᵀ`, `[Ev][W]`.
    ot: &'s mut [f32],
    /// Running max (log₂ units), running sum, and this tile's rescale factor, `[W]`.
    m: &'s mut [f32],
    l: &'s mut [f32],
    alpha: &'s mut [f32],
}

impl<'s> UnitScratch<'s> {
    /// Splits `buf` ([`scratch_len`] floats) for units `w` queries wide.
    fn new(mut buf: &'s mut [f32], e: usize, ev: usize, w: usize) -> Self {
        // Every buffer is a whole number of 16-float rows, so each starts on a cache
        // line as the scratch does.
        let rest = &mut buf;
        UnitScratch {
            qt: carve(rest, e * w),
            s: carve(rest, BK * w),
            mb: carve(rest, BK * w),
            ot: carve(rest, ev * w),
            m: carve(rest, w),
            l: carve(rest, w),
            alpha: carve(rest, w),
        }
    }
}

/// The register block for `registers` vector registers: as many accumulators as
/// fit in about three quarters of them (counted in 16-lane vectors), in keys of
/// `nq` vectors each.
fn register_block(registers: usize, nq: usize) -> usize {
    (registers * 3 / 4 / nq).clamp(1, 12)
}

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

/// One unit of work, for [`dispatch`].
struct UnitJob<'a, 'p, 'o, 's> {
    p: &'a Problem<'p>,
    plan: &'a Plan,
    unit: Unit<'o>,
    scratch: &'s mut [f32],
}

impl SimdJob for UnitJob<'_, '_, '_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<I: Simd>(self, isa: I) {
        let UnitJob {
            p,
            plan,
            unit: u,
            scratch,
        } = self;
        match plan.nq {
            1 => unit::<I, 1>(isa, p, plan, u, scratch),
            2 => unit::<I, 2>(isa, p, plan, u, scratch),
            _ => unit::<I, 4>(isa, p, plan, u, scratch),
        }
    }
}

/// Calls `$f::<$I, $NQ, n>(args)` for a runtime `n` in `1..=12`.
macro_rules! with_block {
    ($n:expr, $f:ident::<$I:ty, $NQ:ident>($($arg:expr),* $(,)?)) => {
        match $n {
            1 => $f::<$I, $NQ, 1>($($arg),*),
            2 => $f::<$I, $NQ, 2>($($arg),*),
            3 => $f::<$I, $NQ, 3>($($arg),*),
            4 => $f::<$I, $NQ, 4>($($arg),*),
            5 => $f::<$I, $NQ, 5>($($arg),*),
            6 => $f::<$I, $NQ, 6>($($arg),*),
            7 => $f::<$I, $NQ, 7>($($arg),*),
            8 => $f::<$I, $NQ, 8>($($arg),*),
            9 => $f::<$I, $NQ, 9>($($arg),*),
            10 => $f::<$I, $NQ, 10>($($arg),*),
            11 => $f::<$I, $NQ, 11>($($arg),*),
            12 => $f::<$I, $NQ, 12>($($arg),*),
            _ => unreachable!("register block out of range"),
        }
    };
}

pub(crate) mod bf16;

/// One unit: pack `Qᵀ`, sweep the key tiles, normalise and write out.
#[inline(always)]
fn unit<I: Simd, const NQ: usize>(
    isa: I,
    p: &Problem<'_>,
    plan: &Plan,
    u: Unit<'_>,
    scratch: &mut [f32],
) {
    let d = p.dims();
    let w = NQ * LANES;
    let (e, ev) = (d.head_dim, d.value_dim);
    let scr = UnitScratch::new(scratch, e, ev, w);
    let rows = u.lse.len();
    let (b, h, i0) = (u.b, u.h, u.i0);
    let kvh = h / plan.group;

    // Qᵀ times the scores' scale; lanes past the last query are zero.
    let mut qt = ArrayViewMut2::from_shape((e, w), &mut scr.qt[..e * w]).expect("e·w floats");
    qt.slice_mut(ndarray::s![.., rows..]).fill(0.0);
    transpose(
        isa,
        p.q.slice(ndarray::s![b, h, i0..i0 + rows, ..]),
        qt.slice_move(ndarray::s![.., ..rows]),
    );
    let scale = isa.splat(plan.scale);
    for x in scr.qt[..e * w].chunks_exact_mut(LANES) {
        // SAFETY: `x` is one whole vector (`w` is a multiple of 16).
        unsafe { isa.store(x.as_mut_ptr(), isa.mul(isa.load(x.as_ptr()), scale)) };
    }
    scr.ot.fill(0.0);
    scr.m.fill(f32::NEG_INFINITY);
    scr.l.fill(0.0);

    let (k_ptr, krs, kcs) = head_ptr(&p.k, b, kvh);
    let (v_ptr, vrs, vcs) = head_ptr(&p.v, b, kvh);
    let (jlo, jhi) = p.block_key_range(i0, i0 + rows);
    let mr = register_block(I::REGISTERS, NQ);
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
        // The additive mask term of the tile, `[nk][w]` rows `mbs` floats apart:
        // read in place where neither the causal/window band nor key padding cuts
        // through the tile, else a copy with the cuts made.
        let (mb, mbs): (*const f32, usize) = if plan.masks.needs_copy(p, b, (i0, rows), (j0, nk)) {
            if !plan.masks.tile(p, (b, h), (i0, rows), (j0, nk), scr.mb, w) {
                continue; // every score of the tile is masked
            }
            for jj in 0..nk {
                scr.mb[jj * w + rows..(jj + 1) * w].fill(0.0);
            }
            (scr.mb.as_ptr(), w)
        } else if plan.masks.has_masks() {
            let (rows_from, stride) = plan.masks.rows((b, h), i0, j0, (nk, w));
            (rows_from.as_ptr(), stride)
        } else {
            (std::ptr::null(), 0)
        };

        // Sᵀ = K Qᵀ (+ mask), MR keys at a time.
        let mut r0 = 0;
        while r0 < nk {
            let n = mr.min(nk - r0);
            // SAFETY: keys `j0 + r0 .. j0 + r0 + n` are inside the head (`j1 ≤ S`),
            // read through the view's own strides; `s` holds `BK ≥ nk` rows and the
            // mask rows (a tile copy or `MaskTiles` rows) `nk` rows of `w` floats.
            unsafe {
                let kp = k_ptr.offset((j0 + r0) as isize * krs);
                let sp = scr.s.as_mut_ptr().add(r0 * w);
                let mbp = if mb.is_null() { mb } else { mb.add(r0 * mbs) };
                with_block!(
                    n,
                    qk_rows::<I, NQ>(isa, scr.qt.as_ptr(), e, kp, krs, kcs, sp, mbp, mbs)
                );
            }
            r0 += n;
        }

        // SAFETY: `s` holds `nk ≤ BK` rows of `w` floats, the statistics `w` each.
        unsafe {
            softmax_tile::<I, NQ>(
                isa,
                scr.s.as_mut_ptr(),
                nk,
                scr.m.as_mut_ptr(),
                scr.l.as_mut_ptr(),
                scr.alpha.as_mut_ptr(),
            )
        };
        if let Some(dr) = &plan.dropout {
            // The running sum `l` above is over the weights before dropout; only
            // the values' weights are dropped (and the kept ones scaled).
            for ii in 0..rows {
                let row = dr.row(b, h, i0 + ii);
                for jj in 0..nk {
                    scr.s[jj * w + ii] *= dr.factor_in_row(row, j0 + jj);
                }
            }
        }

        // Oᵀ = α Oᵀ + Vᵀ Pᵀ, MR value columns at a time.
        let mut c0 = 0;
        while c0 < ev {
            let n = mr.min(ev - c0);
            // SAFETY: value rows `j0..j1` and columns `c0..c0 + n` are inside the
            // head; `ot` holds `ev` rows of `w` floats, `s` `nk` rows.
            unsafe {
                let vp = v_ptr.offset(j0 as isize * vrs + c0 as isize * vcs);
                let op = scr.ot.as_mut_ptr().add(c0 * w);
                with_block!(
                    n,
                    pv_cols::<I, NQ>(
                        isa,
                        scr.s.as_ptr(),
                        nk,
                        vp,
                        vrs,
                        vcs,
                        op,
                        scr.alpha.as_ptr()
                    )
                );
            }
            c0 += n;
        }
    }

    write_out(isa, scr.ot, scr.m, scr.l, w, u);
}

/// Normalises a unit's `Oᵀ` (`[Ev][w]`) by the running sums `l` and writes it out
/// `[rows, Ev]`, with the (natural) log-sum-exp from the base-2 running maxima `m`.
///
/// The divisions run down the rows of `Oᵀ` in place first, a vector at a time;
/// divided while transposing, one at a time, they took 3.5 % of the samples of
/// `perf record` at B1 H8 N512 d64. Each row is divided whole, the lanes past the
/// last query too (their sums are set, and their results never leave the scratch):
/// cut at the last query, a row of 22 left a scalar tail that took a tenth of a
/// 22-token unit's time.
#[inline(always)]
fn write_out<I: Simd>(isa: I, ot: &mut [f32], m: &[f32], l: &[f32], w: usize, u: Unit<'_>) {
    let rows = u.lse.len();
    let ev = u.out.len() / rows.max(1);
    for orow in ot.chunks_exact_mut(w).take(ev) {
        for (o, l) in orow.chunks_exact_mut(LANES).zip(l.chunks_exact(LANES)) {
            // SAFETY: `o` and `l` are whole vectors (`w` is a multiple of 16).
            unsafe {
                let x = isa.div(isa.load(o.as_ptr()), isa.load(l.as_ptr()));
                isa.store(o.as_mut_ptr(), x);
            }
        }
    }
    let ot = ArrayView2::from_shape((ev, w), &ot[..ev * w]).expect("ev·w floats");
    let out = ArrayViewMut2::from_shape((rows, ev), &mut *u.out).expect("rows·ev floats");
    transpose(isa, ot.slice(ndarray::s![.., ..rows]), out);
    for ii in 0..rows {
        let (m, l) = (m[ii], l[ii]);
        // A running max of −∞ means no score was seen, unless a NaN score came
        // first and a masked −∞ after it replaced it (`max` keeps only a NaN in its
        // second operand); the NaN is still in the sum then.
        if m == f32::NEG_INFINITY && !l.is_nan() {
            u.out[ii * ev..(ii + 1) * ev].fill(0.0);
            u.lse[ii] = f32::NEG_INFINITY;
        } else {
            u.lse[ii] = (m as f64 * std::f64::consts::LN_2 + (l as f64).ln()) as f32;
        }
    }
}

/// Base pointer of head `(b, h)` of a `[B, H, T, D]` view, and its row and column
/// strides in elements.
fn head_ptr(a: &ndarray::ArrayView4<'_, f32>, b: usize, h: usize) -> (*const f32, isize, isize) {
    let st = a.strides();
    // SAFETY (of later reads): indices are within the view's shape.
    let base = a
        .as_ptr()
        .wrapping_offset(b as isize * st[0] + h as isize * st[1]);
    (base, st[2], st[3])
}

/// `s[r][·] = Σ_c k[r, c] · qt[c][·] (+ mb[r][·])`, base-2 scores for `MR` keys
/// (`qt` carries the scale, `mb` the mask terms in base 2), rows of `16·NQ` (the
/// mask's rows `mbs` floats apart).
///
/// # Safety
/// `k` must be valid for `MR` rows × `e` columns with the given strides; `qt`, `s`
/// and (when not null) `mb` for `e`, `MR` and `MR` rows of `16·NQ` floats.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn qk_rows<I: Simd, const NQ: usize, const MR: usize>(
    isa: I,
    qt: *const f32,
    e: usize,
    k: *const f32,
    krs: isize,
    kcs: isize,
    s: *mut f32,
    mb: *const f32,
    mbs: usize,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        let zero = isa.splat(0.0);
        let mut kc = k;
        // Blocked summation: each chunk of `DOT_CHUNK` products is summed in registers,
        // then added to the running total in `s`. This keeps the rounding error of long
        // dot products (E = 128, 256) well below the naive sequential sum's.
        let mut c0 = 0;
        while c0 < e.max(1) {
            let c1 = (c0 + DOT_CHUNK).min(e);
            let mut acc = [[zero; NQ]; MR];
            for c in c0..c1 {
                let mut qv = [zero; NQ];
                for (v, q) in qv.iter_mut().enumerate() {
                    *q = isa.load(qt.add(c * w + v * LANES));
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let kb = isa.splat(*kc.offset(r as isize * krs));
                    for v in 0..NQ {
                        row[v] = isa.fma(qv[v], kb, row[v]);
                    }
                }
                kc = kc.offset(kcs);
            }
            let (first, last) = (c0 == 0, c1 >= e);
            for (r, row) in acc.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    let off = r * w + v * LANES;
                    let mut x = x;
                    if !first {
                        x = isa.add(isa.load(s.add(off)), x);
                    }
                    if last && !mb.is_null() {
                        x = masked_score(isa, x, isa.load(mb.add(r * mbs + v * LANES)));
                    }
                    isa.store(s.add(off), x);
                }
            }
            c0 = c1.max(c0 + 1);
        }
    }
}

/// Online-softmax update for one tile of `nk` keys (scores in base 2): updates the
/// running max `m` and sum `l`, turns scores `s` into `2^(s − m)` (the difference is
/// exact for the scores that matter, so huge scores lose nothing), and leaves in
/// `alpha` the factor `2^(m_old − m)` that rescales the previous output.
///
/// # Safety
/// `s` valid for `nk` rows of `16·NQ` floats; `m`, `l`, `alpha` for `16·NQ`.
#[inline(always)]
unsafe fn softmax_tile<I: Simd, const NQ: usize>(
    isa: I,
    s: *mut f32,
    nk: usize,
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        for v in 0..NQ {
            let o = v * LANES;
            let (m_use, a) = running_max::<I, NQ>(isa, s.add(o), nk, m.add(o));
            let mut sum = isa.splat(0.0);
            for j in 0..nk {
                let ptr = s.add(j * w + o);
                let pj = exp_shifted(isa, isa.load(ptr), m_use);
                isa.store(ptr, pj);
                sum = isa.add(sum, pj);
            }
            isa.store(l.add(o), isa.fma(isa.load(l.add(o)), a, sum));
            isa.store(alpha.add(o), a);
        }
    }
}

/// The running maximum of 16 queries updated with a tile's `nk` scores (rows of
/// `16·NQ` floats from `s`) and stored in `m`; returns the maximum to subtract from
/// the tile's scores and `2^(m_old − m)`, the factor that rescales what came before.
///
/// # Safety
/// `s` valid for `nk` rows of 16 floats `16·NQ` apart, `m` for 16 floats.
#[inline(always)]
unsafe fn running_max<I: Simd, const NQ: usize>(
    isa: I,
    s: *const f32,
    nk: usize,
    m: *mut f32,
) -> (I::V, I::V) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        let m_old = isa.load(m);
        let mut mx = m_old;
        for j in 0..nk {
            mx = isa.max(mx, isa.load(s.add(j * w)));
        }
        isa.store(m, mx);
        // While every score so far is masked the max is −∞; subtract the lowest
        // finite float instead, so that masked scores give 0 rather than NaN (max
        // keeps a NaN in its second operand).
        let m_use = isa.max(isa.splat(f32::MIN), mx);
        (m_use, exp_shifted(isa, m_old, m_use))
    }
}

/// `2^(x − m)` for base-2 scores: the difference first, which is exact for the
/// scores that matter, so huge scores lose nothing.
#[inline(always)]
fn exp_shifted<I: Simd>(isa: I, x: I::V, m: I::V) -> I::V {
    isa.exp2(isa.sub(x, m))
}

/// A base-2 score with its mask term (both in base 2, the term from [`MaskTiles`]):
/// `score + mask`, −∞ where the mask is −∞ even if `score` is NaN.
#[inline(always)]
fn masked_score<I: Simd>(isa: I, score: I::V, mask: I::V) -> I::V {
    isa.masked(isa.add(score, mask), mask)
}

/// `ot[c][·] = alpha · ot[c][·] + Σ_j v[j, c] · p[j][·]` for `MC` value columns.
///
/// # Safety
/// `v` valid for `nk` rows × `MC` columns with the given strides; `p` for `nk` rows
/// and `ot` for `MC` rows of `16·NQ` floats; `alpha` for `16·NQ`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_cols<I: Simd, const NQ: usize, const MC: usize>(
    isa: I,
    p: *const f32,
    nk: usize,
    v: *const f32,
    vrs: isize,
    vcs: isize,
    ot: *mut f32,
    alpha: *const f32,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        let zero = isa.splat(0.0);
        let mut a = [zero; NQ];
        for (x, al) in a.iter_mut().enumerate() {
            *al = isa.load(alpha.add(x * LANES));
        }
        // The tile's sum starts from zero and joins `alpha · ot` at the end (blocked
        // summation over keys, as for the dot products).
        let mut acc = [[zero; NQ]; MC];
        let mut vj = v;
        for j in 0..nk {
            let mut pv = [zero; NQ];
            for (x, pp) in pv.iter_mut().enumerate() {
                *pp = isa.load(p.add(j * w + x * LANES));
            }
            for (c, row) in acc.iter_mut().enumerate() {
                let vb = isa.splat(*vj.offset(c as isize * vcs));
                for x in 0..NQ {
                    row[x] = isa.fma(pv[x], vb, row[x]);
                }
            }
            vj = vj.offset(vrs);
        }
        for (c, row) in acc.iter().enumerate() {
            for (x, &val) in row.iter().enumerate() {
                let o = ot.add(c * w + x * LANES);
                isa.store(o, isa.fma(isa.load(o), a[x], val));
            }
        }
    }
}
