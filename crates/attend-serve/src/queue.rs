//! The queue between the request handlers and the scheduler: one entry per text,
//! so a request's texts can share passes with other requests' texts and a large
//! request can be split across passes; bounded in tokens, so a burst past what
//! the engine can work off is refused at once (429) rather than left to time out.
//!
//! The queue forms each pass when the engine is free for it, from everything
//! waiting then, in the order the texts were admitted, up to a token budget: a
//! text that arrives while a pass runs joins the next one unless more than a
//! budget's worth was admitted before it, and no text waits for more than the
//! tokens admitted before it. Order by length would buy nothing: the engine
//! computes real tokens only, so a pass of mixed lengths pads nothing.
//!
//! A request's texts come back to it through its [`Job`]: the scheduler fills a
//! slot per text and, when the last slot is filled, sends the whole answer. A
//! handler that stops waiting (its client went away, or its time ran out) drops
//! the receiving end, and the scheduler skips that job's texts still queued.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ndarray::Array2;
use tokio::sync::oneshot;

/// What a request wants of each text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The sentence vector (pooling and the later modules).
    Sentence,
    /// The sentence vector without the model's `Normalize` module (TEI's
    /// `normalize: false`).
    Unnormalized,
    /// Every token's vector (the last hidden state).
    Tokens,
}

/// One tokenised text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenIds {
    /// Token ids, special tokens included.
    pub ids: Vec<u32>,
    /// Token-type ids, as many as `ids`.
    pub type_ids: Vec<u32>,
}

/// A finished request: one array per text (`[1, dimension]` for sentence
/// vectors, `[tokens, hidden]` for token vectors), and where its time went.
#[derive(Debug)]
pub struct Answer {
    /// The texts' vectors, in the request's order.
    pub vectors: Vec<Array2<f32>>,
    /// From admission to the start of the first pass that held one of its texts.
    pub queue: Duration,
    /// The passes that held its texts, added up.
    pub inference: Duration,
}

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The queue holds too many tokens; `queued` of at most `limit`.
    Overloaded {
        /// Tokens admitted and not yet computed.
        queued: usize,
        /// The bound.
        limit: usize,
    },
    /// The server is shutting down.
    Closed,
}

/// What the scheduler sends back: the answer, or the engine's error.
pub type Reply = Result<Answer, String>;

/// One request in the queue.
pub struct Job {
    want: Want,
    texts: Vec<TokenIds>,
    admitted: Instant,
    state: Mutex<JobState>,
}

struct JobState {
    vectors: Vec<Option<Array2<f32>>>,
    remaining: usize,
    first_pass: Option<Instant>,
    inference: Duration,
    reply: Option<oneshot::Sender<Reply>>,
}

impl Job {
    /// What the request wants.
    pub fn want(&self) -> Want {
        self.want
    }

    /// When it was admitted.
    pub fn admitted(&self) -> Instant {
        self.admitted
    }

    /// A request of no texts: answered at once.
    fn fill_empty(&self) {
        if let Some(reply) = lock(&self.state).reply.take() {
            let _ = reply.send(Ok(Answer {
                vectors: Vec::new(),
                queue: Duration::ZERO,
                inference: Duration::ZERO,
            }));
        }
    }

    /// Text `i`.
    pub fn text(&self, i: usize) -> &TokenIds {
        &self.texts[i]
    }

    /// Whether nobody waits for the answer any more (the handler dropped it, or
    /// an earlier pass failed and answered already).
    pub fn abandoned(&self) -> bool {
        lock(&self.state)
            .reply
            .as_ref()
            .is_none_or(oneshot::Sender::is_closed)
    }

    /// A pass that holds some of its texts started at `start`.
    pub fn started(&self, start: Instant) {
        lock(&self.state).first_pass.get_or_insert(start);
    }

    /// Text `i`'s vectors; sends the answer when it was the last text. Returns
    /// whether the job is now settled (every text filled or skipped).
    pub fn fill(&self, i: usize, vectors: Array2<f32>) -> bool {
        let mut st = lock(&self.state);
        st.vectors[i] = Some(vectors);
        st.remaining -= 1;
        if st.remaining > 0 {
            return false;
        }
        if let Some(reply) = st.reply.take() {
            let answer = Answer {
                vectors: st
                    .vectors
                    .iter_mut()
                    .map(|v| v.take().unwrap_or_default())
                    .collect(),
                queue: st.first_pass.unwrap_or(self.admitted) - self.admitted,
                inference: st.inference,
            };
            // A handler that has stopped waiting drops the answer: nothing to do.
            let _ = reply.send(Ok(answer));
        }
        true
    }

    /// One of its texts will not be computed (the job was abandoned or failed). Returns
    /// whether the job is now settled.
    pub fn skip(&self) -> bool {
        let mut st = lock(&self.state);
        st.remaining -= 1;
        st.remaining == 0
    }

