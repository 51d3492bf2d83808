//! bf16 numbers as their bits, in scalar code: the rounding every [`Simd::pack_bf16`](crate::Simd::pack_bf16)
//! follows lane by lane, and the exact widening.

/// The bits of `x` rounded to bf16: to nearest, ties to even, overflowing to ±∞; a
/// NaN stays a (quiet) NaN. The same as `half::bf16::from_f32` and PyTorch's
/// `tensor.to(torch.bfloat16)`, and what every [`Simd::pack_bf16`](crate::Simd::pack_bf16) computes lane by
/// lane.
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7FFF + lsb) >> 16) as u16
}

/// `x`'s bits widened from bf16 to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}
