//! What both APIs share: the forms of `input`/`inputs`, the service's failures
//! as [`Problem`]s, and `dimensions` (Matryoshka truncation).

use ndarray::{s, Array2};
use serde::Deserialize;

use super::errors::Problem;
use crate::prepare::Input;
use crate::queue::Refusal;
use crate::service::Failed;

/// A request's inputs: a text, texts, token ids, or lists of token ids.
#[derive(Clone, Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a string, a list of strings, a list of token ids, or a list of lists of token ids"
)]
pub enum Inputs {
    /// One text.
    One(String),
    /// Texts.
    Many(Vec<String>),
    /// One text's token ids.
    Ids(Vec<u32>),
    /// Several texts' token ids.
    ManyIds(Vec<Vec<u32>>),
}

impl Inputs {
    /// One [`Input`] per text.
    pub fn into_inputs(self) -> Vec<Input> {
        match self {
            Inputs::One(t) => vec![Input::Text(t)],
            Inputs::Many(ts) => ts.into_iter().map(Input::Text).collect(),
            Inputs::Ids(ids) => vec![Input::Ids(ids)],
            Inputs::ManyIds(all) => all.into_iter().map(Input::Ids).collect(),
        }
    }
}

impl From<Failed> for Problem {
    fn from(f: Failed) -> Self {
        match f {
            Failed::Invalid(i) => Problem::Invalid(i),
            Failed::Refused(Refusal::Overloaded { queued, limit }) => {
                Problem::Overloaded { queued, limit }
            }
            Failed::Refused(Refusal::Closed) => Problem::Unavailable("shutting down"),
            Failed::Timeout(secs) => Problem::Timeout(secs),
            Failed::Engine(e) => Problem::Engine(e),
        }
    }
}

/// Checks `dimensions` against the model's width.
pub fn check_dimensions(dimensions: Option<usize>, width: usize) -> Result<(), Problem> {
    match dimensions {
        Some(k) if k == 0 || k > width => Err(Problem::Parameter {
            param: "dimensions",
            message: format!(
                "{k} is out of range: the model's vectors have 1 to {width} dimensions"
            ),
        }),
        _ => Ok(()),
    }
}

/// Each row's first `dimensions` values (all when `None`), L2-normalised if
/// `normalize` (as `torch.nn.functional.normalize`: by `max(‖x‖, 1e-12)`).
pub fn finish_rows(
    rows: Vec<Array2<f32>>,
    dimensions: Option<usize>,
    normalize: bool,
) -> Vec<Vec<f32>> {
    rows.into_iter()
        .map(|row| {
            let k = dimensions.unwrap_or(row.ncols()).min(row.ncols());
            let mut v: Vec<f32> = row.slice(s![0, ..k]).to_vec();
            if normalize {
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                v.iter_mut().for_each(|x| *x /= norm);
            }
            v
        })
        .collect()
}
