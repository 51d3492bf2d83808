//! The fused forward's operands for f32 tensors: `Qᵀ` packed once per unit with
//! the scores' scale folded in, `K` and `V` read in place through their strides, and
//! both products on the library's register tile (`kernels::tile`), which
//! broadcasts one element of `K` or `V` against rows of queries.
//!
//! The same operands read bf16 tensors on instruction sets without bf16 products
//! ([`Widened`]): each element is widened to f32 as it is loaded (exact: a shift),
//! `Qᵀ` as it is packed and each element of `K` and `V` as it is broadcast, so the
//! products and their sums are the f32 kernel's on the bf16 numbers, and the
//! output is written in bf16 by the units themselves. Nothing is widened or
//! rounded in a pass of its own, and `K` and `V` are read at half the bytes.

use ndarray::{Array4, ArrayView2, ArrayViewMut2};

use super::output::Output;
use super::{
    drive, exp_shifted, head_ptr, join_sums, masked_score, query_vectors, register_block,
    running_max, score_blocks, seen_products, value_blocks,
};
use super::{MaskRows, Operands, RegisterBlocks, Stats, UnitAt, BK};
use crate::element::bf16;
use crate::isa::transpose::transpose;
use crate::isa::{bf16_to_f32, IsaToken, Simd, LANES};
use crate::kernels::lse::LogSumExp;
use crate::kernels::scratch::carve;
use crate::kernels::tile::{Ahead, Lhs, Rescale, Tile, DOT_CHUNK, SUM_BLOCK, WIDE};
use crate::problem::{Dims, Dropout, Problem};

/// Vectors of 16 queries a unit holds at most on instruction sets with 16 vector
/// registers, where the products take one vector (panel) of queries at a time
/// ([`panels_in_registers`]): a unit of 32 queries reads each key and value once for
/// both of its panels, which units of 16 read once each (d128 N1024 and H1 N4096 on
/// AVX2 1.03–1.09×, docs/fused-forward.md); at 64 the unit's tiles of scores and
/// output crowd the L1 cache (N512 0.97×).
const NARROW_UNIT: usize = 2;

/// An element type the f32 operands read: f32 as it is, or bf16 widened to f32
/// as it is loaded.
pub(crate) trait Widened: Lhs<f32> + Output {
    /// Whether a unit widens its query rows into scratch before packing `Qᵀ`.
    const WIDENS: bool;
    /// The value, in f32 (exact).
    fn widen(self) -> f32;
    /// Loads the first `n ≤ 16` elements at `p`, widened; zeros in the other
    /// lanes.
    ///
    /// # Safety
    /// `p` must be valid for reading `n` elements.
    unsafe fn load_part<I: Simd>(isa: I, p: *const Self, n: usize) -> I::V;
    /// `dst[c, r] = src[r, c]`, widened; `spare` holds `src.len()` floats where
    /// [`Widened::WIDENS`].
    fn pack<I: Simd>(
        isa: I,
        src: ArrayView2<'_, Self>,
        dst: ArrayViewMut2<'_, f32>,
        spare: &mut [f32],
    );
}

impl Widened for f32 {
    const WIDENS: bool = false;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    unsafe fn load_part<I: Simd>(isa: I, p: *const f32, n: usize) -> I::V {
        // SAFETY: `p` holds `n` floats (the caller's contract).
        unsafe {
            if n == LANES {
                isa.load(p)
            } else {
                isa.load_part(p, n)
            }
        }
    }
    #[inline(always)]
    fn pack<I: Simd>(isa: I, src: ArrayView2<'_, f32>, dst: ArrayViewMut2<'_, f32>, _: &mut [f32]) {
        transpose(isa, src, dst);
    }
}

