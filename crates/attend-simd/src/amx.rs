//! Intel AMX: eight tile registers of up to 16 rows × 64 bytes, and tile
//! multiplies that sum 16 × 16 × 64 byte products into i32 (`tdpbusd`), eight
//! times what `vpdpbusd` does on a 512-bit register, or 16 × 16 × 32 bf16
//! products into f32 (`tdpbf16ps`), eight times `vdpbf16ps`.
//!
//! Linux hands a process the tiles' 8 KiB of state only when it asks for them
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): [`Amx::new`] asks once
//! and exists only where the answer was yes. The tile instructions are written as
//! inline assembly: Rust's AMX intrinsics are not stable.

use std::arch::asm;
use std::marker::PhantomData;

use super::Avx512Bf16;

/// Proof that the CPU has AMX-TILE, AMX-INT8 and AMX-BF16 besides
/// [`Avx512Bf16`]'s features (every AMX CPU has all three), and that the operating system let this process use the tiles: only
/// [`Amx::new`] makes one.
#[derive(Clone, Copy, Debug)]
pub struct Amx(Avx512Bf16);

impl Amx {
    /// The token, if this CPU has the features and the OS grants the tiles.
    pub fn new() -> Option<Self> {
        static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let vectors = Avx512Bf16::new()?;
        GRANTED
            .get_or_init(|| has_amx() && request_tiles())
            .then_some(Amx(vectors))
    }

    /// The vector instructions every AMX CPU has, for everything but the tiles.
    pub fn vectors(self) -> Avx512Bf16 {
        self.0
    }

    /// The tiles configured as eight of 16 rows × 64 bytes, for this thread until
    /// the guard drops (which releases them, so that a context switch saves no
    /// tile state).
    pub fn tiles(self) -> Tiles {
        let config = TileConfig::full();
        // SAFETY: the token proves AMX-TILE; `config` is a valid palette-1
        // configuration of 64 bytes.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) &config, options(nostack, readonly)) };
        Tiles(PhantomData)
    }
}

/// Whether CPUID reports AMX-BF16, AMX-TILE and AMX-INT8 (leaf 7, EDX bits
/// 22, 24 and 25).
fn has_amx() -> bool {
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    let bits = (1 << 22) | (1 << 24) | (1 << 25);
    leaf.edx & bits == bits
}

/// Asks Linux for the tile data state; whether it was granted.
#[cfg(target_os = "linux")]
fn request_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with this code reads no memory; it only sets a flag of
    // the process.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// Elsewhere the tiles are not used.
#[cfg(not(target_os = "linux"))]
fn request_tiles() -> bool {
    false
}

/// `ldtilecfg`'s 64-byte operand (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// All eight tiles 16 rows of 64 bytes.
    fn full() -> Self {
        let mut config = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        config.bytes_per_row[..8].fill(64);
        config.rows[..8].fill(16);
        config
    }
}

/// Rows of a tile.
pub const TILE_ROWS: usize = 16;
/// Bytes of a tile row, and so of one step of a tile product's sum.
pub const TILE_BYTES: usize = 64;

/// The tiles, configured on this thread ([`Amx::tiles`]); not `Send`, since the
/// configuration is the thread's.
pub struct Tiles(PhantomData<*const ()>);

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a `Tiles` exists only after `ldtilecfg` ran on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// What a tile multiply takes from each 4-byte word of its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    /// Four bytes, unsigned in the rows and signed in the panels, summed exactly
    /// in i32 (`tdpbusd`).
    Bytes,
    /// Two bf16 numbers, their products summed in f32 (`tdpbf16ps`; subnormal
    /// inputs and outputs are taken as zero, and the 32 products of a step are
    /// added in an order of the hardware's own, not one at a time).
    Pairs,
}

/// One block of a product in tiles: up to 2 × 2 tiles of 16 × 16 sums.
pub struct TileBlock<const R: usize, const C: usize> {
    /// Row `i` of the first tile of rows: `R · 16` rows of 4-byte words,
    /// `stride` bytes apart, 64 bytes a step.
    pub rows: *const u8,
    /// Bytes between rows.
    pub stride: usize,
    /// The `C` panels: at each step 16 rows of 16 outputs' words (64 bytes),
    /// `panel_stride` bytes apart.
    pub panels: [*const u8; C],
    /// Bytes between a panel's rows: 64 where its steps are packed 1 KiB each.
    pub panel_stride: usize,
    /// Steps of 64 bytes.
    pub steps: usize,
}

