//! The int8 product on AMX tiles ([`Isa::Amx`](crate::isa::Isa::Amx)): the same
//! quantized rows and packed weight as the register tiles, multiplied 16 rows ×
//! 16 outputs × 64 bytes a `tdpbusd`.
//!
//! The layouts already fit: a row's quads are 64 bytes a step of the tile's sum,
//! `lda` quads apart; a panel's 16 quad rows of 16 outputs at a step are the 1 KiB
//! a tile of weights holds, in the pairs-of-four order `tdpbusd` reads. So a step
//! is two tile loads of rows, two of panels and four products, for a block of 32
//! rows × 32 outputs, and the sums (exact i32, as `vpdpbusd`'s) go through the
//! register tile's own dequantization. A depth that is not whole steps of 64 bytes
//! stays on the register tiles.
//!
//! A tile sums at eight times `vpdpbusd`'s rate, so the dequantization, which
//! costs the same as on the register tiles, would take most of the time if it
//! ran after each block: tiles are not renamed, so the next block's sums wait
//! for the stores of this one's, and the vector work behind those waits for the
//! tiles. Instead the sums go to one of two buffers, and the block before's are
//! dequantized from the other a few rows after each step, while the tiles work;
//! the output lines they go to are asked for a block ahead (`prefetchw`).

use std::ops::Range;

use super::{panel_bias, Dequantize, QuadOperands, NR};
use crate::isa::amx::{BytePanels, Tiles, TILE_BYTES, TILE_ROWS};
use crate::isa::{Amx, Simd};

/// Quads in one step of a tile's sum.
const STEP_QUADS: usize = TILE_BYTES / 4;

/// Rows a tile of rows may read past the input's last: the quantized rows keep
/// that many more, zero, so that a block's last tile needs no rows of its own.
pub(super) const PAD_ROWS: usize = TILE_ROWS;

/// Whether the tiles take a product of `quads` quads a row.
pub(super) fn fits(quads: usize) -> bool {
    quads > 0 && quads.is_multiple_of(STEP_QUADS)
}

/// What a tile block's sum needs besides its operands: the tiles, the block
/// itself, the block before it with its sums (to dequantize meanwhile), and the
/// `[m, n]` output.
struct Sum<'t, 'b, I: Simd> {
    tiles: &'t Tiles,
    this: &'b Summed<'b, I>,
    before: Option<(&'b Summed<'b, I>, &'b Sums)>,
    n: usize,
    out: *mut f32,
}

/// A tile block's sums: 32 rows of 32 outputs.
type Sums = [[i32; 2 * NR]; 2 * TILE_ROWS];

/// A block of sums: `count` rows from `r` against the panels of `panels`,
/// `pair` of them whole.
struct Summed<'d, I: Simd> {
    r: usize,
    count: usize,
    pair: usize,
    panels: &'d [Dequantize<I>; 2],
}

