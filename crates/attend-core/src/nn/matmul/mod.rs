//! The dense layers' matrix product: `y = act(x · wᵀ + bias)`, written once over
//! the 16-lane vectors of [`crate::isa`] and used on every x86 CPU with AVX2 or
//! AVX-512.
//!
//! BLIS's structure, cut down to what encoder layers need: a register tile of 6
//! rows × one 16-output panel on AVX2's 16 registers (12 accumulators), 6 rows ×
//! four panels on AVX-512's 32 (24 accumulators, [`WIDE`]: each broadcast of `x`
//! feeds four products, so loads stay well below the multiply-adds) or, for a
//! block of 7 to 12 rows, all its rows × two panels (a short text's weights then
//! read once, not by a 6-row tile and again by the rest), `k` in blocks
//! of [`KC`], the weight read as 16-output panels (`[k][16]`). Inference layers
//! pack their weight into panels once, at load ([`PackedWeight`], made by
//! `Linear::for_inference`, on huge pages where the system gives them), so that
//! each panel is one sequential stream: with one short sentence the product is
//! bound by reading the weights from memory, and a sequential stream reads
//! fastest. In a block of more rows, the first tile over a group of panels
//! reads them from memory and the others from cache; those others fetch the
//! next group's lines meanwhile (`Tile::ahead`), so that memory does not sit
//! idle while the cache is read (the commit that made this gives the A/B:
//! 58-69 % of the FMA peak became 82-91 % from 64 rows on an AMD EPYC Zen 5).
//! Other layers pack per call, or, with few rows
//! and a column-major weight, read it where it lies. The bias is the accumulators'
//! starting point, and an [`Epilogue`] (an activation, or the residual and a
//! LayerNorm) is applied to each block while it is still in cache.
//!
//! Every path runs the same kernel in the same order of operations, and work is
//! split into blocks of rows × panels that each compute their outputs whole, so a
//! row's result depends neither on the other rows in the batch nor on the thread
//! count. Without AVX2, `Linear` keeps the `gemm` crate for f32; the bf16 product
//! ([`bf16`]) runs here on every instruction set, since only it has one.

use std::mem::MaybeUninit;

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use crate::isa::{dispatch, Isa, IsaToken, Simd, SimdJob};
use crate::memory::LargePageArray;

mod amx;
mod bf16;
mod epilogue;
mod int8;

use crate::kernels::scratch::with_scratch;
use crate::kernels::tile::{self, Ahead, Init, Tile, MR, NR, WIDE};

pub(crate) use bf16::{linear_bf16, PackedBf16};
pub(crate) use epilogue::Epilogue;
pub(crate) use int8::{linear_int8, PackedInt8};

/// Depth of a block of `k`: a `KC × NR` weight panel is 24 KiB, within L1.
const KC: usize = 384;
// The tile's partial sums (64 terms of the f32 product, a whole block of the
// bf16 one) divide a block, so that the order of operations does not depend on
// the blocking.
const _: () =
    assert!(KC.is_multiple_of(tile::SUM_BLOCK) && KC.is_multiple_of(tile::PAIR_SUM_BLOCK));
/// Rows per block when there are many. Every block reads its panels of the weight
/// (megabytes, from L3 or memory), so the more rows share them the less is read: a
/// 64-row product reads the weight once (the commit that set 240 instead of 48
/// gives its A/B; `scripts/bench/dense` shows the shares). 240 rows of `x` are
/// 360 KiB at `k = 384`, which leaves a 512 KiB L2 room for a tile's panels.
const MC: usize = 40 * MR;
/// Up to this many rows, the weight is read where it lies instead of being packed.
const FEW_ROWS: usize = 2 * MR;
/// Below this many multiply-adds a product runs on one thread: waking the other
/// costs more than it saves.
const PARALLEL_MIN: usize = 1 << 17;

/// Whether this module's product is the one to use on this CPU: where the best
/// instruction set is AVX2 or AVX-512 (measured against the `gemm` crate on both,
/// docs/encoder-speed.md).
pub(crate) fn available() -> bool {
    matches!(
        IsaToken::best().isa(),
        Isa::Avx2 | Isa::Avx2Vnni | Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx
    )
}

/// Where a product's f32 weight `[n, k]` comes from.
#[derive(Clone, Copy)]
pub(crate) enum Weight<'a> {
    /// The matrix as it lies (any strides), with its packing when one matches it.
    Plain(ArrayView2<'a, f32>, Option<&'a PackedWeight>),
    /// Its packing alone (an inference layer keeps nothing else).
    Packed(&'a PackedWeight),
}

impl Weight<'_> {
    /// `(n, k)`.
    fn dim(&self) -> (usize, usize) {
        match self {
            Weight::Plain(w, _) => w.dim(),
            Weight::Packed(p) => p.dim(),
        }
    }
}

