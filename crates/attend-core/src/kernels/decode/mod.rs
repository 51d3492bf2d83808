//! Split-KV attention for short queries: the decoding kernel.
//!
//! One new query (or a handful, up to about 16) against a long key/value cache is
//! bound by memory bandwidth, not arithmetic. The keys are cut into fixed chunks;
//! every `(batch, kv head, chunk)` is an independent task that streams its K and V
//! rows once, for the whole group of query heads sharing that K/V head
//! (grouped-query attention), and leaves an unnormalised partial result: the running
//! maximum, the sum of weights and the weighted sum of values. The partials are then
//! merged by log-sum-exp, chunk by chunk in key order, so the result has the same
//! bits whatever the number of threads.
//!
//! Queries are pre-multiplied by `scale`; scores stay in their own units, however
//! large (docs/design.md, "Masks"), and the softmax's `e^x` is `Simd::exp`.
//!
//! The kernel is generic over the element type of `k` and `v` (`f32` or bf16), and
//! over that of `q` apart from it (the problem's `Q` and `KV`): a bf16 row is
//! widened exactly as it is loaded (`rows.rs`), the queries are widened once into
//! f32 rows, and the scores, softmax statistics and accumulators are f32 whatever
//! the cache holds, so a bf16 cache reads half the bytes for the same arithmetic.

mod rows;

pub use crate::kernels::Isa;

use ndarray::{Array3, Array4, ArrayView1, ArrayView4};
use rayon::prelude::*;

use crate::element::Element;
use crate::isa::{dispatch, IsaToken, Simd, SimdJob, LANES};
use crate::kernels::lse::{split, LogSumExp};
use crate::kernels::merge::{merge_softmax_parts, SoftmaxPart};
use crate::kernels::scratch::with_scratch;
use crate::problem::{Problem, SoftmaxAxis};

/// Where a problem's keys sit in the whole sequence.
///
/// A problem's keys may be one shard, keys `start..start + S` of a sequence of
/// `total` keys; causal masks and windows are aligned on the whole sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySpan {
    /// Index of the problem's first key in the whole sequence.
    pub start: usize,
    /// Length of the whole sequence.
    pub total: usize,
}

impl KeySpan {
    /// The problem's keys are the whole sequence.
    pub fn whole(kv_len: usize) -> Self {
        KeySpan {
            start: 0,
            total: kv_len,
        }
    }
}

/// Bytes of K and V per chunk: long sequential reads keep the memory busy (512 KiB
/// chunks measured about 0.80 of the read bandwidth, 2 MiB about 0.88). Software
/// prefetching 2 to 12 blocks ahead measured worse (0.65 to 0.75), so there is none.
/// Counted in bytes, so a bf16 chunk holds twice the keys of an f32 one.
const CHUNK_BYTES: usize = 2 << 20;

/// Chunks are halved (down to [`MIN_CHUNK`] keys) until there are at least this
/// many tasks, so that every core gets work. Chunking depends on the shapes only,
/// never on the thread count, so the merge order (and the result) is fixed.
const MIN_TASKS: usize = 32;

/// Smallest chunk, in keys.
const MIN_CHUNK: usize = 256;

/// Keys per block inside a chunk: one vector of scores per query row.
const BLOCK: usize = LANES;

/// Whether this kernel handles the problem (softmax over keys; anything else goes
/// to the reference).
pub fn supports<Q, KV>(p: &Problem<'_, Q, KV>) -> bool {
    p.softmax_axis == SoftmaxAxis::Keys
}

/// Keys per chunk for `heads` independent `(batch, kv head)` pairs of `keys` keys
/// of widths `e` and `ev`, of `bytes` bytes per element.
fn chunk_len(e: usize, ev: usize, bytes: usize, keys: usize, heads: usize) -> usize {
    let per_key = (e + ev).max(1) * bytes;
    let mut ch = (CHUNK_BYTES / per_key / BLOCK).max(1) * BLOCK;
    while ch > MIN_CHUNK && heads * keys.div_ceil(ch) < MIN_TASKS {
        ch = (ch / 2).div_ceil(BLOCK) * BLOCK;
    }
    ch
}

