//! A notebook experiment from end to end: seed, embed, create weights, attend, and
//! keep every intermediate. `attend explain` and `attend.explain` fill in an
//! [`ExperimentSpec`], whose [`build`](ExperimentSpec::build) applies their rules,
//! and [`run`] it.

use ndarray::{Array2, Array3, ArrayD, ArrayView2};
use serde_json::{json, Map, Value};

use crate::text::sentence_vocab;
use attend_core::attention::{AttentionOptions, Causal, SoftmaxAxis};
use attend_core::nn::initialisers::{self, AttentionSpec};
use attend_core::nn::{Embedding, ModuleTrace, MultiHeadAttention};
use attend_core::rng::TorchGenerator;
use attend_core::{init, Error, Result};

mod spec;
pub use spec::{ExperimentSpec, Named, Spelling};

/// PyTorch's default CPU seed, used when no seed is given.
pub const TORCH_DEFAULT_SEED: u64 = 67_280_421_310_721;

/// Where `x` comes from.
#[derive(Clone, Debug)]
pub enum Input {
    /// Given embeddings `[B, T, d_in]`.
    Array(Array3<f32>),
    /// Embeddings `[1, T, d_in]` made elsewhere (e.g. by a trained model), with a
    /// label per position.
    Labelled {
        /// The embeddings.
        x: Array3<f32>,
        /// One label per position.
        labels: Vec<String>,
    },
    /// A sentence embedded through its own sorted vocabulary (notebook 004).
    Sentence {
        /// The text.
        text: String,
        /// Embedding width.
        embed_dim: usize,
    },
    /// Token ids `[B, T]` through an `nn.Embedding(vocab_size, embed_dim, padding_idx)`.
    Tokens {
        /// The ids.
        ids: Array2<usize>,
        /// Rows of the embedding.
        vocab_size: usize,
        /// Embedding width.
        embed_dim: usize,
        /// `padding_idx` as PyTorch takes it (negative counts from the end).
        padding_idx: Option<i64>,
    },
}

impl Input {
    /// The embedding width `d_in` this input gives.
    pub fn width(&self) -> usize {
        match self {
            Input::Array(x) | Input::Labelled { x, .. } => x.dim().2,
            Input::Sentence { embed_dim, .. } | Input::Tokens { embed_dim, .. } => *embed_dim,
        }
    }
}

/// Where the attention weights come from.
#[derive(Clone, Debug)]
pub enum Weights {
    /// Drawn from the generator. `d_in` of the spec is filled in from the input.
    Init(AttentionSpec),
    /// A ready module, e.g. trained weights.
    Module(Box<MultiHeadAttention>),
    /// Given in `[d_in, width]` orientation (`q = x @ W_q`), notebook 003.
    Given {
        /// Query weights.
        w_q: Array2<f32>,
        /// Key weights.
        w_k: Array2<f32>,
        /// Value weights.
        w_v: Array2<f32>,
        /// Number of heads.
        heads: usize,
    },
}

/// One experiment, ready to run (an [`ExperimentSpec`] with its rules applied).
#[derive(Clone, Debug)]
pub struct Experiment {
    /// The input.
    pub input: Input,
    /// `torch.manual_seed` before anything random.
    pub seed: u64,
    /// Seed again after the embedding, before the weights.
    pub reseed: Option<u64>,
    /// 32-bit draws to consume before the weights.
    pub skip_draws: u64,
    /// The weights.
    pub weights: Weights,
    /// Causal masking (top-left; queries and keys are the same tokens here).
    pub causal: bool,
    /// Sliding window `(left, right)`: query `i` sees keys `i − left ..= i + right`.
    pub window: Option<(usize, usize)>,
    /// Mask keys whose token id is the padding id.
    pub mask_padding: bool,
    /// Softmax over keys or over queries.
    pub softmax_axis: SoftmaxAxis,
    /// Score scale (default `1/√head_dim`).
    pub scale: Option<f32>,
}

/// Everything an experiment computed.
#[derive(Clone, Debug)]
pub struct Explanation {
    /// The words (or labels) of each token, when the input was a sentence or labelled.
    pub words: Option<Vec<String>>,
    /// Token ids `[B, T]`, when the input was ids or a sentence.
    pub ids: Option<Array2<usize>>,
    /// `[B, T, d_in]` after the embedding.
    pub x: Array3<f32>,
    /// The module with its weights.
    pub module: MultiHeadAttention,
    /// Every intermediate.
    pub trace: ModuleTrace,
    /// `[B, T]`, true where a key was masked as padding (with `mask_padding`).
    pub key_padding: Option<Array2<bool>>,
}

