//! One connection: the socket and the fixed-newstyle handshake (STARTTLS
//! for an `nbds` URI, then structured replies and `base:allocation` when
//! the server offers them, then `OPT_GO`). A TLS connection is handed to
//! a relay thread ([`super::relay`]) and the pipeline gets a plain socket.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use roamdisk_blockdev::{Error, ErrorKind, Op, Result};

use super::sock::{io_err, proto_err, read_array, Sock, LAYER};
use super::tls::ClientTls;
use super::uri::{NbdAddr, NbdUri};
use crate::proto::*;

/// What the handshake settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Negotiated {
    pub size: u64,
    /// Transmission flags (`TF_*`).
    pub flags: u16,
    pub max_request: u32,
    pub preferred: u32,
    /// Replies may be structured.
    pub structured: bool,
    /// The id of `base:allocation`, when the server selected it.
    pub base_allocation: Option<u32>,
}

/// Connect to `host:port`, trying each of its addresses for at most
/// `timeout` (an unreachable host fails then, not after the system's
/// minutes).
fn connect_tcp(a: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let mut last = None;
    for addr in a.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(t) => {
                keepalive(&t)?;
                return Ok(t);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address")
    }))
}

/// TCP keepalive on `t`: a peer that vanished (a host switched off, a
/// network dropped without a reset) is noticed within about a minute even
/// with no request in flight (30 s idle, then 3 probes 10 s apart).
fn keepalive(t: &TcpStream) -> std::io::Result<()> {
    use rustix::net::sockopt;
    sockopt::set_socket_keepalive(t, true)?;
    sockopt::set_tcp_keepidle(t, Duration::from_secs(30))?;
    sockopt::set_tcp_keepintvl(t, Duration::from_secs(10))?;
    sockopt::set_tcp_keepcnt(t, 3)?;
    Ok(())
}

/// Connect to `uri`'s server.
fn dial(uri: &NbdUri, timeout: Duration) -> Result<Sock> {
    let op = Op::Open;
    Ok(match &uri.addr {
        NbdAddr::Tcp(a) => {
            let t = connect_tcp(a, timeout).map_err(|e| {
                io_err(op, e).msg(format!("cannot connect to {a}: is the NBD server running?"))
            })?;
            let _ = t.set_nodelay(true);
            Sock::Tcp(t)
        }
        NbdAddr::Unix(p) => Sock::Unix(UnixStream::connect(p).map_err(|e| {
            io_err(op, e)
                .path(p)
                .msg("cannot connect to the Unix socket: is the NBD server running?")
        })?),
    })
}

/// One option reply: `(type, payload)`.
fn option_reply(s: &mut impl Read, opt: u32) -> Result<(u32, Vec<u8>)> {
    let op = Op::Open;
    let io = |e| io_err(op, e);
    let h: [u8; 20] = read_array(s).map_err(io)?;
    let magic = u64::from_be_bytes(h[0..8].try_into().expect("8"));
    let got_opt = u32::from_be_bytes(h[8..12].try_into().expect("4"));
    let rtype = u32::from_be_bytes(h[12..16].try_into().expect("4"));
    let len = u32::from_be_bytes(h[16..20].try_into().expect("4"));
    if magic != OPT_REPLY_MAGIC || got_opt != opt {
        return Err(proto_err(op, "bad option reply"));
    }
    if len > MAX_OPTION_LEN {
        return Err(proto_err(op, format!("option reply of {len} bytes")));
    }
    let mut data = vec![0u8; len as usize];
    s.read_exact(&mut data).map_err(io)?;
    Ok((rtype, data))
}

fn is_error(rtype: u32) -> bool {
    rtype & (1 << 31) != 0
}

/// Connect and negotiate `uri`'s export; `structured` asks for structured
/// replies (and with them `base:allocation`); `tls` is the URI's TLS
/// settings, loaded (required for an `nbds` URI). A server that has not
/// finished the handshake after `timeout` (silent, or not an NBD server)
/// fails it.
pub(super) fn connect(
    uri: &NbdUri,
    structured: bool,
    tls: Option<&ClientTls>,
    timeout: Duration,
) -> Result<(Sock, Negotiated)> {
    let mut s = dial(uri, timeout)?;
    let began = Instant::now();
    let late = |e: Error| {
        if began.elapsed() >= timeout {
            proto_err(
                Op::Open,
                format!(
                    "the server did not finish the NBD handshake within {timeout:?} (is it an NBD server?): {e}"
                ),
            )
        } else {
            e
        }
    };
    s.set_timeouts(Some(timeout))
        .map_err(|e| io_err(Op::Open, e))?;
    greet(&mut s).map_err(late)?;
    let Some(tls) = tls else {
        let n = negotiate(&mut s, uri, structured).map_err(late)?;
        s.set_timeouts(None).map_err(|e| io_err(Op::Open, e))?;
        return Ok((s, n));
    };
    starttls(&mut s).map_err(late)?;
    let mut st = tls.handshake(s, uri.addr.host()).map_err(late)?;
    let n = negotiate(&mut st, uri, structured).map_err(late)?;
    st.get_ref()
        .set_timeouts(None)
        .map_err(|e| io_err(Op::Open, e))?;
    let plain = super::relay::spawn(st).map_err(|e| io_err(Op::Open, e))?;
    Ok((Sock::Unix(plain), n))
}