/// Floats of scratch one task needs: the scores of one chunk of `chunk` keys for
/// every query row of a key/value head's group, and for each row and block of 16
/// keys the bits of the keys it does not see.
fn scratch_len(rows: usize, chunk: usize) -> usize {
    rows * chunk.div_ceil(BLOCK) * (BLOCK + 1)
}

/// Runs the split-KV kernel: output `[B, Hq, L, Ev]` and natural log-sum-exp
/// `[B, Hq, L]` (−∞ and zeros for fully masked rows), in f32 whatever `Q` and `T`
/// are. The queries are read once, into pre-scaled f32 rows, so f32 queries against
/// a bf16 cache (`Problem<'_, f32, bf16>`) keep their f32 bits.
///
/// Runs on the current rayon pool. Panics if the problem's softmax is over
/// queries.
pub(crate) fn run<Q: Element, T: Element>(
    p: &Problem<'_, Q, T>,
    span: KeySpan,
    isa: IsaToken,
) -> (Array4<f32>, LogSumExp) {
    assert!(supports(p), "the decode kernel needs softmax over keys");
    let d = p.dims();
    let (group, l) = (d.heads / d.kv_heads, d.q_len);
    let rows = group * l;
    let (e, ev) = (d.head_dim, d.value_dim);
    let mut out = Array4::zeros((d.batch, d.heads, l, ev));
    let mut lse = Array3::from_elem((d.batch, d.heads, l), f32::NEG_INFINITY);
    let mut residual = Array3::zeros((d.batch, d.heads, l));
    if d.batch == 0 || d.heads == 0 || l == 0 {
        let lse = LogSumExp {
            value: lse,
            residual,
        };
        return (out, lse);
    }

    // K and V rows must be contiguous; copy the rare view that is not.
    let (k_own, v_own);
    let k = if unit_last(&p.k) {
        p.k.view()
    } else {
        k_own = p.k.as_standard_layout().into_owned();
        k_own.view()
    };
    let v = if unit_last(&p.v) {
        p.v.view()
    } else {
        v_own = p.v.as_standard_layout().into_owned();
        v_own.view()
    };

    // Queries grouped by K/V head, pre-scaled, rows padded to whole vectors.
    let ep = e.div_ceil(LANES) * LANES;
    let qscale = p.scale;
    let mut qs = vec![0.0f32; d.batch * d.kv_heads * rows * ep];
    for b in 0..d.batch {
        for h in 0..d.heads {
            let (kvh, g) = (h / group, h % group);
            for i in 0..l {
                let r = g * l + i;
                let at = ((b * d.kv_heads + kvh) * rows + r) * ep;
                for (x, &y) in qs[at..at + e]
                    .iter_mut()
                    .zip(p.q.slice(ndarray::s![b, h, i, ..]))
                {
                    *x = y.to_f32() * qscale;
                }
            }
        }
    }

    // Visible keys of each query, in this problem's key indices.
    let ranges: Vec<(usize, usize)> = (0..l)
        .map(|i| p.key_range_in(i, span.start, span.total))
        .collect();
    let jlo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let jhi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let elementwise = p.has_elementwise_masks();
    let bytes = std::mem::size_of::<T>();
    let ch = chunk_len(e, ev, bytes, jhi.saturating_sub(jlo), d.batch * d.kv_heads);
    let chunks = if jhi > jlo {
        (jhi - jlo).div_ceil(ch)
    } else {
        0
    };

    let stride = rows * (ev + 2);
    let tasks = d.batch * d.kv_heads * chunks;
    let mut partials = vec![0.0f32; tasks * stride];
    let ctx = Ctx {
        p,
        k: k.view(),
        v: v.view(),
        qs: &qs,
        ep,
        group,
        rows,
        ranges: &ranges,
        elementwise,
    };
    let len = scratch_len(rows, ch);
    partials
        .par_chunks_mut(stride)
        .enumerate()
        .for_each(|(t, part)| {
            let c = t % chunks;
            let bh = t / chunks;
            let (b, kvh) = (bh / d.kv_heads, bh % d.kv_heads);
            let j0 = jlo + c * ch;
            let j1 = (j0 + ch).min(jhi);
            with_scratch(len, |scores| {
                let job = ChunkJob {
                    ctx: &ctx,
                    at: (b, kvh),
                    keys: (j0, j1),
                    part,
                    scores,
                };
                dispatch(isa, job)
            });
        });

    // Merge the chunks of each row in key order. A chunk holds its running max
    // `m`, its sum `s` of `e^(score − m)` and its unnormalised output: its
    // log-sum-exp is `m + ln s`, and `1 / s` normalises it.
    let mut acc = vec![0.0f64; ev];
    for b in 0..d.batch {
        for kvh in 0..d.kv_heads {
            let base = (b * d.kv_heads + kvh) * chunks;
            for r in 0..rows {
                let (g, i) = (r / l, r % l);
                let h = kvh * group + g;
                let parts = (0..chunks).map(|c| {
                    let pt = &partials[(base + c) * stride..][..stride];
                    let (m, s) = (pt[r] as f64, pt[rows + r] as f64);
                    SoftmaxPart {
                        // A chunk that saw no key has m = −∞ (and s = 0).
                        top: m,
                        log_sum: s.ln(),
                        scale: 1.0 / s,
                        output: ArrayView1::from(&pt[2 * rows + r * ev..][..ev]),
                    }
                });
                let row = out.slice_mut(ndarray::s![b, h, i, ..]);
                // Fully masked rows keep the zeros and −∞ they were initialised with.
                let (top, log_sum) = merge_softmax_parts(parts, &mut acc, row);
                (lse[[b, h, i]], residual[[b, h, i]]) = split(top, log_sum);
            }
        }
    }
    let lse = LogSumExp {
        value: lse,
        residual,
    };
    (out, lse)
}

