//! Reading key and value rows of either element type as f32 vectors.
//!
//! The decode kernel is written once over the element type of `k` and `v`: an f32
//! row is loaded as it is, a bf16 row through [`Simd::load_bf16`], which widens it
//! exactly. Everything after the load (scores, softmax statistics, accumulators) is
//! f32 whatever the cache holds, so a bf16 cache reads half the bytes for the same
//! arithmetic.

use crate::element::{Dtype, Element};
use crate::isa::{Simd, LANES};

/// Loads 16 contiguous elements at `p`, widened to f32.
///
/// # Safety
/// `p` must be valid for reading 16 elements.
#[inline(always)]
pub(super) unsafe fn load<T: Element, I: Simd>(isa: I, p: *const T) -> I::V {
    // SAFETY: `Element` is sealed to `f32` (whose `DTYPE` is `F32`) and `half::bf16`
    // (`Bf16`, a `repr(transparent)` `u16`), so the cast names `T` itself; the caller
    // guarantees 16 readable elements. `DTYPE` is a constant: the match folds away.
    unsafe {
        match T::DTYPE {
            Dtype::F32 => isa.load(p.cast::<f32>()),
            Dtype::Bf16 => isa.load_bf16(p.cast::<u16>()),
        }
    }
}

/// Loads the first `n ≤ 16` elements at `p`, widened to f32, zeros in the other
/// lanes.
///
/// # Safety
/// `p` must be valid for reading `n` elements.
#[inline(always)]
pub(super) unsafe fn load_part<T: Element, I: Simd>(isa: I, p: *const T, n: usize) -> I::V {
    debug_assert!(n <= LANES);
    // SAFETY: as in [`load`]; only the `n` elements the caller guarantees are read
    // (a bf16 tail is copied into a zeroed buffer of 16 first: `Simd` has no masked
    // bf16 load, and tails are rare, at most one per row).
    unsafe {
        match T::DTYPE {
            Dtype::F32 => isa.load_part(p.cast::<f32>(), n),
            Dtype::Bf16 => {
                let mut tail = [0u16; LANES];
                std::ptr::copy_nonoverlapping(p.cast::<u16>(), tail.as_mut_ptr(), n);
                isa.load_bf16(tail.as_ptr())
            }
        }
    }
}
