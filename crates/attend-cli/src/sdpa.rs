//! `attend sdpa`: scaled dot-product attention on `.npy` files, with PyTorch
//! `scaled_dot_product_attention`'s shapes.

use std::path::PathBuf;

use attend::attention::{attention_backward_with, BackwardConfig};
use attend::attention::{attention_with, AttentionOptions, Causal, Config};
use attend::io::npy::{self, NpyArray};
use attend::Error;
use ndarray::{Array4, ArrayD, Ix4};

use crate::flags;
use crate::outputs::Outputs;

/// Flags of `attend sdpa`.
#[derive(clap::Args)]
pub struct Args {
    /// Queries, f32 `[B, Hq, L, E]`.
    #[arg(long)]
    q: PathBuf,
    /// Keys, f32 `[B, Hkv, S, E]`.
    #[arg(long)]
    k: PathBuf,
    /// Values, f32 `[B, Hkv, S, Ev]`.
    #[arg(long)]
    v: PathBuf,
    /// Mask broadcastable to `[B, Hq, L, S]`: boolean (true = attend) or f32 (added
    /// to the scaled scores).
    #[arg(long)]
    mask: Option<PathBuf>,
    /// Causal masking: `top-left` (PyTorch's is_causal) or `bottom-right`.
    #[arg(long, value_name = "ALIGN")]
    causal: Option<String>,
    /// Sliding window `LEFT,RIGHT` (keys each query sees on either side).
    #[arg(long, value_name = "L,R", allow_hyphen_values = true)]
    window: Option<String>,
    /// Score scale (default 1/√E).
    #[arg(long, allow_hyphen_values = true, value_parser = flags::finite_f32)]
    scale: Option<f32>,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = flags::threads)]
    threads: Option<usize>,
    /// Output `[B, Hq, L, Ev]`.
    #[arg(long)]
    out: PathBuf,
    /// Optional log-sum-exp output `[B, Hq, L]`.
    #[arg(long)]
    lse: Option<PathBuf>,
    /// Gradient of the loss with respect to the output, f32 `[B, Hq, L, Ev]`;
    /// with it, --dq, --dk and --dv receive the gradients (fused backward).
    #[arg(long, requires_all = ["dq", "dk", "dv"])]
    dout: Option<PathBuf>,
    /// Where to write ∂loss/∂q `[B, Hq, L, E]`.
    #[arg(long, requires = "dout")]
    dq: Option<PathBuf>,
    /// Where to write ∂loss/∂k `[B, Hkv, S, E]`.
    #[arg(long, requires = "dout")]
    dk: Option<PathBuf>,
    /// Where to write ∂loss/∂v `[B, Hkv, S, Ev]`.
    #[arg(long, requires = "dout")]
    dv: Option<PathBuf>,
}

fn rank4(name: &str, what: &str, a: ArrayD<f32>) -> Result<Array4<f32>, Error> {
    let shape = a.shape().to_vec();
    a.into_dimensionality::<Ix4>().map_err(|_| {
        Error::shape(format!(
            "{name}: expected a 4-D array {what}, got shape {shape:?}"
        ))
    })
}

/// Parses `--causal`.
pub fn parse_causal(s: &str) -> Result<Causal, Error> {
    match s {
        "top-left" => Ok(Causal::TopLeft),
        "bottom-right" => Ok(Causal::BottomRight),
        _ => Err(Error::value(format!(
            "--causal must be top-left or bottom-right, got {s:?}"
        ))),
    }
}

/// Parses `--window L,R` (both non-negative integers).
pub fn parse_window(s: &str) -> Result<(usize, usize), Error> {
    let bad = || {
        Error::value(format!(
            "--window must be two non-negative integers LEFT,RIGHT, got {s:?}"
        ))
    };
    let (l, r) = s.split_once(',').ok_or_else(bad)?;
    let l = l.trim().parse::<usize>().map_err(|_| bad())?;
    let r = r.trim().parse::<usize>().map_err(|_| bad())?;
    Ok((l, r))
}

/// Runs `attend sdpa`.
pub fn run(args: Args) -> Result<(), Error> {
    let outputs = Outputs::new(&[
        ("--out", Some(&args.out)),
        ("--lse", args.lse.as_deref()),
        ("--dq", args.dq.as_deref()),
        ("--dk", args.dk.as_deref()),
        ("--dv", args.dv.as_deref()),
    ])?;
    let causal = args.causal.as_deref().map(parse_causal).transpose()?;
    let window = args.window.as_deref().map(parse_window).transpose()?;
    let q = rank4("q", "[B, Hq, L, E]", npy::read_f32(&args.q)?)?;
    let k = rank4("k", "[B, Hkv, S, E]", npy::read_f32(&args.k)?)?;
    let v = rank4("v", "[B, Hkv, S, Ev]", npy::read_f32(&args.v)?)?;
    let mask = args.mask.as_ref().map(npy::read).transpose()?;
    let mut opts = AttentionOptions {
        scale: args.scale,
        causal,
        window,
        ..Default::default()
    };
    match &mask {
        Some(NpyArray::Bool(m)) => opts.mask = Some(m.view()),
        Some(NpyArray::F32(m)) => opts.bias = Some(m.view()),
        None => {}
    }
    let config = Config {
        threads: args.threads,
        ..Default::default()
    };
    let dout = args
        .dout
        .as_ref()
        .map(|p| npy::read_f32(p).and_then(|a| rank4("--dout", "[B, Hq, L, Ev]", a)))
        .transpose()?;
    let (out, lse) = attention_with(q.view(), k.view(), v.view(), &opts, &config)?;
    if let Some(dout) = &dout {
        if dout.shape() != out.shape() {
            return Err(Error::shape(format!(
                "--dout of shape {:?} must have the output's shape {:?}",
                dout.shape(),
                out.shape()
            )));
        }
        let bconfig = BackwardConfig {
            threads: args.threads,
            ..Default::default()
        };
        let g = attention_backward_with(
            q.view(),
            k.view(),
            v.view(),
            out.view(),
            lse.view(),
            dout.view(),
            &opts,
            &bconfig,
        )?;
        for (flag, grad) in [("--dq", g.dq), ("--dk", g.dk), ("--dv", g.dv)] {
            outputs.write(flag, |path| npy::write_f32(path, grad.into_dyn().view()))?;
        }
    }
    outputs.write("--out", |path| npy::write_f32(path, out.into_dyn().view()))?;
    outputs.write("--lse", |path| npy::write_f32(path, lse.into_dyn().view()))?;
    outputs.commit()
}
