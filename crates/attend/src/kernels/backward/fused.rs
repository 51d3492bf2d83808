//! The fused attention backward, FlashAttention-2 style, for CPUs.
//!
//! Nothing `L × S` is ever held: for each pair of a key block (64 keys) and a query
//! block (64 queries) the kernel recomputes the scores, turns them into
//! probabilities with the saved log-sum-exp (`P = exp(scale·qkᵀ + bias − lse)`), and
//! runs the five small matrix products of the backward pass:
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

use std::borrow::Cow;

use ndarray::{Array4, ArrayView1, ArrayView3, ArrayView4, Axis, Zip};
use rayon::prelude::*;

use super::{AttentionGrads, Dropout};
use crate::attention::{along, Problem, SoftmaxAxis};
use crate::kernels::simd::{portable::Portable, Isa, Simd, LANES};

/// Queries per block.
const BR: usize = 64;
/// Keys per block.
const BC: usize = 64;
/// Lanes per vector.
const W: usize = LANES;
/// The kernel aims for at least this many tasks (key chunks × batch × kv heads).
const MIN_TASKS: usize = 4;

/// Whether the fused backward handles `p` (softmax over keys).
pub fn supports(p: &Problem<'_>) -> bool {
    p.softmax_axis == SoftmaxAxis::Keys
}

/// A raw pointer that tasks share; every task writes a disjoint region.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: tasks write disjoint regions (see the module docs) and the owner outlives
// the parallel section.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// The problem's dimensions.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    head_dim: usize,
    value_dim: usize,
}

/// Everything the tasks read.
struct Ctx<'a, 'p> {
    p: &'a Problem<'p>,
    d: Dims,
    group: usize,
    scale: f32,
    /// Widths rounded up to whole vectors.
    ep: usize,
    evp: usize,
    /// `[B, H, L, ep]` and `[B, H, L, evp]`, contiguous.
    q: Cow<'a, [f32]>,
    dout: Cow<'a, [f32]>,
    /// `[B, H, L]`.
    lse: Vec<f32>,
    dsum: Vec<f32>,
    /// Boolean, additive or key-padding masks present: per-score rules needed.
    elementwise: bool,
    dropout: Option<&'a Dropout>,
    chunks: usize,
    key_blocks: usize,
    /// `[B, H, L, ep]` for chunk 0, then one per further chunk.
    dq: Vec<Shared>,
    /// `[B, Hkv, S, ep]` and `[B, Hkv, S, evp]`.
    dk: Shared,
    dv: Shared,
}

fn round_up(x: usize) -> usize {
    x.div_ceil(W) * W
}

/// `a` as a contiguous `[.., .., .., width]` buffer, borrowed when it already is one.
fn packed<'a>(a: &'a ArrayView4<'_, f32>, width: usize) -> Cow<'a, [f32]> {
    if a.dim().3 == width {
        if let Some(s) = a.to_slice() {
            return Cow::Borrowed(s);
        }
    }
    let (b, h, t, e) = a.dim();
    let mut out = vec![0.0f32; b * h * t * width];
    for ((bi, hi, ti, ei), &x) in a.indexed_iter() {
        out[((bi * h + hi) * t + ti) * width + ei] = x;
    }
    let _ = e;
    Cow::Owned(out)
}

