//! A real Linux guest for the tests: qemu-system-x86_64 (TCG), a Debian
//! kernel and a small initramfs, all prepared by `scripts/guest-setup` in
//! `$ROAMDISK_GUEST_DIR` (default `~/.cache/roamdisk/guest`). The guest's
//! disks are NBD exports (qemu's own NBD client); its `/init` runs a shell
//! script the test passes in (through fw_cfg), prints `roamdisk-guest:
//! exit N` and powers off. The first serial port is the console (kernel
//! log and all); the second carries only the script's output, between
//! the start and exit lines. See docs/testing-guest.md.
//!
//! [`Guest::run`] is the whole round: script in; console, output and exit
//! status out. [`Guest::spawn`] gives a [`RunningGuest`] to watch the
//! output or drive the VM over QMP while the script runs.

#![allow(
    clippy::disallowed_methods,
    reason = "tests read their environment (ROAMDISK_BIN, the S3 endpoint)"
)]
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::{kill_and_reap, path_str};

/// The line the guest prints before the test's script.
pub const START_MARK: &str = "roamdisk-guest: start";
/// The line the guest prints after the script, followed by its status.
pub const EXIT_MARK: &str = "roamdisk-guest: exit ";

/// The kernel command line: the console on the first serial port, and a
/// panic ends the run at once (qemu runs with `-no-reboot`).
const KERNEL_ARGS: &str = "console=ttyS0 panic=-1";

/// What `scripts/guest-setup` made: the qemu wrapper, kernel, initramfs.
#[derive(Debug, Clone)]
pub struct GuestKit {
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
}

impl GuestKit {
    /// The kit in `$ROAMDISK_GUEST_DIR` (default `~/.cache/roamdisk/guest`);
    /// panics, naming `scripts/guest-setup`, if any part is missing.
    pub fn find() -> GuestKit {
        let dir = match std::env::var_os("ROAMDISK_GUEST_DIR") {
            Some(d) => PathBuf::from(d),
            None => PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/roamdisk/guest"),
        };
        let kit = GuestKit {
            qemu: dir.join("qemu-system-x86_64"),
            kernel: dir.join("kernel/vmlinuz"),
            initramfs: dir.join("initramfs.gz"),
        };
        for p in [&kit.qemu, &kit.kernel, &kit.initramfs] {
            assert!(
                p.is_file(),
                "{} is missing: run scripts/guest-setup (scripts/test runs it)",
                p.display()
            );
        }
        kit
    }
}

/// A guest to boot: memory, disks, and a folder for its files (script,
/// console, output, qemu's log, the QMP socket).
#[derive(Debug, Clone)]
pub struct Guest {
    kit: GuestKit,
    dir: PathBuf,
    memory_mib: u32,
    disks: Vec<String>,
    extra: Vec<String>,
    /// Run QEMU through this command (`setpriv ...`).
    wrapper: Vec<String>,
    /// A third serial port the test writes to (the guest reads
    /// `/dev/ttyS2`).
    control: bool,
}

impl Guest {
    /// A guest with 256 MiB and no disk, its files in DIR.
    pub fn new(dir: &Path) -> Guest {
        Guest {
            kit: GuestKit::find(),
            dir: dir.to_path_buf(),
            memory_mib: 256,
            disks: Vec::new(),
            extra: Vec::new(),
            wrapper: Vec::new(),
            control: false,
        }
    }

    /// Let the last disk added wait up to SECS for its NBD server to come
    /// back (QEMU reconnects) instead of failing the guest's I/O.
    pub fn reconnect(mut self, secs: u32) -> Guest {
        let last = self
            .disks
            .last_mut()
            .expect("Guest::reconnect follows Guest::nbd_disk");
        last.push_str(&format!(",reconnect-delay={secs}"));
        self
    }

    /// Run QEMU as `PREFIX... qemu ARGS` (e.g. `setpriv` dropping a
    /// capability).
    pub fn wrap(mut self, prefix: &[&str]) -> Guest {
        self.wrapper = prefix.iter().map(|a| a.to_string()).collect();
        self
    }

    /// Give the guest a third serial port, `/dev/ttyS2`, that
    /// [`RunningGuest::send_control`] writes lines to.
    pub fn control(mut self) -> Guest {
        self.control = true;
        self
    }

    /// Add a virtio disk (the next `/dev/vdX`) on the export EXPORT (""
    /// for the default one) of the NBD server listening on SOCKET.
    pub fn nbd_disk(mut self, socket: &Path, export: &str) -> Guest {
        let node = format!("disk{}", self.disks.len());
        let mut blockdev = format!(
            "driver=nbd,node-name={node},server.type=unix,server.path={}",
            path_str(socket)
        );
        if !export.is_empty() {
            blockdev.push_str(&format!(",export={export}"));
        }
        self.disks.push(blockdev);
        self
    }

    /// Let the last disk added pass the guest's discards (TRIM, `fstrim`)
    /// on to its NBD server: qemu drops them unless the node says
    /// `discard=unmap`.
    pub fn discard(mut self) -> Guest {
        let last = self
            .disks
            .last_mut()
            .expect("Guest::discard follows Guest::nbd_disk");
        last.push_str(",discard=unmap");
        self
    }