/// Runs the experiment through the reference kernel.
pub fn run(exp: &Experiment) -> Result<Explanation> {
    check_memory(exp)?;
    let mut gen = TorchGenerator::new(exp.seed);
    let Embedded {
        x,
        words,
        ids,
        padding,
    } = embed(&exp.input, &mut gen)?;
    if x.is_empty() {
        return Err(Error::value(format!(
            "input is empty: x has shape {:?}",
            x.shape()
        )));
    }
    if let Some(((b, t, c), v)) = x.indexed_iter().find(|(_, v)| !v.is_finite()) {
        return Err(Error::value(format!(
            "input x[{b}, {t}, {c}] is {v}, not a finite number"
        )));
    }
    if let Some(s) = exp.reseed {
        gen.manual_seed(s);
    }
    gen.skip(exp.skip_draws);
    let module = match &exp.weights {
        Weights::Init(spec) => initialisers::initialise(
            &AttentionSpec {
                d_in: x.dim().2,
                ..*spec
            },
            &mut gen,
        )?,
        Weights::Module(m) => (**m).clone(),
        Weights::Given {
            w_q,
            w_k,
            w_v,
            heads,
        } => initialisers::from_given(w_q.clone(), w_k.clone(), w_v.clone(), *heads)?,
    };
    let key_padding = match (exp.mask_padding, padding) {
        (false, _) => None,
        (true, Some(p)) => Some(p),
        (true, None) => {
            return Err(Error::value(
                "--mask-padding needs --tokens with --padding-idx",
            ))
        }
    };
    let opts = AttentionOptions {
        scale: exp.scale,
        causal: exp.causal.then_some(Causal::TopLeft),
        window: exp.window,
        key_padding: key_padding.as_ref().map(|p| p.view()),
        softmax_axis: exp.softmax_axis,
        ..Default::default()
    };
    let trace = module.trace(x.view(), &opts)?;
    Ok(Explanation {
        words,
        ids,
        x,
        module,
        trace,
        key_padding,
    })
}

/// Refuses an experiment whose arrays could not fit in memory, before any is
/// made, naming the flags behind the largest: the embedding table, the weights,
/// and the trace (three `[B, H, T, T]` score arrays, and the reference kernel's
/// f64 copies of one head's).
fn check_memory(exp: &Experiment) -> Result<()> {
    use attend_core::limits::{array_bytes as bytes, check_memory};
    let (batch, tokens, d_in) = match &exp.input {
        Input::Array(x) | Input::Labelled { x, .. } => x.dim(),
        Input::Sentence { text, embed_dim } => (1, text.split_whitespace().count(), *embed_dim),
        Input::Tokens { ids, embed_dim, .. } => (ids.nrows(), ids.ncols(), *embed_dim),
    };
    let table = match &exp.input {
        Input::Sentence { .. } => ("--sentence × --embed-dim", bytes(&[tokens, d_in], 4)),
        Input::Tokens { vocab_size, .. } => {
            ("--vocab-size × --embed-dim", bytes(&[*vocab_size, d_in], 4))
        }
        _ => ("--input", 0),
    };
    let (d_k, d_v, heads) = match &exp.weights {
        Weights::Init(spec) => (spec.d_k, spec.d_v, spec.heads),
        Weights::Given {
            w_q, w_v, heads, ..
        } => (w_q.ncols(), w_v.ncols(), *heads),
        Weights::Module(m) => (m.q_proj.weight.nrows(), m.v_proj.weight.nrows(), m.heads),
    };
    // q, k, v and the output, each in the projection and split into heads.
    let weights = bytes(
        &[d_in.max(d_v), d_k.saturating_add(d_k).saturating_add(d_v)],
        4,
    );
    let activations = bytes(&[batch, tokens, d_k.saturating_add(d_v)], 4).saturating_mul(6);
    let trace = bytes(&[batch, heads, tokens, tokens], 4)
        .saturating_mul(3)
        .saturating_add(bytes(&[tokens, tokens], 8).saturating_mul(2));
    check_memory(table.0, table.1)?;
    check_memory(
        "--d-out / --d-k / --d-v (the weights)",
        weights.saturating_mul(2),
    )?;
    check_memory("the input's length (every head's T × T scores)", trace)?;
    check_memory(
        "this experiment",
        [table.1, weights, activations, trace]
            .iter()
            .fold(0u128, |a, &b| a.saturating_add(b)),
    )
}

/// `x` and what is known about the tokens behind it.
struct Embedded {
    x: Array3<f32>,
    words: Option<Vec<String>>,
    ids: Option<Array2<usize>>,
    /// `[B, T]`, true where the id is the padding id.
    padding: Option<Array2<bool>>,
}

