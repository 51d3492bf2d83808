//! The fused attention backward, FlashAttention-2 style, for CPUs.
//!
//! Nothing `L × S` is ever held: for each pair of a key block (64 keys) and a query
//! block (64 queries) the kernel recomputes the scores, turns them into
//! probabilities with the saved log-sum-exp in its two f32 parts
//! (`P = exp(scale·qkᵀ + bias − lse − residual)`, `kernels::lse`; where the
//! caller saved no residual, `coarse` gives one), and runs the five small matrix
//! products of the backward pass:
//!
//! ```text
//! S  = Q Kᵀ          dP = dO Vᵀ          dS = P ∘ (dP − D) · scale
//! dV += Pᵀ dO        dK += dSᵀ Q         dQ += dS K
//! ```
//!
//! with `D_i = dO_i · O_i` computed once up front.
//!
//! **Parallelism.** A task owns one key/value head of one batch row and a chunk of
//! its key blocks, and loops over every query head of the group (grouped-query
//! heads sum into the shared `dK`, `dV` there) and every query block. So `dK`, `dV`
//! are written by exactly one task; `dQ` gets one partial sum per key chunk, added
//! up afterwards in chunk order, in parallel over query rows. The number of chunks
//! depends only on the shape (enough tasks for a few cores even at `B·Hkv = 1`), so
//! every sum has the same order whatever the thread count: the result is the same
//! bits on 1 or 2 threads.
//!
//! **Masks.** Blocks that causality and the window leave wholly invisible are
//! skipped; wholly visible blocks take a vector path; the rest (and any boolean,
//! additive or key-padding mask, and dropout) apply [`Problem`]'s per-score rules.
//! Fully masked rows (`lse = −∞`) contribute nothing, so their gradients are zero.

use std::any::{Any, TypeId};
use std::borrow::Cow;

use ndarray::{Array4, ArrayView1, ArrayView2, ArrayView3, ArrayView4};
use rayon::prelude::*;

use super::coarse;
use crate::element::{from_f32_on, to_f32_on, Element};
use crate::isa::{dispatch, IsaToken, Simd, SimdJob, LANES};
use crate::kernels::fused::Widened;
use crate::kernels::scratch::{carve, with_scratch};
use crate::kernels::tile::{Ahead, Init, Tile, DOT_CHUNK, MR, NR, SUM_BLOCK, WIDE};
use crate::problem::{along, Dims, Dropout, Problem, SoftmaxAxis};

/// Queries per block.
const BR: usize = 64;
/// Keys per block.
const BC: usize = 64;
/// Lanes per vector.
const W: usize = LANES;
/// The kernel aims for at least this many tasks (key chunks × batch × kv heads).
const MIN_TASKS: usize = 4;

/// Whether the fused backward handles `p`: softmax over keys and `E > 0` (its
/// partial `dQ`s are summed in rows of `E`; with `E = 0` the reference, which has
/// no rows to sum, gives `dV`).
pub fn supports<T>(p: &Problem<'_, T>) -> bool {
    p.softmax_axis == SoftmaxAxis::Keys && p.dims().head_dim > 0
}

/// A raw pointer that tasks share; every task writes a disjoint region.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: tasks write disjoint regions (see the module docs) and the owner outlives
// the parallel section.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`: no two tasks touch the same element.
unsafe impl Sync for Shared {}

