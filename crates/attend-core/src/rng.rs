//! PyTorch-compatible CPU random number generator (MT19937, uniform and normal draws).
//!
//! [`TorchGenerator`] reproduces the float32 values of PyTorch's default CPU generator
//! bit for bit: `torch.manual_seed`, `torch.rand`, `Tensor.uniform_`, `torch.randn` and
//! `Tensor.normal_`. `docs/torch-rng.md` explains the algorithms and why each step is
//! written as it is; section numbers (§) in the comments refer to it. The normal
//! distribution reproduces the x86-64 AVX2/AVX512 build, which is what PyTorch runs on
//! any modern x86 CPU.

use ndarray::{ArrayD, IxDyn};

/// Number of 32-bit words in the MT19937 state.
const N: usize = 624;
/// Offset of the word mixed in during regeneration.
const M: usize = 397;
/// The twist matrix's last row.
const MATRIX_A: u32 = 0x9908_B0DF;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7FFF_FFFF;

/// Below this many elements `normal` uses the scalar double-precision path (§5.1);
/// from this many on, the batched path in blocks of this many (§5.2).
const BATCH: usize = 16;

/// PyTorch's default CPU generator: MT19937 plus the cached second Box–Muller sample.
///
/// Every method consumes 32-bit draws in exactly the order PyTorch does, so a sequence
/// of calls after [`TorchGenerator::new`] gives the same bits as the same sequence
/// after `torch.manual_seed`.
///
/// ```
/// use attend_core::rng::TorchGenerator;
///
/// // torch.manual_seed(42); torch.rand(3)
/// let mut gen = TorchGenerator::new(42);
/// let x = gen.rand(&[3]);
/// assert_eq!(x.as_slice().unwrap(), &[0.88226926_f32, 0.91500396, 0.38286376]);
/// ```
#[derive(Clone, Debug)]
pub struct TorchGenerator {
    /// MT19937 state words.
    state: Box<[u32; N]>,
    /// Index of the next state word to temper; `N` means "regenerate first".
    next: usize,
    /// Second sample of the last scalar Box–Muller pair, not yet used (§5.1).
    normal_cache: Option<f64>,
}

impl TorchGenerator {
    /// A generator in the state `torch.manual_seed(seed)` leaves behind.
    ///
    /// Negative `i64` seeds are passed as `seed as u64` (two's complement), as PyTorch
    /// does. Only the low 32 bits of the seed matter.
    pub fn new(seed: u64) -> Self {
        let mut gen = TorchGenerator {
            state: Box::new([0; N]),
            next: N,
            normal_cache: None,
        };
        gen.manual_seed(seed);
        gen
    }

