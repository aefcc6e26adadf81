//! Devices for testing layers: [`CrashDev`] keeps a live and a durable
//! image and can simulate a power loss at the N-th I/O, losing, reordering
//! and tearing (at sector granularity) every write that was not flushed.
//!
//! Several crash devices (and other crash-simulating stores) can share one
//! [`Countdown`], so "the N-th I/O" counts across all of a layer's files.
//!
//! [`simfs`] does the same for whole files and directory entries: the
//! simulated file system the crash tests of `durable` run on.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::dev::{push_extent, Alloc, BlockDev, Caps, Extent, WriteFlags, ZeroFlags};
use crate::error::{Error, ErrorKind, Op, Result};

pub mod simfs;

/// Sector size at which unflushed writes may tear.
pub const SECTOR: usize = 512;

/// A shared I/O budget: every write-like call and every flush spends one
/// unit; when the budget is spent the "power fails" and every later call
/// fails.
#[derive(Debug, Default)]
pub struct Countdown {
    left: AtomicU64,
    armed: AtomicBool,
    crashed: AtomicBool,
    spent: AtomicU64,
}

impl Countdown {
    /// A countdown that never fires (counts I/Os only).
    pub fn unarmed() -> Arc<Countdown> {
        Arc::new(Countdown::default())
    }

    /// Crash when the `n`-th I/O (1-based) is attempted: the first `n - 1`
    /// I/Os happen, the `n`-th and all later ones fail.
    pub fn crash_at(n: u64) -> Arc<Countdown> {
        let c = Countdown::default();
        c.left.store(n.saturating_sub(1), Ordering::SeqCst);
        c.armed.store(true, Ordering::SeqCst);
        Arc::new(c)
    }

    /// Spend one I/O; `false` when the power is (now) off.
    pub fn spend(&self) -> bool {
        if self.crashed.load(Ordering::SeqCst) {
            return false;
        }
        self.spent.fetch_add(1, Ordering::SeqCst);
        if !self.armed.load(Ordering::SeqCst) {
            return true;
        }
        let ok = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
            .is_ok();
        if !ok {
            self.crashed.store(true, Ordering::SeqCst);
        }
        ok
    }

    /// Whether the crash happened.
    pub fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// I/Os attempted so far.
    pub fn spent(&self) -> u64 {
        self.spent.load(Ordering::SeqCst)
    }
}

/// A tiny deterministic PRNG (xorshift64*), so crash images are
/// reproducible from a seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    /// `n` pseudo-random bytes: test data that neither compresses nor
    /// reads as zeroes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// Run a tool that makes a test image (`mke2fs`, `mkntfs`, `sfdisk`...)
/// with `stdin` as its input. Panics when the tool is missing or fails:
/// the test setup installs them, and a test never skips for lack of one.
pub fn run_tool(cmd: &str, args: &[&str], stdin: Option<&[u8]>) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut c = Command::new(cmd);
    c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    if stdin.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd} is required (scripts/test installs it): {e}"));
    if let Some(s) = stdin {
        let mut input = child.stdin.take().expect("piped stdin");
        input.write_all(s).expect("write the tool's input");
    }
    let out = child.wait_with_output().expect("wait for the tool");
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct CrashState {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last flush, in order: (offset, bytes).
    unsynced: Vec<(u64, Vec<u8>)>,
}

/// A RAM disk with a live and a durable image.
pub struct CrashDev {
    state: Mutex<CrashState>,
    countdown: Arc<Countdown>,
}

impl CrashDev {
    /// A zero-filled device.
    pub fn new(size: usize, countdown: Arc<Countdown>) -> CrashDev {
        Self::from_image(vec![0u8; size], countdown)
    }

    /// A device whose live and durable images start as `image`.
    pub fn from_image(image: Vec<u8>, countdown: Arc<Countdown>) -> CrashDev {
        CrashDev {
            state: Mutex::new(CrashState {
                durable: image.clone(),
                live: image,
                unsynced: Vec::new(),
            }),
            countdown,
        }
    }

