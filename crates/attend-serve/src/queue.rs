//! The queue between the request handlers and the scheduler: one entry per text,
//! so a request's texts can share passes with other requests' texts and a large
//! request can be split across passes; bounded in tokens, so a burst past what
//! the engine can work off is refused at once (429) rather than left to time out.
//!
//! A request's texts come back to it through its [`Job`]: the scheduler fills a
//! slot per text and, when the last slot is filled, sends the whole answer. A
//! handler that stops waiting (its client went away, or its time ran out) drops
//! the receiving end, and the scheduler skips that job's texts still queued.

use std::collections::VecDeque;
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
    waiting: VecDeque<Entry>,
    /// Tokens of the texts in `waiting`.
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

    /// Everything waiting, once there is something: after the oldest text has
    /// waited `window` (or at once if `window` is zero), or as soon as `budget`
    /// tokens wait. `None` once the queue is closed and empty.
    pub fn next_round(&self, window: Duration, budget: usize) -> Option<Vec<Entry>> {
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
        if !window.is_zero() {
            let deadline = st
                .waiting
                .front()
                .map_or_else(Instant::now, |e| e.job.admitted)
                + window;
            while st.waiting_tokens < budget && !st.closed {
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
        st.waiting_tokens = 0;
        Some(st.waiting.drain(..).collect())
    }

    /// `tokens` of admitted texts are done (computed or dropped), and with them
    /// `requests` whole requests.
    pub fn release(&self, tokens: usize, requests: usize) {
        let mut st = lock(&self.state);
        st.admitted_tokens = st.admitted_tokens.saturating_sub(tokens);
        st.admitted_requests = st.admitted_requests.saturating_sub(requests);
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

/// A lock that a panic elsewhere did not make unusable: the state it guards is
/// only counters and slots, each left consistent by every update.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Taken into a round, the tokens still count until they are computed.
        let round = q.next_round(Duration::ZERO, usize::MAX).unwrap();
        assert_eq!(round.len(), 2);
        assert!(q.submit(Want::Sentence, texts(&[1])).is_err());
        q.release(60, 1);
        assert!(q.submit(Want::Sentence, texts(&[1])).is_ok());
    }

    #[test]
    fn a_request_larger_than_the_bound_gets_an_empty_queue() {
        let q = Queue::new(10);
        assert!(q.submit(Want::Sentence, texts(&[50])).is_ok());
        assert!(q.submit(Want::Sentence, texts(&[1])).is_err());
    }

    #[test]
    fn a_dropped_receiver_abandons_its_job_and_the_last_text_answers() {
        let q = Queue::new(1000);
        let rx = q.submit(Want::Sentence, texts(&[3, 4])).unwrap();
        let round = q.next_round(Duration::ZERO, usize::MAX).unwrap();
        let job = Arc::clone(&round[0].job);
        assert!(!job.abandoned());
        assert!(!job.fill(1, Array2::from_elem((1, 2), 1.0)));
        assert!(job.fill(0, Array2::from_elem((1, 2), 0.5)));
        let answer = rx.blocking_recv().unwrap().unwrap();
        assert_eq!(answer.vectors[0][[0, 0]], 0.5);
        assert_eq!(answer.vectors[1][[0, 1]], 1.0);

        let rx = q.submit(Want::Sentence, texts(&[3])).unwrap();
        let round = q.next_round(Duration::ZERO, usize::MAX).unwrap();
        drop(rx);
        assert!(round[0].job.abandoned());
    }

    #[test]
    fn a_closed_queue_refuses_and_ends_the_rounds_once_empty() {
        let q = Queue::new(1000);
        let _rx = q.submit(Want::Tokens, texts(&[2])).unwrap();
        q.close();
        assert_eq!(
            q.submit(Want::Tokens, texts(&[2])).unwrap_err(),
            Refusal::Closed
        );
        assert_eq!(q.next_round(Duration::ZERO, 10).map(|r| r.len()), Some(1));
        assert!(q.next_round(Duration::ZERO, 10).is_none());
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
        let round = q.next_round(Duration::from_secs(10), 40).unwrap();
        let _b = adder.join().unwrap();
        assert_eq!(round.len(), 2);
    }
}