    /// Reseeds as `torch.manual_seed(seed)` does, and forgets the cached normal sample.
    pub fn manual_seed(&mut self, seed: u64) {
        // PyTorch builds the engine from the 64-bit seed but MT19937 keeps 32 bits (§2).
        let s = (seed & 0xFFFF_FFFF) as u32;
        self.state[0] = s;
        for i in 1..N {
            let prev = self.state[i - 1];
            self.state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.next = N;
        self.normal_cache = None;
    }

    /// One 32-bit draw (PyTorch's `random()`).
    pub fn random_u32(&mut self) -> u32 {
        if self.next >= N {
            self.regenerate();
        }
        let y = self.state[self.next];
        self.next += 1;
        temper(y)
    }

    /// One 64-bit value made of two 32-bit draws, the first being the high word (§3).
    pub fn random_u64(&mut self) -> u64 {
        let hi = self.random_u32() as u64;
        let lo = self.random_u32() as u64;
        (hi << 32) | lo
    }

    /// Consumes `draws` 32-bit draws and throws them away.
    ///
    /// Useful to line up with a notebook that created modules whose values are unused.
    pub fn skip(&mut self, draws: u64) {
        for _ in 0..draws {
            self.random_u32();
        }
    }

    /// `torch.rand(shape)`: uniform float32 in `[0, 1)`, one draw per element,
    /// row-major (§4).
    pub fn rand(&mut self, shape: &[usize]) -> ArrayD<f32> {
        self.uniform(shape, 0.0, 1.0)
    }

    /// `torch.empty(shape).uniform_(from, to)`: one draw per element, row-major (§4).
    ///
    /// The bounds are rounded to f32 first, as PyTorch does. Panics if the element
    /// count of `shape` overflows `usize` (check sizes with [`crate::limits`]).
    pub fn uniform(&mut self, shape: &[usize], from: f64, to: f64) -> ArrayD<f32> {
        let n = numel(shape);
        let mut data = Vec::with_capacity(n);
        for _ in 0..n {
            let x = self.uniform_unit_f32();
            data.push(scale_uniform(x, from as f32, to as f32));
        }
        into_array(shape, data)
    }

    /// `torch.empty(shape).normal_(mean, std)`, equally `torch.randn` when
    /// `mean = 0, std = 1` (§5).
    ///
    /// Fewer than 16 elements use the double-precision Box–Muller path, which reads
    /// and writes the generator's cached sample; 16 or more use the batched 16-wide
    /// path of PyTorch's AVX2 kernel, which leaves the cache alone. Panics if the
    /// element count of `shape` overflows `usize` (check sizes with [`crate::limits`]).
    pub fn normal(&mut self, shape: &[usize], mean: f64, std: f64) -> ArrayD<f32> {
        let n = numel(shape);
        let data = if n < BATCH {
            (0..n).map(|_| self.scalar_normal(mean, std)).collect()
        } else {
            self.batched_normal(n, mean, std)
        };
        into_array(shape, data)
    }

    /// Regenerates all 624 state words in place (§3).
    fn regenerate(&mut self) {
        let st = &mut self.state;
        for k in 0..N {
            // For k = 623, st[0] has already been updated in this pass, as MT19937 requires.
            let next = st[(k + 1) % N];
            let y = (st[k] & UPPER_MASK) | (next & LOWER_MASK);
            let twist = if next & 1 == 1 { MATRIX_A } else { 0 };
            st[k] = st[(k + M) % N] ^ (y >> 1) ^ twist;
        }
        self.next = 0;
    }

    /// A uniform f32 in `[0, 1 - 2^-24]` from the low 24 bits of one draw; exact.
    fn uniform_unit_f32(&mut self) -> f32 {
        let w = self.random_u32();
        (w & 0x00FF_FFFF) as f32 * (1.0 / 16_777_216.0)
    }

    /// A uniform f64 in `[0, 1)` from the low 53 bits of one 64-bit value (two draws).
    fn uniform_unit_f64(&mut self) -> f64 {
        let r = self.random_u64();
        (r & ((1u64 << 53) - 1)) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    /// One sample of the scalar path (§5.1): a cached value if there is one, otherwise
    /// a fresh Box–Muller pair in f64 whose sine half is cached for the next call.
    fn scalar_normal(&mut self, mean: f64, std: f64) -> f32 {
        let z = match self.normal_cache.take() {
            Some(cached) => cached,
            None => {
                let u1 = self.uniform_unit_f64();
                let u2 = self.uniform_unit_f64();
                // log1p(-u2) rather than ln(1 - u2): PyTorch 2.15 uses log1p.
                let radius = (-2.0 * (-u2).ln_1p()).sqrt();
                let theta = 2.0 * std::f64::consts::PI * u1;
                self.normal_cache = Some(radius * theta.sin());
                radius * theta.cos()
            }
        };
        // The AVX2 build contracts z*std + mean into one f64 fma. For mean 0, std 1 this
        // is f32(z) exactly (apart from -0 becoming +0, which the kernel does too).
        z.mul_add(std, mean) as f32
    }

    /// The batched path (§5.2): pre-fill uniforms, transform blocks of 16, then redo
    /// the last 16 positions with fresh draws if `n` is not a multiple of 16.
    fn batched_normal(&mut self, n: usize, mean: f64, std: f64) -> Vec<f32> {
        debug_assert!(n >= BATCH);
        let (mean, std) = (mean as f32, std as f32);
        let mut d: Vec<f32> = (0..n).map(|_| self.uniform_unit_f32()).collect();
        for block in d.chunks_exact_mut(BATCH) {
            box_muller_block(block.try_into().unwrap(), mean, std);
        }
        if !n.is_multiple_of(BATCH) {
            // The tail pre-fill is consumed but unused; the tail block overlaps the
            // last full block and overwrites part of it.
            let tail = &mut d[n - BATCH..];
            for u in tail.iter_mut() {
                *u = self.uniform_unit_f32();
            }
            box_muller_block(tail.try_into().unwrap(), mean, std);
        }
        d
    }
}

/// MT19937 output tempering.
fn temper(mut y: u32) -> u32 {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9D2C_5680;
    y ^= (y << 15) & 0xEFC6_0000;
    y ^= y >> 18;
    y
}

/// Maps a unit uniform `x` onto `[lo, hi)` as the AVX2 build does: one fused
/// multiply-add, then the clamp that keeps `hi` itself out of the range (§4).
fn scale_uniform(x: f32, lo: f32, hi: f32) -> f32 {
    let v = x.mul_add(hi - lo, lo);
    if v == hi {
        lo
    } else {
        v
    }
}

/// Box–Muller on one block of 16 uniforms in place, pairing element `j` with `j + 8`
/// (§5.3): cosine half into `j`, sine half into `j + 8`.
fn box_muller_block(d: &mut [f32; BATCH], mean: f32, std: f32) {
    const HALF: usize = BATCH / 2;
    for j in 0..HALF {
        // 1 - u is exact and lies in [2^-24, 1], so the log never sees 0.
        let u1 = 1.0 - d[j];
        let u2 = d[j + HALF];
        let radius = (-2.0 * cephes::log(u1)).sqrt();
        let theta = cephes::TWO_PI * u2;
        let (sin, cos) = cephes::sincos(theta);
        d[j] = (radius * cos).mul_add(std, mean);
        d[j + HALF] = (radius * sin).mul_add(std, mean);
    }
}

/// The f32 Cephes-style `log` and `sincos` of PyTorch's AVX2 normal kernel, with
/// FMAs exactly where GCC contracts them in that kernel (§5.3). Any other fusion
/// pattern changes some results by one ulp.
mod cephes {
    /// f32(2π).
    pub const TWO_PI: f32 = f(0x40c9_0fdb);

    const SQRTHF: f32 = f(0x3f35_04f3);
    const LOG_P: [f32; 9] = [
        f(0x3d90_21bb),
        f(0xbdeb_d1b8),
        f(0x3def_251a),
        f(0xbdfe_5d4f),
        f(0x3e11_e9bf),
        f(0xbe2a_ae50),
        f(0x3e4c_ceac),
        f(0xbe7f_fffc),
        f(0x3eaa_aaaa),
    ];
    const LOG_Q1: f32 = f(0xb95e_8083);
    const LOG_Q2: f32 = f(0x3f31_8000);

    /// 4/π.
    const FOPI: f32 = f(0x3fa2_f983);
    /// -π/4 split into three parts for an accurate range reduction.
    const DP1: f32 = f(0xbf49_0000);
    const DP2: f32 = f(0xb97d_a000);
    const DP3: f32 = f(0xb322_2169);
    const COS_C: [f32; 3] = [f(0x37cc_f5ce), f(0xbab6_061a), f(0x3d2a_aaa5)];
    const SIN_C: [f32; 3] = [f(0xb94c_a1f9), f(0x3c08_839e), f(0xbe2a_aaa3)];

    const SIGN: u32 = 0x8000_0000;

    /// A binary32 constant from its bit pattern.
    const fn f(bits: u32) -> f32 {
        f32::from_bits(bits)
    }

    /// Natural log of a positive, normal `x` (the kernel never sees 0 or subnormals).
    pub fn log(x: f32) -> f32 {
        let bits = x.to_bits();
        // Exponent as float, plus one because the mantissa is taken in [0.5, 1).
        let mut e = (((bits >> 23) as i32) - 127) as f32 + 1.0;
        let m = f32::from_bits((bits & 0x807F_FFFF) | 0x3F00_0000);
        // Centre the mantissa around 1: t = m - 1 in [sqrt(1/2) - 1, sqrt(2) - 1).
        let t = if m < SQRTHF {
            e -= 1.0;
            (m - 1.0) + m
        } else {
            m - 1.0
        };
        let z = t * t;
        let mut y = LOG_P[0];
        for &p in &LOG_P[1..] {
            y = y.mul_add(t, p);
        }
        y *= t;
        y = y.mul_add(z, e * LOG_Q1);
        y = (-z).mul_add(0.5, y);
        e.mul_add(LOG_Q2, t + y)
    }

    /// `(sin θ, cos θ)` for `θ` in `[0, 2π]`.
    pub fn sincos(theta: f32) -> (f32, f32) {
        let mut sign_sin = theta.to_bits() & SIGN;
        let mut a = theta.abs();
        // Octant index, rounded up to even so the reduced argument lies in [-π/4, π/4].
        let mut j = (a * FOPI) as i32;
        j = (j + 1) & !1;
        let y = j as f32;
        sign_sin ^= ((j & 4) as u32) << 29;
        let sign_cos = ((!(j.wrapping_sub(2)) & 4) as u32) << 29;
        let swap = j & 2 != 0;

        a = y.mul_add(DP1, a);
        a = y.mul_add(DP2, a);
        a = y.mul_add(DP3, a);
        let z = a * a;

        let mut pc = COS_C[0].mul_add(z, COS_C[1]);
        pc = pc.mul_add(z, COS_C[2]);
        pc *= z;
        pc = pc.mul_add(z, -(z * 0.5));
        pc += 1.0;

        let mut ps = SIN_C[0].mul_add(z, SIN_C[1]);
        ps = ps.mul_add(z, SIN_C[2]);
        ps *= z;
        ps = ps.mul_add(a, a);

        // Adding +0 turns -0 into +0, as the kernel's masked adds do.
        let (sin_mag, cos_mag) = if swap { (pc, ps) } else { (ps, pc) };
        let sin_mag = sin_mag + 0.0;
        let cos_mag = cos_mag + 0.0;
        (
            f32::from_bits(sin_mag.to_bits() ^ sign_sin),
            f32::from_bits(cos_mag.to_bits() ^ sign_cos),
        )
    }
}

/// Number of elements of a tensor of `shape` (1 for a scalar, `[]`).
///
/// # Panics
/// When the count overflows `usize`: the generator's callers check their sizes
/// against [`crate::limits`] first, and a wrapped count would silently draw the
/// wrong number of values.
fn numel(shape: &[usize]) -> usize {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .unwrap_or_else(|| {
            panic!("a tensor of shape {shape:?} has more elements than usize counts")
        })
}

/// Wraps row-major `data` into an array of `shape`.
fn into_array(shape: &[usize], data: Vec<f32>) -> ArrayD<f32> {
    ArrayD::from_shape_vec(IxDyn(shape), data).expect("data length equals the shape's numel")
}

#[cfg(test)]
// Expected values are written as docs/torch-rng.md's §10 table prints them (8 digits).
#[allow(clippy::excessive_precision)]
mod tests {
    use super::*;

    fn first_u32(seed: u64, n: usize) -> Vec<u32> {
        let mut gen = TorchGenerator::new(seed);
        (0..n).map(|_| gen.random_u32()).collect()
    }

    fn values(a: &ArrayD<f32>) -> Vec<f32> {
        a.iter().copied().collect()
    }

    #[test]
    fn mt19937_matches_reference_outputs() {
        assert_eq!(first_u32(5489, 1), [3_499_211_612]);
        assert_eq!(
            first_u32(0, 4),
            [2_357_136_044, 2_546_248_239, 3_071_714_933, 3_626_093_760]
        );
        assert_eq!(
            first_u32(42, 4),
            [1_608_637_542, 3_421_126_067, 4_083_286_876, 787_846_414]
        );
    }

    #[test]
    fn mt19937_10000th_output_of_default_seed() {
        // The C++ standard requires this of std::mt19937 default-constructed (seed 5489).
        let mut gen = TorchGenerator::new(5489);
        gen.skip(9999);
        assert_eq!(gen.random_u32(), 4_123_659_995);
    }

    #[test]
    fn random_u64_is_high_word_first() {
        let words = first_u32(0, 2);
        let mut gen = TorchGenerator::new(0);
        assert_eq!(
            gen.random_u64(),
            ((words[0] as u64) << 32) | words[1] as u64
        );
    }

    #[test]
    fn only_low_32_bits_of_seed_matter() {
        assert_eq!(first_u32((1 << 32) + 5, 8), first_u32(5, 8));
        assert_eq!(first_u32(-1i64 as u64, 8), first_u32(u32::MAX as u64, 8));
        assert_eq!(first_u32(i64::MAX as u64, 8), first_u32(u32::MAX as u64, 8));
        let mut gen = TorchGenerator::new(5);
        assert_eq!(
            values(&gen.rand(&[3])),
            [0.83025187, 0.12611091, 0.90746969]
        );
    }

    #[test]
    fn manual_seed_resets_stream_and_cache() {
        let mut gen = TorchGenerator::new(42);
        gen.normal(&[3], 0.0, 1.0); // leaves a cached sample
        gen.skip(1000);
        gen.manual_seed(42);
        assert_eq!(
            values(&gen.normal(&[4], 0.0, 1.0)),
            [0.33669037, 0.12880941, 0.23446237, 0.23033303]
        );
    }

    #[test]
    fn spec_rand_and_scalar_randn_vectors() {
        let mut gen = TorchGenerator::new(0);
        assert_eq!(
            values(&gen.rand(&[5])),
            [0.49625659, 0.7682218, 0.088477433, 0.13203049, 0.30742282]
        );
        gen.manual_seed(0);
        assert_eq!(
            values(&gen.normal(&[5], 0.0, 1.0)),
            [1.5409961, -0.2934289, -2.1787894, 0.56843126, -1.0845224]
        );
        gen.manual_seed(-1i64 as u64);
        assert_eq!(values(&gen.rand(&[2])), [0.99379939, 0.57130635]);
        gen.manual_seed(i64::MAX as u64);
        assert_eq!(values(&gen.normal(&[2], 0.0, 1.0)), [1.219763, -0.39297947]);
    }

    #[test]
    fn cached_sample_survives_other_calls() {
        // randn(3) leaves sin₂ cached; randn(1) returns it without drawing, even
        // after a rand and a batched randn in between.
        let mut gen = TorchGenerator::new(42);
        assert_eq!(
            values(&gen.normal(&[3], 0.0, 1.0)),
            [0.33669037, 0.12880941, 0.23446237]
        );
        gen.rand(&[5]);
        gen.normal(&[20], 0.0, 1.0);
        let before = gen.clone();
        assert_eq!(values(&gen.normal(&[1], 0.0, 1.0)), [0.23033303]);
        // No draws were consumed by the cached sample.
        assert_eq!(gen.clone().random_u32(), before.clone().random_u32());
    }

    #[test]
    fn scalar_draw_count() {
        // 4·⌈(n - h)/2⌉ draws, h = 1 when a cached sample was present.
        for (n, cached, draws) in [(1, false, 4), (2, false, 4), (3, false, 8), (3, true, 4)] {
            let mut gen = TorchGenerator::new(7);
            if cached {
                gen.normal(&[1], 0.0, 1.0);
            }
            let mut reference = gen.clone();
            gen.normal(&[n], 0.0, 1.0);
            reference.skip(draws);
            assert_eq!(gen.random_u32(), reference.random_u32(), "n={n}");
        }
    }

    #[test]
    fn batched_vectors_and_draw_count() {
        let mut gen = TorchGenerator::new(0);
        let x = values(&gen.normal(&[16], 0.0, 1.0));
        assert_eq!(
            x[..6],
            [
                -1.1258398,
                -1.1523602,
                -0.25057858,
                -0.43387881,
                0.84871036,
                0.69200915
            ]
        );
        gen.manual_seed(42);
        let x = values(&gen.normal(&[20], 0.0, 1.0));
        assert_eq!(x[..4], [1.9269153, 1.4872841, 0.9007172, -2.105521]);
        assert_eq!(x[16..], [-0.30972677, -0.3957105, 0.80340934, -0.62159538]);
        let mut reference = TorchGenerator::new(42);
        reference.skip(20 + 16);
        assert_eq!(gen.random_u32(), reference.random_u32());
        gen.manual_seed(0);
        let x = values(&gen.normal(&[20], 0.5, 2.0));
        assert_eq!(x[..4], [-1.7516797, -1.8047204, -0.0011571646, -0.36775762]);
    }

    #[test]
    fn uniform_vectors_and_clamp() {
        let mut gen = TorchGenerator::new(0);
        assert_eq!(
            values(&gen.uniform(&[6], -0.5, 0.25)),
            [
                -0.12780756,
                0.076166347,
                -0.43364191,
                -0.40097713,
                -0.2694329,
                -0.024440989
            ]
        );
        // The largest unit uniform lands on `to` for [1, 1.5) and is clamped to `from`.
        assert_eq!(scale_uniform(1.0 - 1.0 / 16_777_216.0, 1.0, 1.5), 1.0);
    }

    #[test]
    fn empty_and_scalar_shapes() {
        let mut gen = TorchGenerator::new(0);
        assert_eq!(gen.rand(&[0, 3]).shape(), &[0, 3]);
        assert_eq!(gen.normal(&[], 0.0, 1.0).shape(), &[] as &[usize]);
        let mut reference = TorchGenerator::new(0);
        reference.skip(4);
        assert_eq!(gen.random_u32(), reference.random_u32());
    }

    #[test]
    fn cephes_log_and_sincos_sanity() {
        assert_eq!(cephes::log(1.0).to_bits(), 0);
        assert!((cephes::log(0.25) - 0.25f32.ln()).abs() < 1e-6);
        for k in 0..=64 {
            let theta = cephes::TWO_PI * k as f32 / 64.0;
            let (s, c) = cephes::sincos(theta);
            assert!((s - theta.sin()).abs() < 1e-6, "sin {theta}");
            assert!((c - theta.cos()).abs() < 1e-6, "cos {theta}");
        }
    }
}
