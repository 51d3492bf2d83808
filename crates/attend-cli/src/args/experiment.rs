//! The flags that describe a notebook experiment, mapped onto an
//! [`ExperimentSpec`]: the library applies the rules, these flags only parse text.

use attend::attention::SoftmaxAxis;
use attend::experiment::{Experiment, ExperimentSpec, Named, Spelling};
use attend::nn::initialisers::{QkvLayout, WeightInit};
use attend::Error;
use clap::ArgGroup;
use ndarray::Array2;

use crate::args::flags;
use crate::io::json_input::parse_array;

/// The flags that describe a notebook experiment (the names are a contract; see
/// docs/cli.md). Shared by `explain` and `view`.
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
    #[arg(long, value_name = "N", default_value_t = ExperimentSpec::default().skip_draws,
          value_parser = flags::skip_draws)]
    skip_draws: u64,
    /// How the weights are created.
    #[arg(long, value_parser = flags::named::<WeightInit>(),
          default_value = ExperimentSpec::default().init.name(), conflicts_with = "wq")]
    init: WeightInit,
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
    #[arg(long, value_name = "H", default_value_t = ExperimentSpec::default().heads,
          value_parser = flags::positive)]
    heads: usize,
    /// How q, k and v projections are packed.
    #[arg(long, value_parser = flags::named::<QkvLayout>(),
          default_value = ExperimentSpec::default().qkv.name())]
    qkv: QkvLayout,
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
    #[arg(long, value_name = "LEFT,RIGHT", value_parser = flags::window)]
    window: Option<(usize, usize)>,
    /// Mask keys whose token id is --padding-idx.
    #[arg(long, requires = "padding_idx")]
    mask_padding: bool,
    /// The axis the softmax normalises.
    #[arg(long, value_parser = flags::named::<SoftmaxAxis>(),
          default_value = ExperimentSpec::default().softmax_dim.name())]
    softmax_dim: SoftmaxAxis,
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
    let json = |flag: &str, text: &Option<String>| text.as_deref().map(|t| parse_array(flag, t));
    ExperimentSpec {
        input: json("--input", &args.input).transpose()?,
        sentence: args.sentence.clone(),
        tokens: args.tokens.as_deref().map(parse_tokens).transpose()?,
        trained: args.trained.clone(),
        digits: args.digits.clone(),
        vocab_size: args.vocab_size,
        embed_dim: args.embed_dim,
        padding_idx: args.padding_idx,
        seed: args.seed,
        reseed: args.reseed,
        skip_draws: args.skip_draws,
        init: args.init,
        wq: json("--wq", &args.wq).transpose()?,
        wk: json("--wk", &args.wk).transpose()?,
        wv: json("--wv", &args.wv).transpose()?,
        d_out: args.d_out,
        d_k: args.d_k,
        d_v: args.d_v,
        heads: args.heads,
        qkv: args.qkv,
        bias: args.bias,
        out_proj: args.out_proj,
        causal: args.causal,
        window: args.window,
        mask_padding: args.mask_padding,
        softmax_dim: args.softmax_dim,
        scale: args.scale,
        spelling: Spelling::Flags,
    }
    .build()
}

/// `"1,2,0,0;1,2,3,4"` → `[[1, 2, 0, 0], [1, 2, 3, 4]]` (the library checks the
/// ids against `--vocab-size`).
fn parse_tokens(text: &str) -> Result<Array2<i64>, Error> {
    let rows: Vec<Vec<i64>> = text
        .split(';')
        .map(|row| {
            row.split(',')
                .map(|t| {
                    let t = t.trim();
                    t.parse::<i64>()
                        .map_err(|_| Error::value(format!("--tokens: '{t}' is not an integer id")))
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
    let b = rows.len();
    Array2::from_shape_vec((b, width), rows.concat())
        .map_err(|e| Error::shape(format!("--tokens: {e}")))
}
