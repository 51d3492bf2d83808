//! Instruction sets: the one place that detects CPU features and the one place
//! that enters code compiled for them (docs/design.md, "Instruction sets"). The
//! lowest layer of `attend`: it depends on no other part of it, and the kernels of
//! every layer above are written in its [`Simd`] vectors.
//!
//! Each instruction set is a *token* type ([`Portable`], `Avx2`, `Avx2Vnni`,
//! `Avx512`, `Avx512Bf16`) that implements [`Simd`], sixteen-lane f32 vectors and sixteen-lane
//! vectors of bf16 pairs. A token of a SIMD type can only be
//! made by [`Isa::token`] after the CPU was found to have its features, so the
//! vector operations are safe to call given the token; only raw-pointer loads and
//! stores stay `unsafe`. Kernels are written once, generic over `I: Simd`, as a
//! [`SimdJob`]; [`dispatch`] runs a job inside a function compiled for the token's
//! features (`#[target_feature]`), so everything the job inlines is compiled for them
//! too. Every implementation has 16 lanes, so tiles have the same shape whatever the
//! instruction set.
//!
//! Adding an instruction set means a new token type (its [`Simd`] impl is a compile
//! error until every operation exists), a variant of [`Isa`] and of [`IsaToken`], and
//! an arm in [`dispatch`]; no kernel names an instruction set.
//!
//! [`transpose`] builds matrix transposes on [`Simd::transpose16`], for the kernels'
//! packing and for their mask tiles.
//!
//! ```
//! use attend_simd::{dispatch, Isa, Simd, SimdJob, LANES};
//!
//! /// The sum of 16 floats, on whichever instruction set runs it.
//! struct Sum<'a>(&'a [f32; LANES]);
//!
//! impl SimdJob for Sum<'_> {
//!     type Output = f32;
//!     #[inline(always)]
//!     fn run<I: Simd>(self, isa: I) -> f32 {
//!         // SAFETY: the array holds 16 floats.
//!         isa.sum(unsafe { isa.load(self.0.as_ptr()) })
//!     }
//! }
//!
//! let token = Isa::detect().token()?;
//! assert_eq!(dispatch(token, Sum(&[1.0; LANES])), 16.0);
//! # Ok::<(), attend_simd::IsaError>(())
//! ```

#![warn(missing_docs)]

#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod bf16;
mod erf;
mod exp;
mod multiversion;
mod portable;
pub mod transpose;

pub use bf16::{bf16_bits, bf16_to_f32};
pub use erf::erf;
pub use exp::{exp, exp_scalar, EXP2_POLY, EXP2_TABLE, EXP2_TABLE_POLY, EXP_MIN_ARG, LOG2_E};

#[cfg(target_arch = "x86_64")]
pub use amx::Amx;
#[cfg(target_arch = "x86_64")]
pub use avx2::{Avx2, Avx2Of, Avx2Vnni};
#[cfg(target_arch = "x86_64")]
pub use avx512::{Avx512, Avx512Bf16, Avx512Of};
pub use portable::Portable;

/// What can go wrong choosing an instruction set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// An instruction set was asked for that this CPU does not have.
    #[error("isa {0} is not available on this CPU")]
    Unavailable(Isa),
    /// A name (an argument, [`MAX_ISA_VAR`]'s value) that names no instruction set.
    #[error("{0}")]
    Name(String),
}

/// A result with an [`IsaError`].
pub type Result<T> = std::result::Result<T, IsaError>;

/// The environment variable that caps the instruction set [`Isa::detect`] picks
/// (`portable`, `avx2`, `avx2vnni`, `avx512` or `avx512bf16`), for measuring a
/// lesser path on a CPU that has a better one.
pub const MAX_ISA_VAR: &str = "ATTEND_MAX_ISA";

/// An instruction set the kernels can run on, by name; ordered worst first, as
/// [`Isa::ALL`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust, vectorised by the compiler for the build target; runs anywhere.
    Portable,
    /// x86-64 AVX2 with FMA.
    Avx2,
    /// [`Isa::Avx2`] with AVX-VNNI (Intel Alder Lake on, AMD Zen 5): int8 dot
    /// products by the 256-bit `vpdpbusd`, where AVX2 alone widens the bytes to
    /// 16 bits first. Everything else runs as on [`Isa::Avx2`].
    Avx2Vnni,
    /// x86-64 AVX-512 (F, VL, BW and DQ, as on every AVX-512 server CPU since
    /// Skylake).
    Avx512,
    /// [`Isa::Avx512`] with AVX512-BF16 and AVX512-VNNI (Intel Cooper Lake and
    /// Sapphire Rapids on, AMD Zen 4 on): bf16 dot products (`vdpbf16ps`) at twice
    /// the f32 rate, int8 ones (`vpdpbusd`) at four times.
    Avx512Bf16,
    /// [`Isa::Avx512Bf16`] with AMX tiles (AMX-TILE, AMX-INT8 and AMX-BF16:
    /// Intel Sapphire Rapids on), where the OS grants them: the int8 and bf16
    /// dense products by `tdpbusd` and `tdpbf16ps`, 16 rows × 16 outputs × 64
    /// bytes an instruction ([`amx`]). Everything else runs on
    /// [`Isa::Avx512Bf16`]'s vectors, but other bf16 work (attention) is widened
    /// to f32 as where there are no bf16 products ([`Isa::has_bf16_products`]).
    Amx,
}

