//! The register tile of the library's matrix products (the dense layers' f32 and
//! bf16 products in `nn::matmul`, the fused backward's five products, the fused
//! forward's f32 products and its bf16 weights-times-values): `R` rows of `a`
//! times `P` (1, 2 or 4) adjacent 16-wide panels of `b`, written once over what
//! one step of the sum multiplies ([`Step`]: an f32 number, or a bf16 pair through
//! [`Simd::dot2`]). [`Tile::run`] takes up to 6 rows (12 with two panels on
//! 32-register instruction sets) and splits for 16-register ones; the fused
//! forward, which sizes its register blocks itself, calls [`Tile::rows`].
//!
//! How a tile's sums meet its output is the caller's [`WriteOut`], monomorphised
//! into the tile: the dense layers and the backward use [`Init`] per panel, the
//! forward [`Rescale`]. With one enum for all (the forward's rescaling a fourth
//! case) the compiler kept the accumulators on the stack, or shuffled them between
//! registers at every step, slowing the forward or the dense layers by large
//! factors (the commits that split them give the measurements).
//!
//! With one panel a step loads as many numbers as it multiplies (one panel vector,
//! `R` broadcasts, `R` products); with four, each broadcast feeds four products, so
//! 32-register instruction sets take four full panels at a time (24 accumulators). Every output's sum
//! runs over the same steps in the same order whatever the tile's shape, so the bits
//! do not depend on it.

use crate::element::bf16;
use crate::isa::{bf16_to_f32, Simd, LANES};

/// Rows of the register tile.
pub(crate) const MR: usize = 6;
/// Columns of a panel: one 16-lane vector (two AVX2 registers).
pub(crate) const NR: usize = LANES;
/// Panels in one register tile on 32-register instruction sets (AVX-512): 6 × 64
/// outputs are 24 accumulators, and each broadcast of `a` feeds four products.
pub(crate) const WIDE: usize = 4;
/// Terms per partial sum of the dense layers' and the backward's f32 products
/// ([`Tile::partial`]): a divisor of any blocking of the sum a caller makes, so
/// that the order of operations does not depend on the blocking. Each join loads,
/// adds and stores every accumulator.
pub(crate) const SUM_BLOCK: usize = 64;
/// Products in each partial sum of a score's dot product before it joins the
/// score's running total, in the fused forward and in the backward, which
/// recomputes the forward's scores bit for bit: the blocks keep long dot products
/// (E = 64 and up) well below the naive sum's error, and each join costs a load, an
/// add and a store per accumulator (32 rather than 16 halved those at E = 64;
/// docs/fused-forward.md).
pub(crate) const DOT_CHUNK: usize = 32;
/// Pairs per partial sum of the bf16 products: a whole block of the dense layers'
/// sum. Rounding each operand to bf16 moves it by up to 2⁻⁹ of itself, so a
/// product by about 2⁻⁸; the f32 sum adds at most `k · 2⁻²⁴` of the sum of the
/// products' sizes (4.7 % of 2⁻⁸ at `k = 3072`). Shorter partial sums would buy
/// nothing that shows, while each join costs the tile time (the commit that set
/// this gives the A/B).
pub(crate) const PAIR_SUM_BLOCK: usize = 384;

/// Most rows of one tile: two panels of 12 rows are 24 accumulators, as four
/// panels of 6, on 32-register instruction sets.
pub(crate) const TALL_ROWS: usize = 2 * MR;

/// Whether `rows` rows fit one tile of two panels on `I` (see [`TALL_ROWS`]).
pub(crate) fn tall<I: Simd>(rows: usize) -> bool {
    I::REGISTERS >= 32 && rows <= TALL_ROWS
}

/// Lines a streaming tile keeps asked for ahead of its sum, over all its panels.
const PREFETCH_LINES: usize = 128;

/// One step of a dot product: what `a` and `b` hold and how they multiply.
pub(crate) trait Step: Copy {
    /// The vector of 16 steps' `b` operands (one per output column).
    type B<I: Simd>: Copy;
    /// Rows a 16-register instruction set can hold in one tile.
    const ROWS_16: usize;
    /// Loads 16 steps' `b` operands.
    ///
    /// # Safety
    /// `p` must be valid for reading 16 elements.
    unsafe fn load<I: Simd>(isa: I, p: *const Self) -> Self::B<I>;
    /// Broadcasts one row's `a` operand.
    fn splat<I: Simd>(isa: I, a: Self) -> Self::B<I>;
    /// `acc + a · b`, lane by lane.
    fn mul_add<I: Simd>(isa: I, acc: I::V, a: Self::B<I>, b: Self::B<I>) -> I::V;
}

