//! Element-wise kernels compiled for each instruction set and chosen at run time
//! through the crate's one dispatch point ([`crate::isa::dispatch`]), so that the
//! plain loops below vectorise without asking the user for `-C target-cpu=native`.
//!
//! The loops are written so that LLVM can vectorise them: no calls into libm, no
//! branches, reductions split into 16 independent lanes.

/// Defines `fn $name(args)` that runs `$body` compiled for the best instruction set
/// the CPU has, chosen at run time by [`crate::isa::dispatch`].
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            crate::isa::dispatch(
                crate::isa::IsaToken::best(),
                crate::isa::Scalar(|| body($($arg),*)),
            )
        }
    };
}
pub(crate) use multiversion;

/// `e^x` for `f32`, branch-free (Cephes' `expf`: range reduction by `ln 2` and a
/// degree-6 polynomial; within 2 ulp of the true value on `[-87.3, 88]`). Below that
/// range it gives `2^-126`'s neighbourhood (≈ 1e-38), above it saturates at `e^88`.
///
/// Written with fused multiply-adds (`mul_add`), as PyTorch's vectorised kernels
/// are: inside [`multiversion!`] functions they compile to FMA instructions, fewer
/// and faster than separate products and sums (the commit that made this gives
/// the A/B for a GELU). On a CPU without FMA, `mul_add` is a slower library call with the same
/// results.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
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

/// `erf(x)` as PyTorch's vectorised CPU kernels compute it (Abramowitz & Stegun
/// 7.1.26: `1 − (a₁t + … + a₅t⁵) e^{−x²}`, `t = 1/(1 + p|x|)`; absolute error
/// below 1.5·10⁻⁷), with fused multiply-adds as [`exp`].
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A1: f32 = 0.254_829_6;
    const A2: f32 = -0.284_496_74;
    const A3: f32 = 1.421_413_8;
    const A4: f32 = -1.453_152;
    const A5: f32 = 1.061_405_4;
    let a = x.abs();
    let t = 1.0 / P.mul_add(a, 1.0);
    let r = A5
        .mul_add(t, A4)
        .mul_add(t, A3)
        .mul_add(t, A2)
        .mul_add(t, A1)
        * t;
    let y = (-r).mul_add(exp(-a * a), 1.0);
    y.copysign(x)
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

    #[test]
    fn erf_is_accurate() {
        // erf(0.5), erf(1), erf(2) from tables.
        for (x, want) in [
            (0.0f32, 0.0f64),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (-1.0, -0.842_700_792_949_714_9),
            (6.0, 1.0),
        ] {
            assert!((erf(x) as f64 - want).abs() < 3e-7, "erf({x}) = {}", erf(x));
        }
    }
}
