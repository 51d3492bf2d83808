//! Value parsers for the numeric flags: clap runs them while parsing, so a zero,
//! NaN, infinite or absurd value is refused with the flag named before any command
//! starts, and every command sees only values it can act on.

use attend::attention::Causal;
use attend::element::Dtype;
use attend::experiment::Named;
use attend::kernels::Isa;
use attend::limits::MAX_THREADS;
use clap::builder::{PossibleValuesParser, TypedValueParser};

/// The most timed runs or seconds a benchmark may be asked for: enough for any
/// measurement, and a bound on how long a typo can keep the machine busy.
const MAX_RUNS: usize = 1_000_000;
const MAX_SECONDS: f64 = 3600.0;

/// The most optimiser steps `attend train` takes (hours of training on this CPU).
pub const MAX_STEPS: usize = 10_000_000;

/// The most generator draws `--skip-draws` may consume: skipping is one draw at a
/// time (2.4 s for this many on a loaded AMD EPYC), and nothing in the notebooks skips more than
/// a few.
pub const MAX_SKIP_DRAWS: u64 = 1 << 30;

fn integer<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a non-negative integer in range"))
}

fn within<T: PartialOrd + std::fmt::Display>(n: T, min: T, max: T) -> Result<T, String> {
    if n < min || n > max {
        return Err(format!("must be between {min} and {max}, got {n}"));
    }
    Ok(n)
}

/// A size or count of at least 1.
pub fn positive(s: &str) -> Result<usize, String> {
    match integer(s)? {
        0 => Err("must be at least 1, got 0".into()),
        n => Ok(n),
    }
}

/// A worker-thread count, 1 to [`MAX_THREADS`].
pub fn threads(s: &str) -> Result<usize, String> {
    within(integer(s)?, 1, MAX_THREADS)
}

/// A number of timed runs, 1 to a million.
pub fn runs(s: &str) -> Result<usize, String> {
    within(integer(s)?, 1, MAX_RUNS)
}

/// A number of optimiser steps, 1 to [`MAX_STEPS`].
pub fn steps(s: &str) -> Result<usize, String> {
    within(integer(s)?, 1, MAX_STEPS)
}

/// A number of generator draws to skip, 0 to [`MAX_SKIP_DRAWS`].
pub fn skip_draws(s: &str) -> Result<u64, String> {
    within(integer(s)?, 0, MAX_SKIP_DRAWS)
}

/// A duration in seconds: finite, 0 to an hour.
pub fn seconds(s: &str) -> Result<f64, String> {
    let x: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(0.0..=MAX_SECONDS).contains(&x) {
        return Err(format!(
            "must be between 0 and {MAX_SECONDS} seconds, got {s}"
        ));
    }
    Ok(x)
}

/// A finite `f32` (a NaN or infinite scale silently poisons every score).
pub fn finite_f32(s: &str) -> Result<f32, String> {
    let x: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !x.is_finite() {
        return Err(format!("must be a finite number, got {s}"));
    }
    Ok(x)
}

/// A tensor element type: `f32` (`float32`) or `bf16` (`bfloat16`).
pub fn dtype(s: &str) -> Result<Dtype, String> {
    Dtype::from_name(s.trim()).map_err(|e| e.to_string())
}

/// An instruction set this CPU has (`--isa`), by its name.
pub fn isa(s: &str) -> Result<Isa, String> {
    let isa = Isa::from_name(s.trim()).map_err(|e| e.to_string())?;
    if !isa.is_available() {
        let has: Vec<&str> = Isa::available().iter().map(|i| i.name()).collect();
        return Err(format!(
            "--isa {s} is not available on this CPU (it has: {})",
            has.join(", ")
        ));
    }
    Ok(isa)
}

/// `--causal`: `top-left` (PyTorch's is_causal) or `bottom-right`.
pub fn causal(s: &str) -> Result<Causal, String> {
    match s.trim() {
        "top-left" => Ok(Causal::TopLeft),
        "bottom-right" => Ok(Causal::BottomRight),
        _ => Err(format!("must be top-left or bottom-right, got {s:?}")),
    }
}

/// `--window LEFT,RIGHT`: two non-negative integers.
pub fn window(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("must be two non-negative integers LEFT,RIGHT, got {s:?}");
    let (l, r) = s.split_once(',').ok_or_else(bad)?;
    let l = l.trim().parse::<usize>().map_err(|_| bad())?;
    let r = r.trim().parse::<usize>().map_err(|_| bad())?;
    Ok((l, r))
}

/// One of the names in the library's table for `T` (`--init`, `--qkv`,
/// `--softmax-dim`): `--help` lists them and an unknown name's error does.
pub fn named<T: Named + Clone + Send + Sync>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::ALL.iter().map(|v| v.name()))
        .map(|name| T::from_name(&name).expect("clap accepts only the names"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_issue_cases_are_refused() {
        assert!(runs("0").is_err());
        assert!(seconds("NaN").is_err());
        assert!(seconds("inf").is_err());
        assert!(seconds("-1").is_err());
        assert_eq!(seconds("0").unwrap(), 0.0);
        assert!(steps("18446744073709551615").is_err());
        assert!(steps("100000000000").is_err());
        assert!(skip_draws("1000000000000").is_err());
        assert_eq!(skip_draws("0").unwrap(), 0);
        assert!(threads("0").is_err());
        assert!(threads("1000000").is_err());
        assert!(positive("0").is_err());
        assert_eq!(
            positive("1000000000000000000").unwrap(),
            1_000_000_000_000_000_000
        );
        assert!(finite_f32("nan").is_err());
        assert!(finite_f32("1e39").is_err());
        assert_eq!(finite_f32("-0.5").unwrap(), -0.5);
        assert_eq!(dtype("bfloat16").unwrap(), Dtype::Bf16);
        assert!(dtype("f16").unwrap_err().contains("bf16"));
    }

    proptest! {
        // Any text at all gives a value within the bounds or an error; never a panic.
        #[test]
        fn every_parser_accepts_in_range_or_refuses(s in ".{0,24}|[-+0-9.eEinfNa]{0,24}") {
            if let Ok(n) = positive(&s) { prop_assert!(n >= 1); }
            if let Ok(n) = threads(&s) { prop_assert!((1..=MAX_THREADS).contains(&n)); }
            if let Ok(n) = runs(&s) { prop_assert!((1..=MAX_RUNS).contains(&n)); }
            if let Ok(n) = steps(&s) { prop_assert!((1..=MAX_STEPS).contains(&n)); }
            if let Ok(n) = skip_draws(&s) { prop_assert!(n <= MAX_SKIP_DRAWS); }
            if let Ok(x) = seconds(&s) { prop_assert!((0.0..=MAX_SECONDS).contains(&x)); }
            if let Ok(x) = finite_f32(&s) { prop_assert!(x.is_finite()); }
        }

        #[test]
        fn every_integer_is_judged_by_its_bounds(n in any::<u64>()) {
            let s = n.to_string();
            prop_assert_eq!(threads(&s).is_ok(), (1..=MAX_THREADS as u64).contains(&n));
            prop_assert_eq!(steps(&s).is_ok(), (1..=MAX_STEPS as u64).contains(&n));
            prop_assert_eq!(skip_draws(&s).is_ok(), n <= MAX_SKIP_DRAWS);
        }
    }
}
