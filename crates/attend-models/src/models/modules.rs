//! sentence-transformers' modules after the encoder (`modules.json`): Pooling,
//! Dense and Normalize, read from their folders and applied in the file's order.

use std::path::Path;

use ndarray::{concatenate, Array2, ArrayView3, Axis};
use serde_json::Value;

use super::{pool, Pooling};
use attend_core::io::safetensors::SafeTensors;
use attend_core::nn::state_dict::load_linear;
use attend_core::nn::{Activation, Linear};
use attend_core::{Error, Result};

/// What turns the encoder's token vectors into one sentence vector.
#[derive(Clone, Debug)]
pub struct SentenceModules {
    /// The pooling modes, concatenated in this order (one for nearly every model).
    pub pooling: Vec<Pooling>,
    /// Dense layers after the pooling, in order.
    pub dense: Vec<Dense>,
    /// Whether the result is L2-normalised (a `Normalize` module).
    pub normalize: bool,
}

/// sentence-transformers' `Dense` module: `activation(x Wᵀ + b)`.
#[derive(Clone, Debug)]
pub struct Dense {
    /// The linear map, `[out_features, in_features]`.
    pub linear: Linear,
    /// What follows it.
    pub activation: DenseActivation,
}

/// The activations a `Dense` module may name (`torch.nn.modules.…`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DenseActivation {
    /// `nn.Identity`.
    Identity,
    /// `nn.Tanh` (sentence-transformers' default).
    Tanh,
    /// `nn.Sigmoid`.
    Sigmoid,
    /// `nn.ReLU`, `nn.GELU` (exact) or `nn.SiLU`.
    Elementwise(Activation),
}

impl DenseActivation {
    /// The activation named by a `activation_function` path such as
    /// `torch.nn.modules.activation.Tanh`.
    pub fn from_torch_name(path: &str) -> Option<Self> {
        Some(match path.rsplit('.').next().unwrap_or_default() {
            "Identity" => DenseActivation::Identity,
            "Tanh" => DenseActivation::Tanh,
            "Sigmoid" => DenseActivation::Sigmoid,
            "ReLU" => DenseActivation::Elementwise(Activation::Relu),
            "GELU" => DenseActivation::Elementwise(Activation::Gelu),
            "SiLU" => DenseActivation::Elementwise(Activation::Silu),
            _ => return None,
        })
    }

    fn apply(self, xs: &mut [f32]) {
        match self {
            DenseActivation::Identity => {}
            DenseActivation::Tanh => xs.iter_mut().for_each(|x| *x = x.tanh()),
            DenseActivation::Sigmoid => xs.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
            DenseActivation::Elementwise(a) => a.apply(xs),
        }
    }
}

impl Dense {
    /// `activation(x Wᵀ + b)` on rows `[n, in_features]`.
    pub fn forward(&self, x: &Array2<f32>) -> Result<Array2<f32>> {
        let mut y = self.linear.forward(x.view())?;
        self.activation
            .apply(y.as_slice_mut().expect("Linear returns row-major arrays"));
        Ok(y)
    }
}

impl Default for SentenceModules {
    /// Mean pooling, nothing after it: what a checkpoint without `modules.json` gets.
    fn default() -> Self {
        SentenceModules {
            pooling: vec![Pooling::Mean],
            dense: Vec::new(),
            normalize: false,
        }
    }
}

impl SentenceModules {
    /// Reads `modules.json` in `dir` and the folders it names; [`Default`] when
    /// there is no `modules.json`. The hidden width `d` checks the first Dense
    /// layer's input.
    pub fn load(dir: &Path, d: usize) -> Result<Self> {
        let path = dir.join("modules.json");
        let Some(modules) = read_json(&path)? else {
            return Ok(Self::default());
        };
        let list = modules.as_array().ok_or_else(|| {
            Error::format(format!("{}: expected a list of modules", path.display()))
        })?;
        let mut pooling = None;
        let mut dense = Vec::new();
        let mut normalize = false;
        let mut width = d;
        for m in list {
            let kind = m.get("type").and_then(Value::as_str).unwrap_or_default();
            let sub = m.get("path").and_then(Value::as_str).unwrap_or_default();
            let name = kind.rsplit('.').next().unwrap_or_default();
            let out_of_order = |what: &str| {
                Error::format(format!(
                    "{}: module {name} comes {what}; attend runs Transformer, Pooling, Dense…, Normalize in that order",
                    path.display()
                ))
            };
            match name {
                "Transformer" => {}
                "Pooling" => {
                    if pooling.is_some() || normalize {
                        return Err(out_of_order("after another Pooling or a Normalize"));
                    }
                    let modes = read_pooling(&dir.join(sub).join("config.json"))?;
                    width *= modes.len();
                    pooling = Some(modes);
                }
                "Dense" => {
                    if pooling.is_none() || normalize {
                        return Err(out_of_order("before the Pooling or after a Normalize"));
                    }
                    let layer = read_dense(&dir.join(sub), width)?;
                    width = layer.linear.out_features();
                    dense.push(layer);
                }
                "Normalize" => normalize = true,
                _ => {
                    return Err(Error::format(format!(
                        "{}: module type {kind:?} is not supported (Transformer, Pooling, Dense, Normalize)",
                        path.display()
                    )))
                }
            }
        }
        Ok(SentenceModules {
            pooling: pooling.unwrap_or_else(|| vec![Pooling::Mean]),
            dense,
            normalize,
        })
    }