impl Widened for bf16 {
    const WIDENS: bool = true;
    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_to_f32(self.to_bits())
    }
    #[inline(always)]
    unsafe fn load_part<I: Simd>(isa: I, p: *const bf16, n: usize) -> I::V {
        // SAFETY: `p` holds `n` bf16 numbers (the caller's contract), each its
        // `u16` bits.
        unsafe {
            if n == LANES {
                return isa.load_bf16(p.cast());
            }
            let mut bits = [0u16; LANES];
            std::ptr::copy_nonoverlapping(p.cast::<u16>(), bits.as_mut_ptr(), n);
            isa.load_bf16(bits.as_ptr())
        }
    }
    /// The rows widened into `spare` a vector at a time, then transposed.
    #[inline(always)]
    fn pack<I: Simd>(
        isa: I,
        src: ArrayView2<'_, bf16>,
        dst: ArrayViewMut2<'_, f32>,
        spare: &mut [f32],
    ) {
        let (rows, cols) = src.dim();
        let spare = &mut spare[..rows * cols];
        for (r, row) in spare.chunks_exact_mut(cols).enumerate() {
            let src = src.row(r);
            let Some(from) = src.as_slice() else {
                for (x, y) in row.iter_mut().zip(src) {
                    *x = y.widen();
                }
                continue;
            };
            for (x, y) in row.chunks_mut(LANES).zip(from.chunks(LANES)) {
                // SAFETY: `y` holds `x.len() ≤ 16` numbers, and `x` as many floats.
                unsafe {
                    let v = Self::load_part(isa, y.as_ptr(), y.len());
                    isa.store_part(x.as_mut_ptr(), v, x.len());
                }
            }
        }
        let spare = ArrayView2::from_shape((rows, cols), &*spare).expect("rows·cols floats");
        transpose(isa, spare, dst);
    }
}

/// Runs the fused forward on f32 tensors (or bf16 ones widened as they are read:
/// [`Widened`]) on the current rayon pool with `isa`'s vectors, returning the
/// output `[B, Hq, L, Ev]` in the inputs' type and the log-sum-exp `[B, Hq, L]`.
///
/// With `dropout` (training's forward) the output is `Σ_j softmax_j · z_j · v_j`
/// with `z` the [`Dropout`] factors, and the log-sum-exp that of the weights before
/// dropout, as the backward expects.
///
/// # Panics
/// If `!supports(p)` (checked by [`crate::attention::attention_with`]).
pub(crate) fn run<T: Widened, KV: Widened>(
    p: &Problem<'_, T, KV>,
    isa: IsaToken,
    dropout: Option<&Dropout>,
) -> (Array4<T>, LogSumExp) {
    let ops = F32Operands {
        p,
        scale: p.scale,
        dropout: dropout.copied(),
    };
    drive(&ops, isa)
}

/// Panels of 16 queries the products hold in registers at once for a unit of `NQ`:
/// all of them where 32 registers hold six keys of four panels (24 accumulators),
/// one at a time on 16-register instruction sets, where a block of six keys of one
/// panel already takes 12 of the 16 (two panels would leave a block three keys deep,
/// each multiply-add waiting on a load of its own).
fn panels_in_registers<I: Simd>(nq: usize) -> usize {
    if I::REGISTERS >= 32 {
        nq
    } else {
        1
    }
}

/// Whether a unit of `nq` panels widens each tile's bf16 keys and values into its
/// scratch before the tile's products, rather than each number as the register
/// tile broadcasts it (a shift and a move into a vector register per broadcast):
/// on 32 registers, where a unit narrower than four panels (causal N512's and
/// N1024's) has each broadcast feed fewer than four products, whose shifts then
/// cost more than one vectorised pass over the tile (docs/bf16.md). On 16
/// registers a unit's tiles are too short for that pass to pay (the bf16 forward
/// widens `k` and `v` once per call there instead).
fn widens_tiles<I: Simd, KV: Widened>(nq: usize) -> bool {
    KV::WIDENS && I::REGISTERS >= 32 && nq < WIDE
}

