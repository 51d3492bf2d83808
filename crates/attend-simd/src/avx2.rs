//! [`Simd`] on AVX2 + FMA: two `__m256` per 16-lane vector; with AVX-VNNI, int8
//! dot products by the 256-bit `vpdpbusd`.

use std::arch::x86_64::*;

use super::{Simd, EXP2_POLY, LANES, LOG2_E};

/// Proof that the CPU has AVX2 and FMA, and with `VNNI` also AVX-VNNI (Intel
/// Alder Lake on, AMD Zen 5): only [`Avx2::new`] and [`Avx2Vnni::new`] make one.
/// Both share every operation but [`Simd::dot4`].
#[derive(Clone, Copy, Debug)]
pub struct Avx2Of<const VNNI: bool>(());

/// AVX2 and FMA.
pub type Avx2 = Avx2Of<false>;

/// AVX2 and FMA with AVX-VNNI.
pub type Avx2Vnni = Avx2Of<true>;

impl Avx2 {
    /// The token, if this CPU has AVX2 and FMA.
    pub fn new() -> Option<Self> {
        super::has_avx2().then_some(Avx2Of(()))
    }
}

impl Avx2Vnni {
    /// The token, if this CPU has AVX2, FMA and AVX-VNNI.
    pub fn new() -> Option<Self> {
        super::has_avx2vnni().then_some(Avx2Of(()))
    }
}

/// Sixteen lanes as two halves.
#[derive(Clone, Copy)]
pub struct V2(__m256, __m256);

/// Sixteen bf16 pairs as two halves.
#[derive(Clone, Copy)]
pub struct P2(__m256i, __m256i);

/// `acc + a.high · b.high + a.low · b.low` for eight pairs (see [`Simd::dot2`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline(always)]
unsafe fn dot2_half(acc: __m256, a: __m256i, b: __m256i) -> __m256 {
    // SAFETY: the caller guarantees AVX2 and FMA; no memory is touched.
    unsafe {
        let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        let hi = |x| _mm256_castsi256_ps(_mm256_and_si256(x, high));
        let lo = |x| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x));
        _mm256_fmadd_ps(lo(a), lo(b), _mm256_fmadd_ps(hi(a), hi(b), acc))
    }
}

/// `acc + Σ a.byte[t] · b.byte[t]` for eight lanes of four bytes (see
/// [`Simd::dot4`]): the bytes widened to 16 bits, even and odd ones apart, and
/// multiplied in pairs by `vpmaddwd`, whose sums (at most 2 · 255 · 128) cannot
/// saturate.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn dot4_half(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: the caller guarantees AVX2; no memory is touched.
    unsafe {
        let low_bytes = _mm256_set1_epi16(0x00FF);
        let a_even = _mm256_and_si256(a, low_bytes);
        let a_odd = _mm256_srli_epi16::<8>(a);
        let b_even = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(b));
        let b_odd = _mm256_srai_epi16::<8>(b);
        let even = _mm256_madd_epi16(a_even, b_even);
        let odd = _mm256_madd_epi16(a_odd, b_odd);
        _mm256_add_epi32(acc, _mm256_add_epi32(even, odd))
    }
}

/// Eight floats rounded to bf16 (see [`super::bf16_bits`]), the result in the high
/// half of each 32-bit lane.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn round_bf16_half(x: __m256) -> __m256i {
    // SAFETY: the caller guarantees AVX2; no memory is touched.
    unsafe {
        let bits = _mm256_castps_si256(x);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
        let rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
        let quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x0040_0000));
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        _mm256_blendv_epi8(rounded, quiet, nan)
    }
}

/// Eight bf16 numbers widened to f32.
///
/// # Safety
/// The CPU must have AVX2; `p` valid for reading 8 `u16`.
#[inline(always)]
unsafe fn load_bf16_half(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees AVX2 and 8 readable `u16`.
    unsafe {
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
    }
}

