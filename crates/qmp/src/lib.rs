//! A client of QEMU's machine protocol (QMP): one JSON object per line
//! over a Unix socket, a greeting, `qmp_capabilities`, then commands, each
//! answered by `{"return": ...}` or `{"error": {"class", "desc"}}`, with
//! asynchronous `{"event": ...}` lines in between (kept, not answered).
//! The protocol is QEMU's (docs/interop/qmp-spec in its tree); roamdisk
//! uses the commands every QEMU since 2.x has: `query-status`, `stop`,
//! `cont`, `quit`, `migrate`, `migrate-incoming`, `query-migrate`,
//! `migrate-set-parameters`, `query-migrate-parameters`.
//!
//! QEMU serves one QMP client per socket at a time: while this client is
//! connected, another one waits (and the other way round).

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// What went wrong talking to QEMU.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to QEMU's QMP socket {path}: {source} (start QEMU with `-qmp unix:{path},server=on,wait=off`)")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("QMP socket {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("QMP socket {path}: QEMU closed the connection{during}")]
    Closed { path: PathBuf, during: String },
    #[error("QMP socket {path}: not a QMP message: {line}")]
    Protocol { path: PathBuf, line: String },
    #[error("QEMU refused `{command}`: {desc} ({class})")]
    Refused {
        command: String,
        class: String,
        desc: String,
    },
    #[error("QMP socket {path}: {what}")]
    Unexpected { path: PathBuf, what: String },
}

pub type Result<T> = std::result::Result<T, Error>;

/// How long a reply may take (a `migrate` returns at once; `quit` and
/// `stop` drain the guest's disks first, which may wait on the network).
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest QMP message read (QEMU's replies are far shorter; a
/// peer that never ends its line is not buffered without bound).
const MAX_LINE: u64 = 16 << 20;

/// A migration as `query-migrate` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Migration {
    /// `none`, `setup`, `active`, `completed`, `failed`, `cancelled`...
    pub status: String,
    /// Why it failed (`error-desc`), when QEMU says.
    pub error: Option<String>,
    /// RAM bytes sent so far (source side; 0 when unknown).
    pub transferred: u64,
}

impl Migration {
    /// Whether the migration has ended, well or not.
    pub fn ended(&self) -> bool {
        matches!(self.status.as_str(), "completed" | "failed" | "cancelled")
    }
}

/// A connection to one QEMU's QMP socket, capabilities negotiated.
pub struct Qmp {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// Events received so far (`{"event": NAME, "data": ...}`).
    pub events: Vec<Value>,
    /// The `id` of the next command: a reply carries it back, so a late
    /// reply to an earlier command (one that timed out) is never taken
    /// for the answer to a later one.
    next_id: u64,
}

