//! `explain`: a notebook experiment, or one head of a real model, step by step.
//!
//! The keyword arguments are `attend explain`'s flags; the steps, their text and
//! the pictures come from the library (`attend::walkthrough`, `attend::viz`), so
//! Python shows exactly what the command line prints.

use std::path::PathBuf;

use attend::attention::SoftmaxAxis;
use attend::experiment::{self, Experiment, Input, Weights, TORCH_DEFAULT_SEED};
use attend::models::SentenceEncoder;
use attend::nn::initialisers::{AttentionSpec, QkvLayout, WeightInit};
use attend::viz::{html_view, render_svg, AttentionMaps, ColorMode};
use attend::walkthrough::{self, Step};
use attend::Error;
use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArray2, PyReadonlyArrayDyn};
use pyo3::prelude::*;

use crate::pool;

/// Everything an `explain` call computed: the steps, their text and the pictures.
#[pyclass(module = "attend._attend", frozen)]
pub struct Walkthrough {
    steps: Vec<Step>,
    text: String,
    /// The walkthrough page, made with the steps (it is what Jupyter shows).
    page: String,
    maps: AttentionMaps,
    layer: usize,
}

#[pymethods]
impl Walkthrough {
    /// `[(key, title, array)]` in walkthrough order.
    fn steps<'py>(
        &self,
        py: Python<'py>,
    ) -> Vec<(&'static str, String, Bound<'py, PyArrayDyn<f32>>)> {
        self.steps
            .iter()
            .map(|s| (s.key, s.title.clone(), s.value.clone().into_pyarray(py)))
            .collect()
    }

    /// The walkthrough and the heatmaps as plain text (what `attend explain` prints
    /// when its output is not a terminal).
    #[getter]
    fn text(&self) -> &str {
        &self.text
    }

    /// The tokens (or positions) labelling the weights' rows and columns.
    #[getter]
    fn tokens(&self) -> Vec<String> {
        self.maps.query_tokens.clone()
    }

    /// The heatmaps of the walked-through layer as one SVG picture.
    fn svg(&self) -> PyResult<String> {
        render_svg(&self.maps, self.layer).map_err(crate::errors::to_py)
    }

    /// The self-contained HTML attention view (head view, model view, heatmaps).
    fn html(&self) -> PyResult<String> {
        html_view(&self.maps).map_err(crate::errors::to_py)
    }

    /// The walkthrough as one self-contained HTML page, every number linked to the
    /// numbers it is made of (what `attend explain --html` writes).
    fn page(&self) -> &str {
        &self.page
    }
}

/// The value named `name` among `choices`, for the arguments that the command line
/// takes as `ValueEnum`s (same spellings).
fn choose<T: Copy>(arg: &str, name: &str, choices: &[(&str, T)]) -> attend::Result<T> {
    choices
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            Error::value(format!(
                "{arg} must be one of {}, got {name:?}",
                names.join(", ")
            ))
        })
}

const INITS: [(&str, WeightInit); 4] = [
    ("linear", WeightInit::Linear),
    ("uniform-in-out", WeightInit::UniformInOut),
    ("uniform-out-in", WeightInit::UniformOutIn),
    ("torch-mha", WeightInit::TorchMha),
];

const LAYOUTS: [(&str, QkvLayout); 4] = [
    ("separate", QkvLayout::Separate),
    ("fused", QkvLayout::Fused),
    ("fused-interleaved", QkvLayout::FusedInterleaved),
    ("per-head", QkvLayout::PerHead),
];

const AXES: [(&str, SoftmaxAxis); 2] = [
    ("keys", SoftmaxAxis::Keys),
    ("queries", SoftmaxAxis::Queries),
];

/// The source of `x`, from exactly one of `input`, `sentence` and `tokens`.
fn input(
    array: Option<PyReadonlyArrayDyn<'_, f32>>,
    sentence: Option<String>,
    tokens: Option<PyReadonlyArray2<'_, i64>>,
    vocab_size: Option<usize>,
    embed_dim: Option<usize>,
    padding_idx: Option<i64>,
) -> attend::Result<Input> {
    let need_dim = || {
        embed_dim
            .filter(|&d| d > 0)
            .ok_or_else(|| Error::value("embed_dim (at least 1) is needed with sentence or tokens"))
    };
    match (array, sentence, tokens) {
        (Some(a), None, None) => {
            let a = a.as_array();
            let x = match a.ndim() {
                2 => a.insert_axis(ndarray::Axis(0)).to_owned(),
                3 => a.to_owned(),
                _ => {
                    return Err(Error::shape(format!(
                        "input must be [T, d_in] or [B, T, d_in], got shape {:?}",
                        a.shape()
                    )))
                }
            };
            let x = x.into_dimensionality().expect("rank 3 by construction");
            Ok(Input::Array(x))
        }
        (None, Some(text), None) => Ok(Input::Sentence {
            text,
            embed_dim: need_dim()?,
        }),
        (None, None, Some(ids)) => {
            let vocab_size = vocab_size.ok_or_else(|| Error::value("tokens needs vocab_size"))?;
            let ids = ids.as_array();
            if let Some(&bad) = ids
                .iter()
                .find(|&&id| id < 0 || id as u64 >= vocab_size as u64)
            {
                return Err(Error::value(format!(
                    "tokens: id {bad} is out of range for vocab_size {vocab_size}"
                )));
            }
            Ok(Input::Tokens {
                ids: ids.mapv(|id| id as usize),
                vocab_size,
                embed_dim: need_dim()?,
                padding_idx,
            })
        }
        (None, None, None) => Err(Error::value(
            "no input: give one of input, sentence, tokens, or model with text",
        )),
        _ => Err(Error::value("give only one of input, sentence and tokens")),
    }
}