/// `act(x · wᵀ + bias)` for `x [m, k]` and a weight `w [n, k]`, `bias [n]`. Call
/// only when [`available`] says so.
pub(crate) fn linear(
    x: ArrayView2<'_, f32>,
    w: Weight<'_>,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
) -> Array2<f32> {
    linear_on(IsaToken::best(), x, w, bias, epilogue)
}

/// [`linear`] on the instruction set `isa`.
fn linear_on(
    isa: IsaToken,
    x: ArrayView2<'_, f32>,
    w: Weight<'_>,
    bias: Option<&[f32]>,
    epilogue: Epilogue<'_>,
) -> Array2<f32> {
    let (m, k) = x.dim();
    let (n, wk) = w.dim();
    assert_eq!(wk, k, "inner dimensions");
    assert!(bias.is_none_or(|b| b.len() == n), "bias length");
    if m == 0 || n == 0 || k == 0 {
        return bias_only(m, n, bias, epilogue);
    }
    // Contiguous rows (a copy only for transposed or strided views).
    let x = x.as_standard_layout();
    let lda = k;
    let parallel = m * n * k >= PARALLEL_MIN && rayon::current_num_threads() > 1;
    let panels = n.div_ceil(NR);
    let source = match w {
        Weight::Packed(p) | Weight::Plain(_, Some(p)) => {
            assert_eq!((p.n, p.k), (n, k), "packed weight's shape");
            Panels::Packed(p)
        }
        // Few rows use each weight element once: read a column-major weight where
        // it lies (its rows are the panels' rows) rather than copy it first.
        Weight::Plain(w, None) if m <= FEW_ROWS && w.strides()[0] == 1 => {
            let tail = (!n.is_multiple_of(NR)).then(|| pack_panels(w, panels - 1..panels, false));
            Panels::InPlace { w, tail }
        }
        Weight::Plain(w, None) => Panels::Owned {
            data: pack_panels(w, 0..panels, parallel),
            k,
        },
    };
    let operands = F32Operands {
        x: x.as_ptr(),
        lda,
        k,
        panels: &source,
    };
    let problem = Problem {
        n,
        bias,
        epilogue,
        operands: &operands,
    };
    problem.run(isa, m, parallel)
}

/// The epilogue of `bias` in every row of an `[m, n]` output: the product when
/// `k = 0` (or the output is empty).
fn bias_only(m: usize, n: usize, bias: Option<&[f32]>, epilogue: Epilogue<'_>) -> Array2<f32> {
    let mut y = Array2::<f32>::zeros((m, n));
    if y.is_empty() {
        return y;
    }
    if let Some(b) = bias {
        y.rows_mut()
            .into_iter()
            .for_each(|mut row| row.assign(&ndarray::aview1(b)));
    }
    epilogue.apply_all(y.view_mut());
    y
}

/// Splits an output of `m` rows × `panels` panels into the blocks threads take;
/// with `whole_rows`, every block spans all panels (for an epilogue that reads
/// whole rows). The split does not change any output's order of operations, only
/// who computes it.
fn plan(m: usize, panels: usize, parallel: bool, whole_rows: bool) -> Vec<Block> {
    let ways = if parallel {
        rayon::current_num_threads()
    } else {
        1
    };
    let (row_block, panel_chunk) = if whole_rows {
        // At least four blocks per thread where there are rows for them.
        let row_block = m.div_ceil(4 * ways).next_multiple_of(MR).min(MC);
        (row_block, panels)
    } else if m > FEW_ROWS {
        // Row blocks of equal size up to MC rows, cut across at most 24 panels
        // (for k = 384 a block's slice of them is 590 KiB) and into at least four
        // blocks per thread, so that neither thread waits on the other's one big
        // block.
        let row_blocks = m.div_ceil(MC);
        let row_block = m.div_ceil(row_blocks).next_multiple_of(MR);
        let chunks = (4 * ways).div_ceil(row_blocks).max(panels.div_ceil(24));
        (row_block, panels.div_ceil(chunks).next_multiple_of(WIDE))
    } else {
        // About 12 tasks per thread: a thread that starts late takes fewer of them
        // (on the short sentence, 1.8-2.0 ms of products against 2.2-2.4 ms with
        // one task per thread). An even number of panels, for tiles of two.
        (m, panels.div_ceil(12 * ways).next_multiple_of(2))
    };
    (0..m)
        .step_by(row_block)
        .flat_map(|r0| {
            (0..panels).step_by(panel_chunk).map(move |p0| Block {
                rows: r0..(r0 + row_block).min(m),
                panels: p0..(p0 + panel_chunk).min(panels),
            })
        })
        .collect()
}

/// Panel `p`'s 16 entries of `bias [n]`, zero past `n` (and all zero without one).
fn panel_bias(bias: Option<&[f32]>, n: usize, p: usize) -> [f32; NR] {
    let mut panel = [0.0f32; NR];
    if let Some(bias) = bias {
        let (lo, hi) = (p * NR, ((p + 1) * NR).min(n));
        panel[..hi - lo].copy_from_slice(&bias[lo..hi]);
    }
    panel
}

