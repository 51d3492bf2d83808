//! [`Simd`] on AVX2 + FMA: two `__m256` per 16-lane vector.

use std::arch::x86_64::*;

use super::{Simd, EXP2_POLY, LANES};

/// Proof that the CPU has AVX2 and FMA: only [`Avx2::new`] makes one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// The token, if this CPU has AVX2 and FMA.
    pub(crate) fn new() -> Option<Self> {
        super::has_avx2().then_some(Avx2(()))
    }
}

/// Sixteen lanes as two halves.
#[derive(Clone, Copy)]
pub(crate) struct V2(__m256, __m256);

/// `2^x` of one half (see [`Simd::exp2`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline(always)]
unsafe fn exp2_half(x: __m256) -> __m256 {
    // SAFETY: the caller guarantees AVX2 and FMA; no memory is touched.
    unsafe {
        // max(-150, x) keeps a NaN x (second operand).
        let x = _mm256_max_ps(_mm256_set1_ps(-150.0), x);
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let f = _mm256_sub_ps(x, n);
        let c = EXP2_POLY;
        let mut p = _mm256_set1_ps(c[7]);
        for &ci in c[..7].iter().rev() {
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(ci));
        }
        // Scale by 2^n in two exact halves so that n down to −150 underflows gracefully.
        let ni = _mm256_cvtps_epi32(n); // NaN → i32::MIN; p is NaN then anyway.
        let n1 = _mm256_srai_epi32::<1>(ni);
        let n2 = _mm256_sub_epi32(ni, n1);
        let bias = _mm256_set1_epi32(127);
        let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
        let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
        _mm256_mul_ps(_mm256_mul_ps(p, s1), s2)
    }
}

/// Lanes `< n` of the half whose first lane is `first`, as a load/store mask.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn lanes(n: usize, first: i32) -> __m256i {
    // SAFETY: the caller guarantees AVX2; no memory is touched.
    unsafe {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32 - first), idx)
    }
}

/// Sums of the lanes of eight vectors, lane `j` for `h[j]` (a `hadd` tree).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn sum8(h: [__m256; 8]) -> __m256 {
    // SAFETY: the caller guarantees AVX2; no memory is touched.
    unsafe {
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
}

/// Applies a two-operand AVX2 operation to both halves.
macro_rules! halves {
    ($op:ident, $a:expr, $b:expr) => {
        // SAFETY: the token proves AVX2 and FMA; no memory is touched.
        unsafe { V2($op($a.0, $b.0), $op($a.1, $b.1)) }
    };
}

// SAFETY: an `Avx2` exists only on CPUs with AVX2 and FMA (`Avx2::new`), the only
// instructions used here.
unsafe impl Simd for Avx2 {
    type V = V2;
    const REGISTERS: usize = 8;
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> V2 {
        // SAFETY: the caller guarantees 16 readable floats; the token, AVX2.
        unsafe { V2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: V2) {
        // SAFETY: the caller guarantees 16 writable floats; the token, AVX2.
        unsafe {
            _mm256_storeu_ps(p, v.0);
            _mm256_storeu_ps(p.add(8), v.1);
        }
    }
    #[inline(always)]
    unsafe fn load_part(self, p: *const f32, n: usize) -> V2 {
        // SAFETY: masked-off lanes are not read, so `p` needs only the `n` readable
        // floats the caller guarantees; the token proves AVX2.
        unsafe {
            V2(
                _mm256_maskload_ps(p, lanes(n, 0)),
                _mm256_maskload_ps(p.add(8), lanes(n, 8)),
            )
        }
    }
    #[inline(always)]
    unsafe fn store_part(self, p: *mut f32, v: V2, n: usize) {
        // SAFETY: only the `n` lanes the caller guarantees writable are written.
        unsafe {
            _mm256_maskstore_ps(p, lanes(n, 0), v.0);
            _mm256_maskstore_ps(p.add(8), lanes(n, 8), v.1);
        }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> V2 {
        // SAFETY: the token proves AVX2.
        let x = unsafe { _mm256_set1_ps(x) };
        V2(x, x)
    }
    #[inline(always)]
    fn fma(self, a: V2, b: V2, c: V2) -> V2 {
        // SAFETY: the token proves FMA.
        unsafe {
            V2(
                _mm256_fmadd_ps(a.0, b.0, c.0),
                _mm256_fmadd_ps(a.1, b.1, c.1),
            )
        }
    }
    #[inline(always)]
    fn add(self, a: V2, b: V2) -> V2 {
        halves!(_mm256_add_ps, a, b)
    }
    #[inline(always)]
    fn sub(self, a: V2, b: V2) -> V2 {
        halves!(_mm256_sub_ps, a, b)
    }
    #[inline(always)]
    fn mul(self, a: V2, b: V2) -> V2 {
        halves!(_mm256_mul_ps, a, b)
    }
    #[inline(always)]
    fn max(self, a: V2, b: V2) -> V2 {
        // vmaxps returns its second operand when either is NaN.
        halves!(_mm256_max_ps, a, b)
    }
    #[inline(always)]
    fn masked(self, y: V2, mask: V2) -> V2 {
        // SAFETY: the token proves AVX2.
        unsafe {
            let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
            let half = |y, m| _mm256_blendv_ps(y, m, _mm256_cmp_ps::<_CMP_EQ_OQ>(m, neg_inf));
            V2(half(y.0, mask.0), half(y.1, mask.1))
        }
    }
    #[inline(always)]
    fn exp2(self, x: V2) -> V2 {
        // SAFETY: the token proves AVX2 and FMA.
        unsafe { V2(exp2_half(x.0), exp2_half(x.1)) }
    }
    #[inline(always)]
    fn sum(self, a: V2) -> f32 {
        // SAFETY: the token proves AVX2. Pairwise halves, like the portable tree.
        unsafe {
            let s8 = _mm256_add_ps(a.0, a.1);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
            _mm_cvtss_f32(s1)
        }
    }
    #[inline(always)]
    fn sum16(self, a: &[V2; LANES]) -> V2 {
        // SAFETY: the token proves AVX2.
        unsafe {
            let halves = |j0: usize| {
                let mut h = [_mm256_setzero_ps(); 8];
                for (x, v) in h.iter_mut().zip(&a[j0..j0 + 8]) {
                    *x = _mm256_add_ps(v.0, v.1);
                }
                sum8(h)
            };
            V2(halves(0), halves(8))
        }
    }
    #[inline(always)]
    fn max_lane(self, a: V2) -> f32 {
        // SAFETY: the token proves AVX2.
        unsafe {
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
