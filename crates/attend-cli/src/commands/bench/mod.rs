//! `attend bench`: times the attention forward on random inputs, with the same
//! flags, timing rule and FLOP count as `scripts/bench/py/torch_sdpa.py`, so the two
//! can be run side by side and compared as a ratio.
//!
//! `--dtype bf16` times the forward on bf16 tensors (`torch_sdpa.py --dtype bf16`'s
//! pair); with `--backward`, the bf16 forward and then the library's bf16 backward
//! (the f32 backward of the bf16 numbers, widened as it reads them, its gradients
//! rounded to bf16). The output names the instruction set that ran: only
//! `avx512bf16` multiplies bf16 pairs with `vdpbf16ps`; elsewhere the inputs are
//! widened to f32 and the f32 kernel runs.

use attend::attention::{attention_backward_with, BackwardConfig, BackwardKernel, Exec, Saved};
use attend::attention::{
    attention_with, attention_with_lse_parts, AttentionOptions, Causal, Config, Kernel,
};
use attend::element::{bf16, from_f32, Dtype};
use attend::kernels::Isa;
use attend::timing::median_seconds;
use attend::{limits, Error};
use ndarray::{Array2, Array4};

use crate::args::flags;
use crate::io::console::outln;

mod decode;

/// Flags of `attend bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Batch size B.
    #[arg(long, default_value_t = 1, value_parser = flags::positive)]
    batch: usize,
    /// Query heads H.
    #[arg(long, default_value_t = 8, value_parser = flags::positive)]
    heads: usize,
    /// Key/value heads (default: H).
    #[arg(long, value_parser = flags::positive)]
    kv_heads: Option<usize>,
    /// Query length L (not with --decode: a decode step has one query token).
    #[arg(long, default_value_t = 2048, value_parser = flags::positive, conflicts_with = "decode")]
    seq: usize,
    /// Key length S (default: L).
    #[arg(long, value_parser = flags::positive)]
    kv_len: Option<usize>,
    /// Head width E (= Ev).
    #[arg(long, default_value_t = 64, value_parser = flags::positive)]
    head_dim: usize,
    /// Top-left causal mask (PyTorch's is_causal).
    #[arg(long)]
    causal: bool,
    /// A per-score mask `[L, S]`, broadcast over batch and heads: `bool` (every
    /// tenth score dropped) or `additive` (a bias on every score).
    #[arg(long, value_enum, conflicts_with = "decode")]
    mask: Option<MaskKind>,
    /// Worker threads.
    #[arg(long, default_value_t = 2, value_parser = flags::threads)]
    threads: usize,
    /// Instruction set: amx, avx512bf16, avx512, avx2vnni, avx2 or portable (default:
    /// the best available).
    #[arg(long, value_parser = flags::isa)]
    isa: Option<Isa>,
    /// Element type: f32 or bf16 (the forward on bf16 tensors: bf16 products, f32
    /// accumulation); with --decode, the type of the cached keys and values (the
    /// query stays f32).
    #[arg(long, default_value = "f32", value_parser = flags::dtype)]
    dtype: Dtype,
    /// Decoding: one query token against --kv-len cached keys (default 4096), like
    /// `torch_sdpa.py --decode`; reports `gbps` (K and V bytes read once per call)
    /// and the machine's read bandwidth measured in the same run (calls run back to
    /// back, so a cache that fits in the last-level cache is read from there and
    /// can exceed it).
    #[arg(long, conflicts_with_all = ["backward", "causal", "reference"])]
    decode: bool,
    /// Time forward + backward (dQ, dK, dV from a random dO), like
    /// `torch_sdpa.py --backward`; with `--dtype bf16`, dO and the gradients are
    /// bf16 too.
    #[arg(long)]
    backward: bool,
    /// Run the f64 reference instead of the fused kernel.
    #[arg(long)]
    reference: bool,
    /// Minimum timed runs (1 to a million).
    #[arg(long, default_value_t = 5, value_parser = flags::runs)]
    min_runs: usize,
    /// Minimum total timed seconds (0 to 3600).
    #[arg(long, default_value_t = 0.5, value_parser = flags::seconds)]
    min_time: f64,
    /// Output format: json (one line) or text.
    #[arg(long, default_value = "json")]
    format: String,
}

/// `--mask`: the per-score mask a run makes, as `scripts/bench/py/torch_sdpa.py
/// --mask` makes PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum MaskKind {
    /// Every tenth score dropped: `(7i + 13j) mod 10 = 0`.
    Bool,
    /// A bias on every score: `-0.25 · ((i + j) mod 5)`.
    Additive,
}

