//! Sixteen-lane f32 vectors for the decode kernel: AVX-512F and a portable fallback.
//!
//! This mirrors the `Simd` trait of the fused kernel (branch `fused`) with the two
//! extra reductions decoding needs; once both are on `main` they should become one
//! module (`kernels/simd`).

/// Lanes in every vector.
pub(crate) const LANES: usize = 16;

/// An instruction set the decode kernel can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, vectorised by the compiler for the build target; runs anywhere.
    Portable,
    /// x86-64 AVX-512 (F).
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        if Isa::Avx512.is_available() {
            Isa::Avx512
        } else {
            Isa::Portable
        }
    }

    /// Whether this CPU can run kernels built for `self`.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 => false,
        }
    }

    /// Every instruction set this CPU can run, best last.
    pub fn available() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx512]
            .into_iter()
            .filter(|isa| isa.is_available())
            .collect()
    }

    /// Lower-case name (`portable`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx512 => "avx512",
        }
    }
}

/// A 16-lane f32 vector type and its operations.
///
/// # Safety
/// Implementations may only be used on CPUs that support their instruction set;
/// pointer arguments must be valid for the number of floats each method reads or
/// writes.
pub(crate) unsafe trait Simd: Copy {
    /// The vector.
    type V: Copy;
    /// Loads 16 contiguous floats.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Loads the first `n < 16` floats at `p`, zeros in the other lanes.
    unsafe fn load_part(p: *const f32, n: usize) -> Self::V;
    /// Stores 16 contiguous floats.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// Stores the first `n < 16` lanes.
    unsafe fn store_part(p: *mut f32, v: Self::V, n: usize);
    /// Broadcasts `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// `a · b + c`.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// Sum of the lanes.
    unsafe fn sum(a: Self::V) -> f32;
    /// Lane `j` of the result is the sum of the lanes of `a[j]` (sixteen horizontal
    /// sums at once, as a transpose-and-add tree).
    unsafe fn sum16(a: &[Self::V; LANES]) -> Self::V;
    /// Maximum of the lanes (−∞ lanes are ignored unless all are −∞).
    unsafe fn max_lane(a: Self::V) -> f32;
    /// `2^x` lane by lane for `x ≤ 0`: 0 for −∞ and below `2^−150`.
    unsafe fn exp2(x: Self::V) -> Self::V;
}

/// `2^f` on `f ∈ [−½, ½]`: Taylor coefficients of `e^(f ln 2)` to degree 7
/// (the same polynomial as the fused kernel's).
const EXP2_POLY: [f32; 8] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_355_8,
    0.000_154_035_3,
    0.000_015_252_734,
];

/// Scalar `2^x` following the same steps as the vector versions.
#[inline(always)]
pub(crate) fn exp2_scalar(x: f32) -> f32 {
    let x = if x < -150.0 { -150.0 } else { x };
    const MAGIC: f32 = 12_582_912.0;
    let n = (x + MAGIC) - MAGIC;
    let f = x - n;
    let c = EXP2_POLY;
    let mut p = c[7];
    for k in (0..7).rev() {
        p = p * f + c[k];
    }
    let n = n as i32;
    let n1 = n / 2;
    let n2 = n - n1;
    p * pow2i(n1) * pow2i(n2)
}

#[inline(always)]
fn pow2i(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// Plain arrays that the compiler vectorises for the build target.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

type PV = [f32; LANES];

// SAFETY: uses no instruction beyond the build target's.
unsafe impl Simd for Portable {
    type V = PV;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> PV {
        std::ptr::read_unaligned(p as *const PV)
    }
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> PV {
        let mut out = [0.0; LANES];
        std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), n);
        out
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: PV) {
        std::ptr::write_unaligned(p as *mut PV, v)
    }
    #[inline(always)]
    unsafe fn store_part(p: *mut f32, v: PV, n: usize) {
        std::ptr::copy_nonoverlapping(v.as_ptr(), p, n);
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> PV {
        [x; LANES]
    }
    #[inline(always)]
    unsafe fn fma(a: PV, b: PV, c: PV) -> PV {
        let mut out = [0.0; LANES];
        for i in 0..LANES {
            out[i] = a[i] * b[i] + c[i];
        }
        out
    }
    #[inline(always)]
    unsafe fn add(a: PV, b: PV) -> PV {
        let mut out = [0.0; LANES];
        for i in 0..LANES {
            out[i] = a[i] + b[i];
        }
        out
    }
    #[inline(always)]
    unsafe fn sub(a: PV, b: PV) -> PV {
        let mut out = [0.0; LANES];
        for i in 0..LANES {
            out[i] = a[i] - b[i];
        }
        out
    }
    #[inline(always)]
    unsafe fn sum(a: PV) -> f32 {
        // A pairwise tree, like the vector reductions.
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
    #[inline(always)]
    unsafe fn exp2(x: PV) -> PV {
        let mut out = [0.0; LANES];
        for i in 0..LANES {
            out[i] = exp2_scalar(x[i]);
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::Avx512;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Simd, EXP2_POLY};

    /// AVX-512F vectors. Only use on CPUs with `avx512f`.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512;

    #[inline(always)]
    fn lanes(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    // SAFETY: callers check `avx512f` at run time before using this type.
    unsafe impl Simd for Avx512 {
        type V = __m512;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn load_part(p: *const f32, n: usize) -> __m512 {
            _mm512_maskz_loadu_ps(lanes(n), p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            _mm512_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn store_part(p: *mut f32, v: __m512, n: usize) {
            _mm512_mask_storeu_ps(p, lanes(n), v)
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
            _mm512_scalef_ps(p, n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(always)]
    fn check<S: Simd>() {
        let xs: Vec<f32> = (0..16).map(|i| -(i as f32) * 7.3 - 0.37).collect();
        let mut out = [0.0f32; 16];
        // SAFETY: the caller checked the ISA; buffers hold 16 floats.
        unsafe {
            S::store(out.as_mut_ptr(), S::exp2(S::load(xs.as_ptr())));
            for (x, g) in xs.iter().zip(out) {
                let want = (*x as f64).exp2();
                assert!(((g as f64 - want) / want).abs() < 3.0 * f32::EPSILON as f64);
            }
            let v = S::load_part(xs.as_ptr(), 5);
            let want: f32 = xs[..5].iter().sum();
            assert!((S::sum(v) - want).abs() <= 4.0 * f32::EPSILON * want.abs());
            assert_eq!(S::max_lane(S::load(xs.as_ptr())), xs[0]);
            let mut vs = [S::splat(0.0); LANES];
            for (j, v) in vs.iter_mut().enumerate() {
                let row: Vec<f32> = (0..16).map(|c| (j * 16 + c) as f32).collect();
                *v = S::load(row.as_ptr());
            }
            let mut sums = [0.0f32; 16];
            S::store(sums.as_mut_ptr(), S::sum16(&vs));
            for (j, x) in sums.iter().enumerate() {
                assert_eq!(
                    *x,
                    (0..16).map(|c| (j * 16 + c) as f32).sum::<f32>(),
                    "sum16 lane {j}"
                );
            }
            let mut special = [f32::NEG_INFINITY; 16];
            special[3] = -1000.0;
            S::store(special.as_mut_ptr(), S::exp2(S::load(special.as_ptr())));
            assert!(special.iter().all(|&x| x == 0.0));
        }
    }

    #[test]
    fn vectors_agree_with_f64() {
        check::<Portable>();
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx512.is_available() {
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512() {
                check::<Avx512>()
            }
            // SAFETY: the CPU has avx512f.
            unsafe { avx512() }
        }
    }
}
