//! The per-score masks of a problem, combined and transposed once per call for the
//! tiled kernels.
//!
//! The fused forward holds a tile of scores transposed, one key per row and one query
//! per lane (`Sᵀ[jj][ii]`). Reading a boolean or additive mask score by score into
//! that layout cost more than computing the score itself (the masked forward ran at
//! about half the unmasked speed). [`MaskTiles`] instead combines them into one
//! additive term, already transposed, once per call and per distinct `(batch, head)`
//! slice — a mask broadcast over heads is combined once, not once per head — so that
//! a tile reads it in place. Key padding (`[B, S]`) is not materialised: it drops
//! whole key rows of a tile, applied with causality and the window to a copy, only in
//! the tiles it or they cut through.

use ndarray::{s, ArrayView2, ArrayViewMut2, ShapeBuilder};
use rayon::prelude::*;

use super::Problem;
use crate::isa::transpose::transpose;
use crate::isa::{dispatch, IsaToken, Simd, SimdJob};

/// Keys per block of the one-off transposition (and per parallel task).
const TRANSPOSE_BLOCK: usize = 64;

/// Queries per block of the combined masks: the widest query block of the fused
/// kernel, so that a unit's mask rows lie in one block, one after the other.
const QUERY_BLOCK: usize = 64;

/// Queries per step of the transposition: one cache line of each output row.
const TRANSPOSE_ROWS: usize = 16;

/// The additive term of every score from the boolean and additive masks, transposed:
/// `−∞` where the boolean mask drops the score, the additive mask's value (or 0)
/// where it is kept, so that a tile adds its term as it is.
///
/// Stored as `[Bm, Hm, ⌈L/64⌉, S, 64]`: for each block of 64 queries, one row of 64
/// per key, so that a unit of the fused kernel reads its tiles' mask rows in memory
/// order. `Bm` is 1 when neither mask varies over the batch (else `B`), `Hm`
/// likewise for heads; zeros past `L`, so that a kernel may read whole vectors of
/// queries. That is `4 · Bm · Hm · S · Lp` bytes with `Lp` = `L` rounded up to a
/// multiple of 64, and nothing without either mask. (Rows of all `Lp` queries per
/// key, `[S, Lp]`, put a unit's consecutive mask rows `4·Lp` bytes apart, a page
/// each from `L` = 1024; read that way, the masked forward was about 5 % slower at
/// `L` = 2048: docs/fused-forward.md, Per-score masks.)
#[derive(Debug)]
pub struct MaskTiles {
    /// Empty when the problem has neither a boolean nor an additive mask.
    data: Vec<f32>,
    per_batch: bool,
    per_head: bool,
    heads: usize,
    q_len: usize,
    kv_len: usize,
    /// Query blocks, `⌈L/64⌉`.
    blocks: usize,
}