fn embed(input: &Input, gen: &mut TorchGenerator) -> Result<Embedded> {
    match input {
        Input::Labelled { x, labels } => Ok(Embedded {
            x: x.clone(),
            words: Some(labels.clone()),
            ids: None,
            padding: None,
        }),
        Input::Array(x) => Ok(Embedded {
            x: x.clone(),
            words: None,
            ids: None,
            padding: None,
        }),
        Input::Sentence { text, embed_dim } => {
            let s = sentence_vocab(text);
            if s.ids.is_empty() {
                return Err(Error::value("--sentence has no words"));
            }
            let table = Embedding {
                weight: init::embedding(gen, s.vocab.len(), *embed_dim, None)?,
                padding_idx: None,
            };
            let ids = Array2::from_shape_vec((1, s.ids.len()), s.ids).expect("one row");
            Ok(Embedded {
                x: table.forward(ids.view())?,
                words: Some(s.words),
                ids: Some(ids),
                padding: None,
            })
        }
        Input::Tokens {
            ids,
            vocab_size,
            embed_dim,
            padding_idx,
        } => {
            let weight = init::embedding(gen, *vocab_size, *embed_dim, *padding_idx)?;
            let pad = padding_idx.map(|p| if p < 0 { p + *vocab_size as i64 } else { p } as usize);
            let table = Embedding {
                weight,
                padding_idx: pad,
            };
            let padding = pad.map(|p| ids.mapv(|id| id == p));
            Ok(Embedded {
                x: table.forward(ids.view())?,
                words: None,
                ids: Some(ids.clone()),
                padding,
            })
        }
    }
}

impl Explanation {
    /// The attention weights of batch row 0, labelled by the tokens, for the
    /// heatmaps and the HTML view.
    pub fn attention_maps(&self, title: &str) -> Result<crate::viz::AttentionMaps> {
        let labels = self.labels();
        crate::viz::AttentionMaps::from_weights(
            self.trace.attention.weights.view(),
            0,
            labels.clone(),
            labels,
            title.to_owned(),
        )
    }

    /// The JSON object of the `explain` contract: nested arrays named `x`, `w_q`,
    /// `w_k`, `w_v` (`[out, in]`), `b_*`, `w_o`, `b_o`, `q`, `k`, `v`, `scores`,
    /// `scaled` (masked entries `null`), `weights`, `context` and `output`.
    pub fn to_json(&self) -> Value {
        let m = &self.module;
        let t = &self.trace;
        let mut obj = Map::new();
        let mut put = |name: &str, a: ArrayD<f32>| {
            obj.insert(name.to_owned(), nested(&a));
        };
        put("x", self.x.clone().into_dyn());
        for (name, proj) in [("q", &m.q_proj), ("k", &m.k_proj), ("v", &m.v_proj)] {
            put(&format!("w_{name}"), proj.weight.clone().into_dyn());
            if let Some(b) = &proj.bias {
                put(&format!("b_{name}"), b.clone().into_dyn());
            }
        }
        if let Some(o) = &m.out_proj {
            put("w_o", o.weight.clone().into_dyn());
            if let Some(b) = &o.bias {
                put("b_o", b.clone().into_dyn());
            }
        }
        put("q", t.q.clone().into_dyn());
        put("k", t.k.clone().into_dyn());
        put("v", t.v.clone().into_dyn());
        put("scores", t.attention.scores.clone().into_dyn());
        put("scaled", t.attention.scaled.clone().into_dyn());
        put("weights", t.attention.weights.clone().into_dyn());
        put("context", t.context.clone().into_dyn());
        if let Some(o) = &t.output {
            put("output", o.clone().into_dyn());
        }
        if let Some(w) = &self.words {
            obj.insert("tokens".into(), json!(w));
        }
        Value::Object(obj)
    }

    /// A label per position of batch row 0: the word, else the token id, else `x[t]`.
    pub fn labels(&self) -> Vec<String> {
        self.row_labels(0)
    }

    /// A label per position of batch row `b` (see [`labels`](Self::labels)).
    pub fn row_labels(&self, b: usize) -> Vec<String> {
        match (&self.words, &self.ids) {
            (Some(words), _) => words.clone(),
            (None, Some(ids)) => ids.row(b).iter().map(|id| id.to_string()).collect(),
            (None, None) => (0..self.x.dim().1).map(|t| format!("x[{t}]")).collect(),
        }
    }

    /// The attention weights of batch row `b` and head `h`, `[T_q, T_k]`.
    pub fn head_weights(&self, b: usize, h: usize) -> ArrayView2<'_, f32> {
        self.trace
            .attention
            .weights
            .slice(ndarray::s![b, h, .., ..])
    }
}

/// Nested JSON arrays; non-finite values (masked scores) become `null`.
fn nested(a: &ArrayD<f32>) -> Value {
    if a.ndim() == 0 {
        let v = a.iter().next().copied().unwrap_or(f32::NAN);
        return if v.is_finite() {
            json!(v as f64)
        } else {
            Value::Null
        };
    }
    Value::Array(a.outer_iter().map(|sub| nested(&sub.to_owned())).collect())
}
