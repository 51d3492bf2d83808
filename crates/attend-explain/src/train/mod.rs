//! A small attention model that learns to reverse digit sequences.
//!
//! The task cannot be solved without attention: the answer at position `i` is the
//! digit at position `T − 1 − i`, so every output must look somewhere else in the
//! sequence. The model is `x = tokens[id] + positions[t]`, one
//! [`MultiHeadAttention`] (with an output projection) and a [`Linear`] head giving
//! ten logits per position, trained with cross-entropy and [`AdamW`], every
//! gradient from the explicit-cache API of [`attend_core::grad`].

mod safetensors;
mod svg;

pub use safetensors::{load, save, TENSOR_NAMES};
pub use svg::loss_curve_svg;

use ndarray::{Array2, Array3, ArrayView2, ArrayView3, Axis};

use attend_core::attention::AttentionOptions;
use attend_core::attention::Dropout;
use attend_core::grad::{
    EmbeddingCache, EmbeddingGrads, LinearCache, LinearGrads, MultiHeadAttentionCache,
    MultiHeadAttentionGrads,
};
use attend_core::nn::initialisers::{self, AttentionSpec, QkvLayout, WeightInit};
use attend_core::nn::{Embedding, Linear, MultiHeadAttention};
use attend_core::optim::{prefixed, AdamW, Optimizer, Parameters, Visitor};
use attend_core::rng::TorchGenerator;
use attend_core::{init, Error, Result};

/// Number of digit classes.
pub const DIGITS: usize = 10;

/// The reversal model.
#[derive(Clone, Debug, PartialEq)]
pub struct Reverser {
    /// Digit embeddings `[10, d]`.
    pub tokens: Embedding,
    /// Position embeddings `[T, d]`.
    pub positions: Embedding,
    /// Self-attention over the sequence.
    pub attention: MultiHeadAttention,
    /// Logits per position, `[10, d]`.
    pub head: Linear,
}

/// Gradients of a [`Reverser`], named like its parameters.
#[derive(Clone, Debug)]
pub struct ReverserGrads {
    /// Of the digit embeddings.
    pub tokens: EmbeddingGrads,
    /// Of the position embeddings.
    pub positions: EmbeddingGrads,
    /// Of the attention module.
    pub attention: MultiHeadAttentionGrads,
    /// Of the head.
    pub head: LinearGrads,
}

/// What [`Reverser::backward`] needs.
pub struct ReverserCache {
    tokens: EmbeddingCache,
    positions: EmbeddingCache,
    attention: MultiHeadAttentionCache<'static>,
    head: LinearCache,
}

impl Reverser {
    /// A fresh model for sequences of `len` digits, width `d_model`, `heads` heads.
    pub fn new(len: usize, d_model: usize, heads: usize, gen: &mut TorchGenerator) -> Result<Self> {
        if len == 0 || d_model == 0 || heads == 0 || !d_model.is_multiple_of(heads) {
            return Err(Error::value(format!(
                "need len ≥ 1 and d_model ({d_model}) a positive multiple of heads ({heads}), len {len}"
            )));
        }
        let tokens = Embedding {
            weight: init::embedding(gen, DIGITS, d_model, None)?,
            padding_idx: None,
        };
        let positions = Embedding {
            weight: init::embedding(gen, len, d_model, None)?,
            padding_idx: None,
        };
        let attention = initialisers::initialise(
            &AttentionSpec {
                d_in: d_model,
                d_k: d_model,
                d_v: d_model,
                heads,
                bias: true,
                out_proj: true,
                init: WeightInit::Linear,
                layout: QkvLayout::Separate,
            },
            gen,
        )?;
        let (w, b) = init::linear(gen, d_model, DIGITS, true);
        Ok(Reverser {
            tokens,
            positions,
            attention,
            head: Linear::new(w, b)?,
        })
    }

    /// Sequence length the model was built for.
    pub fn len(&self) -> usize {
        self.positions.num_embeddings()
    }