    pub fn memory_mib(mut self, mib: u32) -> Guest {
        self.memory_mib = mib;
        self
    }

    /// Add qemu arguments after the ones the guest always has (devices,
    /// `-incoming`...).
    pub fn qemu_args(mut self, args: &[&str]) -> Guest {
        self.extra.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// The folder holding the guest's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The qemu arguments for a run of SCRIPT (a file).
    fn args(&self, script: &Path, files: &RunFiles) -> Vec<String> {
        let mut a: Vec<String> = [
            "-accel",
            "tcg",
            // Every feature TCG emulates: more than twice as fast as the
            // default qemu64 model (mke2fs 4 s -> 0.2 s).
            "-cpu",
            "max",
            "-M",
            "pc",
            "-m",
            &self.memory_mib.to_string(),
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-kernel",
            path_str(&self.kit.kernel),
            "-initrd",
            path_str(&self.kit.initramfs),
            "-append",
            KERNEL_ARGS,
            "-serial",
            &format!("file:{}", path_str(&files.console)),
            "-serial",
            &format!("file:{}", path_str(&files.output)),
            "-qmp",
            &format!("unix:{},server=on,wait=off", path_str(&files.qmp)),
            "-fw_cfg",
            &format!("name=opt/roamdisk/script,file={}", path_str(script)),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if self.control {
            a.push("-serial".into());
            a.push(format!(
                "unix:{},server=on,wait=off",
                path_str(&files.control)
            ));
        }
        for (i, blockdev) in self.disks.iter().enumerate() {
            a.push("-blockdev".into());
            a.push(blockdev.clone());
            a.push("-device".into());
            a.push(format!("virtio-blk-pci,drive=disk{i}"));
        }
        a.extend(self.extra.iter().cloned());
        a
    }

    /// Boot the guest on SCRIPT (a busybox `sh -e` script; the real
    /// `mke2fs` is there too) and return at once.
    pub fn spawn(&self, script: &str) -> RunningGuest {
        let script_file = self.dir.join("guest-script.sh");
        std::fs::write(&script_file, script).expect("write the guest script");
        let files = RunFiles {
            console: self.dir.join("guest-console.log"),
            output: self.dir.join("guest-output.log"),
            qemu_log: self.dir.join("guest-qemu.log"),
            qmp: self.dir.join("guest-qmp.sock"),
            control: self.dir.join("guest-control.sock"),
        };
        for f in [&files.console, &files.output, &files.qmp, &files.control] {
            let _ = std::fs::remove_file(f);
        }
        let mut args = self.args(&script_file, &files);
        let mut program = self.kit.qemu.to_string_lossy().into_owned();
        if let Some((first, rest)) = self.wrapper.split_first() {
            let mut wrapped: Vec<String> = rest.to_vec();
            wrapped.push(program);
            wrapped.append(&mut args);
            args = wrapped;
            program = first.clone();
        }
        let command = format!("{program} {}", args.join(" "));
        let log = std::fs::File::create(&files.qemu_log).expect("qemu log");
        let child = Command::new(&program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("qemu log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}; run scripts/guest-setup",
                    self.kit.qemu.display()
                )
            });
        RunningGuest {
            child: Some(child),
            files,
            command,
            started: Instant::now(),
        }
    }

    /// Boot the guest on SCRIPT and wait until it powers off, killing it
    /// after TIMEOUT.
    pub fn run(&self, script: &str, timeout: Duration) -> GuestRun {
        self.spawn(script).wait(timeout)
    }
}

/// Where a run's serial ports, qemu's stdout and stderr, and QMP go.
#[derive(Debug, Clone)]
struct RunFiles {
    console: PathBuf,
    output: PathBuf,
    qemu_log: PathBuf,
    qmp: PathBuf,
    control: PathBuf,
}

/// The text of a file written by the guest or qemu ("" before it exists).
fn read_text(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// A guest that is booting or running its script.
pub struct RunningGuest {
    child: Option<Child>,
    files: RunFiles,
    command: String,
    started: Instant,
}

impl RunningGuest {
    /// The console so far.
    pub fn console(&self) -> String {
        read_text(&self.files.console)
    }

    /// The script's output so far (with the start line).
    pub fn output(&self) -> String {
        read_text(&self.files.output)
    }

    /// Wait until the script's output holds NEEDLE; panics (with the
    /// console) if the guest ends first or TIMEOUT passes.
    pub fn wait_output(&mut self, needle: &str, timeout: Duration) {
        let t0 = Instant::now();
        while !self.output().contains(needle) {
            let status = self.child.as_mut().expect("running").try_wait();
            if let Some(st) = status.expect("wait for qemu") {
                panic!(
                    "the guest ended ({st}) before printing {needle:?}:\n{}",
                    self.report()
                );
            }
            if t0.elapsed() > timeout {
                panic!(
                    "the guest did not print {needle:?} within {timeout:?}:\n{}",
                    self.report()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Write LINE to the guest's `/dev/ttyS2` ([`Guest::control`]).
    pub fn send_control(&self, line: &str) {
        let t0 = Instant::now();
        let mut s = loop {
            match UnixStream::connect(&self.files.control) {
                Ok(s) => break s,
                Err(e) if t0.elapsed() > Duration::from_secs(20) => {
                    panic!("the guest's control port: {e}\n{}", self.report())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        writeln!(s, "{line}").expect("write to the guest's control port");
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// QEMU's QMP socket (for `roamdisk suspend --qmp`, `resume --qmp`).
    pub fn qmp_socket(&self) -> &Path {
        &self.files.qmp
    }

    /// Run one QMP command (`{"execute": ...}` as JSON text) and return
    /// the reply line (`{"return": ...}` or `{"error": ...}`); events
    /// before it are skipped.
    pub fn qmp(&self, command: &str) -> String {
        let t0 = Instant::now();
        let stream = loop {
            match UnixStream::connect(&self.files.qmp) {
                Ok(s) => break s,
                Err(e) if t0.elapsed() > Duration::from_secs(20) => {
                    let qmp = self.files.qmp.display();
                    panic!("QMP socket {qmp}: {e}\n{}", self.report())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("QMP read timeout");
        let mut out = stream.try_clone().expect("QMP socket");
        let mut lines = BufReader::new(stream).lines();
        let mut reply = |cmd: &str| {
            writeln!(out, "{cmd}").expect("write to QMP");
            loop {
                let line = lines.next().expect("QMP closed").expect("read from QMP");
                if line.contains("\"return\"") || line.contains("\"error\"") {
                    return line;
                }
            }
        };
        let greeting = reply(r#"{"execute": "qmp_capabilities"}"#);
        assert!(greeting.contains("\"return\""), "QMP: {greeting}");
        reply(command)
    }

    /// Wait until the guest powers off, killing it after TIMEOUT (from
    /// now); the console and status of the run.
    pub fn wait(mut self, timeout: Duration) -> GuestRun {
        let mut child = self.child.take().expect("running");
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait for qemu") {
                break Some(st);
            }
            if t0.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let output = self.output();
        GuestRun {
            exit: script_exit(&output),
            console: self.console(),
            output,
            qemu_status: status,
            qemu: self.qemu_text(),
            elapsed: self.started.elapsed(),
        }
    }

    /// The command line and qemu's log, for a failure message.
    fn qemu_text(&self) -> String {
        format!(
            "command: {}\nqemu log:\n{}",
            self.command,
            read_text(&self.files.qemu_log)
        )
    }

    /// [`RunningGuest::qemu_text`] and the console, for a failure message.
    pub fn report(&self) -> String {
        format!("{}\nconsole:\n{}", self.qemu_text(), self.console())
    }
}

impl Drop for RunningGuest {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

/// The script's exit status from its output's `roamdisk-guest: exit N`.
fn script_exit(output: &str) -> Option<i32> {
    output
        .lines()
        .rev()
        .find_map(|l| l.trim_end().strip_prefix(EXIT_MARK))
        .and_then(|n| n.trim().parse().ok())
}

/// A finished guest run.
#[derive(Debug)]
pub struct GuestRun {
    /// Everything on the serial console (kernel log and script output).
    pub console: String,
    /// The second serial port: the start line, what the script printed
    /// (stdout and stderr), the exit line.
    pub output: String,
    /// The script's exit status, if the guest got to print it.
    pub exit: Option<i32>,
    /// qemu's exit status; None if it was killed at the timeout.
    pub qemu_status: Option<ExitStatus>,
    pub elapsed: Duration,
    /// The qemu command line and qemu's own stdout and stderr.
    qemu: String,
}

impl GuestRun {
    /// The script exited 0 and qemu then exited 0 by itself (power off).
    pub fn ok(&self) -> bool {
        self.exit == Some(0) && self.qemu_status.is_some_and(|s| s.success())
    }

    /// Panic with the whole story unless [`GuestRun::ok`].
    pub fn assert_ok(&self) {
        assert!(
            self.ok(),
            "guest run failed: script exit {:?}, qemu {:?}{}\n{}\nconsole:\n{}",
            self.exit,
            self.qemu_status,
            if self.qemu_status.is_none() {
                " (killed at the timeout)"
            } else {
                ""
            },
            self.qemu,
            self.console
        );
    }

    /// The qemu command line and qemu's own stdout and stderr.
    pub fn qemu_text(&self) -> &str {
        &self.qemu
    }

    /// What the script printed, line by line (without the start and exit
    /// lines).
    pub fn lines(&self) -> Vec<&str> {
        self.output
            .lines()
            .map(|l| l.trim_end_matches('\r'))
            .skip_while(|l| *l != START_MARK)
            .skip(1)
            .take_while(|l| !l.starts_with(EXIT_MARK))
            .collect()
    }

    /// The rest of the first output line that starts with PREFIX; panics
    /// if there is none.
    pub fn value(&self, prefix: &str) -> &str {
        self.lines()
            .into_iter()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| {
                panic!(
                    "no line {prefix:?} in the guest's output:\n{}",
                    self.console
                )
            })
    }
}
