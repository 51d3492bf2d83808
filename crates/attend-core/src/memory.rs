//! Where the encoder's large buffers get their memory: the allocator's treatment
//! of short-lived activations ([`keep_freed_memory`]), huge pages for the packed
//! weights ([`LargePageArray`]) and for the largest outputs
//! (`advise_large_pages`).
//!
//! A forward pass allocates each layer's activations afresh (megabytes each for a
//! batch of sentences) and frees them a layer later. glibc's allocator serves
//! blocks from 128 KiB up with `mmap` until it has seen one freed, and gives
//! memory at the top of its heaps back to the system, so the same pages are
//! faulted in and cleared again layer after layer, in the kernel, while the
//! kernels wait. [`keep_freed_memory`] tells glibc to keep freed memory for reuse
//! instead, as ONNX Runtime's and OpenVINO's own arenas do.

use std::mem::MaybeUninit;

/// Keeps freed memory in the process for reuse: blocks up to 32 MiB come from
/// the allocator's heaps rather than fresh mappings, and the heaps are not
/// trimmed until 1 GiB of them lies free. The resident memory then stays at its
/// high-water mark between batches rather than rising and falling with each
/// layer; the high-water mark itself does not change.
///
/// The `attend` command and the Python package's `SentenceEncoder` call this
/// once; a Rust program that runs the encoders calls it at start-up (or uses a
/// caching allocator such as mimalloc or jemalloc). It sets process-wide
/// allocator options, so it is for programs, not for libraries built on attend.
/// A no-op where the C library is not glibc.
///
/// ```
/// attend_core::memory::keep_freed_memory();
/// ```
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // 32 MiB is the largest threshold glibc takes for the heaps of threads
        // other than the main one (where the thread pool's workers allocate).
        const MMAP_THRESHOLD: libc::c_int = 32 << 20;
        const TRIM_THRESHOLD: libc::c_int = 1 << 30;
        // SAFETY: mallopt only sets two of the allocator's tuning parameters; it
        // is safe to call at any time, from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}

/// An x86-64 large page: 2 MiB.
const LARGE_PAGE: usize = 2 << 20;

/// Buffers from this size up are fresh mappings in glibc's allocator whatever
/// [`keep_freed_memory`] asks (32 MiB is the largest threshold its heaps take):
/// every such buffer is faulted in and cleared anew.
const FRESH_MAPPING: usize = 32 << 20;

