//! Threads that run the jobs handed to them and sleep while there is none.
//!
//! Not a rayon pool: rayon's idle workers spin (yielding) for a while after each
//! job before they sleep. With a request every millisecond that spinning never
//! ended, and the scheduler counts it as runnable: it took the CPUs from the
//! compute threads' passes (in `perf` at half the server's saturation, nearly all
//! of the tokenization threads' samples were in `sched_yield`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of threads taking jobs from one queue, in the order given.
pub struct Workers {
    jobs: Sender<Job>,
}

impl Workers {
    /// `count` threads (at least one) named `{name}-{i}`. They end once the
    /// `Workers` is dropped and the jobs already given are done.
    pub fn new(count: usize, name: &str) -> std::io::Result<Self> {
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..count.max(1) {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&queue))?;
        }
        Ok(Workers { jobs })
    }

    /// Hands `job` to the next free thread.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        // The threads outlive every `Workers` handle, so the queue is open.
        let _ = self.jobs.send(Box::new(job));
    }
}

/// One thread's loop: the next job, until the queue is closed. A job that panics
/// ends only itself (its caller sees its reply channel closed), not the thread.
fn work(queue: &Mutex<Receiver<Job>>) {
    loop {
        let next = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        match next {
            Ok(job) => {
                let _ = catch_unwind(AssertUnwindSafe(job));
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_runs_and_a_panic_leaves_the_thread_working() {
        let workers = Workers::new(1, "test-worker").unwrap();
        let (tx, rx) = channel();
        workers.spawn(|| panic!("a job's bug"));
        for i in 0..10 {
            let tx = tx.clone();
            workers.spawn(move || tx.send(i).unwrap());
        }
        // A dead thread would leave these unanswered: wait a bounded time, not forever.
        let got: Vec<i32> = (0..10)
            .map(|_| rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }
}
