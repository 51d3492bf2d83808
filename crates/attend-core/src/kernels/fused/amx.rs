//! The fused forward on bf16 tensors on AMX tiles (`tdpbf16ps`): the bf16
//! kernel's units, queries in pairs and weights in pairs (`kernels::fused::bf16`),
//! with both products taken 16 × 16 outputs at a time by the tiles instead of
//! `vdpbf16ps`, which Intel's cores run no faster than two f32 FMAs.
//!
//! A tile product `C[i][x] += Σ A[i][2t..2t+2] · B[t][x][0..2]` sums its rows of
//! `A` against pairs along the sum in `B`, so:
//!
//! * `Sᵀ = K Qᵀ`: `A` is 16 keys' rows, 32 elements of the head width a step
//!   (the call's keys packed once, with zero rows past the last key, so a block of
//!   32 keys never reads past them); `B` is the unit's `Qᵀ` in pairs of columns,
//!   exactly as the bf16 kernel packs it, `[E/2][W]`;
//! * `Oᵀ = Vᵀ Pᵀ`: `A` is 16 value columns' rows, 32 keys a step (the call's
//!   values transposed once, `Vᵀ`, with zero columns past the last key); `B` is the
//!   tile's weights in pairs of keys, `[BK/2][W]`, as the bf16 kernel's softmax
//!   writes them, zero past the tile's last pair.
//!
//! A block's last step may run past the tile's keys, by less than 32: those keys'
//! scores are never read, and their weights are zero. A zero weight times an
//! infinite or NaN value is NaN, so the tiles take only calls whose values are all
//! finite; the others run the bf16 kernel's vectors. The head width must be a whole
//! number of steps (32); the value width may be any, its last block's extra rows
//! being zero.
//!
//! The tiles add each step's 32 products in an order of their own and take
//! subnormal inputs as zero ([`Product::Pairs`]); the sums are f32 as in the bf16
//! kernel, whose error bound (docs/bf16.md) covers both.

use std::marker::PhantomData;

use ndarray::{s, Array4};
use rayon::prelude::*;

use super::bf16::{as_words, pack_query_pairs, pairs, seen_pair_products, softmax_pairs};
use super::{drive, masked_score, query_vectors, MaskRows, Operands, Stats, UnitAt, BK};
use crate::element::bf16;
use crate::isa::amx::{Amx, Product, TileBlock, Tiles, TILE_BYTES};
use crate::isa::{IsaToken, Simd, LANES};
use crate::kernels::lse::LogSumExp;
use crate::kernels::scratch::carve;
use crate::kernels::tile::Rescale;
use crate::problem::{Dims, Problem};

/// Elements of bf16 one tile step sums over: a tile row of 64 bytes.
const STEP: usize = 32;

/// Floats of one block of tile sums, 32 rows × 32 outputs ([`Block::sum`]).
const SUMS: usize = 32 * 32;

/// Whether the tiles take this problem: AMX, and a head width of whole steps.
pub(crate) fn takes<Q, KV>(p: &Problem<'_, Q, KV>, isa: IsaToken) -> Option<Amx> {
    let e = p.dims().head_dim;
    isa.amx().filter(|_| e > 0 && e.is_multiple_of(STEP))
}

/// Runs the forward on the tiles, on the current rayon pool, returning the output
/// `[B, Hq, L, Ev]` (rounded to bf16 once) and the log-sum-exp `[B, Hq, L]`; or
/// `None` where a value is not finite (see the module's docs).
///
/// # Panics
/// If `takes(p, isa)` is not `Some(amx)`, or `!supports(p)`.
pub(crate) fn run(
    p: &Problem<'_, bf16>,
    amx: Amx,
    isa: IsaToken,
) -> Option<(Array4<bf16>, LogSumExp)> {
    assert!(
        p.dims().head_dim.is_multiple_of(STEP),
        "tiles need whole steps"
    );
    let values = ValueColumns::new(p)?;
    let ops = AmxOperands {
        p,
        amx,
        keys: KeyRows::new(p),
        values,
    };
    Some(drive(&ops, isa))
}

/// The call's keys, every head's rows of `E` bf16 packed back to back with
/// [`STEP`] zero rows after its last key, `[B·Hkv][S + 32][E]`.
struct KeyRows {
    data: Vec<u16>,
    /// Elements per head.
    head: usize,
}