/// Runs `run` on every block, on the current rayon pool if `parallel`.
fn run_blocks(blocks: &[Block], parallel: bool, run: impl Fn(&Block) + Sync + Send) {
    if parallel && blocks.len() > 1 {
        blocks.par_iter().for_each(run);
    } else {
        blocks.iter().for_each(run);
    }
}

/// A block of output rows × weight panels, computed by one thread.
struct Block {
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
}

/// One block of the product, for [`dispatch`].
struct BlockJob<'a, 'p, O> {
    problem: &'a Problem<'p, O>,
    block: &'a Block,
    out: &'a Out,
    /// This thread's scratch for the block's staged panels.
    staged: &'a mut [f32],
}

impl<O: Operands> SimdJob for BlockJob<'_, '_, O> {
    type Output = ();
    #[inline(always)]
    fn run<I: Simd>(self, isa: I) {
        // SAFETY: `plan` makes blocks that cover disjoint parts of the output,
        // which outlives them; `problem` describes live arrays of checked shapes.
        unsafe { self.problem.block(isa, self.block, self.out, self.staged) }
    }
}

/// The output's base pointer, shared by blocks that write disjoint parts of it.
struct Out(*mut f32);
// SAFETY: each block writes only its own rows × columns of the output.
unsafe impl Sync for Out {}

/// A weight `w [n, k]` in the product's layout: 16-output panels, each `[k][16]`
/// contiguous (zero-padded past `n`), so that reading a panel is one sequential
/// stream. `Linear::for_inference` makes one at load, on huge pages
/// ([`LargePageArray`]); other layers pack per call.
pub(crate) struct PackedWeight {
    n: usize,
    k: usize,
    data: LargePageArray<f32>,
}

impl std::fmt::Debug for PackedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedWeight([{}, {}])", self.n, self.k)
    }
}

impl PackedWeight {
    /// Packs `w [n, k]` (any strides), in parallel if `parallel`.
    pub(crate) fn new(w: ArrayView2<'_, f32>, parallel: bool) -> Self {
        let (n, k) = w.dim();
        let panels = 0..n.div_ceil(NR);
        // SAFETY: `write_panels` writes every element.
        let data = unsafe {
            LargePageArray::filled(panels.len() * k * NR, |dst| {
                write_panels(w, panels, parallel, dst)
            })
        };
        PackedWeight { n, k, data }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }

