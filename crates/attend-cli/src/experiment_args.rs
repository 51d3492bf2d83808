//! The flags that describe a notebook experiment, turned into an
//! [`attend::experiment::Experiment`].

use attend::attention::SoftmaxAxis;
use attend::experiment::{Experiment, Input, Weights, TORCH_DEFAULT_SEED};
use attend::nn::initialisers::{AttentionSpec, QkvLayout, WeightInit};
use attend::Error;
use clap::{ArgGroup, ValueEnum};
use ndarray::{Array2, Array3};

use crate::flags;
use crate::json_input::parse_array;
use crate::sdpa::parse_window;

/// The flags that describe a notebook experiment (the names are a contract; see
/// the README). Shared by `explain` and `view`.
#[derive(clap::Args, Debug)]
#[command(group(ArgGroup::new("source").args(["input", "sentence", "tokens", "digits"])))]
pub struct ExperimentArgs {
    /// Embeddings as JSON, `[T, d_in]` or `[B, T, d_in]`.
    #[arg(long, value_name = "JSON")]
    input: Option<String>,
    /// A sentence, embedded through its sorted vocabulary (notebook 004).
    #[arg(long, value_name = "TEXT", requires = "embed_dim")]
    sentence: Option<String>,
    /// Token ids, `,` between tokens and `;` between batch rows: "1,2,0,0;1,2,3,4".
    #[arg(long, value_name = "IDS", requires_all = ["vocab_size", "embed_dim"])]
    tokens: Option<String>,
    /// Weights written by `attend train`: explain that model's learned attention.
    #[arg(long, value_name = "FILE", requires = "digits", conflicts_with_all = MODULE_FLAGS)]
    trained: Option<std::path::PathBuf>,
    /// The digit sequence fed to the --trained model, e.g. "31415926".
    #[arg(long, value_name = "DIGITS", requires = "trained")]
    digits: Option<String>,
    /// Rows of the embedding table for --tokens.
    #[arg(long, value_name = "V", value_parser = flags::positive)]
    vocab_size: Option<usize>,
    /// Embedding width for --sentence and --tokens.
    #[arg(long, value_name = "D", value_parser = flags::positive)]
    embed_dim: Option<usize>,
    /// `nn.Embedding`'s padding_idx (negative counts from the end).
    #[arg(
        long,
        value_name = "P",
        allow_hyphen_values = true,
        requires = "tokens"
    )]
    padding_idx: Option<i64>,
    /// `torch.manual_seed` before anything random (default: PyTorch's default seed).
    #[arg(long, value_name = "S", value_parser = parse_seed, allow_hyphen_values = true)]
    seed: Option<u64>,
    /// Seed again after the embedding, before the weights.
    #[arg(long, value_name = "S", value_parser = parse_seed, allow_hyphen_values = true)]
    reseed: Option<u64>,
    /// Consume N 32-bit draws before creating the weights (at most 2^30).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = flags::skip_draws)]
    skip_draws: u64,
    /// How the weights are created.
    #[arg(long, value_enum, default_value = "linear", conflicts_with = "wq")]
    init: InitArg,
    /// Given query weights `[d_in, width]` (q = x @ WQ); their widths decide the
    /// head widths, and there are no biases or output projection.
    #[arg(long, value_name = "JSON", requires_all = ["wk", "wv"],
          conflicts_with_all = ["d_out", "d_k", "d_v", "qkv", "bias", "out_proj"])]
    wq: Option<String>,
    /// Given key weights `[d_in, width]`.
    #[arg(long, value_name = "JSON", requires_all = ["wq", "wv"])]
    wk: Option<String>,
    /// Given value weights `[d_in, width]`.
    #[arg(long, value_name = "JSON", requires_all = ["wq", "wk"])]
    wv: Option<String>,
    /// Total width of q, k and v (all heads); default d_in.
    #[arg(long, value_name = "N", conflicts_with_all = ["d_k", "d_v"], value_parser = flags::positive)]
    d_out: Option<usize>,
    /// Total query/key width.
    #[arg(long, value_name = "N", value_parser = flags::positive)]
    d_k: Option<usize>,
    /// Total value width (default: --d-k).
    #[arg(long, value_name = "N", value_parser = flags::positive)]
    d_v: Option<usize>,
    /// Number of heads.
    #[arg(long, value_name = "H", default_value_t = 1, value_parser = flags::positive)]
    heads: usize,
    /// How q, k and v projections are packed.
    #[arg(long, value_enum, default_value = "separate")]
    qkv: QkvArg,
    /// Projections have biases.
    #[arg(long)]
    bias: bool,
    /// An output `Linear(d_v, d_v)` after the heads.
    #[arg(long)]
    out_proj: bool,
    /// Query i sees keys j ≤ i.
    #[arg(long)]
    causal: bool,
    /// Sliding window LEFT,RIGHT: query i sees keys i − LEFT to i + RIGHT.
    #[arg(long, value_name = "LEFT,RIGHT")]
    window: Option<String>,
    /// Mask keys whose token id is --padding-idx.
    #[arg(long, requires = "padding_idx")]
    mask_padding: bool,
    /// The axis the softmax normalises.
    #[arg(long, value_enum, default_value = "keys")]
    softmax_dim: SoftmaxArg,
    /// Multiply scores by X (default 1/√(key head width)).
    #[arg(long, value_name = "X", allow_hyphen_values = true, value_parser = flags::finite_f32)]
    scale: Option<f32>,
}

