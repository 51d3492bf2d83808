//! The scheduler: one thread that takes rounds of texts from the [`Queue`],
//! orders each round by length, cuts it into passes of at most a token budget
//! (counted unpadded: the engine computes real tokens only) and runs each pass
//! through the engine on the compute threads. It never sees HTTP.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use attend_models::models::{Engine, SentenceEncoder, SentenceModules, Sequence};
use ndarray::{s, Array2};
use rayon::ThreadPool;

use crate::metrics::Metrics;
use crate::queue::{Entry, Queue, Want};

/// How passes are formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    /// Tokens one pass holds at most (a longer text runs alone).
    pub max_batch_tokens: usize,
    /// Texts of one request one pass holds at most.
    pub max_client_batch_size: usize,
    /// How long the oldest text may wait for others to join.
    pub max_wait: Duration,
}

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
            while let Some(round) = queue.next_round(batching.max_wait, batching.max_batch_tokens) {
                for pass in passes(round, batching) {
                    run_pass(&queue, engines, &compute, pass, &metrics);
                }
            }
        })
}

/// The engine with the model's own modules, and without its `Normalize`.
#[derive(Clone, Copy)]
struct Engines<'a> {
    normalized: Engine<'a>,
    unnormalized: Engine<'a>,
}

/// A round's texts, shortest first, cut into passes of at most
/// `max_batch_tokens` tokens and `max_client_batch_size` texts of any one
/// request; what does not fit waits for the next pass of the round.
fn passes(mut round: Vec<Entry>, batching: Batching) -> Vec<Vec<Entry>> {
    round.sort_by_key(|e| e.len);
    let mut out = Vec::new();
    while !round.is_empty() {
        let mut pass = Vec::new();
        let mut later = Vec::new();
        let mut tokens = 0;
        let mut per_job: HashMap<*const crate::queue::Job, usize> = HashMap::new();
        for e in round {
            let of_job = per_job.entry(Arc::as_ptr(&e.job)).or_default();
            let fits = pass.is_empty() || tokens + e.len <= batching.max_batch_tokens;
            if fits && *of_job < batching.max_client_batch_size.max(1) {
                *of_job += 1;
                tokens += e.len;
                pass.push(e);
            } else {
                later.push(e);
            }
        }
        out.push(pass);
        round = later;
    }
    out
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
    settle_skipped(queue, &gone);
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

/// Drops texts whose request nobody waits for any more.
fn settle_skipped(queue: &Queue, gone: &[Entry]) {
    let tokens = gone.iter().map(|e| e.len).sum();
    let settled = gone.iter().filter(|e| e.job.skip()).count();
    queue.release(tokens, settled);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TokenIds;

    fn text(len: usize) -> TokenIds {
        TokenIds {
            ids: vec![1; len],
            type_ids: vec![0; len],
        }
    }

    fn round_of(queue: &Queue, jobs: &[Vec<usize>]) -> Vec<Entry> {
        for lens in jobs {
            let texts = lens.iter().map(|&l| text(l)).collect();
            // The receivers are dropped: passes() does not look at them.
            drop(queue.submit(Want::Sentence, texts).unwrap());
        }
        queue.next_round(Duration::ZERO, usize::MAX).unwrap()
    }

    #[test]
    fn passes_keep_the_token_budget_and_the_per_request_cap() {
        let queue = Queue::new(usize::MAX);
        let round = round_of(&queue, &[vec![5, 30, 7], vec![12, 3], vec![40]]);
        let batching = Batching {
            max_batch_tokens: 50,
            max_client_batch_size: 2,
            max_wait: Duration::ZERO,
        };
        let cut = passes(round, batching);
        let lens: Vec<Vec<usize>> = cut
            .iter()
            .map(|p| p.iter().map(|e| e.len).collect())
            .collect();
        // Shortest first; the third text of the first request (30) waits for the
        // second pass; 40 does not fit beside 30 and gets a pass of its own.
        assert_eq!(lens, vec![vec![3, 5, 7, 12], vec![30], vec![40]]);
        for p in &cut {
            assert!(p.iter().map(|e| e.len).sum::<usize>() <= 50);
        }
    }

    #[test]
    fn a_text_over_the_budget_runs_alone() {
        let queue = Queue::new(usize::MAX);
        let round = round_of(&queue, &[vec![2, 500, 3]]);
        let batching = Batching {
            max_batch_tokens: 100,
            max_client_batch_size: 8,
            max_wait: Duration::ZERO,
        };
        let lens: Vec<Vec<usize>> = passes(round, batching)
            .iter()
            .map(|p| p.iter().map(|e| e.len).collect())
            .collect();
        assert_eq!(lens, vec![vec![2, 3], vec![500]]);
    }
}