impl<I: Simd> Summed<'_, I> {
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
            for panel in &self.panels[..self.pair] {
                let line = out.wrapping_add((self.r + i) * n + panel.j0);
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

impl QuadOperands<'_> {
    /// Rows `rows` × panels `panels` of the `[m, n]` output at `out`, bias
    /// included, on the tiles of `amx`.
    ///
    /// # Safety
    /// `out` must point to the `[m, n]` output and no other thread may write the
    /// block's part of it; the rows and panels must be the operands'; the rows
    /// must be quantized with [`PAD_ROWS`] more and [`fits`] their depth.
    #[inline(always)]
    pub(super) unsafe fn amx_block<I: Simd>(
        &self,
        isa: I,
        amx: Amx,
        (rows, panels): (Range<usize>, Range<usize>),
        n: usize,
        bias: Option<&[f32]>,
        out: *mut f32,
    ) {
        let (lda, w) = (self.x.lda, self.w);
        debug_assert!(fits(lda) && self.x.quads.len() >= (rows.end + PAD_ROWS) * lda);
        let steps = lda / STEP_QUADS;
        let stride = lda * std::mem::size_of::<u32>();
        let panel = |p: usize| w.data[p * lda * NR..].as_ptr();
        let pairs: Vec<[Dequantize<I>; 2]> = panels
            .clone()
            .step_by(2)
            .map(|p| {
                let last = (p + 1).min(panels.end - 1);
                std::array::from_fn(|q| {
                    let p = (p + q).min(last);
                    Dequantize::new(isa, w, p * NR, panel(p), &panel_bias(bias, n, p))
                })
            })
            .collect();
        // Configured until the end of the block, released when dropped.
        let tiles = amx.tiles();
        // Two buffers: the tiles sum a block into one while the vector units
        // dequantize the block before from the other, a few rows after each
        // step, so that neither waits for the other.
        let mut buffers: [Sums; 2] = [[[0; 2 * NR]; 2 * TILE_ROWS]; 2];
        let [mut into, mut done] = buffers.each_mut();
        let mut waiting: Option<Summed<'_, I>> = None;
        // Each pair of panels against every row of the block in turn: the pair
        // (`k / 2` bytes) stays in L1 while the rows stream from L2, which halves
        // what a step reads from L2 against taking every pair for each row tile.
        for (p, dequantize) in panels.clone().step_by(2).zip(&pairs) {
            let pair = (panels.end - p).min(2);
            let b = [panel(p).cast::<u8>(), panel(p + pair - 1).cast::<u8>()];
            for r in rows.clone().step_by(2 * TILE_ROWS) {
                let count = (rows.end - r).min(2 * TILE_ROWS);
                let a = self.x.quads[r * lda..].as_ptr().cast::<u8>();
                let this = Summed {
                    r,
                    count,
                    pair,
                    panels: dequantize,
                };
                let sum = Sum {
                    tiles: &tiles,
                    this: &this,
                    before: waiting.as_ref().map(|block| (block, &*done)),
                    n,
                    out,
                };
                // SAFETY: the rows from `r` are quantized with `PAD_ROWS` more,
                // `steps · 64` bytes each; each panel is `steps` KiB.
                unsafe {
                    match (count > TILE_ROWS, pair == 2) {
                        (true, true) => {
                            self.sum(isa, &sum, &block::<2, 2>(a, stride, b, steps), into)
                        }
                        (true, false) => {
                            self.sum(isa, &sum, &block::<2, 1>(a, stride, [b[0]], steps), into)
                        }
                        (false, true) => {
                            self.sum(isa, &sum, &block::<1, 2>(a, stride, b, steps), into)
                        }
                        (false, false) => {
                            self.sum(isa, &sum, &block::<1, 1>(a, stride, [b[0]], steps), into)
                        }
                    }
                }
                waiting = Some(this);
                std::mem::swap(&mut into, &mut done);
            }
        }
        if let Some(last) = &waiting {
            // SAFETY: as this function's, for the last block.
            unsafe { self.dequantize_rows(isa, last, done, 0..last.count, n, out) };
        }
    }

    /// `block`'s sums into `into`; after each step, a few of its rows' output
    /// lines claimed and as many rows of the block before dequantized.
    ///
    /// # Safety
    /// As [`amx_block`](Self::amx_block)'s, for both blocks.
    #[inline(always)]
    unsafe fn sum<I: Simd, const R: usize, const C: usize>(
        &self,
        isa: I,
        sum: &Sum<'_, '_, I>,
        block: &BytePanels<R, C>,
        into: &mut Sums,
    ) {
        let steps = block.steps;
        sum.tiles.zero();
        for s in 0..steps {
            // SAFETY: the caller's guarantees; `s` is a step of the block.
            unsafe { sum.tiles.step(block, s) };
            sum.this.claim(sum.this.step_rows(steps, s), sum.n, sum.out);
            if let Some((before, sums)) = sum.before {
                let rows = before.step_rows(steps, s);
                // SAFETY: the caller's guarantees, for the block before.
                unsafe { self.dequantize_rows(isa, before, sums, rows, sum.n, sum.out) };
            }
        }
        sum.tiles.store::<R, C>(into);
    }

    /// Rows `rows` (of its `count`) of the block `summed`, dequantized from its
    /// `sums` into the `[m, n]` output at `out`, bias included.
    ///
    /// # Safety
    /// As [`amx_block`](Self::amx_block)'s, for the block's rows and panels.
    #[inline(always)]
    unsafe fn dequantize_rows<I: Simd>(
        &self,
        isa: I,
        summed: &Summed<'_, I>,
        sums: &Sums,
        rows: Range<usize>,
        n: usize,
        out: *mut f32,
    ) {
        for i in rows {
            let r = summed.r + i;
            let row = self.row(isa, r);
            for (q, panel) in summed.panels.iter().enumerate().take(summed.pair) {
                let (j0, cols) = (panel.j0, NR.min(n - panel.j0));
                // SAFETY: 16 sums of the row's 32; the panel is whole; the output
                // row `r` is the block's, `cols` wide from `j0`.
                unsafe {
                    let acc = isa.load_pairs(sums[i][q * NR..].as_ptr().cast());
                    let y = self.dequantize::<I, false>(isa, panel, &row, acc);
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
}

/// A tile block of `16·R` rows from `rows` against panels `panels`.
fn block<const R: usize, const C: usize>(
    rows: *const u8,
    stride: usize,
    panels: [*const u8; C],
    steps: usize,
) -> BytePanels<R, C> {
    BytePanels {
        rows,
        stride,
        panels,
        steps,
    }
}
