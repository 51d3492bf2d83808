//! The portable [`Simd`]: plain arrays that the compiler vectorises for the build
//! target. Slower than the intrinsics, but it runs everywhere and passes every test.

use super::{exp2_scalar, Simd, LANES};

/// Sixteen f32 lanes as a plain array.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

type V = [f32; LANES];

#[inline(always)]
fn map2(a: V, b: V, f: impl Fn(f32, f32) -> f32) -> V {
    let mut out = [0.0; LANES];
    for i in 0..LANES {
        out[i] = f(a[i], b[i]);
    }
    out
}

// SAFETY: uses no instruction beyond the build target's; pointers are the caller's duty.
unsafe impl Simd for Portable {
    type V = V;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> V {
        std::ptr::read_unaligned(p as *const V)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: V) {
        std::ptr::write_unaligned(p as *mut V, v)
    }
    #[inline(always)]
    unsafe fn splat_load(p: *const f32) -> V {
        [*p; LANES]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> V {
        [x; LANES]
    }
    #[inline(always)]
    unsafe fn fma(a: V, b: V, c: V) -> V {
        let mut out = [0.0; LANES];
        for i in 0..LANES {
            // Fused, like the SIMD kernels: one rounding. (Where the build target has
            // no FMA instruction this is a library call: slow, but exact.)
            out[i] = a[i].mul_add(b[i], c[i]);
        }
        out
    }
    #[inline(always)]
    unsafe fn add(a: V, b: V) -> V {
        map2(a, b, |x, y| x + y)
    }
    #[inline(always)]
    unsafe fn sub(a: V, b: V) -> V {
        map2(a, b, |x, y| x - y)
    }
    #[inline(always)]
    unsafe fn mul(a: V, b: V) -> V {
        map2(a, b, |x, y| x * y)
    }
    #[inline(always)]
    unsafe fn max(a: V, b: V) -> V {
        // Like x86 `maxps`: returns b unless a > b, so a NaN in b survives.
        map2(a, b, |x, y| if x > y { x } else { y })
    }
    #[inline(always)]
    unsafe fn masked(y: V, mask: V) -> V {
        map2(y, mask, |y, m| if m == f32::NEG_INFINITY { m } else { y })
    }
    #[inline(always)]
    unsafe fn exp2(x: V) -> V {
        let mut out = [0.0; LANES];
        for i in 0..LANES {
            out[i] = exp2_scalar(x[i]);
        }
        out
    }
}