/// Everything the tasks read.
struct Ctx<'a, 'p, T> {
    p: &'a Problem<'p, T>,
    d: Dims,
    group: usize,
    scale: f32,
    /// Widths rounded up to whole vectors.
    ep: usize,
    evp: usize,
    /// `[B, H, L, ep]` and `[B, H, L, evp]`, contiguous.
    q: Cow<'a, [f32]>,
    /// `q · scale`, `[B, H, L, ep]`: the queries as the fused forward scales them
    /// before its scores' products, which the backward's repeat bit for bit.
    qs: Vec<f32>,
    dout: Cow<'a, [f32]>,
    /// `[B, H, L]`: each row's weights are `exp((s − shift) − residual)`, the
    /// shift the forward's log-sum-exp (−∞ for a row that sees no key) and the
    /// residual what its rounding to f32 left out ([`crate::kernels::lse`]).
    shift: Vec<f32>,
    residual: Vec<f32>,
    dsum: Vec<f32>,
    /// Boolean, additive or key-padding masks present: per-score rules needed.
    elementwise: bool,
    /// Where masks or the band hide some pairs: whether each row `[B, H, L]` has a
    /// finite query and `D_i`, and each key `[B, Hkv, S]` a finite key and value
    /// (empty where nothing is hidden). A block that hides pairs and holds a row or
    /// a key that is not finite takes the exact path ([`seen_products`]).
    finite_rows: Vec<bool>,
    finite_keys: Vec<bool>,
    dropout: Option<&'a Dropout>,
    chunks: usize,
    key_blocks: usize,
    /// `[B, H, L, ep]` for chunk 0, then one per further chunk.
    dq: Vec<Shared>,
    /// `[B, Hkv, S, ep]` and `[B, Hkv, S, evp]`.
    dk: Shared,
    dv: Shared,
    /// `[B, H, L, S]`: the scores' gradient `dS` before the scale, where the
    /// caller asked for the additive mask's gradient (else null).
    ds: Shared,
}

fn round_up(x: usize) -> usize {
    x.div_ceil(W) * W
}

/// `a` in f32 as a contiguous `[.., .., .., width]` buffer: borrowed when it
/// already is one (f32), widened in one vectorised pass when it is one in bf16.
fn packed<'a, T: Element>(a: &'a ArrayView4<'_, T>, width: usize, isa: IsaToken) -> Cow<'a, [f32]> {
    if a.dim().3 == width {
        if let Some(s) = a.to_slice() {
            return match as_f32(s) {
                Some(s) => Cow::Borrowed(s),
                None => Cow::Owned(
                    to_f32_on(isa, ArrayView1::from(s))
                        .into_raw_vec_and_offset()
                        .0,
                ),
            };
        }
    }
    let (b, h, t, _) = a.dim();
    let mut out = vec![0.0f32; b * h * t * width];
    for ((bi, hi, ti, ei), &x) in a.indexed_iter() {
        out[((bi * h + hi) * t + ti) * width + ei] = x.to_f32();
    }
    Cow::Owned(out)
}