fn unit_last<T>(a: &ArrayView4<'_, T>) -> bool {
    a.dim().3 <= 1 || a.strides()[3] == 1
}

/// Everything the tasks of one call share.
struct Ctx<'a, 'p, Q, T> {
    p: &'a Problem<'p, Q, T>,
    k: ArrayView4<'a, T>,
    v: ArrayView4<'a, T>,
    /// Pre-scaled queries `[B, Hkv, rows, ep]`.
    qs: &'a [f32],
    ep: usize,
    group: usize,
    rows: usize,
    ranges: &'a [(usize, usize)],
    elementwise: bool,
}

/// One chunk of one key/value head, for [`dispatch`].
struct ChunkJob<'a, 'c, 'p, 'o, Q, T> {
    ctx: &'a Ctx<'c, 'p, Q, T>,
    /// `(b, kvh)`.
    at: (usize, usize),
    /// Keys `[j0, j1)`.
    keys: (usize, usize),
    /// `m[rows]`, `l[rows]`, `o[rows, Ev]`.
    part: &'o mut [f32],
    /// [`scratch_len`] floats for the chunk's scores.
    scores: &'o mut [f32],
}

impl<Q: Element, T: Element> SimdJob for ChunkJob<'_, '_, '_, '_, Q, T> {
    type Output = ();
    #[inline(always)]
    fn run<I: Simd>(self, isa: I) {
        let ((b, kvh), (j0, j1)) = (self.at, self.keys);
        // SAFETY: `run` made `(b, kvh)` and `[j0, j1)` inside the problem, `part`
        // one task's partial and `scores` `scratch_len` floats.
        unsafe { self.ctx.chunk(isa, b, kvh, j0, j1, self.part, self.scores) }
    }
}