    /// Adds a pass's time to the request's inference time.
    pub fn charge(&self, took: Duration) {
        lock(&self.state).inference += took;
    }

    /// Answers with the engine's error (once; later texts see the job abandoned).
    pub fn fail(&self, error: &str) {
        if let Some(reply) = lock(&self.state).reply.take() {
            let _ = reply.send(Err(error.to_owned()));
        }
    }
}

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

/// One text of a job, waiting for a pass.
pub struct Entry {
    /// Its job.
    pub job: Arc<Job>,
    /// Which of the job's texts.
    pub index: usize,
    /// Its length in tokens.
    pub len: usize,
}

/// The texts waiting for the engine, bounded in tokens.
pub struct Queue {
    state: Mutex<QueueState>,
    arrived: Condvar,
    limit: usize,
}

#[derive(Default)]
struct QueueState {
    /// The waiting texts, in admission order.
    waiting: VecDeque<Entry>,
    /// Tokens of the waiting texts.
    waiting_tokens: usize,
    /// Tokens admitted and not yet computed or dropped: what the bound counts.
    admitted_tokens: usize,
    /// Requests admitted and not yet finished.
    admitted_requests: usize,
    closed: bool,
}

/// The queue's depth, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Depth {
    /// Requests admitted and not yet finished.
    pub requests: usize,
    /// Their tokens not yet computed.
    pub tokens: usize,
}

impl Queue {
    /// A queue admitting at most `limit` tokens at once.
    pub fn new(limit: usize) -> Self {
        Queue {
            state: Mutex::default(),
            arrived: Condvar::new(),
            limit,
        }
    }

    /// Admits a request's texts, or refuses them; the receiver gets the answer.
    /// A request larger than the whole bound is admitted only into an empty
    /// queue (otherwise it could never be).
    pub fn submit(
        &self,
        want: Want,
        texts: Vec<TokenIds>,
    ) -> Result<oneshot::Receiver<Reply>, Refusal> {
        let tokens: usize = texts.iter().map(|t| t.ids.len()).sum();
        let mut st = lock(&self.state);
        if st.closed {
            return Err(Refusal::Closed);
        }
        if st.admitted_tokens > 0 && st.admitted_tokens + tokens > self.limit {
            // Texts nobody waits for any more leave now rather than when the
            // scheduler reaches them: they must not turn live requests away.
            st.drop_abandoned();
        }
        if st.admitted_tokens > 0 && st.admitted_tokens + tokens > self.limit {
            return Err(Refusal::Overloaded {
                queued: st.admitted_tokens,
                limit: self.limit,
            });
        }
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        let lens: Vec<usize> = texts.iter().map(|t| t.ids.len()).collect();
        let job = Arc::new(Job {
            want,
            admitted: now,
            state: Mutex::new(JobState {
                vectors: vec![None; texts.len()],
                remaining: texts.len(),
                first_pass: None,
                inference: Duration::ZERO,
                reply: Some(tx),
            }),
            texts,
        });
        if lens.is_empty() {
            job.fill_empty();
            return Ok(rx);
        }
        for (index, len) in lens.into_iter().enumerate() {
            st.waiting.push_back(Entry {
                job: Arc::clone(&job),
                index,
                len,
            });
        }
        st.waiting_tokens += tokens;
        st.admitted_tokens += tokens;
        st.admitted_requests += 1;
        drop(st);
        self.arrived.notify_one();
        Ok(rx)
    }

