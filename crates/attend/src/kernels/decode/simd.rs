//! What decoding needs of the vectors beyond the fused kernel's [`Simd`]: partial
//! loads and stores for widths that are not a multiple of 16, and horizontal sums
//! and maxima. Implemented for the portable, AVX2 and AVX-512 vectors.

use crate::kernels::simd::portable::Portable;
use crate::kernels::simd::{Simd, LANES};

/// Decoding's extra vector operations.
///
/// # Safety
/// As for [`Simd`]: only on CPUs with the instruction set, with valid pointers.
pub(crate) unsafe trait DecodeSimd: Simd {
    /// Loads the first `n ≤ 16` floats at `p`, zeros in the other lanes.
    unsafe fn load_part(p: *const f32, n: usize) -> Self::V;
    /// Stores the first `n ≤ 16` lanes.
    unsafe fn store_part(p: *mut f32, v: Self::V, n: usize);
    /// Sum of the lanes, as a pairwise tree.
    unsafe fn sum(a: Self::V) -> f32;
    /// Lane `j` of the result is the sum of the lanes of `a[j]` (sixteen horizontal
    /// sums at once, as a transpose-and-add tree).
    unsafe fn sum16(a: &[Self::V; LANES]) -> Self::V;
    /// Maximum of the lanes (−∞ lanes are ignored unless all are −∞).
    unsafe fn max_lane(a: Self::V) -> f32;
}

type PV = [f32; LANES];

