//! [`ExperimentSpec`]: an experiment as its front ends take it (every flag of
//! `attend explain`, every keyword of `attend.explain`), and the one place their
//! rules turn it into an [`Experiment`]; [`Named`]: the names of the choices.

use std::path::PathBuf;

use ndarray::{Array2, Array3, ArrayD, Axis};

use super::{Experiment, Input, Weights, TORCH_DEFAULT_SEED};
use attend_core::attention::SoftmaxAxis;
use attend_core::nn::initialisers::{AttentionSpec, QkvLayout, WeightInit};
use attend_core::{Error, Result};

/// A notebook experiment as the front ends describe it, before its rules are
/// applied: the fields are `attend explain`'s flags (`d_out` is `--d-out`) and
/// `attend.explain`'s keywords, with their defaults in [`Default`].
/// [`build`](Self::build) checks them and makes the [`Experiment`].
///
/// ```
/// use attend_explain::experiment::{self, ExperimentSpec, Spelling};
/// use ndarray::array;
///
/// // attend explain --input '[[1.16,0.23],[0.57,1.36],[4.41,-2.16]]' --seed 42 --d-out 2
/// let spec = ExperimentSpec {
///     input: Some(array![[1.16f32, 0.23], [0.57, 1.36], [4.41, -2.16]].into_dyn()),
///     seed: Some(42),
///     d_out: Some(2),
///     ..ExperimentSpec::default()
/// };
/// let ex = experiment::run(&spec.build()?)?;
/// assert_eq!(ex.trace.attention.weights.shape(), &[1, 1, 3, 3]);
///
/// // Errors name the argument as the front end spells it.
/// let python = ExperimentSpec { spelling: Spelling::Keywords, ..ExperimentSpec::default() };
/// assert!(python.build().unwrap_err().to_string().contains("give one of input, sentence"));
/// # Ok::<(), attend_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ExperimentSpec {
    /// Embeddings `[T, d_in]` or `[B, T, d_in]`.
    pub input: Option<ArrayD<f32>>,
    /// A sentence, embedded through its sorted vocabulary (notebook 004).
    pub sentence: Option<String>,
    /// Token ids `[B, T]`, each below `vocab_size`.
    pub tokens: Option<Array2<i64>>,
    /// Weights written by `attend train`, whose learned attention is explained on
    /// `digits`.
    pub trained: Option<PathBuf>,
    /// The digit sequence fed to the `trained` model, e.g. `"31415926"`.
    pub digits: Option<String>,
    /// Rows of the embedding table for `tokens`.
    pub vocab_size: Option<usize>,
    /// Embedding width for `sentence` and `tokens`.
    pub embed_dim: Option<usize>,
    /// `nn.Embedding`'s `padding_idx` for `tokens` (negative counts from the end).
    pub padding_idx: Option<i64>,
    /// `torch.manual_seed` before anything random (default [`TORCH_DEFAULT_SEED`]).
    pub seed: Option<u64>,
    /// Seed again after the embedding, before the weights.
    pub reseed: Option<u64>,
    /// 32-bit draws to consume before the weights are created.
    pub skip_draws: u64,
    /// How the weights are created (when they are not given).
    pub init: WeightInit,
    /// Given query weights `[d_in, width]` (`q = x @ wq`); with `wk` and `wv`, they
    /// replace `init` and decide the widths, with no biases or output projection.
    pub wq: Option<ArrayD<f32>>,
    /// Given key weights `[d_in, width]`.
    pub wk: Option<ArrayD<f32>>,
    /// Given value weights `[d_in, width]`.
    pub wv: Option<ArrayD<f32>>,
    /// Total width of q, k and v (all heads); sets both `d_k` and `d_v`.
    pub d_out: Option<usize>,
    /// Total query/key width (default `d_in`).
    pub d_k: Option<usize>,
    /// Total value width (default `d_k`, else `d_in`).
    pub d_v: Option<usize>,
    /// Number of heads.
    pub heads: usize,
    /// How the q, k and v projections are packed.
    pub qkv: QkvLayout,
    /// The projections have biases (always with [`WeightInit::TorchMha`], as
    /// `nn.MultiheadAttention(bias=True)` has).
    pub bias: bool,
    /// An output `Linear(d_v, d_v)` after the heads.
    pub out_proj: bool,
    /// Query `i` sees keys `j ≤ i`.
    pub causal: bool,
    /// Sliding window `(left, right)`: query `i` sees keys `i − left ..= i + right`.
    pub window: Option<(usize, usize)>,
    /// Mask keys whose token id is `padding_idx`.
    pub mask_padding: bool,
    /// The axis the softmax normalises.
    pub softmax_dim: SoftmaxAxis,
    /// Multiplies the scores (default `1/√(key head width)`).
    pub scale: Option<f32>,
    /// How errors spell the arguments: as the front end that filled the spec in.
    pub spelling: Spelling,
}

