//! The fused forward on bf16 tensors: the f32 kernel's tiling and online softmax,
//! with both products taken on bf16 *pairs* ([`Simd::dot2`]), which AVX512-BF16
//! computes at twice the f32 rate (`vdpbf16ps`) and other instruction sets with
//! two fused multiply-adds, to the same sums.
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
//! Scores, the softmax statistics and the output accumulate in f32; the caller
//! rounds the output to bf16. A width or tile of odd length ends with a pair whose
//! high half is zero.

use ndarray::{Array3, Array4, ArrayView4};
use rayon::prelude::*;

use super::{
    exp_shifted, masked_score, query_vectors, register_block, running_max, tile_keys, widest_unit,
    Plan, Unit, BK,
};
use crate::element::bf16;
use crate::isa::{dispatch, IsaToken, Simd, SimdJob, LANES};
use crate::kernels::scratch::{carve, with_scratch};
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
fn pairs(n: usize) -> usize {
    n.div_ceil(2)
}

/// Floats (4-byte words) of scratch one unit needs: the packed `Qᵀ`, a tile of
/// scores and one of mask terms, the packed weights and values, `Oᵀ` and the running
/// statistics.
pub fn scratch_len(d: &Dims) -> usize {
    let w = widest_unit(d.q_len) * LANES;
    let values = pairs(BK) * d.value_dim.next_multiple_of(LANES);
    (pairs(d.head_dim) + 2 * BK + pairs(BK) + d.value_dim + 3) * w + values
}

/// Runs the bf16 fused forward on the current rayon pool with `isa`'s vectors,
/// returning the f32 output `[B, Hq, L, Ev]` (before rounding to bf16) and the
/// log-sum-exp `[B, Hq, L]`.
///
/// # Panics
/// If `!supports(p)` or `!reads_in_place(p)` (both checked by the caller).
pub(crate) fn run(p: &Problem<'_, bf16>, isa: IsaToken) -> (Array4<f32>, Array3<f32>) {
    assert!(
        super::supports(p),
        "fused kernel does not support this problem"
    );
    assert!(reads_in_place(p), "bf16 fused kernel needs contiguous rows");
    let d = p.dims();
    let mut out = Array4::<f32>::zeros((d.batch, d.heads, d.q_len, d.value_dim));
    let mut lse = Array3::<f32>::zeros((d.batch, d.heads, d.q_len));
    if out.is_empty() {
        return (out, lse);
    }
    // Not narrowed to fit the register block as the f32 kernel's units are: on AVX2
    // the pair products are bound by the shuffles that emulate them, not by loads,
    // and one vector of queries measured 0.94× (docs/fused-forward.md).
    let nq = query_vectors(d.q_len, p.is_banded());
    let plan = Plan {
        group: d.heads / d.kv_heads,
        scale: p.scale * std::f32::consts::LOG2_E,
        nq,
        masks: p.mask_tiles(std::f32::consts::LOG2_E, isa),
        dropout: None,
    };
    let values = ValuePairs::new(p, isa);
    let units = super::units(&d, nq * LANES, &mut out, &mut lse);
    let len = scratch_len(&d);
    units.into_par_iter().for_each(|unit| {
        with_scratch(len, |scratch| {
            dispatch(
                isa,
                UnitJob {
                    p,
                    plan: &plan,
                    values: &values,
                    unit,
                    scratch,
                },
            )
        })
    });
    (out, lse)
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
}

impl ValuePairs {
    fn new(p: &Problem<'_, bf16>, isa: IsaToken) -> Self {
        let d = p.dims();
        let evp = d.value_dim.next_multiple_of(LANES);
        let head = pairs(d.kv_len) * evp;
        let mut data = vec![0u32; d.batch * d.kv_heads * head];
        data.par_chunks_mut(head.max(1))
            .enumerate()
            .for_each(|(bh, dst)| {
                let v =
                    p.v.slice(ndarray::s![bh / d.kv_heads, bh % d.kv_heads, .., ..]);
                dispatch(isa, PackValues { v, dst, evp })
            });
        ValuePairs {
            data,
            head,
            evp,
            kv_heads: d.kv_heads,
            keys: d.kv_len,
        }
    }