/// Runs the fused backward on a validated problem.
pub(crate) fn run(
    p: &Problem<'_>,
    out: ArrayView4<'_, f32>,
    lse: ArrayView3<'_, f32>,
    dout: ArrayView4<'_, f32>,
    dropout: Option<&Dropout>,
    isa: Isa,
) -> AttentionGrads {
    let pd = p.dims();
    let d = Dims {
        batch: pd.batch,
        heads: pd.heads,
        kv_heads: pd.kv_heads,
        q_len: pd.q_len,
        kv_len: pd.kv_len,
        head_dim: pd.head_dim,
        value_dim: pd.value_dim,
    };
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
                for (i, x) in chunk.iter_mut().enumerate() {
                    let mut s = 0.0f32;
                    for c in 0..d.value_dim {
                        s += dout[[b, h, i, c]] * out[[b, h, i, c]];
                    }
                    *x = s;
                }
            });
    }
    let lse: Vec<f32> = lse.iter().copied().collect();
    let q_len_total = d.batch * d.heads * d.q_len;
    let mut dq_bufs: Vec<Vec<f32>> = (0..chunks)
        .map(|_| vec![0.0f32; q_len_total * ep])
        .collect();
    let mut dk = vec![0.0f32; d.batch * d.kv_heads * d.kv_len * ep];
    let mut dv = vec![0.0f32; d.batch * d.kv_heads * d.kv_len * evp];
    let ctx = Ctx {
        p,
        d,
        group: d.heads / d.kv_heads,
        scale: p.scale,
        ep,
        evp,
        q: packed(&p.q, ep),
        dout: packed(&dout, evp),
        lse,
        dsum,
        elementwise: p.mask.is_some() || p.bias.is_some() || p.key_padding.is_some(),
        dropout: dropout.filter(|dr| dr.p() > 0.0),
        chunks,
        key_blocks,
        dq: dq_bufs.iter_mut().map(|b| Shared(b.as_mut_ptr())).collect(),
        dk: Shared(dk.as_mut_ptr()),
        dv: Shared(dv.as_mut_ptr()),
    };
    let tasks: Vec<(usize, usize, usize)> = (0..d.batch)
        .flat_map(|b| (0..d.kv_heads).flat_map(move |h| (0..chunks).map(move |c| (b, h, c))))
        .collect();
    tasks.into_par_iter().for_each(|(b, kvh, c)| {
        // SAFETY: the caller checked that the CPU has `isa`; task regions are disjoint.
        unsafe {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => task_avx512(&ctx, b, kvh, c),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => task_avx2(&ctx, b, kvh, c),
                _ => task::<Portable>(&ctx, b, kvh, c),
            }
        }
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
    AttentionGrads {
        dq: unpad([d.batch, d.heads, d.q_len, d.head_dim], ep, dq),
        dk: unpad([d.batch, d.kv_heads, d.kv_len, d.head_dim], ep, dk),
        dv: unpad([d.batch, d.kv_heads, d.kv_len, d.value_dim], evp, dv),
    }
}