/// Widens `n` elements from `p`, `step` apart, into `dst`.
///
/// # Safety
/// `p` must be valid for reading the `n` elements, `dst` hold `n` floats.
#[inline(always)]
unsafe fn widen_row<I: Simd, KV: Widened>(
    isa: I,
    (p, step): (*const KV, isize),
    n: usize,
    dst: *mut f32,
) {
    // SAFETY: the caller's contract, vector by vector or element by element.
    unsafe {
        if step != 1 {
            for c in 0..n {
                *dst.add(c) = (*p.offset(c as isize * step)).widen();
            }
            return;
        }
        let mut c = 0;
        while c + LANES <= n {
            isa.store(dst.add(c), KV::load_part(isa, p.add(c), LANES));
            c += LANES;
        }
        if c < n {
            isa.store_part(dst.add(c), KV::load_part(isa, p.add(c), n - c), n - c);
        }
    }
}

/// Runs the register `tile` over the unit's `NQ` panels of queries into `c` (rows
/// `16·NQ` floats apart), `rescale` joining each panel's sums: all panels in one
/// tile, or one panel after another ([`panels_in_registers`]). Every sum runs over
/// the same steps in the same order either way, so the bits are the same.
///
/// # Safety
/// As [`Tile::rows`]'s for `NQ` panels `16` floats apart in `b` and `c`.
#[inline(always)]
unsafe fn over_panels<I: Simd, const MR: usize, const NQ: usize, A: Lhs<f32>>(
    isa: I,
    tile: Tile<f32, A>,
    c: *mut f32,
    rescale: Rescale<'_>,
) {
    let w = NQ * LANES;
    // SAFETY: the caller's guarantees, panel by panel.
    unsafe {
        if panels_in_registers::<I>(NQ) == NQ {
            tile.rows::<I, MR, NQ, _, false>(isa, c, w, rescale);
            return;
        }
        for q in 0..NQ {
            let panel = Tile {
                b: tile.b.add(q * LANES),
                ..tile
            };
            panel.rows::<I, MR, 1, _, false>(isa, c.add(q * LANES), w, rescale.panel(q));
        }
    }
}

/// The problem, with what its units share.
struct F32Operands<'a, 'p, T, KV> {
    p: &'a Problem<'p, T, KV>,
    /// The scores' scale.
    scale: f32,
    dropout: Option<Dropout>,
}

/// A unit: its scaled `Qᵀ` and where its key/value head starts.
struct F32Unit<'s, KV> {
    /// `Qᵀ · scale`, `[E][W]`.
    qt: &'s mut [f32],
    e: usize,
    /// The head's keys and values: base pointer, row and column strides.
    k: (*const KV, isize, isize),
    v: (*const KV, isize, isize),
    /// Where the unit widens each tile's keys `[BK][E]` and values `[BK][Ev]`
    /// ([`widens_tiles`]; empty otherwise), and the tile's first key.
    kw: &'s mut [f32],
    vw: &'s mut [f32],
    j0: usize,
}

impl<'p, T: Widened, KV: Widened> Operands<'p> for F32Operands<'_, 'p, T, KV> {
    type Elem = T;
    type KvElem = KV;
    type Out = T;
    type Unit<'s> = F32Unit<'s, KV>;