    /// `(n, k)`.
    pub(crate) fn dim(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Element `[j, kk]` of the weight.
    fn at(&self, j: usize, kk: usize) -> f32 {
        self.data[((j / NR) * self.k + kk) * NR + j % NR]
    }

    /// The weight `[n, k]` again, to the bit.
    pub(crate) fn unpack(&self) -> Array2<f32> {
        Array2::from_shape_fn((self.n, self.k), |(j, kk)| self.at(j, kk))
    }

    /// Whether this is still `w`'s packing: the shape, and 64 entries spread over
    /// the matrix, so that a weight changed in place after packing (an optimiser
    /// step changes every entry) is noticed rather than silently ignored, at a
    /// cost that does not grow with the weight.
    pub(crate) fn matches(&self, w: ArrayView2<'_, f32>) -> bool {
        if w.dim() != (self.n, self.k) {
            return false;
        }
        if self.n == 0 || self.k == 0 {
            return true;
        }
        (0..64).all(|i| {
            let (j, kk) = (i * self.n / 64, (i * 7919 + self.k - 1) % self.k);
            self.at(j, kk).to_bits() == w[[j, kk]].to_bits()
        })
    }
}

/// Panels `panels` of `w [n, k]`, one after the other, each `[k][16]`, on all
/// threads if `parallel`.
fn pack_panels(w: ArrayView2<'_, f32>, panels: std::ops::Range<usize>, parallel: bool) -> Vec<f32> {
    let len = panels.len() * w.ncols() * NR;
    let mut data = Vec::with_capacity(len);
    write_panels(w, panels, parallel, &mut data.spare_capacity_mut()[..len]);
    // SAFETY: `write_panels` wrote each of the `len` elements.
    unsafe { data.set_len(len) };
    data
}

/// Writes panels `panels` of `w [n, k]` into `dst`, every element of it, one
/// panel after the other, each `[k][16]`, on all threads if `parallel`.
///
/// The buffer is not zeroed first: every panel writes all of its part (a weight's
/// zero fill was a sixth of mpnet's f32 load, in a profile of it).
fn write_panels(
    w: ArrayView2<'_, f32>,
    panels: std::ops::Range<usize>,
    parallel: bool,
    dst: &mut [MaybeUninit<f32>],
) {
    let k = w.ncols();
    let first = panels.start;
    if k > 0 && parallel {
        dst.par_chunks_mut(k * NR)
            .enumerate()
            .for_each(|(p, dst)| copy_panel(w, first + p, dst));
    } else if k > 0 {
        dst.chunks_mut(k * NR)
            .enumerate()
            .for_each(|(p, dst)| copy_panel(w, first + p, dst));
    }
}

/// Writes panel `p` of `w [n, k]` (outputs `16p ..`) into `dst [k][16]`, every
/// element of it, zeros past `n`.
fn copy_panel(w: ArrayView2<'_, f32>, p: usize, dst: &mut [MaybeUninit<f32>]) {
    let n = w.nrows();
    let (j0, j1) = (p * NR, ((p + 1) * NR).min(n));
    if w.strides()[0] == 1 {
        // Column-major: each row of `wᵀ` holds the panel's 16 outputs side by side.
        let wt = w.t();
        for (kk, row) in dst.chunks_exact_mut(NR).enumerate() {
            let src = wt.row(kk);
            let src = src.as_slice().expect("unit column stride");
            for (d, &v) in row.iter_mut().zip(&src[j0..j1]) {
                d.write(v);
            }
            row[j1 - j0..].fill(MaybeUninit::new(0.0));
        }
    } else {
        // The panel (k · 64 bytes) stays in cache between the fill and the writes.
        dst.fill(MaybeUninit::new(0.0));
        for j in j0..j1 {
            for (kk, &v) in w.row(j).iter().enumerate() {
                dst[kk * NR + j - j0].write(v);
            }
        }
    }
}

/// Where the kernel reads the weight's panels from.
enum Panels<'a> {
    /// Packed at load.
    Packed(&'a PackedWeight),
    /// Packed for this call (on the heap, reused call after call, where a
    /// long-lived [`PackedWeight`] has its own huge pages).
    Owned { data: Vec<f32>, k: usize },
    /// A column-major weight read where it lies, with a packed copy of a last
    /// partial panel so that no read goes past the weight.
    InPlace {
        w: ArrayView2<'a, f32>,
        tail: Option<Vec<f32>>,
    },
}

impl Panels<'_> {
    /// Pointer to element `[kk, 0]` of panel `p` and the distance between its rows.
    fn at(&self, p: usize, kk: usize) -> (*const f32, usize) {
        match self {
            Panels::Packed(w) => (w.data[(p * w.k + kk) * NR..].as_ptr(), NR),
            Panels::Owned { data, k } => (data[(p * k + kk) * NR..].as_ptr(), NR),
            Panels::InPlace { w, tail } => {
                if (p + 1) * NR > w.nrows() {
                    let t = tail.as_ref().expect("a partial panel has its copy");
                    return (t[kk * NR..].as_ptr(), NR);
                }
                let ld = w.strides()[1] as usize;
                // SAFETY: kk < k and the panel's 16 outputs are inside the weight.
                (unsafe { w.as_ptr().add(kk * ld + p * NR) }, ld)
            }
        }
    }

    /// Floats from a full panel to the next: they lie in one buffer (packed) or
    /// one weight (in place), each after the one before.
    fn next(&self) -> usize {
        match self {
            Panels::Packed(w) => w.k * NR,
            Panels::Owned { k, .. } => k * NR,
            Panels::InPlace { .. } => NR,
        }
    }
}

/// Where one register tile runs: rows `r .. r + rows` of `x`, the group of panels
/// from `p`, steps `s0 .. s0 + sc` of the sum, and the panel and step of the first
/// line it fetches ahead ([`Ahead`]), if any.
#[derive(Clone, Copy)]
struct TileAt {
    r: usize,
    rows: usize,
    p: usize,
    s0: usize,
    sc: usize,
    ahead: Option<(usize, usize)>,
}

/// The depth of a product's sum and how its blocks are laid out: what the blocking
/// and the staging of panels need to know of any [`Operands`], and whether a
/// block runs elsewhere than on the register tiles.
trait Depth: Sync {
    /// Steps of the sum per block, so that a block's panel stays in L1; a
    /// multiple of every tile's partial-sum length, so that the order of
    /// operations does not depend on the blocking.
    const BLOCK: usize;
    /// Steps of the sum (`k` for f32, its pairs for bf16, its quads for int8).
    fn depth(&self) -> usize;
    /// Floats of this thread's scratch in which a group of `count` panels over `sc`
    /// steps is staged before its tiles run ([`stage`](Self::stage)); 0 where the
    /// tiles read the panels where they lie.
    fn staged_len(&self, _count: usize, _sc: usize) -> usize {
        0
    }
    /// Writes the group of panels `p .. p + count` over steps `s0 .. s0 + sc` into
    /// `staged` (its first [`staged_len`](Self::staged_len) floats), for the tiles
    /// that follow.
    fn stage<I: Simd>(
        &self,
        _isa: I,
        _p: usize,
        _count: usize,
        _steps: (usize, usize),
        _staged: &mut [f32],
    ) {
    }
    /// Computes a whole block of the output, bias included, where the operands
    /// have a faster way than register tiles (AMX, [`amx`]); false, having
    /// written nothing, where they have not.
    ///
    /// # Safety
    /// `out` must point to the `[m, n]` output and no other thread may write the
    /// block's part of it; the block's rows and panels must be the operands'.
    unsafe fn whole_block<I: Simd>(
        &self,
        _isa: I,
        _block: &Block,
        _n: usize,
        _bias: Option<&[f32]>,
        _out: *mut f32,
    ) -> bool {
        false
    }
}