    fn power(&self, op: Op) -> Result<()> {
        if self.countdown.spend() {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Io,
                op,
                "crash",
                "simulated power loss",
            ))
        }
    }

    /// The live image (what a reader sees before a crash).
    pub fn live(&self) -> Vec<u8> {
        self.state.lock().live.clone()
    }

    /// The image a reboot would find: the durable image plus a random
    /// subset of the unflushed writes, applied in random order, each torn
    /// at sector granularity with some probability.
    pub fn crash_image(&self, rng: &mut Rng) -> Vec<u8> {
        let st = self.state.lock();
        let mut img = st.durable.clone();
        let mut order: Vec<usize> = (0..st.unsynced.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for i in order {
            let (off, data) = &st.unsynced[i];
            match rng.below(3) {
                0 => {} // lost
                1 => img[*off as usize..*off as usize + data.len()].copy_from_slice(data),
                _ => {
                    // torn: each sector independently
                    let mut pos = 0usize;
                    while pos < data.len() {
                        let abs = *off as usize + pos;
                        let n = (SECTOR - abs % SECTOR).min(data.len() - pos);
                        if rng.chance(1, 2) {
                            img[abs..abs + n].copy_from_slice(&data[pos..pos + n]);
                        }
                        pos += n;
                    }
                }
            }
        }
        img
    }
}

impl BlockDev for CrashDev {
    crate::layer!("crash");
    fn size(&self) -> u64 {
        self.state.lock().live.len() as u64
    }
    fn caps(&self) -> Caps {
        Caps {
            can_fast_zero: false,
            ..Caps::FULL
        }
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        if self.countdown.crashed() {
            return Err(Error::new(
                ErrorKind::Io,
                Op::Read,
                "crash",
                "simulated power loss",
            ));
        }
        let st = self.state.lock();
        buf.copy_from_slice(&st.live[off as usize..off as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.power(Op::Write)?;
        {
            let mut st = self.state.lock();
            st.live[off as usize..off as usize + buf.len()].copy_from_slice(buf);
            st.unsynced.push((off, buf.to_vec()));
        }
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.power(Op::Flush)?;
        let mut st = self.state.lock();
        st.durable = st.live.clone();
        st.unsynced.clear();
        Ok(())
    }
    fn trim(&self, _off: u64, _len: u64, _flags: WriteFlags) -> Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        crate::dev::write_zero_buffers(self, off, len, flags.fua)
    }
    fn block_status(&self, _off: u64, len: u64) -> Result<Vec<Extent>> {
        let mut v = Vec::new();
        push_extent(
            &mut v,
            Extent {
                len,
                state: Alloc::Data,
            },
        );
        Ok(v)
    }
}

/// A fresh temporary directory and the path of `name` inside it, for tests
/// that need one scratch file. Keep the directory alive (bind it to `_d`,
/// not `_`) for as long as the path is used.
pub fn scratch(name: impl AsRef<std::path::Path>) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let path = dir.path().join(name);
    (dir, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushed_writes_survive_and_unflushed_may_not() {
        let cd = Countdown::unarmed();
        let d = CrashDev::new(4096, cd);
        d.write_at(&[1u8; 1024], 0, WriteFlags::default()).unwrap();
        d.flush().unwrap();
        d.write_at(&[2u8; 1024], 0, WriteFlags::default()).unwrap();
        let mut seen_old = false;
        let mut seen_new = false;
        for s in 0..64 {
            let img = d.crash_image(&mut Rng::new(s));
            for sector in img[..1024].chunks(SECTOR) {
                assert!(sector.iter().all(|&b| b == 1) || sector.iter().all(|&b| b == 2));
                seen_old |= sector[0] == 1;
                seen_new |= sector[0] == 2;
            }
        }
        assert!(seen_old && seen_new);
    }

    #[test]
    fn countdown_stops_io() {
        let cd = Countdown::crash_at(3);
        let d = CrashDev::new(4096, cd.clone());
        d.write_at(&[1], 0, WriteFlags::default()).unwrap();
        d.flush().unwrap();
        assert!(d.write_at(&[1], 0, WriteFlags::default()).is_err());
        assert!(cd.crashed());
        assert!(d.flush().is_err());
    }
}