/// The flags that build the attention module or shape its computation: a model
/// that comes whole (`--trained`, `--model`) has its own, so these are refused
/// with it rather than ignored.
pub const MODULE_FLAGS: [&str; 18] = [
    "wq",
    "init",
    "d_out",
    "d_k",
    "d_v",
    "heads",
    "qkv",
    "bias",
    "out_proj",
    "causal",
    "window",
    "scale",
    "softmax_dim",
    "seed",
    "reseed",
    "skip_draws",
    "mask_padding",
    "padding_idx",
];

#[derive(Clone, Copy, Debug, ValueEnum)]
enum InitArg {
    Linear,
    UniformInOut,
    UniformOutIn,
    TorchMha,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum QkvArg {
    Separate,
    Fused,
    FusedInterleaved,
    PerHead,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum SoftmaxArg {
    Keys,
    Queries,
}

/// A seed as `torch.manual_seed` takes it: any integer in [-2⁶³, 2⁶⁴−1].
fn parse_seed(s: &str) -> Result<u64, String> {
    let n: i128 = s.parse().map_err(|_| format!("'{s}' is not an integer"))?;
    if n < i64::MIN as i128 || n > u64::MAX as i128 {
        return Err(format!("{n} is outside [-2^63, 2^64-1]"));
    }
    Ok(n as u64)
}

/// The experiment the flags describe.
pub fn experiment(args: &ExperimentArgs) -> Result<Experiment, Error> {
    if let (Some(path), Some(digits)) = (&args.trained, &args.digits) {
        return trained_experiment(path, digits);
    }
    let input = input(args)?;
    let weights = match (&args.wq, &args.wk, &args.wv) {
        (Some(q), Some(k), Some(v)) => Weights::Given {
            w_q: given_weight("--wq", q, &input)?,
            w_k: given_weight("--wk", k, &input)?,
            w_v: given_weight("--wv", v, &input)?,
            heads: args.heads,
        },
        _ => {
            let d_in = input.width();
            let (d_k, d_v) = attend::experiment::widths(d_in, args.d_out, args.d_k, args.d_v);
            Weights::Init(AttentionSpec {
                d_in,
                d_k,
                d_v,
                heads: args.heads,
                bias: args.bias || matches!(args.init, InitArg::TorchMha),
                out_proj: args.out_proj,
                init: match args.init {
                    InitArg::Linear => WeightInit::Linear,
                    InitArg::UniformInOut => WeightInit::UniformInOut,
                    InitArg::UniformOutIn => WeightInit::UniformOutIn,
                    InitArg::TorchMha => WeightInit::TorchMha,
                },
                layout: match args.qkv {
                    QkvArg::Separate => QkvLayout::Separate,
                    QkvArg::Fused => QkvLayout::Fused,
                    QkvArg::FusedInterleaved => QkvLayout::FusedInterleaved,
                    QkvArg::PerHead => QkvLayout::PerHead,
                },
            })
        }
    };
    Ok(Experiment {
        input,
        seed: args.seed.unwrap_or(TORCH_DEFAULT_SEED),
        reseed: args.reseed,
        skip_draws: args.skip_draws,
        weights,
        causal: args.causal,
        window: args.window.as_deref().map(parse_window).transpose()?,
        mask_padding: args.mask_padding,
        softmax_axis: match args.softmax_dim {
            SoftmaxArg::Keys => SoftmaxAxis::Keys,
            SoftmaxArg::Queries => SoftmaxAxis::Queries,
        },
        scale: args.scale,
    })
}

fn input(args: &ExperimentArgs) -> Result<Input, Error> {
    if let Some(text) = &args.input {
        let a = parse_array("--input", text)?;
        let x: Array3<f32> = match a.ndim() {
            2 => a
                .insert_axis(ndarray::Axis(0))
                .into_dimensionality()
                .expect("rank 3"),
            3 => a.into_dimensionality().expect("rank 3"),
            _ => {
                return Err(Error::shape(format!(
                    "--input must be [T, d_in] or [B, T, d_in], got shape {:?}",
                    a.shape()
                )))
            }
        };
        return Ok(Input::Array(x));
    }
    if args.sentence.is_none() && args.tokens.is_none() {
        return Err(Error::value(
            "no input: give one of --input, --sentence, --tokens, --trained with --digits, or --model with a sentence",
        ));
    }
    let embed_dim = args.embed_dim.expect("clap requires --embed-dim");
    if embed_dim == 0 {
        return Err(Error::value("--embed-dim must be at least 1"));
    }
    if let Some(text) = &args.sentence {
        return Ok(Input::Sentence {
            text: text.clone(),
            embed_dim,
        });
    }
    let tokens = args.tokens.as_deref().expect("clap requires one input");
    let vocab_size = args.vocab_size.expect("clap requires --vocab-size");
    Ok(Input::Tokens {
        ids: parse_tokens(tokens, vocab_size)?,
        vocab_size,
        embed_dim,
        padding_idx: args.padding_idx,
    })
}

/// `"1,2,0,0;1,2,3,4"` → `[[1, 2, 0, 0], [1, 2, 3, 4]]`.
fn parse_tokens(text: &str, vocab_size: usize) -> Result<Array2<usize>, Error> {
    let rows: Vec<Vec<usize>> = text
        .split(';')
        .map(|row| {
            row.split(',')
                .map(|t| {
                    let t = t.trim();
                    t.parse::<usize>().map_err(|_| {
                        Error::value(format!("--tokens: '{t}' is not a non-negative integer id"))
                    })
                })
                .collect()
        })
        .collect::<Result<_, _>>()?;
    let width = rows[0].len();
    if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != width) {
        return Err(Error::shape(format!(
            "--tokens rows differ in length: row 0 has {width} ids, row {i} has {}",
            r.len()
        )));
    }
    if let Some(&id) = rows.iter().flatten().find(|&&id| id >= vocab_size) {
        return Err(Error::value(format!(
            "--tokens: id {id} is out of range for --vocab-size {vocab_size}"
        )));
    }
    let b = rows.len();
    Array2::from_shape_vec((b, width), rows.concat())
        .map_err(|e| Error::shape(format!("--tokens: {e}")))
}

/// A given weight `[d_in, width]`, whose `d_in` must be the input's width.
fn given_weight(flag: &str, text: &str, input: &Input) -> Result<Array2<f32>, Error> {
    let a = parse_array(flag, text)?;
    let shape = a.shape().to_vec();
    let w: Array2<f32> = a.into_dimensionality().map_err(|_| {
        Error::shape(format!(
            "{flag} must be a matrix [d_in, width], got shape {shape:?}"
        ))
    })?;
    attend::experiment::check_given_weight(flag, &w, input)?;
    Ok(w)
}

/// The attention of a model trained by `attend train`, on one digit sequence.
fn trained_experiment(path: &std::path::Path, digits: &str) -> Result<Experiment, Error> {
    let model = attend::train::load(path)?;
    let ids: Vec<usize> = digits
        .chars()
        .map(|c| {
            c.to_digit(10).map(|d| d as usize).ok_or_else(|| {
                Error::value(format!("--digits: '{c}' is not a digit (in {digits:?})"))
            })
        })
        .collect::<Result<_, _>>()?;
    if ids.len() != model.len() {
        return Err(Error::shape(format!(
            "--digits has {} digits but the model in {} was trained on {}",
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