impl Isa {
    /// Every instruction set, worst first.
    pub const ALL: [Isa; 6] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::Avx2Vnni,
        Isa::Avx512,
        Isa::Avx512Bf16,
        Isa::Amx,
    ];

    /// The best instruction set this CPU supports, at most the one named by
    /// [`MAX_ISA_VAR`] when that is set (a valid name; see [`Isa::env_cap`]).
    ///
    /// ```
    /// let isa = attend_simd::Isa::detect();
    /// assert!(isa.is_available());
    /// ```
    pub fn detect() -> Isa {
        let cap = Isa::env_cap().ok().flatten().unwrap_or(Isa::Amx);
        let best = Isa::ALL
            .into_iter()
            .rev()
            .find(|&isa| isa <= cap && isa.is_available());
        best.unwrap_or(Isa::Portable)
    }

    /// The cap [`MAX_ISA_VAR`] puts on [`Isa::detect`] (as oneDNN's
    /// `ONEDNN_MAX_CPU_ISA`: run a CPU's AVX2 path where it has AVX-512), `None`
    /// when unset; an error naming the variable when its value names no
    /// instruction set. [`Isa::detect`] ignores an invalid value, so front ends
    /// call this at start and refuse to run with one.
    pub fn env_cap() -> Result<Option<Isa>> {
        match std::env::var(MAX_ISA_VAR) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(IsaError::Name(format!(
                "{MAX_ISA_VAR} is not valid Unicode"
            ))),
            Ok(name) => Isa::from_name(&name)
                .map(Some)
                .map_err(|err| IsaError::Name(format!("{MAX_ISA_VAR}: {err}"))),
        }
    }

    /// The requested instruction set, or the best this CPU has; an error if the CPU
    /// cannot run the requested one.
    pub fn resolve(requested: Option<Isa>) -> Result<Isa> {
        let isa = requested.unwrap_or_else(Isa::detect);
        isa.token().map(|_| isa)
    }

    /// Whether `self` multiplies bf16 numbers faster than f32 ones ([`Simd::dot2`]
    /// in one `vdpbf16ps`, at twice the f32 rate): only [`Isa::Avx512Bf16`].
    /// Elsewhere `dot2` is two fused multiply-adds behind the shifts that widen
    /// its pairs, slower than the f32 kernels on the same numbers widened once, so
    /// bf16 work runs those there (docs/design.md, "Precision"). So does
    /// [`Isa::Amx`]: Intel's CPUs run `vdpbf16ps` at half the rate of their
    /// fused multiply-adds, the f32 rate in all, and the pairs' conversions made
    /// it slower than f32 there (`ATTEND_MAX_ISA=avx512bf16` runs it).
    pub fn has_bf16_products(self) -> bool {
        self == Isa::Avx512Bf16
    }

    /// Whether the bf16 dense layers multiply on AMX's tiles here (`tdpbf16ps`,
    /// [`Isa::Amx`]), at several times the f32 rate, though attention's bf16
    /// work is widened to f32 ([`Isa::has_bf16_products`]).
    pub fn has_bf16_tiles(self) -> bool {
        self == Isa::Amx
    }

    /// Whether this CPU can run kernels built for `self`.
    pub fn is_available(self) -> bool {
        self.token().is_ok()
    }

    /// Every instruction set this CPU can run, best last.
    pub fn available() -> Vec<Isa> {
        Isa::ALL
            .into_iter()
            .filter(|isa| isa.is_available())
            .collect()
    }

    /// Lower-case name (`portable`, `avx2`, `avx2vnni`, `avx512`, `avx512bf16`,
    /// `amx`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx2Vnni => "avx2vnni",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
            Isa::Amx => "amx",
        }
    }

    /// The instruction set named `name` (as [`Isa::name`] spells it); an error
    /// listing the names otherwise.
    pub fn from_name(name: &str) -> Result<Isa> {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Isa::ALL.iter().map(|isa| isa.name()).collect();
                IsaError::Name(format!(
                    "unknown instruction set {name:?}; expected one of {}",
                    names.join(", ")
                ))
            })
    }

    /// The token that lets kernels run on `self`; an error naming the instruction
    /// set if this CPU does not have it.
    pub fn token(self) -> Result<IsaToken> {
        let token = match self {
            Isa::Portable => Some(IsaToken::Portable(Portable)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Avx2::new().map(IsaToken::Avx2),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Vnni => Avx2Vnni::new().map(IsaToken::Avx2Vnni),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Avx512::new().map(IsaToken::Avx512),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => Avx512Bf16::new().map(IsaToken::Avx512Bf16),
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Amx::new().map(IsaToken::Amx),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx2Vnni | Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => None,
        };
        token.ok_or(IsaError::Unavailable(self))
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Whether the CPU has AVX2, FMA and AVX-VNNI.
#[cfg(target_arch = "x86_64")]
fn has_avx2vnni() -> bool {
    has_avx2() && std::arch::is_x86_feature_detected!("avxvnni")
}

/// Whether the CPU has AVX-512 F, VL, BW and DQ (and AVX2 with FMA, which every
/// such CPU has).
#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    has_avx2()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512dq")
}

/// Whether the CPU has [`has_avx512`]'s features, AVX512-BF16 and AVX512-VNNI
/// (which every CPU with AVX512-BF16 has).
#[cfg(target_arch = "x86_64")]
fn has_avx512bf16() -> bool {
    has_avx512()
        && std::arch::is_x86_feature_detected!("avx512bf16")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// A detected instruction set: one of the token types, which exist only when the
/// CPU has their features.
#[derive(Clone, Copy, Debug)]
pub enum IsaToken {
    /// Plain Rust, on any CPU.
    Portable(Portable),
    #[cfg(target_arch = "x86_64")]
    /// AVX2 with FMA.
    Avx2(Avx2),
    #[cfg(target_arch = "x86_64")]
    /// AVX2 with FMA and AVX-VNNI.
    Avx2Vnni(Avx2Vnni),
    #[cfg(target_arch = "x86_64")]
    /// AVX-512 F, VL, BW and DQ.
    Avx512(Avx512),
    #[cfg(target_arch = "x86_64")]
    /// AVX-512 with AVX512-BF16 and AVX512-VNNI.
    Avx512Bf16(Avx512Bf16),
    #[cfg(target_arch = "x86_64")]
    /// AVX-512 with AVX512-BF16, AVX512-VNNI and AMX tiles.
    Amx(Amx),
}

impl IsaToken {
    /// The instruction set this token stands for.
    pub fn isa(self) -> Isa {
        match self {
            IsaToken::Portable(_) => Isa::Portable,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx2(_) => Isa::Avx2,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx2Vnni(_) => Isa::Avx2Vnni,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx512(_) => Isa::Avx512,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx512Bf16(_) => Isa::Avx512Bf16,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Amx(_) => Isa::Amx,
        }
    }

    /// Vector registers of 16 lanes ([`Simd::REGISTERS`]) of this instruction set.
    pub fn registers(self) -> usize {
        match self {
            IsaToken::Portable(_) => Portable::REGISTERS,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx2(_) => Avx2::REGISTERS,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx2Vnni(_) => Avx2Vnni::REGISTERS,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx512(_) => Avx512::REGISTERS,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx512Bf16(_) | IsaToken::Amx(_) => Avx512Bf16::REGISTERS,
        }
    }

    /// Whether [`Simd::dot4`] is one instruction (`vpdpbusd`) on this instruction
    /// set ([`Simd::NATIVE_DOT4`]).
    pub fn native_dot4(self) -> bool {
        match self {
            IsaToken::Portable(_) => Portable::NATIVE_DOT4,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx2(_) => Avx2::NATIVE_DOT4,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx2Vnni(_) => Avx2Vnni::NATIVE_DOT4,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx512(_) => Avx512::NATIVE_DOT4,
            #[cfg(target_arch = "x86_64")]
            IsaToken::Avx512Bf16(_) | IsaToken::Amx(_) => Avx512Bf16::NATIVE_DOT4,
        }
    }

    /// The AMX tiles, where this token grants them ([`Isa::Amx`]).
    #[cfg(target_arch = "x86_64")]
    pub fn amx(self) -> Option<Amx> {
        match self {
            IsaToken::Amx(t) => Some(t),
            _ => None,
        }
    }

    /// The best instruction set of this CPU, detected once.
    pub fn best() -> IsaToken {
        static BEST: std::sync::OnceLock<IsaToken> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let best = Isa::detect().token();
            best.unwrap_or(IsaToken::Portable(Portable))
        })
    }
}

