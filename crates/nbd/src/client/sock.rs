//! The client's socket ([`Sock`], TCP or Unix) and the error helpers of
//! the layer: below the handshake ([`super::conn`]), the TLS relay and the
//! pipeline, which all read and write it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use roamdisk_blockdev::{Error, ErrorKind, Op};

/// The layer name errors carry.
pub(super) const LAYER: &str = "nbd";

/// A protocol error of the layer (the server said or sent something wrong).
pub(super) fn proto_err(op: Op, m: impl Into<String>) -> Error {
    Error::new(ErrorKind::Io, op, LAYER, m)
}

/// An I/O error of the layer's socket.
pub(super) fn io_err(op: Op, e: std::io::Error) -> Error {
    Error::io(op, LAYER, e)
}

/// A connected socket, TCP or Unix.
pub(super) enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    pub(super) fn try_clone(&self) -> std::io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }
    pub(super) fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_nonblocking(on),
            Sock::Unix(s) => s.set_nonblocking(on),
        }
    }
    /// Read and write timeouts (None: wait forever).
    pub(super) fn set_timeouts(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(t).and_then(|()| s.set_write_timeout(t)),
            Sock::Unix(s) => s.set_read_timeout(t).and_then(|()| s.set_write_timeout(t)),
        }
    }
    /// Close both directions: a thread blocked reading wakes up.
    pub(super) fn shutdown(&self) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl AsRawFd for Sock {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(b),
            Sock::Unix(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(b),
            Sock::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write_vectored(b),
            Sock::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Read exactly `N` bytes.
pub(super) fn read_array<const N: usize>(r: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}