    /// Whether the model has no positions (never true for a built model).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn position_ids(&self, batch: usize) -> Array2<usize> {
        Array2::from_shape_fn((batch, self.len()), |(_, t)| t)
    }

    fn check(&self, ids: &ArrayView2<'_, usize>) -> Result<()> {
        if ids.ncols() != self.len() {
            return Err(Error::shape(format!(
                "ids of shape {:?} must have {} positions",
                ids.shape(),
                self.len()
            )));
        }
        Ok(())
    }

    /// The attention's input `[B, T, d]` for digit sequences `ids [B, T]`: digit
    /// embedding plus position embedding.
    pub fn embed(&self, ids: ArrayView2<'_, usize>) -> Result<Array3<f32>> {
        self.check(&ids)?;
        Ok(self.tokens.forward(ids)?
            + self
                .positions
                .forward(self.position_ids(ids.nrows()).view())?)
    }

    /// Logits `[B, T, 10]` for digit sequences `ids [B, T]`.
    pub fn forward(&self, ids: ArrayView2<'_, usize>) -> Result<Array3<f32>> {
        let x = self.embed(ids)?;
        let h = self
            .attention
            .forward(x.view(), &AttentionOptions::default())?;
        self.head.forward(h.view())
    }

    /// [`forward`](Self::forward) keeping the caches; `dropout` applies to the
    /// attention weights.
    pub fn forward_train(
        &self,
        ids: ArrayView2<'_, usize>,
        dropout: Option<Dropout>,
    ) -> Result<(Array3<f32>, ReverserCache)> {
        self.check(&ids)?;
        let (xt, tokens) = self.tokens.forward_train(ids)?;
        let (xp, positions) = self
            .positions
            .forward_train(self.position_ids(ids.nrows()).view())?;
        let x = xt + xp;
        let (h, attention) = self.attention.forward_train_dropout(
            x.view(),
            &AttentionOptions::default(),
            dropout,
        )?;
        let (logits, head) = self.head.forward_train(h.view())?;
        Ok((
            logits,
            ReverserCache {
                tokens,
                positions,
                attention,
                head,
            },
        ))
    }

    /// Gradients given `dlogits`.
    pub fn backward(
        &self,
        cache: &ReverserCache,
        dlogits: ArrayView3<'_, f32>,
    ) -> Result<ReverserGrads> {
        let (dh, head) = self.head.backward(&cache.head, dlogits)?;
        let (dx, attention) = self.attention.backward(&cache.attention, dh.view())?;
        Ok(ReverserGrads {
            tokens: self.tokens.backward(&cache.tokens, dx.view())?,
            positions: self.positions.backward(&cache.positions, dx.view())?,
            attention,
            head,
        })
    }
}

impl Parameters for Reverser {
    type Grads = ReverserGrads;
    fn visit(&mut self, g: &ReverserGrads, f: &mut Visitor<'_>) -> Result<()> {
        prefixed("tokens", &mut self.tokens, &g.tokens, f)?;
        prefixed("positions", &mut self.positions, &g.positions, f)?;
        prefixed("attention", &mut self.attention, &g.attention, f)?;
        prefixed("head", &mut self.head, &g.head, f)
    }
}

