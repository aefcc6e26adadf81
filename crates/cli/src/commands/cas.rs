//! What the content-addressed image commands share (`commit`, `log`,
//! `checkout`, `tag`, `rm`, `gc`, `store`): where the chunk store is, the
//! user's key, and how progress is shown (terminal bar, periodic lines,
//! JSON lines, or nothing).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressStyle};
use roamdisk_blockdev::units::format_size;
use roamdisk_cas::store::{self, DynStore, StoreConfig};

/// Where the chunk store is, and the user's key.
#[derive(ClapArgs, Clone, Debug)]
pub struct StoreArgs {
    /// Chunk store: a directory or the http:// URL of `roamdisk store
    /// serve` (default: $ROAMDISK_STORE, else ~/.local/share/roamdisk/store).
    #[arg(long, value_name = "DIR|URL")]
    pub store: Option<String>,
    /// The user's key file (encrypted images; make one with `roamdisk
    /// store keygen`).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Parallel requests to an HTTP store.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub parallel: usize,
    /// Machine-readable output: the result as JSON on stdout, progress as
    /// JSON lines on stderr.
    #[arg(long)]
    pub json: bool,
}

impl StoreArgs {
    pub fn location(&self) -> String {
        self.store
            .clone()
            .unwrap_or_else(roamdisk_cas::layer::default_store)
    }

    /// Open the store; a local default store is created on first use.
    pub fn open(&self, create: bool) -> anyhow::Result<DynStore> {
        let loc = self.location();
        let opts = store::OpenOptions {
            create: create.then(StoreConfig::default),
            parallel: Some(self.parallel),
        };
        store::open(&loc, &opts).with_context(|| format!("cannot open chunk store {loc}"))
    }

    pub fn key(&self) -> anyhow::Result<Option<[u8; 32]>> {
        match &self.key_file {
            Some(p) => Ok(Some(roamdisk_cas::version::read_key_file(p)?)),
            None => Ok(None),
        }
    }
}

/// Parse a duration: `90`, `90s`, `15m`, `2h`, `1d`.
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num
        .parse()
        .with_context(|| format!("'{s}' is not a duration (e.g. 30s, 15m, 2h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => anyhow::bail!("'{s}': unknown duration unit '{unit}' (use s, m, h or d)"),
    };
    Ok(Duration::from_secs(secs))
}

enum Mode {
    Quiet,
    Json,
    Bar(ProgressBar),
    Lines,
}

struct State {
    phase: &'static str,
    total: u64,
    done: u64,
    last: Instant,
}

/// A progress display for the engine's [`roamdisk_cas::Progress`].
pub struct Progress {
    mode: Mode,
    state: Mutex<State>,
}

impl Progress {
    pub fn new(quiet: bool, json: bool) -> Progress {
        let mode = if json {
            Mode::Json
        } else if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            let b = ProgressBar::new(0);
            b.set_style(
                ProgressStyle::with_template(
                    "{msg:>16} [{bar:36}] {bytes}/{total_bytes} {bytes_per_sec} {eta} left",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            Mode::Bar(b)
        } else {
            Mode::Lines
        };
        Progress {
            mode,
            state: Mutex::new(State {
                phase: "",
                total: 0,
                done: 0,
                last: Instant::now(),
            }),
        }
    }

    fn json_line(s: &State) {
        eprintln!(
            "{}",
            serde_json::json!({"phase": s.phase, "done": s.done, "total": s.total})
        );
    }

    /// Clear the bar.
    pub fn finish(&self) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &self.mode {
            Mode::Bar(b) => b.finish_and_clear(),
            Mode::Json if !s.phase.is_empty() => Self::json_line(&s),
            _ => {}
        }
    }
}

impl roamdisk_cas::Progress for Progress {
    fn phase(&self, name: &'static str, total: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(self.mode, Mode::Json) && !s.phase.is_empty() {
            Self::json_line(&s);
        }
        *s = State {
            phase: name,
            total,
            done: 0,
            last: Instant::now(),
        };
        match &self.mode {
            Mode::Bar(b) => {
                b.set_message(name);
                b.set_length(total);
                b.set_position(0);
            }
            Mode::Json => Self::json_line(&s),
            _ => {}
        }
    }

    fn advance(&self, n: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.done += n;
        match &self.mode {
            Mode::Bar(b) => b.set_position(s.done),
            Mode::Json if s.last.elapsed() > Duration::from_millis(500) => {
                s.last = Instant::now();
                Self::json_line(&s);
            }
            Mode::Lines if s.last.elapsed() > Duration::from_secs(5) => {
                s.last = Instant::now();
                eprintln!(
                    "roamdisk: {} {:.0}% ({} of {})",
                    s.phase,
                    s.done as f64 * 100.0 / s.total.max(1) as f64,
                    format_size(s.done),
                    format_size(s.total)
                );
            }
            _ => {}
        }
    }

    fn note(&self, msg: &str) {
        match &self.mode {
            Mode::Quiet => {}
            Mode::Json => eprintln!("{}", serde_json::json!({ "note": msg })),
            Mode::Bar(b) => b.println(format!("roamdisk: {msg}")),
            Mode::Lines => eprintln!("roamdisk: {msg}"),
        }
    }
}

/// `3f2a1b9c0d1e` from a hex version id.
pub fn short(hex: &str) -> &str {
    &hex[..12.min(hex.len())]
}