/// `s` itself where its elements are f32.
fn as_f32<T: Element>(s: &[T]) -> Option<&[f32]> {
    // SAFETY: `T` is `f32`, so the slice is one of f32 numbers.
    (TypeId::of::<T>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
}

/// Runs the fused backward on a validated problem, from the forward's output and
/// log-sum-exp with its residual (recomputed where it matters if the caller has
/// none, [`coarse::residuals`]): `[dq, dk, dv]` in the inputs' element type; with
/// `want_ds`, also returns the scores' gradient
/// `dS` `[B, H, L, S]` (the additive mask's, before its sum over broadcast axes), 0
/// at the pairs that do not see each other.
pub(crate) fn run<T: Element + Widened>(
    p: &Problem<'_, T>,
    out: ArrayView4<'_, T>,
    (lse, residual): (ArrayView3<'_, f32>, Option<ArrayView3<'_, f32>>),
    dout: ArrayView4<'_, T>,
    dropout: Option<&Dropout>,
    want_ds: bool,
    isa: IsaToken,
) -> ([Array4<T>; 3], Option<Array4<f32>>) {
    let d = p.dims();
    let (ep, evp) = (round_up(d.head_dim), round_up(d.value_dim));
    let key_blocks = d.kv_len.div_ceil(BC);
    let units = d.batch * d.kv_heads;
    let chunks = MIN_TASKS.div_ceil(units.max(1)).clamp(1, key_blocks.max(1));
    // D_i = dO_i · O_i, in f32 like the rest.
    let mut dsum = vec![0.0f32; d.batch * d.heads * d.q_len];
    let rows = d.batch * d.heads * d.q_len;
    if rows > 0 {
        dsum.par_chunks_mut(d.q_len.max(1))
            .enumerate()
            .for_each(|(bh, chunk)| {
                let (b, h) = (bh / d.heads, bh % d.heads);
                let rows = dout.slice(ndarray::s![b, h, .., ..]);
                let outs = out.slice(ndarray::s![b, h, .., ..]);
                row_dots(rows, outs, chunk);
            });
    }
    let shift: Vec<f32> = lse.iter().copied().collect();
    let residual = match residual {
        Some(r) => r.iter().copied().collect(),
        None => coarse::residuals(p, &shift),
    };
    // A NaN in `D_i` covers one in `dO_i` (or a NaN output); `q`, `k` and `v` are
    // checked row by row, once per call and only where pairs can be hidden.
    let hides = p.has_elementwise_masks() || p.is_banded();
    let (finite_rows, finite_keys) = if hides {
        let q = rows_finite(&p.q).into_iter().zip(&dsum);
        let kv = rows_finite(&p.k).into_iter().zip(rows_finite(&p.v));
        (
            q.map(|(q, dsum)| q && dsum.is_finite()).collect(),
            kv.map(|(k, v)| k && v).collect(),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let q_len_total = d.batch * d.heads * d.q_len;
    let q = packed(&p.q, ep, isa);
    let mut dq_bufs: Vec<Vec<f32>> = (0..chunks)
        .map(|_| vec![0.0f32; q_len_total * ep])
        .collect();
    let mut dk = vec![0.0f32; d.batch * d.kv_heads * d.kv_len * ep];
    let mut dv = vec![0.0f32; d.batch * d.kv_heads * d.kv_len * evp];
    let mut ds = want_ds.then(|| Array4::<f32>::zeros((d.batch, d.heads, d.q_len, d.kv_len)));
    let ctx = Ctx {
        p,
        d,
        group: d.heads / d.kv_heads,
        scale: p.scale,
        ep,
        evp,
        qs: scaled(&q, p.scale),
        q,
        dout: packed(&dout, evp, isa),
        shift,
        residual,
        dsum,
        elementwise: p.mask.is_some() || p.bias.is_some() || p.key_padding.is_some(),
        finite_rows,
        finite_keys,
        dropout: dropout.filter(|dr| dr.p() > 0.0),
        chunks,
        key_blocks,
        dq: dq_bufs.iter_mut().map(|b| Shared(b.as_mut_ptr())).collect(),
        dk: Shared(dk.as_mut_ptr()),
        dv: Shared(dv.as_mut_ptr()),
        ds: Shared(ds.as_mut().map_or(std::ptr::null_mut(), |a| a.as_mut_ptr())),
    };
    let tasks: Vec<(usize, usize, usize)> = (0..d.batch)
        .flat_map(|b| (0..d.kv_heads).flat_map(move |h| (0..chunks).map(move |c| (b, h, c))))
        .collect();
    let len = scratch_len(&d);
    tasks.into_par_iter().for_each(|(b, kvh, c)| {
        with_scratch(len, |scratch| {
            dispatch(
                isa,
                TaskJob {
                    ctx: &ctx,
                    task: (b, kvh, c),
                    scratch,
                },
            )
        })
    });
    drop(ctx);
    // dQ = Σ_chunks partials, in chunk order.
    let (first, rest) = dq_bufs.split_first_mut().expect("at least one chunk");
    if !rest.is_empty() {
        first
            .par_chunks_mut(ep * 256)
            .enumerate()
            .for_each(|(n, dst)| {
                let (off, len) = (n * ep * 256, dst.len());
                for part in rest.iter() {
                    for (x, y) in dst.iter_mut().zip(&part[off..off + len]) {
                        *x += *y;
                    }
                }
            });
    }
    let dq = dq_bufs.swap_remove(0);
    let grads = [
        unpad([d.batch, d.heads, d.q_len, d.head_dim], ep, dq, isa),
        unpad([d.batch, d.kv_heads, d.kv_len, d.head_dim], ep, dk, isa),
        unpad([d.batch, d.kv_heads, d.kv_len, d.value_dim], evp, dv, isa),
    ];
    (grads, ds)
}

/// Rows of `D_i` at once: the sums of as many rows, each over its own
/// columns in order, run side by side instead of one after another (each is a
/// chain of dependent additions).
const DOT_ROWS: usize = 8;

/// `dots[i] = Σ_e a[i, e] · b[i, e]` in f32, each row's terms added in column
/// order, [`DOT_ROWS`] rows side by side where the rows are contiguous.
fn row_dots<T: Widened>(a: ArrayView2<'_, T>, b: ArrayView2<'_, T>, dots: &mut [f32]) {
    let row = |m: &ArrayView2<'_, T>, i: usize| m.row(i).to_slice().map(<[T]>::as_ptr);
    let width = a.ncols();
    for (n, group) in dots.chunks_mut(DOT_ROWS).enumerate() {
        let i0 = n * DOT_ROWS;
        let rows: Option<Vec<_>> = (i0..i0 + group.len())
            .map(|i| row(&a, i).zip(row(&b, i)))
            .collect();
        match rows {
            Some(rows) if group.len() == DOT_ROWS => {
                let mut s = [0.0f32; DOT_ROWS];
                for e in 0..width {
                    for (s, &(x, y)) in s.iter_mut().zip(&rows) {
                        // SAFETY: each row holds `width` elements.
                        unsafe { *s += (*x.add(e)).widen() * (*y.add(e)).widen() };
                    }
                }
                group.copy_from_slice(&s);
            }
            _ => {
                for (r, x) in group.iter_mut().enumerate() {
                    let (ar, br) = (a.row(i0 + r), b.row(i0 + r));
                    *x = ar
                        .iter()
                        .zip(&br)
                        .fold(0.0, |s, (&g, &o)| s + g.widen() * o.widen());
                }
            }
        }
    }
}

/// `q · scale`, element by element, as the fused forward's vectors multiply it.
fn scaled(q: &[f32], scale: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; q.len()];
    out.par_chunks_mut(1 << 14)
        .zip(q.par_chunks(1 << 14))
        .for_each(|(out, q)| out.iter_mut().zip(q).for_each(|(y, &x)| *y = x * scale));
    out
}

/// Whether each row `a[b, h, t, ..]` is finite, in `[B, H, T]` order.
fn rows_finite<T: Widened>(a: &ArrayView4<'_, T>) -> Vec<bool> {
    let (b, h, t, _) = a.dim();
    let mut out = Vec::with_capacity(b * h * t);
    for b in a.outer_iter() {
        for h in b.outer_iter() {
            out.extend(
                h.outer_iter()
                    .map(|row| row.iter().all(|x| x.widen().is_finite())),
            );
        }
    }
    out
}

/// A `[.., width]` buffer of f32 gradients as an array of `shape` in `T`, dropping
/// the padding columns: the buffer itself for f32 without padding, else rounded
/// (or copied) in one vectorised pass.
fn unpad<T: Element>(shape: [usize; 4], width: usize, buf: Vec<f32>, isa: IsaToken) -> Array4<T> {
    let [b, h, t, e] = shape;
    let full = Array4::from_shape_vec((b, h, t, width), buf).expect("sizes agree");
    if width == e {
        let full: Box<dyn Any> = Box::new(full);
        return match full.downcast::<Array4<T>>() {
            Ok(same) => *same,
            Err(full) => {
                let full = full.downcast::<Array4<f32>>().expect("the f32 buffer");
                from_f32_on(isa, full.view())
            }
        };
    }
    from_f32_on(isa, full.slice(ndarray::s![.., .., .., ..e]))
}

/// Floats of scratch one task needs: the packed key block (`Kᵀ`, `K`), `Vᵀ`, the
/// block's scores and their gradients, and the `dK`, `dV` accumulators.
pub fn scratch_len(d: &Dims) -> usize {
    let (ep, evp) = (round_up(d.head_dim), round_up(d.value_dim));
    BC * (3 * ep + 2 * evp) + 2 * BR * BC
}

/// One task (a key/value head of a batch row and a chunk of its key blocks), for
/// [`dispatch`].
struct TaskJob<'a, 'c, 'p, 's, T> {
    ctx: &'a Ctx<'c, 'p, T>,
    task: (usize, usize, usize),
    scratch: &'s mut [f32],
}

impl<T: Element + Widened> SimdJob for TaskJob<'_, '_, '_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn run<I: Simd>(self, isa: I) {
        let (b, kvh, c) = self.task;
        // SAFETY: `run` makes one job per `(b, kvh, c)`, so no other task writes the
        // same rows of `dK`, `dV` or the same chunk's `dQ` partial; `ctx` outlives
        // the parallel section.
        unsafe { task(isa, self.ctx, b, kvh, c, self.scratch) }
    }
}

