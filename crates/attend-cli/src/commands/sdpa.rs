//! `attend sdpa`: scaled dot-product attention on `.npy` files, with PyTorch
//! `scaled_dot_product_attention`'s shapes.
//!
//! With `--dtype bf16` the float32 inputs are rounded to bfloat16 as PyTorch's
//! `tensor.to(torch.bfloat16)` rounds them (to nearest, ties to even), attention runs
//! on bf16 tensors, and the bf16 results are written widened to float32 (exactly:
//! NumPy has no bfloat16). The log-sum-exp stays the kernel's f32, as PyTorch's bf16
//! SDPA keeps it in its f32 accumulation type.

use std::path::PathBuf;

use attend::attention::{attention_backward_with, BackwardConfig, Exec, Saved};
use attend::attention::{attention_with_lse_parts, AttentionOptions, Causal, Config, LogSumExp};
use attend::element::{bf16, from_f32, round_to_bf16, to_f32, Dtype};
use attend::io::npy::{self, NpyArray};
use attend::Error;
use ndarray::{Array4, ArrayD, Ix4};

use crate::args::flags;
use crate::io::outputs::Outputs;

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
    #[arg(long, value_name = "ALIGN", value_parser = flags::causal)]
    causal: Option<Causal>,
    /// Sliding window `LEFT,RIGHT` (keys each query sees on either side).
    #[arg(long, value_name = "L,R", allow_hyphen_values = true, value_parser = flags::window)]
    window: Option<(usize, usize)>,
    /// Score scale (default 1/√E).
    #[arg(long, allow_hyphen_values = true, value_parser = flags::finite_f32)]
    scale: Option<f32>,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = flags::threads)]
    threads: Option<usize>,
    /// Element type of the computation: `f32`, or `bf16` (q, k, v, a float mask and
    /// --dout rounded to bfloat16; results written as float32 holding bf16 values).
    #[arg(long, default_value = "f32", value_parser = flags::dtype)]
    dtype: Dtype,
    /// Output `[B, Hq, L, Ev]`.
    #[arg(long)]
    out: PathBuf,
    /// Optional log-sum-exp output `[B, Hq, L]`.
    #[arg(long)]
    lse: Option<PathBuf>,
    /// Gradient of the loss with respect to the output, f32 `[B, Hq, L, Ev]`;
    /// with it, --dq, --dk and --dv receive the gradients (fused backward). With
    /// `--dtype bf16` the backward runs in f32 on the bf16 values (the library has no
    /// bf16 backward yet) and the gradients are rounded to bf16.
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

/// Runs `attend sdpa`.
pub fn run(args: Args) -> Result<(), Error> {
    let outputs = Outputs::new(&[
        ("--out", Some(&args.out)),
        ("--lse", args.lse.as_deref()),
        ("--dq", args.dq.as_deref()),
        ("--dk", args.dk.as_deref()),
        ("--dv", args.dv.as_deref()),
    ])?;
    let (causal, window) = (args.causal, args.window);
    let bf16 = args.dtype == Dtype::Bf16;
    let read = |path: &PathBuf, name: &str, what: &str| -> Result<Array4<f32>, Error> {
        let a = rank4(name, what, npy::read_f32(path)?)?;
        Ok(if bf16 { round_to_bf16(a.view()) } else { a })
    };
    let q = read(&args.q, "q", "[B, Hq, L, E]")?;
    let k = read(&args.k, "k", "[B, Hkv, S, E]")?;
    let v = read(&args.v, "v", "[B, Hkv, S, Ev]")?;
    let mask = match args.mask.as_ref().map(npy::read).transpose()? {
        Some(NpyArray::F32(m)) if bf16 => Some(NpyArray::F32(round_to_bf16(m.view()))),
        other => other,
    };
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
        exec: Exec {
            threads: args.threads,
            ..Default::default()
        },
        ..Default::default()
    };
    let dout = args
        .dout
        .as_ref()
        .map(|p| read(p, "--dout", "[B, Hq, L, Ev]"))
        .transpose()?;
    let (out, lse) = forward(args.dtype, [&q, &k, &v], &opts, &config)?;
    if let Some(dout) = &dout {
        if dout.shape() != out.shape() {
            return Err(Error::shape(format!(
                "--dout of shape {:?} must have the output's shape {:?}",
                dout.shape(),
                out.shape()
            )));
        }
        let bconfig = BackwardConfig {
            exec: Exec {
                threads: args.threads,
                ..Default::default()
            },
            ..Default::default()
        };
        let g = attention_backward_with(
            q.view(),
            k.view(),
            v.view(),
            Saved::new(out.view(), lse.value.view()).with_lse_residual(lse.residual.view()),
            dout.view(),
            &opts,
            &bconfig,
        )?;
        // bf16 gradients, as PyTorch returns for bf16 inputs: the f32 backward of
        // the bf16 values, rounded once.
        for (flag, grad) in [("--dq", g.dq), ("--dk", g.dk), ("--dv", g.dv)] {
            let grad = if bf16 {
                round_to_bf16(grad.view())
            } else {
                grad
            };
            outputs.write(flag, |path| npy::write_f32(path, grad.into_dyn().view()))?;
        }
    }
    outputs.write("--out", |path| npy::write_f32(path, out.into_dyn().view()))?;
    outputs.write("--lse", |path| {
        npy::write_f32(path, lse.value.into_dyn().view())
    })?;
    outputs.commit()
}

/// The attention output (as f32) and log-sum-exp (in its two parts) of `q`, `k`, `v`, computed on
/// tensors of `dtype`. For bf16 the inputs already hold bf16 values, so the
/// conversion to bf16 is exact.
fn forward(
    dtype: Dtype,
    [q, k, v]: [&Array4<f32>; 3],
    opts: &AttentionOptions<'_>,
    config: &Config,
) -> Result<(Array4<f32>, LogSumExp), Error> {
    match dtype {
        Dtype::F32 => attention_with_lse_parts(q.view(), k.view(), v.view(), opts, config),
        Dtype::Bf16 => {
            let [q, k, v] = [q, k, v].map(|a| from_f32::<bf16, _>(a.view()));
            let (out, lse) = attention_with_lse_parts(q.view(), k.view(), v.view(), opts, config)?;
            Ok((to_f32(out.view()), lse))
        }
    }
}