    /// The pairs of keys `j0..j1` of head `(b, kvh)`, if they can be read here.
    fn tile(&self, (b, kvh): (usize, usize), (j0, j1): (usize, usize)) -> Option<&[u32]> {
        let even = j0 % 2 == 0 && (j1 % 2 == 0 || j1 == self.keys);
        let at = (b * self.kv_heads + kvh) * self.head + j0 / 2 * self.evp;
        even.then(|| &self.data[at..at + pairs(j1 - j0) * self.evp])
    }
}

/// [`pack_value_pairs`] over one head's values `[S, Ev]`, for [`dispatch`].
struct PackValues<'v, 'd> {
    v: ndarray::ArrayView2<'v, bf16>,
    dst: &'d mut [u32],
    evp: usize,
}

impl SimdJob for PackValues<'_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<I: Simd>(self, isa: I) {
        let (rows, ev) = self.v.dim();
        assert!(
            self.v.strides()[1] == 1 || ev <= 1,
            "value rows must be contiguous"
        );
        assert!(self.evp >= ev && self.dst.len() >= pairs(rows) * self.evp);
        let src = (self.v.as_ptr() as *const u16, self.v.strides()[0]);
        // SAFETY: `v` holds `rows` rows of `ev` contiguous bf16 (checked), `src.1`
        // apart (a bf16 is its `u16` bits); `dst` was checked to hold their pairs.
        unsafe { pack_value_pairs(isa, src, (rows, ev), self.dst.as_mut_ptr(), self.evp) }
    }
}

/// A unit's buffers, carved from the thread's scratch (pairs are `u32`).
struct UnitScratch<'s> {
    /// `Qᵀ` as pairs of columns, `[E/2][W]`.
    qp: &'s mut [u32],
    /// Scores, then weights, `[BK][W]`.
    s: &'s mut [f32],
    /// Additive mask tile, `[BK][W]`.
    mb: &'s mut [f32],
    /// Weights as bf16 pairs of keys, `[BK/2][W]`.
    pp: &'s mut [u32],
    /// Values as bf16 pairs of rows, `[BK/2][Evp]` (`Evp` = `Ev` rounded up to 16).
    vp: &'s mut [u32],
    /// `Oᵀ`, `[Ev][W]`.
    ot: &'s mut [f32],
    m: &'s mut [f32],
    l: &'s mut [f32],
    alpha: &'s mut [f32],
}

impl<'s> UnitScratch<'s> {
    fn new(buf: &'s mut [f32], e: usize, ev: usize, w: usize) -> Self {
        let rest = &mut &mut buf[..];
        let qp = carve(rest, pairs(e) * w);
        let s = carve(rest, BK * w);
        let mb = carve(rest, BK * w);
        let pp = carve(rest, pairs(BK) * w);
        let vp = carve(rest, pairs(BK) * ev.next_multiple_of(LANES));
        UnitScratch {
            qp: as_words(qp),
            s,
            mb,
            pp: as_words(pp),
            vp: as_words(vp),
            ot: carve(rest, ev * w),
            m: carve(rest, w),
            l: carve(rest, w),
            alpha: carve(rest, w),
        }
    }
}

/// A scratch slice of floats reused as 32-bit words.
fn as_words(f: &mut [f32]) -> &mut [u32] {
    // SAFETY: f32 and u32 have the same size and alignment, and every bit pattern is
    // valid for both; the slice is borrowed mutably for the result's lifetime.
    unsafe { std::slice::from_raw_parts_mut(f.as_mut_ptr() as *mut u32, f.len()) }
}