/// Where a product's operands come from, and the register tile that multiplies
/// them: f32 rows against f32 panels, bf16 pairs against bf16 pairs, or widened
/// to f32 ([`bf16`]; these three through [`Streams`]), or int8 quads against int8
/// quads ([`int8`]).
trait Operands: Depth {
    /// `c[rows, 16·P] = init + x[r .. r + rows] · panels p .. p + P`, over steps
    /// `s0 .. s0 + sc` (`at`), each panel with its own `init` and its output 16
    /// floats right of the one before; `staged`: the group's panels as
    /// [`Depth::stage`] wrote them (empty where there is no staging). Every
    /// output's sum is the same, in the same order, whatever `P` (`Tile` takes four
    /// full panels in one register tile where there are registers for it).
    ///
    /// # Safety
    /// `r + rows` must be within the input's rows (`rows ≤ 6`, or up to
    /// `tile::TALL_ROWS` with `P = 2` on 32-register instruction sets), `p .. p + P`
    /// panels of the weight (full ones when `P > 1`), `s0 + sc ≤ depth()`, `staged`
    /// the group's staging where there is one, and `c` readable and writable for
    /// `rows` rows of `16·P` floats `ldc` apart.
    unsafe fn tile<I: Simd, const P: usize>(
        &self,
        isa: I,
        at: TileAt,
        staged: &[f32],
        c: *mut f32,
        ldc: usize,
        init: [Init<'_>; P],
    );
}

/// The operands of the products whose register tile is [`Tile`] (f32 numbers or
/// bf16 pairs): where a tile finds its rows, its panels and the lines it fetches
/// ahead. One [`Operands::tile`] runs them all.
trait Streams: Depth {
    /// What one step of the sum multiplies.
    type Step: tile::Step;
    /// Steps per partial sum ([`Tile::partial`]).
    const PARTIAL: usize;
    /// Row `r` of `x` at step `s`, and the distance between rows.
    fn row(&self, r: usize, s: usize) -> (*const Self::Step, usize);
    /// The group of `count` panels from `p` at step `s`, as the tiles read it
    /// (from `staged` where the operands stage it, [`Depth::stage`] having
    /// written it from step `s`): its first panel, the distance between a panel's
    /// rows and that to the next panel.
    fn panels(
        &self,
        p: usize,
        count: usize,
        s: usize,
        staged: &[f32],
    ) -> (*const Self::Step, usize, usize);
    /// The lines to fetch ahead from panel `p` at step `s` on.
    fn ahead(&self, p: usize, s: usize) -> Ahead;
}

impl<S: Streams> Operands for S {
    #[inline(always)]
    unsafe fn tile<I: Simd, const P: usize>(
        &self,
        isa: I,
        at: TileAt,
        staged: &[f32],
        c: *mut f32,
        ldc: usize,
        init: [Init<'_>; P],
    ) {
        let (a, lda) = self.row(at.r, at.s0);
        let (b, ldb, next) = self.panels(at.p, P, at.s0, staged);
        let tile = Tile {
            a,
            lda: lda as isize,
            sa: 1,
            b,
            ldb,
            next,
            kc: at.sc,
            partial: S::PARTIAL,
            ahead: at.ahead.map_or(Ahead::NONE, |(p, s)| self.ahead(p, s)),
        };
        // SAFETY: the caller's guarantees (rows of `x`, panels of `w`, steps within
        // the depth, `c`) are the tile's.
        unsafe { tile.run::<I, P>(isa, at.rows, c, ldc, init) }
    }
}

/// The f32 product's operands: contiguous rows of `x` and the weight's panels.
struct F32Operands<'a, 'w> {
    x: *const f32,
    lda: usize,
    k: usize,
    panels: &'a Panels<'w>,
}

// SAFETY: `x` points to an input that is only read while the product runs.
unsafe impl Sync for F32Operands<'_, '_> {}

impl Depth for F32Operands<'_, '_> {
    const BLOCK: usize = KC;

    fn depth(&self) -> usize {
        self.k
    }
}

impl Streams for F32Operands<'_, '_> {
    type Step = f32;
    const PARTIAL: usize = tile::SUM_BLOCK;

    #[inline(always)]
    fn row(&self, r: usize, s: usize) -> (*const f32, usize) {
        (self.x.wrapping_add(r * self.lda + s), self.lda)
    }

    #[inline(always)]
    fn panels(
        &self,
        p: usize,
        count: usize,
        s: usize,
        _staged: &[f32],
    ) -> (*const f32, usize, usize) {
        let (b, ldb) = self.panels.at(p, s);
        let next = if count > 1 { self.panels.next() } else { 0 };
        (b, ldb, next)
    }

