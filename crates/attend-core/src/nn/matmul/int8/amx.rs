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

use std::ops::Range;

use super::{panel_bias, Dequantize, QuadOperands, NR};
use crate::isa::amx::{BytePanels, TILE_BYTES, TILE_ROWS};
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
        // Configured until the end of the block, released when dropped.
        let tiles = amx.tiles();
        let mut sums = [[0i32; 2 * NR]; 2 * TILE_ROWS];
        let panel = |p: usize| w.data[p * lda * NR..].as_ptr();
        // Each pair of panels against every row of the block in turn: the pair
        // (`k / 2` bytes) stays in L1 while the rows stream from L2, which halves
        // what a step reads from L2 against taking every pair for each row tile.
        for p in panels.clone().step_by(2) {
            let pair = (panels.end - p).min(2);
            let b = [panel(p).cast::<u8>(), panel(p + pair - 1).cast::<u8>()];
            let dequantize: [_; 2] = std::array::from_fn(|q| {
                let p = (p + q).min(p + pair - 1);
                Dequantize::new(isa, w, p * NR, panel(p), &panel_bias(bias, n, p))
            });
            for r in rows.clone().step_by(2 * TILE_ROWS) {
                let count = (rows.end - r).min(2 * TILE_ROWS);
                let a = self.x.quads[r * lda..].as_ptr().cast::<u8>();
                // SAFETY: the rows from `r` are quantized with `PAD_ROWS` more,
                // `steps · 64` bytes each; each panel is `steps` KiB.
                unsafe {
                    match (count > TILE_ROWS, pair == 2) {
                        (true, true) => tiles.dot4(&block::<2, 2>(a, stride, b, steps), &mut sums),
                        (true, false) => {
                            tiles.dot4(&block::<2, 1>(a, stride, [b[0]], steps), &mut sums)
                        }
                        (false, true) => tiles.dot4(&block::<1, 2>(a, stride, b, steps), &mut sums),
                        (false, false) => {
                            tiles.dot4(&block::<1, 1>(a, stride, [b[0]], steps), &mut sums)
                        }
                    }
                }
                for (q, panel) in dequantize.iter().enumerate().take(pair) {
                    let j0 = panel.j0;
                    let cols = NR.min(n - j0);
                    for (i, row) in sums[..count].iter().enumerate() {
                        // SAFETY: 16 sums of the row's 32; the panel is whole; the
                        // output row `r + i` is the block's, `cols` wide from `j0`.
                        unsafe {
                            let acc = isa.load_pairs(row[q * NR..].as_ptr().cast());
                            let y = self.dequantize::<I, false>(isa, panel, acc, r + i);
                            let at = out.add((r + i) * n + j0);
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