impl<Q: Element, T: Element> Ctx<'_, '_, Q, T> {
    /// Computes chunk `[j0, j1)` of `(b, kvh)` into `part`: `m[rows]` (running
    /// max), `l[rows]` (sum of weights), `o[rows, Ev]` (unnormalised).
    ///
    /// Two passes over the chunk, each a long sequential read: first every score
    /// (K streamed once for all the group's queries), then the weighted values
    /// (V streamed once). The chunk's scores stay in cache between the passes.
    ///
    /// # Safety
    /// `b < B`, `kvh < Hkv` and `j0 < j1 ≤ S`; `part` holds `rows · (Ev + 2)`
    /// floats and `scratch` [`scratch_len`] for a chunk of `j1 − j0` keys.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn chunk<I: Simd>(
        &self,
        isa: I,
        b: usize,
        kvh: usize,
        j0: usize,
        j1: usize,
        part: &mut [f32],
        scratch: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's contract (see # Safety).
        unsafe {
            let rows = self.rows;
            let l = rows / self.group;
            let (e, ev) = (self.k.dim().3, self.v.dim().3);
            let (m, rest) = part.split_at_mut(rows);
            let (lsum, o) = rest.split_at_mut(rows);
            m.fill(f32::NEG_INFINITY);
            lsum.fill(0.0);
            o.fill(0.0);
            let ks = self.k.strides()[2];
            let vs = self.v.strides()[2];
            let kbase = self
                .k
                .as_ptr()
                .offset(b as isize * self.k.strides()[0] + kvh as isize * self.k.strides()[1]);
            let vbase = self
                .v
                .as_ptr()
                .offset(b as isize * self.v.strides()[0] + kvh as isize * self.v.strides()[1]);
            let qrows = &self.qs[(b * self.k.dim().1 + kvh) * rows * self.ep..][..rows * self.ep];
            // Scores of the chunk, one row per query, padded to whole blocks.
            let n = j1 - j0;
            let width = n.div_ceil(BLOCK) * BLOCK;
            let blocks = width / BLOCK;
            {
                let (s, hidden) = scratch.split_at_mut(rows * width);
                s.fill(f32::NEG_INFINITY);
                // Bit `jj` of `hidden[r · blocks + block]` (a `u32` in an f32's bits)
                // marks key `jj` of the block as one row `r` does not see: its weight
                // is 0, and pass 2 skips it, so that a NaN or an infinite value never
                // reaches a row that does not see its key (docs/design.md, "NaN").
                let hidden = &mut hidden[..rows * blocks];
                hidden.fill(0.0);

                // Pass 1: scores.
                let mut jb = j0;
                while jb < j1 {
                    let nb = BLOCK.min(j1 - jb);
                    let kb = kbase.offset(jb as isize * ks);
                    for (i, &(lo, hi)) in self.ranges.iter().enumerate() {
                        if hi <= jb || lo >= jb + nb {
                            continue; // nothing visible to this query in the block
                        }
                        let partial = lo > jb || hi < jb + nb || self.elementwise;
                        for g in 0..self.group {
                            let r = g * l + i;
                            let q = qrows.as_ptr().add(r * self.ep);
                            let sb = &mut s[r * width + (jb - j0)..][..BLOCK];
                            if nb == BLOCK {
                                dots16(isa, q, kb, ks, e, sb.as_mut_ptr());
                            } else {
                                dots(isa, q, kb, ks, e, nb, sb.as_mut_ptr());
                            }
                            if partial {
                                self.mask_block(b, kvh * self.group + g, i, jb, nb, (lo, hi), sb);
                                let bits = sb[..nb]
                                    .iter()
                                    .enumerate()
                                    .filter(|(_, &x)| x == f32::NEG_INFINITY)
                                    .fold(0u32, |bits, (jj, _)| bits | 1 << jj);
                                hidden[r * blocks + (jb - j0) / BLOCK] = f32::from_bits(bits);
                            }
                        }
                    }
                    jb += nb;
                }

                // Softmax numerators per query, in place.
                for r in 0..rows {
                    let row = &mut s[r * width..][..width];
                    let mut mv = f32::NEG_INFINITY;
                    for blk in row.chunks_exact(BLOCK) {
                        let x = isa.max_lane(isa.load(blk.as_ptr()));
                        if x > mv || x.is_nan() {
                            mv = x;
                        }
                    }
                    m[r] = mv;
                    if mv == f32::NEG_INFINITY {
                        continue;
                    }
                    let mvv = isa.splat(mv);
                    let mut acc = isa.splat(0.0);
                    for blk in row.chunks_exact_mut(BLOCK) {
                        let pv = isa.exp(isa.sub(isa.load(blk.as_ptr()), mvv));
                        isa.store(blk.as_mut_ptr(), pv);
                        acc = isa.add(acc, pv);
                    }
                    lsum[r] = isa.sum(acc);
                }

                // Pass 2: weighted values.
                let mut jb = j0;
                while jb < j1 {
                    let nb = BLOCK.min(j1 - jb);
                    let vb = vbase.offset(jb as isize * vs);
                    for (i, &(lo, hi)) in self.ranges.iter().enumerate() {
                        if hi <= jb || lo >= jb + nb {
                            continue;
                        }
                        let mut g = 0;
                        while g < self.group {
                            let r = g * l + i;
                            g += 1;
                            if m[r] == f32::NEG_INFINITY {
                                continue;
                            }
                            let p = s.as_ptr().add(r * width + (jb - j0));
                            let unseen =
                                |r: usize| hidden[r * blocks + (jb - j0) / BLOCK].to_bits();
                            if unseen(r) != 0 {
                                let or = o.as_mut_ptr().add(r * ev);
                                accumulate_seen(isa, or, p, vb, vs, ev, nb, unseen(r));
                                continue;
                            }
                            let next = r + l;
                            if roomy::<I>()
                                && g < self.group
                                && m[next] != f32::NEG_INFINITY
                                && unseen(next) == 0
                            {
                                g += 1;
                                let p2 = s.as_ptr().add(next * width + (jb - j0));
                                let os =
                                    [o.as_mut_ptr().add(r * ev), o.as_mut_ptr().add(next * ev)];
                                accumulate_pair(isa, os, [p, p2], vb, vs, ev, nb);
                            } else {
                                accumulate(isa, o.as_mut_ptr().add(r * ev), p, vb, vs, ev, nb);
                            }
                        }
                    }
                    jb += nb;
                }
            }
        }
    }

    /// Masks the scores of keys `jb..jb + n` for query `i` of head `h`: the mask
    /// terms added (the bias, −∞ where a mask drops the key), then
    /// −∞ outside the causal/window range `[lo, hi)`, whatever the score.
    #[allow(clippy::too_many_arguments)]
    fn mask_block(
        &self,
        b: usize,
        h: usize,
        i: usize,
        jb: usize,
        n: usize,
        (lo, hi): (usize, usize),
        s: &mut [f32],
    ) {
        let s = &mut s[..n];
        let masks = self.p.mask_rows((b, h), i..i + 1, jb..jb + n);
        masks.add_terms(0, s);
        let (lo, hi) = (lo.clamp(jb, jb + n) - jb, hi.clamp(jb, jb + n) - jb);
        s[..lo].fill(f32::NEG_INFINITY);
        s[hi.max(lo)..].fill(f32::NEG_INFINITY);
    }
}

