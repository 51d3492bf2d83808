//! The dense products on AMX tiles ([`Isa::Amx`](crate::isa::Isa::Amx)): int8
//! quads by `tdpbusd` ([`int8`](super::int8)) and bf16 pairs by `tdpbf16ps`
//! ([`bf16`](super::bf16)), 16 rows × 16 outputs × 64 bytes an instruction.
//!
//! Both products' layouts already fit the tiles: a row's 4-byte words (quads or
//! pairs) are 64 bytes a step of the tile's sum, `lda` words apart; a panel's 16
//! word rows of 16 outputs at a step are the 1 KiB a tile of weights holds, in
//! the order the tile multiplies read. So a step is two tile loads of rows, two
//! of panels and four products, for a block of 32 rows × 32 outputs, over the
//! whole depth; the operands then finish each output from its sum ([`OnTiles`]:
//! the int8 dequantization, or the bf16 bias). A depth that is not whole steps
//! of 64 bytes stays on the register tiles.
//!
//! A tile sums at eight times the vector units' rate, so finishing the sums,
//! which costs what it costs after the register tiles, would take most of the
//! time if it ran after each block: tiles are not renamed, so the next block's
//! sums wait for the stores of this one's, and the vector work behind those
//! waits for the tiles. Instead the sums go to one of two buffers, and the block
//! before's are finished from the other a few rows after each step, while the
//! tiles work; the output lines they go to are asked for a block ahead
//! (`prefetchw`).

use std::ops::Range;

use super::{panel_bias, Block, NR};
use crate::isa::amx::{Product, TileBlock, Tiles, TILE_BYTES, TILE_ROWS};
use crate::isa::{Amx, Simd};

/// 4-byte words in one step of a tile's sum.
const STEP_WORDS: usize = TILE_BYTES / 4;

/// Rows a tile of rows may read past the input's last: the packed rows keep
/// that many more, zero, so that a block's last tile needs no rows of its own.
pub(super) const PAD_ROWS: usize = TILE_ROWS;

/// Whether the tiles take a product of `words` 4-byte words a row.
pub(super) fn fits(words: usize) -> bool {
    words > 0 && words.is_multiple_of(STEP_WORDS)
}

/// Operands the tiles multiply: rows of 4-byte words (`PAD_ROWS` more than
/// the input's, zero), panels of 16 outputs in the register tiles' packing, and
/// how an output is finished from its tile sum.
pub(super) trait OnTiles {
    /// The tiles, where the rows were packed for them ([`PAD_ROWS`] more, a
    /// depth that [`fits`]); `None` where the register tiles run instead.
    fn amx(&self) -> Option<Amx>;
    /// The tile multiply.
    const PRODUCT: Product;
    /// A tile sum: `i32` for [`Product::Bytes`], `f32` for [`Product::Pairs`].
    type Sum: Copy;
    /// Zero, to start the sums' buffers.
    const ZERO: Self::Sum;
    /// What finishing needs of one row, made once for all its panels.
    type Row<I: Simd>;
    /// What finishing needs of one panel, made once a call.
    type Panel<I: Simd>;

    /// The rows' words, and the words between rows.
    fn rows(&self) -> (&[u32], usize);
    /// Panel `p`'s words.
    fn panel(&self, p: usize) -> *const u32;
    /// Panel `p`'s finishing, with the bias of its outputs.
    fn finish_panel<I: Simd>(&self, isa: I, p: usize, bias: &[f32; NR]) -> Self::Panel<I>;
    /// Row `r`'s finishing.
    fn finish_row<I: Simd>(&self, isa: I, r: usize) -> Self::Row<I>;
    /// The 16 outputs of `row` and `panel` from their tile `sums`.
    ///
    /// # Safety
    /// `sums` must point to 16 sums of `row`, `panel` must be the operands'.
    unsafe fn finish<I: Simd>(
        &self,
        isa: I,
        row: &Self::Row<I>,
        panel: &Self::Panel<I>,
        sums: *const Self::Sum,
    ) -> I::V;
}

/// A tile block's sums: 32 rows of 32 outputs.
type Sums<S> = [[S; 2 * NR]; 2 * TILE_ROWS];

/// A block of sums: `count` rows from `r` against the `pair` panels from `p`,
/// finished with `panels`.
struct Summed<'d, P> {
    r: usize,
    count: usize,
    p: usize,
    pair: usize,
    panels: &'d [P; 2],
}

