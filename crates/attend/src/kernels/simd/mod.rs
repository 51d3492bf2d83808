//! Sixteen-lane f32 vectors for the fused kernels, one implementation per ISA.
//!
//! The kernels in [`crate::kernels::fused`] are written once, generic over [`Simd`],
//! and instantiated inside functions compiled for each instruction set
//! (`#[target_feature]`); the CPU is probed at run time ([`Isa::detect`]). Every
//! implementation has 16 lanes, so tiles have the same shape whatever the ISA.
//!
//! All operations are `#[inline(always)]` so that they inline into the
//! feature-enabled entry points; calling them anywhere else is slow but correct.

pub(crate) mod portable;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

/// An instruction set the fused kernels can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, vectorised by the compiler for the build target; runs anywhere.
    Portable,
    /// x86-64 AVX2 with FMA.
    Avx2,
    /// x86-64 AVX-512 (F).
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// The requested instruction set, or the best this CPU has; an error if the CPU
    /// cannot run the requested one.
    pub fn resolve(requested: Option<Isa>) -> crate::Result<Isa> {
        let isa = requested.unwrap_or_else(Isa::detect);
        if !isa.is_available() {
            return Err(crate::Error::value(format!(
                "isa {} is not available on this CPU",
                isa.name()
            )));
        }
        Ok(isa)
    }

    /// Whether this CPU can run kernels built for `self`.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every instruction set this CPU can run, best last.
    pub fn available() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|isa| isa.is_available())
            .collect()
    }

    /// Lower-case name (`portable`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// Lanes in every [`Simd`] vector.
pub(crate) const LANES: usize = 16;

/// A 16-lane f32 vector type and its operations.
///
/// # Safety
/// Implementations may only be used on CPUs that support their instruction set, and
/// every pointer argument must be valid for 16 (or 1, for `splat_load`) f32 reads or
/// writes.
pub(crate) unsafe trait Simd: Copy {
    /// The vector.
    type V: Copy;
    /// Loads 16 contiguous floats.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Stores 16 contiguous floats.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// Broadcasts `*p`.
    unsafe fn splat_load(p: *const f32) -> Self::V;
    /// Broadcasts `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// `a · b + c`, fused.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum; a NaN in `b` is returned as is, so NaN scores propagate.
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// `y`, but −∞ in the lanes where `mask` is −∞: a masked score stays masked
    /// even when it is NaN (NaN + −∞ is NaN), so a NaN never reaches a row that
    /// cannot see it.
    unsafe fn masked(y: Self::V, mask: Self::V) -> Self::V;
    /// `2^x` for `x ≤ 0` (also correct, but not fast-path, for small positive `x`):
    /// about 1 ulp, 0 below `2^−150`, NaN for NaN, 0 for −∞.
    unsafe fn exp2(x: Self::V) -> Self::V;
}

/// `2^f` on `f ∈ [−½, ½]`: Taylor coefficients of `e^(f ln 2)` to degree 7
/// (truncation error below 6e−9, under a tenth of an f32 ulp).
pub(crate) const EXP2_POLY: [f32; 8] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_355_8,
    0.000_154_035_3,
    0.000_015_252_734,
];

/// The scalar `2^x` every implementation follows lane by lane: the same reduction
/// `x = n + f`, the same polynomial, then an exact scaling by `2^n`.
#[inline(always)]
pub(crate) fn exp2_scalar(x: f32) -> f32 {
    // NaN fails the comparison and stays NaN; −∞ and tiny values clamp to −150.
    let x = if x < -150.0 { -150.0 } else { x };
    // Round to nearest with the 1.5·2^23 trick (exact for |x| < 2^22).
    const MAGIC: f32 = 12_582_912.0;
    let n = (x + MAGIC) - MAGIC;
    let f = x - n;
    let c = EXP2_POLY;
    let mut p = c[7];
    p = p.mul_add(f, c[6]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp2_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -149.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp2();
            let got = exp2_scalar(x) as f64;
            if want > 1e-30 {
                worst = worst.max(((got - want) / want).abs());
            }
            x += 0.0137;
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "worst relative error {worst}"
        );
        assert_eq!(exp2_scalar(0.0), 1.0);
        assert_eq!(exp2_scalar(f32::NEG_INFINITY), 0.0);
        assert!(exp2_scalar(f32::NAN).is_nan());
        for isa in Isa::available() {
            let xs: Vec<f32> = (0..16).map(|i| -(i as f32) * 7.3 - 0.37).collect();
            let got = exp2_lanes(isa, &xs);
            for (x, g) in xs.iter().zip(got) {
                let want = (*x as f64).exp2();
                assert!(((g as f64 - want) / want).abs() < 3.0 * f32::EPSILON as f64);
            }
            let mut special = [0.0f32; 16];
            special[1] = f32::NEG_INFINITY;
            special[2] = f32::NAN;
            special[3] = -1000.0;
            let got = exp2_lanes(isa, &special);
            assert_eq!(got[0], 1.0, "{isa:?}");
            assert_eq!(got[1], 0.0, "{isa:?}");
            assert!(got[2].is_nan(), "{isa:?}");
            assert_eq!(got[3], 0.0, "{isa:?}");
        }
    }

    fn exp2_lanes(isa: Isa, xs: &[f32]) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        // SAFETY: `isa` is available; both buffers hold 16 floats.
        unsafe {
            match isa {
                Isa::Portable => portable::Portable::store(
                    out.as_mut_ptr(),
                    portable::Portable::exp2(portable::Portable::load(xs.as_ptr())),
                ),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => avx2::exp2_test(xs.as_ptr(), out.as_mut_ptr()),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => avx512::exp2_test(xs.as_ptr(), out.as_mut_ptr()),
                #[allow(unreachable_patterns)]
                _ => unreachable!(),
            }
        }
        out
    }
}