/// `out[j] = q · k_j` for a whole block of 16 keys: sixteen accumulators, summed
/// with one transpose-and-add tree.
///
/// # Safety
/// `q` must be valid for reading `e` rounded up to 16 floats; `k` for 16 rows of
/// `e` elements `ks` apart; `out` for writing 16 floats.
#[inline(always)]
unsafe fn dots16<T: Element, I: Simd>(
    isa: I,
    q: *const f32,
    k: *const T,
    ks: isize,
    e: usize,
    out: *mut f32,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        if roomy::<I>() {
            match e {
                64 => return dots16_held::<T, I, 4>(isa, q, k, ks, out),
                128 => return dots16_held::<T, I, 8>(isa, q, k, ks, out),
                _ => {}
            }
        }
        let full = e / LANES;
        let tail = e % LANES;
        let mut acc = [isa.splat(0.0); BLOCK];
        // Key by key, so that the rows are read in memory order.
        for (j, a) in acc.iter_mut().enumerate() {
            let kj = k.offset(j as isize * ks);
            for c in 0..full {
                *a = isa.fma(
                    isa.load(q.add(c * LANES)),
                    rows::load(isa, kj.add(c * LANES)),
                    *a,
                );
            }
        }
        if tail > 0 {
            let at = full * LANES;
            let qv = isa.load(q.add(at));
            for (j, a) in acc.iter_mut().enumerate() {
                *a = isa.fma(
                    qv,
                    rows::load_part(isa, k.offset(j as isize * ks).add(at), tail),
                    *a,
                );
            }
        }
        isa.store(out, isa.sum16(&acc));
    }
}