/// The four arms of [`Tiles::step`] for one multiply instruction.
macro_rules! step_arms {
    ($op:literal, $r:expr, $c:expr, $a0:expr, $a1:expr, $p0:expr, $p1:expr, $sa:expr, $sb:expr) => {
        match ($r, $c) {
            (2, 2) => asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm6, [{p0} + {sb}*1]",
                concat!($op, " tmm0, tmm4, tmm6"),
                "tileloadd tmm7, [{p1} + {sb}*1]",
                concat!($op, " tmm1, tmm4, tmm7"),
                "tileloadd tmm5, [{a1} + {sa}*1]",
                concat!($op, " tmm2, tmm5, tmm6"),
                concat!($op, " tmm3, tmm5, tmm7"),
                a0 = in(reg) $a0, a1 = in(reg) $a1, p0 = in(reg) $p0, p1 = in(reg) $p1,
                sa = in(reg) $sa, sb = in(reg) $sb,
                options(nostack, readonly)
            ),
            (2, 1) => asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm6, [{p0} + {sb}*1]",
                concat!($op, " tmm0, tmm4, tmm6"),
                "tileloadd tmm5, [{a1} + {sa}*1]",
                concat!($op, " tmm2, tmm5, tmm6"),
                a0 = in(reg) $a0, a1 = in(reg) $a1, p0 = in(reg) $p0,
                sa = in(reg) $sa, sb = in(reg) $sb,
                options(nostack, readonly)
            ),
            (1, 2) => asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm6, [{p0} + {sb}*1]",
                concat!($op, " tmm0, tmm4, tmm6"),
                "tileloadd tmm7, [{p1} + {sb}*1]",
                concat!($op, " tmm1, tmm4, tmm7"),
                a0 = in(reg) $a0, p0 = in(reg) $p0, p1 = in(reg) $p1,
                sa = in(reg) $sa, sb = in(reg) $sb,
                options(nostack, readonly)
            ),
            _ => asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm6, [{p0} + {sb}*1]",
                concat!($op, " tmm0, tmm4, tmm6"),
                a0 = in(reg) $a0, p0 = in(reg) $p0,
                sa = in(reg) $sa, sb = in(reg) $sb,
                options(nostack, readonly)
            ),
        }
    };
}

impl Tiles {
    /// Sets the four tiles of sums to zero, to start a block.
    #[inline(always)]
    pub fn zero(&self) {
        // SAFETY: the tiles are configured (`self`).
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            )
        };
    }

    /// Step `s` of `block`'s sums: `sums[i][j] += Σ rows[i][b] · panel(j)[b]`
    /// over the step's 64 bytes `b`, as `product` reads them, for the `16·R`
    /// rows and `16·C` outputs of `block` (`R`, `C` ∈ {1, 2}). The instructions
    /// are only issued: vector work placed between steps runs while the tiles
    /// sum, where after the block it would wait for them (and they for it, since
    /// tiles are not renamed).
    ///
    /// # Safety
    /// The rows must be readable for `16·R` rows of `64 · steps` bytes `stride`
    /// apart, each panel for `16 · steps` rows of 64 bytes `panel_stride` apart,
    /// and `s < steps`.
    #[inline(always)]
    pub unsafe fn step<const R: usize, const C: usize>(
        &self,
        product: Product,
        block: &TileBlock<R, C>,
        s: usize,
    ) {
        const { assert!((R == 1 || R == 2) && (C == 1 || C == 2)) };
        let (sa, sb) = (block.stride, block.panel_stride);
        let a0 = block.rows.wrapping_add(s * TILE_BYTES);
        let a1 = a0.wrapping_add(TILE_ROWS * sa);
        let p0 = block.panels[0].wrapping_add(s * TILE_ROWS * sb);
        let p1 = block.panels[C - 1].wrapping_add(s * TILE_ROWS * sb);
        // SAFETY: the tiles are configured (`self`); the caller guarantees the
        // reads.
        unsafe {
            match product {
                Product::Bytes => step_arms!("tdpbusd", R, C, a0, a1, p0, p1, sa, sb),
                Product::Pairs => step_arms!("tdpbf16ps", R, C, a0, a1, p0, p1, sa, sb),
            }
        }
    }

    /// Stores the sums of a block of `16·R` rows and `16·C` outputs into `sums`
    /// (rows of 32; columns past `16·C` untouched): `i32` after
    /// [`Product::Bytes`], `f32` after [`Product::Pairs`].
    #[inline(always)]
    pub fn store<const R: usize, const C: usize, T: Copy>(&self, sums: &mut [[T; 32]; 32]) {
        const { assert!(std::mem::size_of::<T>() == 4) };
        // SAFETY: `sums` holds 32 rows of 128 bytes, `16·R ≤ 32` rows and
        // `16·C ≤ 32` columns.
        unsafe { self.store_rows::<R, C, T>(sums.as_mut_ptr().cast::<T>(), 32) };
    }

    /// Stores the sums of a block of `16·R` rows and `16·C` outputs at `out`, row
    /// `i` at `out + i·row_len`, as [`Tiles::store`] does.
    ///
    /// # Safety
    /// `out` must be writable for `16·R` rows of `16·C` values `row_len` apart.
    #[inline(always)]
    pub unsafe fn store_rows<const R: usize, const C: usize, T: Copy>(
        &self,
        out: *mut T,
        row_len: usize,
    ) {
        const { assert!(std::mem::size_of::<T>() == 4) };
        let ldc = row_len * std::mem::size_of::<T>();
        // SAFETY: the tiles are configured (`self`); the caller guarantees the
        // stores.
        unsafe {
            let (c01, c10) = (out.add(16), out.add(16 * row_len));
            let c11 = c10.add(16);
            asm!("tilestored [{c} + {s}*1], tmm0", c = in(reg) out, s = in(reg) ldc, options(nostack));
            if C == 2 {
                asm!("tilestored [{c} + {s}*1], tmm1", c = in(reg) c01, s = in(reg) ldc, options(nostack));
            }
            if R == 2 {
                asm!("tilestored [{c} + {s}*1], tmm2", c = in(reg) c10, s = in(reg) ldc, options(nostack));
            }
            if R == 2 && C == 2 {
                asm!("tilestored [{c} + {s}*1], tmm3", c = in(reg) c11, s = in(reg) ldc, options(nostack));
            }
        }
    }
}