impl<Q: Sync, KV: Sync> Problem<'_, Q, KV> {
    /// The combined, transposed boolean and additive masks (key padding, causality
    /// and windows are applied tile by tile: see [`MaskTiles::tile`]), transposed
    /// with `isa`'s vectors.
    pub(crate) fn mask_tiles(&self, isa: IsaToken) -> MaskTiles {
        let d = self.dims();
        let (l, s) = (d.q_len, d.kv_len);
        if self.mask.is_none() && self.bias.is_none() {
            return MaskTiles {
                data: Vec::new(),
                per_batch: false,
                per_head: false,
                heads: 1,
                q_len: l,
                kv_len: s,
                blocks: 0,
            };
        }
        // Axis 0 or 1 matters only if some mask has a non-zero stride along it.
        let varies = |axis: usize| {
            let dim = [d.batch, d.heads][axis];
            dim > 1
                && (self.mask.is_some_and(|m| m.strides()[axis] != 0)
                    || self.bias.is_some_and(|m| m.strides()[axis] != 0))
        };
        let (per_batch, per_head) = (varies(0), varies(1));
        let nh = if per_head { d.heads } else { 1 };
        let slices = if per_batch { d.batch } else { 1 } * nh;
        let blocks = l.div_ceil(QUERY_BLOCK);
        let mut data = vec![0.0f32; slices * blocks * s * QUERY_BLOCK];
        // Parallel over slices, query blocks and blocks of keys: each piece is
        // `TRANSPOSE_BLOCK` rows of one query block.
        data.par_chunks_mut(s * QUERY_BLOCK)
            .enumerate()
            .flat_map(|(sq, out)| {
                out.par_chunks_mut(TRANSPOSE_BLOCK * QUERY_BLOCK)
                    .enumerate()
                    .map(move |(jb, out)| (sq, jb, out))
            })
            .for_each(|(sq, jb, out)| {
                let (slice, qb) = (sq / blocks, sq % blocks);
                let at = (slice / nh, slice % nh);
                let keys = (jb * TRANSPOSE_BLOCK, out.len() / QUERY_BLOCK);
                let job = BlockJob {
                    p: self,
                    at,
                    q0: qb * QUERY_BLOCK,
                    keys,
                    out,
                };
                dispatch(isa, job);
            });
        MaskTiles {
            data,
            per_batch,
            per_head,
            heads: nh,
            q_len: l,
            kv_len: s,
            blocks,
        }
    }

    /// Writes keys `j0..j0 + nj` (at most [`TRANSPOSE_BLOCK`]) of the query block
    /// from `q0` of `(b, h)` into `out[jj * 64 + i]`, the additive mask's values:
    /// [`TRANSPOSE_ROWS`] queries' terms at a time are written
    /// along the keys in a small buffer ([`MaskRows::write_terms`](super::mask_term::MaskRows::write_terms)), then
    /// transposed into place with `isa`'s vectors.
    #[inline(always)]
    fn transpose_block<I: Simd>(
        &self,
        isa: I,
        (b, h): (usize, usize),
        q0: usize,
        (j0, nj): (usize, usize),
        out: &mut [f32],
    ) {
        let l = self.dims().q_len.min(q0 + QUERY_BLOCK);
        // Key padding is per batch row, and these rows may serve every batch row:
        // `tile` applies it.
        let masks = self.mask_rows((b, h), q0..l, j0..j0 + nj).without_padding();
        let mut buf = [0.0f32; TRANSPOSE_ROWS * TRANSPOSE_BLOCK];
        for i0 in (q0..l).step_by(TRANSPOSE_ROWS) {
            let ni = TRANSPOSE_ROWS.min(l - i0);
            for (r, line) in buf.chunks_exact_mut(TRANSPOSE_BLOCK).take(ni).enumerate() {
                masks.write_terms(i0 - q0 + r, &mut line[..nj]);
            }
            let src = ArrayView2::from_shape((ni, nj).strides((TRANSPOSE_BLOCK, 1)), &buf)
                .expect("the buffer holds ni rows of nj");
            let dst =
                ArrayViewMut2::from_shape((nj, ni).strides((QUERY_BLOCK, 1)), &mut out[i0 - q0..])
                    .expect("out holds nj rows of the query block");
            transpose(isa, src, dst);
        }
    }
}

/// One block of [`Problem::mask_tiles`], for [`dispatch`].
struct BlockJob<'a, 'p, 'o, Q, KV> {
    p: &'a Problem<'p, Q, KV>,
    /// `(b, h)` of the slice.
    at: (usize, usize),
    /// First query of the block.
    q0: usize,
    /// `(j0, nj)`.
    keys: (usize, usize),
    out: &'o mut [f32],
}

impl<Q: Sync, KV: Sync> SimdJob for BlockJob<'_, '_, '_, Q, KV> {
    type Output = ();
    #[inline(always)]
    fn run<I: Simd>(self, isa: I) {
        let (at, q0, keys) = (self.at, self.q0, self.keys);
        self.p.transpose_block(isa, at, q0, keys, self.out);
    }
}

impl MaskTiles {
    /// Whether the problem has a boolean or additive mask, to be read with
    /// [`rows`](Self::rows) in the tiles that need no copy.
    pub fn has_masks(&self) -> bool {
        !self.data.is_empty()
    }