/// Read the server's greeting and send our flags.
fn greet(s: &mut Sock) -> Result<()> {
    let op = Op::Open;
    let io = |e| io_err(op, e);
    let greeting: [u8; 18] = read_array(s).map_err(io)?;
    if greeting[0..8] != NBDMAGIC.to_be_bytes() || greeting[8..16] != IHAVEOPT.to_be_bytes() {
        return Err(proto_err(
            op,
            "not an NBD server speaking the newstyle protocol",
        ));
    }
    let hflags = u16::from_be_bytes([greeting[16], greeting[17]]);
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
    s.write_all(&cflags.to_be_bytes()).map_err(io)
}

/// Ask for TLS; an `nbds` URI must not go on without it.
fn starttls(s: &mut Sock) -> Result<()> {
    let op = Op::Open;
    s.write_all(&encode_option(OPT_STARTTLS, &[]))
        .map_err(|e| io_err(op, e))?;
    let (rtype, data) = option_reply(s, OPT_STARTTLS)?;
    match rtype {
        REP_ACK => Ok(()),
        t if is_error(t) => {
            let said = String::from_utf8_lossy(&data);
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(": \"{said}\"")
            };
            Err(Error::new(
                ErrorKind::Unsupported,
                op,
                LAYER,
                format!(
                    "the server does not offer TLS (STARTTLS refused, error {t:#x}{said}); configure TLS on the server, or, on a link you trust, use an nbd:// URI (unencrypted)"
                ),
            ))
        }
        t => Err(proto_err(op, format!("unexpected reply {t} to STARTTLS"))),
    }
}

/// The server refused an option because it wants TLS first.
fn tls_required(op: Op) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        op,
        LAYER,
        "the server requires TLS: use nbds://HOST/EXPORT?tls-certificates=DIR or nbds://NAME@HOST/EXPORT?tls-psk-file=FILE",
    )
}

/// The options after the greeting (and after STARTTLS, inside TLS).
fn negotiate<S: Read + Write>(s: &mut S, uri: &NbdUri, structured: bool) -> Result<Negotiated> {
    let op = Op::Open;
    let io = |e| io_err(op, e);
    if uri.export.len() > MAX_STRING {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            op,
            LAYER,
            "export name too long",
        ));
    }
    let mut n = Negotiated {
        size: 0,
        flags: 0,
        max_request: 32 << 20,
        preferred: 4096,
        structured: false,
        base_allocation: None,
    };
    if structured {
        s.write_all(&encode_option(OPT_STRUCTURED_REPLY, &[]))
            .map_err(io)?;
        let (rtype, _) = option_reply(s, OPT_STRUCTURED_REPLY)?;
        if rtype == REP_ERR_TLS_REQD {
            return Err(tls_required(op));
        }
        n.structured = rtype == REP_ACK;
    }
    if n.structured {
        let q = MetaRequest {
            export: uri.export.clone(),
            queries: vec![BASE_ALLOCATION.to_string()],
        };
        s.write_all(&encode_option(
            OPT_SET_META_CONTEXT,
            &encode_meta_request(&q),
        ))
        .map_err(io)?;
        loop {
            let (rtype, data) = option_reply(s, OPT_SET_META_CONTEXT)?;
            match rtype {
                REP_META_CONTEXT if data.len() >= 4 => {
                    if &data[4..] == BASE_ALLOCATION.as_bytes() {
                        n.base_allocation =
                            Some(u32::from_be_bytes(data[0..4].try_into().expect("4")));
                    }
                }
                // ACK ends the list; an error means no contexts.
                _ => break,
            }
        }
    }
    let go = InfoRequest {
        name: uri.export.clone(),
        infos: vec![INFO_BLOCK_SIZE],
    };
    s.write_all(&encode_option(OPT_GO, &encode_info_request(&go)))
        .map_err(io)?;
    let mut size = None;
    loop {
        let (rtype, data) = option_reply(s, OPT_GO)?;
        match rtype {
            REP_ACK => break,
            REP_INFO if data.len() >= 2 => {
                let t = u16::from_be_bytes([data[0], data[1]]);
                if t == INFO_EXPORT && data.len() == 12 {
                    size = Some(u64::from_be_bytes(data[2..10].try_into().expect("8")));
                    n.flags = u16::from_be_bytes([data[10], data[11]]);
                } else if t == INFO_BLOCK_SIZE && data.len() == 14 {
                    n.preferred = u32::from_be_bytes(data[6..10].try_into().expect("4"));
                    n.max_request = u32::from_be_bytes(data[10..14].try_into().expect("4"));
                }
            }
            REP_ERR_TLS_REQD => return Err(tls_required(op)),
            t if is_error(t) => {
                let text = String::from_utf8_lossy(&data);
                let kind = if t == REP_ERR_UNKNOWN {
                    ErrorKind::NotFound
                } else {
                    ErrorKind::Io
                };
                return Err(Error::new(
                    kind,
                    op,
                    LAYER,
                    format!(
                        "the server refused export '{}': {text} (error {t:#x})",
                        uri.export
                    ),
                ));
            }
            _ => {}
        }
    }
    n.size = size.ok_or_else(|| proto_err(op, "the server sent no export size"))?;
    n.max_request = n.max_request.clamp(4096, MAX_PAYLOAD);
    n.preferred = n.preferred.clamp(512, 1 << 20);
    Ok(n)
}