    fn problem(&self) -> &Problem<'p, T, KV> {
        self.p
    }

    fn query_vectors(&self, registers: usize) -> usize {
        let nq = query_vectors(self.p);
        if registers >= 32 {
            nq
        } else {
            nq.min(NARROW_UNIT)
        }
    }

    fn scratch_len(d: &Dims, w: usize) -> usize {
        let tiles = if KV::WIDENS {
            BK * (d.head_dim + d.value_dim)
        } else {
            0
        };
        d.head_dim * w * if T::WIDENS { 2 } else { 1 } + tiles
    }

    #[inline(always)]
    fn start<'s, I: Simd, const NQ: usize>(
        &self,
        isa: I,
        at: &UnitAt,
        rest: &mut &'s mut [f32],
    ) -> F32Unit<'s, KV> {
        let w = NQ * LANES;
        let e = self.p.dims().head_dim;
        let qt = carve(rest, e * w);
        let spare = if T::WIDENS {
            carve(rest, e * w)
        } else {
            &mut []
        };
        // Qᵀ times the scores' scale; lanes past the last query are zero.
        let mut view = ArrayViewMut2::from_shape((e, w), &mut *qt).expect("e·w floats");
        view.slice_mut(ndarray::s![.., at.rows..]).fill(0.0);
        T::pack(
            isa,
            self.p
                .q
                .slice(ndarray::s![at.b, at.h, at.i0..at.i0 + at.rows, ..]),
            view.slice_move(ndarray::s![.., ..at.rows]),
            spare,
        );
        let scale = isa.splat(self.scale);
        for x in qt.chunks_exact_mut(LANES) {
            // SAFETY: `x` is one whole vector (`w` is a multiple of 16).
            unsafe { isa.store(x.as_mut_ptr(), isa.mul(isa.load(x.as_ptr()), scale)) };
        }
        let (kw, vw) = if widens_tiles::<I, KV>(NQ) {
            let ev = self.p.dims().value_dim;
            (carve(rest, BK * e), carve(rest, BK * ev))
        } else {
            (&mut [][..], &mut [][..])
        };
        F32Unit {
            qt,
            e,
            k: head_ptr(&self.p.k, at.b, at.kvh),
            v: head_ptr(&self.p.v, at.b, at.kvh),
            kw,
            vw,
            j0: 0,
        }
    }

    #[inline(always)]
    unsafe fn begin_tile<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &mut F32Unit<'_, KV>,
        (j0, j1): (usize, usize),
        _: Stats,
    ) {
        if !widens_tiles::<I, KV>(NQ) {
            return;
        }
        let ((kp, krs, kcs), (vp, vrs, vcs)) = (u.k, u.v);
        let ev = self.p.dims().value_dim;
        u.j0 = j0;
        for j in j0..j1 {
            let r = j - j0;
            // SAFETY: keys and values `j0..j1` are inside the head (a tile has at
            // most `BK` keys), each row `e` or `ev` elements its column stride apart.
            unsafe {
                let (krow, vrow) = (kp.offset(j as isize * krs), vp.offset(j as isize * vrs));
                widen_row(isa, (krow, kcs), u.e, u.kw.as_mut_ptr().add(r * u.e));
                widen_row(isa, (vrow, vcs), ev, u.vw.as_mut_ptr().add(r * ev));
            }
        }
    }

    #[inline(always)]
    unsafe fn weights<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        _: &mut F32Unit<'_, KV>,
        at: &UnitAt,
        (j0, j1): (usize, usize),
        s: *mut f32,
        stats: Stats,
    ) {
        let nk = j1 - j0;
        // SAFETY: the caller upholds `s` and `stats` (see `Operands::weights`).
        unsafe { softmax_tile::<I, NQ>(isa, s, nk, stats) };
        if let Some(dr) = &self.dropout {
            // The running sum `l` above is over the weights before dropout; only
            // the values' weights are dropped (and the kept ones scaled).
            let w = NQ * LANES;
            for ii in 0..at.rows {
                let row = dr.row(at.b, at.h, at.i0 + ii);
                for jj in 0..nk {
                    // SAFETY: `s` holds `nk` rows of `w` floats and `ii < w`.
                    unsafe { *s.add(jj * w + ii) *= dr.factor_in_row(row, j0 + jj) };
                }
            }
        }
    }

    #[inline(always)]
    fn values_finite<I: Simd>(
        &self,
        isa: I,
        u: &F32Unit<'_, KV>,
        (j0, j1): (usize, usize),
    ) -> bool {
        let (vp, vrs, vcs) = u.v;
        let ev = self.p.dims().value_dim;
        // x · 0 + acc: 0 for every finite x, NaN for a NaN or an infinity.
        let zero = isa.splat(0.0);
        let mut acc = zero;
        for j in j0..j1 {
            // SAFETY: value rows `j0..j1` are inside the head (the caller's tile),
            // each `ev` values `vcs` apart.
            unsafe {
                let row = vp.offset(j as isize * vrs);
                if vcs != 1 {
                    let bad = (0..ev).any(|c| !(*row.offset(c as isize * vcs)).widen().is_finite());
                    if bad {
                        return false;
                    }
                    continue;
                }
                let mut c = 0;
                while c + LANES <= ev {
                    acc = isa.fma(KV::load_part(isa, row.add(c), LANES), zero, acc);
                    c += LANES;
                }
                if c < ev {
                    acc = isa.fma(KV::load_part(isa, row.add(c), ev - c), zero, acc);
                }
            }
        }
        !isa.sum(acc).is_nan()
    }

    #[inline(always)]
    unsafe fn value_cols_seen<I: Simd, const NQ: usize>(
        &self,
        _: I,
        u: &F32Unit<'_, KV>,
        (j0, j1): (usize, usize),
        s: *const f32,
        ot: *mut f32,
        alpha: *const f32,
        mask: MaskRows,
    ) {
        let (vp, vrs, vcs) = u.v;
        let w = NQ * LANES;
        let ev = self.p.dims().value_dim;
        // SAFETY: the caller upholds `Operands::value_cols_seen`'s contract: value
        // rows `j0..j1` and every column inside the head, `s` and the mask `j1 − j0`
        // rows, `ot` `ev` rows and `alpha` one, of `w` floats.
        unsafe {
            seen_products(
                (ev, w, j1 - j0),
                ot,
                alpha,
                mask,
                |j, c| (*vp.offset((j0 + j) as isize * vrs + c as isize * vcs)).widen(),
                |j, lane| *s.add(j * w + lane),
            );
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

impl<'p, T: Widened, KV: Widened> RegisterBlocks<'p> for F32Operands<'_, 'p, T, KV> {
    fn register_block<I: Simd, const NQ: usize>(&self) -> usize {
        register_block(I::REGISTERS, panels_in_registers::<I>(NQ))
    }
    #[inline(always)]
    unsafe fn score_rows<I: Simd, const NQ: usize, const MR: usize>(
        &self,
        isa: I,
        u: &F32Unit<'_, KV>,
        j: usize,
        s: *mut f32,
        mask: MaskRows,
    ) {
        let (kp, krs, kcs) = u.k;
        let w = NQ * LANES;
        // Sᵀ = K·Qᵀ: key rows against the query panels, the sum along the keys'
        // columns. SAFETY: keys `j..j + MR` are inside the head (the caller's
        // contract), read through the view's own strides; `qt` holds `e` rows of
        // `16·NQ` floats, `s` (and the mask terms, when there are any) `MR`.
        unsafe {
            if widens_tiles::<I, KV>(NQ) {
                // The tile's keys as `begin_tile` widened them, rows of `e`.
                let tile = Tile {
                    a: u.kw.as_ptr().add((j - u.j0) * u.e),
                    lda: u.e as isize,
                    sa: 1,
                    b: u.qt.as_ptr(),
                    ldb: w,
                    next: LANES,
                    kc: u.e,
                    partial: DOT_CHUNK,
                    ahead: Ahead::NONE,
                };
                over_panels::<I, MR, NQ, f32>(isa, tile, s, Rescale::None);
            } else {
                let tile = Tile {
                    a: kp.offset(j as isize * krs),
                    lda: krs,
                    sa: kcs,
                    b: u.qt.as_ptr(),
                    ldb: w,
                    next: LANES,
                    kc: u.e,
                    partial: DOT_CHUNK,
                    ahead: Ahead::NONE,
                };
                over_panels::<I, MR, NQ, KV>(isa, tile, s, Rescale::None);
            }
            if !mask.is_none() {
                add_mask_terms::<I, NQ, MR>(isa, s, mask);
            }
        }
    }
    #[inline(always)]
    unsafe fn value_cols<I: Simd, const NQ: usize, const MC: usize>(
        &self,
        isa: I,
        u: &F32Unit<'_, KV>,
        (j0, j1): (usize, usize),
        c0: usize,
        s: *const f32,
        ot: *mut f32,
        rescale: Rescale<'_>,
    ) {
        let (vp, vrs, vcs) = u.v;
        let w = NQ * LANES;
        // Oᵀ = α·Oᵀ + Vᵀ·Pᵀ: value columns against the weights' panels, the sum
        // along the keys. SAFETY: value rows `j0..j1` and columns `c0..c0 + MC` are
        // inside the head (the caller's contract), read through the view's own
        // strides; `s` holds `j1 - j0` rows of `16·NQ` weights, `ot` `MC` rows.
        unsafe {
            if widens_tiles::<I, KV>(NQ) {
                // The tile's values as `begin_tile` widened them, rows of `ev`.
                let ev = self.p.dims().value_dim;
                let tile = Tile {
                    a: u.vw.as_ptr().add((j0 - u.j0) * ev + c0),
                    lda: 1,
                    sa: ev as isize,
                    b: s,
                    ldb: w,
                    next: LANES,
                    kc: j1 - j0,
                    partial: SUM_BLOCK,
                    ahead: Ahead::NONE,
                };
                over_panels::<I, MC, NQ, f32>(isa, tile, ot, rescale);
            } else {
                let tile = Tile {
                    a: vp.offset(j0 as isize * vrs + c0 as isize * vcs),
                    lda: vcs,
                    sa: vrs,
                    b: s,
                    ldb: w,
                    next: LANES,
                    kc: j1 - j0,
                    partial: SUM_BLOCK,
                    ahead: Ahead::NONE,
                };
                over_panels::<I, MC, NQ, KV>(isa, tile, ot, rescale);
            }
        }
    }
}

/// `s[r][·] = masked(s[r][·] + mb[r][·])` for `MR` rows of scores of
/// `16·NQ` queries: each score with its mask term ([`masked_score`]).
///
/// # Safety
/// `s` and `mb` must be valid for `MR` rows of `16·NQ` floats.
#[inline(always)]
unsafe fn add_mask_terms<I: Simd, const NQ: usize, const MR: usize>(
    isa: I,
    s: *mut f32,
    mask: MaskRows,
) {
    let w = NQ * LANES;
    for r in 0..MR {
        for v in 0..NQ {
            // SAFETY: row `r < MR`, vector `v < NQ` (the caller's contract).
            unsafe {
                let at = s.add(r * w + v * LANES);
                let term = isa.load(mask.row(r).add(v * LANES));
                isa.store(at, masked_score(isa, isa.load(at), term));
            }
        }
    }
}

/// Online-softmax update for one tile of `nk` keys: updates the
/// running max `m` and sum `l`, turns scores `s` into `e^(s − m)` in place (the
/// difference is exact for the scores that matter, so huge scores lose nothing), and
/// leaves in `alpha` the factor `e^(m_old − m)` that rescales the previous output.
///
/// # Safety
/// `s` valid for `nk` rows of `16·NQ` floats; `m`, `l`, `alpha` for `16·NQ`.
#[inline(always)]
unsafe fn softmax_tile<I: Simd, const NQ: usize>(isa: I, s: *mut f32, nk: usize, stats: Stats) {
    // SAFETY: the caller upholds this function's contract (see # Safety).
    unsafe {
        let w = NQ * LANES;
        let (m_use, alpha) = running_max::<I, NQ>(isa, s, nk, stats.m);
        let mut sum = [isa.splat(0.0); NQ];
        for j in 0..nk {
            for (x, sum) in sum.iter_mut().enumerate() {
                let ptr = s.add(j * w + x * LANES);
                let pj = exp_shifted(isa, isa.load(ptr), m_use[x]);
                isa.store(ptr, pj);
                *sum = isa.add(*sum, pj);
            }
        }
        join_sums::<I, NQ>(isa, sum, alpha, stats);
    }
}
