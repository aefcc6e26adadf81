//! The one progress display of the command line, for every engine's
//! [`roamdisk_blockdev::Progress`]: a terminal bar (indicatif) when stderr
//! is a terminal, a plain line every 5 seconds when it is not, JSON lines
//! with `--json`, nothing with `-q`.

use parking_lot::Mutex;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use roamdisk_blockdev::progress::{Progress, Unit};
use roamdisk_blockdev::units::format_size;

/// What the user asked to see.
#[derive(Debug, Clone, Copy, Default)]
pub struct Output {
    /// `-q`: nothing.
    pub quiet: bool,
    /// `--json`: JSON lines on stderr (`{"phase", "done", "total"}`,
    /// `{"note"}`) instead of a bar.
    pub json: bool,
}

impl Output {
    /// Progress for a person (bars or lines), or nothing when `quiet`: for
    /// commands whose `--json` is about their result, not their progress.
    pub fn human(quiet: bool) -> Output {
        Output { quiet, json: false }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Quiet,
    Json,
    Bar,
    Lines,
}

struct State {
    phase: &'static str,
    unit: Unit,
    total: u64,
    done: u64,
    last: Instant,
    bar: Option<ProgressBar>,
}

/// Draws progress as [`Output`] says.
pub struct Reporter {
    mode: Mode,
    state: Mutex<State>,
}

impl Reporter {
    pub fn new(out: Output) -> Reporter {
        let mode = if out.json {
            Mode::Json
        } else if out.quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            Mode::Bar
        } else {
            Mode::Lines
        };
        Reporter {
            mode,
            state: Mutex::new(State {
                phase: "",
                unit: Unit::Items,
                total: 0,
                done: 0,
                last: Instant::now(),
                bar: None,
            }),
        }
    }

    /// Close the last phase (clear the bar, print the last JSON line).
    pub fn finish(&self) {
        self.end();
    }

    fn json_line(s: &State) {
        eprintln!(
            "{}",
            serde_json::json!({"phase": s.phase, "done": s.done, "total": s.total})
        );
    }

    fn amount(unit: Unit, n: u64) -> String {
        match unit {
            Unit::Bytes => format_size(n),
            Unit::Items => n.to_string(),
        }
    }

    fn show(&self, s: &mut State) {
        match self.mode {
            Mode::Bar => {
                if let Some(b) = &s.bar {
                    b.set_position(s.done);
                }
            }
            Mode::Json if s.last.elapsed() > Duration::from_millis(500) => {
                s.last = Instant::now();
                Self::json_line(s);
            }
            Mode::Lines if s.last.elapsed() > Duration::from_secs(5) => {
                s.last = Instant::now();
                eprintln!(
                    "roamdisk: {} {:.0}% ({} of {})",
                    s.phase,
                    s.done as f64 * 100.0 / s.total.max(1) as f64,
                    Self::amount(s.unit, s.done),
                    Self::amount(s.unit, s.total)
                );
            }
            _ => {}
        }
    }
}

impl Progress for Reporter {
    fn start(&self, name: &'static str, total: u64, unit: Unit) {
        self.end();
        let mut s = self.state.lock();
        s.phase = name;
        s.unit = unit;
        s.total = total;
        s.done = 0;
        s.last = Instant::now();
        match self.mode {
            Mode::Bar => {
                let template = match (unit, total) {
                    // A stream of unknown length (a VM's migration stream).
                    (Unit::Bytes, 0) => "{msg:>16} {bytes} {bytes_per_sec}",
                    (Unit::Bytes, _) => {
                        "{msg:>16} [{bar:36}] {bytes}/{total_bytes} {bytes_per_sec} {eta} left"
                    }
                    (Unit::Items, _) => "{msg:>16} [{bar:36}] {percent:>3}% {eta} left",
                };
                let b = ProgressBar::new(total);
                b.set_style(
                    ProgressStyle::with_template(template)
                        .expect("valid template")
                        .progress_chars("=> "),
                );
                b.set_message(name);
                s.bar = Some(b);
            }
            Mode::Json => Self::json_line(&s),
            _ => {}
        }
    }

    fn advance(&self, n: u64) {
        let mut s = self.state.lock();
        s.done += n;
        self.show(&mut s);
    }

    fn set(&self, done: u64) {
        let mut s = self.state.lock();
        s.done = done;
        self.show(&mut s);
    }

    fn end(&self) {
        let mut s = self.state.lock();
        if let Some(b) = s.bar.take() {
            b.finish_and_clear();
        }
        if self.mode == Mode::Json && !s.phase.is_empty() {
            Self::json_line(&s);
        }
        s.phase = "";
    }

    fn note(&self, msg: &str) {
        match self.mode {
            Mode::Quiet => {}
            Mode::Json => eprintln!("{}", serde_json::json!({ "note": msg })),
            Mode::Bar => match &self.state.lock().bar {
                Some(b) => b.println(format!("roamdisk: {msg}")),
                None => eprintln!("roamdisk: {msg}"),
            },
            Mode::Lines => eprintln!("roamdisk: {msg}"),
        }
    }
}
