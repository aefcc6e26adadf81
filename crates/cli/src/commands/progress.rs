//! Progress display for long work: a terminal bar (indicatif) unless
//! quiet or stderr is not a terminal, where periodic log lines are printed
//! instead.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
    lines: Option<std::cell::Cell<Instant>>,
    total: u64,
    what: &'static str,
}

impl Progress {
    /// Progress over `total` units (bytes or blocks).
    pub fn new(quiet: bool, total: u64, what: &'static str) -> Progress {
        if quiet {
            return Progress {
                bar: None,
                lines: None,
                total,
                what,
            };
        }
        if std::io::stderr().is_terminal() {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template("{msg:>12} [{bar:40}] {percent:>3}% {eta} left")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            b.set_message(what);
            return Progress {
                bar: Some(b),
                lines: None,
                total,
                what,
            };
        }
        Progress {
            bar: None,
            lines: Some(std::cell::Cell::new(Instant::now())),
            total,
            what,
        }
    }

    pub fn set(&self, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        } else if let Some(last) = &self.lines {
            if last.get().elapsed() > Duration::from_secs(5) {
                last.set(Instant::now());
                eprintln!(
                    "roamdisk: {} {:.0}%",
                    self.what,
                    done as f64 * 100.0 / self.total.max(1) as f64
                );
            }
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
