//! Limits on what a caller may ask for, in one place.
//!
//! Sizes that come from flags and files are multiplied with checked arithmetic and
//! compared with the memory the process can still get *before* anything is
//! allocated, so an absurd size is a one-line [`Error`] naming what asked for it and
//! the bytes it would take, never an abort, a wrapped count or a machine brought to
//! its knees. Thread counts are bounded too: each thread costs a stack.

use crate::{Error, Result};

/// The most worker threads a caller may ask for. Far above any CPU this crate runs
/// on, far below the point where thread stacks alone exhaust an address space.
pub const MAX_THREADS: usize = 1024;

/// The product of `dims`, or an error naming `what` when it overflows `usize`.
pub fn elements(what: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            Error::value(format!(
                "{what}: shape {dims:?} has more elements than any memory holds"
            ))
        })
}

/// Bytes of a `dims`-shaped array of `elem_bytes`-byte values (saturating: a count
/// too large for `u128` is refused by [`check_memory`] all the same).
pub fn array_bytes(dims: &[usize], elem_bytes: usize) -> u128 {
    dims.iter()
        .try_fold(elem_bytes as u128, |n, &d| n.checked_mul(d as u128))
        .unwrap_or(u128::MAX)
}

/// Refuses `bytes` (the memory an operation needs, as counted by its caller) when
/// the process cannot get that much: more than the machine's available memory or
/// the address space left under `ulimit -v`. `what` names the flag or file.
pub fn check_memory(what: &str, bytes: u128) -> Result<()> {
    let available = available_memory();
    if bytes > available as u128 {
        return Err(Error::value(format!(
            "{what} would need {} of memory, more than the {} available",
            human(bytes),
            human(available as u128)
        )));
    }
    Ok(())
}

/// The thread count `n` given for `what`, refused when it is 0 or above
/// [`MAX_THREADS`].
pub fn threads(what: &str, n: usize) -> Result<usize> {
    if n == 0 || n > MAX_THREADS {
        return Err(Error::value(format!(
            "{what} must be between 1 and {MAX_THREADS}, got {n}"
        )));
    }
    Ok(n)
}

/// Bytes the process can still allocate: the smaller of the machine's available
/// memory and what remains of the address-space limit. Where the system does not
/// say (not Linux), `u64::MAX`: the allocator then has the last word.
pub fn available_memory() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let machine = meminfo
        .as_deref()
        .and_then(|m| kib_field(m, "MemAvailable:"))
        .unwrap_or(u64::MAX);
    let limits = std::fs::read_to_string("/proc/self/limits").ok();
    let address_space = limits.as_deref().and_then(address_space_limit);
    let left = match address_space {
        Some(limit) => {
            let status = std::fs::read_to_string("/proc/self/status").ok();
            let used = status
                .as_deref()
                .and_then(|s| kib_field(s, "VmSize:"))
                .unwrap_or(0);
            limit.saturating_sub(used)
        }
        None => u64::MAX,
    };
    machine.min(left)
}

/// The peak resident set size of this process so far, in bytes (Linux's `VmHWM`),
/// if the system reports it.
pub fn peak_rss() -> Option<u64> {
    kib_field(
        &std::fs::read_to_string("/proc/self/status").ok()?,
        "VmHWM:",
    )
}

/// A `Name:   1234 kB` field of `/proc/meminfo` or `/proc/self/status`, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The soft "Max address space" of `/proc/self/limits` in bytes, `None` when
/// unlimited.
fn address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `1234567890` → `"1.15 GiB"`.
pub fn human(bytes: u128) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut x = bytes as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{x:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_overflow_into_errors_not_wraps() {
        assert_eq!(elements("x", &[3, 4]).unwrap(), 12);
        assert_eq!(elements("x", &[0, usize::MAX, usize::MAX]).unwrap(), 0);
        let err = elements("--vocab-size", &[1 << 32, 1 << 32]).unwrap_err();
        assert!(err.to_string().starts_with("--vocab-size: shape"), "{err}");
        assert_eq!(array_bytes(&[2, 3], 4), 24);
        assert_eq!(array_bytes(&[usize::MAX, usize::MAX, 16], 8), u128::MAX);
    }

    #[test]
    fn memory_beyond_the_machine_is_refused_with_the_bytes() {
        assert!(check_memory("--seq", 1024).is_ok());
        let err = check_memory("--seq", 1 << 70).unwrap_err().to_string();
        assert!(err.contains("--seq would need 1024.00 EiB"), "{err}");
    }

    #[test]
    fn thread_counts_are_bounded() {
        assert_eq!(threads("--threads", 4).unwrap(), 4);
        assert!(threads("--threads", 0).is_err());
        assert!(threads("--threads", MAX_THREADS + 1).is_err());
    }

    #[test]
    fn proc_fields_parse() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax address space         4096000000           unlimited            bytes\n";
        assert_eq!(address_space_limit(limits), Some(4_096_000_000));
        let unlimited =
            "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_limit(unlimited), None);
        assert_eq!(kib_field("VmHWM:\t  2048 kB\n", "VmHWM:"), Some(2 << 20));
        assert_eq!(human(3 << 30), "3.00 GiB");
        assert_eq!(human(12), "12 bytes");
    }
}