    #[inline(always)]
    fn ahead(&self, p: usize, s: usize) -> Ahead {
        let (at, ldb) = self.panels.at(p, s);
        let size = std::mem::size_of::<f32>();
        Ahead {
            at: at.cast(),
            next: self.panels.next() * size,
            step: ldb * size,
        }
    }
}

/// A product: its operands, output width, bias and epilogue.
struct Problem<'a, O> {
    n: usize,
    bias: Option<&'a [f32]>,
    epilogue: Epilogue<'a>,
    operands: &'a O,
}

impl<O: Operands> Problem<'_, O> {
    /// Steps of the sum per block of a block of `rows` rows.
    fn steps(&self, rows: usize) -> usize {
        // A block of a few rows (a short text) reads each weight once, from
        // memory: its tiles run the whole depth, so that each panel is one
        // sequential stream rather than KC steps of it and then the next
        // panel's. The partial sums are added in the same order either way.
        if rows <= tile::TALL_ROWS {
            self.operands.depth().max(1)
        } else {
            O::BLOCK
        }
    }

    /// Floats of scratch a block of `rows` rows stages its groups of panels in.
    fn staged_len(&self, rows: usize) -> usize {
        // Groups hold at most `WIDE` panels (`2 ≤ WIDE`).
        let sc = self.steps(rows).min(self.operands.depth());
        self.operands.staged_len(WIDE, sc)
    }

    /// Computes one block of the output, staging its groups of panels in `staged`
    /// ([`staged_len`](Self::staged_len) floats at least).
    ///
    /// # Safety
    /// `out` must point to the `[m, n]` output and no other thread may write this
    /// block's part of it; the block's rows and panels must be the operands'.
    #[inline(always)]
    unsafe fn block<I: Simd>(&self, isa: I, b: &Block, out: &Out, staged: &mut [f32]) {
        // SAFETY: the caller upholds this function's contract (see # Safety).
        unsafe {
            let (depth, n) = (self.operands.depth(), self.n);
            let columns = b.panels.start * NR..(b.panels.end * NR).min(n);
            if self.operands.whole_block(isa, b, n, self.bias, out.0) {
                self.epilogue.apply(out.0, n, b.rows.clone(), columns);
                return;
            }
            let tall = b.rows.len() > MR && tile::tall::<I>(b.rows.len());
            let block = self.steps(b.rows.len());
            for s0 in (0..depth).step_by(block) {
                let sc = block.min(depth - s0);
                let mut p = b.panels.start;
                let full =
                    |p: usize, count: usize| p + count <= b.panels.end && (p + count) * NR <= n;
                while p < b.panels.end {
                    // As many full panels at a time as the registers hold: a block
                    // of 7 to 12 rows takes two panels for all its rows at once
                    // (`TALL_ROWS`), which reads each weight once, not twice.
                    if tall && full(p, 2) {
                        self.panels::<I, 2>(isa, b, p, (s0, sc), out, staged);
                        p += 2;
                    } else if I::REGISTERS >= 32 && full(p, WIDE) {
                        self.panels::<I, WIDE>(isa, b, p, (s0, sc), out, staged);
                        p += WIDE;
                    } else if full(p, 2) {
                        self.panels::<I, 2>(isa, b, p, (s0, sc), out, staged);
                        p += 2;
                    } else {
                        self.panels::<I, 1>(isa, b, p, (s0, sc), out, staged);
                        p += 1;
                    }
                }
            }
            self.epilogue.apply(out.0, n, b.rows.clone(), columns);
        }
    }

