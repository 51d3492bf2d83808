//! A one-line progress display on stderr for `attend embed --input` (only drawn
//! when stderr is a terminal): texts done, texts per second, and, when the input's
//! size is known, the share done and the time left.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::io::console::{err, errln};
use attend::corpus::Progress;

/// Redraws at most this often: a terminal need not see every batch.
const REDRAW: Duration = Duration::from_millis(200);
const WIDTH: usize = 24;

/// The progress line of one run.
pub struct ProgressBar {
    start: Instant,
    last: Option<Instant>,
    input_bytes: Option<u64>,
}

impl ProgressBar {
    /// A bar for an input of `input_bytes` bytes (unknown for standard input).
    pub fn new(input_bytes: Option<u64>) -> Self {
        ProgressBar {
            start: Instant::now(),
            last: None,
            input_bytes: input_bytes.filter(|&n| n > 0),
        }
    }

    /// Redraws the line if enough time has passed.
    pub fn update(&mut self, p: Progress) {
        let now = Instant::now();
        if self.last.is_some_and(|t| now - t < REDRAW) {
            return;
        }
        self.last = Some(now);
        let secs = (now - self.start).as_secs_f64();
        let rate = p.texts_done as f64 / secs.max(1e-9);
        let mut line = String::new();
        if let Some(total) = self.input_bytes {
            // Bytes are known per chunk read; the chunk's embedded share scales them.
            let share = if p.texts_read == 0 {
                0.0
            } else {
                (p.bytes_read as f64 * p.texts_done as f64 / p.texts_read as f64 / total as f64)
                    .min(1.0)
            };
            let filled = (share * WIDTH as f64).round() as usize;
            let left = if share > 0.0 {
                secs * (1.0 - share) / share
            } else {
                0.0
            };
            line.push_str(&format!(
                "[{}{}] {:3.0}%  ",
                "#".repeat(filled),
                "-".repeat(WIDTH - filled),
                share * 100.0
            ));
            line.push_str(&format!(
                "{} texts  {rate:.0} texts/s  {left:.0}s left",
                p.texts_done
            ));
        } else {
            line.push_str(&format!("{} texts  {rate:.0} texts/s", p.texts_done));
        }
        let mut err = std::io::stderr().lock();
        // \r and clear-to-end-of-line: the line is redrawn in place.
        let _ = write!(err, "\r{line}\x1b[K");
        let _ = err.flush();
    }

    /// Erases the line.
    pub fn clear(&self) {
        if self.last.is_some() {
            err!("\r\x1b[K");
        }
    }

    /// Replaces the line with the run's total.
    pub fn finish(self, texts: u64, output: &Path) {
        let secs = self.start.elapsed().as_secs_f64();
        errln!(
            "\r\x1b[Kembedded {texts} texts in {secs:.1} s ({:.0} texts/s) into {}",
            texts as f64 / secs.max(1e-9),
            output.display()
        );
    }
}