// SAFETY: uses no instruction beyond the build target's.
unsafe impl DecodeSimd for Portable {
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> PV {
        let mut out = [0.0; LANES];
        std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), n);
        out
    }
    #[inline(always)]
    unsafe fn store_part(p: *mut f32, v: PV, n: usize) {
        std::ptr::copy_nonoverlapping(v.as_ptr(), p, n);
    }
    #[inline(always)]
    unsafe fn sum(a: PV) -> f32 {
        let mut w = a;
        let mut n = LANES / 2;
        while n > 0 {
            for i in 0..n {
                w[i] += w[i + n];
            }
            n /= 2;
        }
        w[0]
    }
    #[inline(always)]
    unsafe fn sum16(a: &[PV; LANES]) -> PV {
        let mut out = [0.0; LANES];
        for (o, v) in out.iter_mut().zip(a) {
            *o = Self::sum(*v);
        }
        out
    }
    #[inline(always)]
    unsafe fn max_lane(a: PV) -> f32 {
        a.iter().copied().fold(
            f32::NEG_INFINITY,
            |m, x| {
                if x > m || x.is_nan() {
                    x
                } else {
                    m
                }
            },
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::DecodeSimd;
    use crate::kernels::simd::avx512::Avx512;

    #[inline(always)]
    fn lanes(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    // SAFETY: callers check `avx512f` at run time before using this type.
    unsafe impl DecodeSimd for Avx512 {
        #[inline(always)]
        unsafe fn load_part(p: *const f32, n: usize) -> __m512 {
            _mm512_maskz_loadu_ps(lanes(n), p)
        }
        #[inline(always)]
        unsafe fn store_part(p: *mut f32, v: __m512, n: usize) {
            _mm512_mask_storeu_ps(p, lanes(n), v)
        }
        #[inline(always)]
        unsafe fn sum(a: __m512) -> f32 {
            // Pairwise halves, like the portable tree.
            let lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
            let s8 = _mm256_add_ps(lo, hi);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
            _mm_cvtss_f32(s1)
        }
        #[inline(always)]
        unsafe fn sum16(a: &[__m512; 16]) -> __m512 {
            // Pairs of vectors: per 128-bit lane [x0+x2, y0+y2, x1+x3, y1+y3].
            let pair = |x: __m512, y: __m512| {
                _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y))
            };
            // Pairs of pairs: per 128-bit lane the four vectors' partial sums.
            let quad = |x: __m512, y: __m512| {
                let (x, y) = (_mm512_castps_pd(x), _mm512_castps_pd(y));
                _mm512_add_ps(
                    _mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                    _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)),
                )
            };
            // Across 128-bit lanes: [x.L0+x.L1, x.L2+x.L3, y.L0+y.L1, y.L2+y.L3].
            let lanes = |x: __m512, y: __m512| {
                _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
                    _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
                )
            };
            let c0 = quad(pair(a[0], a[1]), pair(a[2], a[3]));
            let c1 = quad(pair(a[4], a[5]), pair(a[6], a[7]));
            let c2 = quad(pair(a[8], a[9]), pair(a[10], a[11]));
            let c3 = quad(pair(a[12], a[13]), pair(a[14], a[15]));
            lanes(lanes(c0, c1), lanes(c2, c3))
        }
        #[inline(always)]
        unsafe fn max_lane(a: __m512) -> f32 {
            _mm512_reduce_max_ps(a)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::DecodeSimd;
    use crate::kernels::simd::avx2::{Avx2, V2};

    /// Lanes `< n` of the half whose first lane is `first`, as a load/store mask.
    #[inline(always)]
    unsafe fn lanes(n: usize, first: i32) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32 - first), idx)
    }

    /// Sums of the lanes of eight vectors, lane `j` for `h[j]` (a `hadd` tree).
    #[inline(always)]
    unsafe fn sum8(h: [__m256; 8]) -> __m256 {
        let t0 = _mm256_hadd_ps(h[0], h[1]);
        let t1 = _mm256_hadd_ps(h[2], h[3]);
        let t2 = _mm256_hadd_ps(h[4], h[5]);
        let t3 = _mm256_hadd_ps(h[6], h[7]);
        // Per 128-bit lane: the partial sums of h0..h3 and of h4..h7.
        let u0 = _mm256_hadd_ps(t0, t1);
        let u1 = _mm256_hadd_ps(t2, t3);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(u0, u1),
            _mm256_permute2f128_ps::<0x31>(u0, u1),
        )
    }

    // SAFETY: callers check `avx2` and `fma` at run time before using this type.
    unsafe impl DecodeSimd for Avx2 {
        #[inline(always)]
        unsafe fn load_part(p: *const f32, n: usize) -> V2 {
            // Masked-off lanes are not read, so `p` needs only `n` valid floats.
            V2(
                _mm256_maskload_ps(p, lanes(n, 0)),
                _mm256_maskload_ps(p.add(8), lanes(n, 8)),
            )
        }
        #[inline(always)]
        unsafe fn store_part(p: *mut f32, v: V2, n: usize) {
            _mm256_maskstore_ps(p, lanes(n, 0), v.0);
            _mm256_maskstore_ps(p.add(8), lanes(n, 8), v.1);
        }
        #[inline(always)]
        unsafe fn sum(a: V2) -> f32 {
            // Pairwise halves, like the portable tree.
            let s8 = _mm256_add_ps(a.0, a.1);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
            _mm_cvtss_f32(s1)
        }
        #[inline(always)]
        unsafe fn sum16(a: &[V2; 16]) -> V2 {
            let halves = |j0: usize| {
                let mut h = [_mm256_setzero_ps(); 8];
                for (x, v) in h.iter_mut().zip(&a[j0..j0 + 8]) {
                    *x = _mm256_add_ps(v.0, v.1);
                }
                sum8(h)
            };
            V2(halves(0), halves(8))
        }
        #[inline(always)]
        unsafe fn max_lane(a: V2) -> f32 {
            let unordered = _mm256_cmp_ps::<_CMP_UNORD_Q>(a.0, a.1);
            if _mm256_movemask_ps(unordered) != 0 {
                return f32::NAN;
            }
            let m8 = _mm256_max_ps(a.0, a.1);
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Isa;

    #[inline(always)]
    fn check<S: DecodeSimd>() {
        let xs: Vec<f32> = (0..16).map(|i| -(i as f32) * 7.3 - 0.37).collect();
        // SAFETY: the caller checked the ISA; buffers hold 16 floats.
        unsafe {
            let v = S::load_part(xs.as_ptr(), 5);
            let want: f32 = xs[..5].iter().sum();
            assert!((S::sum(v) - want).abs() <= 4.0 * f32::EPSILON * want.abs());
            assert_eq!(S::max_lane(S::load(xs.as_ptr())), xs[0]);
            let mut out = [1.0f32; 16];
            S::store_part(out.as_mut_ptr(), S::load(xs.as_ptr()), 3);
            assert_eq!(&out[..3], &xs[..3]);
            assert!(out[3..].iter().all(|&x| x == 1.0));
            let mut vs = [S::splat(0.0); LANES];
            for (j, v) in vs.iter_mut().enumerate() {
                let row: Vec<f32> = (0..16).map(|c| (j * 16 + c) as f32).collect();
                *v = S::load(row.as_ptr());
            }
            let mut sums = [0.0f32; 16];
            S::store(sums.as_mut_ptr(), S::sum16(&vs));
            for (j, x) in sums.iter().enumerate() {
                let want: f32 = (0..16).map(|c| (j * 16 + c) as f32).sum();
                assert_eq!(*x, want, "sum16 lane {j}");
            }
        }
    }

    #[test]
    fn reductions_and_partial_access() {
        check::<Portable>();
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx512.is_available() {
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512() {
                check::<crate::kernels::simd::avx512::Avx512>()
            }
            // SAFETY: the CPU has avx512f.
            unsafe { avx512() }
        }
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx2.is_available() {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2() {
                check::<crate::kernels::simd::avx2::Avx2>()
            }
            // SAFETY: the CPU has avx2 and fma.
            unsafe { avx2() }
        }
    }
}