impl Default for ExperimentSpec {
    fn default() -> Self {
        ExperimentSpec {
            input: None,
            sentence: None,
            tokens: None,
            trained: None,
            digits: None,
            vocab_size: None,
            embed_dim: None,
            padding_idx: None,
            seed: None,
            reseed: None,
            skip_draws: 0,
            init: WeightInit::Linear,
            wq: None,
            wk: None,
            wv: None,
            d_out: None,
            d_k: None,
            d_v: None,
            heads: 1,
            qkv: QkvLayout::Separate,
            bias: false,
            out_proj: false,
            causal: false,
            window: None,
            mask_padding: false,
            softmax_dim: SoftmaxAxis::Keys,
            scale: None,
            spelling: Spelling::Flags,
        }
    }
}

/// How a front end spells an argument, so that an error names what the user typed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Spelling {
    /// The command line's flags: `--d-out`.
    #[default]
    Flags,
    /// Python's keyword arguments: `d_out`.
    Keywords,
}

impl Spelling {
    /// The field `field` of [`ExperimentSpec`] (e.g. `d_out`) as this front end
    /// spells it.
    pub fn arg(self, field: &str) -> String {
        match self {
            Spelling::Flags => format!("--{}", field.replace('_', "-")),
            Spelling::Keywords => field.to_owned(),
        }
    }
}

impl ExperimentSpec {
    /// The experiment, or an error of one line naming the argument at fault:
    /// exactly one input source; `trained` with `digits`; `embed_dim` (at least 1)
    /// with `sentence` or `tokens`, and `vocab_size` above every token id; the
    /// input of rank 2 or 3; `wq`, `wk` and `wv` all or none, each `[d_in, width]`;
    /// else the widths from `d_out`/`d_k`/`d_v` and biases with `torch-mha`.
    pub fn build(mut self) -> Result<Experiment> {
        let arg = |field: &str| self.spelling.arg(field);
        let sources = [
            ("input", self.input.is_some()),
            ("sentence", self.sentence.is_some()),
            ("tokens", self.tokens.is_some()),
            ("trained", self.trained.is_some()),
        ];
        let given: Vec<String> = sources
            .iter()
            .filter(|(_, given)| *given)
            .map(|(field, _)| arg(field))
            .collect();
        if given.len() > 1 {
            return Err(Error::value(format!(
                "give only one input, got {}",
                given.join(" and ")
            )));
        }
        if self.trained.is_some() != self.digits.is_some() {
            return Err(Error::value(format!(
                "{} and {} go together",
                arg("trained"),
                arg("digits")
            )));
        }
        if let (Some(path), Some(digits)) = (&self.trained, &self.digits) {
            return self.trained_experiment(path, digits);
        }
        let input = self.take_input()?;
        let weights = self.take_weights(&input)?;
        Ok(Experiment {
            input,
            seed: self.seed.unwrap_or(TORCH_DEFAULT_SEED),
            reseed: self.reseed,
            skip_draws: self.skip_draws,
            weights,
            causal: self.causal,
            window: self.window,
            mask_padding: self.mask_padding,
            softmax_axis: self.softmax_dim,
            scale: self.scale,
        })
    }

