//! The scheduler: one thread that takes passes of texts from the [`Queue`] (at
//! most a token budget each, counted unpadded: the engine computes real tokens
//! only) and runs each through the engine on the compute threads. It never sees
//! HTTP.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use attend_models::models::{Engine, SentenceEncoder, SentenceModules, Sequence};
use ndarray::{s, Array2};
use rayon::ThreadPool;

use crate::metrics::Metrics;
use crate::queue::{self, Batching, Entry, Queue, Want};

/// Starts the scheduler's thread; it stops once `queue` is closed and empty.
pub fn spawn(
    queue: Arc<Queue>,
    encoder: Arc<SentenceEncoder>,
    compute: Arc<ThreadPool>,
    batching: Batching,
    metrics: Arc<Metrics>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("attend-scheduler".into())
        .spawn(move || {
            let own = pass_pool(compute.current_num_threads());
            let compute = own.as_ref().unwrap_or(&compute);
            let unnormalized = SentenceModules {
                normalize: false,
                ..encoder.modules.clone()
            };
            let engines = Engines {
                normalized: encoder.engine(),
                unnormalized: Engine {
                    model: &encoder.model,
                    modules: &unnormalized,
                },
            };
            while let Some(pass) = queue.next_pass(batching) {
                run_pass(&queue, engines, compute, pass, &metrics);
            }
        })
}

/// A pool of `threads` compute threads of which the calling thread is one, so
/// that a pass starts and ends on the scheduler's thread without handing itself
/// to a sleeping worker and waiting to be woken back: two wake-ups a pass fewer,
/// which on short texts are a fair share of the pass (docs/serving.md). `None`
/// if the pool cannot be made: the passes then go to `compute`, as fast at
/// saturation.
fn pass_pool(threads: usize) -> Option<ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .use_current_thread()
        .thread_name(|i| format!("attend-pass-{i}"))
        .build()
        .inspect_err(|e| tracing::warn!("passes hand over to the compute threads: {e}"))
        .ok()
}

/// The engine with the model's own modules, and without its `Normalize`.
#[derive(Clone, Copy)]
struct Engines<'a> {
    normalized: Engine<'a>,
    unnormalized: Engine<'a>,
}

/// Runs one pass: texts nobody waits for are dropped first, then the rest go
/// through the engine, sentence vectors and token vectors apart.
fn run_pass(
    queue: &Queue,
    engines: Engines<'_>,
    compute: &ThreadPool,
    pass: Vec<Entry>,
    metrics: &Metrics,
) {
    let (live, gone): (Vec<Entry>, Vec<Entry>) = pass.into_iter().partition(|e| !e.job.abandoned());
    let (tokens, settled) = queue::skip(&gone);
    queue.release(tokens, settled);
    for want in [Want::Sentence, Want::Unnormalized, Want::Tokens] {
        let group: Vec<&Entry> = live.iter().filter(|e| e.job.want() == want).collect();
        if group.is_empty() {
            continue;
        }
        let start = Instant::now();
        for e in &group {
            e.job.started(start);
        }
        let seqs: Vec<Sequence<'_>> = group
            .iter()
            .map(|e| {
                let t = e.job.text(e.index);
                Sequence {
                    ids: &t.ids,
                    type_ids: &t.type_ids,
                }
            })
            .collect();
        let engine = match want {
            Want::Unnormalized => engines.unnormalized,
            Want::Sentence | Want::Tokens => engines.normalized,
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            compute.install(|| compute_vectors(engine, want, &seqs))
        }))
        .unwrap_or_else(|_| Err("the engine panicked (a bug in attend)".into()));
        let took = start.elapsed();
        let tokens: usize = group.iter().map(|e| e.len).sum();
        metrics.inference_seconds.observe(took.as_secs_f64());
        metrics.batch_tokens.observe(tokens as f64);
        metrics.batch_texts.observe(group.len() as f64);
        let mut charged: HashSet<*const crate::queue::Job> = HashSet::new();
        let mut settled = 0;
        match result {
            Ok(vectors) => {
                for (e, v) in group.iter().zip(vectors) {
                    if charged.insert(Arc::as_ptr(&e.job)) {
                        e.job.charge(took);
                        metrics
                            .queue_seconds
                            .observe((start - e.job.admitted()).as_secs_f64());
                    }
                    settled += usize::from(e.job.fill(e.index, v));
                }
            }
            Err(error) => {
                for e in &group {
                    e.job.fail(&error);
                    settled += usize::from(e.job.skip());
                }
            }
        }
        queue.release(tokens, settled);
    }
}

/// One pass through the engine: a `[1, dimension]` array per text for sentence
/// vectors, `[tokens, hidden]` for token vectors.
fn compute_vectors(
    engine: Engine<'_>,
    want: Want,
    seqs: &[Sequence<'_>],
) -> Result<Vec<Array2<f32>>, String> {
    match want {
        Want::Sentence | Want::Unnormalized => {
            let v = engine.embed(seqs).map_err(|e| e.to_string())?;
            Ok((0..v.nrows())
                .map(|i| v.slice(s![i..i + 1, ..]).to_owned())
                .collect())
        }
        Want::Tokens => engine.token_vectors(seqs).map_err(|e| e.to_string()),
    }
}