    /// Panels `p .. p + P` of one block over steps `s0 .. s0 + sc`, every row
    /// block of the block's rows, the group staged first in `staged` where the
    /// operands stage it; the bias starts the first steps' sums.
    ///
    /// # Safety
    /// As [`block`](Self::block)'s, for panels of the block (full ones when
    /// `P > 1`).
    #[inline(always)]
    unsafe fn panels<I: Simd, const P: usize>(
        &self,
        isa: I,
        b: &Block,
        p: usize,
        (s0, sc): (usize, usize),
        out: &Out,
        staged: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's contract (see # Safety).
        unsafe {
            let staged = &mut staged[..self.operands.staged_len(P, sc)];
            if !staged.is_empty() {
                self.operands.stage(isa, p, P, (s0, sc), staged);
            }
            let staged = &*staged;
            let n = self.n;
            let j0 = p * NR;
            let cols = (P * NR).min(n - j0);
            let bias: [_; P] = std::array::from_fn(|q| panel_bias(self.bias, n, p + q));
            let first = s0 == 0;
            let mut init = [Init::Add; P];
            if first {
                for (i, bq) in init.iter_mut().zip(&bias) {
                    *i = Init::Bias(bq);
                }
            }
            let width = P * NR;
            let step = if P == 2 && tile::tall::<I>(b.rows.len()) {
                b.rows.len()
            } else {
                MR
            };
            // The next group of panels (this block's next one of as many full
            // panels, else its first at the next steps of the sum): tiles after
            // the first fetch it while theirs come from cache.
            let depth = self.operands.depth();
            let full = |q: usize| q + P <= b.panels.end && (q + P) * NR <= n;
            let next = if full(p + P) {
                Some((p + P, s0))
            } else if s0 + sc < depth && full(b.panels.start) {
                Some((b.panels.start, s0 + sc))
            } else {
                None
            };
            let mut r = b.rows.start;
            while r < b.rows.end {
                let rows = step.min(b.rows.end - r);
                let c = out.0.add(r * n + j0);
                let t = (r - b.rows.start) / step;
                let ahead = next
                    .filter(|_| (1..=P).contains(&t))
                    .map(|(q, s)| (q, s + (t - 1) * sc.min(depth - s) / P));
                let at = TileAt {
                    r,
                    rows,
                    p,
                    s0,
                    sc,
                    ahead,
                };
                let tile = |c, ldc| self.operands.tile::<I, P>(isa, at, staged, c, ldc, init);
                if cols == width {
                    tile(c, n);
                } else {
                    // A partial panel: through a buffer of whole ones.
                    let mut buf = [0.0f32; MR * WIDE * NR];
                    if !first {
                        for i in 0..rows {
                            let src = std::slice::from_raw_parts(c.add(i * n), cols);
                            buf[i * width..i * width + cols].copy_from_slice(src);
                        }
                    }
                    tile(buf.as_mut_ptr(), width);
                    for i in 0..rows {
                        let dst = std::slice::from_raw_parts_mut(c.add(i * n), cols);
                        dst.copy_from_slice(&buf[i * width..i * width + cols]);
                    }
                }
                r += rows;
            }
        }
    }

