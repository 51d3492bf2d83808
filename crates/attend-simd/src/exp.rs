//! `e^x` in scalar f32 code without branches or calls into libm: the polynomial
//! and reduction the portable and AVX2 [`Simd::exp`](crate::Simd::exp) follow lane
//! by lane, the table and short polynomial of the AVX-512 one, and an
//! `e^x` for loops that [`multiversion!`](crate::multiversion) compiles for each
//! instruction set.

/// `2^f` on `f ∈ [−½, ½]` to degree 6, highest last: `1 + f·g(f)` with `g` a
/// relative-error-weighted Chebyshev fit of `(2^f − 1)/f`, rounded to f32. Evaluated
/// by Horner's rule in f32 fused multiply-adds, its worst relative error over the
/// interval is 8.0e−8 (0.67 ulp), against 7.2e−8 (0.60 ulp) for the degree-7 Taylor
/// polynomial it replaced: one multiply-add fewer in every softmax weight.
pub const EXP2_POLY: [f32; 7] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_49,
    0.055_503_424,
    0.009_618_365,
    0.001_339_469,
    0.000_153_633_71,
];

/// `2^(j/32)` for `j = 0..32`, each rounded to nearest f32 (a test checks every
/// entry against f64): the table of the AVX-512 [`Simd::exp`](crate::Simd::exp),
/// which looks up `2^x`'s nearest 32nd with one two-register permute and leaves only
/// `|f| ≤ 1/64` to a polynomial.
pub const EXP2_TABLE: [f32; 32] = [
    1.0,
    1.021_897_2,
    1.044_273_7,
    1.067_140_5,
    1.090_507_7,
    1.114_386_8,
    1.138_788_6,
    1.163_724_9,
    1.189_207_1,
    1.215_247_4,
    1.241_857_8,
    1.269_051,
    1.296_839_6,
    1.325_236_7,
    1.354_255_6,
    1.383_91,
    std::f32::consts::SQRT_2,
    1.445_180_8,
    1.476_826_2,
    1.509_164_5,
    1.542_210_8,
    1.575_980_9,
    1.610_490_3,
    1.645_755_5,
    1.681_792_9,
    1.718_619_3,
    1.756_252_2,
    1.794_709_1,
    1.834_008_1,
    1.874_167_7,
    1.915_206_6,
    1.957_144_1,
];

/// `(2^f − 1)/f` on `f ∈ [−1/64, 1/64]` to degree 1, lowest first: a
/// relative-error-weighted least-squares fit on Chebyshev nodes, so that
/// `1 + f·(c₀ + f·c₁)` is within 0.45 ulp of `2^f` there (Taylor's coefficients
/// would give 1.8 ulp).
pub const EXP2_TABLE_POLY: [f32; 2] = [0.693_157_3, 0.240_226_9];

/// `log₂e` rounded to f32 (1.9·10⁻⁸ below the true value): the factor by which
/// [`Simd::exp`](crate::Simd::exp) turns its argument into a power of two.
///
/// Inside a fused multiply-add the product `x · log₂e` is exact, so the reduction
/// `x · log₂e = n + f` loses nothing to a product rounded first; the constant's own
/// rounding moves the result by a relative `|x| · 1.3·10⁻⁸` (ln 2 times its error),
/// below one ulp for `|x| < 9` and within the softmax's own rounding of its scores
/// (whose error is `|s| · ε/2` in the exponent).
pub const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// The most negative argument [`Simd::exp`](crate::Simd::exp) reduces, a little
/// below `−150 · ln 2 ≈ −103.972`, where `e^x` is less than half the smallest
/// subnormal: a clamp to it keeps the reduction's integer in range, and its own
/// `e^x` (`2^−150.04`) rounds to 0, as `e^−∞` must. (At `−150 · ln 2` rounded to
/// f32 the reduction's fraction is a hair above 0 and the result rounds up to the
/// smallest subnormal.)
pub const EXP_MIN_ARG: f32 = -104.0;

/// The scalar `e^x` the portable and AVX2 implementations follow lane by lane:
/// `x · log₂e = n + f` rounded to the nearest integer `n` inside fused
/// multiply-adds ([`LOG2_E`]), the same polynomial for `2^f`, then an exact
/// scaling by `2^n`.
#[inline(always)]
pub fn exp_scalar(x: f32) -> f32 {
    // NaN fails the comparison and stays NaN; −∞ and tiny values clamp.
    let x = if x < EXP_MIN_ARG { EXP_MIN_ARG } else { x };
    // Round to nearest with the 1.5·2^23 trick (exact for |x · log₂e| < 2^22).
    const MAGIC: f32 = 12_582_912.0;
    let n = x.mul_add(LOG2_E, MAGIC) - MAGIC;
    let f = x.mul_add(LOG2_E, -n);
    let c = EXP2_POLY;
    let mut p = c[6];
    p = p.mul_add(f, c[5]);
    p = p.mul_add(f, c[4]);
    p = p.mul_add(f, c[3]);
    p = p.mul_add(f, c[2]);
    p = p.mul_add(f, c[1]);
    p = p.mul_add(f, c[0]);
    // Scale by 2^n in two exact steps so that n down to −150 underflows gracefully.
    let n = n as i32; // NaN becomes 0: p is NaN anyway.
    let n1 = n / 2;
    let n2 = n - n1;
    p * pow2i(n1) * pow2i(n2)
}

/// `2^n` for `−126 ≤ n ≤ 127`, built from its bits.
#[inline(always)]
fn pow2i(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// `e^x` for `f32`, branch-free (Cephes' `expf`: range reduction by `ln 2` and a
/// degree-6 polynomial; within 2 ulp of the true value on `[-87.3, 88]`). Below that
/// range it gives `2^-126`'s neighbourhood (≈ 1e-38), above it saturates at `e^88`.
///
/// Written with fused multiply-adds (`mul_add`), as PyTorch's vectorised kernels
/// are: inside [`multiversion!`](crate::multiversion) functions they compile to FMA instructions, fewer
/// and faster than separate products and sums (the commit that made this gives
/// the A/B for a GELU). On a CPU without FMA, `mul_add` is a slower library call with the same
/// results.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAGIC: f32 = 12_582_912.0; // 1.5·2^23
    let x = x.clamp(-87.336_55, 88.0);
    // Round to nearest with the magic number: `t`'s low mantissa bits hold `n` as a
    // two's-complement integer (no float-to-int conversion, which would not vectorise).
    let t = x.mul_add(LOG2E, MAGIC);
    let n = t - MAGIC;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 5e-1);
    let e = (p * r).mul_add(r, r) + 1.0;
    // 2^n: the low 9 bits of t's bits + 127 are n + 127 ∈ [1, 254], shifted into
    // the exponent field.
    let scale = f32::from_bits(t.to_bits().wrapping_add(127) << 23);
    e * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -80.0f32;
        while x < 80.0 {
            let want = (x as f64).exp();
            let rel = ((exp(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.013;
        }
        assert!(worst < 3e-7, "{worst}");
        assert_eq!(exp(-200.0), exp(-87.336_55));
        assert!(exp(-200.0) < 1e-37);
        assert!(exp(100.0).is_finite() && exp(100.0) > 1e38);
    }
}