/// One unit of work, for [`dispatch`].
struct UnitJob<'a, 'p, 'o, 's> {
    p: &'a Problem<'p, bf16>,
    plan: &'a Plan,
    values: &'a ValuePairs,
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
            values,
            unit: u,
            scratch,
        } = self;
        match plan.nq {
            1 => unit::<I, 1>(isa, p, (plan, values), u, scratch),
            2 => unit::<I, 2>(isa, p, (plan, values), u, scratch),
            _ => unit::<I, 4>(isa, p, (plan, values), u, scratch),
        }
    }
}

/// The bits of a bf16 pair `(lo, hi)`, from the numbers' bits.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// One unit: pack `Qᵀ`, sweep the key tiles, normalise and write out.
#[inline(always)]
fn unit<I: Simd, const NQ: usize>(
    isa: I,
    p: &Problem<'_, bf16>,
    (plan, values): (&Plan, &ValuePairs),
    u: Unit<'_>,
    scratch: &mut [f32],
) {
    let d = p.dims();
    let w = NQ * LANES;
    let (e, ev) = (d.head_dim, d.value_dim);
    let evp = ev.next_multiple_of(LANES);
    let scr = UnitScratch::new(scratch, e, ev, w);
    let rows = u.lse.len();
    let (b, h, i0) = (u.b, u.h, u.i0);
    let kvh = h / plan.group;

    // Qᵀ as pairs of adjacent columns; lanes past the last query are zero.
    scr.qp.fill(0);
    let q = p.q.slice(ndarray::s![b, h, i0..i0 + rows, ..]);
    for (ii, row) in q.outer_iter().enumerate() {
        for c in 0..pairs(e) {
            let hi = if 2 * c + 1 < e {
                row[2 * c + 1]
            } else {
                bf16::ZERO
            };
            scr.qp[c * w + ii] = pair(row[2 * c].to_bits(), hi.to_bits());
        }
    }
    scr.ot.fill(0.0);
    scr.m.fill(f32::NEG_INFINITY);
    scr.l.fill(0.0);

    let k = p.k.slice(ndarray::s![b, kvh, .., ..]);
    let v = p.v.slice(ndarray::s![b, kvh, .., ..]);
    let (jlo, jhi) = p.block_key_range(i0, i0 + rows);
    let mr = register_block(I::REGISTERS, NQ);
    let bk = tile_keys::<I>();
    let mut t = jlo / bk;
    while t * bk < jhi {
        let j0 = (t * bk).max(jlo);
        let j1 = ((t + 1) * bk).min(jhi);
        t += 1;
        if j0 >= j1 {
            continue;
        }
        let nk = j1 - j0;
        let (mb, mbs): (*const f32, usize) = if plan.masks.needs_copy(p, b, (i0, rows), (j0, nk)) {
            if !plan.masks.tile(p, (b, h), (i0, rows), (j0, nk), scr.mb, w) {
                continue;
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
            let krows = k.slice(ndarray::s![j0 + r0..j0 + r0 + n, ..]);
            // SAFETY: `krows` holds `n` contiguous rows of `e` bf16 (`reads_in_place`)
            // `krs` apart; `s` holds `BK ≥ nk` rows of `w` floats and the mask rows
            // (a tile copy or `MaskTiles` rows) `nk` rows `mbs` apart.
            unsafe {
                let sp = scr.s.as_mut_ptr().add(r0 * w);
                let mbp = if mb.is_null() { mb } else { mb.add(r0 * mbs) };
                with_block!(
                    n,
                    qk_rows::<I, NQ>(
                        isa,
                        scr.qp.as_ptr(),
                        e,
                        (krows.as_ptr() as *const u16, krows.strides()[0]),
                        plan.scale,
                        sp,
                        (mbp, mbs)
                    )
                );
            }
            r0 += n;
        }

        // SAFETY: `s` holds `nk ≤ BK` rows of `w` floats, `pp` `pairs(BK)` rows of `w`
        // pairs, the statistics `w` each.
        unsafe {
            softmax_pairs::<I, NQ>(
                isa,
                scr.s.as_ptr(),
                nk,
                scr.pp.as_mut_ptr(),
                (scr.m.as_mut_ptr(), scr.l.as_mut_ptr()),
                scr.alpha.as_mut_ptr(),
            )
        };
        // The values as pairs of rows: packed for the whole call where the tile's
        // pairs are the head's, here otherwise.
        let vp: &[u32] = match values.tile((b, kvh), (j0, j1)) {
            Some(pairs) => pairs,
            None => {
                let vrows = v.slice(ndarray::s![j0..j1, ..]);
                // SAFETY: `vrows` holds `nk` rows of `ev` contiguous bf16
                // (`reads_in_place`), `vp` `pairs(BK) ≥ pairs(nk)` rows of `evp ≥ ev`
                // pairs.
                unsafe {
                    pack_value_pairs(
                        isa,
                        (vrows.as_ptr() as *const u16, vrows.strides()[0]),
                        (nk, ev),
                        scr.vp.as_mut_ptr(),
                        evp,
                    )
                };
                &scr.vp[..pairs(nk) * evp]
            }
        };

        // Oᵀ = α Oᵀ + Vᵀ Pᵀ, MR value columns at a time.
        let mut c0 = 0;
        while c0 < ev {
            let n = mr.min(ev - c0);
            // SAFETY: `pp` holds `pairs(nk)` rows of `w` pairs, `vp` as many rows of
            // `evp ≥ c0 + n` pairs (either source); `ot` holds `ev` rows of `w` floats.
            unsafe {
                with_block!(
                    n,
                    pv_cols::<I, NQ>(
                        isa,
                        scr.pp.as_ptr(),
                        pairs(nk),
                        (vp.as_ptr().add(c0), evp),
                        scr.ot.as_mut_ptr().add(c0 * w),
                        scr.alpha.as_ptr()
                    )
                );
            }
            c0 += n;
        }
    }

    super::write_out(isa, scr.ot, scr.m, scr.l, w, u);
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
unsafe fn softmax_pairs<I: Simd, const NQ: usize>(
    isa: I,
    s: *const f32,
    nk: usize,
    pp: *mut u32,
    (m, l): (*mut f32, *mut f32),
    alpha: *mut f32,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        for x in 0..NQ {
            let o = x * LANES;
            let (m_use, a) = running_max::<I, NQ>(isa, s.add(o), nk, m.add(o));
            // (No closure for the weight of key `j`: a closure is a function of its
            // own, compiled without the instruction set's features unless inlined.)
            let mut sum = isa.splat(0.0);
            for t in 0..pairs(nk) {
                let lo = exp_shifted(isa, isa.load(s.add(2 * t * w + o)), m_use);
                sum = isa.add(sum, lo);
                let hi = if 2 * t + 1 < nk {
                    let hi = exp_shifted(isa, isa.load(s.add((2 * t + 1) * w + o)), m_use);
                    sum = isa.add(sum, hi);
                    hi
                } else {
                    isa.splat(0.0)
                };
                isa.store_pairs(pp.add(t * w + o), isa.pack_bf16(lo, hi));
            }
            isa.store(l.add(o), isa.fma(isa.load(l.add(o)), a, sum));
            isa.store(alpha.add(o), a);
        }
    }
}

/// Interleaves `rows` rows of `ev` bf16 values into pairs of adjacent rows,
/// `dst[t][c] = (v[2t][c], v[2t + 1][c])`, `evp` pairs apart; an odd last row is
/// paired with zero. Sixteen columns at a time: widening a bf16 number to f32 and
/// rounding it back is exact.
///
/// # Safety
/// `v.0` must be valid for `rows` rows of `ev` contiguous bf16, `v.1` elements
/// apart, and `dst` for `⌈rows/2⌉` rows of `evp ≥ ev` pairs.
#[inline(always)]
unsafe fn pack_value_pairs<I: Simd>(
    isa: I,
    v: (*const u16, isize),
    (rows, ev): (usize, usize),
    dst: *mut u32,
    evp: usize,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let whole = ev - ev % LANES;
        for t in 0..pairs(rows) {
            let lo = v.0.offset(2 * t as isize * v.1);
            let hi = (2 * t + 1 < rows).then(|| lo.offset(v.1));
            let out = dst.add(t * evp);
            for c in (0..whole).step_by(LANES) {
                let h = hi.map_or(isa.splat(0.0), |h| isa.load_bf16(h.add(c)));
                isa.store_pairs(out.add(c), isa.pack_bf16(isa.load_bf16(lo.add(c)), h));
            }
            for c in whole..ev {
                *out.add(c) = pair(*lo.add(c), hi.map_or(0, |h| *h.add(c)));
            }
        }
    }
}

