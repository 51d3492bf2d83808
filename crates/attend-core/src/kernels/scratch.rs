//! Per-thread scratch memory for the kernels (docs/design.md, "Scratch and
//! threads").
//!
//! Every kernel states how many floats of scratch one unit of its work needs (its
//! `scratch_len`) and carves its buffers out of one slice that [`with_scratch`]
//! lends it. The slice comes from a buffer kept per thread and grown to the largest
//! size asked for, so the hot loops allocate nothing after a thread's first unit.

use std::cell::RefCell;

thread_local! {
    static BUFFER: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Floats in a 64-byte cache line.
const LINE: usize = 16;

/// Runs `f` with this thread's scratch, `len` floats of unspecified contents,
/// starting on a cache line (a buffer that starts mid-line splits every other
/// vector load over two lines, which measured up to 25 % on the fused forward).
///
/// Re-entrant: a nested call (which no kernel makes) gets a fresh buffer.
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    // Taken out while in use, so the borrow is not held across `f`.
    let mut buf = BUFFER.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    if buf.len() < len + LINE {
        buf.resize(len + LINE, 0.0);
    }
    let skip = buf.as_ptr().align_offset(LINE * 4).min(LINE);
    let out = f(&mut buf[skip..skip + len]);
    BUFFER.with(|cell| {
        let mut kept = cell.borrow_mut();
        if kept.len() < buf.len() {
            *kept = buf;
        }
    });
    out
}

/// The next `n` floats of `rest`, which keeps what follows.
///
/// # Panics
/// If `rest` is shorter than `n`: the kernel's `scratch_len` undercounted.
pub(crate) fn carve<'a>(rest: &mut &'a mut [f32], n: usize) -> &'a mut [f32] {
    let (head, tail) = std::mem::take(rest).split_at_mut(n);
    *rest = tail;
    head
}
