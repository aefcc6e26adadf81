//! A small synchronous NBD client (fixed newstyle, OPT_GO, simple replies)
//! so `replay` and `sperf` can drive any NBD server, ours or qemu-nbd or
//! nbdkit, as a [`BlockDev`]. One connection carries one request at a
//! time; open one connection per client thread for parallelism.
//!
//! URIs: `nbd://HOST[:PORT][/EXPORT]` and
//! `nbd+unix:///[EXPORT]?socket=PATH` (the NBD URI specification's forms).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Mutex;

use roamdisk_blockdev::{
    write_zero_buffers, BlockDev, Caps, Error, ErrorKind, Op, Result, WriteFlags, ZeroFlags,
};
use roamdisk_nbd::proto::*;

/// Where an NBD export is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddr {
    Tcp(String),
    Unix(PathBuf),
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub addr: NbdAddr,
    pub export: String,
}

fn pct_decode(s: &str) -> std::result::Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("'{s}' is not UTF-8"))
}

impl NbdUri {
    /// Whether `s` looks like an NBD URI.
    pub fn is_uri(s: &str) -> bool {
        s.starts_with("nbd://") || s.starts_with("nbd+unix://")
    }

    pub fn parse(s: &str) -> std::result::Result<NbdUri, String> {
        if let Some(rest) = s.strip_prefix("nbd+unix://") {
            let (path, query) = rest.split_once('?').ok_or_else(|| {
                format!("'{s}': a Unix-socket NBD URI needs ?socket=PATH (nbd+unix:///EXPORT?socket=/tmp/nbd.sock)")
            })?;
            let path = path.strip_prefix('/').unwrap_or(path);
            let socket = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .ok_or_else(|| format!("'{s}': missing socket=PATH"))?;
            Ok(NbdUri {
                addr: NbdAddr::Unix(PathBuf::from(pct_decode(socket)?)),
                export: pct_decode(path)?,
            })
        } else if let Some(rest) = s.strip_prefix("nbd://") {
            let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
            if host.is_empty() {
                return Err(format!("'{s}': no host (nbd://HOST[:PORT]/EXPORT)"));
            }
            let has_port = if host.starts_with('[') {
                host.contains("]:")
            } else {
                host.contains(':')
            };
            let addr = if has_port {
                host.to_string()
            } else {
                format!("{host}:10809")
            };
            Ok(NbdUri {
                addr: NbdAddr::Tcp(addr),
                export: pct_decode(export.split('?').next().unwrap_or(""))?,
            })
        } else {
            Err(format!("'{s}' is not an NBD URI (nbd://HOST:PORT/EXPORT or nbd+unix:///EXPORT?socket=PATH)"))
        }
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.addr {
            NbdAddr::Tcp(a) => write!(f, "nbd://{a}/{}", self.export),
            NbdAddr::Unix(p) => write!(f, "nbd+unix:///{}?socket={}", self.export, p.display()),
        }
    }
}

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

struct Conn {
    s: Box<dyn Stream>,
    handle: u64,
    /// Set once the connection is in an unknown state.
    broken: bool,
}

/// One NBD connection as a block device.
pub struct NbdDev {
    conn: Mutex<Conn>,
    size: u64,
    flags: u16,
    max_request: u32,
    preferred: u32,
    name: String,
}

fn proto_err(op: Op, m: impl Into<String>) -> Error {
    Error::new(ErrorKind::Io, op, "nbd-client", m)
}

fn io_err(op: Op, e: std::io::Error) -> Error {
    Error::io(op, "nbd-client", e)
}

fn read_u16(r: &mut impl Read) -> std::io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn errno_kind(e: u32) -> ErrorKind {
    match e {
        EPERM => ErrorKind::ReadOnly,
        ENOSPC => ErrorKind::NoSpace,
        EINVAL | EOVERFLOW => ErrorKind::InvalidArgument,
        ENOTSUP => ErrorKind::Unsupported,
        ESHUTDOWN => ErrorKind::Shutdown,
        _ => ErrorKind::Io,
    }
}