/// Asks Linux for transparent huge pages under `buf` (its whole 2 MiB stretches)
/// before anything is written to it, where `buf` is at least [`FRESH_MAPPING`]
/// bytes: a buffer the allocator mapped afresh, whose first writes otherwise take
/// one page fault and one 4 KiB clear per page. A product's 50 MB output (4,096
/// rows of mpnet's feed-forward) took 12,800 faults a call, and the kernel's
/// share of the int8 product's time was near half (`perf`, examples/dense_bench);
/// with huge pages it is 25 faults. Only advice: the contents and the
/// allocator's ownership do not change, and smaller buffers (reused from the
/// allocator's heaps) are left alone.
#[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
pub(crate) fn advise_large_pages<T>(buf: &mut [MaybeUninit<T>]) {
    #[cfg(target_os = "linux")]
    if std::mem::size_of_val(buf) >= FRESH_MAPPING {
        let start = (buf.as_ptr() as usize).next_multiple_of(LARGE_PAGE);
        let end = (buf.as_ptr() as usize + std::mem::size_of_val(buf)) / LARGE_PAGE * LARGE_PAGE;
        if end > start {
            // SAFETY: the stretch lies inside `buf`, which this caller owns; the
            // advice changes no contents (it fails harmlessly where the kernel has
            // huge pages switched off).
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
}

/// A fixed-length array for data that lives as long as a model and is read again
/// and again as one sequential stream: the packed weights. From 2 MiB up it is
/// its own mapping, starting on a 2 MiB boundary, and asks Linux for transparent
/// huge pages (`MADV_HUGEPAGE`, which the default `madvise` setting honours), so
/// that a stream through it crosses no 4 KiB page boundary, where the hardware
/// prefetcher stops, and needs a 512th of the TLB entries. One short sentence
/// through an encoder is bound by that stream (the commit that made this gives
/// the A/B). Smaller arrays, and other systems, use the ordinary allocator.
///
/// Public for benchmarks that compare a stream with the weights' own (the
/// `stream_bench` example's reference read):
///
/// ```
/// let ramp = attend_core::memory::LargePageArray::from_fn(1 << 20, |i| i as f32);
/// assert_eq!(ramp[1000], 1000.0);
/// ```
pub struct LargePageArray<T: Copy> {
    ptr: std::ptr::NonNull<T>,
    len: usize,
}

// SAFETY: the array owns its elements as a `Box<[T]>` would.
unsafe impl<T: Copy + Send> Send for LargePageArray<T> {}
// SAFETY: shared references only read.
unsafe impl<T: Copy + Sync> Sync for LargePageArray<T> {}

impl<T: Copy> LargePageArray<T> {
    /// An array of `len` elements, written by `fill` before anything reads them.
    ///
    /// # Safety
    /// `fill` must write every element of the slice it is given (it may panic, in
    /// which case the memory is freed and nothing is read).
    pub(crate) unsafe fn filled(len: usize, fill: impl FnOnce(&mut [MaybeUninit<T>])) -> Self {
        let bytes = Self::bytes(len);
        let ptr = if bytes == 0 {
            std::ptr::NonNull::dangling()
        } else {
            std::ptr::NonNull::new(allocate(bytes).cast::<T>())
                .unwrap_or_else(|| std::alloc::handle_alloc_error(heap_layout(bytes)))
        };
        let array = LargePageArray { ptr, len };
        // SAFETY: `ptr` holds `len` elements (or is dangling for none), uniquely
        // owned by `array`; `MaybeUninit` makes no claim about their contents.
        let slots = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr().cast(), len) };
        fill(slots);
        array
    }

    /// An array of `len` elements, element `i` being `f(i)`.
    pub fn from_fn(len: usize, f: impl Fn(usize) -> T) -> Self {
        // SAFETY: the loop writes every slot.
        unsafe {
            Self::filled(len, |slots| {
                for (i, slot) in slots.iter_mut().enumerate() {
                    slot.write(f(i));
                }
            })
        }
    }

    fn bytes(len: usize) -> usize {
        len.checked_mul(std::mem::size_of::<T>())
            .expect("an array's size fits the address space")
    }
}

impl<T: Copy> Drop for LargePageArray<T> {
    fn drop(&mut self) {
        let bytes = Self::bytes(self.len);
        if bytes > 0 {
            // SAFETY: `allocate(bytes)` returned this pointer and nothing else
            // frees it.
            unsafe { release(self.ptr.as_ptr().cast(), bytes) }
        }
    }
}

impl<T: Copy> std::ops::Deref for LargePageArray<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `filled` wrote all `len` elements.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

/// The ordinary allocator's layout for `bytes`: cache-line aligned.
fn heap_layout(bytes: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(bytes, 64).expect("an array's size fits the address space")
}

/// `bytes` (more than 0) of fresh memory, or null: from 2 MiB up on Linux a
/// mapping of its own, aligned to [`LARGE_PAGE`] and advised to use huge pages.
fn allocate(bytes: usize) -> *mut u8 {
    #[cfg(target_os = "linux")]
    if bytes >= LARGE_PAGE {
        return map_large_pages(bytes);
    }
    // SAFETY: the layout's size is not zero.
    unsafe { std::alloc::alloc(heap_layout(bytes)) }
}

