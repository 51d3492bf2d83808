//! `attend train`: trains a small attention model to reverse digit sequences, with a
//! progress bar and running loss; writes the loss curve (SVG) and the weights
//! (safetensors, tensor names in `attend::train`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use attend::train::{evaluate, loss_curve_svg, save, train, TrainConfig, EVAL_SEQUENCES};
use attend::Error;

use crate::args::flags;
use crate::io::console::{err, errln, outln};
use crate::io::outputs::Outputs;

/// Flags of `attend train`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Digits per sequence.
    #[arg(long, default_value_t = 8, value_parser = flags::positive)]
    len: usize,
    /// Model width.
    #[arg(long, default_value_t = 32, value_parser = flags::positive)]
    d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 2, value_parser = flags::positive)]
    heads: usize,
    /// Optimiser steps (1 to 10 million).
    #[arg(long, default_value_t = 600, value_parser = flags::steps)]
    steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 64, value_parser = flags::positive)]
    batch: usize,
    /// AdamW learning rate (positive).
    #[arg(long, default_value_t = 3e-3, allow_hyphen_values = true)]
    lr: f64,
    /// Dropout probability on the attention weights, in [0, 1).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    dropout: f32,
    /// Seed of the weights and the training data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2, value_parser = flags::threads)]
    threads: usize,
    /// Where to write the trained weights.
    #[arg(long, default_value = "reverser.safetensors")]
    weights: PathBuf,
    /// Where to write the loss curve, an SVG picture (FILE.svg).
    #[arg(long, default_value = "loss.svg")]
    curve: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Runs `attend train`.
pub fn run(args: Args) -> Result<(), Error> {
    if args.lr.is_nan() || args.lr <= 0.0 || !args.lr.is_finite() {
        return Err(Error::value(format!(
            "--lr must be a positive finite number, got {}",
            args.lr
        )));
    }
    if !(0.0..1.0).contains(&args.dropout) {
        return Err(Error::value(format!(
            "--dropout must be in [0, 1), got {}",
            args.dropout
        )));
    }
    let outputs = Outputs::new(&[
        ("--weights", Some(&args.weights)),
        ("--curve", Some(&args.curve)),
    ])?;
    let svg = args
        .curve
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if !svg {
        return Err(Error::value(format!(
            "--curve {}: the loss curve is an SVG picture; name a .svg file",
            args.curve.display()
        )));
    }
    let config = TrainConfig {
        len: args.len,
        d_model: args.d_model,
        heads: args.heads,
        steps: args.steps,
        batch: args.batch,
        lr: args.lr,
        dropout: args.dropout,
        seed: args.seed,
    };
    let pool = attend::threads::pool(args.threads)?;
    let start = Instant::now();
    let mut running = None::<f32>;
    let steps = args.steps;
    let quiet = args.quiet;
    let (model, losses) = pool.install(|| {
        train(&config, |step, loss| {
            let r = running.map_or(loss, |r| 0.95 * r + 0.05 * loss);
            running = Some(r);
            if !quiet && (step % 10 == 0 || step + 1 == steps) {
                let filled = (step + 1) * 30 / steps;
                err!(
                    "\r[{}{}] {:>5}/{steps}  loss {r:.4}  {:.1}s",
                    "#".repeat(filled),
                    ".".repeat(30 - filled),
                    step + 1,
                    start.elapsed().as_secs_f64()
                );
                let _ = std::io::stderr().flush();
            }
        })
    })?;
    let train_secs = start.elapsed().as_secs_f64();
    if !quiet {
        errln!();
    }
    let (digit, sequence) = evaluate(&model, EVAL_SEQUENCES, args.seed ^ 0xA11CE)?;
    outputs.write("--weights", |path| save(&model, path))?;
    let title = format!(
        "attend train: reverse {} digits, held-out accuracy {:.1}%",
        args.len,
        digit * 100.0
    );
    outputs.write("--curve", |path| {
        std::fs::write(path, loss_curve_svg(&losses, &title)).map_err(|e| Error::io(path, e))
    })?;
    outputs.commit()?;
    outln!(
        "trained {steps} steps in {train_secs:.1}s on {} threads; final loss {:.4}",
        args.threads,
        losses.last().copied().unwrap_or(f32::NAN)
    )?;
    outln!(
        "held-out accuracy: {:.2}% of digits, {:.2}% of whole sequences ({EVAL_SEQUENCES} new sequences)",
        digit * 100.0,
        sequence * 100.0
    )?;
    outln!(
        "wrote {} and {}",
        args.weights.display(),
        args.curve.display()
    )?;
    Ok(())
}