    /// The width of the sentence vectors.
    pub fn dimension(&self, hidden_size: usize) -> usize {
        self.dense
            .last()
            .map_or(hidden_size * self.pooling.len(), |l| {
                l.linear.out_features()
            })
    }

    /// Sentence vectors `[B, dimension]` from the last hidden state `[B, T, d]` of
    /// sequences of the given lengths.
    pub fn apply(&self, hidden: ArrayView3<'_, f32>, lengths: &[usize]) -> Result<Array2<f32>> {
        let pooled = self
            .pooling
            .iter()
            .map(|&p| pool(hidden, lengths, p, false))
            .collect::<Result<Vec<_>>>()?;
        let views: Vec<_> = pooled.iter().map(Array2::view).collect();
        let mut x = concatenate(Axis(1), &views)
            .map_err(|e| Error::shape(format!("pooled vectors do not concatenate: {e}")))?;
        for layer in &self.dense {
            x = layer.forward(&x)?;
        }
        if self.normalize {
            for mut row in x.rows_mut() {
                // torch.nn.functional.normalize: divide by max(‖x‖, 1e-12).
                let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
                row /= norm;
            }
        }
        Ok(x)
    }
}

/// The JSON in `path`, or `None` when there is no such file.
pub(crate) fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::format(format!("{}: not valid JSON: {e}", path.display())))
}

/// The pooling modes of a `Pooling` config: sentence-transformers ≥ 6's
/// `pooling_mode` (a name or a list of names), else the older
/// `pooling_mode_*_token(s)` flags, concatenated in sentence-transformers' order.
fn read_pooling(path: &Path) -> Result<Vec<Pooling>> {
    let cfg = read_json(path)?.ok_or_else(|| Error::io(path, "pooling config not found"))?;
    let by_name = |name: &str| -> Result<Pooling> {
        Pooling::from_name(name).ok_or_else(|| {
            Error::format(format!(
                "{}: pooling mode {name:?} is not supported (cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken)",
                path.display()
            ))
        })
    };
    let bad = || {
        Error::format(format!(
            "{}: \"pooling_mode\" must be a mode name or a non-empty list of them",
            path.display()
        ))
    };
    let modes = match cfg.get("pooling_mode") {
        Some(Value::String(name)) => vec![by_name(name)?],
        Some(Value::Array(names)) if !names.is_empty() => names
            .iter()
            .map(|n| n.as_str().ok_or_else(bad).and_then(by_name))
            .collect::<Result<_>>()?,
        Some(_) => return Err(bad()),
        None => {
            let on = |k: &str| cfg.get(k).and_then(Value::as_bool).unwrap_or(false);
            [
                ("pooling_mode_cls_token", Pooling::Cls),
                ("pooling_mode_max_tokens", Pooling::Max),
                ("pooling_mode_mean_tokens", Pooling::Mean),
                ("pooling_mode_mean_sqrt_len_tokens", Pooling::MeanSqrtLen),
                ("pooling_mode_weightedmean_tokens", Pooling::WeightedMean),
                ("pooling_mode_lasttoken", Pooling::LastToken),
            ]
            .into_iter()
            .filter(|(k, _)| on(k))
            .map(|(_, p)| p)
            .collect()
        }
    };
    // sentence-transformers means the tokens when no flag is on.
    Ok(if modes.is_empty() {
        vec![Pooling::Mean]
    } else {
        modes
    })
}

/// A `Dense` folder: `config.json` and the weights in `model.safetensors`
/// (`linear.weight`, `linear.bias`), taking vectors of width `width`.
fn read_dense(dir: &Path, width: usize) -> Result<Dense> {
    let cfg_path = dir.join("config.json");
    let cfg =
        read_json(&cfg_path)?.ok_or_else(|| Error::io(&cfg_path, "Dense config not found"))?;
    let activation = match cfg.get("activation_function") {
        // sentence-transformers' default when the config names none.
        None => DenseActivation::Tanh,
        Some(a) => a
            .as_str()
            .and_then(DenseActivation::from_torch_name)
            .ok_or_else(|| {
                Error::format(format!(
                    "{}: activation_function {a} is not supported (Identity, Tanh, Sigmoid, ReLU, GELU, SiLU)",
                    cfg_path.display()
                ))
            })?,
    };
    let weights = dir.join("model.safetensors");
    if !weights.is_file() {
        return Err(Error::io(
            &weights,
            "Dense weights not found (attend reads model.safetensors, not pytorch_model.bin)",
        ));
    }
    let file = SafeTensors::open(&weights)?;
    let linear = load_linear(&file.scope("linear."))?;
    if linear.in_features() != width {
        return Err(Error::shape(format!(
            "{}: linear.weight takes vectors of width {}, but the modules before it give {width}",
            file.origin(),
            linear.in_features()
        )));
    }
    Ok(Dense {
        linear: linear.column_major(),
        activation,
    })
}
