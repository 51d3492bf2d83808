//! [`Simd`] on AVX2 + FMA: two `__m256` per 16-lane vector.

use std::arch::x86_64::*;

use super::{Simd, EXP2_POLY};

/// AVX2 + FMA vectors. Only use on CPUs with `avx2` and `fma`.
#[derive(Clone, Copy)]
pub(crate) struct Avx2;

/// Sixteen lanes as two halves.
#[derive(Clone, Copy)]
pub(crate) struct V2(pub(crate) __m256, pub(crate) __m256);

#[inline(always)]
unsafe fn exp2_half(x: __m256) -> __m256 {
    // max(-150, x) keeps a NaN x (second operand).
    let x = _mm256_max_ps(_mm256_set1_ps(-150.0), x);
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm256_sub_ps(x, n);
    let c = EXP2_POLY;
    let mut p = _mm256_set1_ps(c[7]);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[6]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[5]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[4]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[3]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[2]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[1]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[0]));
    // Scale by 2^n in two exact halves so that n down to −150 underflows gracefully.
    let ni = _mm256_cvtps_epi32(n); // NaN → i32::MIN; p is NaN then anyway.
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    _mm256_mul_ps(_mm256_mul_ps(p, s1), s2)
}

// SAFETY: callers check `avx2` and `fma` at run time before using this type.
unsafe impl Simd for Avx2 {
    type V = V2;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V2 {
        V2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: V2) {
        _mm256_storeu_ps(p, v.0);
        _mm256_storeu_ps(p.add(8), v.1);
    }
    #[inline(always)]
    unsafe fn splat_load(p: *const f32) -> V2 {
        let x = _mm256_broadcast_ss(&*p);
        V2(x, x)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> V2 {
        let x = _mm256_set1_ps(x);
        V2(x, x)
    }
    #[inline(always)]
    unsafe fn fma(a: V2, b: V2, c: V2) -> V2 {
        V2(
            _mm256_fmadd_ps(a.0, b.0, c.0),
            _mm256_fmadd_ps(a.1, b.1, c.1),
        )
    }
    #[inline(always)]
    unsafe fn add(a: V2, b: V2) -> V2 {
        V2(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1))
    }
    #[inline(always)]
    unsafe fn sub(a: V2, b: V2) -> V2 {
        V2(_mm256_sub_ps(a.0, b.0), _mm256_sub_ps(a.1, b.1))
    }
    #[inline(always)]
    unsafe fn mul(a: V2, b: V2) -> V2 {
        V2(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1))
    }
    #[inline(always)]
    unsafe fn max(a: V2, b: V2) -> V2 {
        V2(_mm256_max_ps(a.0, b.0), _mm256_max_ps(a.1, b.1))
    }
    #[inline(always)]
    unsafe fn masked(y: V2, mask: V2) -> V2 {
        let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
        let half = |y, m| _mm256_blendv_ps(y, m, _mm256_cmp_ps::<_CMP_EQ_OQ>(m, neg_inf));
        V2(half(y.0, mask.0), half(y.1, mask.1))
    }
    #[inline(always)]
    unsafe fn exp2(x: V2) -> V2 {
        V2(exp2_half(x.0), exp2_half(x.1))
    }
}

/// `out[..16] = 2^xs[..16]`, for the unit tests.
///
/// # Safety
/// The CPU must have `avx2` and `fma`; both pointers must be valid for 16 floats.
#[cfg(test)]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp2_test(xs: *const f32, out: *mut f32) {
    Avx2::store(out, Avx2::exp2(Avx2::load(xs)))
}
