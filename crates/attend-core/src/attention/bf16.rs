//! Attention on bf16 tensors, and on f32 tensors with [`Precision::Bf16`].
//!
//! Where the instruction set multiplies bf16 numbers faster than f32 ones
//! ([`Isa::has_bf16_products`](crate::isa::Isa::has_bf16_products)), the fused
//! kernel has its own bf16 form, which reads the rows of `k` and `v` in place (a
//! strided view is copied first). Elsewhere the f32 fused kernel runs on the bf16
//! numbers widened (exact: a shift): it reads `q` in place, widening it as a unit
//! packs it, and writes its output in bf16; on AVX-512 it reads `k` and `v` in
//! place too, widening each number as it loads it, on AVX2 they are widened once
//! per call. The pair products there are two fused
//! multiply-adds behind the shifts that widen each pair, 3.5–4× slower than the
//! f32 kernel at B1 H8 N2048 on AVX2. The decode kernel reads bf16 rows in place and widens them as it loads
//! them; the reference runs on the bf16 numbers widened to f32, exactly.

use std::mem::MaybeUninit;

use ndarray::{Array4, ArrayView3, ArrayView4};
use rayon::prelude::*;

use super::{choose_kernel, Config, Kernel};
use crate::element::sealed::{Computed, FusedBackward, Sealed};
use crate::element::{bf16, round_to_bf16, to_f32_on};
use crate::isa::{dispatch, IsaToken, Simd, SimdJob};
use crate::kernels::backward::fused as backward_kernel;
use crate::kernels::fused::{self, amx as fused_amx, bf16 as fused_bf16};
use crate::kernels::lse::LogSumExp;
use crate::kernels::round::round_into;
use crate::kernels::{decode, reference};
use crate::problem::{Dropout, Precision, Problem};
use crate::Result;

impl Sealed for bf16 {
    fn compute(problem: &Problem<'_, bf16>, config: &Config) -> Result<Computed<bf16>> {
        let isa = config.exec.token()?;
        let which = choose_kernel(problem, config.kernel)?;
        // The fused kernel writes bf16 itself; the others' f32 output is rounded.
        let run = || match which {
            // The tiles, where they take the problem and its values are finite.
            Kernel::Fused => match fused_amx::takes(problem, isa) {
                Some(amx) => fused_amx::run(problem, amx, isa)
                    .unwrap_or_else(|| fused_on_vectors(problem, isa)),
                None => fused_on_vectors(problem, isa),
            },
            // Reads the bf16 rows of k and v in place, widening them as it loads.
            Kernel::Decode => {
                let (out, lse) =
                    decode::run(problem, decode::KeySpan::whole(problem.dims().kv_len), isa);
                (round_output(&out, isa), lse)
            }
            Kernel::Reference | Kernel::Auto => {
                let [q, k, v] = [&problem.q, &problem.k, &problem.v].map(|a| a.mapv(bf16::to_f32));
                let trace = reference::run(&problem.with_tensors(q.view(), k.view(), v.view()));
                (round_output(&trace.output, isa), trace.lse)
            }
        };
        let (out, lse) = config.exec.install(run)?;
        Ok((out, [lse.value, lse.residual]))
    }

    fn fused_backward(
        p: &Problem<'_, Self>,
        out: ArrayView4<'_, Self>,
        lse: (ArrayView3<'_, f32>, Option<ArrayView3<'_, f32>>),
        dout: ArrayView4<'_, Self>,
        dropout: Option<&Dropout>,
        want_ds: bool,
        isa: IsaToken,
    ) -> FusedBackward<Self> {
        backward_kernel::run(p, out, lse, dout, dropout, want_ds, isa)
    }
}