impl<P> Summed<'_, P> {
    /// Of the block's rows, those that step `s` of `steps` takes care of.
    fn step_rows(&self, steps: usize, s: usize) -> Range<usize> {
        let per = self.count.div_ceil(steps);
        (s * per).min(self.count)..((s + 1) * per).min(self.count)
    }

    /// Asks for the output lines of the block's rows `rows`, to be written: the
    /// output is megabytes that no cache holds, and a store that waits for its
    /// line holds up the tiles behind it.
    fn claim(&self, rows: Range<usize>, n: usize, out: *mut f32) {
        for i in rows {
            for q in 0..self.pair {
                let line = out.wrapping_add((self.r + i) * n + (self.p + q) * NR);
                // SAFETY: a prefetch reads nothing and cannot fault.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
                    _mm_prefetch::<_MM_HINT_ET0>(line.cast());
                }
            }
        }
    }
}

/// What a tile block's sum needs besides its operands: the tiles, the block
/// itself, the block before it with its sums (to finish meanwhile), and the
/// `[m, n]` output.
struct Sum<'t, 'b, P, S> {
    tiles: &'t Tiles,
    this: &'b Summed<'b, P>,
    before: Option<(&'b Summed<'b, P>, &'b Sums<S>)>,
    n: usize,
    out: *mut f32,
}

/// [`Depth::whole_block`](super::Depth::whole_block) for operands that
/// may take the tiles: the block of the `[m, n]` output at `out`, bias
/// included, on the tiles where the operands have them; false, having written
/// nothing, where they have not.
///
/// # Safety
/// `out` must point to the `[m, n]` output and no other thread may write the
/// block's part of it; the block's rows and panels must be the operands'.
#[inline(always)]
pub(super) unsafe fn whole_block<I: Simd, T: OnTiles>(
    operands: &T,
    isa: I,
    block: &Block,
    n: usize,
    bias: Option<&[f32]>,
    out: *mut f32,
) -> bool {
    let Some(amx) = operands.amx() else {
        return false;
    };
    // SAFETY: the caller's guarantees; operands that have the tiles packed their
    // rows for them (`OnTiles::amx`).
    unsafe { sum_blocks(operands, isa, amx, block, n, bias, out) };
    true
}

/// [`whole_block`] on the tiles of `amx`.
///
/// # Safety
/// As [`whole_block`]'s; the rows must be packed with [`PAD_ROWS`] more and
/// [`fits`] their depth.
#[inline(always)]
unsafe fn sum_blocks<I: Simd, T: OnTiles>(
    operands: &T,
    isa: I,
    amx: Amx,
    Block { rows, panels }: &Block,
    n: usize,
    bias: Option<&[f32]>,
    out: *mut f32,
) {
    let (rows, panels) = (rows.clone(), panels.clone());
    let (x, lda) = operands.rows();
    debug_assert!(fits(lda) && x.len() >= (rows.end + PAD_ROWS) * lda);
    let steps = lda / STEP_WORDS;
    let stride = lda * std::mem::size_of::<u32>();
    let finishing: Vec<[T::Panel<I>; 2]> = panels
        .clone()
        .step_by(2)
        .map(|p| {
            let last = (p + 1).min(panels.end - 1);
            std::array::from_fn(|q| {
                let p = (p + q).min(last);
                operands.finish_panel(isa, p, &panel_bias(bias, n, p))
            })
        })
        .collect();
    // Configured until the end of the block, released when dropped.
    let tiles = amx.tiles();
    // Two buffers: the tiles sum a block into one while the vector units finish
    // the block before from the other, a few rows after each step, so that
    // neither waits for the other.
    let mut buffers: [Sums<T::Sum>; 2] = [[[T::ZERO; 2 * NR]; 2 * TILE_ROWS]; 2];
    let [mut into, mut done] = buffers.each_mut();
    let mut waiting: Option<Summed<'_, T::Panel<I>>> = None;
    // Each pair of panels against every row of the block in turn: the pair
    // (`k / 2` words) stays in L1 while the rows stream from L2, which halves
    // what a step reads from L2 against taking every pair for each row tile.
    for (p, finish) in panels.clone().step_by(2).zip(&finishing) {
        let pair = (panels.end - p).min(2);
        let b = [
            operands.panel(p).cast::<u8>(),
            operands.panel(p + pair - 1).cast::<u8>(),
        ];
        for r in rows.clone().step_by(2 * TILE_ROWS) {
            let count = (rows.end - r).min(2 * TILE_ROWS);
            let a = x[r * lda..].as_ptr().cast::<u8>();
            let this = Summed {
                r,
                count,
                p,
                pair,
                panels: finish,
            };
            let sum = Sum {
                tiles: &tiles,
                this: &this,
                before: waiting.as_ref().map(|block| (block, &*done)),
                n,
                out,
            };
            // SAFETY: the rows from `r` are packed with `PAD_ROWS` more, `steps ·
            // 64` bytes each; each panel is `steps` KiB.
            unsafe {
                match (count > TILE_ROWS, pair == 2) {
                    (true, true) => sum_block(
                        operands,
                        isa,
                        &sum,
                        &tiled::<2, 2>(a, stride, b, steps),
                        into,
                    ),
                    (true, false) => sum_block(
                        operands,
                        isa,
                        &sum,
                        &tiled::<2, 1>(a, stride, [b[0]], steps),
                        into,
                    ),
                    (false, true) => sum_block(
                        operands,
                        isa,
                        &sum,
                        &tiled::<1, 2>(a, stride, b, steps),
                        into,
                    ),
                    (false, false) => sum_block(
                        operands,
                        isa,
                        &sum,
                        &tiled::<1, 1>(a, stride, [b[0]], steps),
                        into,
                    ),
                }
            }
            waiting = Some(this);
            std::mem::swap(&mut into, &mut done);
        }
    }
    if let Some(last) = &waiting {
        // SAFETY: as this function's, for the last block.
        unsafe { finish_rows(operands, isa, last, done, 0..last.count, n, out) };
    }
}

/// The block of `sum` into `into`; after each step, a few of its rows' output
/// lines claimed and as many rows of the block before finished.
///
/// # Safety
/// As [`sum_blocks`]'s, for both blocks.
#[inline(always)]
unsafe fn sum_block<I: Simd, T: OnTiles, const R: usize, const C: usize>(
    operands: &T,
    isa: I,
    sum: &Sum<'_, '_, T::Panel<I>, T::Sum>,
    block: &TileBlock<R, C>,
    into: &mut Sums<T::Sum>,
) {
    let steps = block.steps;
    sum.tiles.zero();
    for s in 0..steps {
        // SAFETY: the caller's guarantees; `s` is a step of the block.
        unsafe { sum.tiles.step(T::PRODUCT, block, s) };
        sum.this.claim(sum.this.step_rows(steps, s), sum.n, sum.out);
        if let Some((before, sums)) = sum.before {
            let rows = before.step_rows(steps, s);
            // SAFETY: the caller's guarantees, for the block before.
            unsafe { finish_rows(operands, isa, before, sums, rows, sum.n, sum.out) };
        }
    }
    sum.tiles.store::<R, C, T::Sum>(into);
}

/// Rows `rows` (of its `count`) of the block `summed`, finished from its `sums`
/// into the `[m, n]` output at `out`.
///
/// # Safety
/// As [`sum_blocks`]'s, for the block's rows and panels.
#[inline(always)]
unsafe fn finish_rows<I: Simd, T: OnTiles>(
    operands: &T,
    isa: I,
    summed: &Summed<'_, T::Panel<I>>,
    sums: &Sums<T::Sum>,
    rows: Range<usize>,
    n: usize,
    out: *mut f32,
) {
    for i in rows {
        let r = summed.r + i;
        let row = operands.finish_row(isa, r);
        for (q, panel) in summed.panels.iter().enumerate().take(summed.pair) {
            let j0 = (summed.p + q) * NR;
            let cols = NR.min(n - j0);
            // SAFETY: 16 sums of the row's 32; the panel is whole; the output
            // row `r` is the block's, `cols` wide from `j0`.
            unsafe {
                let y = operands.finish(isa, &row, panel, sums[i][q * NR..].as_ptr());
                let at = out.add(r * n + j0);
                if cols == NR {
                    isa.store(at, y);
                } else {
                    let mut whole = [0.0f32; NR];
                    isa.store(whole.as_mut_ptr(), y);
                    std::ptr::copy_nonoverlapping(whole.as_ptr(), at, cols);
                }
            }
        }
    }
}

/// A tile block of `16·R` rows from `rows` against panels `panels`.
fn tiled<const R: usize, const C: usize>(
    rows: *const u8,
    stride: usize,
    panels: [*const u8; C],
    steps: usize,
) -> TileBlock<R, C> {
    TileBlock {
        rows,
        stride,
        panels,
        panel_stride: TILE_BYTES,
        steps,
    }
}