fn given(
    name: &str,
    w: PyReadonlyArray2<'_, f32>,
    input: &Input,
) -> attend::Result<ndarray::Array2<f32>> {
    let w = w.as_array().to_owned();
    experiment::check_given_weight(name, &w, input)?;
    Ok(w)
}

/// A notebook experiment (see `attend explain --help`; the arguments are its flags).
#[pyfunction]
#[pyo3(signature = (*, input=None, sentence=None, tokens=None, vocab_size=None, embed_dim=None,
    padding_idx=None, seed=None, reseed=None, skip_draws=0, init="linear", wq=None, wk=None,
    wv=None, d_out=None, d_k=None, d_v=None, heads=1, qkv="separate", bias=false,
    out_proj=false, causal=false, window=None, mask_padding=false, softmax_dim="keys", scale=None))]
#[allow(clippy::too_many_arguments)]
pub fn explain_experiment(
    py: Python<'_>,
    input: Option<PyReadonlyArrayDyn<'_, f32>>,
    sentence: Option<String>,
    tokens: Option<PyReadonlyArray2<'_, i64>>,
    vocab_size: Option<usize>,
    embed_dim: Option<usize>,
    padding_idx: Option<i64>,
    seed: Option<u64>,
    reseed: Option<u64>,
    skip_draws: u64,
    init: &str,
    wq: Option<PyReadonlyArray2<'_, f32>>,
    wk: Option<PyReadonlyArray2<'_, f32>>,
    wv: Option<PyReadonlyArray2<'_, f32>>,
    d_out: Option<usize>,
    d_k: Option<usize>,
    d_v: Option<usize>,
    heads: usize,
    qkv: &str,
    bias: bool,
    out_proj: bool,
    causal: bool,
    window: Option<(usize, usize)>,
    mask_padding: bool,
    softmax_dim: &str,
    scale: Option<f32>,
) -> PyResult<Walkthrough> {
    let err = crate::errors::to_py;
    let input =
        self::input(input, sentence, tokens, vocab_size, embed_dim, padding_idx).map_err(err)?;
    let d_in = input.width();
    let weights = match (wq, wk, wv) {
        (Some(q), Some(k), Some(v)) => Weights::Given {
            w_q: given("wq", q, &input).map_err(err)?,
            w_k: given("wk", k, &input).map_err(err)?,
            w_v: given("wv", v, &input).map_err(err)?,
            heads,
        },
        (None, None, None) => {
            let (d_k, d_v) = experiment::widths(d_in, d_out, d_k, d_v);
            let init = choose("init", init, &INITS).map_err(err)?;
            Weights::Init(AttentionSpec {
                d_in,
                d_k,
                d_v,
                heads,
                bias: bias || init == WeightInit::TorchMha,
                out_proj,
                init,
                layout: choose("qkv", qkv, &LAYOUTS).map_err(err)?,
            })
        }
        _ => {
            return Err(err(Error::value(
                "wq, wk and wv go together: give all three",
            )))
        }
    };
    let exp = Experiment {
        input,
        seed: seed.unwrap_or(TORCH_DEFAULT_SEED),
        reseed,
        skip_draws,
        weights,
        causal,
        window,
        mask_padding,
        softmax_axis: choose("softmax_dim", softmax_dim, &AXES).map_err(err)?,
        scale,
    };
    pool::run(py, 1, || {
        let ex = experiment::run(&exp)?;
        let maps = ex.attention_maps("attend explain")?;
        let steps = walkthrough::experiment_steps(&ex, &exp);
        let text =
            walkthrough::render(&steps) + &walkthrough::heatmaps(&maps, 0, ColorMode::Plain)?;
        Ok(Walkthrough {
            page: walkthrough::experiment_page(&ex, &exp, "attend.explain")?,
            steps,
            text,
            maps,
            layer: 0,
        })
    })
}

/// One head of a real model reading `text`, step by step.
#[pyfunction]
#[pyo3(signature = (model, text, *, layer, head))]
pub fn explain_model(
    py: Python<'_>,
    model: PathBuf,
    text: String,
    layer: usize,
    head: usize,
) -> PyResult<Walkthrough> {
    pool::run(py, 1, || {
        let encoder = SentenceEncoder::load(&model)?;
        let trace = encoder.trace(&text)?;
        let title = format!("{} — {text}", attend::models::model_name(&model));
        let maps = attend::viz::AttentionMaps::of_trace(&trace, &title)?;
        let steps = walkthrough::head_steps(
            trace.head(layer, head)?,
            &encoder.model.layers[layer].attention,
            head,
        );
        let mut out = format!(
            "{title}, layer {layer}, head {head}\ntokens: {:?}\n\n",
            trace.tokens
        );
        out.push_str(&walkthrough::render(&steps));
        out.push_str(&walkthrough::heatmaps(&maps, layer, ColorMode::Plain)?);
        let page_title = format!("{title}, layer {layer}, head {head}");
        Ok(Walkthrough {
            page: walkthrough::head_page(&steps, &trace.tokens, &page_title)?,
            steps,
            text: out,
            maps,
            layer,
        })
    })
}