/// The fused forward on the vector registers: the bf16 kernel where the
/// instruction set has bf16 products, else the f32 kernel on the widened numbers.
fn fused_on_vectors(problem: &Problem<'_, bf16>, isa: IsaToken) -> (Array4<bf16>, LogSumExp) {
    if isa.isa().has_bf16_products() {
        return if fused_bf16::reads_in_place(problem) {
            fused_bf16::run(problem, isa)
        } else {
            let [k, v] = [&problem.k, &problem.v].map(|a| a.as_standard_layout());
            fused_bf16::run(
                &problem.with_tensors(problem.q.view(), k.view(), v.view()),
                isa,
            )
        };
    }
    // The f32 kernel, reading the bf16 numbers in place and widening them as it
    // loads them, where 32 registers let each widened broadcast of `k` or `v` feed
    // four panels' products (narrower units widen each tile of them first). On 16
    // registers a broadcast feeds one panel (two 8-lane products), and its shift
    // made the forward 3–9 % slower than widening `k` and `v` once per call
    // (docs/bf16.md), and widening each tile 3–14 % slower; its units still pack
    // `q` and write the output in bf16.
    if isa.registers() >= 32 {
        fused::run(problem, isa, None)
    } else {
        let [k, v] = [&problem.k, &problem.v].map(|a| to_f32_on(isa, a.view()));
        fused::run(
            &problem.with_tensors(problem.q.view(), k.view(), v.view()),
            isa,
            None,
        )
    }
}

/// Values rounded (or widened) per task: large enough that a task's overhead is
/// nothing beside it, small enough that both threads share a short tensor.
const ROUND_CHUNK: usize = 1 << 14;

/// A kernel's f32 output rounded to bf16 (to nearest, ties to even, as
/// `bf16::from_f32`), on the current rayon pool with `isa`'s vectors: one thread
/// rounding element by element took 4 % of a bf16 forward's time at B1 H8 N512
/// (docs/bf16.md).
fn round_output(out: &Array4<f32>, isa: IsaToken) -> Array4<bf16> {
    let Some(src) = out.as_slice() else {
        return out.mapv(bf16::from_f32);
    };
    // Written uninitialised: zeroing it first was a serial pass over the output.
    let mut values: Vec<bf16> = Vec::with_capacity(src.len());
    values.spare_capacity_mut()[..src.len()]
        .par_chunks_mut(ROUND_CHUNK)
        .zip(src.par_chunks(ROUND_CHUNK))
        .for_each(|(dst, src)| dispatch(isa, RoundChunk { src, dst }));
    // SAFETY: the chunks cover the first `src.len()` values, and each `RoundChunk`
    // writes every value of its chunk.
    unsafe { values.set_len(src.len()) };
    Array4::from_shape_vec(out.raw_dim(), values).expect("one value per output")
}

/// One chunk of [`round_output`], for [`dispatch`]: writes every value of `dst`.
struct RoundChunk<'a> {
    src: &'a [f32],
    dst: &'a mut [MaybeUninit<bf16>],
}

impl SimdJob for RoundChunk<'_> {
    type Output = ();
    #[inline(always)]
    fn run<I: Simd>(self, isa: I) {
        round_into(isa, self.src, self.dst);
    }
}

/// [`Precision::Bf16`] on f32 tensors: rounds them to bf16, computes in bf16 and
/// widens the result.
pub(super) fn compute_rounded(problem: &Problem<'_>, config: &Config) -> Result<Computed<f32>> {
    debug_assert_eq!(problem.precision, Precision::Bf16);
    let isa = config.exec.token()?;
    let tiles = choose_kernel(problem, config.kernel)? == Kernel::Fused
        && fused_amx::takes(problem, isa).is_some();
    if !isa.isa().has_bf16_products() && !tiles {
        // The f32 kernels on the rounded numbers, as bf16 tensors take them here,
        // without the trip through bf16 storage and back.
        let [q, k, v] = [&problem.q, &problem.k, &problem.v].map(|a| round_to_bf16(a.view()));
        let mut rounded = problem.with_tensors(q.view(), k.view(), v.view());
        rounded.precision = Precision::F32;
        let (out, lse) = <f32 as Sealed>::compute(&rounded, config)?;
        return Ok((round_to_bf16(out.view()), lse));
    }
    let [q, k, v] = [&problem.q, &problem.k, &problem.v].map(|a| a.mapv(bf16::from_f32));
    let rounded = problem.with_tensors(q.view(), k.view(), v.view());
    let (out, lse) = bf16::compute(&rounded, config)?;
    Ok((out.mapv(bf16::to_f32), lse))
}