/// A `[.., width]` buffer as an array of `shape`, dropping the padding columns.
fn unpad(shape: [usize; 4], width: usize, buf: Vec<f32>) -> Array4<f32> {
    let [b, h, t, e] = shape;
    if width == e {
        return Array4::from_shape_vec((b, h, t, e), buf).expect("sizes agree");
    }
    let full = Array4::from_shape_vec((b, h, t, width), buf).expect("sizes agree");
    let mut out = Array4::zeros((b, h, t, e));
    Zip::from(&mut out)
        .and(&full.slice(ndarray::s![.., .., .., ..e]))
        .for_each(|o, &x| *o = x);
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn task_avx512(ctx: &Ctx<'_, '_>, b: usize, kvh: usize, c: usize) {
    task::<crate::kernels::simd::avx512::Avx512>(ctx, b, kvh, c)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn task_avx2(ctx: &Ctx<'_, '_>, b: usize, kvh: usize, c: usize) {
    task::<crate::kernels::simd::avx2::Avx2>(ctx, b, kvh, c)
}

/// One task: key/value head `kvh` of batch row `b`, key chunk `c`.
#[inline(always)]
unsafe fn task<L: Simd>(ctx: &Ctx<'_, '_>, b: usize, kvh: usize, c: usize) {
    let d = ctx.d;
    let (ep, evp) = (ctx.ep, ctx.evp);
    let p = ctx.p;
    let kb_lo = c * ctx.key_blocks / ctx.chunks;
    let kb_hi = (c + 1) * ctx.key_blocks / ctx.chunks;
    let mut kt = vec![0.0f32; ep * BC];
    let mut krow = vec![0.0f32; BC * ep];
    let mut vt = vec![0.0f32; evp * BC];
    let mut s = vec![0.0f32; BR * BC];
    let mut dp = vec![0.0f32; BR * BC];
    let mut dk_acc = vec![0.0f32; BC * ep];
    let mut dv_acc = vec![0.0f32; BC * evp];
    let q_blocks = d.q_len.div_ceil(BR);
    let fast = !ctx.elementwise && ctx.dropout.is_none();
    let dq = ctx.dq[c];
    for kb in kb_lo..kb_hi {
        let k0 = kb * BC;
        let nk = BC.min(d.kv_len - k0);
        // Pack Kᵀ [ep, BC], K [BC, ep] and Vᵀ [evp, BC], zero-padded.
        kt.fill(0.0);
        krow.fill(0.0);
        vt.fill(0.0);
        for j in 0..nk {
            for e in 0..d.head_dim {
                let x = p.k[[b, kvh, k0 + j, e]];
                kt[e * BC + j] = x;
                krow[j * ep + e] = x;
            }
            for e in 0..d.value_dim {
                vt[e * BC + j] = p.v[[b, kvh, k0 + j, e]];
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
                    let live = ctx.lse[bh * d.q_len + i] != f32::NEG_INFINITY;
                    any |= live && lo < k0 + nk && hi > k0;
                    full &= live && lo <= k0 && hi >= k0 + nk;
                }
                if !any {
                    continue;
                }
                let qblk = ctx.q.as_ptr().add((bh * d.q_len + i0) * ep);
                let doblk = ctx.dout.as_ptr().add((bh * d.q_len + i0) * evp);
                gemm::<L>(
                    nr,
                    BC,
                    ep,
                    qblk,
                    ep,
                    1,
                    kt.as_ptr(),
                    BC,
                    s.as_mut_ptr(),
                    BC,
                    false,
                );
                gemm::<L>(
                    nr,
                    BC,
                    evp,
                    doblk,
                    evp,
                    1,
                    vt.as_ptr(),
                    BC,
                    dp.as_mut_ptr(),
                    BC,
                    false,
                );
                // The tile's per-score masks as 2-D views, sliced once: a 4-D
                // index per score would cost more than the score.
                let tile = ndarray::s![b, h, i0..i0 + nr, k0..k0 + nk];
                let mask = p.mask.filter(|_| !full).map(|m| m.slice_move(tile));
                let bias = p.bias.filter(|_| !full).map(|m| m.slice_move(tile));
                let pad = p
                    .key_padding
                    .map(|m| m.slice_move(ndarray::s![b, k0..k0 + nk]));
                let mut terms = [0.0f32; BC];
                for r in 0..nr {
                    let i = i0 + r;
                    let l = ctx.lse[bh * d.q_len + i];
                    let dsum = ctx.dsum[bh * d.q_len + i];
                    let srow = s.as_mut_ptr().add(r * BC);
                    let dprow = dp.as_mut_ptr().add(r * BC);
                    if l == f32::NEG_INFINITY {
                        std::ptr::write_bytes(srow, 0, BC);
                        std::ptr::write_bytes(dprow, 0, BC);
                        continue;
                    }
                    if full {
                        exp_row::<L>(srow, ctx.scale, l);
                    } else {
                        // Per-score rules: logits, −∞ where masked, then exp.
                        let (lo, hi) = p.key_range(i);
                        let (lo, hi) = (lo.clamp(k0, k0 + nk) - k0, hi.clamp(k0, k0 + nk) - k0);
                        let term = &mut terms[..nk];
                        mask_terms(
                            mask.map(|m| m.index_axis_move(Axis(0), r)),
                            bias.map(|m| m.index_axis_move(Axis(0), r)),
                            pad,
                            term,
                        );
                        let srow_n = std::slice::from_raw_parts_mut(srow, nk);
                        for (jj, (x, &t)) in srow_n.iter_mut().zip(term.iter()).enumerate() {
                            let logit = *x * ctx.scale + t - l;
                            let visible = (lo <= jj) & (jj < hi);
                            *x = if visible { logit } else { f32::NEG_INFINITY };
                        }
                        for jj in nk..BC {
                            *srow.add(jj) = f32::NEG_INFINITY;
                        }
                        exp_row::<L>(srow, 1.0, 0.0);
                    }
                    match ctx.dropout {
                        None => ds_row::<L>(srow, dprow, dsum, ctx.scale),
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
                gemm::<L>(
                    nk,
                    evp,
                    nr,
                    s.as_ptr(),
                    1,
                    BC,
                    doblk,
                    evp,
                    dv_acc.as_mut_ptr(),
                    evp,
                    true,
                );
                gemm::<L>(
                    nk,
                    ep,
                    nr,
                    dp.as_ptr(),
                    1,
                    BC,
                    qblk,
                    ep,
                    dk_acc.as_mut_ptr(),
                    ep,
                    true,
                );
                let dq_blk = dq.0.add((bh * d.q_len + i0) * ep);
                gemm::<L>(
                    nr,
                    ep,
                    nk,
                    dp.as_ptr(),
                    BC,
                    1,
                    krow.as_ptr(),
                    ep,
                    dq_blk,
                    ep,
                    true,
                );
            }
        }
        let kvrow = (b * d.kv_heads + kvh) * d.kv_len + k0;
        std::ptr::copy_nonoverlapping(dk_acc.as_ptr(), ctx.dk.0.add(kvrow * ep), nk * ep);
        std::ptr::copy_nonoverlapping(dv_acc.as_ptr(), ctx.dv.0.add(kvrow * evp), nk * evp);
    }
}

/// `row[j] = exp(row[j] · scale − shift)` over one block row, computed as
/// `2^(row[j] · scale·log₂e − shift·log₂e)` like the forward kernel.
#[inline(always)]
unsafe fn exp_row<L: Simd>(row: *mut f32, scale: f32, shift: f32) {
    let log2e = std::f32::consts::LOG2_E;
    let (sc, sh) = (L::splat(scale * log2e), L::splat(shift * log2e));
    for v in 0..BC / W {
        let x = L::load(row.add(v * W));
        L::store(row.add(v * W), L::exp2(L::sub(L::mul(x, sc), sh)));
    }
}

/// `dp[j] = p[j] · (dp[j] − dsum) · scale` over one block row.
#[inline(always)]
unsafe fn ds_row<L: Simd>(p: *const f32, dp: *mut f32, dsum: f32, scale: f32) {
    let (ds, sc) = (L::splat(dsum), L::splat(scale));
    for v in 0..BC / W {
        let x = L::load(dp.add(v * W));
        let pr = L::load(p.add(v * W));
        L::store(dp.add(v * W), L::mul(L::mul(pr, L::sub(x, ds)), sc));
    }
}

/// `C[m × n] (+)= A[m × k] · B[k × n]` with `n` a multiple of 16. `A[i, kk]` is at
/// `a + i·rsa + kk·csa` (so `Aᵀ` costs nothing), `B` and `C` are row-major.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn gemm<L: Simd>(
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    let mut j = 0;
    while j + 4 * W <= n {
        rows::<L, 4>(m, k, a, rsa, csa, b.add(j), ldb, c.add(j), ldc, acc);
        j += 4 * W;
    }
    while j < n {
        rows::<L, 1>(m, k, a, rsa, csa, b.add(j), ldb, c.add(j), ldc, acc);
        j += W;
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn rows<L: Simd, const NV: usize>(
    m: usize,
    k: usize,
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    let mut i = 0;
    while i + 4 <= m {
        tile::<L, 4, NV>(
            k,
            a.add(i * rsa),
            rsa,
            csa,
            b,
            ldb,
            c.add(i * ldc),
            ldc,
            acc,
        );
        i += 4;
    }
    while i < m {
        tile::<L, 1, NV>(
            k,
            a.add(i * rsa),
            rsa,
            csa,
            b,
            ldb,
            c.add(i * ldc),
            ldc,
            acc,
        );
        i += 1;
    }
}

/// An `MR × (NV·16)` tile of `C`, held in registers across the `k` loop.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile<L: Simd, const MR: usize, const NV: usize>(
    k: usize,
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    let mut t = [[L::splat(0.0); NV]; MR];
    if acc {
        for (r, row) in t.iter_mut().enumerate() {
            for (v, x) in row.iter_mut().enumerate() {
                *x = L::load(c.add(r * ldc + v * W));
            }
        }
    }
    for kk in 0..k {
        let mut bv = [L::splat(0.0); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = L::load(b.add(kk * ldb + v * W));
        }
        for (r, row) in t.iter_mut().enumerate() {
            let av = L::splat(*a.add(r * rsa + kk * csa));
            for (v, x) in row.iter_mut().enumerate() {
                *x = L::fma(av, bv[v], *x);
            }
        }
    }
    for (r, row) in t.iter().enumerate() {
        for (v, x) in row.iter().enumerate() {
            L::store(c.add(r * ldc + v * W), *x);
        }
    }
}

/// The additive term of one row of scores from the per-score masks: the additive
/// mask's value (or 0), −∞ where the boolean mask or key padding drops the key.
/// Contiguous rows are read as slices, which the compiler vectorises.
fn mask_terms(
    keep: Option<ArrayView1<'_, bool>>,
    add: Option<ArrayView1<'_, f32>>,
    pad: Option<ArrayView1<'_, bool>>,
    out: &mut [f32],
) {
    match add {
        Some(a) => along(out, a, |t, x| *t = x),
        None => out.fill(0.0),
    }
    let cut = |t: &mut f32, dropped: bool| {
        if dropped {
            *t = f32::NEG_INFINITY;
        }
    };
    if let Some(m) = keep {
        along(out, m, |t, kept| cut(t, !kept));
    }
    if let Some(m) = pad {
        along(out, m, cut);
    }
}
