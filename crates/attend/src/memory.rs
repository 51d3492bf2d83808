//! How the process's allocator treats the encoder's large, short-lived buffers.
//!
//! A forward pass allocates each layer's activations afresh (megabytes each for a
//! batch of sentences) and frees them a layer later. glibc's allocator serves
//! blocks from 128 KiB up with `mmap` until it has seen one freed, and gives
//! memory at the top of its heaps back to the system, so the same pages are
//! faulted in and cleared again layer after layer, in the kernel, while the
//! kernels wait. [`keep_freed_memory`] tells glibc to keep freed memory for reuse
//! instead, as ONNX Runtime's and OpenVINO's own arenas do.

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
/// attend::memory::keep_freed_memory();
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