/// A computation written once for every instruction set.
pub trait SimdJob {
    /// What the job returns.
    type Output;
    /// Runs the job with the vectors of `isa`. Implementations are
    /// `#[inline(always)]`, so that they (and the vector operations they call) are
    /// compiled inside [`dispatch`]'s per-instruction-set entry points.
    fn run<I: Simd>(self, isa: I) -> Self::Output;
}

/// A job of plain scalar code (a closure): [`dispatch`] compiles it for the
/// instruction set's features, so that the compiler vectorises its loops with
/// them.
pub struct Scalar<F>(pub F);

impl<R, F: FnOnce() -> R> SimdJob for Scalar<F> {
    type Output = R;
    #[inline(always)]
    fn run<I: Simd>(self, _isa: I) -> R {
        (self.0)()
    }
}

/// Runs `job` with `token`'s vectors, compiled for its features.
#[inline]
pub fn dispatch<J: SimdJob>(token: IsaToken, job: J) -> J::Output {
    match token {
        IsaToken::Portable(t) => job.run(t),
        // SAFETY: a token exists only on a CPU with its features (`Isa::token`).
        #[cfg(target_arch = "x86_64")]
        IsaToken::Avx2(t) => unsafe { run_avx2(t, job) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        IsaToken::Avx2Vnni(t) => unsafe { run_avx2vnni(t, job) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        IsaToken::Avx512(t) => unsafe { run_avx512(t, job) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        IsaToken::Avx512Bf16(t) => unsafe { run_avx512bf16(t, job) },
        // SAFETY: as above; the job runs on the vectors, not the tiles.
        #[cfg(target_arch = "x86_64")]
        IsaToken::Amx(t) => unsafe { run_avx512bf16(t.vectors(), job) },
    }
}

/// # Safety
/// The CPU must have AVX2 and FMA (the token proves it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<J: SimdJob>(token: Avx2, job: J) -> J::Output {
    job.run(token)
}

/// # Safety
/// The CPU must have AVX2, FMA and AVX-VNNI (the token proves it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn run_avx2vnni<J: SimdJob>(token: Avx2Vnni, job: J) -> J::Output {
    job.run(token)
}

/// # Safety
/// The CPU must have AVX-512 F, VL, BW, DQ, AVX2 and FMA (the token proves it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
unsafe fn run_avx512<J: SimdJob>(token: Avx512, job: J) -> J::Output {
    job.run(token)
}

/// # Safety
/// The CPU must have AVX512-BF16, AVX512-VNNI and [`run_avx512`]'s features (the
/// token proves it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,avx512vnni,avx2,fma")]
unsafe fn run_avx512bf16<J: SimdJob>(token: Avx512Bf16, job: J) -> J::Output {
    job.run(token)
}

/// Lanes in every [`Simd`] vector.
pub const LANES: usize = 16;

/// The largest magnitude of a signed byte of [`Simd::dot4_narrow`]'s `b`.
pub const NARROW_LEVEL: i8 = 63;

/// Sixteen-lane f32 vectors and their operations, on one instruction set.
///
/// Operations on vectors are safe: the token (`self`) proves the CPU has the
/// instructions. Loads and stores through raw pointers are `unsafe`. All are
/// `#[inline(always)]`, so that they inline into [`dispatch`]'s entry points.
///
/// # Safety
/// An implementing type must be constructible only on CPUs that support every
/// instruction its methods use.
pub unsafe trait Simd: Copy + Send + Sync {
    /// The vector.
    type V: Copy;
    /// Sixteen 32-bit integer lanes: bf16 *pairs* (32 bf16 numbers; lane `i`
    /// holds elements `2i` (low half) and `2i + 1` (high half) of a row, as they
    /// lie in memory), int8 *quads* (four bytes, the lowest first) or i32 sums.
    type P: Copy;
    /// Sixteen-lane vector registers, for choosing register blocks.
    const REGISTERS: usize;
    /// Whether [`Simd::dot4`] is one instruction (`vpdpbusd`), which needs no
    /// registers for bytes widened to 16 bits: int8 tiles can take more rows.
    const NATIVE_DOT4: bool;
    /// Loads 16 contiguous floats.
    ///
    /// # Safety
    /// `p` must be valid for reading 16 floats.
    unsafe fn load(self, p: *const f32) -> Self::V;
    /// Stores 16 contiguous floats.
    ///
    /// # Safety
    /// `p` must be valid for writing 16 floats.
    unsafe fn store(self, p: *mut f32, v: Self::V);
    /// Loads the first `n ≤ 16` floats at `p`, zeros in the other lanes.
    ///
    /// # Safety
    /// `p` must be valid for reading `n` floats.
    unsafe fn load_part(self, p: *const f32, n: usize) -> Self::V;
    /// Stores the first `n ≤ 16` lanes.
    ///
    /// # Safety
    /// `p` must be valid for writing `n` floats.
    unsafe fn store_part(self, p: *mut f32, v: Self::V, n: usize);
    /// Broadcasts `x`.
    fn splat(self, x: f32) -> Self::V;
    /// `a · b + c`, fused.
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a + b`.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`, correctly rounded (as the scalar division).
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum; a NaN in `b` is returned as is, so NaN scores propagate.
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// `y`, but −∞ in the lanes where `mask` is −∞: a masked score stays masked
    /// even when it is NaN (NaN + −∞ is NaN), so a NaN never reaches a row that
    /// cannot see it.
    fn masked(self, y: Self::V, mask: Self::V) -> Self::V;
    /// `e^x` for `x ≤ 0` (also correct, but not fast-path, for positive `x` up to
    /// 88), computed as `2^(x · log₂e)` with the product inside the reduction's
    /// fused multiply-adds, so that a softmax keeps its scores in their own units
    /// (a factor of `log₂e` applied to the scores would overflow those beyond
    /// `f32::MAX / log₂e`): within about 1 ulp plus `|x| · 1.3·10⁻⁸` relative
    /// ([`LOG2_E`]) where the result is normal, NaN for NaN, 0 for −∞. Subnormal
    /// results are 0 on AVX2 (one scaling instead of two) and exact to within
    /// their spacing elsewhere: a softmax weight that small changes no sum.
    fn exp(self, x: Self::V) -> Self::V;
    /// Sum of the lanes, as a pairwise tree.
    fn sum(self, a: Self::V) -> f32;
    /// Lane `j` of the result is the sum of the lanes of `a[j]` (sixteen horizontal
    /// sums at once, as a transpose-and-add tree).
    fn sum16(self, a: &[Self::V; LANES]) -> Self::V;
    /// Transposes sixteen vectors in place: lane `i` of `a[j]` and lane `j` of
    /// `a[i]` trade places (a 16 × 16 block turned between row and column order).
    fn transpose16(self, a: &mut [Self::V; LANES]);
    /// Maximum of the lanes (−∞ lanes are ignored unless all are −∞; NaN if any
    /// lane is NaN).
    fn max_lane(self, a: Self::V) -> f32;
    /// Loads 16 contiguous bf16 pairs.
    ///
    /// # Safety
    /// `p` must be valid for reading 16 `u32`.
    unsafe fn load_pairs(self, p: *const u32) -> Self::P;
    /// Stores 16 bf16 pairs.
    ///
    /// # Safety
    /// `p` must be valid for writing 16 `u32`.
    unsafe fn store_pairs(self, p: *mut u32, v: Self::P);
    /// Broadcasts one pair (its bits, low element in the low half).
    fn splat_pair(self, x: u32) -> Self::P;
    /// `acc + a.high · b.high + a.low · b.low` in each lane, in that order, each
    /// product added with one rounding: AVX512-BF16's `vdpbf16ps`, which other
    /// instruction sets compute with two fused multiply-adds (the products of bf16
    /// numbers are exact in f32). Only subnormals may differ: `vdpbf16ps` flushes
    /// them to zero.
    fn dot2(self, acc: Self::V, a: Self::P, b: Self::P) -> Self::V;
    /// The pairs' high halves and their low halves, each widened exactly to f32
    /// (a mask, a shift): `(high, low)`, the order in which [`dot2`](Self::dot2)
    /// adds their products.
    fn widen_pairs(self, a: Self::P) -> (Self::V, Self::V);
    /// Rounds `low` and `high` to bf16 (to nearest, ties to even, as
    /// [`bf16_bits`]) and interleaves them: lane `i` is the pair
    /// `(low[i], high[i])`. Only subnormals may differ: AVX512-BF16's
    /// `vcvtne2ps2bf16` flushes them to zero.
    fn pack_bf16(self, low: Self::V, high: Self::V) -> Self::P;
    /// Loads 16 contiguous bf16 numbers (their bits), widened exactly to f32.
    ///
    /// # Safety
    /// `p` must be valid for reading 16 `u16`.
    unsafe fn load_bf16(self, p: *const u16) -> Self::V;
    /// Rounds 16 floats to bf16 exactly as [`bf16_bits`] does, subnormals included,
    /// and stores their bits: a bf16 tensor's values, where `pack_bf16`'s flushing
    /// would be visible.
    ///
    /// # Safety
    /// `p` must be valid for writing 16 `u16`.
    unsafe fn store_bf16(self, p: *mut u16, x: Self::V);
    /// `acc + Σ a.byte[t] · b.byte[t]` over the four bytes of each lane, `a`'s
    /// bytes unsigned (0 to 255) and `b`'s signed (−128 to 127), the sum wrapping
    /// in i32: `vpdpbusd` (AVX512-VNNI, AVX-VNNI), which other instruction sets
    /// compute exactly by widening the bytes to 16 bits (`vpmaddwd`): no
    /// intermediate saturates, so every instruction set gives the same sums.
    fn dot4(self, acc: Self::P, a: Self::P, b: Self::P) -> Self::P;
    /// [`dot4`](Self::dot4) where every byte of `b` is in −63 ..= 63 ([`NARROW_LEVEL`]):
    /// `vpdpbusd` where there is one, and elsewhere `vpmaddubsw` (two byte products
    /// summed in 16 bits, at most 2 · 255 · 63 = 32,130, so nothing saturates)
    /// followed by `vpmaddwd` by ones: on AVX2 twice the rate of the widening,
    /// whose two `vpmaddwd` share one port (`scripts/peak/int8-peak`). A byte of
    /// `b` outside that range may give a wrong sum (saturated) on those
    /// instruction sets.
    fn dot4_narrow(self, acc: Self::P, a: Self::P, b: Self::P) -> Self::P;
    /// `acc − a · b` lane by lane, in i32, wrapping.
    fn mul_sub_i32(self, acc: Self::P, a: Self::P, b: Self::P) -> Self::P;
    /// The i32 lanes converted to f32, rounded to nearest (ties to even) as `as
    /// f32` rounds.
    fn i32_to_f32(self, a: Self::P) -> Self::V;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The relative error [`Simd::exp`] may have at `x`: 3 ε for the
    /// polynomial and the scaling, plus what `log₂e`'s rounding to f32 moves
    /// (`|x| · 1.34·10⁻⁸`, [`LOG2_E`]).
    fn exp_bound(x: f32) -> f64 {
        3.0 * f32::EPSILON as f64 + x.abs() as f64 * 1.34e-8
    }

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -103.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = exp_scalar(x) as f64;
            if want > 1e-30 {
                worst = worst.max(((got - want) / want).abs() / exp_bound(x));
            }
            x += 0.0093;
        }
        assert!(worst < 1.0, "worst error {worst} of the bound");
        assert_eq!(exp_scalar(0.0), 1.0);
        assert_eq!(exp_scalar(f32::NEG_INFINITY), 0.0);
        assert!(exp_scalar(f32::NAN).is_nan());
        for isa in Isa::available() {
            let token = isa.token().expect("available");
            // Every 1/128 of a power of two from 2^−126 to 1 (each table entry,
            // both sides of each rounding boundary between them), in natural
            // units, and 16 points spread wider.
            let ln2 = std::f64::consts::LN_2;
            let grid = (0..126 * 128).map(|i| ((-(i as f64) / 128.0 - 1.0 / 256.0) * ln2) as f32);
            let spread = (0..16).map(|i| -(i as f32) * 5.1 - 0.37);
            let xs: Vec<f32> = grid.chain(spread).collect();
            for chunk in xs.chunks_exact(16) {
                let chunk: [f32; 16] = chunk.try_into().expect("16 lanes");
                for (x, g) in chunk.iter().zip(dispatch(token, ExpLanes(chunk))) {
                    let want = (*x as f64).exp();
                    let err = ((g as f64 - want) / want).abs();
                    assert!(err < exp_bound(*x), "{isa:?}: e^{x} gave {g}");
                }
            }
            // Subnormal results: within their spacing (plus the relative bound) or
            // flushed to 0, never above 2^−126.
            let tiny: [f32; 16] = std::array::from_fn(|i| -87.4 - i as f32 * 1.1);
            for (x, g) in tiny.iter().zip(dispatch(token, ExpLanes(tiny))) {
                let want = (*x as f64).exp();
                let bound = f32::from_bits(1) as f64 + want * exp_bound(*x);
                let close = (g as f64 - want).abs() <= bound;
                assert!(close || g == 0.0, "{isa:?}: e^{x} gave {g}");
            }
            let mut special = [0.0f32; 16];
            special[1] = f32::NEG_INFINITY;
            special[2] = f32::NAN;
            special[3] = -1000.0;
            special[4] = f32::MIN;
            let got = dispatch(token, ExpLanes(special));
            assert_eq!(got[0], 1.0, "{isa:?}");
            assert_eq!(got[1], 0.0, "{isa:?}");
            assert!(got[2].is_nan(), "{isa:?}");
            assert_eq!(got[3], 0.0, "{isa:?}");
            assert_eq!(got[4], 0.0, "{isa:?}");
        }
    }

    #[test]
    fn exp2_table_is_rounded_to_nearest() {
        for (j, &t) in EXP2_TABLE.iter().enumerate() {
            let want = (j as f64 / 32.0).exp2();
            let (below, above) = (
                f32::from_bits(t.to_bits() - 1),
                f32::from_bits(t.to_bits() + 1),
            );
            let err = (t as f64 - want).abs();
            assert!(err <= (below as f64 - want).abs(), "entry {j}: {t}");
            assert!(err <= (above as f64 - want).abs(), "entry {j}: {t}");
        }
    }

    /// `e^x` of sixteen floats.
    struct ExpLanes([f32; 16]);

    impl SimdJob for ExpLanes {
        type Output = [f32; 16];
        #[inline(always)]
        fn run<I: Simd>(self, isa: I) -> [f32; 16] {
            let mut out = [0.0f32; 16];
            // SAFETY: both arrays hold 16 floats.
            unsafe { isa.store(out.as_mut_ptr(), isa.exp(isa.load(self.0.as_ptr()))) };
            out
        }
    }

    #[test]
    fn reductions_and_partial_access() {
        for isa in Isa::available() {
            dispatch(isa.token().expect("available"), CheckReductions);
        }
    }

    /// Partial loads and stores, sums and maxima against plain loops.
    struct CheckReductions;

    impl SimdJob for CheckReductions {
        type Output = ();
        #[inline(always)]
        fn run<I: Simd>(self, isa: I) {
            let xs: Vec<f32> = (0..16).map(|i| -(i as f32) * 7.3 - 0.37).collect();
            // SAFETY: every buffer holds at least 16 floats.
            unsafe {
                let v = isa.load_part(xs.as_ptr(), 5);
                let want: f32 = xs[..5].iter().sum();
                assert!((isa.sum(v) - want).abs() <= 4.0 * f32::EPSILON * want.abs());
                assert_eq!(isa.max_lane(isa.load(xs.as_ptr())), xs[0]);
                for lane in 0..LANES {
                    let mut ys = [f32::NEG_INFINITY; LANES];
                    ys[lane] = f32::NAN;
                    let m = isa.max_lane(isa.load(ys.as_ptr()));
                    assert!(m.is_nan(), "max_lane drops a NaN in lane {lane}: {m}");
                }
                let mut out = [1.0f32; 16];
                isa.store_part(out.as_mut_ptr(), isa.load(xs.as_ptr()), 3);
                assert_eq!(&out[..3], &xs[..3]);
                assert!(out[3..].iter().all(|&x| x == 1.0));
                let mut vs = [isa.splat(0.0); LANES];
                for (j, v) in vs.iter_mut().enumerate() {
                    let row: Vec<f32> = (0..16).map(|c| (j * 16 + c) as f32).collect();
                    *v = isa.load(row.as_ptr());
                }
                let mut sums = [0.0f32; 16];
                isa.store(sums.as_mut_ptr(), isa.sum16(&vs));
                for (j, x) in sums.iter().enumerate() {
                    let want: f32 = (0..16).map(|c| (j * 16 + c) as f32).sum();
                    assert_eq!(*x, want, "sum16 lane {j}");
                }
                isa.transpose16(&mut vs);
                for (i, v) in vs.iter().enumerate() {
                    let mut lanes = [0.0f32; 16];
                    isa.store(lanes.as_mut_ptr(), *v);
                    for (j, &x) in lanes.iter().enumerate() {
                        assert_eq!(x, (j * 16 + i) as f32, "transpose16 row {i} lane {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_rounding_matches_half_and_the_definition() {
        let cases = [
            0.0f32,
            -0.0,
            1.0,
            // Ties: 1 + 2^-8 sits halfway between 1 and 1 + 2^-7; even is 1.
            1.0 + 1.0 / 256.0,
            // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6; even is the upper.
            1.0 + 3.0 / 256.0,
            1.0 + 1.0 / 256.0 + f32::EPSILON,
            -5.432_1,
            f32::MAX,
            f32::MIN_POSITIVE,
            1.0e-40,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for x in cases {
            assert_eq!(bf16_bits(x), half::bf16::from_f32(x).to_bits(), "{x:e}");
        }
        assert_eq!(bf16_to_f32(bf16_bits(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(bf16_to_f32(bf16_bits(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
        assert_eq!(bf16_to_f32(bf16_bits(f32::MAX)), f32::INFINITY);
        // A NaN whose payload lies only in the low half must not round to infinity.
        assert!(bf16_to_f32(bf16_bits(f32::from_bits(0x7F80_0001))).is_nan());
    }

    #[test]
    fn bf16_pair_operations_agree_with_scalar_code() {
        for isa in Isa::available() {
            dispatch(isa.token().expect("available"), CheckPairs);
        }
    }

    /// `pack_bf16`, `store_bf16`, `load_bf16`, `widen_pairs` and `dot2` against
    /// [`bf16_bits`], [`bf16_to_f32`] and two scalar fused multiply-adds, lane by
    /// lane.
    struct CheckPairs;

    impl SimdJob for CheckPairs {
        type Output = ();
        #[inline(always)]
        fn run<I: Simd>(self, isa: I) {
            let low: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) * 1.001_37).collect();
            let mut high: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 / 256.0).collect();
            high[3] = f32::from_bits(0x7F80_0001);
            high[4] = f32::MAX;
            let acc: Vec<f32> = (0..16).map(|i| i as f32 * 0.1).collect();
            // SAFETY: every buffer holds 16 elements.
            unsafe {
                let pairs = isa.pack_bf16(isa.load(low.as_ptr()), isa.load(high.as_ptr()));
                let mut bits = [0u32; 16];
                isa.store_pairs(bits.as_mut_ptr(), pairs);
                for i in 0..16 {
                    assert_eq!(bits[i] as u16, bf16_bits(low[i]), "low lane {i}");
                    assert_eq!((bits[i] >> 16) as u16, bf16_bits(high[i]), "high lane {i}");
                }
                let mut rounded = [0u16; 16];
                for v in [&low, &high] {
                    isa.store_bf16(rounded.as_mut_ptr(), isa.load(v.as_ptr()));
                    for i in 0..16 {
                        assert_eq!(rounded[i], bf16_bits(v[i]), "store_bf16 lane {i}");
                    }
                }
                let subnormal: Vec<f32> = (0..16)
                    .map(|i| f32::from_bits(0x0001_8000 + 0x0002_0000 * i as u32))
                    .collect();
                isa.store_bf16(rounded.as_mut_ptr(), isa.load(subnormal.as_ptr()));
                for i in 0..16 {
                    assert_ne!(rounded[i], 0, "store_bf16 keeps subnormal lane {i}");
                    assert_eq!(rounded[i], bf16_bits(subnormal[i]), "subnormal lane {i}");
                }
                let halves: Vec<u16> = bits.iter().map(|&b| b as u16).collect();
                let mut widened = [0.0f32; 16];
                isa.store(widened.as_mut_ptr(), isa.load_bf16(halves.as_ptr()));
                for i in 0..16 {
                    assert_eq!(widened[i], bf16_to_f32(halves[i]));
                }
                let (wide_high, wide_low) = isa.widen_pairs(isa.load_pairs(bits.as_ptr()));
                let (mut got_high, mut got_low) = ([0.0f32; 16], [0.0f32; 16]);
                isa.store(got_high.as_mut_ptr(), wide_high);
                isa.store(got_low.as_mut_ptr(), wide_low);
                for i in 0..16 {
                    let want_high = bf16_to_f32((bits[i] >> 16) as u16);
                    assert_eq!(got_high[i].to_bits(), want_high.to_bits(), "high lane {i}");
                    let want_low = bf16_to_f32(bits[i] as u16);
                    assert_eq!(got_low[i].to_bits(), want_low.to_bits(), "low lane {i}");
                }
                let b = isa.splat_pair(bf16_bits(0.75) as u32 | (bf16_bits(-2.5) as u32) << 16);
                let again = isa.load_pairs(bits.as_ptr());
                let mut got = [0.0f32; 16];
                isa.store(got.as_mut_ptr(), isa.dot2(isa.load(acc.as_ptr()), again, b));
                for i in 0..16 {
                    let (lo, hi) = (
                        bf16_to_f32(bits[i] as u16),
                        bf16_to_f32((bits[i] >> 16) as u16),
                    );
                    let want = lo.mul_add(0.75, hi.mul_add(-2.5, acc[i]));
                    assert!(
                        got[i].to_bits() == want.to_bits() || (got[i].is_nan() && want.is_nan()),
                        "{:?} dot2 lane {i}: {} vs {want}",
                        std::any::type_name::<I>(),
                        got[i]
                    );
                }
            }
        }
    }

    #[test]
    fn int8_quad_operations_agree_with_scalar_code() {
        for isa in Isa::available() {
            dispatch(isa.token().expect("available"), CheckQuads);
        }
    }

    /// `dot4`, `mul_sub_i32` and `i32_to_f32` against plain integer arithmetic,
    /// lane by lane, on the bytes' extremes (255 × −128 in every product of some
    /// lanes, which `vpmaddubsw` would saturate) and on mixed ones.
    struct CheckQuads;

    impl SimdJob for CheckQuads {
        type Output = ();
        #[inline(always)]
        fn run<I: Simd>(self, isa: I) {
            let quad = |bytes: [u8; 4]| u32::from_le_bytes(bytes);
            let a: Vec<u32> = (0..16u32)
                .map(|i| match i {
                    0 => quad([255; 4]),
                    1 => quad([0; 4]),
                    _ => quad(std::array::from_fn(|t| (i * 37 + t as u32 * 101) as u8)),
                })
                .collect();
            let b: Vec<u32> = (0..16u32)
                .map(|i| match i {
                    0 => quad([0x80; 4]),
                    1 => quad([0x7F; 4]),
                    _ => quad(std::array::from_fn(|t| (i * 53 + t as u32 * 29) as u8)),
                })
                .collect();
            let acc: Vec<u32> = (0..16)
                .map(|i: i32| (i * 100_003 - 700_000) as u32)
                .collect();
            let mut got = [0u32; 16];
            // SAFETY: every buffer holds 16 lanes.
            unsafe {
                let (va, vb, vacc) = (
                    isa.load_pairs(a.as_ptr()),
                    isa.load_pairs(b.as_ptr()),
                    isa.load_pairs(acc.as_ptr()),
                );
                // Each lane's sum of products of `a`'s unsigned and `w`'s signed
                // bytes, in i64, added to `acc`'s.
                let exact = |got: &[u32], w: &[u32], name: &str| {
                    for i in 0..16 {
                        let (x, y) = (a[i].to_le_bytes(), w[i].to_le_bytes());
                        let sum: i64 = (0..4).map(|t| x[t] as i64 * y[t] as i8 as i64).sum();
                        assert_eq!(
                            got[i] as i32 as i64,
                            acc[i] as i32 as i64 + sum,
                            "{name} lane {i}"
                        );
                    }
                };
                isa.store_pairs(got.as_mut_ptr(), isa.dot4(vacc, va, vb));
                exact(&got, &b, "dot4");
                let want0 = 4 * 255 * -128 + acc[0] as i32;
                assert_eq!(got[0] as i32, want0, "dot4 at the bytes' extremes");
                // `dot4_narrow` on `b`'s bytes brought into −63 ..= 63 (their
                // extremes in lanes 0 and 1: 255 × ±63 in every product).
                let narrow: Vec<u32> = b
                    .iter()
                    .map(|&q| {
                        let bytes = q.to_le_bytes();
                        quad(bytes.map(|y| (y as i8).clamp(-NARROW_LEVEL, NARROW_LEVEL) as u8))
                    })
                    .collect();
                let vn = isa.load_pairs(narrow.as_ptr());
                isa.store_pairs(got.as_mut_ptr(), isa.dot4_narrow(vacc, va, vn));
                exact(&got, &narrow, "dot4_narrow");
                let want0 = 4 * 255 * -63 + acc[0] as i32;
                assert_eq!(got[0] as i32, want0, "dot4_narrow at the bytes' extremes");
                isa.store_pairs(
                    got.as_mut_ptr(),
                    isa.mul_sub_i32(vacc, vb, isa.splat_pair(3)),
                );
                for i in 0..16 {
                    let want = (acc[i] as i32).wrapping_sub((b[i] as i32).wrapping_mul(3));
                    assert_eq!(got[i] as i32, want, "mul_sub_i32 lane {i}");
                }
                let big: Vec<u32> = (0..16)
                    .map(|i| ((1i32 << 24) + 1 + i * 7 - 50 * (i % 2) * (1 << 20)) as u32)
                    .collect();
                let mut floats = [0.0f32; 16];
                isa.store(
                    floats.as_mut_ptr(),
                    isa.i32_to_f32(isa.load_pairs(big.as_ptr())),
                );
                for i in 0..16 {
                    assert_eq!(floats[i], big[i] as i32 as f32, "i32_to_f32 lane {i}");
                }
            }
        }
    }
}