    /// Whether the band (causality or the window) is the only thing that masks
    /// scores: no boolean or additive mask, no key padding. A tile the band cuts
    /// through then needs no copy of mask terms: its scores can be cut in place
    /// ([`cut_to_band`]).
    pub fn band_only<Q, KV>(&self, p: &Problem<'_, Q, KV>) -> bool {
        self.data.is_empty() && p.key_padding.is_none()
    }

    /// Whether the tile of queries `i0..i0 + ni` and keys `j0..j0 + nj` of batch `b`
    /// needs a copy made by [`tile`](Self::tile): causality or the window cuts
    /// through it, or key padding drops one of its keys.
    pub fn needs_copy<Q, KV>(
        &self,
        p: &Problem<'_, Q, KV>,
        b: usize,
        (i0, ni): (usize, usize),
        (j0, nj): (usize, usize),
    ) -> bool {
        !p.tile_in_band(i0, i0 + ni, j0, j0 + nj)
            || p.key_padding
                .is_some_and(|pad| pad.slice(s![b, j0..j0 + nj]).iter().any(|&x| x))
    }

    /// The combined masks from query `i0` and key `j0` of `(b, h)` on, and the
    /// distance between the rows of consecutive keys: `nj` rows of `width` queries
    /// are in the slice (queries past `L` read as 0).
    ///
    /// # Panics
    /// Without a boolean or additive mask, for a block beyond the problem's, or for
    /// queries `i0..i0 + width` that cross a multiple of 64 (the fused kernel's
    /// query blocks never do).
    pub fn rows(
        &self,
        (b, h): (usize, usize),
        i0: usize,
        j0: usize,
        (nj, width): (usize, usize),
    ) -> (&[f32], usize) {
        assert!(
            !self.data.is_empty(),
            "rows: the problem has no boolean or additive mask"
        );
        let (qb, off) = (i0 / QUERY_BLOCK, i0 % QUERY_BLOCK);
        assert!(qb < self.blocks && off + width <= QUERY_BLOCK && j0 + nj <= self.kv_len && nj > 0);
        let slice =
            if self.per_batch { b } else { 0 } * self.heads + if self.per_head { h } else { 0 };
        let start = ((slice * self.blocks + qb) * self.kv_len + j0) * QUERY_BLOCK + off;
        (
            &self.data[start..start + (nj - 1) * QUERY_BLOCK + width],
            QUERY_BLOCK,
        )
    }

    /// Writes, for queries `i0..i0 + ni` and keys `j0..j0 + nj` of batch `b` and
    /// query head `h`, the additive term of each score, transposed:
    /// `out[jj * stride + ii]` is the additive mask's value (or 0) when every mask,
    /// key padding, causality and the window keep score `(i0 + ii, j0 + jj)`, and
    /// −∞ when one drops it. Returns whether any score is kept.
    #[allow(clippy::too_many_arguments)]
    pub fn tile<Q, KV>(
        &self,
        p: &Problem<'_, Q, KV>,
        (b, h): (usize, usize),
        (i0, ni): (usize, usize),
        (j0, nj): (usize, usize),
        out: &mut [f32],
        stride: usize,
    ) -> bool {
        assert!(ni <= stride && out.len() >= nj.saturating_sub(1) * stride + ni);
        assert!(i0 + ni <= self.q_len && j0 + nj <= self.kv_len);
        if self.data.is_empty() {
            for jj in 0..nj {
                out[jj * stride..jj * stride + ni].fill(0.0);
            }
        } else {
            let (src, row) = self.rows((b, h), i0, j0, (nj, ni));
            for jj in 0..nj {
                out[jj * stride..jj * stride + ni].copy_from_slice(&src[jj * row..][..ni]);
            }
        }
        if let Some(pad) = p.key_padding {
            for (jj, &dropped) in pad.slice_move(s![b, j0..j0 + nj]).iter().enumerate() {
                if dropped {
                    out[jj * stride..jj * stride + ni].fill(f32::NEG_INFINITY);
                }
            }
        }
        let band_keeps_any = p.tile_in_band(i0, i0 + ni, j0, j0 + nj)
            || cut_to_band(p, (i0, ni), (j0, nj), out, stride);
        if self.data.is_empty() && p.key_padding.is_none() {
            return band_keeps_any;
        }
        (0..nj).any(|jj| {
            out[jj * stride..jj * stride + ni]
                .iter()
                .any(|&x| x != f32::NEG_INFINITY)
        })
    }
}