    /// The source of `x`: `input`, `sentence` or `tokens` (at most one is given).
    fn take_input(&mut self) -> Result<Input> {
        let spelling = self.spelling;
        let arg = |field: &str| spelling.arg(field);
        if let Some(a) = self.input.take() {
            let x = match a.ndim() {
                2 => a.insert_axis(Axis(0)),
                3 => a,
                _ => {
                    return Err(Error::shape(format!(
                        "{} must be [T, d_in] or [B, T, d_in], got shape {:?}",
                        arg("input"),
                        a.shape()
                    )))
                }
            };
            let x: Array3<f32> = x.into_dimensionality().expect("rank 3 by construction");
            return Ok(Input::Array(x));
        }
        let embed_dim = || {
            self.embed_dim.filter(|&d| d > 0).ok_or_else(|| {
                Error::value(format!(
                    "{} (at least 1) is needed with {} or {}",
                    arg("embed_dim"),
                    arg("sentence"),
                    arg("tokens")
                ))
            })
        };
        if let Some(text) = self.sentence.take() {
            return Ok(Input::Sentence {
                text,
                embed_dim: embed_dim()?,
            });
        }
        let Some(ids) = &self.tokens else {
            return Err(Error::value(match self.spelling {
                Spelling::Flags => "no input: give one of --input, --sentence, --tokens, --trained with --digits, or --model with a sentence",
                Spelling::Keywords => "no input: give one of input, sentence, tokens, or model with text",
            }));
        };
        let vocab_size = self.vocab_size.ok_or_else(|| {
            Error::value(format!("{} needs {}", arg("tokens"), arg("vocab_size")))
        })?;
        if let Some(&bad) = ids
            .iter()
            .find(|&&id| id < 0 || id as u64 >= vocab_size as u64)
        {
            return Err(Error::value(format!(
                "{}: id {bad} is out of range for {} {vocab_size}",
                arg("tokens"),
                arg("vocab_size")
            )));
        }
        Ok(Input::Tokens {
            ids: ids.mapv(|id| id as usize),
            vocab_size,
            embed_dim: embed_dim()?,
            padding_idx: self.padding_idx,
        })
    }

    /// The weights: given as `wq`, `wk` and `wv`, or created as `init` says.
    fn take_weights(&mut self, input: &Input) -> Result<Weights> {
        let arg = |field: &str| self.spelling.arg(field);
        let d_in = input.width();
        match (self.wq.take(), self.wk.take(), self.wv.take()) {
            (Some(q), Some(k), Some(v)) => Ok(Weights::Given {
                w_q: given(&arg("wq"), q, d_in)?,
                w_k: given(&arg("wk"), k, d_in)?,
                w_v: given(&arg("wv"), v, d_in)?,
                heads: self.heads,
            }),
            (None, None, None) => {
                // `d_out` sets both widths; else `d_k`, and `d_v`, which defaults
                // to `d_k`; each defaults to the input's width.
                let d_k = self.d_out.or(self.d_k).unwrap_or(d_in);
                let d_v = self.d_out.or(self.d_v).or(self.d_k).unwrap_or(d_in);
                Ok(Weights::Init(AttentionSpec {
                    d_in,
                    d_k,
                    d_v,
                    heads: self.heads,
                    bias: self.bias || self.init == WeightInit::TorchMha,
                    out_proj: self.out_proj,
                    init: self.init,
                    layout: self.qkv,
                }))
            }
            _ => Err(Error::value(format!(
                "{}, {} and {} go together: give all three",
                arg("wq"),
                arg("wk"),
                arg("wv")
            ))),
        }
    }