/// Whether the instruction set has room (32 registers) for a block's sixteen sums
/// beside a query of up to eight vectors ([`dots16_held`]), or for two query rows'
/// sums of eight value vectors each ([`accumulate_pair`]). AVX2's sixteen sums
/// alone fill its registers; both measured slower there (docs/decode.md).
fn roomy<I: Simd>() -> bool {
    I::REGISTERS >= 32
}

/// [`dots16`] for `E = 16·C`, with the query held in `C` registers: one load per
/// multiply-add (the key's) instead of two. Grouped-query decoding, whose scores
/// take a multiply-add per key element for each of the group's heads, is bound by
/// these loads (docs/decode.md).
///
/// # Safety
/// As [`dots16`]'s, with `e = 16·C`.
#[inline(always)]
unsafe fn dots16_held<T: Element, I: Simd, const C: usize>(
    isa: I,
    q: *const f32,
    k: *const T,
    ks: isize,
    out: *mut f32,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let qv: [I::V; C] = std::array::from_fn(|c| isa.load(q.add(c * LANES)));
        let mut acc = [isa.splat(0.0); BLOCK];
        for (j, a) in acc.iter_mut().enumerate() {
            let kj = k.offset(j as isize * ks);
            for (c, &x) in qv.iter().enumerate() {
                *a = isa.fma(x, rows::load(isa, kj.add(c * LANES)), *a);
            }
        }
        isa.store(out, isa.sum16(&acc));
    }
}

/// `out[j] = q · k_j` for the `n ≤ 16` keys at `k`, four keys at a time.
///
/// # Safety
/// As [`dots16`]'s, for `n` rows of `k` and `n` floats of `out`.
#[inline(always)]
unsafe fn dots<T: Element, I: Simd>(
    isa: I,
    q: *const f32,
    k: *const T,
    ks: isize,
    e: usize,
    n: usize,
    out: *mut f32,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let full = e / LANES;
        let tail = e % LANES;
        let mut j = 0;
        while j + 4 <= n {
            let k0 = k.offset(j as isize * ks);
            let k1 = k0.offset(ks);
            let k2 = k1.offset(ks);
            let k3 = k2.offset(ks);
            let z = isa.splat(0.0);
            let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
            for c in 0..full {
                let qv = isa.load(q.add(c * LANES));
                a0 = isa.fma(qv, rows::load(isa, k0.add(c * LANES)), a0);
                a1 = isa.fma(qv, rows::load(isa, k1.add(c * LANES)), a1);
                a2 = isa.fma(qv, rows::load(isa, k2.add(c * LANES)), a2);
                a3 = isa.fma(qv, rows::load(isa, k3.add(c * LANES)), a3);
            }
            if tail > 0 {
                let at = full * LANES;
                let qv = isa.load(q.add(at));
                a0 = isa.fma(qv, rows::load_part(isa, k0.add(at), tail), a0);
                a1 = isa.fma(qv, rows::load_part(isa, k1.add(at), tail), a1);
                a2 = isa.fma(qv, rows::load_part(isa, k2.add(at), tail), a2);
                a3 = isa.fma(qv, rows::load_part(isa, k3.add(at), tail), a3);
            }
            *out.add(j) = isa.sum(a0);
            *out.add(j + 1) = isa.sum(a1);
            *out.add(j + 2) = isa.sum(a2);
            *out.add(j + 3) = isa.sum(a3);
            j += 4;
        }
        while j < n {
            let kj = k.offset(j as isize * ks);
            let mut a = isa.splat(0.0);
            for c in 0..full {
                a = isa.fma(
                    isa.load(q.add(c * LANES)),
                    rows::load(isa, kj.add(c * LANES)),
                    a,
                );
            }
            if tail > 0 {
                let at = full * LANES;
                a = isa.fma(
                    isa.load(q.add(at)),
                    rows::load_part(isa, kj.add(at), tail),
                    a,
                );
            }
            *out.add(j) = isa.sum(a);
            j += 1;
        }
    }
}

