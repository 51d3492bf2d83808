//! [`Simd`] on AVX-512: one `__m512` per vector; with AVX512-BF16 and
//! AVX512-VNNI, bf16 dot products by `vdpbf16ps` and int8 ones by `vpdpbusd`.

use std::arch::x86_64::*;

use super::{Simd, EXP2_TABLE, EXP2_TABLE_POLY, EXP_MIN_ARG, LANES, LOG2_E};

/// Proof that the CPU has AVX-512 F, VL, BW and DQ (and AVX2 with FMA), and with
/// `BF16` also AVX512-BF16 and AVX512-VNNI (every CPU with the first has the
/// second: Intel Cooper Lake and Sapphire Rapids on, AMD Zen 4 on): only
/// [`Avx512::new`] and [`Avx512Bf16::new`] make one. Both share every operation
/// but [`Simd::dot2`], [`Simd::pack_bf16`] and [`Simd::dot4`].
#[derive(Clone, Copy, Debug)]
pub struct Avx512Of<const BF16: bool>(());

/// AVX-512 without AVX512-BF16.
pub type Avx512 = Avx512Of<false>;

/// AVX-512 with AVX512-BF16 and AVX512-VNNI.
pub type Avx512Bf16 = Avx512Of<true>;

impl Avx512 {
    /// The token, if this CPU has the features.
    pub fn new() -> Option<Self> {
        super::has_avx512().then_some(Avx512Of(()))
    }
}

impl Avx512Bf16 {
    /// The token, if this CPU has the features.
    pub fn new() -> Option<Self> {
        super::has_avx512bf16().then_some(Avx512Of(()))
    }
}

/// Sixteen floats rounded to bf16 (see [`super::bf16_bits`]), the result in the high
/// half of each 32-bit lane.
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
unsafe fn round_bf16(x: __m512) -> __m512i {
    // SAFETY: the caller guarantees AVX-512F; no memory is touched.
    unsafe {
        let bits = _mm512_castps_si512(x);
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
        let rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb);
        let quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x0040_0000));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_blend_epi32(nan, rounded, quiet)
    }
}