impl Qmp {
    /// Connect to the QMP socket at `path`, waiting up to `wait` for it to
    /// appear and accept (QEMU may still be starting), and negotiate.
    pub fn connect(path: &Path, wait: Duration) -> Result<Qmp> {
        let t0 = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e)
                    if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused)
                        && t0.elapsed() < wait =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(source) => {
                    return Err(Error::Connect {
                        path: path.to_path_buf(),
                        source,
                    })
                }
            }
        };
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        stream.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
        let writer = stream.try_clone().map_err(io)?;
        let mut q = Qmp {
            path: path.to_path_buf(),
            reader: BufReader::new(stream),
            writer,
            events: Vec::new(),
            next_id: 1,
        };
        let greeting = q.message("the greeting")?;
        if greeting.get("QMP").is_none() {
            return Err(q.unexpected(format!("expected QEMU's greeting, got {greeting}")));
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn unexpected(&self, what: String) -> Error {
        Error::Unexpected {
            path: self.path.clone(),
            what,
        }
    }

    /// The next message (an event, a reply or the greeting).
    fn message(&mut self, during: &str) -> Result<Value> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = std::io::Read::take(&mut self.reader, MAX_LINE)
                .read_line(&mut line)
                .map_err(|e| {
                    let source = if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
                    {
                        std::io::Error::new(
                            ErrorKind::TimedOut,
                            format!("no answer to {during} within {} s", REPLY_TIMEOUT.as_secs()),
                        )
                    } else {
                        e
                    };
                    Error::Io {
                        path: self.path.clone(),
                        source,
                    }
                })?;
            if n as u64 == MAX_LINE && !line.ends_with('\n') {
                return Err(Error::Protocol {
                    path: self.path.clone(),
                    line: format!("a line longer than {MAX_LINE} bytes"),
                });
            }
            if n == 0 {
                return Err(Error::Closed {
                    path: self.path.clone(),
                    during: format!(" (waiting for {during})"),
                });
            }
            if !line.trim().is_empty() {
                break;
            }
        }
        serde_json::from_str(line.trim()).map_err(|_| Error::Protocol {
            path: self.path.clone(),
            line: line.trim().chars().take(200).collect(),
        })
    }

    /// Run `command` with `arguments`; its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({ "execute": command, "id": id });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        writeln!(self.writer, "{msg}").map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        loop {
            let m = self.message(&format!("`{command}`"))?;
            if m.get("event").is_some() {
                self.events.push(m);
                continue;
            }
            // A reply to an earlier command (it timed out here): skip it.
            if m.get("id").is_some_and(|i| i.as_u64() != Some(id)) {
                continue;
            }
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                return Err(Error::Refused {
                    command: command.to_string(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            return Err(self.unexpected(format!("unexpected message {m}")));
        }
    }

    /// The VM's run state (`running`, `paused`, `inmigrate`,
    /// `postmigrate`, `shutdown`...).
    pub fn run_state(&mut self) -> Result<String> {
        let r = self.execute("query-status", None)?;
        r.get("status")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| self.unexpected(format!("query-status without a status: {r}")))
    }

    /// The migration's state (`query-migrate`).
    pub fn migration(&mut self) -> Result<Migration> {
        let r = self.execute("query-migrate", None)?;
        let num = |k: &str| r["ram"][k].as_u64().unwrap_or(0);
        Ok(Migration {
            status: r["status"].as_str().unwrap_or("none").to_string(),
            error: r["error-desc"].as_str().map(str::to_string),
            transferred: num("transferred"),
        })
    }

    /// Poll the migration until it ends or `timeout` passes; `seen` is
    /// called with every state read. Returns the last state.
    pub fn wait_migration(
        &mut self,
        timeout: Duration,
        mut seen: impl FnMut(&Migration) -> bool,
    ) -> Result<Migration> {
        let t0 = Instant::now();
        loop {
            let m = self.migration()?;
            if m.ended() || !seen(&m) {
                return Ok(m);
            }
            if t0.elapsed() > timeout {
                return Err(self.unexpected(format!(
                    "the migration did not end within {} s (status {})",
                    timeout.as_secs(),
                    m.status
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `quit`, then wait until QEMU closes the socket (it has flushed and
    /// closed its disks by then).
    /// A QEMU already gone (its socket closed or reset, even before the
    /// command could be written) has quit too.
    pub fn quit(mut self) -> Result<()> {
        let gone = |e: &Error| match e {
            Error::Closed { .. } => true,
            Error::Io { source, .. } => matches!(
                source.kind(),
                ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
            ),
            _ => false,
        };
        match self.execute("quit", None) {
            Ok(_) => {}
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
        // Events may still come while QEMU exits; the read timeout bounds
        // a QEMU that never closes.
        loop {
            match self.message("QEMU to exit") {
                Ok(_) => continue,
                Err(e) if gone(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A fake QEMU answering one scripted exchange: each (expected
    /// command, reply lines).
    fn fake(dir: &Path, script: Vec<(&'static str, Vec<&'static str>)>) -> PathBuf {
        let path = dir.join("qmp.sock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            writeln!(w, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
            for (cmd, replies) in script {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap() == 0 {
                    return;
                }
                assert!(line.contains(cmd), "{line} is not {cmd}");
                for rep in replies {
                    writeln!(w, "{rep}").unwrap();
                }
            }
        });
        path
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("roamdisk-qmp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Replies, events, errors, and a late reply to an earlier command
    /// (id 1, `qmp_capabilities`) skipped.
    #[test]
    fn replies_events_and_errors() {
        let d = tmp("replies");
        let p = fake(
            &d,
            vec![
                ("qmp_capabilities", vec![r#"{"return": {}}"#]),
                (
                    "query-status",
                    vec![
                        r#"{"event": "STOP", "data": {}}"#,
                        r#"{"return": {"status": "paused", "running": false}}"#,
                    ],
                ),
                (
                    "migrate",
                    vec![r#"{"error": {"class": "GenericError", "desc": "no"}}"#],
                ),
                (
                    "query-migrate",
                    vec![
                        r#"{"return": {"status": "active"}, "id": 1}"#,
                        r#"{"return": {"status": "failed", "error-desc": "broken pipe"}, "id": 4}"#,
                    ],
                ),
                ("quit", vec![]),
            ],
        );
        let mut q = Qmp::connect(&p, Duration::from_secs(5)).unwrap();
        assert_eq!(q.run_state().unwrap(), "paused");
        assert_eq!(q.events.len(), 1);
        let e = q
            .execute("migrate", Some(json!({"uri": "unix:/x"})))
            .unwrap_err();
        assert_eq!(e.to_string(), "QEMU refused `migrate`: no (GenericError)");
        let m = q.migration().unwrap();
        assert!(m.ended());
        assert_eq!(m.error.as_deref(), Some("broken pipe"));
        // The fake closes after `quit`: that is how QEMU exits.
        q.quit().unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_missing_socket_says_how_to_start_qemu() {
        let d = tmp("missing");
        let e = match Qmp::connect(&d.join("none.sock"), Duration::from_millis(100)) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("connected to nothing"),
        };
        assert!(e.contains("-qmp unix:"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn garbage_is_a_protocol_error_not_a_panic() {
        let d = tmp("garbage");
        let path = d.join("qmp.sock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            writeln!(s, "SSH-2.0-OpenSSH").unwrap();
        });
        let e = match Qmp::connect(&path, Duration::from_secs(5)) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("took garbage for QMP"),
        };
        assert!(e.contains("not a QMP message"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
