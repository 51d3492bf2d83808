//! `explain`: a notebook experiment, or one head of a real model, step by step.
//!
//! The keyword arguments are `attend explain`'s flags; the steps, their text and
//! the pictures come from the library (`attend::walkthrough`, `attend::viz`), so
//! Python shows exactly what the command line prints.

use std::path::PathBuf;

use attend::attention::SoftmaxAxis;
use attend::experiment::{self, ExperimentSpec, Named, Spelling};
use attend::models::SentenceEncoder;
use attend::nn::initialisers::{QkvLayout, WeightInit};
use attend::viz::{html_view, render_svg, AttentionMaps, ColorMode};
use attend::walkthrough::{self, Step};
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

/// A notebook experiment (see `attend explain --help`; the arguments are its flags).
// The defaults are `ExperimentSpec::default()`'s, written out because Python's
// signature shows only literals (an expression shows as `...`).
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
    let exp = ExperimentSpec {
        input: input.map(|a| a.as_array().to_owned()),
        sentence,
        tokens: tokens.map(|t| t.as_array().to_owned()),
        vocab_size,
        embed_dim,
        padding_idx,
        seed,
        reseed,
        skip_draws,
        init: WeightInit::parse("init", init).map_err(err)?,
        wq: wq.map(|w| w.as_array().into_dyn().to_owned()),
        wk: wk.map(|w| w.as_array().into_dyn().to_owned()),
        wv: wv.map(|w| w.as_array().into_dyn().to_owned()),
        d_out,
        d_k,
        d_v,
        heads,
        qkv: QkvLayout::parse("qkv", qkv).map_err(err)?,
        bias,
        out_proj,
        causal,
        window,
        mask_padding,
        softmax_dim: SoftmaxAxis::parse("softmax_dim", softmax_dim).map_err(err)?,
        scale,
        spelling: Spelling::Keywords,
        ..ExperimentSpec::default()
    }
    .build()
    .map_err(err)?;
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
