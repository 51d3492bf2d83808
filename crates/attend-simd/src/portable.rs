//! The portable [`Simd`]: plain arrays that the compiler vectorises for the build
//! target. Slower than the intrinsics, but it runs everywhere and passes every test.

use super::{bf16_bits, bf16_to_f32, exp_scalar, Simd, LANES};

/// Sixteen f32 lanes as a plain array; needs no CPU feature.
#[derive(Clone, Copy, Debug)]
pub struct Portable;

type V = [f32; LANES];
type P = [u32; LANES];

/// The low and high bf16 halves of a pair, as f32.
#[inline(always)]
fn halves(x: u32) -> (f32, f32) {
    (bf16_to_f32(x as u16), f32::from_bits(x & 0xFFFF_0000))
}

#[inline(always)]
fn map2(a: V, b: V, f: impl Fn(f32, f32) -> f32) -> V {
    std::array::from_fn(|i| f(a[i], b[i]))
}

// SAFETY: uses no instruction beyond the build target's.
unsafe impl Simd for Portable {
    type V = V;
    type P = P;
    const REGISTERS: usize = 4;
    const NATIVE_DOT4: bool = false;
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> V {
        // SAFETY: the caller guarantees 16 readable floats.
        unsafe { std::ptr::read_unaligned(p as *const V) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: V) {
        // SAFETY: the caller guarantees 16 writable floats.
        unsafe { std::ptr::write_unaligned(p as *mut V, v) }
    }
    #[inline(always)]
    unsafe fn load_part(self, p: *const f32, n: usize) -> V {
        let mut out = [0.0; LANES];
        // SAFETY: the caller guarantees `n ≤ 16` readable floats.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), n) };
        out
    }
    #[inline(always)]
    unsafe fn store_part(self, p: *mut f32, v: V, n: usize) {
        // SAFETY: the caller guarantees `n ≤ 16` writable floats.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p, n) };
    }
    #[inline(always)]
    fn splat(self, x: f32) -> V {
        [x; LANES]
    }
    #[inline(always)]
    fn fma(self, a: V, b: V, c: V) -> V {
        // Fused, like the SIMD kernels: one rounding. (Where the build target has
        // no FMA instruction this is a library call: slow, but exact.)
        std::array::from_fn(|i| a[i].mul_add(b[i], c[i]))
    }
    #[inline(always)]
    fn add(self, a: V, b: V) -> V {
        map2(a, b, |x, y| x + y)
    }
    #[inline(always)]
    fn sub(self, a: V, b: V) -> V {
        map2(a, b, |x, y| x - y)
    }
    #[inline(always)]
    fn mul(self, a: V, b: V) -> V {
        map2(a, b, |x, y| x * y)
    }
    #[inline(always)]
    fn div(self, a: V, b: V) -> V {
        map2(a, b, |x, y| x / y)
    }
    #[inline(always)]
    fn max(self, a: V, b: V) -> V {
        // Like x86 `maxps`: returns b unless a > b, so a NaN in b survives.
        map2(a, b, |x, y| if x > y { x } else { y })
    }
    #[inline(always)]
    fn masked(self, y: V, mask: V) -> V {
        map2(y, mask, |y, m| if m == f32::NEG_INFINITY { m } else { y })
    }
    #[inline(always)]
    fn exp(self, x: V) -> V {
        x.map(exp_scalar)
    }
    #[inline(always)]
    fn sum(self, a: V) -> f32 {
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
    fn sum16(self, a: &[V; LANES]) -> V {
        std::array::from_fn(|j| self.sum(a[j]))
    }
    #[inline(always)]
    fn transpose16(self, a: &mut [V; LANES]) {
        let t = *a;
        *a = std::array::from_fn(|i| std::array::from_fn(|j| t[j][i]));
    }
    #[inline(always)]
    fn max_lane(self, a: V) -> f32 {
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
    unsafe fn load_pairs(self, p: *const u32) -> P {
        // SAFETY: the caller guarantees 16 readable `u32`.
        unsafe { std::ptr::read_unaligned(p as *const P) }
    }
    #[inline(always)]
    unsafe fn store_pairs(self, p: *mut u32, v: P) {
        // SAFETY: the caller guarantees 16 writable `u32`.
        unsafe { std::ptr::write_unaligned(p as *mut P, v) }
    }
    #[inline(always)]
    fn splat_pair(self, x: u32) -> P {
        [x; LANES]
    }
    #[inline(always)]
    fn dot2(self, acc: V, a: P, b: P) -> V {
        std::array::from_fn(|i| {
            let ((a_lo, a_hi), (b_lo, b_hi)) = (halves(a[i]), halves(b[i]));
            a_lo.mul_add(b_lo, a_hi.mul_add(b_hi, acc[i]))
        })
    }
    #[inline(always)]
    fn widen_pairs(self, a: P) -> (V, V) {
        (
            std::array::from_fn(|i| halves(a[i]).1),
            std::array::from_fn(|i| halves(a[i]).0),
        )
    }
    #[inline(always)]
    fn pack_bf16(self, low: V, high: V) -> P {
        std::array::from_fn(|i| bf16_bits(low[i]) as u32 | (bf16_bits(high[i]) as u32) << 16)
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut u16, x: V) {
        // SAFETY: the caller guarantees 16 writable `u16`.
        unsafe { std::ptr::write_unaligned(p as *mut [u16; LANES], x.map(bf16_bits)) };
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> V {
        // SAFETY: the caller guarantees 16 readable `u16`.
        let bits = unsafe { std::ptr::read_unaligned(p as *const [u16; LANES]) };
        bits.map(bf16_to_f32)
    }
    #[inline(always)]
    fn dot4(self, acc: P, a: P, b: P) -> P {
        std::array::from_fn(|i| {
            let (a, b) = (a[i].to_le_bytes(), b[i].to_le_bytes());
            let sum: i32 = (0..4).map(|t| a[t] as i32 * b[t] as i8 as i32).sum();
            (acc[i] as i32).wrapping_add(sum) as u32
        })
    }
    #[inline(always)]
    fn dot4_narrow(self, acc: P, a: P, b: P) -> P {
        self.dot4(acc, a, b)
    }
    #[inline(always)]
    fn mul_sub_i32(self, acc: P, a: P, b: P) -> P {
        std::array::from_fn(|i| acc[i].wrapping_sub(a[i].wrapping_mul(b[i])))
    }
    #[inline(always)]
    fn i32_to_f32(self, a: P) -> V {
        a.map(|x| x as i32 as f32)
    }
}