    /// The `[m, n]` output, every block run on `isa`, in parallel if `parallel`.
    fn run(&self, isa: IsaToken, m: usize, parallel: bool) -> Array2<f32> {
        let n = self.n;
        if self.epilogue.whole_rows() && m <= FEW_ROWS {
            // Blocks of whole rows would leave one thread all of a few rows'
            // product: split it by panels, then finish the rows.
            let product = Problem {
                epilogue: Epilogue::None,
                ..*self
            };
            let mut y = product.run(isa, m, parallel);
            self.epilogue.apply_all(y.view_mut());
            return y;
        }
        // Not zeroed first: clearing each product's output cost 5 % of an
        // encoder's time, and the kernel writes every element anyway.
        let mut y = Array2::<f32>::uninit((m, n));
        if let Some(out) = y.as_slice_mut() {
            crate::memory::advise_large_pages(out);
        }
        let blocks = plan(m, n.div_ceil(NR), parallel, self.epilogue.whole_rows());
        let out = Out(y.as_mut_ptr().cast::<f32>());
        run_blocks(&blocks, parallel, |block| {
            let job = |staged: &mut [f32]| {
                let job = BlockJob {
                    problem: self,
                    block,
                    out: &out,
                    staged,
                };
                dispatch(isa, job)
            };
            match self.staged_len(block.rows.len()) {
                0 => job(&mut []),
                len => with_scratch(len, job),
            }
        });
        // SAFETY: the blocks cover every row and panel of the output, and the first
        // steps of each output's sum store it without reading it (`Init::Bias`,
        // and the buffer of a partial panel is read back only after them), so
        // every element has been written.
        unsafe { y.assume_init() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::Activation;
    use ndarray::Array;

    /// `x · wᵀ + bias` in f64.
    fn naive(x: &Array2<f32>, w: &Array2<f32>, bias: &[f32]) -> Array2<f64> {
        let (m, k) = x.dim();
        let n = w.nrows();
        Array2::from_shape_fn((m, n), |(i, j)| {
            (0..k).fold(bias[j] as f64, |s, kk| {
                s + x[[i, kk]] as f64 * w[[j, kk]] as f64
            })
        })
    }

    /// The same `[n, k]` weight stored row-major and column-major.
    fn layouts(w: &Array2<f32>) -> [Array2<f32>; 2] {
        let column_major = w.t().as_standard_layout().into_owned().reversed_axes();
        [w.clone(), column_major]
    }

    fn operands(m: usize, k: usize, n: usize) -> (Array2<f32>, Array2<f32>, Vec<f32>) {
        let x = Array::from_shape_fn((m, k), |(i, j)| ((i * 31 + j * 7) % 23) as f32 / 11.0 - 1.0);
        let w = Array::from_shape_fn((n, k), |(j, i)| ((i * 13 + j * 5) % 19) as f32 / 9.0 - 1.0);
        let bias = (0..n).map(|j| j as f32 / 7.0 - 1.0).collect();
        (x, w, bias)
    }

    #[test]
    fn matches_the_f64_product_on_every_edge() {
        if !available() {
            return;
        }
        // Row counts on both sides of the tile and packing thresholds, partial
        // panels, and depths across a block of k.
        for &(m, k, n) in &[
            (1, 1, 1),
            (1, 384, 384),
            (5, 7, 17),
            (6, 33, 16),
            (7, 385, 40),
            (12, 100, 31),
            (13, 768, 48),
            (50, 1000, 70),
            (19, 130, 100),
            (97, 384, 1536),
            (487, 130, 40),
        ] {
            let (x, w, bias) = operands(m, k, n);
            let want = naive(&x, &w, &bias);
            // A sum of k + 1 terms of size ≤ 1 in f32: |error| ≤ k·ε·Σ|terms|.
            let tol = (k as f64) * f32::EPSILON as f64 * (k as f64 + 1.0);
            for isa in Isa::available() {
                let token = isa.token().expect("available");
                for w in layouts(&w) {
                    let y = linear_on(
                        token,
                        x.view(),
                        Weight::Plain(w.view(), None),
                        Some(&bias),
                        Epilogue::None,
                    );
                    let err = y
                        .iter()
                        .zip(want.iter())
                        .fold(0.0f64, |e, (&a, &b)| e.max((a as f64 - b).abs()));
                    assert!(
                        err <= tol,
                        "{isa} {m}x{k}x{n} {:?}: {err} > {tol}",
                        w.strides()
                    );
                }
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_in_a_batch_and_packed() {
        if !available() {
            return;
        }
        for &(k, n) in &[(400, 40), (1536, 48)] {
            let (x, w, bias) = operands(30, k, n);
            let packed = PackedWeight::new(w.view(), false);
            let all = linear(
                x.view(),
                Weight::Packed(&packed),
                Some(&bias),
                Epilogue::None,
            );
            for stored in layouts(&w) {
                for m in [1, 5, 6, 7, 12, 13, 30] {
                    let rows = x.slice(ndarray::s![..m, ..]);
                    let y = linear(
                        rows,
                        Weight::Plain(stored.view(), None),
                        Some(&bias),
                        Epilogue::None,
                    );
                    assert_eq!(y, all.slice(ndarray::s![..m, ..]), "{m} rows of {k}x{n}");
                }
            }
        }
    }

    #[test]
    fn a_packing_notices_a_changed_weight() {
        let (_, mut w, _) = operands(1, 20, 24);
        let packed = PackedWeight::new(w.view(), false);
        assert_eq!(packed.unpack(), w);
        assert!(packed.matches(w.view()));
        assert!(!packed.matches(w.slice(ndarray::s![..23, ..])));
        w.mapv_inplace(|v| v - 0.01);
        assert!(!packed.matches(w.view()));
    }

    #[test]
    fn strided_inputs_and_no_bias() {
        if !available() {
            return;
        }
        for m in [9, 30] {
            let (x, w, _) = operands(m, 20, 24);
            let xt = x.t().as_standard_layout().into_owned();
            let want = naive(&x, &w, &[0.0; 24]);
            // Every other column of a wider matrix: neither layout, so copied.
            let wide =
                Array::from_shape_fn(
                    (24, 40),
                    |(j, i)| if i % 2 == 0 { w[[j, i / 2]] } else { f32::NAN },
                );
            for stored in layouts(&w) {
                let strided = wide.slice(ndarray::s![.., ..;2]);
                for w in [stored.view(), strided] {
                    let y = linear(xt.t(), Weight::Plain(w, None), None, Epilogue::None);
                    let err = y
                        .iter()
                        .zip(want.iter())
                        .fold(0.0f64, |e, (&a, &b)| e.max((a as f64 - b).abs()));
                    assert!(err < 1e-4, "{err}");
                }
            }
        }
    }

    #[test]
    fn the_fused_activation_equals_the_separate_one() {
        if !available() {
            return;
        }
        for m in [3, 40] {
            let (x, w, bias) = operands(m, 64, 50);
            for w in layouts(&w) {
                let fused = linear(
                    x.view(),
                    Weight::Plain(w.view(), None),
                    Some(&bias),
                    Epilogue::Act(Activation::Gelu),
                );
                let mut separate = linear(
                    x.view(),
                    Weight::Plain(w.view(), None),
                    Some(&bias),
                    Epilogue::None,
                );
                Activation::Gelu.apply(separate.as_slice_mut().unwrap());
                assert_eq!(fused, separate);
            }
        }
    }

    #[test]
    fn same_bits_whatever_the_thread_count() {
        if !available() {
            return;
        }
        // One row block, and three (`MC`).
        for m in [5, 200, 3 * MC - 7] {
            let (x, w, bias) = operands(m, 1536, 384);
            for isa in Isa::available() {
                let token = isa.token().expect("available");
                for w in layouts(&w) {
                    let run = |threads: usize| {
                        crate::threads::pool(threads).unwrap().install(|| {
                            linear_on(
                                token,
                                x.view(),
                                Weight::Plain(w.view(), None),
                                Some(&bias),
                                Epilogue::None,
                            )
                        })
                    };
                    let one = run(1);
                    assert_eq!(run(2), one, "{isa}");
                    assert_eq!(run(3), one, "{isa}");
                }
            }
        }
    }
}