/// `s[r][·] = scale · Σ_c k[r, c] · q[c][·] (+ mb[r][·])`, base-2 scores for `MR`
/// keys (`mb` holds the mask terms in base 2), over pairs of columns. The bf16
/// queries are not pre-scaled as the f32 kernel's are: that would round them again.
///
/// # Safety
/// `k.0` must be valid for `MR` rows of `e` contiguous bf16, `k.1` elements apart;
/// `qp` for `⌈e/2⌉` rows of `16·NQ` pairs; `s` and (when not null) `mb.0` for `MR`
/// rows of `16·NQ` floats (the mask's `mb.1` apart).
#[inline(always)]
unsafe fn qk_rows<I: Simd, const NQ: usize, const MR: usize>(
    isa: I,
    qp: *const u32,
    e: usize,
    k: (*const u16, isize),
    scale: f32,
    s: *mut f32,
    mb: (*const f32, usize),
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        let (kp, krs) = k;
        let zero = isa.splat(0.0);
        let np = pairs(e);
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
                        if !mb.0.is_null() {
                            let add = isa.load(mb.0.add(r * mb.1 + x * LANES));
                            val = masked_score(isa, val, add);
                        }
                    }
                    isa.store(s.add(off), val);
                }
            }
            c0 = c1.max(c0 + 1);
        }
    }
}