impl MaskKind {
    /// The flag value naming the mask, as the JSON record spells it.
    fn name(self) -> &'static str {
        match self {
            MaskKind::Bool => "bool",
            MaskKind::Additive => "additive",
        }
    }
}

/// How `--dtype` is spelt in the JSON record (as `torch_sdpa.py` spells it).
fn dtype_flag(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F32 => "f32",
        Dtype::Bf16 => "bf16",
    }
}

/// Fills an array with a cheap deterministic pseudo-normal sequence.
fn random(shape: (usize, usize, usize, usize), seed: u64) -> Array4<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Array4::from_shape_simple_fn(shape, || {
        let mut s = 0.0f32;
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s += (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        }
        s * 0.866
    })
}

/// The bytes a run needs: inputs, outputs, the mask asked for, gradients with
/// `--backward`, and the scores the f64 reference materialises with `--reference`.
/// Counted in `u128` so that no flag value can wrap it.
fn needed_bytes(args: &Args) -> u128 {
    let (b, h, e) = (args.batch, args.heads, args.head_dim);
    let hkv = args.kv_heads.unwrap_or(h);
    let (l, s) = (args.seq, args.kv_len.unwrap_or(args.seq));
    let bytes = limits::array_bytes;
    if args.decode {
        // One query row; K and V, and a bandwidth probe buffer at least as large.
        let kv = bytes(&[b, hkv, args.kv_len.unwrap_or(4096), e], 4).saturating_mul(2);
        return bytes(&[b, h, e], 8).saturating_add(kv.saturating_mul(2));
    }
    let q_like = bytes(&[b, h, l, e], 4); // q, the output; dout and dq in backward
    let kv_like = bytes(&[b, hkv, s, e], 4); // k, v; dk and dv in backward
    let sets: u128 = if args.backward { 4 } else { 2 };
    let mask = match args.mask {
        Some(MaskKind::Bool) => bytes(&[l, s], 1),
        Some(MaskKind::Additive) => bytes(&[l, s], 4),
        None => 0,
    };
    // The reference keeps scores and weights in f64 (and their gradients).
    let reference = if args.reference {
        bytes(&[b, h, l, s], 8).saturating_mul(sets)
    } else {
        0
    };
    (q_like.saturating_add(kv_like))
        .saturating_mul(sets)
        .saturating_add(mask.saturating_mul(2))
        .saturating_add(reference)
}

