//! `trace:FILE:NEXT` — records every request that passes through into a
//! trace file (binary, or CSV when FILE ends in `.csv`), optionally with
//! the written bytes in `FILE.data` so a replay reproduces the image.
//!
//! Each record carries the id of the client that issued the request: the
//! `client=N` option when given, else the client of the request's
//! [`IoContext`](roamdisk_blockdev::context::IoContext) (the NBD server
//! numbers each export's connections from 1), else 0 (no client: an
//! in-process stack, or the server's own flush at shutdown).
//!
//! The cost on the I/O path is one short critical section that appends a
//! few bytes to a buffer (see docs/BENCHMARKS.md); the file is written in
//! 64 KiB pieces and pushed to the OS at every flush, so the trace holds
//! every request up to the last barrier even if the server is killed. A
//! failure to write the trace is logged once and stops the recording; it
//! never fails the guest's I/O.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use roamdisk_blockdev::context;
use roamdisk_blockdev::{
    BlockDev, Error, ErrorKind, Extent, LayerKind, Op, OpenCtx, Result, WriteFlags, ZeroFlags,
};

use crate::format::payload::{sidecar_path, PayloadWriter};
use crate::format::{Format, Record, TraceError, TraceOp, Writer};

/// Options of a recorder.
#[derive(Debug, Clone, Default)]
pub struct RecorderOptions {
    /// Also record the bytes of every write in `FILE.data`.
    pub data: bool,
    /// Client id written into every record; `None`: the client of each
    /// request's context (0 when it has none).
    pub client: Option<u32>,
    /// Device id written into every record.
    pub device: u32,
}

struct Sink {
    trace: Writer,
    payload: Option<PayloadWriter>,
}

/// The recorder layer.
pub struct TraceDev {
    next: Arc<dyn BlockDev>,
    path: PathBuf,
    start: Instant,
    opts: RecorderOptions,
    sink: Mutex<Option<Sink>>,
    /// Set after the first write error: recording has stopped.
    broken: AtomicBool,
}

impl TraceDev {
    /// Start recording the requests to `next` into `path` (truncated).
    pub fn create(path: &Path, next: Arc<dyn BlockDev>, opts: RecorderOptions) -> Result<Self> {
        let open_err = |e: TraceError| {
            Error::new(
                ErrorKind::Io,
                Op::Open,
                "trace",
                format!("cannot create the trace: {e}"),
            )
            .path(path)
        };
        let trace = Writer::create(path, Format::from_path(path)).map_err(open_err)?;
        let payload = if opts.data {
            Some(PayloadWriter::create(&sidecar_path(path)).map_err(open_err)?)
        } else {
            None
        };
        Ok(TraceDev {
            next,
            path: path.to_path_buf(),
            start: Instant::now(),
            opts,
            sink: Mutex::new(Some(Sink { trace, payload })),
            broken: AtomicBool::new(false),
        })
    }

    fn record(&self, op: TraceOp, offset: u64, len: u64, data: Option<&[u8]>) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        let client = self
            .opts
            .client
            .or_else(|| context::current().client)
            .unwrap_or(0);
        let mut guard = self.sink.lock();
        let Some(sink) = guard.as_mut() else { return };
        let time_ns = self.start.elapsed().as_nanos() as u64;
        // A request longer than a record can hold is split into fragments,
        // as a guest driver splits a request into a scatter-gather list.
        let mut done = 0u64;
        let mut fragment = 0u16;
        let res: std::result::Result<(), TraceError> = (|| {
            loop {
                let piece = (len - done).min(u32::MAX as u64 & !4095);
                let rec = Record {
                    time_ns,
                    client,
                    device: self.opts.device,
                    op,
                    offset: offset + done,
                    len: piece as u32,
                    fragment,
                };
                sink.trace.write(&rec)?;
                if let (Some(p), Some(d)) = (sink.payload.as_mut(), data) {
                    p.write(&d[done as usize..(done + piece) as usize])?;
                }
                done += piece;
                fragment = fragment.wrapping_add(1);
                if done >= len {
                    break;
                }
            }
            if op == TraceOp::Flush {
                sink.trace.flush()?;
                if let Some(p) = sink.payload.as_mut() {
                    p.flush()?;
                }
            }
            Ok(())
        })();
        if let Err(e) = res {
            self.broken.store(true, Ordering::Relaxed);
            *guard = None;
            tracing::error!(path = %self.path.display(), error = %e, "trace recording stopped");
        }
    }
}

impl Drop for TraceDev {
    fn drop(&mut self) {
        let sink = self.sink.get_mut().take();
        if let Some(s) = sink {
            let n = s.trace.count();
            let r = s
                .trace
                .finish()
                .and_then(|()| s.payload.map_or(Ok(()), PayloadWriter::finish));
            match r {
                Ok(()) => {
                    tracing::info!(path = %self.path.display(), records = n, "trace written")
                }
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "cannot finish the trace")
                }
            }
        }
    }
}

impl BlockDev for TraceDev {
    roamdisk_blockdev::layer!("trace", next);
    fn describe(&self) -> String {
        format!(
            "trace: recording to {}{}",
            self.path.display(),
            if self.opts.data {
                " (with write data)"
            } else {
                ""
            }
        )
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.record(TraceOp::Read, off, buf.len() as u64, None);
        self.next.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.record(TraceOp::Write, off, buf.len() as u64, Some(buf));
        self.next.write_at(buf, off, flags)
    }
    fn flush(&self) -> Result<()> {
        self.record(TraceOp::Flush, 0, 0, None);
        self.next.flush()
    }
    fn settle(&self) -> Result<()> {
        // Not a client request (the server settles at a disconnect), so it
        // is not recorded; the recorder holds no acknowledged writes.
        self.next.settle()
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.record(TraceOp::Trim, off, len, None);
        self.next.trim(off, len, flags)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.record(TraceOp::WriteZeroes, off, len, None);
        self.next.write_zeroes(off, len, flags)
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        self.next.block_status(off, len)
    }
}

