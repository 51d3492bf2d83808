//! `attend bench --decode`: one query token against a long key/value cache, timed
//! with the machine's read bandwidth measured in the same run.
//!
//! `gbps` counts the K and V bytes read once per call, as
//! `scripts/bench/py/torch_sdpa.py --decode` does; `read_gbps` is a streaming sum over
//! a buffer much larger than the CPU caches, on the same threads. Decode calls and
//! reads of the buffer alternate, and `fraction_of_read` is the median over those
//! pairs of the decode's bandwidth over the read's: how close decoding comes to the
//! memory's limit at the same moment.
//!
//! `--dtype bf16` stores K and V as bf16 (rounded from the same f32 numbers) and
//! counts bf16 bytes: half the bytes of the f32 cache for the same keys. The query
//! stays f32 either way.

use std::time::Instant;

use attend::decode::{decode_attention, DecodeConfig};
use attend::element::{bf16, Dtype, Element};
use attend::kernels::Isa;
use attend::timing::median;
use attend::Error;
use ndarray::{Array4, ArrayView4};

/// The shape and settings of a decode benchmark (`attend bench --decode`).
#[derive(Debug, Clone)]
pub struct DecodeArgs {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (default: `heads`).
    pub kv_heads: Option<usize>,
    /// Cached keys.
    pub kv_len: usize,
    /// Query/key/value width per head.
    pub head_dim: usize,
    /// Query tokens per step.
    pub q_len: usize,
    /// Worker threads.
    pub threads: usize,
    /// Instruction set.
    pub isa: Isa,
    /// Element type of the cached keys and values.
    pub dtype: Dtype,
    /// Minimum timed seconds in all (decode samples alternating with reads).
    pub min_time: f64,
}

/// Pairs of measurements at the least, whatever `min_time` says.
const MIN_PAIRS: usize = 5;

/// A decode sample lasts at least this long: short calls repeat back to back, as
/// `torch_sdpa.py --decode` times them. Only a sample's first call follows the
/// bandwidth read, which empties the last-level cache; a cache that fits in it is
/// then read from it by every later call, as it is on PyTorch's side. With 1 ms
/// samples, a 16 MiB cache (0.5 ms a call from memory) repeated once or twice, so
/// half its calls came cold from memory, and it measured 0.45× PyTorch where a warm
/// cache runs level with it.
const MIN_SAMPLE_SECONDS: f64 = 2e-2;

/// Seconds per call of `f`, timed over `reps` calls.
fn seconds_per_call(reps: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    t.elapsed().as_secs_f64() / reps as f64
}

/// Runs the decode benchmark and returns its JSON record.
pub fn run(a: &DecodeArgs) -> Result<serde_json::Value, Error> {
    let hkv = a.kv_heads.unwrap_or(a.heads);
    if a.heads == 0 || hkv == 0 || !a.heads.is_multiple_of(hkv) {
        return Err(Error::value(format!(
            "--heads ({}) must be a positive multiple of --kv-heads ({hkv})",
            a.heads
        )));
    }
    let (b, h, l, s, d) = (a.batch, a.heads, a.q_len, a.kv_len, a.head_dim);
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let q = Array4::from_shape_fn((b, h, l, d), |_| rnd());
    let k = Array4::from_shape_fn((b, hkv, s, d), |_| rnd());
    let v = Array4::from_shape_fn((b, hkv, s, d), |_| rnd());
    match a.dtype {
        Dtype::F32 => time(a, q.view(), k.view(), v.view()),
        Dtype::Bf16 => {
            let (k, v) = (k.mapv(bf16::from_f32), v.mapv(bf16::from_f32));
            time(a, q.view(), k.view(), v.view())
        }
    }
}

/// Times decoding `q` against a cache of `T` and returns the JSON record.
fn time<T: Element>(
    a: &DecodeArgs,
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
) -> Result<serde_json::Value, Error> {
    let isa = a.isa;
    let ((b, h, l, d), (_, hkv, s, _)) = (q.dim(), k.dim());
    let kv_bytes = 2.0 * (b * hkv * s * d) as f64 * std::mem::size_of::<T>() as f64;

    let pool = attend::threads::pool(a.threads)?;
    let cfg = DecodeConfig {
        isa: Some(isa),
        threads: None,
    };
    let opts = Default::default();
    // Bandwidth buffer: well beyond the last-level cache, and at least the cache size.
    let bw_len = (256usize << 20).max(kv_bytes as usize) / 4;
    let buf: Vec<f32> = (0..bw_len).map(|i| (i % 7) as f32).collect();
    let read_bytes = (bw_len * 4) as f64;
    let (mut t_decode, mut t_read, mut fraction) = (Vec::new(), Vec::new(), Vec::new());
    pool.install(|| -> Result<(), Error> {
        let mut decode = || {
            let _ = std::hint::black_box(decode_attention(q, k, v, &opts, &cfg));
        };
        decode_attention(q, k, v, &opts, &cfg)?;
        let once = seconds_per_call(1, &mut decode);
        let reps = (MIN_SAMPLE_SECONDS / once.max(1e-9)).ceil().max(1.0) as usize;
        // Alternate one decode sample and one read of the buffer: the load that
        // other tenants put on this shared machine's memory changes from one second
        // to the next, and each pair sees the same load, so the fraction of the
        // read bandwidth is taken pair by pair.
        let end = Instant::now() + std::time::Duration::from_secs_f64(a.min_time);
        while t_decode.len() < MIN_PAIRS || Instant::now() < end {
            let td = seconds_per_call(reps, &mut decode);
            let tr = seconds_per_call(1, || {
                std::hint::black_box(attend::kernels::stream_sum(&buf));
            });
            t_decode.push(td);
            t_read.push(tr);
            fraction.push((kv_bytes / td) / (read_bytes / tr));
        }
        Ok(())
    })?;
    let (sec, read_sec) = (median(t_decode), median(t_read));
    let gbps = kv_bytes / sec / 1e9;
    let read_gbps = read_bytes / read_sec / 1e9;
    Ok(serde_json::json!({
        "what": "decode",
        "isa": isa.name(),
        "threads": a.threads,
        "dtype": T::DTYPE.name(),
        "batch": b,
        "heads": h,
        "kv_heads": hkv,
        "q_len": l,
        "kv_len": s,
        "head_dim": d,
        "ms": sec * 1e3,
        "gbps": gbps,
        "read_gbps": read_gbps,
        "fraction_of_read": median(fraction),
    }))
}