/// Runs `attend bench`.
pub fn run(args: Args) -> Result<(), Error> {
    if args.format != "json" && args.format != "text" {
        return Err(Error::value(format!(
            "--format must be json or text, got {:?}",
            args.format
        )));
    }
    limits::check_memory(
        "--batch × --heads × --seq × --kv-len × --head-dim",
        needed_bytes(&args),
    )?;
    let isa = args.isa.unwrap_or_else(Isa::detect);
    let bf16 = args.dtype == Dtype::Bf16;
    if args.decode {
        let record = decode::run(&decode::DecodeArgs {
            batch: args.batch,
            heads: args.heads,
            kv_heads: args.kv_heads,
            kv_len: args.kv_len.unwrap_or(4096),
            head_dim: args.head_dim,
            q_len: 1,
            threads: args.threads,
            isa,
            dtype: args.dtype,
            min_time: args.min_time,
        })?;
        if args.format == "json" {
            outln!("{record}")?;
        } else {
            outln!(
                "attend decode {} {} B={} H={} Hkv={} S={} E={} threads={}: {:.3} ms, {:.2} GB/s ({:.0}% of the {:.2} GB/s read bandwidth)",
                record["isa"].as_str().unwrap_or("?"),
                record["dtype"].as_str().unwrap_or("?"),
                record["batch"], record["heads"], record["kv_heads"], record["kv_len"],
                record["head_dim"], record["threads"],
                record["ms"].as_f64().unwrap_or(0.0),
                record["gbps"].as_f64().unwrap_or(0.0),
                100.0 * record["fraction_of_read"].as_f64().unwrap_or(0.0),
                record["read_gbps"].as_f64().unwrap_or(0.0),
            )?;
        }
        return Ok(());
    }
    let (b, h, e) = (args.batch, args.heads, args.head_dim);
    let hkv = args.kv_heads.unwrap_or(h);
    let (l, s) = (args.seq, args.kv_len.unwrap_or(args.seq));
    let q = random((b, h, l, e), 1);
    let k = random((b, hkv, s, e), 2);
    let v = random((b, hkv, s, e), 3);
    // The bf16 copies, rounded once, outside the timing (empty for f32).
    let [qb, kb, vb] = [&q, &k, &v].map(|a| {
        if bf16 {
            from_f32::<bf16, _>(a.view())
        } else {
            Array4::from_elem((0, 0, 0, 0), bf16::ZERO)
        }
    });
    // Only the mask asked for is made: at L = S = 65536 an [L, S] mask is 4 GiB
    // (bool) or 16 GiB (additive), far more than the attention itself needs.
    let keep = (args.mask == Some(MaskKind::Bool))
        .then(|| Array2::from_shape_fn((l, s), |(i, j)| (7 * i + 13 * j) % 10 != 0));
    let bias = (args.mask == Some(MaskKind::Additive))
        .then(|| Array2::from_shape_fn((l, s), |(i, j)| ((i + j) % 5) as f32 * -0.25));
    let opts = AttentionOptions {
        causal: args.causal.then_some(Causal::TopLeft),
        mask: keep.as_ref().map(|m| m.view().into_dyn()),
        bias: bias.as_ref().map(|m| m.view().into_dyn()),
        ..Default::default()
    };
    let config = Config {
        kernel: if args.reference {
            Kernel::Reference
        } else {
            Kernel::Fused
        },
        exec: Exec {
            isa: Some(isa),
            threads: None,
        },
    };
    let pool = attend::threads::pool(args.threads)?;
    let dout = if args.backward {
        random((b, h, l, e), 4)
    } else {
        Array4::zeros((0, 0, 0, 0))
    };
    let bconfig = BackwardConfig {
        kernel: if args.reference {
            BackwardKernel::Reference
        } else {
            BackwardKernel::Fused
        },
        exec: config.exec,
        ..Default::default()
    };
    let dout_b = if bf16 && args.backward {
        from_f32::<bf16, _>(dout.view())
    } else {
        Array4::from_elem((0, 0, 0, 0), bf16::ZERO)
    };
    let step = || -> Result<(), Error> {
        if bf16 && !args.backward {
            attention_with(qb.view(), kb.view(), vb.view(), &opts, &config)?;
            return Ok(());
        }
        if bf16 {
            // The bf16 backward: the f32 backward of the bf16 numbers, its
            // gradients rounded to bf16.
            let forward =
                attention_with_lse_parts(qb.view(), kb.view(), vb.view(), &opts, &config)?;
            attention_backward_with(
                qb.view(),
                kb.view(),
                vb.view(),
                Saved::from(&forward),
                dout_b.view(),
                &opts,
                &bconfig,
            )?;
            return Ok(());
        }
        let forward = attention_with_lse_parts(q.view(), k.view(), v.view(), &opts, &config)?;
        if args.backward {
            attention_backward_with(
                q.view(),
                k.view(),
                v.view(),
                Saved::from(&forward),
                dout.view(),
                &opts,
                &bconfig,
            )?;
        }
        Ok(())
    };
    let median = pool.install(|| median_seconds(args.min_runs, args.min_time, step))?;
    let flops = 4.0
        * [b, h, l, s, e].iter().map(|&n| n as f64).product::<f64>()
        * if args.causal { 0.5 } else { 1.0 }
        * if args.backward { 3.5 } else { 1.0 };
    let gflops = flops / median / 1e9;
    if args.format == "json" {
        let j = serde_json::json!({
            "what": "sdpa", "impl": "attend", "isa": isa.name(), "threads": args.threads,
            "dtype": dtype_flag(args.dtype), "batch": b, "heads": h, "kv_heads": hkv, "q_len": l, "kv_len": s,
            "head_dim": e, "causal": args.causal, "mask": args.mask.map(MaskKind::name), "backward": args.backward, "ms": median * 1e3, "gflops": gflops,
            "peak_rss_bytes": limits::peak_rss(),
        });
        outln!("{j}")?;
    } else {
        outln!(
            "attend {} {} B={b} H={h} Hkv={hkv} L={l} S={s} E={e} causal={} mask={} threads={}: {:.3} ms, {:.1} GFLOP/s{}",
            isa.name(),
            dtype_flag(args.dtype),
            args.causal,
            args.mask.map_or("none", MaskKind::name),
            args.threads,
            median * 1e3,
            gflops,
            match (bf16, isa.has_bf16_products()) {
                (false, _) | (true, true) => "",
                (true, false) => " (bf16 widened to f32 for the f32 kernel: no vdpbf16ps on this path)",
            }
        )?;
    }
    Ok(())
}