impl KeyRows {
    fn new(p: &Problem<'_, bf16>) -> Self {
        let d = p.dims();
        let head = (d.kv_len + STEP) * d.head_dim;
        let mut data = vec![0u16; d.batch * d.kv_heads * head];
        data.par_chunks_mut(head).enumerate().for_each(|(bh, dst)| {
            let k = p.k.slice(s![bh / d.kv_heads, bh % d.kv_heads, .., ..]);
            for (row, dst) in k.rows().into_iter().zip(dst.chunks_exact_mut(d.head_dim)) {
                match row.as_slice() {
                    // SAFETY: bf16 is a u16 of the same bits; `row` and `dst` hold
                    // `e` elements each.
                    Some(row) => unsafe {
                        let src = row.as_ptr().cast::<u16>();
                        std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), row.len());
                    },
                    None => dst.iter_mut().zip(row).for_each(|(d, x)| *d = x.to_bits()),
                }
            }
        });
        KeyRows { data, head }
    }
}

/// The call's values transposed, every head's `Vᵀ`: rows of one value column over
/// the keys, with at least [`STEP`] zero keys after the last, and zero rows up to
/// a whole number of tiles of columns, `[B·Hkv][Ev rounded up to 32][row]`.
struct ValueColumns {
    data: Vec<u16>,
    /// Elements per head, and per row (`S + 32` rounded up to 32).
    head: usize,
    row: usize,
}

/// Keys and columns a block of the transpose moves: 32 × 32 bf16 stay in the L1
/// cache on both sides.
const TRANSPOSE_BLOCK: usize = 32;

impl ValueColumns {
    /// The transposed values, or `None` if one of them is not finite.
    fn new(p: &Problem<'_, bf16>) -> Option<Self> {
        let d = p.dims();
        let row = (d.kv_len + STEP).next_multiple_of(STEP);
        let head = d.value_dim.next_multiple_of(2 * LANES) * row;
        let mut data = vec![0u16; d.batch * d.kv_heads * head];
        let finite = data.par_chunks_mut(head).enumerate().all(|(bh, dst)| {
            let v = p.v.slice(s![bh / d.kv_heads, bh % d.kv_heads, .., ..]);
            let (rs, cs) = (v.strides()[0], v.strides()[1]);
            let base = v.as_ptr() as *const u16;
            let at = dst.as_mut_ptr();
            let mut finite = true;
            for j0 in (0..d.kv_len).step_by(TRANSPOSE_BLOCK) {
                let keys = j0..(j0 + TRANSPOSE_BLOCK).min(d.kv_len);
                for c0 in (0..d.value_dim).step_by(TRANSPOSE_BLOCK) {
                    let cols = c0..(c0 + TRANSPOSE_BLOCK).min(d.value_dim);
                    for j in keys.clone() {
                        for c in cols.clone() {
                            // SAFETY: `(j, c)` is inside the head's view, and `dst`
                            // holds `Ev ≤ c` rows of `row > j` elements.
                            unsafe {
                                let x = *base.offset(j as isize * rs + c as isize * cs);
                                // Every exponent bit set: an infinity or a NaN.
                                finite &= x & 0x7f80 != 0x7f80;
                                *at.add(c * row + j) = x;
                            }
                        }
                    }
                }
            }
            finite
        });
        finite.then_some(ValueColumns { data, head, row })
    }
}

/// The problem on tiles, with what its units share.
struct AmxOperands<'a, 'p> {
    p: &'a Problem<'p, bf16>,
    amx: Amx,
    keys: KeyRows,
    values: ValueColumns,
}

/// A unit: its packed queries, the tile's weights in pairs, a block of sums, its
/// head's packed keys and values, and the tiles configured for its thread.
struct AmxUnit<'s> {
    /// `Qᵀ` as pairs of columns, `[E/2][W]`.
    qp: *const u32,
    /// The tile's weights as pairs of keys, `[BK/2][W]`.
    pp: *mut u32,
    /// One block of tile sums, `[32][32]`.
    sums: *mut f32,
    /// The head's key rows ([`KeyRows`]) and value columns ([`ValueColumns`]).
    k: *const u16,
    vt: *const u16,
    tiles: Tiles,
    /// The pointers above into the unit's scratch are borrowed from it.
    scratch: PhantomData<&'s mut [f32]>,
}

impl<'p> Operands<'p> for AmxOperands<'_, 'p> {
    type Elem = bf16;
    type KvElem = bf16;
    type Out = bf16;
    type Unit<'s> = AmxUnit<'s>;

