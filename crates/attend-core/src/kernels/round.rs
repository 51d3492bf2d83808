//! f32 results rounded to bf16 with an instruction set's vectors.

use std::mem::MaybeUninit;

use crate::element::bf16;
use crate::isa::{bf16_bits, Simd, LANES};

/// Writes every element of `dst`: `src` rounded to bf16 (to nearest, ties to even,
/// as `bf16::from_f32`, subnormals kept), sixteen at a time.
///
/// # Panics
/// If the two differ in length.
#[inline(always)]
pub(crate) fn round_into<I: Simd>(isa: I, src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
    assert_eq!(src.len(), dst.len(), "one bf16 per f32");
    let whole = src.len() - src.len() % LANES;
    for (s, d) in src[..whole]
        .chunks_exact(LANES)
        .zip(dst[..whole].chunks_exact_mut(LANES))
    {
        // SAFETY: both chunks are 16 elements (a bf16 is its `u16` bits), and the
        // store only writes.
        unsafe { isa.store_bf16(d.as_mut_ptr().cast(), isa.load(s.as_ptr())) };
    }
    for (s, d) in src[whole..].iter().zip(&mut dst[whole..]) {
        d.write(bf16::from_bits(bf16_bits(*s)));
    }
}