/// Mean cross-entropy of `logits [B, T, C]` against `targets [B, T]`: the loss,
/// its gradient with respect to the logits, and the number of correct argmaxes.
pub fn cross_entropy(
    logits: ArrayView3<'_, f32>,
    targets: ArrayView2<'_, usize>,
) -> (f32, Array3<f32>, usize) {
    let (b, t, _) = logits.dim();
    let n = (b * t) as f32;
    let mut grad = Array3::zeros(logits.raw_dim());
    let mut loss = 0.0f64;
    let mut correct = 0;
    for bi in 0..b {
        for ti in 0..t {
            let row = logits.slice(ndarray::s![bi, ti, ..]);
            let m = row.fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            let sum: f32 = row.iter().map(|x| (x - m).exp()).sum();
            let target = targets[[bi, ti]];
            loss += (m + sum.ln() - row[target]) as f64;
            let argmax = row
                .iter()
                .enumerate()
                .fold(0, |best, (i, &x)| if x > row[best] { i } else { best });
            correct += usize::from(argmax == target);
            for (c, g) in grad
                .slice_mut(ndarray::s![bi, ti, ..])
                .iter_mut()
                .enumerate()
            {
                *g = ((row[c] - m).exp() / sum - f32::from(u8::from(c == target))) / n;
            }
        }
    }
    ((loss / n as f64) as f32, grad, correct)
}

/// A batch of random digit sequences and their reversals.
pub fn reverse_batch(
    gen: &mut TorchGenerator,
    batch: usize,
    len: usize,
) -> (Array2<usize>, Array2<usize>) {
    let ids =
        Array2::from_shape_simple_fn((batch, len), || (gen.random_u32() % DIGITS as u32) as usize);
    let mut targets = ids.clone();
    targets.invert_axis(Axis(1));
    (ids, targets)
}

/// Hyper-parameters of a training run.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Digits per sequence.
    pub len: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// Dropout on the attention weights, `[0, 1)`.
    pub dropout: f32,
    /// Seed of the weights and of the training data.
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            len: 8,
            d_model: 32,
            heads: 2,
            steps: 600,
            batch: 64,
            lr: 3e-3,
            dropout: 0.0,
            seed: 0,
        }
    }
}

impl TrainConfig {
    /// A bound on the bytes a training step (or the 2000-sequence evaluation)
    /// holds: activations and their gradients (about sixteen `[batch, len, d_model]`
    /// and four `[batch, heads, len, len]` arrays) and the parameters with their
    /// gradients and AdamW moments.
    pub fn memory_bytes(&self) -> u128 {
        let bytes = attend_core::limits::array_bytes;
        let batch = self.batch.max(EVAL_SEQUENCES);
        let activations = bytes(&[batch, self.len, self.d_model], 4)
            .saturating_mul(16)
            .saturating_add(bytes(&[batch, self.heads, self.len, self.len], 4).saturating_mul(4));
        let params = bytes(&[self.d_model, self.d_model], 4)
            .saturating_mul(4)
            .saturating_add(bytes(&[self.len + DIGITS, self.d_model], 4));
        activations.saturating_add(params.saturating_mul(4))
    }
}

/// Sequences `attend train` evaluates the trained model on.
pub const EVAL_SEQUENCES: usize = 2000;

/// Trains a [`Reverser`]; `on_step(step, loss)` is called after every step.
/// Returns the model and the loss of every step.
pub fn train(
    config: &TrainConfig,
    mut on_step: impl FnMut(usize, f32),
) -> Result<(Reverser, Vec<f32>)> {
    if config.steps == 0 || config.batch == 0 {
        return Err(Error::value("steps and batch must be at least 1"));
    }
    attend_core::limits::check_memory(
        "--batch × --len × --d-model × --heads",
        config.memory_bytes(),
    )?;
    Dropout::new(config.dropout, 0)?;
    let mut opt = AdamW::new(config.lr)?;
    let mut gen = TorchGenerator::new(config.seed);
    let mut model = Reverser::new(config.len, config.d_model, config.heads, &mut gen)?;
    // Grown step by step: reserving `steps` up front would let a huge step count
    // claim memory before a single step has run.
    let mut losses = Vec::new();
    for step in 0..config.steps {
        let (ids, targets) = reverse_batch(&mut gen, config.batch, config.len);
        let dropout = (config.dropout > 0.0)
            .then(|| Dropout::new(config.dropout, config.seed ^ (step as u64 + 1)))
            .transpose()?;
        let (logits, cache) = model.forward_train(ids.view(), dropout)?;
        let (loss, dlogits, _) = cross_entropy(logits.view(), targets.view());
        if !loss.is_finite() {
            return Err(Error::value(format!(
                "loss became {loss} at step {step}; lower --lr"
            )));
        }
        let grads = model.backward(&cache, dlogits.view())?;
        opt.step(&mut model, &grads)?;
        losses.push(loss);
        on_step(step, loss);
    }
    Ok((model, losses))
}

