//! The step-by-step walkthrough of `explain`: every intermediate with its name and
//! a title, printed the way PyTorch prints tensors. The command line prints it (or
//! writes it as a page, [`experiment_page`] and [`head_page`]); the Python package
//! returns its steps as arrays, its text as `str()` and the same page.

mod page;

use ndarray::{s, Array3, ArrayD};

use crate::experiment::{Experiment, Explanation, Weights};
use crate::print::format_tensor;
use crate::viz::{terminal_heatmap, AttentionMaps, ColorMode};
use attend_core::attention::SoftmaxAxis;
use attend_core::nn::initialisers::{AttentionSpec, WeightInit};
use attend_core::nn::MultiHeadAttention;
use attend_core::Result;
use attend_models::models::HeadTrace;

pub use page::{
    walkthrough_page, PageContext, MASK_CAUSAL, MASK_PADDING, MASK_WINDOW, TABLE_TOKENS,
};

/// One intermediate of a walkthrough.
#[derive(Clone, Debug)]
pub struct Step {
    /// Its name in the JSON output and as a Python attribute (`q`, `weights`, …).
    pub key: &'static str,
    /// What it is, e.g. `scores = q kᵀ`.
    pub title: String,
    /// Its values.
    pub value: ArrayD<f32>,
}

fn step(key: &'static str, title: impl Into<String>, value: ArrayD<f32>) -> Step {
    Step {
        key,
        title: title.into(),
        value,
    }
}

/// The steps of a notebook experiment, from the input to the output.
pub fn experiment_steps(ex: &Explanation, exp: &Experiment) -> Vec<Step> {
    let t = &ex.trace;
    let m = &ex.module;
    let mut steps = Vec::new();
    let x_title = match &ex.words {
        Some(words) => format!("x: embeddings of {words:?}"),
        None => "x: input".to_owned(),
    };
    steps.push(step("x", x_title, ex.x.clone().into_dyn()));
    steps.push(step(
        "w_q",
        "W_q [out, in]   (q = x W_qᵀ)",
        m.q_proj.weight.clone().into_dyn(),
    ));
    steps.push(step(
        "w_k",
        "W_k [out, in]",
        m.k_proj.weight.clone().into_dyn(),
    ));
    steps.push(step(
        "w_v",
        "W_v [out, in]",
        m.v_proj.weight.clone().into_dyn(),
    ));
    for (key, proj) in [("b_q", &m.q_proj), ("b_k", &m.k_proj), ("b_v", &m.v_proj)] {
        if let Some(b) = &proj.bias {
            steps.push(step(key, key, b.clone().into_dyn()));
        }
    }
    steps.push(step(
        "q",
        "q = x W_qᵀ, split into heads [B, H, T, d_head]",
        t.q.clone().into_dyn(),
    ));
    steps.push(step("k", "k = x W_kᵀ", t.k.clone().into_dyn()));
    steps.push(step("v", "v = x W_vᵀ", t.v.clone().into_dyn()));
    steps.push(step(
        "scores",
        "scores = q kᵀ",
        t.attention.scores.clone().into_dyn(),
    ));
    let scale = experiment_scale(ex, exp);
    steps.push(step(
        "scaled",
        format!("scaled = scores × {scale:.4} (masked entries -inf)"),
        t.attention.scaled.clone().into_dyn(),
    ));
    let axis = match exp.softmax_axis {
        SoftmaxAxis::Keys => "keys (each row sums to 1)",
        SoftmaxAxis::Queries => "queries (each column sums to 1)",
    };
    steps.push(step(
        "weights",
        format!("weights = softmax(scaled) over {axis}"),
        t.attention.weights.clone().into_dyn(),
    ));
    steps.push(step(
        "context",
        "context = weights v, heads concatenated",
        t.context.clone().into_dyn(),
    ));
    if let (Some(o), Some(proj)) = (&t.output, &m.out_proj) {
        steps.push(step("w_o", "W_o [out, in]", proj.weight.clone().into_dyn()));
        if let Some(b) = &proj.bias {
            steps.push(step("b_o", "b_o", b.clone().into_dyn()));
        }
        steps.push(step(
            "output",
            "output = context W_oᵀ + b_o",
            o.clone().into_dyn(),
        ));
    }
    steps
}

/// The factor the experiment's scores were multiplied by.
fn experiment_scale(ex: &Explanation, exp: &Experiment) -> f32 {
    exp.scale
        .unwrap_or(1.0 / (ex.module.head_dim() as f32).sqrt())
}

