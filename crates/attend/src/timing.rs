//! The benchmarks' one timing rule, shared by `attend bench`, the examples that time
//! the encoders, and (as `scripts/bench/py/timing.py`) every Python side they are
//! compared with: a warm-up call, then at least `min_runs` calls and `min_time`
//! seconds, and the median, which one slow call (another tenant, a page fault) does
//! not move.
//!
//! ```
//! let mut calls = 0;
//! let seconds = attend::timing::median_seconds(3, 0.0, || {
//!     calls += 1;
//!     Ok::<(), ()>(())
//! })?;
//! assert_eq!(calls, 4); // the warm-up and three timed calls
//! assert!(seconds >= 0.0);
//! assert_eq!(attend::timing::median([3.0, 1.0, 2.0, 10.0]), 2.5);
//! # Ok::<(), ()>(())
//! ```

use std::time::Instant;

/// The median of `xs`: the middle value, or the mean of the middle two for an even
/// count; NaN for none.
pub fn median(xs: impl IntoIterator<Item = f64>) -> f64 {
    let mut xs: Vec<f64> = xs.into_iter().collect();
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => xs[n / 2],
        _ => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// Seconds per call of `step`: one warm-up call (which also surfaces a bad input
/// before any timing), then calls until there have been at least `min_runs` and
/// `min_time` seconds have passed; the median. The first error stops the timing and
/// is returned.
pub fn median_seconds<E>(
    min_runs: usize,
    min_time: f64,
    mut step: impl FnMut() -> Result<(), E>,
) -> Result<f64, E> {
    step()?;
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < min_runs || start.elapsed().as_secs_f64() < min_time {
        let t = Instant::now();
        step()?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(median(times))
}