fn parse_u32(ctx: &OpenCtx<'_>, name: &str) -> Result<Option<u32>> {
    match ctx.opt(name) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                "trace",
                format!("{name} must be a number from 0 to 4294967295, not '{v}'"),
            )
        }),
    }
}

/// `trace[data=on,client=N,device=N]:FILE:NEXT`.
pub static TRACE: LayerKind = LayerKind {
    name: "trace",
    summary: "record every request to NEXT in the trace FILE (.csv: CSV, else binary); see `roamdisk trace`",
    args: &["file"],
    options: &[
        ("data", "on: also record the written bytes in FILE.data, for byte-exact replay (default off)"),
        ("client", "client id written in every record, overriding the requester's (default: the NBD connection's id, 1, 2, ... per export; in `roamdisk replay`, the replayed client's; else 0)"),
        ("device", "device id written in every record (default 0)"),
    ],
    open: |ctx: &OpenCtx<'_>, next| {
        let file = ctx.path("trace", "file")?;
        let next = ctx.inner("trace", next)?;
        let data = ctx.flag("trace", "data")?.unwrap_or(false);
        let opts = RecorderOptions {
            data,
            client: parse_u32(ctx, "client")?,
            device: parse_u32(ctx, "device")?.unwrap_or(0),
        };
        Ok(Arc::new(TraceDev::create(&file, next, opts)?) as Arc<dyn BlockDev>)
    },
    ..LayerKind::WRAPPING
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::payload::{PayloadFile, PayloadIndex};
    use crate::format::Reader;
    use roamdisk_blockdev::{Access, Registry};

    #[test]
    fn records_every_request_with_its_data() {
        let (_dir, path) = roamdisk_blockdev::testkit::scratch("t.rdtrace");
        let mut reg = Registry::with_builtin();
        reg.add(&TRACE);
        let spec = format!("trace[data=on,device=3,client=7]:{}:mem:1M", path.display());
        let dev = reg.build(&spec, Access::ReadWrite).unwrap();
        dev.write_at(&[1u8; 4096], 8192, WriteFlags::default())
            .unwrap();
        let mut b = [0u8; 512];
        dev.read_at(&mut b, 0).unwrap();
        dev.flush().unwrap();
        dev.trim(0, 4096, WriteFlags::default()).unwrap();
        dev.write_zeroes(4096, 4096, ZeroFlags::default()).unwrap();
        drop(dev);
        let recs: Vec<Record> = Reader::open(&path)
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap();
        let ops: Vec<_> = recs.iter().map(|r| (r.op, r.offset, r.len)).collect();
        assert_eq!(
            ops,
            vec![
                (TraceOp::Write, 8192, 4096),
                (TraceOp::Read, 0, 512),
                (TraceOp::Flush, 0, 0),
                (TraceOp::Trim, 0, 4096),
                (TraceOp::WriteZeroes, 4096, 4096),
            ]
        );
        assert!(recs.iter().all(|r| r.client == 7 && r.device == 3));
        assert!(recs.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        let data = sidecar_path(&path);
        let mut idx = PayloadIndex::open(&data).unwrap();
        let at = idx.next(4096).unwrap();
        let mut buf = vec![0u8; 4096];
        PayloadFile::open(&data)
            .unwrap()
            .read(&mut buf, at)
            .unwrap();
        assert_eq!(buf, vec![1u8; 4096]);
        assert!(idx.next(4096).is_err(), "only one write was recorded");
    }

    /// The client of each request's context, unless `client=N` says
    /// otherwise; 0 outside any context.
    #[test]
    fn records_the_requesting_client_unless_overridden() {
        use roamdisk_blockdev::context::{with_context, IoContext};
        let dir = tempfile::tempdir().unwrap();
        let mut reg = Registry::with_builtin();
        reg.add(&TRACE);
        for (opt, want) in [("", [3, 4, 0]), ("[client=9]", [9, 9, 9])] {
            let path = dir.path().join("t.rdtrace");
            let dev = reg
                .build(
                    &format!("trace{opt}:{}:mem:1M", path.display()),
                    Access::ReadWrite,
                )
                .unwrap();
            let w = |off| dev.write_at(&[1u8; 512], off, WriteFlags::default());
            with_context(IoContext::for_client(3), || w(0)).unwrap();
            with_context(IoContext::for_client(4), || w(512)).unwrap();
            w(1024).unwrap();
            drop(dev);
            let clients: Vec<u32> = Reader::open(&path)
                .unwrap()
                .map(|r| r.unwrap().client)
                .collect();
            assert_eq!(clients, want, "trace{opt}");
        }
    }

    #[test]
    fn bad_options_are_refused() {
        let mut reg = Registry::with_builtin();
        reg.add(&TRACE);
        let e = reg
            .build("trace[data=maybe]:/tmp/x.rdtrace:mem:1M", Access::ReadWrite)
            .err()
            .unwrap();
        assert!(e.to_string().contains("data must be on or off"), "{e}");
        let e = reg
            .build("trace:/nonexistent-dir/x.rdtrace:mem:1M", Access::ReadWrite)
            .err()
            .unwrap();
        assert!(e.to_string().contains("cannot create the trace"), "{e}");
    }
}