/// `e^x` of one half (see [`Simd::exp`]), flushed to 0 below `2^−126`: one
/// scaling by `2^n` built from its bits, where a result that may be subnormal
/// needs two (and AVX2 has no `vscalefps`). A softmax weight that small changes
/// no sum it joins (the largest weight of a row is 1).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline(always)]
unsafe fn exp_half(x: __m256) -> __m256 {
    // SAFETY: the caller guarantees AVX2 and FMA; no memory is touched.
    unsafe {
        // max(−127 ln 2, x) keeps a NaN x (second operand); below it n = −127.
        let x = _mm256_max_ps(_mm256_set1_ps(EXP_FLUSH_ARG), x);
        // x · log₂e = n + f, the product exact inside the fused multiply-adds
        // ([`exp_scalar`](crate::exp_scalar)'s reduction).
        const MAGIC: f32 = 12_582_912.0;
        let log2e = _mm256_set1_ps(LOG2_E);
        let t = _mm256_fmadd_ps(x, log2e, _mm256_set1_ps(MAGIC));
        let n = _mm256_sub_ps(t, _mm256_set1_ps(MAGIC));
        let f = _mm256_fmsub_ps(x, log2e, n);
        let c = EXP2_POLY;
        let (&last, lower) = c.split_last().expect("a polynomial has a coefficient");
        let mut p = _mm256_set1_ps(last);
        for &ci in lower.iter().rev() {
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(ci));
        }
        // 2^n for −126 ≤ n ≤ 127 and 0 for n = −127 (a zero exponent field).
        // NaN → i32::MIN, whose scale is finite; p is NaN then anyway.
        let ni = _mm256_cvtps_epi32(n);
        let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(ni, _mm256_set1_epi32(127)));
        _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
    }
}

/// `−127 · ln 2`, the argument below which AVX2's `e^x` is 0 (its reduction's
/// integer stays at −127, whose scale has a zero exponent field).
const EXP_FLUSH_ARG: f32 = -88.029_69;

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

/// The 8 × 8 transpose of eight vectors: lane `i` of row `j` becomes lane `j` of
/// row `i`.
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // SAFETY: the caller guarantees AVX2; no memory is touched.
    unsafe {
        // Within 128-bit halves: `u[4g + m]` holds in half `l` column `4l + m` of
        // rows `4g..4g + 4`.
        let mut u = [_mm256_setzero_ps(); 8];
        for g in 0..2 {
            let q = &r[4 * g..4 * g + 4];
            let lo01 = _mm256_castps_pd(_mm256_unpacklo_ps(q[0], q[1]));
            let hi01 = _mm256_castps_pd(_mm256_unpackhi_ps(q[0], q[1]));
            let lo23 = _mm256_castps_pd(_mm256_unpacklo_ps(q[2], q[3]));
            let hi23 = _mm256_castps_pd(_mm256_unpackhi_ps(q[2], q[3]));
            u[4 * g] = _mm256_castpd_ps(_mm256_unpacklo_pd(lo01, lo23));
            u[4 * g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(lo01, lo23));
            u[4 * g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(hi01, hi23));
            u[4 * g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(hi01, hi23));
        }
        let mut out = [_mm256_setzero_ps(); 8];
        for m in 0..4 {
            out[m] = _mm256_permute2f128_ps::<0x20>(u[m], u[4 + m]);
            out[4 + m] = _mm256_permute2f128_ps::<0x31>(u[m], u[4 + m]);
        }
        out
    }
}

/// Applies a two-operand AVX2 operation to both halves.
macro_rules! halves {
    ($op:ident, $a:expr, $b:expr) => {
        // SAFETY: the token proves AVX2 and FMA; no memory is touched.
        unsafe { V2($op($a.0, $b.0), $op($a.1, $b.1)) }
    };
}