/// Frees what [`allocate`] returned for `bytes`.
///
/// # Safety
/// `ptr` must come from `allocate(bytes)` and not be used afterwards.
unsafe fn release(ptr: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    if bytes >= LARGE_PAGE {
        // SAFETY: `map_large_pages` mapped exactly these pages for this array.
        unsafe { libc::munmap(ptr.cast(), bytes.next_multiple_of(page_size())) };
        return;
    }
    // SAFETY: the caller's guarantee; same layout as the allocation.
    unsafe { std::alloc::dealloc(ptr, heap_layout(bytes)) }
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// A fresh anonymous mapping of `bytes` (rounded up to whole pages) starting on a
/// 2 MiB boundary, with its whole 2 MiB stretches advised to use huge pages; null
/// if the system has no memory for it.
#[cfg(target_os = "linux")]
fn map_large_pages(bytes: usize) -> *mut u8 {
    let len = bytes.next_multiple_of(page_size());
    // Map a large page more than needed, then unmap what lies before the first
    // 2 MiB boundary and after the array.
    let span = len + LARGE_PAGE;
    // SAFETY: a private anonymous mapping touches no existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let base = raw as usize;
    let start = base.next_multiple_of(LARGE_PAGE);
    // SAFETY: both stretches lie inside the mapping just made and hold nothing;
    // the advice only asks for huge pages (it fails harmlessly where the kernel
    // has them switched off).
    unsafe {
        if start > base {
            libc::munmap(raw, start - base);
        }
        let end = start + len;
        if base + span > end {
            libc::munmap(end as *mut libc::c_void, base + span - end);
        }
        libc::madvise(
            start as *mut libc::c_void,
            len - len % LARGE_PAGE,
            libc::MADV_HUGEPAGE,
        );
    }
    start as *mut u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An array of `len` numbers `0, 1, 2, …`.
    fn counting(len: usize) -> LargePageArray<u32> {
        LargePageArray::from_fn(len, |i| i as u32)
    }

    #[test]
    fn holds_what_was_written_at_every_size() {
        // Empty, on the heap, exactly one large page, and a partial one after it.
        for len in [0, 1, 1000, LARGE_PAGE / 4, LARGE_PAGE / 4 + 1001] {
            let array = counting(len);
            assert_eq!(array.len(), len);
            assert!(
                array.iter().enumerate().all(|(i, &v)| v == i as u32),
                "len {len}"
            );
        }
    }

    #[test]
    fn large_arrays_start_on_a_large_page() {
        let array = counting(3 * LARGE_PAGE / 4);
        let start = array.as_ptr() as usize;
        if cfg!(target_os = "linux") {
            assert_eq!(start % LARGE_PAGE, 0);
        }
        assert_eq!(start % 64, 0);
    }

    /// The `VmFlags` of the mapping holding address `at`, from /proc/self/smaps.
    #[cfg(target_os = "linux")]
    fn flags_at(at: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            if let Some((lo, hi)) = range.filter(|_| !line.starts_with("VmFlags")) {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = (lo..hi).contains(&at);
                    continue;
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.split_whitespace().map(str::to_owned).collect();
                }
            }
        }
        panic!("no mapping holds {at:#x}")
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn only_buffers_of_fresh_mappings_are_advised_to_use_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            return;
        }
        // One buffer above the allocator's largest heap block, one below it.
        for (len, advised) in [(FRESH_MAPPING / 4 + 1000, true), (LARGE_PAGE, false)] {
            let mut buf: Vec<MaybeUninit<f32>> = Vec::with_capacity(len);
            // SAFETY: `MaybeUninit` needs no initialisation.
            unsafe { buf.set_len(len) };
            advise_large_pages(&mut buf);
            let inner = (buf.as_ptr() as usize).next_multiple_of(LARGE_PAGE);
            let flags = flags_at(inner);
            // `hg`: the kernel's mark of MADV_HUGEPAGE on the mapping.
            assert_eq!(
                flags.iter().any(|f| f == "hg"),
                advised,
                "{len} floats: {flags:?}"
            );
        }
    }

    #[test]
    fn a_panicking_fill_frees_its_memory_and_returns_nothing() {
        let result = std::panic::catch_unwind(|| {
            // SAFETY: the fill panics before anything could read the slots.
            unsafe { LargePageArray::<f32>::filled(LARGE_PAGE, |_| panic!("fill failed")) }
        });
        assert!(result.is_err());
    }
}