/// Causality's and the window's terms for a tile of `width` queries from `i0` and
/// keys `j0..j0 + nj`, written as one row of `width + nj − 1` floats into `out`: 0
/// where the band keeps a score, −∞ where it hides it. Whether query `i` sees key
/// `j` depends only on `j − i` ([`Problem::band_offsets`]), so key `j0 + r`'s terms
/// for queries `i0..i0 + width` are `out[nj − 1 − r..][..width]`: each key's row
/// starts one float before the previous key's. Filling these few floats replaces
/// filling a whole tile of terms (or cutting its scores after the products).
///
/// # Panics
/// If `out` is shorter than `width + nj − 1` or nothing bands the problem's keys.
pub(crate) fn band_row<Q, KV>(
    p: &Problem<'_, Q, KV>,
    i0: usize,
    (j0, nj): (usize, usize),
    width: usize,
    out: &mut [f32],
) {
    let d = p.dims();
    let (lo, hi) = p
        .band_offsets(d.q_len, d.kv_len)
        .expect("band_row: a problem with causality or a window");
    let out = &mut out[..width + nj - 1];
    // Float `k` is the term of query `i` and key `j` with `j − i = first − k`.
    let first = (j0 + nj - 1) as i128 - i0 as i128;
    // `lo ≤ first − k < hi`: `first − hi < k ≤ first − lo`.
    let len = out.len() as i128;
    let from = (first - hi + 1).clamp(0, len) as usize;
    let to = lo.map_or(len, |lo| (first - lo + 1).clamp(0, len)) as usize;
    let to = to.max(from);
    out[..from].fill(f32::NEG_INFINITY);
    out[from..to].fill(0.0);
    out[to..].fill(f32::NEG_INFINITY);
}

/// Sets to −∞ the scores of the tile `out` (queries `i0..i0 + ni` along its rows,
/// keys `j0..j0 + nj` down them, rows `stride` apart) that causality and the window
/// hide, and returns whether they leave any: the terms of a mask tile, or the
/// scores themselves (a NaN score too: hidden, it is −∞ like any other). Both ends of a query's keys move right
/// with the query ([`Problem::block_key_range`]), so each key is seen by one run of
/// consecutive queries, `a..b`, and both ends of that run move right with the key.
fn cut_to_band<Q, KV>(
    p: &Problem<'_, Q, KV>,
    (i0, ni): (usize, usize),
    (j0, nj): (usize, usize),
    out: &mut [f32],
    stride: usize,
) -> bool {
    // Query `i`'s keys as offsets into the tile.
    let keys_of = |i: usize| {
        let (lo, hi) = p.key_range(i0 + i);
        let lo = lo.clamp(j0, j0 + nj) - j0;
        (lo, (hi.clamp(j0, j0 + nj) - j0).max(lo))
    };
    let mut any = false;
    // The first query whose keys end after key `jj`, and the first whose keys start
    // after it, with those ends.
    let (mut a, mut b) = (0, 0);
    let (mut start_b, mut end_a) = keys_of(0);
    for jj in 0..nj {
        while a < ni && end_a <= jj {
            a += 1;
            end_a = if a < ni { keys_of(a).1 } else { 0 };
        }
        while b < ni && start_b <= jj {
            b += 1;
            start_b = if b < ni { keys_of(b).0 } else { 0 };
        }
        let b = b.max(a);
        let row = &mut out[jj * stride..jj * stride + ni];
        row[..a].fill(f32::NEG_INFINITY);
        row[b..].fill(f32::NEG_INFINITY);
        any |= a < b;
    }
    any
}

