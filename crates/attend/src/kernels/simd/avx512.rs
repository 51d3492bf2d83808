//! [`Simd`] on AVX-512F: one `__m512` per vector.

use std::arch::x86_64::*;

use super::{Simd, EXP2_POLY};

/// AVX-512F vectors. Only use on CPUs with `avx512f`.
#[derive(Clone, Copy)]
pub(crate) struct Avx512;

// SAFETY: callers check `avx512f` at run time before using this type.
unsafe impl Simd for Avx512 {
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
    unsafe fn splat_load(p: *const f32) -> __m512 {
        _mm512_set1_ps(*p)
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
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
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
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        // vmaxps returns its second operand when either is NaN.
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn masked(y: __m512, mask: __m512) -> __m512 {
        let hidden = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(mask, _mm512_set1_ps(f32::NEG_INFINITY));
        _mm512_mask_blend_ps(hidden, y, mask)
    }
    #[inline(always)]
    unsafe fn exp2(x: __m512) -> __m512 {
        // max(-150, x) keeps a NaN x (second operand).
        let x = _mm512_max_ps(_mm512_set1_ps(-150.0), x);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let f = _mm512_sub_ps(x, n);
        let c = EXP2_POLY;
        let mut p = _mm512_set1_ps(c[7]);
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[6]));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[5]));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[4]));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[3]));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[2]));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[1]));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[0]));
        // p · 2^n with correct underflow.
        _mm512_scalef_ps(p, n)
    }
}

/// `out[..16] = 2^xs[..16]`, for the unit tests.
///
/// # Safety
/// The CPU must have `avx512f`; both pointers must be valid for 16 floats.
#[cfg(test)]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp2_test(xs: *const f32, out: *mut f32) {
    Avx512::store(out, Avx512::exp2(Avx512::load(xs)))
}