// SAFETY: an `Avx2Of` exists only on CPUs with AVX2 and FMA (`Avx2::new`), the
// only instructions used here but `vpdpbusd`, used only by `Avx2Vnni`, which
// exists only on CPUs that also have AVX-VNNI.
unsafe impl<const VNNI: bool> Simd for Avx2Of<VNNI> {
    type V = V2;
    type P = P2;
    const REGISTERS: usize = 8;
    const NATIVE_DOT4: bool = VNNI;
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
    fn div(self, a: V2, b: V2) -> V2 {
        halves!(_mm256_div_ps, a, b)
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
    fn exp(self, x: V2) -> V2 {
        // SAFETY: the token proves AVX2 and FMA.
        unsafe { V2(exp_half(x.0), exp_half(x.1)) }
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
    fn transpose16(self, a: &mut [V2; LANES]) {
        // SAFETY: the token proves AVX2; no memory is touched.
        unsafe {
            // Four 8 × 8 blocks: rows 0–7 and 8–15 by lanes 0–7 and 8–15; the
            // off-diagonal blocks trade places.
            let block = |rows: usize, high: bool| -> [__m256; 8] {
                transpose8(std::array::from_fn(|r| {
                    let v = a[rows + r];
                    if high {
                        v.1
                    } else {
                        v.0
                    }
                }))
            };
            let (top_lo, top_hi) = (block(0, false), block(0, true));
            let (bottom_lo, bottom_hi) = (block(8, false), block(8, true));
            for c in 0..8 {
                a[c] = V2(top_lo[c], bottom_lo[c]);
                a[8 + c] = V2(top_hi[c], bottom_hi[c]);
            }
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
    #[inline(always)]
    unsafe fn load_pairs(self, p: *const u32) -> P2 {
        // SAFETY: the caller guarantees 16 readable `u32`; the token, AVX2.
        unsafe {
            P2(
                _mm256_loadu_si256(p as *const __m256i),
                _mm256_loadu_si256(p.add(8) as *const __m256i),
            )
        }
    }
    #[inline(always)]
    unsafe fn store_pairs(self, p: *mut u32, v: P2) {
        // SAFETY: the caller guarantees 16 writable `u32`; the token, AVX2.
        unsafe {
            _mm256_storeu_si256(p as *mut __m256i, v.0);
            _mm256_storeu_si256(p.add(8) as *mut __m256i, v.1);
        }
    }
    #[inline(always)]
    fn splat_pair(self, x: u32) -> P2 {
        // SAFETY: the token proves AVX2.
        let x = unsafe { _mm256_set1_epi32(x as i32) };
        P2(x, x)
    }
    #[inline(always)]
    fn dot2(self, acc: V2, a: P2, b: P2) -> V2 {
        // SAFETY: the token proves AVX2 and FMA.
        unsafe { V2(dot2_half(acc.0, a.0, b.0), dot2_half(acc.1, a.1, b.1)) }
    }
    #[inline(always)]
    fn widen_pairs(self, a: P2) -> (V2, V2) {
        // SAFETY: the token proves AVX2; no memory is touched.
        unsafe {
            let mask = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
            let high = |x| _mm256_castsi256_ps(_mm256_and_si256(x, mask));
            let low = |x| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x));
            (V2(high(a.0), high(a.1)), V2(low(a.0), low(a.1)))
        }
    }
    #[inline(always)]
    fn pack_bf16(self, low: V2, high: V2) -> P2 {
        // SAFETY: the token proves AVX2.
        unsafe {
            let mask = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
            let half = |l, h| {
                let l = _mm256_srli_epi32::<16>(round_bf16_half(l));
                _mm256_or_si256(l, _mm256_and_si256(round_bf16_half(h), mask))
            };
            P2(half(low.0, high.0), half(low.1, high.1))
        }
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut u16, x: V2) {
        // SAFETY: the caller guarantees 16 writable `u16`; the token, AVX2.
        unsafe {
            let lo = _mm256_srli_epi32::<16>(round_bf16_half(x.0));
            let hi = _mm256_srli_epi32::<16>(round_bf16_half(x.1));
            // Packs within each 128-bit half (lo₀₋₃ hi₀₋₃ lo₄₋₇ hi₄₋₇), then puts the
            // quarters in order.
            let words = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(lo, hi));
            _mm256_storeu_si256(p as *mut __m256i, words);
        }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> V2 {
        // SAFETY: the caller guarantees 16 readable `u16`; the token, AVX2.
        unsafe { V2(load_bf16_half(p), load_bf16_half(p.add(8))) }
    }
    #[inline(always)]
    fn dot4(self, acc: P2, a: P2, b: P2) -> P2 {
        if VNNI {
            // SAFETY: `VNNI` tokens exist only on CPUs with AVX-VNNI.
            return unsafe {
                P2(
                    _mm256_dpbusd_avx_epi32(acc.0, a.0, b.0),
                    _mm256_dpbusd_avx_epi32(acc.1, a.1, b.1),
                )
            };
        }
        // SAFETY: the token proves AVX2.
        unsafe { P2(dot4_half(acc.0, a.0, b.0), dot4_half(acc.1, a.1, b.1)) }
    }
    #[inline(always)]
    fn dot4_narrow(self, acc: P2, a: P2, b: P2) -> P2 {
        if VNNI {
            return self.dot4(acc, a, b);
        }
        // SAFETY: the token proves AVX2.
        unsafe {
            let half = |acc, a, b| {
                let pairs = _mm256_maddubs_epi16(a, b);
                _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
            };
            P2(half(acc.0, a.0, b.0), half(acc.1, a.1, b.1))
        }
    }
    #[inline(always)]
    fn mul_sub_i32(self, acc: P2, a: P2, b: P2) -> P2 {
        // SAFETY: the token proves AVX2.
        unsafe {
            let half = |acc, a, b| _mm256_sub_epi32(acc, _mm256_mullo_epi32(a, b));
            P2(half(acc.0, a.0, b.0), half(acc.1, a.1, b.1))
        }
    }
    #[inline(always)]
    fn i32_to_f32(self, a: P2) -> V2 {
        // SAFETY: the token proves AVX2.
        unsafe { V2(_mm256_cvtepi32_ps(a.0), _mm256_cvtepi32_ps(a.1)) }
    }
}