    /// The attention of a model trained by `attend train`, on one digit sequence.
    fn trained_experiment(&self, path: &std::path::Path, digits: &str) -> Result<Experiment> {
        let arg = |field: &str| self.spelling.arg(field);
        let model = crate::train::load(path)?;
        let ids: Vec<usize> = digits
            .chars()
            .map(|c| {
                c.to_digit(10).map(|d| d as usize).ok_or_else(|| {
                    Error::value(format!(
                        "{}: '{c}' is not a digit (in {digits:?})",
                        arg("digits")
                    ))
                })
            })
            .collect::<Result<_>>()?;
        if ids.len() != model.len() {
            return Err(Error::shape(format!(
                "{} has {} digits but the model in {} was trained on {}",
                arg("digits"),
                ids.len(),
                path.display(),
                model.len()
            )));
        }
        let ids = Array2::from_shape_vec((1, ids.len()), ids).expect("one row");
        Ok(Experiment {
            input: Input::Labelled {
                x: model.embed(ids.view())?,
                labels: digits.chars().map(String::from).collect(),
            },
            seed: TORCH_DEFAULT_SEED,
            reseed: None,
            skip_draws: 0,
            weights: Weights::Module(Box::new(model.attention)),
            causal: false,
            window: None,
            mask_padding: false,
            softmax_axis: SoftmaxAxis::Keys,
            scale: None,
        })
    }
}

/// A given weight `[d_in, width]`, whose `d_in` must be the input's width.
fn given(name: &str, w: ArrayD<f32>, d_in: usize) -> Result<Array2<f32>> {
    let shape = w.shape().to_vec();
    let w: Array2<f32> = w.into_dimensionality().map_err(|_| {
        Error::shape(format!(
            "{name} must be a matrix [d_in, width], got shape {shape:?}"
        ))
    })?;
    if w.nrows() != d_in {
        return Err(Error::shape(format!(
            "{name} of shape {:?} must have d_in = {d_in} rows to match the input's width",
            w.shape()
        )));
    }
    Ok(w)
}

/// A choice among named values (`--init torch-mha`, `init="torch-mha"`): the one
/// table of names behind both front ends' parsing, help and errors.
///
/// ```
/// use attend_core::nn::initialisers::WeightInit;
/// use attend_explain::experiment::Named;
///
/// assert_eq!(WeightInit::from_name("torch-mha"), Some(WeightInit::TorchMha));
/// assert_eq!(WeightInit::TorchMha.name(), "torch-mha");
/// let err = WeightInit::parse("init", "xavier").unwrap_err();
/// assert!(err.to_string().contains("init must be one of linear, uniform-in-out"));
/// ```
pub trait Named: Copy + 'static {
    /// Every value, in the order help lists them.
    const ALL: &'static [Self];

    /// The value's name.
    fn name(self) -> &'static str;

    /// The value named `name`, if any.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }

    /// The value named `name`, or an error naming the argument `arg` and listing
    /// the names.
    fn parse(arg: &str, name: &str) -> Result<Self> {
        Self::from_name(name).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
            Error::value(format!(
                "{arg} must be one of {}, got {name:?}",
                names.join(", ")
            ))
        })
    }
}

impl Named for WeightInit {
    const ALL: &'static [Self] = &[
        WeightInit::Linear,
        WeightInit::UniformInOut,
        WeightInit::UniformOutIn,
        WeightInit::TorchMha,
    ];

    fn name(self) -> &'static str {
        match self {
            WeightInit::Linear => "linear",
            WeightInit::UniformInOut => "uniform-in-out",
            WeightInit::UniformOutIn => "uniform-out-in",
            WeightInit::TorchMha => "torch-mha",
        }
    }
}

impl Named for QkvLayout {
    const ALL: &'static [Self] = &[
        QkvLayout::Separate,
        QkvLayout::Fused,
        QkvLayout::FusedInterleaved,
        QkvLayout::PerHead,
    ];

    fn name(self) -> &'static str {
        match self {
            QkvLayout::Separate => "separate",
            QkvLayout::Fused => "fused",
            QkvLayout::FusedInterleaved => "fused-interleaved",
            QkvLayout::PerHead => "per-head",
        }
    }
}

impl Named for SoftmaxAxis {
    const ALL: &'static [Self] = &[SoftmaxAxis::Keys, SoftmaxAxis::Queries];

    fn name(self) -> &'static str {
        match self {
            SoftmaxAxis::Keys => "keys",
            SoftmaxAxis::Queries => "queries",
        }
    }
}
