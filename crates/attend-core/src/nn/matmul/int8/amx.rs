//! The int8 product on AMX tiles ([`Isa::Amx`](crate::isa::Isa::Amx)): the same
//! quantized rows and packed weight as the register tiles, multiplied 16 rows ×
//! 16 outputs × 64 bytes a `tdpbusd` ([`super::super::amx`]). The layouts
//! already fit: a row's quads are 64 bytes a step of the tile's sum, and a
//! panel's 16 quad rows of 16 outputs at a step are the 1 KiB a tile of weights
//! holds, in the pairs-of-four order `tdpbusd` reads. The sums (exact i32, as
//! `vpdpbusd`'s) go through the register tile's own dequantization.

use super::{Dequantize, QuadOperands, Row, NR};
use crate::isa::amx::Product;
use crate::isa::{Amx, Simd};
use crate::nn::matmul::amx::OnTiles;

impl OnTiles for QuadOperands<'_> {
    /// `linear_int8_on` quantizes the rows for the tiles exactly where it sets
    /// `amx`.
    fn amx(&self) -> Option<Amx> {
        self.amx
    }

    const PRODUCT: Product = Product::Bytes;
    type Sum = i32;
    const ZERO: i32 = 0;
    type Row<I: Simd> = Row<I>;
    type Panel<I: Simd> = Dequantize<I>;

    fn rows(&self) -> (&[u32], usize) {
        (&self.x.quads, self.x.lda)
    }

    fn panel(&self, p: usize) -> *const u32 {
        self.w.data[p * self.x.lda * NR..].as_ptr()
    }

    #[inline(always)]
    fn finish_panel<I: Simd>(&self, isa: I, p: usize, bias: &[f32; NR]) -> Dequantize<I> {
        Dequantize::new(isa, self.w, p * NR, self.panel(p), bias)
    }

    #[inline(always)]
    fn finish_row<I: Simd>(&self, isa: I, r: usize) -> Row<I> {
        self.row(isa, r)
    }

    #[inline(always)]
    unsafe fn finish<I: Simd>(
        &self,
        isa: I,
        row: &Row<I>,
        panel: &Dequantize<I>,
        sums: *const i32,
    ) -> I::V {
        // SAFETY: the caller's guarantee: 16 sums, and the operands' panel.
        unsafe {
            let acc = isa.load_pairs(sums.cast());
            self.dequantize::<I, false>(isa, panel, row, acc)
        }
    }
}