    fn problem(&self) -> &Problem<'p, bf16> {
        self.p
    }

    fn query_vectors(&self, _: usize) -> usize {
        query_vectors(self.p)
    }

    fn scratch_len(d: &Dims, w: usize) -> usize {
        2 * pairs(d.head_dim) * w + pairs(BK) * w + SUMS
    }

    #[inline(always)]
    fn start<'s, I: Simd, const NQ: usize>(
        &self,
        isa: I,
        at: &UnitAt,
        rest: &mut &'s mut [f32],
    ) -> AmxUnit<'s> {
        let w = NQ * LANES;
        let np = pairs(self.p.dims().head_dim);
        let qp = carve(rest, np * w);
        let rows = carve(rest, np * w);
        let pp = as_words(carve(rest, pairs(BK) * w)).as_mut_ptr();
        let sums = carve(rest, SUMS).as_mut_ptr();
        pack_query_pairs(isa, self.p, at, (&mut *qp, rows), w);
        let bh = at.b * self.p.dims().kv_heads + at.kvh;
        AmxUnit {
            qp: as_words(qp).as_ptr(),
            pp,
            sums,
            k: self.keys.data[bh * self.keys.head..].as_ptr(),
            vt: self.values.data[bh * self.values.head..].as_ptr(),
            tiles: self.amx.tiles(),
            scratch: PhantomData,
        }
    }

    /// Blocks of 32 keys against 32 queries (16 for a unit of one vector), written
    /// straight into `s`; then scaled and masked as the bf16 kernel's scores.
    #[inline(always)]
    unsafe fn score_tile<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &AmxUnit<'_>,
        (j0, j1): (usize, usize),
        s: *mut f32,
        mask: MaskRows,
    ) {
        let w = NQ * LANES;
        let e = self.p.dims().head_dim;
        let nk = j1 - j0;
        let d = self.p.dims();
        // The next tile's keys and this tile's value columns, asked for in the L1
        // cache while the products run: a tile load that misses it waits for
        // each line in turn.
        let next = j1..(j1 + BK).min(d.kv_len);
        prefetch_lines(u.k.wrapping_add(next.start * e), next.len() * e * 2, 1, 0);
        prefetch_lines(
            u.vt.wrapping_add(j0),
            nk * 2,
            d.value_dim,
            self.values.row * 2,
        );
        // SAFETY: the keys' rows hold `S + 32` rows of `e` bf16, so 32 rows from
        // any key of the tile; `qp` holds `e/2` rows of `w` pairs; `s` holds `BK`
        // rows of `w` floats, a multiple of 32 at least `nk`, and `mask` (unless
        // none) `nk` rows (the caller's contract).
        unsafe {
            for r0 in (0..nk).step_by(2 * LANES) {
                let rows = u.k.add((j0 + r0) * e).cast::<u8>();
                for x0 in (0..NQ).step_by(2) {
                    let block = Block {
                        rows: (rows, e * 2),
                        panels: (u.qp.add(x0 * LANES).cast::<u8>(), w * 4),
                        steps: e / STEP,
                    };
                    let out = s.add(r0 * w + x0 * LANES);
                    if NQ == 1 {
                        block.sum::<1>(&u.tiles, out, w);
                    } else {
                        block.sum::<2>(&u.tiles, out, w);
                    }
                }
            }
            let scale = isa.splat(self.p.scale);
            for r in 0..nk {
                for x in 0..NQ {
                    let at = s.add(r * w + x * LANES);
                    let mut val = isa.mul(isa.load(at), scale);
                    if !mask.is_none() {
                        val = masked_score(isa, val, isa.load(mask.row(r).add(x * LANES)));
                    }
                    isa.store(at, val);
                }
            }
        }
    }

    /// The bf16 kernel's softmax into pairs, with the pairs past the tile's last
    /// cleared up to the block's 32 keys.
    #[inline(always)]
    unsafe fn weights<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &mut AmxUnit<'_>,
        _: &UnitAt,
        (j0, j1): (usize, usize),
        s: *mut f32,
        stats: Stats,
    ) {
        let (w, nk) = (NQ * LANES, j1 - j0);
        // SAFETY: `pp` holds `BK/2` rows of `w` pairs, and `BK` is a multiple of
        // 32 at least `nk`; the caller upholds `s` and `stats`.
        unsafe {
            softmax_pairs::<I, NQ>(isa, s, nk, u.pp, stats);
            let (used, block) = (pairs(nk), nk.next_multiple_of(2 * LANES) / 2);
            std::ptr::write_bytes(u.pp.add(used * w), 0, (block - used) * w);
        }
    }

    /// Always: the calls with a value that is not finite do not reach the tiles.
    fn values_finite<I: Simd>(&self, _: I, _: &AmxUnit<'_>, _: (usize, usize)) -> bool {
        true
    }

    /// The bf16 kernel's exact path; the driver never takes it here, since
    /// [`Operands::values_finite`] is always true on the tiles.
    #[inline(always)]
    unsafe fn value_cols_seen<I: Simd, const NQ: usize>(
        &self,
        _: I,
        u: &AmxUnit<'_>,
        (j0, j1): (usize, usize),
        _: *const f32,
        ot: *mut f32,
        alpha: *const f32,
        mask: MaskRows,
    ) {
        let (ev, row) = (self.p.dims().value_dim, self.values.row);
        // The values from their transposed copy: value `(j, c)` at `c · row + j`.
        let values = ((u.vt, 1, row as isize), ev);
        // SAFETY: the caller upholds `Operands::value_cols_seen`'s contract; `pp`
        // holds the tile's weights (the last `weights` call), `vt` the head's values.
        unsafe { seen_pair_products(values, u.pp, NQ * LANES, (j0, j1), ot, alpha, mask) }
    }

    /// Blocks of 32 value columns against 32 queries (16 for a unit of one
    /// vector), summed into [`AmxUnit::sums`] and joined to `Oᵀ` from there.
    #[inline(always)]
    unsafe fn value_tile<I: Simd, const NQ: usize>(
        &self,
        isa: I,
        u: &AmxUnit<'_>,
        (j0, j1): (usize, usize),
        _: *const f32,
        ot: *mut f32,
        rescale: Rescale<'_>,
    ) {
        let w = NQ * LANES;
        let ev = self.p.dims().value_dim;
        let row = self.values.row;
        let steps = (j1 - j0).div_ceil(STEP);
        // SAFETY: the value columns hold whole blocks of 32 rows, each with at
        // least 32 keys past the tile's last; `pp` holds `steps · 16` rows of `w`
        // pairs (`weights` cleared those past the tile); `sums` holds 32 rows of
        // 32 floats and `ot` `ev` rows of `w` (the caller's contract).
        unsafe {
            for c0 in (0..ev).step_by(2 * LANES) {
                let rows = u.vt.add(c0 * row + j0).cast::<u8>();
                let cols = (ev - c0).min(2 * LANES);
                for x0 in (0..NQ).step_by(2) {
                    let block = Block {
                        rows: (rows, row * 2),
                        panels: (u.pp.add(x0 * LANES).cast_const().cast::<u8>(), w * 4),
                        steps,
                    };
                    let nx = NQ.min(2);
                    if nx == 1 {
                        block.sum::<1>(&u.tiles, u.sums, 2 * LANES);
                    } else {
                        block.sum::<2>(&u.tiles, u.sums, 2 * LANES);
                    }
                    for c in 0..cols {
                        for x in 0..nx {
                            let sum = isa.load(u.sums.add(c * 2 * LANES + x * LANES));
                            let at = ot.add((c0 + c) * w + (x0 + x) * LANES);
                            let val = match rescale {
                                Rescale::None => sum,
                                Rescale::By(alpha) => {
                                    isa.fma(isa.load(at), isa.load(alpha[x0 + x].as_ptr()), sum)
                                }
                                Rescale::Add => isa.add(isa.load(at), sum),
                            };
                            isa.store(at, val);
                        }
                    }
                }
            }
        }
    }
}

