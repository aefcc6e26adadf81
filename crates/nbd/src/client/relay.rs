//! TLS under the pipeline: one relay thread owns the TLS stream.
//!
//! The pipeline reads replies on one thread and writes requests on
//! others, each on its own handle of the socket; an OpenSSL stream cannot
//! be split that way (`SSL_read` and `SSL_write` share one state, and
//! either may need the other direction of the socket). So the negotiated
//! TLS stream goes to a relay thread that alone touches it, with its
//! socket non-blocking, and the pipeline gets the other end of a Unix
//! socket pair: the relay moves plaintext between the pair and the TLS
//! stream, waiting in `poll()` on whatever each side is blocked on. Both
//! directions have a bounded buffer, so a slow reader holds the other side
//! back instead of growing memory.
//!
//! When the pipeline shuts its end (drop, or a failed send) the relay
//! sends what it holds, closes TLS (`close_notify`) and ends; when the
//! server's side ends or TLS fails, the relay closes its end and the
//! pipeline sees the connection drop, as it would on plain TCP.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use openssl::ssl::{ErrorCode, SslStream};

use super::sock::Sock;

/// Plaintext held in each direction.
const BUF: usize = 1 << 20;

/// Bytes read from one side, not yet written to the other.
struct Buf {
    data: Vec<u8>,
    start: usize,
    end: usize,
}

impl Buf {
    fn new() -> Buf {
        Buf {
            data: vec![0u8; BUF],
            start: 0,
            end: 0,
        }
    }
    fn is_empty(&self) -> bool {
        self.start == self.end
    }
    fn pending(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }
    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }
    /// Free space at the end (None when full).
    fn space(&mut self) -> Option<&mut [u8]> {
        (self.end < self.data.len()).then(|| &mut self.data[self.end..])
    }
    fn filled(&mut self, n: usize) {
        self.end += n;
    }
}

/// Hand the negotiated `tls` to a relay thread; the returned socket
/// carries the plaintext.
pub(super) fn spawn(tls: SslStream<Sock>) -> std::io::Result<UnixStream> {
    tls.get_ref().set_nonblocking(true)?;
    let (ours, theirs) = UnixStream::pair()?;
    theirs.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("roamdisk-nbd-tls".into())
        .spawn(move || {
            let why = relay(tls, theirs);
            tracing::debug!(reason = %why, "NBD TLS relay ended");
        })?;
    Ok(ours)
}

/// Why a relay ended (logged at debug level).
#[derive(Debug, thiserror::Error)]
enum RelayEnd {
    #[error("the server closed TLS")]
    TlsClosed,
    #[error("the server closed the connection")]
    ServerClosed,
    #[error("TLS failed: {0}")]
    Tls(openssl::ssl::Error),
    #[error("the client side closed: {0}")]
    LocalGone(std::io::Error),
    #[error("the client closed the connection")]
    ClientClosed,
    #[error("poll: {0}")]
    Poll(std::io::Error),
}

/// Map a TLS error to the poll event of the socket that the call waits
/// for (a read may want to write, a write to read); Err ends the relay
/// with why.
fn tls_wait(e: openssl::ssl::Error) -> Result<i16, RelayEnd> {
    match e.code() {
        ErrorCode::WANT_READ => Ok(libc::POLLIN),
        ErrorCode::WANT_WRITE => Ok(libc::POLLOUT),
        ErrorCode::ZERO_RETURN => Err(RelayEnd::TlsClosed),
        ErrorCode::SYSCALL if e.io_error().is_none() => Err(RelayEnd::ServerClosed),
        _ => Err(RelayEnd::Tls(e)),
    }
}

fn poll2(a: (RawFd, i16), b: (RawFd, i16)) -> std::io::Result<()> {
    let mut fds = [
        libc::pollfd {
            fd: a.0,
            events: a.1,
            revents: 0,
        },
        libc::pollfd {
            fd: b.0,
            events: b.1,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Move bytes both ways until one side ends; returns why.
fn relay(mut tls: SslStream<Sock>, mut local: UnixStream) -> RelayEnd {
    let net_fd = tls.get_ref().as_raw_fd();
    let local_fd = local.as_raw_fd();
    // down: server -> pipeline; up: pipeline -> server.
    let mut down = Buf::new();
    let mut up = Buf::new();
    let mut local_done = false;
    loop {
        // Interest in readiness is gathered from the calls that would
        // block; a pass that moved bytes goes round again instead, since
        // a call it skipped (buffer full or empty then) may now go on.
        let mut net_ev: i16 = 0;
        let mut local_ev: i16 = 0;
        let mut moved = false;
        // Server -> buffer, as much as fits.
        while let Some(space) = down.space() {
            match tls.ssl_read(space) {
                Ok(0) => return RelayEnd::TlsClosed,
                Ok(n) => {
                    down.filled(n);
                    moved = true;
                }
                Err(e) => match tls_wait(e) {
                    Ok(ev) => {
                        net_ev |= ev;
                        break;
                    }
                    // What the server sent before it closed still goes up.
                    Err(why) => {
                        let _ = local.set_nonblocking(false);
                        let _ = local.write_all(down.pending());
                        return why;
                    }
                },
            }
        }
        // Buffer -> pipeline.
        while !down.is_empty() {
            match local.write(down.pending()) {
                Ok(n) => {
                    down.consume(n);
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    local_ev |= libc::POLLOUT;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return RelayEnd::LocalGone(e),
            }
        }
        // Pipeline -> buffer.
        while !local_done {
            let Some(space) = up.space() else { break };
            match local.read(space) {
                Ok(0) => {
                    local_done = true;
                    moved = true;
                }
                Ok(n) => {
                    up.filled(n);
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    local_ev |= libc::POLLIN;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => local_done = true,
            }
        }
        // Buffer -> server.
        while !up.is_empty() {
            match tls.ssl_write(up.pending()) {
                Ok(n) => {
                    up.consume(n);
                    moved = true;
                }
                Err(e) => match tls_wait(e) {
                    Ok(ev) => {
                        net_ev |= ev;
                        break;
                    }
                    Err(why) => return why,
                },
            }
        }
        if local_done && up.is_empty() {
            // The pipeline is done and everything it sent is out: say
            // goodbye (best effort: the socket is non-blocking).
            let _ = tls.shutdown();
            return RelayEnd::ClientClosed;
        }
        if moved {
            continue;
        }
        // A closed local end would wake poll() at once, again and again.
        let local_fd = if local_done { -1 } else { local_fd };
        if let Err(e) = poll2((net_fd, net_ev), (local_fd, local_ev)) {
            return RelayEnd::Poll(e);
        }
    }
}