/// `ot[c][·] = alpha · ot[c][·] + Σ_t vp[t][c] · pp[t][·]` over `np` pairs of keys,
/// for `MC` value columns.
///
/// # Safety
/// `pp` valid for `np` rows of `16·NQ` pairs; `v.0` for `np` rows of `MC` pairs,
/// `v.1` apart; `ot` for `MC` rows and `alpha` for one row of `16·NQ` floats.
#[inline(always)]
unsafe fn pv_cols<I: Simd, const NQ: usize, const MC: usize>(
    isa: I,
    pp: *const u32,
    np: usize,
    v: (*const u32, usize),
    ot: *mut f32,
    alpha: *const f32,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        let zero = isa.splat(0.0);
        let mut acc = [[zero; NQ]; MC];
        for t in 0..np {
            let mut pv = [isa.splat_pair(0); NQ];
            for (x, pr) in pv.iter_mut().enumerate() {
                *pr = isa.load_pairs(pp.add(t * w + x * LANES));
            }
            let vrow = v.0.add(t * v.1);
            for (c, row) in acc.iter_mut().enumerate() {
                let vb = isa.splat_pair(*vrow.add(c));
                for x in 0..NQ {
                    row[x] = isa.dot2(row[x], pv[x], vb);
                }
            }
        }
        for (c, row) in acc.iter().enumerate() {
            for (x, &val) in row.iter().enumerate() {
                let o = ot.add(c * w + x * LANES);
                let a = isa.load(alpha.add(x * LANES));
                isa.store(o, isa.fma(isa.load(o), a, val));
            }
        }
    }
}