impl NbdDev {
    /// Connect and negotiate `uri`'s export.
    pub fn connect(uri: &NbdUri) -> Result<NbdDev> {
        let op = Op::Open;
        let mut s: Box<dyn Stream> = match &uri.addr {
            NbdAddr::Tcp(a) => {
                let t = TcpStream::connect(a).map_err(|e| {
                    io_err(op, e).msg(format!("cannot connect to {a}: is the NBD server running?"))
                })?;
                let _ = t.set_nodelay(true);
                Box::new(t)
            }
            NbdAddr::Unix(p) => Box::new(UnixStream::connect(p).map_err(|e| {
                io_err(op, e)
                    .path(p)
                    .msg("cannot connect to the Unix socket: is the NBD server running?")
            })?),
        };
        let io = |e| io_err(op, e);
        if read_u64(&mut s).map_err(io)? != NBDMAGIC || read_u64(&mut s).map_err(io)? != IHAVEOPT {
            return Err(proto_err(
                op,
                "not an NBD server speaking the newstyle protocol",
            ));
        }
        let hflags = read_u16(&mut s).map_err(io)?;
        if hflags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(proto_err(
                op,
                "the server does not speak fixed newstyle NBD",
            ));
        }
        let mut cflags = FLAG_C_FIXED_NEWSTYLE;
        if hflags & FLAG_NO_ZEROES != 0 {
            cflags |= FLAG_C_NO_ZEROES;
        }
        let name = uri.export.as_bytes();
        if name.len() > MAX_STRING {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                op,
                "nbd-client",
                "export name too long",
            ));
        }
        let mut msg = Vec::new();
        msg.extend_from_slice(&cflags.to_be_bytes());
        msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&OPT_GO.to_be_bytes());
        msg.extend_from_slice(&(4 + name.len() as u32 + 2 + 2).to_be_bytes());
        msg.extend_from_slice(&(name.len() as u32).to_be_bytes());
        msg.extend_from_slice(name);
        msg.extend_from_slice(&1u16.to_be_bytes());
        msg.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        s.write_all(&msg).map_err(io)?;
        let mut size = None;
        let mut flags = 0u16;
        let mut max_request = 32 << 20;
        let mut preferred = 4096;
        loop {
            if read_u64(&mut s).map_err(io)? != OPT_REPLY_MAGIC {
                return Err(proto_err(op, "bad option reply magic"));
            }
            let _opt = read_u32(&mut s).map_err(io)?;
            let rtype = read_u32(&mut s).map_err(io)?;
            let len = read_u32(&mut s).map_err(io)?;
            if len > MAX_OPTION_LEN {
                return Err(proto_err(op, format!("option reply of {len} bytes")));
            }
            let mut data = vec![0u8; len as usize];
            s.read_exact(&mut data).map_err(io)?;
            match rtype {
                REP_ACK => break,
                REP_INFO if data.len() >= 2 => {
                    let t = u16::from_be_bytes([data[0], data[1]]);
                    if t == INFO_EXPORT && data.len() == 12 {
                        size = Some(u64::from_be_bytes(data[2..10].try_into().expect("8")));
                        flags = u16::from_be_bytes([data[10], data[11]]);
                    } else if t == INFO_BLOCK_SIZE && data.len() == 14 {
                        preferred = u32::from_be_bytes(data[6..10].try_into().expect("4"));
                        max_request = u32::from_be_bytes(data[10..14].try_into().expect("4"));
                    }
                }
                t if t & (1 << 31) != 0 => {
                    let text = String::from_utf8_lossy(&data);
                    let kind = if t == REP_ERR_UNKNOWN {
                        ErrorKind::NotFound
                    } else {
                        ErrorKind::Io
                    };
                    return Err(Error::new(
                        kind,
                        op,
                        "nbd-client",
                        format!(
                            "the server refused export '{}': {text} (error {t:#x})",
                            uri.export
                        ),
                    ));
                }
                _ => {}
            }
        }
        let size = size.ok_or_else(|| proto_err(op, "the server sent no export size"))?;
        Ok(NbdDev {
            conn: Mutex::new(Conn {
                s,
                handle: 0,
                broken: false,
            }),
            size,
            flags,
            max_request: max_request.clamp(4096, 32 << 20),
            preferred: preferred.clamp(512, 1 << 20),
            name: uri.to_string(),
        })
    }

    /// One request; `out` receives read data.
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        op: Op,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: Option<&[u8]>,
        out: Option<&mut [u8]>,
    ) -> Result<()> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if c.broken {
            return Err(proto_err(op, "the connection failed earlier").at(offset));
        }
        c.handle = c.handle.wrapping_add(1);
        let handle = c.handle;
        let mut h = [0u8; REQUEST_SIZE];
        h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&flags.to_be_bytes());
        h[6..8].copy_from_slice(&cmd.to_be_bytes());
        h[8..16].copy_from_slice(&handle.to_be_bytes());
        h[16..24].copy_from_slice(&offset.to_be_bytes());
        h[24..28].copy_from_slice(&len.to_be_bytes());
        let r = (|| -> std::io::Result<(u32, u64)> {
            c.s.write_all(&h)?;
            if let Some(p) = payload {
                c.s.write_all(p)?;
            }
            let magic = read_u32(&mut c.s)?;
            if magic != SIMPLE_REPLY_MAGIC {
                return Err(std::io::Error::other(format!("reply magic {magic:#x}")));
            }
            let err = read_u32(&mut c.s)?;
            let got = read_u64(&mut c.s)?;
            Ok((err, got))
        })();
        let (err, got) = match r {
            Ok(v) => v,
            Err(e) => {
                c.broken = true;
                return Err(io_err(op, e).at(offset));
            }
        };
        if got != handle {
            c.broken = true;
            return Err(proto_err(op, "reply to a request never sent").at(offset));
        }
        if err != 0 {
            return Err(Error::new(
                errno_kind(err),
                op,
                "nbd-client",
                format!("the server failed the request (errno {err})"),
            )
            .at(offset));
        }
        if let Some(buf) = out {
            if let Err(e) = c.s.read_exact(buf) {
                c.broken = true;
                return Err(io_err(op, e).at(offset));
            }
        }
        Ok(())
    }

    fn pieces(&self, off: u64, len: u64) -> impl Iterator<Item = (u64, u32)> {
        let max = self.max_request as u64;
        let mut done = 0;
        std::iter::from_fn(move || {
            if done >= len {
                return None;
            }
            let n = (len - done).min(max);
            let p = (off + done, n as u32);
            done += n;
            Some(p)
        })
    }
}