/// Accuracy on `n` fresh sequences drawn from `seed`: `(per digit, per sequence)`.
pub fn evaluate(model: &Reverser, n: usize, seed: u64) -> Result<(f64, f64)> {
    let mut gen = TorchGenerator::new(seed);
    let (ids, targets) = reverse_batch(&mut gen, n, model.len());
    let logits = model.forward(ids.view())?;
    let (_, _, correct) = cross_entropy(logits.view(), targets.view());
    let mut whole = 0;
    for (bi, row) in targets.outer_iter().enumerate() {
        let ok = row.iter().enumerate().all(|(t, &target)| {
            let l = logits.slice(ndarray::s![bi, t, ..]);
            l.iter()
                .enumerate()
                .all(|(c, &x)| c == target || x < l[target])
        });
        whole += usize::from(ok);
    }
    Ok((
        correct as f64 / (n * model.len()) as f64,
        whole as f64 / n as f64,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_entropy_gradient_matches_finite_differences() {
        let logits = Array3::from_shape_fn((2, 3, DIGITS), |(b, t, c)| {
            ((b * 7 + t * 3 + c * 5) % 11) as f32 * 0.3 - 1.0
        });
        let targets = Array2::from_shape_fn((2, 3), |(b, t)| (b + 2 * t) % DIGITS);
        let (_, grad, _) = cross_entropy(logits.view(), targets.view());
        let h = 1e-2f32;
        for idx in [(0, 0, 0), (1, 2, 5), (0, 1, 2)] {
            let mut up = logits.clone();
            up[idx] += h;
            let mut down = logits.clone();
            down[idx] -= h;
            let numeric = (cross_entropy(up.view(), targets.view()).0
                - cross_entropy(down.view(), targets.view()).0)
                / (2.0 * h);
            assert!(
                (numeric - grad[idx]).abs() < 1e-3,
                "{numeric} vs {}",
                grad[idx]
            );
        }
    }

    #[test]
    fn a_short_run_learns_to_reverse() {
        let config = TrainConfig {
            len: 4,
            steps: 250,
            ..Default::default()
        };
        let (model, losses) = train(&config, |_, _| {}).unwrap();
        assert!(
            losses.last().unwrap() < &(losses[0] / 4.0),
            "{:?}",
            &losses[losses.len() - 5..]
        );
        let (digit, _) = evaluate(&model, 500, 99).unwrap();
        assert!(digit > 0.9, "held-out accuracy {digit}");
    }

    #[test]
    fn bad_hyper_parameters_are_errors() {
        for (lr, p) in [
            (0.0, 0.0),
            (f64::NAN, 0.0),
            (-1.0, 0.0),
            (1e-3, 1.0),
            (1e-3, -0.1),
        ] {
            let config = TrainConfig {
                lr,
                dropout: p,
                steps: 1,
                ..Default::default()
            };
            assert!(train(&config, |_, _| {}).is_err(), "lr {lr} dropout {p}");
        }
    }
}

#[cfg(test)]
mod io_tests {
    use super::*;

    #[test]
    fn saved_weights_load_back_identical() {
        let mut gen = TorchGenerator::new(3);
        let m = Reverser::new(5, 8, 2, &mut gen).unwrap();
        let path = std::env::temp_dir().join(format!(
            "attend-reverser-{}.safetensors",
            std::process::id()
        ));
        save(&m, &path).unwrap();
        let back = load(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(back, m);
        assert_eq!(TENSOR_NAMES.len(), 12);
    }
}
