//! The engine's speed, measured once at start, and the queue bound derived from
//! it. A bound in tokens means seconds of waiting that differ by model and CPU
//! (262,144 tokens are 20 s of MiniLM's work on two cores and minutes of
//! MPNet's); a bound made from the measured rate holds the same few seconds of
//! work everywhere, so an overloaded server refuses at once (429) instead of
//! admitting requests that would time out in the queue.

use std::time::{Duration, Instant};

use attend_models::models::{SentenceEncoder, Sequence};
use rayon::ThreadPool;

/// The work a queue holds when its bound is not given.
pub const QUEUE_WORK: Duration = Duration::from_secs(5);

/// Tokens of the timed pass: from a few hundred rows the dense layers run at
/// their full speed, so a larger pass would only lengthen the start.
pub const TIMED_TOKENS: usize = 512;

/// Tokens of each text of the timed pass, where the model allows that many: the
/// length of a paragraph, so that attention weighs as it does in real traffic.
pub const TEXT_TOKENS: usize = 128;

/// Timed passes; the fastest is the engine's own speed, the others having been
/// slowed by whatever else the machine ran meanwhile.
pub const TIMED_PASSES: usize = 3;

/// The engine's rate in tokens per second: one pass of a short text first (it
/// touches every weight once, as the first request would), then the fastest of
/// [`TIMED_PASSES`] passes of [`TIMED_TOKENS`] tokens in texts of [`TEXT_TOKENS`],
/// on `pool`.
pub fn measure(encoder: &SentenceEncoder, pool: &ThreadPool) -> Result<f64, String> {
    let paragraph = "Every server measures how fast its engine embeds a paragraph of plain text \
                     once, when it starts, and keeps a few seconds of that work in its queue. "
        .repeat(TEXT_TOKENS / 8);
    let text = encoder
        .tokenizer
        .encode(&paragraph)
        .map_err(|e| e.to_string())?;
    let len = text.ids.len().min(TEXT_TOKENS);
    let one = Sequence {
        ids: &text.ids[..len],
        type_ids: &text.type_ids[..len],
    };
    let engine = encoder.engine();
    let warm = Sequence {
        ids: &one.ids[..len.min(16)],
        type_ids: &one.type_ids[..len.min(16)],
    };
    let texts = vec![one; TIMED_TOKENS.div_ceil(len)];
    pool.install(|| {
        engine.embed(&[warm])?;
        let mut fastest = Duration::MAX;
        for _ in 0..TIMED_PASSES {
            let start = Instant::now();
            engine.embed(&texts)?;
            fastest = fastest.min(start.elapsed());
        }
        Ok((texts.len() * len) as f64 / fastest.as_secs_f64())
    })
    .map_err(|e: attend_core::Error| e.to_string())
}

/// The queue bound for an engine of `rate` tokens per second: [`QUEUE_WORK`] of
/// its work, at most half of `request_timeout` (an admitted text is then
/// answered before its time is up even if the engine runs slower under load
/// than when measured), and at least two passes of `max_batch_tokens`.
pub fn queue_bound(rate: f64, request_timeout: Duration, max_batch_tokens: usize) -> usize {
    let work = QUEUE_WORK.min(request_timeout / 2);
    let tokens = (rate * work.as_secs_f64()) as usize;
    tokens.max(2 * max_batch_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_five_seconds_of_work_within_half_the_timeout_and_two_passes() {
        let minute = Duration::from_secs(60);
        assert_eq!(queue_bound(13_000.0, minute, 2_048), 65_000);
        // A short timeout: half of it.
        assert_eq!(queue_bound(13_000.0, Duration::from_secs(2), 2_048), 13_000);
        // A slow engine: still two passes.
        assert_eq!(queue_bound(100.0, minute, 2_048), 4_096);
    }
}