impl Step for f32 {
    type B<I: Simd> = I::V;
    const ROWS_16: usize = 6;
    #[inline(always)]
    unsafe fn load<I: Simd>(isa: I, p: *const f32) -> I::V {
        // SAFETY: the caller guarantees 16 readable floats.
        unsafe { isa.load(p) }
    }
    #[inline(always)]
    fn splat<I: Simd>(isa: I, a: f32) -> I::V {
        isa.splat(a)
    }
    #[inline(always)]
    fn mul_add<I: Simd>(isa: I, acc: I::V, a: I::V, b: I::V) -> I::V {
        isa.fma(a, b, acc)
    }
}

/// A bf16 pair (its bits, low element in the low half): two products per step.
impl Step for u32 {
    type B<I: Simd> = I::P;
    /// Six rows' accumulators, the panel's pairs widened to f32 and a row's pair do
    /// not fit in 16 registers: four rows, then the rest.
    const ROWS_16: usize = 4;
    #[inline(always)]
    unsafe fn load<I: Simd>(isa: I, p: *const u32) -> I::P {
        // SAFETY: the caller guarantees 16 readable pairs.
        unsafe { isa.load_pairs(p) }
    }
    #[inline(always)]
    fn splat<I: Simd>(isa: I, a: u32) -> I::P {
        isa.splat_pair(a)
    }
    #[inline(always)]
    fn mul_add<I: Simd>(isa: I, acc: I::V, a: I::P, b: I::P) -> I::V {
        isa.dot2(acc, a, b)
    }
}

/// What a tile's `a` operand may hold for steps of `E`: `E` itself, or, for f32
/// steps, a bf16 number, widened exactly (a shift) as it is broadcast, so that the
/// f32 products read bf16 tensors in place (the fused forward on instruction sets
/// without bf16 products, docs/bf16.md).
pub(crate) trait Lhs<E: Step>: Copy {
    /// Broadcasts `a` as a step's `a` operand.
    fn splat<I: Simd>(isa: I, a: Self) -> E::B<I>;
}

impl<E: Step> Lhs<E> for E {
    #[inline(always)]
    fn splat<I: Simd>(isa: I, a: E) -> E::B<I> {
        E::splat(isa, a)
    }
}

impl Lhs<f32> for bf16 {
    #[inline(always)]
    fn splat<I: Simd>(isa: I, a: bf16) -> I::V {
        isa.splat(bf16_to_f32(a.to_bits()))
    }
}

/// What a tile's partial sums are added to, written once per tile and step of
/// the sum: the tile hands it the accumulators of each partial sum in turn.
pub(crate) trait WriteOut<const P: usize>: Copy {
    /// The write-out of every partial sum after the first.
    fn then(self) -> Self;
    /// Asks for the lines of the output the first join reads, before the sum
    /// starts, where they may be far from the core.
    fn prefetch<const R: usize>(self, _c: *const f32, _ldc: usize) {}
    /// Joins the accumulators `acc` (`acc[q][i]`: panel `q`, row `i`) to `c`
    /// (rows `ldc` apart, panel `q` at column `16·q`).
    ///
    /// # Safety
    /// `c` must be readable and writable for `R` rows of `16·P` floats `ldc` apart.
    unsafe fn join<I: Simd, const R: usize>(
        self,
        isa: I,
        acc: &[[I::V; R]; P],
        c: *mut f32,
        ldc: usize,
    );
}

/// What one panel's accumulators are added to (the dense layers and the
/// backward: `[Init; P]`, one per panel).
#[derive(Clone, Copy)]
pub(crate) enum Init<'a> {
    /// Nothing: the output is written, not read (the first block of a sum
    /// without a bias).
    Zero,
    /// A bias, the same in every row (the first block of a dense layer's sum).
    Bias(&'a [f32; NR]),
    /// The partial sums already in the output.
    Add,
}