/// One task: key/value head `kvh` of batch row `b`, key chunk `c`.
///
/// # Safety
/// No other call with the same `(b, kvh, c)` may run at the same time (it would
/// write the same gradient rows), and `ctx`'s gradient buffers must be alive;
/// `scratch` must hold [`scratch_len`] floats.
#[inline(always)]
unsafe fn task<I: Simd, T: Widened>(
    isa: I,
    ctx: &Ctx<'_, '_, T>,
    b: usize,
    kvh: usize,
    c: usize,
    scratch: &mut [f32],
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let d = ctx.d;
        let (ep, evp) = (ctx.ep, ctx.evp);
        let p = ctx.p;
        let kb_lo = c * ctx.key_blocks / ctx.chunks;
        let kb_hi = (c + 1) * ctx.key_blocks / ctx.chunks;
        let rest = &mut &mut scratch[..];
        let kt = carve(rest, ep * BC);
        let krow = carve(rest, BC * ep);
        let vt = carve(rest, evp * BC);
        let s = carve(rest, BR * BC);
        let dp = carve(rest, BR * BC);
        let dk_acc = carve(rest, BC * ep);
        let dv_acc = carve(rest, BC * evp);
        let q_blocks = d.q_len.div_ceil(BR);
        let fast = !ctx.elementwise && ctx.dropout.is_none();
        let dq = ctx.dq[c];
        for kb in kb_lo..kb_hi {
            let k0 = kb * BC;
            let nk = BC.min(d.kv_len - k0);
            let kvrow = (b * d.kv_heads + kvh) * d.kv_len + k0;
            let keys_finite = ctx
                .finite_keys
                .get(kvrow..kvrow + nk)
                .is_none_or(|f| f.iter().all(|&x| x));
            // Pack Kᵀ [ep, BC], K [BC, ep] and Vᵀ [evp, BC], zero-padded.
            kt.fill(0.0);
            krow.fill(0.0);
            vt.fill(0.0);
            // Row views, not a 4-D index per element (which took about 4 % of the
            // backward's samples).
            let keys = p.k.slice(ndarray::s![b, kvh, k0..k0 + nk, ..]);
            let values = p.v.slice(ndarray::s![b, kvh, k0..k0 + nk, ..]);
            for (j, (kj, vj)) in keys.outer_iter().zip(values.outer_iter()).enumerate() {
                along(&mut krow[j * ep..j * ep + d.head_dim], kj, |t, x| {
                    *t = x.widen()
                });
                for (e, &x) in kj.iter().enumerate() {
                    kt[e * BC + j] = x.widen();
                }
                for (e, &x) in vj.iter().enumerate() {
                    vt[e * BC + j] = x.widen();
                }
            }
            dk_acc.fill(0.0);
            dv_acc.fill(0.0);
            for h in kvh * ctx.group..(kvh + 1) * ctx.group {
                let bh = b * d.heads + h;
                for qb in 0..q_blocks {
                    let i0 = qb * BR;
                    let nr = BR.min(d.q_len - i0);
                    // Which rows see this key block, and whether all see all of it.
                    let mut any = false;
                    let mut full = fast && nk == BC;
                    for i in i0..i0 + nr {
                        let (lo, hi) = p.key_range(i);
                        let live = ctx.shift[bh * d.q_len + i] != f32::NEG_INFINITY;
                        any |= live && lo < k0 + nk && hi > k0;
                        full &= live && lo <= k0 && hi >= k0 + nk;
                    }
                    if !any {
                        continue;
                    }
                    // A block that hides some pairs multiplies their zeros by the rows
                    // and keys in its products: where one is not finite, the exact path.
                    let rows_finite = ctx
                        .finite_rows
                        .get(bh * d.q_len + i0..bh * d.q_len + i0 + nr);
                    let rows_finite = rows_finite.is_none_or(|f| f.iter().all(|&x| x));
                    let exact = !full && (!keys_finite || !rows_finite);
                    let qblk = ctx.q.as_ptr().add((bh * d.q_len + i0) * ep);
                    let qsblk = ctx.qs.as_ptr().add((bh * d.q_len + i0) * ep);
                    let doblk = ctx.dout.as_ptr().add((bh * d.q_len + i0) * evp);
                    // S = (Q · scale) Kᵀ, the fused forward's scores to the bit (its
                    // products, in its order and partial sums; zero padding adds
                    // zeros), so that `exp(s − lse)` gives back its weights, and
                    // dP = dO Vᵀ, through one copy of the product's code.
                    let scores = Product {
                        dims: [nr, BC, ep],
                        a: (qsblk, ep, 1),
                        b: (kt.as_ptr(), BC),
                        c: (s.as_mut_ptr(), BC),
                        init: Init::Zero,
                        partial: DOT_CHUNK,
                    };
                    let grads = Product {
                        dims: [nr, BC, evp],
                        a: (doblk, evp, 1),
                        b: (vt.as_ptr(), BC),
                        c: (dp.as_mut_ptr(), BC),
                        init: Init::Zero,
                        partial: SUM_BLOCK,
                    };
                    for product in [scores, grads] {
                        product.run(isa);
                    }
                    let masks = p.mask_rows((b, h), i0..i0 + nr, k0..k0 + nk);
                    let mut terms = [0.0f32; BC];
                    for r in 0..nr {
                        let i = i0 + r;
                        let l = ctx.shift[bh * d.q_len + i];
                        let rest = ctx.residual[bh * d.q_len + i];
                        let dsum = ctx.dsum[bh * d.q_len + i];
                        let srow = s.as_mut_ptr().add(r * BC);
                        let dprow = dp.as_mut_ptr().add(r * BC);
                        if l == f32::NEG_INFINITY {
                            std::ptr::write_bytes(srow, 0, BC);
                            std::ptr::write_bytes(dprow, 0, BC);
                            continue;
                        }
                        if full {
                            exp_row(isa, srow, (l, rest));
                        } else {
                            // Per-score rules: logits, −∞ where masked, then exp.
                            let (lo, hi) = p.key_range(i);
                            let (lo, hi) = (lo.clamp(k0, k0 + nk) - k0, hi.clamp(k0, k0 + nk) - k0);
                            let term = &mut terms[..nk];
                            masks.write_terms(r, term);
                            let srow_n = std::slice::from_raw_parts_mut(srow, nk);
                            for (jj, (x, &t)) in srow_n.iter_mut().zip(term.iter()).enumerate() {
                                let logit = (*x + t - l) - rest;
                                // −∞ where hidden, even for a NaN score (NaN + −∞ is NaN).
                                let visible = (lo <= jj) & (jj < hi) & (t != f32::NEG_INFINITY);
                                *x = if visible { logit } else { f32::NEG_INFINITY };
                            }
                            for jj in nk..BC {
                                *srow.add(jj) = f32::NEG_INFINITY;
                            }
                            exp_row(isa, srow, (0.0, 0.0));
                        }
                        if !ctx.ds.0.is_null() {
                            // dS = P ∘ (dP − D) before the scale, as below, for the
                            // additive mask's gradient; 0 where the pair is hidden.
                            // This task alone writes these keys of the row.
                            let row = ctx.ds.0.add((bh * d.q_len + i) * d.kv_len + k0);
                            let (lo, hi) = p.key_range(i);
                            let drow = ctx.dropout.map(|dr| (dr, dr.row(b, h, i)));
                            for (jj, &t) in terms.iter().enumerate().take(nk) {
                                let j = k0 + jj;
                                let seen =
                                    full || ((lo..hi).contains(&j) && t != f32::NEG_INFINITY);
                                let z = drow.map_or(1.0, |(dr, row)| dr.factor_in_row(row, j));
                                let g = *srow.add(jj) * (*dprow.add(jj) * z - dsum);
                                *row.add(jj) = if seen { g } else { 0.0 };
                            }
                        }
                        match ctx.dropout {
                            None => ds_row(isa, srow, dprow, dsum, ctx.scale),
                            Some(dr) => {
                                let row = dr.row(b, h, i);
                                for jj in 0..nk {
                                    let z = dr.factor_in_row(row, k0 + jj);
                                    let pr = *srow.add(jj);
                                    *dprow.add(jj) = pr * (*dprow.add(jj) * z - dsum) * ctx.scale;
                                    *srow.add(jj) = pr * z;
                                }
                            }
                        }
                    }
                    // dV += P̃ᵀ dO, dK += dSᵀ Q, dQ += dS K.
                    let dq_blk = dq.0.add((bh * d.q_len + i0) * ep);
                    let into_dv = Product {
                        dims: [nk, evp, nr],
                        a: (s.as_ptr(), 1, BC),
                        b: (doblk, evp),
                        c: (dv_acc.as_mut_ptr(), evp),
                        init: Init::Add,
                        partial: SUM_BLOCK,
                    };
                    let into_dk = Product {
                        dims: [nk, ep, nr],
                        a: (dp.as_ptr(), 1, BC),
                        b: (qblk, ep),
                        c: (dk_acc.as_mut_ptr(), ep),
                        init: Init::Add,
                        partial: SUM_BLOCK,
                    };
                    let into_dq = Product {
                        dims: [nr, ep, nk],
                        a: (dp.as_ptr(), BC, 1),
                        b: (krow.as_ptr(), ep),
                        c: (dq_blk, ep),
                        init: Init::Add,
                        partial: SUM_BLOCK,
                    };
                    if exact {
                        let block = SeenBlock {
                            p,
                            at: (b, h),
                            rows: (i0, nr),
                            keys: (k0, nk),
                            shift: &ctx.shift[bh * d.q_len + i0..][..nr],
                        };
                        block.products(into_dv, into_dk, into_dq);
                    } else {
                        for product in [into_dv, into_dk, into_dq] {
                            product.run(isa);
                        }
                    }
                }
            }
            std::ptr::copy_nonoverlapping(dk_acc.as_ptr(), ctx.dk.0.add(kvrow * ep), nk * ep);
            std::ptr::copy_nonoverlapping(dv_acc.as_ptr(), ctx.dv.0.add(kvrow * evp), nk * evp);
        }
    }
}

