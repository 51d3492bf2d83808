//! Numeric arrays given as JSON on the command line (`--input`, `--wq`, ...).

use attend::Error;
use ndarray::{ArrayD, IxDyn};
use serde_json::Value;

/// Parses a rectangular JSON array of finite numbers of rank 1 to 3 for `flag`.
pub fn parse_array(flag: &str, text: &str) -> Result<ArrayD<f32>, Error> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        if ["NaN", "Infinity"].iter().any(|w| text.contains(w)) {
            Error::value(format!(
                "{flag} holds NaN or Infinity: every value must be a finite number"
            ))
        } else {
            Error::format(format!("{flag} is not valid JSON: {e}"))
        }
    })?;
    let shape = shape_of(flag, &value)?;
    let mut data = Vec::new();
    flatten(flag, &value, &shape, 0, &mut data, &mut Vec::new())?;
    ArrayD::from_shape_vec(IxDyn(&shape), data).map_err(|e| Error::shape(format!("{flag}: {e}")))
}

/// The shape implied by the first element at every depth.
fn shape_of(flag: &str, value: &Value) -> Result<Vec<usize>, Error> {
    let mut shape = Vec::new();
    let mut v = value;
    while let Value::Array(items) = v {
        shape.push(items.len());
        match items.first() {
            Some(first) => v = first,
            None => break,
        }
    }
    if shape.is_empty() {
        return Err(Error::format(format!(
            "{flag} must be a JSON array, got {value}"
        )));
    }
    if shape.contains(&0) {
        return Err(Error::value(format!("{flag} is empty: shape {shape:?}")));
    }
    Ok(shape)
}

fn flatten(
    flag: &str,
    value: &Value,
    shape: &[usize],
    depth: usize,
    out: &mut Vec<f32>,
    at: &mut Vec<usize>,
) -> Result<(), Error> {
    match (value, shape.get(depth)) {
        (Value::Array(items), Some(&len)) => {
            if items.len() != len {
                return Err(Error::shape(format!(
                    "{flag} is ragged: element {at:?} has {} entries where {len} were expected (shape {shape:?})",
                    items.len()
                )));
            }
            for (i, item) in items.iter().enumerate() {
                at.push(i);
                flatten(flag, item, shape, depth + 1, out, at)?;
                at.pop();
            }
            Ok(())
        }
        (Value::Number(n), None) => {
            let x = n.as_f64().unwrap_or(f64::NAN) as f32;
            if !x.is_finite() {
                return Err(Error::value(format!(
                    "{flag}{at:?} = {n} is not a finite float32 value"
                )));
            }
            out.push(x);
            Ok(())
        }
        (other, _) => Err(Error::shape(format!(
            "{flag} is ragged or not numeric at {at:?}: found {other} (shape {shape:?})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A JSON array with pieces spliced in where they break rank, raggedness,
    /// number ranges or syntax.
    fn mutated_array() -> impl Strategy<Value = String> {
        let base = "[[1.5, -2, 3e2], [0, 4, 5]]";
        let pieces = prop::sample::select(vec![
            "[",
            "]",
            ",",
            "1e39",
            "-1e39",
            "NaN",
            "Infinity",
            "\"a\"",
            "null",
            "[]",
            "{}",
            "18446744073709551616",
            "1e-50",
            "true",
        ]);
        prop::collection::vec((0..base.len(), pieces), 0..5).prop_map(move |edits| {
            let mut s = base.to_string();
            for (at, piece) in edits {
                s.insert_str(at.min(s.len()), piece);
            }
            s
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5_000, ..ProptestConfig::default() })]

        // A value is a non-empty rectangular array of finite numbers of rank 1
        // to 3; anything else is a one-line error naming the flag.
        #[test]
        fn arrays_are_finite_and_rectangular_or_refused(
            text in prop_oneof![mutated_array(), ".{0,40}"]
        ) {
            match parse_array("--input", &text) {
                Ok(a) => {
                    prop_assert!(!a.is_empty() && a.iter().all(|x| x.is_finite()));
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(msg.starts_with("--input") && !msg.contains('\n'), "{}", msg);
                }
            }
        }
    }
}