impl<const P: usize> WriteOut<P> for [Init<'_>; P] {
    #[inline(always)]
    fn then(self) -> Self {
        [Init::Add; P]
    }

    /// An output added to may be far (the backward's dQ of a long sequence, a
    /// dense layer's partial sums): asked for now, it arrives while the sum runs.
    #[inline(always)]
    fn prefetch<const R: usize>(self, c: *const f32, ldc: usize) {
        #[cfg(target_arch = "x86_64")]
        for (q, init) in self.iter().enumerate() {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            if matches!(init, Init::Add) {
                for i in 0..R {
                    // SAFETY: a prefetch reads nothing; `wrapping_add` makes an
                    // address past the output no UB.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(i * ldc + q * NR).cast()) };
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn join<I: Simd, const R: usize>(
        self,
        isa: I,
        acc: &[[I::V; R]; P],
        c: *mut f32,
        ldc: usize,
    ) {
        // SAFETY: every store is inside the caller's `R` rows of `16·P` floats.
        unsafe {
            for (q, (start, sums)) in self.iter().zip(acc).enumerate() {
                for (i, sum) in sums.iter().enumerate() {
                    let ci = c.add(i * ldc + q * NR);
                    let start = match start {
                        Init::Zero => {
                            isa.store(ci, *sum);
                            continue;
                        }
                        Init::Bias(bias) => isa.load(bias.as_ptr()),
                        Init::Add => isa.load(ci),
                    };
                    isa.store(ci, isa.add(start, *sum));
                }
            }
        }
    }
}

/// The fused forward's write-out: the first partial sum replaces the output
/// (`None`) or joins it rescaled lane by lane, the same factors in every row (`c =
/// α ⊙ c + a·b`: the running `Oᵀ`, one factor per query; `alpha[q]` for panel
/// `q`); later ones add to it.
#[derive(Clone, Copy)]
pub(crate) enum Rescale<'a> {
    /// Write the sum (the scores).
    None,
    /// `c = α ⊙ c + a·b`.
    By(&'a [[f32; NR]]),
    /// `c = c + a·b`.
    Add,
}

impl Rescale<'_> {
    /// The write-out of panel `q` alone, for a tile of that one panel.
    #[inline(always)]
    pub(crate) fn panel(self, q: usize) -> Self {
        match self {
            Rescale::By(alpha) => Rescale::By(&alpha[q..q + 1]),
            other => other,
        }
    }
}

impl<const P: usize> WriteOut<P> for Rescale<'_> {
    #[inline(always)]
    fn then(self) -> Self {
        Rescale::Add
    }

    #[inline(always)]
    unsafe fn join<I: Simd, const R: usize>(
        self,
        isa: I,
        acc: &[[I::V; R]; P],
        c: *mut f32,
        ldc: usize,
    ) {
        let at = |q: usize, i: usize| c.wrapping_add(i * ldc + q * NR);
        // SAFETY: every access is inside the caller's `R` rows of `16·P` floats.
        // One match, then plain loops that unroll (see the module docs).
        #[allow(clippy::needless_range_loop)]
        unsafe {
            match self {
                Rescale::None => {
                    for q in 0..P {
                        for i in 0..R {
                            isa.store(at(q, i), acc[q][i]);
                        }
                    }
                }
                Rescale::By(alpha) => {
                    for q in 0..P {
                        let alpha = isa.load(alpha[q].as_ptr());
                        for i in 0..R {
                            isa.store(at(q, i), isa.fma(isa.load(at(q, i)), alpha, acc[q][i]));
                        }
                    }
                }
                Rescale::Add => {
                    for q in 0..P {
                        for i in 0..R {
                            isa.store(at(q, i), isa.add(isa.load(at(q, i)), acc[q][i]));
                        }
                    }
                }
            }
        }
    }
}

/// One register tile's operands: rows of `a` (elements of `A`, `E` itself unless
/// widened as they are broadcast: [`Lhs`]; `lda` apart, each row's steps `sa`
/// apart: 1 for rows stored along the sum, the row length to read a transposed
/// matrix; either may be negative, as an array view's strides may), a panel of `b`
/// (rows of 16 elements `ldb` apart, the next panel `next` elements further), `kc`
/// steps.
#[derive(Clone, Copy)]
pub(crate) struct Tile<E, A = E> {
    pub a: *const A,
    pub lda: isize,
    pub sa: isize,
    pub b: *const E,
    pub ldb: usize,
    pub next: usize,
    pub kc: usize,
    /// Steps in each partial sum: [`SUM_BLOCK`] or [`PAIR_SUM_BLOCK`] for the
    /// dense layers' and the backward's products, shorter where a caller wants
    /// shorter sums (the fused forward's scores).
    pub partial: usize,
    /// Lines of another group of panels to bring into the L2 cache while this
    /// tile runs (only where `STREAM`), or [`Ahead::NONE`].
    pub ahead: Ahead,
}

/// Lines of another group of panels for a tile to bring into the L2 cache: a
/// dense layer's tiles after the first of a group read its panels from the
/// cache, while memory would sit idle, so they fetch the next group's instead.
/// Step `s` of a `P`-panel tile asks for the line `at + (s % P)·next + (s / P)·step`
/// (bytes), so a tile covers `kc / P` steps of each panel. The lines are laid out
/// as the weight lies in memory, which need not be as the tile reads its panels
/// (a bf16 weight widened to f32 for its tiles: `step` is then half a line).
#[derive(Clone, Copy)]
pub(crate) struct Ahead {
    /// The first line, or null for none.
    pub at: *const u8,
    /// Bytes between two panels' lines.
    pub next: usize,
    /// Bytes the lines advance by per step of the sum.
    pub step: usize,
}

impl Ahead {
    /// No lines to fetch.
    pub(crate) const NONE: Ahead = Ahead {
        at: std::ptr::null(),
        next: 0,
        step: 0,
    };
}

impl<E: Step, A: Lhs<E>> Tile<E, A> {
    /// `c[rows, 16·P] = init + a·b` for `P` adjacent panels, `c` with row
    /// stride `ldc`, each panel with its own `init`.
    ///
    /// # Safety
    /// `a` must be readable for `rows` rows of `kc` elements `sa` apart, the rows
    /// `lda` apart, `b` for
    /// `kc` rows of 16 elements `ldb` apart in each of the `P` panels, and `c`
    /// readable and writable for `rows` rows of `16·P` floats `ldc` apart;
    /// `rows ≤ 6`, or `rows ≤ TALL_ROWS` with `P = 2` on 32-register
    /// instruction sets.
    #[inline(always)]
    pub unsafe fn run<I: Simd, const P: usize>(
        &self,
        isa: I,
        rows: usize,
        c: *mut f32,
        ldc: usize,
        init: [Init<'_>; P],
    ) {
        // SAFETY: the caller's guarantees, split by panel and by rows below (no
        // recursion: a recursive call could not be inlined into the instruction
        // set's entry point, and would run without its features).
        unsafe {
            if I::REGISTERS < 32 && (P > 1 || rows > E::ROWS_16) {
                for (q, &init) in init.iter().enumerate() {
                    let panel = Tile {
                        b: self.b.add(q * self.next),
                        ..*self
                    };
                    let c = c.add(q * NR);
                    let top = rows.min(E::ROWS_16);
                    panel.fixed::<I, 1>(isa, top, c, ldc, [init]);
                    if rows > top {
                        let rest = Tile {
                            a: panel.a.offset(top as isize * self.lda),
                            ..panel
                        };
                        rest.fixed::<I, 1>(isa, rows - top, c.add(top * ldc), ldc, [init]);
                    }
                }
                return;
            }
            if rows > MR {
                debug_assert!(P == 2 && tall::<I>(rows));
                let init = [init[0], init[P - 1]];
                match rows {
                    12 => self.rows::<I, 12, 2, _, true>(isa, c, ldc, init),
                    11 => self.rows::<I, 11, 2, _, true>(isa, c, ldc, init),
                    10 => self.rows::<I, 10, 2, _, true>(isa, c, ldc, init),
                    9 => self.rows::<I, 9, 2, _, true>(isa, c, ldc, init),
                    8 => self.rows::<I, 8, 2, _, true>(isa, c, ldc, init),
                    _ => self.rows::<I, 7, 2, _, true>(isa, c, ldc, init),
                }
                return;
            }
            self.fixed::<I, P>(isa, rows, c, ldc, init);
        }
    }

    /// [`run`](Self::run) with the row count made a constant.
    ///
    /// # Safety
    /// As [`run`](Self::run)'s.
    #[inline(always)]
    unsafe fn fixed<I: Simd, const P: usize>(
        &self,
        isa: I,
        rows: usize,
        c: *mut f32,
        ldc: usize,
        init: [Init<'_>; P],
    ) {
        // SAFETY: the caller's guarantees, for `R = rows`.
        unsafe {
            match rows {
                6 => self.rows::<I, 6, P, _, true>(isa, c, ldc, init),
                5 => self.rows::<I, 5, P, _, true>(isa, c, ldc, init),
                4 => self.rows::<I, 4, P, _, true>(isa, c, ldc, init),
                3 => self.rows::<I, 3, P, _, true>(isa, c, ldc, init),
                2 => self.rows::<I, 2, P, _, true>(isa, c, ldc, init),
                _ => self.rows::<I, 1, P, _, true>(isa, c, ldc, init),
            }
        }
    }

    /// [`run`](Self::run) for a number of rows the caller knows at compile time
    /// (the fused forward's register blocks), with no dispatch on it, and any
    /// [`WriteOut`]: `R` rows of `P` panels must fit the registers, which the
    /// caller sees to. `STREAM`: whether `b` streams from memory, read once (a
    /// dense layer's weights), so that the tile asks for its lines ahead.
    ///
    /// # Safety
    /// As [`run`](Self::run)'s, with `rows = R`.
    #[inline(always)]
    pub unsafe fn rows<
        I: Simd,
        const R: usize,
        const P: usize,
        W: WriteOut<P>,
        const STREAM: bool,
    >(
        &self,
        isa: I,
        c: *mut f32,
        ldc: usize,
        init: W,
    ) {
        // SAFETY: every read and write below is inside the caller's `R` rows of `a`
        // and `c` and `kc` rows of each panel of `b`.
        unsafe {
            // Each row's own pointer. From `a` and `lda` the compiler derives each
            // row's address from the row before: a chain of `R` dependent adds in
            // every step, as long as the twelve multiply-adds of a 16-register
            // tile take, which then waited on it (docs/fused-forward.md). Made
            // opaque there, each row's address is its own pointer plus the step's
            // offset. Wider tiles have twice the products per step to hide the
            // chain, and no registers to spare for `R` pointers.
            let rows: [*const A; R] =
                std::array::from_fn(|i| self.a.wrapping_offset(i as isize * self.lda));
            let rows = if I::REGISTERS < 32 {
                std::hint::black_box(rows)
            } else {
                rows
            };
            let mut at: isize = 0;
            let mut b = self.b;
            let mut init = init;
            let mut left = self.kc;
            let mut step = 0;
            init.prefetch::<R>(c, ldc);
            // Partial sums of `partial` steps, each added to the output: the error
            // of an f32 sum of k terms then grows like SUM_BLOCK + k/SUM_BLOCK, not
            // like k. At least one, so that `kc = 0` still writes `init`.
            loop {
                let steps = left.min(self.partial);
                let mut acc = [[isa.splat(0.0); R]; P];
                for _ in 0..steps {
                    // A short text reads each weight once, straight from memory:
                    // asking for each panel's lines PREFETCH_LINES / P steps ahead keeps more
                    // reads in flight than the hardware prefetcher does alone. A
                    // prefetch past the panel's end is harmless (no fault, no UB
                    // with `wrapping_add`). Panels already in the L1 cache (the
                    // fused forward's) are not asked for: that costs an instruction
                    // per panel and step.
                    #[cfg(target_arch = "x86_64")]
                    if STREAM {
                        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
                        for q in 0..P {
                            _mm_prefetch::<_MM_HINT_T0>(
                                b.wrapping_add(q * self.next + PREFETCH_LINES / P * self.ldb)
                                    .cast(),
                            );
                        }
                        let ahead = self.ahead;
                        if !ahead.at.is_null() {
                            let line = (step % P) * ahead.next + (step / P) * ahead.step;
                            _mm_prefetch::<_MM_HINT_T1>(ahead.at.wrapping_add(line).cast());
                        }
                    }
                    step += 1;
                    let mut bv = [A::splat(isa, *rows[0].offset(at)); P];
                    for (q, v) in bv.iter_mut().enumerate() {
                        *v = E::load(isa, b.add(q * self.next));
                    }
                    // Indices, not iterators: an iterator over a nested accumulator
                    // array kept it on the stack (a store after every product).
                    #[allow(clippy::needless_range_loop)]
                    for i in 0..R {
                        let ai = A::splat(isa, *rows[i].offset(at));
                        for q in 0..P {
                            acc[q][i] = E::mul_add(isa, acc[q][i], ai, bv[q]);
                        }
                    }
                    // Past the last step `b` points beyond its panel, where it
                    // is not read: `wrapping_add` makes that no UB.
                    at += self.sa;
                    b = b.wrapping_add(self.ldb);
                }
                init.join::<I, R>(isa, &acc, c, ldc);
                init = init.then();
                left -= steps;
                if left == 0 {
                    break;
                }
            }
        }
    }
}
