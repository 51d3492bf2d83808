//! A pure streaming read, the yardstick of memory-bound kernels.

use rayon::prelude::*;

use crate::isa::{dispatch, IsaToken, Simd, SimdJob, LANES};

/// Floats per parallel task: large enough that each task streams for a while.
const TASK: usize = 1 << 18;

/// The sum of `x`, split over the current rayon pool and read once at full vector
/// width: the read bandwidth that `attend bench --decode` compares decoding with.
pub fn stream_sum(x: &[f32]) -> f32 {
    let isa = IsaToken::best();
    x.par_chunks(TASK).map(|c| dispatch(isa, ChunkSum(c))).sum()
}

/// The sum of one chunk, with four independent accumulators.
struct ChunkSum<'a>(&'a [f32]);

impl SimdJob for ChunkSum<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<I: Simd>(self, isa: I) -> f32 {
        const STEP: usize = 4 * LANES;
        let mut acc = [isa.splat(0.0); 4];
        let mut blocks = self.0.chunks_exact(STEP);
        for block in &mut blocks {
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: `block` holds `4 · 16` floats.
                *a = isa.add(*a, unsafe { isa.load(block.as_ptr().add(i * LANES)) });
            }
        }
        let total = isa.add(isa.add(acc[0], acc[1]), isa.add(acc[2], acc[3]));
        isa.sum(total) + blocks.remainder().iter().sum::<f32>()
    }
}