/// The walkthrough of a notebook experiment as one self-contained HTML page
/// (see [`walkthrough_page`]).
pub fn experiment_page(ex: &Explanation, exp: &Experiment, title: &str) -> Result<String> {
    let (b, t) = (ex.x.dim().0, ex.x.dim().1);
    let masked = exp.causal || exp.window.is_some() || ex.key_padding.is_some();
    let mask_reasons = masked.then(|| {
        Array3::from_shape_fn((b, t, t), |(b, i, j)| {
            let padding = ex.key_padding.as_ref().is_some_and(|p| p[[b, j]]);
            let causal = exp.causal && j > i;
            // Queries and keys are the same tokens: both alignments agree.
            let window = exp.window.is_some_and(|(l, r)| j + l < i || j > i + r);
            u8::from(padding) * MASK_PADDING
                + u8::from(causal) * MASK_CAUSAL
                + u8::from(window) * MASK_WINDOW
        })
    });
    let ctx = PageContext {
        title: title.to_owned(),
        labels: (0..b).map(|row| ex.row_labels(row)).collect(),
        scale: experiment_scale(ex, exp),
        softmax_axis: exp.softmax_axis,
        // Notebook 003 writes `nn.Parameter(torch.rand(d_in, d_out))`, used as `x @ W`.
        weights_in_out: matches!(
            &exp.weights,
            Weights::Given { .. }
                | Weights::Init(AttentionSpec {
                    init: WeightInit::UniformInOut,
                    ..
                })
        ),
        mask_reasons,
    };
    walkthrough_page(&experiment_steps(ex, exp), &ctx)
}

/// The walkthrough of one head of a real model (the steps of [`head_steps`]) as one
/// self-contained HTML page; `tokens` label the positions.
pub fn head_page(steps: &[Step], tokens: &[String], title: &str) -> Result<String> {
    let head_dim = steps
        .iter()
        .find(|s| s.key == "q")
        .and_then(|s| s.value.shape().last().copied())
        .unwrap_or(1);
    let ctx = PageContext {
        title: title.to_owned(),
        labels: vec![tokens.to_vec()],
        // BERT scales by 1/√d_head and masks nothing in a single text.
        scale: 1.0 / (head_dim as f32).sqrt(),
        softmax_axis: SoftmaxAxis::Keys,
        weights_in_out: false,
        mask_reasons: None,
    };
    walkthrough_page(steps, &ctx)
}

/// The steps of one head of a real model: the layer's input, this head's rows of the
/// projections of `attention` (the layer's module), and on to the head's context.
pub fn head_steps(t: HeadTrace, attention: &MultiHeadAttention, head: usize) -> Vec<Step> {
    let mut steps = vec![step(
        "x",
        "x: the layer's input (hidden states)",
        t.input.into_dyn(),
    )];
    let (dk, dv) = (attention.head_dim(), attention.value_dim());
    // K and V heads are shared by groups of query heads when kv_heads < heads.
    let kv = head / (attention.heads / attention.kv_heads);
    let projections = [
        ("w_q", "b_q", &attention.q_proj, head * dk, dk),
        ("w_k", "b_k", &attention.k_proj, kv * dk, dk),
        ("w_v", "b_v", &attention.v_proj, kv * dv, dv),
    ];
    for (key, _, proj, start, width) in projections {
        let rows = proj.weight.slice(s![start..start + width, ..]);
        let title = format!("W_{} [out, in], this head's rows", &key[2..]);
        steps.push(step(key, title, rows.to_owned().into_dyn()));
    }
    for (_, key, proj, start, width) in projections {
        if let Some(b) = &proj.bias {
            let part = b.slice(s![start..start + width]);
            steps.push(step(
                key,
                format!("{key}, this head"),
                part.to_owned().into_dyn(),
            ));
        }
    }
    steps.extend([
        step("q", "q = x W_qᵀ + b_q, this head", t.q.into_dyn()),
        step("k", "k = x W_kᵀ + b_k, this head", t.k.into_dyn()),
        step("v", "v = x W_vᵀ + b_v, this head", t.v.into_dyn()),
        step("scores", "scores = q kᵀ", t.scores.into_dyn()),
    ]);
    // MPNet adds a bias from the relative positions of query and key.
    let scaled_title = match t.position_bias {
        Some(bias) => {
            steps.push(step(
                "position_bias",
                "position bias, this head (from the key's position relative to the query)",
                bias.into_dyn(),
            ));
            "scaled = scores / √d_head + position bias"
        }
        None => "scaled = scores / √d_head",
    };
    steps.extend([
        step("scaled", scaled_title, t.scaled.into_dyn()),
        step(
            "weights",
            "weights = softmax(scaled) over keys (each row sums to 1)",
            t.weights.into_dyn(),
        ),
        step("context", "context = weights v", t.output.into_dyn()),
    ]);
    steps
}

/// `Step 1. title  shape [..]`, the tensor, a blank line; for every step.
pub fn render(steps: &[Step]) -> String {
    let mut out = String::new();
    for (i, s) in steps.iter().enumerate() {
        out.push_str(&format!(
            "Step {}. {}  shape {:?}\n{}\n\n",
            i + 1,
            s.title,
            s.value.shape(),
            format_tensor(s.value.view())
        ));
    }
    out
}

/// Every head's weights in `layer` as a terminal heatmap, one after another.
pub fn heatmaps(maps: &AttentionMaps, layer: usize, style: ColorMode) -> Result<String> {
    maps.check_layer(layer)?;
    let mut out = String::new();
    for (h, w) in maps.layers[layer].outer_iter().enumerate() {
        out.push_str(&format!(
            "Attention weights, head {h} (rows: queries, columns: keys)\n"
        ));
        out.push_str(&terminal_heatmap(
            w,
            &maps.query_tokens,
            &maps.key_tokens,
            style,
        )?);
        out.push('\n');
    }
    Ok(out)
}