#[cfg(test)]
mod tests {
    use ndarray::Array4;

    use super::*;
    use crate::problem::{AttentionOptions, Causal, Dims};

    /// Calls `check` on problems with causal alignments and windows (one unbounded
    /// on the left), square and oblong, and a label naming the problem.
    fn for_each_band(mut check: impl FnMut(&Problem<'_>, &str)) {
        let bands = [
            (Some(Causal::TopLeft), None),
            (Some(Causal::BottomRight), None),
            (Some(Causal::BottomRight), Some((7, 0))),
            (None, Some((5, 9))),
            (None, Some((0, 0))),
            (None, Some((usize::MAX, 2))),
        ];
        for (q_len, kv_len) in [(40, 40), (23, 61), (61, 23)] {
            let q = Array4::<f32>::zeros((1, 1, q_len, 4));
            let kv = Array4::<f32>::zeros((1, 1, kv_len, 4));
            for (causal, window) in bands {
                let opts = AttentionOptions {
                    causal,
                    window,
                    ..Default::default()
                };
                let p = Problem::new(q.view(), kv.view(), kv.view(), &opts).expect("valid");
                check(&p, &format!("{causal:?} {window:?} L{q_len} S{kv_len}"));
            }
        }
    }

    /// The band's cut of every tile, against each score's own key range.
    #[test]
    fn band_tiles_hide_exactly_the_scores_outside_each_querys_keys() {
        for_each_band(|p, band| {
            let Dims { q_len, kv_len, .. } = p.dims();
            let tiles = p.mask_tiles(IsaToken::best());
            for (i0, ni) in [(0, 16), (5, 13), (q_len - 9, 9)] {
                for (j0, nj) in [(0, kv_len), (3, 17), (kv_len - 11, 11)] {
                    let stride = ni + 3;
                    let mut out = vec![f32::NAN; nj * stride];
                    let any = tiles.tile(p, (0, 0), (i0, ni), (j0, nj), &mut out, stride);
                    let mut want_any = false;
                    for jj in 0..nj {
                        for ii in 0..ni {
                            let (lo, hi) = p.key_range(i0 + ii);
                            let seen = (lo..hi).contains(&(j0 + jj));
                            want_any |= seen;
                            let want = if seen { 0.0 } else { f32::NEG_INFINITY };
                            let (i, j) = (i0 + ii, j0 + jj);
                            assert_eq!(out[jj * stride + ii], want, "{band} query {i} key {j}");
                        }
                    }
                    assert_eq!(any, want_any);
                }
            }
        });
    }

    /// A tile's band row, read at each key's offset, against each score's own key
    /// range; lanes past the last query (a unit's padding) are not checked.
    #[test]
    fn band_row_read_key_by_key_is_each_querys_keys() {
        for_each_band(|p, band| {
            let Dims { q_len, kv_len, .. } = p.dims();
            for (i0, width) in [(0, 16), (16, 64), (q_len - 9, 16)] {
                for (j0, nj) in [(0, kv_len), (3, 17), (kv_len - 11, 11), (2, 1)] {
                    let mut out = vec![f32::NAN; width + nj + 5];
                    band_row(p, i0, (j0, nj), width, &mut out);
                    let row = &out[..width + nj - 1];
                    assert!(row.iter().all(|&x| x == 0.0 || x == f32::NEG_INFINITY));
                    for r in 0..nj {
                        for ii in 0..width.min(q_len.saturating_sub(i0)) {
                            let (i, j) = (i0 + ii, j0 + r);
                            let (lo, hi) = p.key_range(i);
                            let want = if (lo..hi).contains(&j) {
                                0.0
                            } else {
                                f32::NEG_INFINITY
                            };
                            assert_eq!(row[nj - 1 - r + ii], want, "{band} query {i} key {j}");
                        }
                    }
                }
            }
        });
    }
}
