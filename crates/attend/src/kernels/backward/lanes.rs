//! Sixteen-lane f32 vectors for the backward kernel: AVX-512 intrinsics, and a
//! portable fallback the compiler vectorises as it can.
//!
//! This is deliberately the same shape as the fused forward's `Simd` trait (load,
//! store, splat, fma, exp) so that the backward can move onto those helpers once
//! both live on one branch.

/// A 16-lane f32 vector type.
///
/// # Safety
/// Implementations may use instructions the CPU lacks; callers check first.
pub(crate) unsafe trait Lanes: Copy {
    /// The vector.
    type V: Copy;
    /// Loads 16 floats.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Stores 16 floats.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// All lanes `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// `a · b + c`.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a − b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `eˣ` per lane, for `x ≤ 0` (to within a few ulps; −∞ gives 0).
    unsafe fn exp(x: Self::V) -> Self::V;
}

/// Taylor coefficients `1/k!` of `eʳ` on `|r| ≤ ln2/2`; the degree-7 remainder is
/// below 6e-9 relative, under f32's half ulp.
const EXP_POLY: [f32; 8] = [
    1.0,
    1.0,
    0.5,
    0.166_666_67,
    0.041_666_668,
    0.008_333_334,
    0.001_388_888_9,
    0.000_198_412_7,
];
/// `ln 2` split so that `n · LN2_HI` is exact for the `n` that occur (Cody–Waite).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// Portable lanes: plain arrays.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

// SAFETY: plain Rust, valid on every CPU.
unsafe impl Lanes for Portable {
    type V = [f32; 16];
    #[inline(always)]
    unsafe fn load(p: *const f32) -> [f32; 16] {
        std::ptr::read_unaligned(p as *const [f32; 16])
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [f32; 16]) {
        std::ptr::write_unaligned(p as *mut [f32; 16], v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> [f32; 16] {
        [x; 16]
    }
    #[inline(always)]
    unsafe fn fma(a: [f32; 16], b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| a[l] * b[l] + c[l])
    }
    #[inline(always)]
    unsafe fn sub(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| a[l] - b[l])
    }
    #[inline(always)]
    unsafe fn mul(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| a[l] * b[l])
    }
    #[inline(always)]
    unsafe fn exp(x: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| x[l].exp())
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::Avx512;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Lanes, EXP_POLY, LN2_HI, LN2_LO};

    /// AVX-512F vectors. Only use on CPUs with `avx512f`.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512;

    // SAFETY: callers check `avx512f` at run time before using this type.
    unsafe impl Lanes for Avx512 {
        type V = __m512;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            _mm512_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            _mm512_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            _mm512_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn sub(a: __m512, b: __m512) -> __m512 {
            _mm512_sub_ps(a, b)
        }
        #[inline(always)]
        unsafe fn mul(a: __m512, b: __m512) -> __m512 {
            _mm512_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn exp(x: __m512) -> __m512 {
            // eˣ = 2ⁿ · eʳ with n = round(x log2 e) and r = x − n ln 2 reduced in two
            // exact steps, so the result keeps full f32 accuracy however large |x|.
            // max(−120, ·) sends −∞ to an exact 0 after scaling.
            let x = _mm512_max_ps(_mm512_set1_ps(-120.0), x);
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            );
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
            let c = EXP_POLY;
            let mut p = _mm512_set1_ps(c[7]);
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[6]));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[5]));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[4]));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[3]));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[2]));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[1]));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[0]));
            _mm512_scalef_ps(p, n)
        }
    }
}