/// A block of `rows.1` queries from `rows.0` and `nk` keys from `keys.0` of head
/// `at`, for the backward's exact path.
struct SeenBlock<'a, 'p, T> {
    p: &'a Problem<'p, T>,
    at: (usize, usize),
    rows: (usize, usize),
    keys: (usize, usize),
    /// The rows' shifts (−∞: a row that sees no key).
    shift: &'a [f32],
}

impl<T> SeenBlock<'_, '_, T> {
    /// The three products `dV += P̃ᵀ dO`, `dK += dSᵀ Q`, `dQ += dS K` of a block
    /// (as the [`Product`]s given describe them), one term at a time over the pairs
    /// that see each other only: a hidden pair adds nothing, not even its zero
    /// weight times a NaN in its row or key (docs/design.md, "NaN").
    ///
    /// # Safety
    /// As [`Product::run`]'s for each of the three.
    unsafe fn products(&self, into_dv: Product, into_dk: Product, into_dq: Product) {
        let (i0, nr) = self.rows;
        let (k0, nk) = self.keys;
        let masks = self.p.mask_rows(self.at, i0..i0 + nr, k0..k0 + nk);
        let mut term = vec![0.0f32; nk];
        for r in 0..nr {
            if self.shift[r] == f32::NEG_INFINITY {
                continue;
            }
            let (lo, hi) = self.p.key_range(i0 + r);
            masks.write_terms(r, &mut term);
            for (jj, &t) in term.iter().enumerate() {
                if !(lo..hi).contains(&(k0 + jj)) || t == f32::NEG_INFINITY {
                    continue;
                }
                // SAFETY: `r < nr` and `jj < nk` index the products' operands as
                // their dimensions say (the caller's contract).
                unsafe {
                    for (prod, m, n) in [(into_dv, jj, r), (into_dk, jj, r), (into_dq, r, jj)] {
                        let (a, lda, sa) = prod.a;
                        let (b, ldb) = prod.b;
                        let (c, ldc) = prod.c;
                        let x = *a.add(m * lda + n * sa);
                        for col in 0..prod.dims[1] {
                            *c.add(m * ldc + col) += x * *b.add(n * ldb + col);
                        }
                    }
                }
            }
        }
    }
}