/// [`accumulate`] for two query rows of a group at once, each value load serving
/// both: `o[x][..ev] += Σ_j p[x][j] · v_j`, each row's sums in the same order as
/// [`accumulate`]'s.
///
/// # Safety
/// As [`accumulate`]'s, for both rows.
#[inline(always)]
unsafe fn accumulate_pair<T: Element, I: Simd>(
    isa: I,
    o: [*mut f32; 2],
    p: [*const f32; 2],
    v: *const T,
    vs: isize,
    ev: usize,
    n: usize,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        const T: usize = 8;
        let mut c = 0;
        while c + T * LANES <= ev {
            let mut acc = [[isa.splat(0.0); T]; 2];
            for (row, &ox) in acc.iter_mut().zip(&o) {
                for (t, a) in row.iter_mut().enumerate() {
                    *a = isa.load(ox.add(c + t * LANES));
                }
            }
            for j in 0..n {
                let pj = [isa.splat(*p[0].add(j)), isa.splat(*p[1].add(j))];
                let vj = v.offset(j as isize * vs).add(c);
                let [first, second] = &mut acc;
                for (t, (a0, a1)) in first.iter_mut().zip(second.iter_mut()).enumerate() {
                    let vv = rows::load(isa, vj.add(t * LANES));
                    *a0 = isa.fma(pj[0], vv, *a0);
                    *a1 = isa.fma(pj[1], vv, *a1);
                }
            }
            for (row, &ox) in acc.iter().zip(&o) {
                for (t, a) in row.iter().enumerate() {
                    isa.store(ox.add(c + t * LANES), *a);
                }
            }
            c += T * LANES;
        }
        if c < ev {
            for (&ox, &px) in o.iter().zip(&p) {
                accumulate(isa, ox.add(c), px, v.add(c), vs, ev - c, n);
            }
        }
    }
}

/// [`accumulate`] over the keys a row sees: the runs of keys whose bit in `unseen`
/// is clear, in order, so that a key the row does not see adds nothing, not even a
/// NaN value times its zero weight (the sums of the others are [`accumulate`]'s).
///
/// # Safety
/// As [`accumulate`]'s.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn accumulate_seen<T: Element, I: Simd>(
    isa: I,
    o: *mut f32,
    p: *const f32,
    v: *const T,
    vs: isize,
    ev: usize,
    n: usize,
    unseen: u32,
) {
    let mut j = 0;
    while j < n {
        if unseen >> j & 1 == 1 {
            j += 1;
            continue;
        }
        let start = j;
        while j < n && unseen >> j & 1 == 0 {
            j += 1;
        }
        // SAFETY: keys `start..j` are among the caller's `n`.
        unsafe {
            let vj = v.offset(start as isize * vs);
            accumulate(isa, o, p.add(start), vj, vs, ev, j - start);
        }
    }
}

/// `o[..ev] += Σ_j p[j] · v_j` over the `n` value rows at `v`.
///
/// # Safety
/// `o` must be valid for reading and writing `ev` floats, `p` for reading `n`, and
/// `v` for `n` rows of `ev` elements `vs` apart.
#[inline(always)]
unsafe fn accumulate<T: Element, I: Simd>(
    isa: I,
    o: *mut f32,
    p: *const f32,
    v: *const T,
    vs: isize,
    ev: usize,
    n: usize,
) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        const T: usize = 8;
        let mut c = 0;
        while c + T * LANES <= ev {
            let mut acc = [isa.splat(0.0); T];
            for (t, a) in acc.iter_mut().enumerate() {
                *a = isa.load(o.add(c + t * LANES));
            }
            for j in 0..n {
                let pj = isa.splat(*p.add(j));
                let vj = v.offset(j as isize * vs).add(c);
                for (t, a) in acc.iter_mut().enumerate() {
                    *a = isa.fma(pj, rows::load(isa, vj.add(t * LANES)), *a);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                isa.store(o.add(c + t * LANES), *a);
            }
            c += T * LANES;
        }
        while c < ev {
            let w = LANES.min(ev - c);
            let mut a = isa.load_part(o.add(c), w);
            for j in 0..n {
                let vj = v.offset(j as isize * vs).add(c);
                a = isa.fma(isa.splat(*p.add(j)), rows::load_part(isa, vj, w), a);
            }
            isa.store_part(o.add(c), a, w);
            c += w;
        }
    }
}
