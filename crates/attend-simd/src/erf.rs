//! `erf(x)` in scalar f32 code, for loops that [`multiversion!`](crate::multiversion)
//! compiles for each instruction set (the exact GELU).

use crate::exp;

/// `erf(x)` as PyTorch's vectorised CPU kernels compute it (Abramowitz & Stegun
/// 7.1.26: `1 − (a₁t + … + a₅t⁵) e^{−x²}`, `t = 1/(1 + p|x|)`; absolute error
/// below 1.5·10⁻⁷), with fused multiply-adds as [`exp`].
#[inline(always)]
pub fn erf(x: f32) -> f32 {
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