/// `row[j] = exp((row[j] − shift) − residual)` over one block row: the score and
/// the shift meet in their own units, however large, and what is left is small
/// enough to take the residual.
///
/// # Safety
/// `row` must be valid for reading and writing `BC` floats.
#[inline(always)]
unsafe fn exp_row<I: Simd>(isa: I, row: *mut f32, (shift, residual): (f32, f32)) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let (sh, rest) = (isa.splat(shift), isa.splat(residual));
        for v in 0..BC / W {
            let x = isa.load(row.add(v * W));
            isa.store(row.add(v * W), isa.exp(isa.sub(isa.sub(x, sh), rest)));
        }
    }
}

/// `dp[j] = p[j] · (dp[j] − dsum) · scale` over one block row.
///
/// # Safety
/// `p` must be valid for reading and `dp` for reading and writing `BC` floats.
#[inline(always)]
unsafe fn ds_row<I: Simd>(isa: I, p: *const f32, dp: *mut f32, dsum: f32, scale: f32) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let (ds, sc) = (isa.splat(dsum), isa.splat(scale));
        for v in 0..BC / W {
            let x = isa.load(dp.add(v * W));
            let pr = isa.load(p.add(v * W));
            isa.store(dp.add(v * W), isa.mul(isa.mul(pr, isa.sub(x, ds)), sc));
        }
    }
}