impl Drop for NbdDev {
    fn drop(&mut self) {
        let c = self.conn.get_mut().unwrap_or_else(|p| p.into_inner());
        if !c.broken {
            let mut h = [0u8; REQUEST_SIZE];
            h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            h[6..8].copy_from_slice(&CMD_DISC.to_be_bytes());
            let _ = c.s.write_all(&h);
        }
    }
}

impl BlockDev for NbdDev {
    fn layer(&self) -> &'static str {
        "nbd-client"
    }
    fn describe(&self) -> String {
        format!("nbd-client: {}", self.name)
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        let f = self.flags;
        Caps {
            can_write: f & TF_READ_ONLY == 0,
            can_flush: f & TF_SEND_FLUSH != 0,
            can_fua: f & TF_SEND_FUA != 0,
            can_trim: f & TF_SEND_TRIM != 0,
            can_zero: true,
            can_fast_zero: f & TF_SEND_FAST_ZERO != 0,
            can_multi_conn: f & TF_CAN_MULTI_CONN != 0,
            can_extents: false,
            rotational: f & TF_ROTATIONAL != 0,
            min_block: 1,
            preferred_block: self.preferred,
        }
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let mut at = 0usize;
        for (o, n) in self.pieces(off, buf.len() as u64) {
            self.request(
                Op::Read,
                CMD_READ,
                0,
                o,
                n,
                None,
                Some(&mut buf[at..at + n as usize]),
            )?;
            at += n as usize;
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let mut at = 0usize;
        let fua = if flags.fua && self.flags & TF_SEND_FUA != 0 {
            CMD_FLAG_FUA
        } else {
            0
        };
        for (o, n) in self.pieces(off, buf.len() as u64) {
            self.request(
                Op::Write,
                CMD_WRITE,
                fua,
                o,
                n,
                Some(&buf[at..at + n as usize]),
                None,
            )?;
            at += n as usize;
        }
        if flags.fua && fua == 0 {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        if self.flags & TF_SEND_FLUSH == 0 {
            return Ok(());
        }
        self.request(Op::Flush, CMD_FLUSH, 0, 0, 0, None, None)
    }
    fn trim(&self, off: u64, len: u64, _flags: WriteFlags) -> Result<()> {
        if self.flags & TF_SEND_TRIM == 0 {
            // A hint the server does not take: nothing to do.
            return Ok(());
        }
        for (o, n) in self.pieces(off, len) {
            self.request(Op::Trim, CMD_TRIM, 0, o, n, None, None)?;
        }
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        if self.flags & TF_SEND_WRITE_ZEROES == 0 {
            if flags.fast {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    Op::WriteZeroes,
                    "nbd-client",
                    "no fast zero",
                ));
            }
            return write_zero_buffers(self, off, len, flags.fua);
        }
        let mut f = 0;
        if !flags.may_trim {
            f |= CMD_FLAG_NO_HOLE;
        }
        if flags.fua && self.flags & TF_SEND_FUA != 0 {
            f |= CMD_FLAG_FUA;
        }
        if flags.fast {
            if self.flags & TF_SEND_FAST_ZERO == 0 {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    Op::WriteZeroes,
                    "nbd-client",
                    "no fast zero",
                ));
            }
            f |= CMD_FLAG_FAST_ZERO;
        }
        for (o, n) in self.pieces(off, len) {
            self.request(Op::WriteZeroes, CMD_WRITE_ZEROES, f, o, n, None, None)?;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<roamdisk_blockdev::Extent>> {
        // Base allocation is not negotiated: everything reads as data.
        Ok(vec![roamdisk_blockdev::Extent {
            len: len.min(self.size.saturating_sub(off)),
            state: roamdisk_blockdev::Alloc::Data,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse() {
        let u = NbdUri::parse("nbd+unix:///vm1?socket=/tmp/a%20b.sock").unwrap();
        assert_eq!(u.addr, NbdAddr::Unix("/tmp/a b.sock".into()));
        assert_eq!(u.export, "vm1");
        let u = NbdUri::parse("nbd+unix://?socket=/tmp/s").unwrap();
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://localhost/disk").unwrap();
        assert_eq!(u.addr, NbdAddr::Tcp("localhost:10809".into()));
        let u = NbdUri::parse("nbd://127.0.0.1:1234").unwrap();
        assert_eq!(
            (u.addr, u.export),
            (NbdAddr::Tcp("127.0.0.1:1234".into()), String::new())
        );
        let u = NbdUri::parse("nbd://[::1]:99/x").unwrap();
        assert_eq!(u.addr, NbdAddr::Tcp("[::1]:99".into()));
        assert!(NbdUri::parse("nbd+unix:///x")
            .unwrap_err()
            .contains("socket"));
        assert!(NbdUri::parse("http://x").is_err());
        assert!(NbdUri::parse("nbd:///x").is_err());
    }

    #[test]
    fn refused_connections_say_what_to_do() {
        let e = NbdDev::connect(&NbdUri::parse("nbd+unix:///?socket=/nonexistent/s").unwrap())
            .err()
            .unwrap();
        assert!(e.to_string().contains("is the NBD server running"), "{e}");
    }
}