/// The first `n ≤ 16` lanes, as a mask.
#[inline(always)]
fn lanes(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

// SAFETY: an `Avx512Of` exists only on CPUs with AVX-512 F, VL, BW and DQ
// (`Avx512::new`), which cover every instruction used here but the bf16 ones and
// `vpdpbusd`, used only by `Avx512Bf16`, which exists only on CPUs that also have
// AVX512-BF16 and AVX512-VNNI.
unsafe impl<const BF16: bool> Simd for Avx512Of<BF16> {
    type V = __m512;
    type P = __m512i;
    const REGISTERS: usize = 32;
    const NATIVE_DOT4: bool = BF16;
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m512 {
        // SAFETY: the caller guarantees 16 readable floats; the token, AVX-512F.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m512) {
        // SAFETY: the caller guarantees 16 writable floats; the token, AVX-512F.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_part(self, p: *const f32, n: usize) -> __m512 {
        // SAFETY: masked-off lanes are not read; the caller guarantees `n` floats.
        unsafe { _mm512_maskz_loadu_ps(lanes(n), p) }
    }
    #[inline(always)]
    unsafe fn store_part(self, p: *mut f32, v: __m512, n: usize) {
        // SAFETY: masked-off lanes are not written; the caller guarantees `n` floats.
        unsafe { _mm512_mask_storeu_ps(p, lanes(n), v) }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token proves AVX-512F. vmaxps returns its second operand when
        // either is NaN.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn masked(self, y: __m512, mask: __m512) -> __m512 {
        // SAFETY: the token proves AVX-512F.
        unsafe {
            let hidden = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(mask, _mm512_set1_ps(f32::NEG_INFINITY));
            _mm512_mask_blend_ps(hidden, y, mask)
        }
    }
    #[inline(always)]
    fn exp(self, x: __m512) -> __m512 {
        // SAFETY: the token proves AVX-512F.
        unsafe {
            // max(−150 ln 2, x) keeps a NaN x (second operand).
            let x = _mm512_max_ps(_mm512_set1_ps(EXP_MIN_ARG), x);
            // x · log₂e = n/32 + f, |f| ≤ 1/64, the product exact inside the fused
            // multiply-adds: adding 1.5·2^18 rounds it to a multiple of 1/32 (exact
            // for |x · log₂e| < 2^17) and leaves n in the sum's low mantissa bits;
            // the permute reads their low five, n mod 32, as the table's index. A
            // shuffle and no more multiply-adds than `2^x` would take, not the
            // multiply pipes' work that the products of a softmax's tile wait on:
            // 2^(n/32) from the table, then a polynomial of degree 2 on the small f
            // instead of 6 on [−½, ½].
            const MAGIC: f32 = 393_216.0;
            let log2e = _mm512_set1_ps(LOG2_E);
            let t = _mm512_fmadd_ps(x, log2e, _mm512_set1_ps(MAGIC));
            let k = _mm512_sub_ps(t, _mm512_set1_ps(MAGIC));
            let f = _mm512_fmsub_ps(x, log2e, k);
            let lo = _mm512_loadu_ps(EXP2_TABLE.as_ptr());
            let hi = _mm512_loadu_ps(EXP2_TABLE.as_ptr().add(LANES));
            let table = _mm512_permutex2var_ps(lo, _mm512_castps_si512(t), hi);
            let [c0, c1] = EXP2_TABLE_POLY.map(|c| _mm512_set1_ps(c));
            let g = _mm512_fmadd_ps(c1, f, c0);
            let p = _mm512_fmadd_ps(_mm512_mul_ps(table, f), g, table);
            // p · 2^floor(k) with correct underflow: k's fraction is (n mod 32)/32.
            _mm512_scalef_ps(p, k)
        }
    }
    #[inline(always)]
    fn sum(self, a: __m512) -> f32 {
        // SAFETY: the token proves AVX-512F. Pairwise halves, like the portable tree.
        unsafe {
            let lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
            let s8 = _mm256_add_ps(lo, hi);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
            _mm_cvtss_f32(s1)
        }
    }
    #[inline(always)]
    fn sum16(self, a: &[__m512; LANES]) -> __m512 {
        // SAFETY: the token proves AVX-512F.
        unsafe {
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
    }
    #[inline(always)]
    fn transpose16(self, a: &mut [__m512; LANES]) {
        // SAFETY: the token proves AVX-512F; no memory is touched.
        unsafe {
            // Within 128-bit lanes, four rows at a time: after the two unpacks,
            // `u[4g + m]` holds in its lane `l` column `4l + m` of rows `4g..4g + 4`.
            let mut u = [_mm512_setzero_ps(); LANES];
            for g in 0..4 {
                let r = &a[4 * g..4 * g + 4];
                let lo01 = _mm512_castps_pd(_mm512_unpacklo_ps(r[0], r[1]));
                let hi01 = _mm512_castps_pd(_mm512_unpackhi_ps(r[0], r[1]));
                let lo23 = _mm512_castps_pd(_mm512_unpacklo_ps(r[2], r[3]));
                let hi23 = _mm512_castps_pd(_mm512_unpackhi_ps(r[2], r[3]));
                u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo01, lo23));
                u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo01, lo23));
                u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi01, hi23));
                u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi01, hi23));
            }
            // Across 128-bit lanes: column `4l + m` gathers lane `l` of `u[m]`,
            // `u[4 + m]`, `u[8 + m]`, `u[12 + m]`.
            for m in 0..4 {
                let even01 = _mm512_shuffle_f32x4::<0b10_00_10_00>(u[m], u[4 + m]);
                let odd01 = _mm512_shuffle_f32x4::<0b11_01_11_01>(u[m], u[4 + m]);
                let even23 = _mm512_shuffle_f32x4::<0b10_00_10_00>(u[8 + m], u[12 + m]);
                let odd23 = _mm512_shuffle_f32x4::<0b11_01_11_01>(u[8 + m], u[12 + m]);
                a[m] = _mm512_shuffle_f32x4::<0b10_00_10_00>(even01, even23);
                a[8 + m] = _mm512_shuffle_f32x4::<0b11_01_11_01>(even01, even23);
                a[4 + m] = _mm512_shuffle_f32x4::<0b10_00_10_00>(odd01, odd23);
                a[12 + m] = _mm512_shuffle_f32x4::<0b11_01_11_01>(odd01, odd23);
            }
        }
    }
    #[inline(always)]
    fn max_lane(self, a: __m512) -> f32 {
        // SAFETY: the token proves AVX-512F.
        unsafe {
            // The reduction's `max` keeps a NaN only in some positions of its tree.
            if _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a) != 0 {
                return f32::NAN;
            }
            _mm512_reduce_max_ps(a)
        }
    }
    #[inline(always)]
    unsafe fn load_pairs(self, p: *const u32) -> __m512i {
        // SAFETY: the caller guarantees 16 readable `u32`; the token, AVX-512F.
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    }
    #[inline(always)]
    unsafe fn store_pairs(self, p: *mut u32, v: __m512i) {
        // SAFETY: the caller guarantees 16 writable `u32`; the token, AVX-512F.
        unsafe { _mm512_storeu_si512(p as *mut __m512i, v) }
    }
    #[inline(always)]
    fn splat_pair(self, x: u32) -> __m512i {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_set1_epi32(x as i32) }
    }
    #[inline(always)]
    fn dot2(self, acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        if BF16 {
            // SAFETY: `BF16` tokens exist only on CPUs with AVX512-BF16; the bf16
            // vector types are the same 512 bits reinterpreted.
            unsafe {
                let (a, b) = (
                    std::mem::transmute::<__m512i, __m512bh>(a),
                    std::mem::transmute::<__m512i, __m512bh>(b),
                );
                _mm512_dpbf16_ps(acc, a, b)
            }
        } else {
            // SAFETY: the token proves AVX-512F.
            unsafe {
                let high = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
                let hi = |x| _mm512_castsi512_ps(_mm512_and_si512(x, high));
                let lo = |x| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x));
                _mm512_fmadd_ps(lo(a), lo(b), _mm512_fmadd_ps(hi(a), hi(b), acc))
            }
        }
    }
    #[inline(always)]
    fn widen_pairs(self, a: __m512i) -> (__m512, __m512) {
        // SAFETY: the token proves AVX-512F; no memory is touched.
        unsafe {
            let high = _mm512_and_si512(a, _mm512_set1_epi32(0xFFFF_0000u32 as i32));
            let low = _mm512_slli_epi32::<16>(a);
            (_mm512_castsi512_ps(high), _mm512_castsi512_ps(low))
        }
    }
    #[inline(always)]
    fn pack_bf16(self, low: __m512, high: __m512) -> __m512i {
        if BF16 {
            // SAFETY: `BF16` tokens exist only on CPUs with AVX512-BF16 (and BW for
            // the word permutation); the bf16 vector type is the same 512 bits.
            unsafe {
                // `vcvtne2ps2bf16` rounds as `bf16_bits` does (but flushes subnormals),
                // words `[low₀ … low₁₅, high₀ … high₁₅]`, which one permutation
                // interleaves into pairs.
                let words =
                    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(high, low));
                let interleave = _mm512_set_epi16(
                    31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                    5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0,
                );
                return _mm512_permutexvar_epi16(interleave, words);
            }
        }
        // SAFETY: the token proves AVX-512F.
        unsafe {
            let l = _mm512_srli_epi32::<16>(round_bf16(low));
            let h = _mm512_and_si512(round_bf16(high), _mm512_set1_epi32(0xFFFF_0000u32 as i32));
            _mm512_or_si512(l, h)
        }
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut u16, x: __m512) {
        // SAFETY: the caller guarantees 16 writable `u16`; the token, AVX-512F.
        unsafe {
            let words = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(round_bf16(x)));
            _mm256_storeu_si256(p as *mut __m256i, words);
        }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> __m512 {
        // SAFETY: the caller guarantees 16 readable `u16`; the token, AVX-512F.
        unsafe {
            let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
        }
    }
    #[inline(always)]
    fn dot4(self, acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        if BF16 {
            // SAFETY: `BF16` tokens exist only on CPUs with AVX512-VNNI.
            return unsafe { _mm512_dpbusd_epi32(acc, a, b) };
        }
        // SAFETY: the token proves AVX-512 BW. As AVX2's `dot4_half`: the bytes
        // widened to 16 bits, even and odd apart, whose pair sums cannot saturate.
        unsafe {
            let low_bytes = _mm512_set1_epi16(0x00FF);
            let a_even = _mm512_and_si512(a, low_bytes);
            let a_odd = _mm512_srli_epi16::<8>(a);
            let b_even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(b));
            let b_odd = _mm512_srai_epi16::<8>(b);
            let even = _mm512_madd_epi16(a_even, b_even);
            let odd = _mm512_madd_epi16(a_odd, b_odd);
            _mm512_add_epi32(acc, _mm512_add_epi32(even, odd))
        }
    }
    #[inline(always)]
    fn dot4_narrow(self, acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        if BF16 {
            return self.dot4(acc, a, b);
        }
        // SAFETY: the token proves AVX-512 BW.
        unsafe {
            let pairs = _mm512_maddubs_epi16(a, b);
            _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
        }
    }
    #[inline(always)]
    fn mul_sub_i32(self, acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_sub_epi32(acc, _mm512_mullo_epi32(a, b)) }
    }
    #[inline(always)]
    fn i32_to_f32(self, a: __m512i) -> __m512 {
        // SAFETY: the token proves AVX-512F; the rounding is MXCSR's, to nearest.
        unsafe { _mm512_cvtepi32_ps(a) }
    }
}