/// One of the backward's matrix products, `C[m × n] = init + A[m × k] · B[k × n]`
/// for `[m, n, k]`, `n` a multiple of 16, through the library's register tile
/// ([`Tile`]): `A` is `(ptr, lda, sa)`, its rows `lda` apart and each row's steps
/// `sa` apart (so `Aᵀ` costs nothing); `B` and `C` are `(ptr, ld)`, row-major.
#[derive(Clone, Copy)]
struct Product {
    dims: [usize; 3],
    a: (*const f32, usize, usize),
    b: (*const f32, usize),
    c: (*mut f32, usize),
    /// [`Init::Zero`] to write `C`, [`Init::Add`] to add to it.
    init: Init<'static>,
    /// Steps in each partial sum ([`Tile::partial`]).
    partial: usize,
}

impl Product {
    /// Computes the product: as many panels of 16 columns at a time as the
    /// registers hold (the tile splits four on 16-register instruction sets), up
    /// to [`MR`] rows each.
    ///
    /// # Safety
    /// `A` must be readable at every `(i, kk)`, `i < m`, `kk < k`; `B` at every
    /// `(kk, j)`, `j < n`; `C` readable and writable at every `(i, j)`.
    #[inline(always)]
    unsafe fn run<I: Simd>(self, isa: I) {
        let n = self.dims[1];
        debug_assert!(n.is_multiple_of(NR));
        // SAFETY: every group of panels below lies inside the caller's `n` columns.
        unsafe {
            let mut j = 0;
            while j < n {
                if n - j >= WIDE * NR {
                    self.panels::<I, WIDE>(isa, j);
                    j += WIDE * NR;
                } else if n - j >= 2 * NR {
                    self.panels::<I, 2>(isa, j);
                    j += 2 * NR;
                } else {
                    self.panels::<I, 1>(isa, j);
                    j += NR;
                }
            }
        }
    }

    /// Columns `j .. j + 16·P` of the product, every row.
    ///
    /// # Safety
    /// As [`run`](Self::run)'s, with `j + 16·P ≤ n`.
    #[inline(always)]
    unsafe fn panels<I: Simd, const P: usize>(self, isa: I, j: usize) {
        let [m, _, k] = self.dims;
        let ((a, lda, sa), (b, ldb), (c, ldc)) = (self.a, self.b, self.c);
        // SAFETY: each tile's rows, steps and panels are inside the caller's `A`,
        // `B` and `C` (`rows ≤ MR`, as the tile asks).
        unsafe {
            let mut i = 0;
            while i < m {
                let rows = MR.min(m - i);
                let tile = Tile {
                    a: a.add(i * lda),
                    lda: lda as isize,
                    sa: sa as isize,
                    b: b.add(j),
                    ldb,
                    next: NR,
                    kc: k,
                    partial: self.partial,
                    ahead: Ahead::NONE,
                };
                tile.run::<I, P>(isa, rows, c.add(i * ldc + j), ldc, [self.init; P]);
                i += rows;
            }
        }
    }
}