/// Asks for `rows` runs of `bytes` bytes, `stride` bytes apart from `first`, in
/// the L1 cache.
#[inline(always)]
fn prefetch_lines(first: *const u16, bytes: usize, rows: usize, stride: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let first = first.cast::<u8>();
    for r in 0..rows {
        for at in (0..bytes).step_by(64) {
            // SAFETY: a prefetch never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(r * stride + at).cast()) };
        }
    }
}

/// One block of 32 rows against panels of 16 outputs, side by side.
struct Block {
    /// The first row and the bytes between rows.
    rows: (*const u8, usize),
    /// The first panel's first row and the bytes between its rows; the next
    /// panel starts 64 bytes after it.
    panels: (*const u8, usize),
    /// Steps of 64 bytes.
    steps: usize,
}

impl Block {
    /// The block's sums against `C` panels, from zero over its steps, stored at
    /// `out`, rows `row_len` floats apart.
    ///
    /// # Safety
    /// As [`Tiles::step`]'s for every step, and `out` writable for 32 rows of
    /// `16·C` floats `row_len` apart.
    #[inline(always)]
    unsafe fn sum<const C: usize>(&self, tiles: &Tiles, out: *mut f32, row_len: usize) {
        let block = TileBlock::<2, C> {
            rows: self.rows.0,
            stride: self.rows.1,
            panels: std::array::from_fn(|x| self.panels.0.wrapping_add(x * TILE_BYTES)),
            panel_stride: self.panels.1,
            steps: self.steps,
        };
        tiles.zero();
        // SAFETY: the caller upholds this function's contract (see # Safety).
        unsafe {
            for step in 0..self.steps {
                tiles.step(Product::Pairs, &block, step);
            }
            tiles.store_rows::<2, C, f32>(out, row_len);
        }
    }
}