    /// The next pass, once there is something to compute: after the oldest text
    /// has waited `batching.max_wait` (at once if that is zero) or as soon as a
    /// full budget of tokens waits. It holds the waiting texts in admission
    /// order until the next would take it past `batching.max_batch_tokens` (the
    /// oldest alone may exceed it), passing over the texts of a request that has
    /// `batching.max_client_batch_size` in the pass already. `None` once the
    /// queue is closed and empty.
    pub fn next_pass(&self, batching: Batching) -> Option<Vec<Entry>> {
        let mut st = lock(&self.state);
        while st.waiting.is_empty() {
            if st.closed {
                return None;
            }
            st = self
                .arrived
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if !batching.max_wait.is_zero() {
            let deadline = st
                .waiting
                .front()
                .map_or_else(Instant::now, |e| e.job.admitted)
                + batching.max_wait;
            while st.waiting_tokens < batching.max_batch_tokens && !st.closed {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                st = self
                    .arrived
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        Some(st.take_pass(batching))
    }

    /// `tokens` of admitted texts are done (computed or dropped), and with them
    /// `requests` whole requests.
    pub fn release(&self, tokens: usize, requests: usize) {
        lock(&self.state).release(tokens, requests);
    }

    /// Admits nothing more; the scheduler finishes what was admitted, then stops.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.arrived.notify_all();
    }

    /// Requests and tokens admitted and not yet done.
    pub fn depth(&self) -> Depth {
        let st = lock(&self.state);
        Depth {
            requests: st.admitted_requests,
            tokens: st.admitted_tokens,
        }
    }
}

impl QueueState {
    /// Removes the waiting texts of requests nobody waits for, releasing their
    /// tokens (and the requests that are then settled).
    fn drop_abandoned(&mut self) {
        let (mut gone, waiting): (VecDeque<Entry>, VecDeque<Entry>) =
            std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(|e| e.job.abandoned());
        self.waiting = waiting;
        let (tokens, settled) = skip(gone.make_contiguous());
        self.waiting_tokens -= tokens;
        self.release(tokens, settled);
    }

    /// See [`Queue::release`].
    fn release(&mut self, tokens: usize, requests: usize) {
        self.admitted_tokens = self.admitted_tokens.saturating_sub(tokens);
        self.admitted_requests = self.admitted_requests.saturating_sub(requests);
    }

    /// Takes the next pass (see [`Queue::next_pass`]).
    fn take_pass(&mut self, batching: Batching) -> Vec<Entry> {
        let per_request = batching.max_client_batch_size.max(1);
        let mut pass: Vec<Entry> = Vec::new();
        let mut passed_over = Vec::new();
        let mut tokens = 0;
        let mut of_job: HashMap<*const Job, usize> = HashMap::new();
        while let Some(e) = self.waiting.pop_front() {
            let taken = of_job.entry(Arc::as_ptr(&e.job)).or_default();
            if *taken >= per_request {
                passed_over.push(e);
                continue;
            }
            if !pass.is_empty() && tokens + e.len > batching.max_batch_tokens {
                self.waiting.push_front(e);
                break;
            }
            *taken += 1;
            tokens += e.len;
            pass.push(e);
        }
        // What was passed over keeps its place, ahead of everything admitted later.
        for e in passed_over.into_iter().rev() {
            self.waiting.push_front(e);
        }
        self.waiting_tokens -= tokens;
        pass
    }
}

/// Skips `entries`, texts that will not be computed: their tokens, and how many
/// requests that settles (for [`Queue::release`]).
pub fn skip(entries: &[Entry]) -> (usize, usize) {
    let tokens = entries.iter().map(|e| e.len).sum();
    let settled = entries.iter().filter(|e| e.job.skip()).count();
    (tokens, settled)
}

/// A lock that a panic elsewhere did not make unusable: the state it guards is
/// only counters and slots, each left consistent by every update.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything waiting in one pass, at once.
    const ALL: Batching = Batching {
        max_batch_tokens: usize::MAX,
        max_client_batch_size: usize::MAX,
        max_wait: Duration::ZERO,
    };

    fn budget(max_batch_tokens: usize, max_client_batch_size: usize) -> Batching {
        Batching {
            max_batch_tokens,
            max_client_batch_size,
            max_wait: Duration::ZERO,
        }
    }

    fn lens(pass: &[Entry]) -> Vec<usize> {
        pass.iter().map(|e| e.len).collect()
    }

    fn texts(lens: &[usize]) -> Vec<TokenIds> {
        lens.iter()
            .map(|&l| TokenIds {
                ids: vec![1; l],
                type_ids: vec![0; l],
            })
            .collect()
    }

    #[test]
    fn the_bound_counts_tokens_until_they_are_released() {
        let q = Queue::new(100);
        let _a = q.submit(Want::Sentence, texts(&[60])).unwrap();
        assert_eq!(
            q.submit(Want::Sentence, texts(&[30, 20])).unwrap_err(),
            Refusal::Overloaded {
                queued: 60,
                limit: 100
            }
        );
        let _b = q.submit(Want::Sentence, texts(&[40])).unwrap();
        assert_eq!(
            q.depth(),
            Depth {
                requests: 2,
                tokens: 100
            }
        );
        // Taken into a pass, the tokens still count until they are computed.
        let pass = q.next_pass(ALL).unwrap();
        assert_eq!(pass.len(), 2);
        assert!(q.submit(Want::Sentence, texts(&[1])).is_err());
        q.release(60, 1);
        assert!(q.submit(Want::Sentence, texts(&[1])).is_ok());
    }

    #[test]
    fn a_request_larger_than_the_bound_gets_an_empty_queue() {
        let q = Queue::new(10);
        let _waiting = q.submit(Want::Sentence, texts(&[50])).unwrap();
        assert!(q.submit(Want::Sentence, texts(&[1])).is_err());
    }

    #[test]
    fn a_dropped_receiver_abandons_its_job_and_the_last_text_answers() {
        let q = Queue::new(1000);
        let rx = q.submit(Want::Sentence, texts(&[3, 4])).unwrap();
        let pass = q.next_pass(ALL).unwrap();
        let job = Arc::clone(&pass[0].job);
        assert!(!job.abandoned());
        assert!(!job.fill(1, Array2::from_elem((1, 2), 1.0)));
        assert!(job.fill(0, Array2::from_elem((1, 2), 0.5)));
        let answer = rx.blocking_recv().unwrap().unwrap();
        assert_eq!(answer.vectors[0][[0, 0]], 0.5);
        assert_eq!(answer.vectors[1][[0, 1]], 1.0);

        let rx = q.submit(Want::Sentence, texts(&[3])).unwrap();
        let pass = q.next_pass(ALL).unwrap();
        drop(rx);
        assert!(pass[0].job.abandoned());
    }

    #[test]
    fn texts_nobody_waits_for_do_not_turn_a_request_away() {
        let q = Queue::new(100);
        let gone = q.submit(Want::Sentence, texts(&[50, 40])).unwrap();
        let _live = q.submit(Want::Sentence, texts(&[5])).unwrap();
        assert!(q.submit(Want::Sentence, texts(&[20])).is_err());
        drop(gone);
        assert!(q.submit(Want::Sentence, texts(&[20])).is_ok());
        assert_eq!(
            q.depth(),
            Depth {
                requests: 2,
                tokens: 25
            }
        );
        assert_eq!(lens(&q.next_pass(ALL).unwrap()), vec![5, 20]);
    }

    #[test]
    fn a_closed_queue_refuses_and_ends_the_passes_once_empty() {
        let q = Queue::new(1000);
        let _rx = q.submit(Want::Tokens, texts(&[2])).unwrap();
        q.close();
        assert_eq!(
            q.submit(Want::Tokens, texts(&[2])).unwrap_err(),
            Refusal::Closed
        );
        assert_eq!(q.next_pass(budget(10, 8)).map(|p| p.len()), Some(1));
        assert!(q.next_pass(budget(10, 8)).is_none());
    }

    #[test]
    fn the_window_waits_for_more_texts_until_the_budget_fills() {
        let q = Arc::new(Queue::new(1000));
        let _a = q.submit(Want::Sentence, texts(&[5])).unwrap();
        let adder = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                q.submit(Want::Sentence, texts(&[50])).unwrap()
            })
        };
        // The budget (40) fills when the second request arrives, well before the
        // window (10 s) ends.
        let batching = Batching {
            max_wait: Duration::from_secs(10),
            ..budget(40, 8)
        };
        let pass = q.next_pass(batching).unwrap();
        let _b = adder.join().unwrap();
        // 50 does not fit beside 5: the pass holds the oldest text alone.
        assert_eq!(lens(&pass), vec![5]);
        assert_eq!(lens(&q.next_pass(batching).unwrap()), vec![50]);
    }

    #[test]
    fn a_pass_takes_texts_in_admission_order_within_the_budget_and_the_per_request_cap() {
        let q = Queue::new(usize::MAX);
        let _rx: Vec<_> = [vec![30, 5, 7], vec![12, 3], vec![40], vec![2, 2, 2]]
            .iter()
            .map(|lens| q.submit(Want::Sentence, texts(lens)).unwrap())
            .collect();
        // 30, 5 (7 is the first request's third text: passed over), 12, 3: 50
        // tokens; 40 does not fit, and the pass ends there.
        assert_eq!(
            lens(&q.next_pass(budget(50, 2)).unwrap()),
            vec![30, 5, 12, 3]
        );
        // The passed-over 7 kept its place: first in the next pass; then 40 and
        // 2 (49 tokens), and the next 2 does not fit.
        assert_eq!(lens(&q.next_pass(budget(50, 2)).unwrap()), vec![7, 40, 2]);
        // A text over the budget runs alone.
        assert_eq!(lens(&q.next_pass(budget(1, 2)).unwrap()), vec![2]);
        assert_eq!(lens(&q.next_pass(budget(50, 2)).unwrap()), vec![2]);
        // Taken texts count against the bound until they are released.
        assert_eq!(q.depth().tokens, 103);
    }

    #[test]
    fn no_text_waits_for_texts_admitted_after_it() {
        let q = Queue::new(usize::MAX);
        let _long = q.submit(Want::Sentence, texts(&[200, 200, 200])).unwrap();
        assert_eq!(lens(&q.next_pass(budget(250, 8)).unwrap()), vec![200]);
        // A short text admitted now comes after the long texts admitted before it.
        let _short = q.submit(Want::Sentence, texts(&[4])).unwrap();
        assert_eq!(lens(&q.next_pass(budget(250, 8)).unwrap()), vec![200]);
        assert_eq!(lens(&q.next_pass(budget(250, 8)).unwrap()), vec![200, 4]);
        assert_eq!(q.depth().tokens, 604);
    }
}
