//! Fixed-newstyle option haggling, up to the start of transmission.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::access::Peer;
use crate::export::Export;
use crate::proto::*;
use crate::shared::Shared;
use crate::stream::BoxStream;
use crate::tls::TlsMode;

/// Most options one client may send before we hang up on it.
const MAX_OPTIONS: usize = 1024;
/// Option payloads above this are not even read: the client is hostile.
const DISCARD_LIMIT: u32 = 16 * 1024 * 1024;

/// What the client chose during the handshake.
pub struct Session {
    pub export: Arc<Export>,
    pub structured: bool,
    pub base_allocation: bool,
    pub tls: bool,
    /// Who the client is, for the log.
    pub peer: String,
    /// A write refused as read-only was logged already (once per
    /// connection, so a client cannot flood the log).
    pub warned_read_only: std::sync::atomic::AtomicBool,
}

/// Why a handshake ended without transmission.
#[derive(Debug)]
pub enum HandshakeEnd {
    /// The client aborted or asked for an unknown export with EXPORT_NAME.
    Closed(&'static str),
    /// I/O error or protocol violation.
    Error(std::io::Error),
}

impl From<std::io::Error> for HandshakeEnd {
    fn from(e: std::io::Error) -> Self {
        HandshakeEnd::Error(e)
    }
}

fn violation(m: &str) -> HandshakeEnd {
    HandshakeEnd::Error(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        m.to_string(),
    ))
}

async fn reply(s: &mut BoxStream, opt: u32, rtype: u32, payload: &[u8]) -> std::io::Result<()> {
    s.write_all(&encode_option_reply(opt, rtype, payload)).await
}

async fn error_reply(s: &mut BoxStream, opt: u32, rtype: u32, msg: &str) -> std::io::Result<()> {
    reply(s, opt, rtype, msg.as_bytes()).await?;
    s.flush().await
}

async fn no_such_export(s: &mut BoxStream, opt: u32, name: &str) -> std::io::Result<()> {
    let msg = format!("no export named '{name}'");
    error_reply(s, opt, REP_ERR_UNKNOWN, &msg).await
}

fn transmission_flags(exp: &Export, structured: bool) -> u16 {
    let caps = exp.dev.caps();
    let w = caps.can_write;
    [
        (!w, TF_READ_ONLY),
        (w && caps.can_fua, TF_SEND_FUA),
        (w && caps.can_trim, TF_SEND_TRIM),
        (w && caps.can_zero, TF_SEND_WRITE_ZEROES),
        (w && caps.can_fast_zero, TF_SEND_FAST_ZERO),
        (caps.rotational, TF_ROTATIONAL),
        (caps.can_multi_conn, TF_CAN_MULTI_CONN),
        (structured, TF_SEND_DF),
    ]
    .into_iter()
    .filter(|&(on, _)| on)
    .fold(
        TF_HAS_FLAGS | TF_SEND_FLUSH | TF_SEND_CACHE,
        |f, (_, flag)| f | flag,
    )
}

/// Run the handshake on `s` for an anonymous peer (in-process sessions).
pub async fn negotiate(
    s: BoxStream,
    shared: &Shared,
) -> Result<(BoxStream, Session), HandshakeEnd> {
    negotiate_peer(s, shared, &mut Peer::default()).await
}

/// Run the handshake on `s` with `peer`, which STARTTLS completes with
/// the client's TLS identity. Returns the (possibly TLS-wrapped) stream
/// and the session, or how it ended.
pub async fn negotiate_peer(
    mut s: BoxStream,
    shared: &Shared,
    peer: &mut Peer,
) -> Result<(BoxStream, Session), HandshakeEnd> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello).await?;
    s.flush().await?;
    // A client that sits idle in the handshake must not hold up a shutdown.
    let mut shutdown = shared.shutdown_rx();
    let cflags = tokio::select! {
        r = s.read_u32() => r?,
        _ = shutdown.changed() => return Err(HandshakeEnd::Closed("server shutting down")),
    };
    if cflags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(violation("unknown client flags"));
    }
    let fixed = cflags & FLAG_C_FIXED_NEWSTYLE != 0;
    let no_zeroes = cflags & FLAG_C_NO_ZEROES != 0;

    let mut structured = false;
    let mut meta: Option<(String, bool)> = None; // (export, base:allocation selected)
    let mut tls = false;
    let mut logged_plain = false;

    for _ in 0..MAX_OPTIONS {
        let mut h = [0u8; OPTION_HEADER_SIZE];
        tokio::select! {
            r = s.read_exact(&mut h) => { r?; }
            _ = shutdown.changed() => return Err(HandshakeEnd::Closed("server shutting down")),
        }
        let magic = u64::from_be_bytes(h[0..8].try_into().expect("8 bytes"));
        if magic != IHAVEOPT {
            return Err(violation("bad option magic"));
        }
        let opt = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
        if len > MAX_OPTION_LEN {
            if len > DISCARD_LIMIT || opt == OPT_EXPORT_NAME || !fixed {
                return Err(violation("option payload too large"));
            }
            tokio::io::copy(&mut (&mut s).take(len as u64), &mut tokio::io::sink()).await?;
            error_reply(&mut s, opt, REP_ERR_TOO_BIG, "option payload too large").await?;
            continue;
        }
        let mut payload = vec![0u8; len as usize];
        tokio::select! {
            r = s.read_exact(&mut payload) => { r?; }
            _ = shutdown.changed() => return Err(HandshakeEnd::Closed("server shutting down")),
        }

        let tls_needed = !(shared.unix_without_tls && peer.unix);
        if shared.tls_mode == TlsMode::Require && !tls && tls_needed {
            if !logged_plain && opt != OPT_STARTTLS && opt != OPT_ABORT {
                logged_plain = true;
                tracing::warn!(%peer, "refused: plain client on a TLS-only server");
                shared.refused(peer, crate::access::refusal_kind::TLS_REQUIRED);
            }
            match opt {
                OPT_STARTTLS | OPT_ABORT => {}
                OPT_EXPORT_NAME => {
                    return Err(HandshakeEnd::Closed(
                        "EXPORT_NAME before STARTTLS on a TLS-only server",
                    ))
                }
                _ => {
                    error_reply(
                        &mut s,
                        opt,
                        REP_ERR_TLS_REQD,
                        "this server requires TLS: use STARTTLS",
                    )
                    .await?;
                    continue;
                }
            }
        }
        if shared.is_shutting_down() && opt != OPT_ABORT {
            error_reply(&mut s, opt, REP_ERR_SHUTDOWN, "server is shutting down").await?;
            continue;
        }

        match opt {
            OPT_EXPORT_NAME => {
                let Ok(name) = parse_export_name(&payload) else {
                    return Err(violation("bad export name"));
                };
                let export = shared.lookup(peer, &name);
                let Ok(export) = export.inspect_err(|r| shared.refused(peer, r.kind)) else {
                    return Err(HandshakeEnd::Closed(
                        "unknown export requested with EXPORT_NAME",
                    ));
                };
                let mut r = Vec::with_capacity(10 + 124);
                r.extend_from_slice(&export.dev.size().to_be_bytes());
                r.extend_from_slice(&transmission_flags(&export, false).to_be_bytes());
                if !no_zeroes {
                    r.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&r).await?;
                s.flush().await?;
                return Ok((
                    s,
                    Session {
                        export,
                        structured: false,
                        base_allocation: false,
                        tls,
                        peer: peer.to_string(),
                        warned_read_only: Default::default(),
                    },
                ));
            }
            OPT_ABORT => {
                let _ = reply(&mut s, opt, REP_ACK, &[]).await;
                let _ = s.flush().await;
                return Err(HandshakeEnd::Closed("client aborted"));
            }
            OPT_LIST => {
                if !payload.is_empty() {
                    error_reply(&mut s, opt, REP_ERR_INVALID, "LIST takes no payload").await?;
                    continue;
                }
                for (name, description) in shared.list(peer) {
                    let mut p = Vec::new();
                    p.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    p.extend_from_slice(name.as_bytes());
                    p.extend_from_slice(description.as_bytes());
                    reply(&mut s, opt, REP_SERVER, &p).await?;
                }
                reply(&mut s, opt, REP_ACK, &[]).await?;
                s.flush().await?;
            }
            OPT_STARTTLS => {
                if tls {
                    error_reply(&mut s, opt, REP_ERR_INVALID, "TLS is already active").await?;
                    continue;
                }
                let Some(acceptor) = shared.tls.as_ref() else {
                    error_reply(
                        &mut s,
                        opt,
                        REP_ERR_POLICY,
                        "TLS is not configured on this server",
                    )
                    .await?;
                    continue;
                };
                if !payload.is_empty() {
                    error_reply(&mut s, opt, REP_ERR_INVALID, "STARTTLS takes no payload").await?;
                    continue;
                }
                reply(&mut s, opt, REP_ACK, &[]).await?;
                s.flush().await?;
                let (st, who) = match crate::tls::accept(acceptor, s).await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "refused: TLS handshake failed");
                        shared.refused(peer, crate::access::refusal_kind::TLS_FAILED);
                        return Err(HandshakeEnd::Error(e));
                    }
                };
                s = st;
                peer.tls = Some(who);
                tls = true;
                // Options negotiated in the clear are forgotten (spec).
                structured = false;
                meta = None;
            }
            OPT_STRUCTURED_REPLY => {
                if !payload.is_empty() {
                    error_reply(
                        &mut s,
                        opt,
                        REP_ERR_INVALID,
                        "STRUCTURED_REPLY takes no payload",
                    )
                    .await?;
                } else if structured {
                    error_reply(
                        &mut s,
                        opt,
                        REP_ERR_INVALID,
                        "structured replies already negotiated",
                    )
                    .await?;
                } else {
                    structured = true;
                    reply(&mut s, opt, REP_ACK, &[]).await?;
                    s.flush().await?;
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let list = opt == OPT_LIST_META_CONTEXT;
                let req = match parse_meta_request(&payload) {
                    Ok(r) => r,
                    Err(e) => {
                        error_reply(&mut s, opt, REP_ERR_INVALID, &e.to_string()).await?;
                        continue;
                    }
                };
                if !structured {
                    error_reply(
                        &mut s,
                        opt,
                        REP_ERR_INVALID,
                        "negotiate structured replies first",
                    )
                    .await?;
                    continue;
                }
                if shared.lookup(peer, &req.export).is_err() {
                    no_such_export(&mut s, opt, &req.export).await?;
                    continue;
                }
                let selected = if list && req.queries.is_empty() {
                    true
                } else {
                    req.queries.iter().any(|q| match_meta_query(q, list))
                };
                if selected {
                    let mut p = Vec::new();
                    p.extend_from_slice(&(if list { 0 } else { BASE_ALLOCATION_ID }).to_be_bytes());
                    p.extend_from_slice(BASE_ALLOCATION.as_bytes());
                    reply(&mut s, opt, REP_META_CONTEXT, &p).await?;
                }
                if !list {
                    meta = Some((req.export.clone(), selected));
                }
                reply(&mut s, opt, REP_ACK, &[]).await?;
                s.flush().await?;
            }
            OPT_INFO | OPT_GO => {
                let req = match parse_info_request(&payload) {
                    Ok(r) => r,
                    Err(e) => {
                        error_reply(&mut s, opt, REP_ERR_INVALID, &e.to_string()).await?;
                        continue;
                    }
                };
                let export = shared.lookup(peer, &req.name);
                if let (Err(r), OPT_GO) = (&export, opt) {
                    shared.refused(peer, r.kind);
                }
                let Ok(export) = export else {
                    no_such_export(&mut s, opt, &req.name).await?;
                    continue;
                };
                let mut p = Vec::with_capacity(12);
                p.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                p.extend_from_slice(&export.dev.size().to_be_bytes());
                p.extend_from_slice(&transmission_flags(&export, structured).to_be_bytes());
                reply(&mut s, opt, REP_INFO, &p).await?;
                for &i in &req.infos {
                    let mut p = Vec::new();
                    p.extend_from_slice(&i.to_be_bytes());
                    match i {
                        INFO_NAME => p.extend_from_slice(export.name.as_bytes()),
                        INFO_DESCRIPTION => p.extend_from_slice(export.description.as_bytes()),
                        INFO_BLOCK_SIZE => {
                            let caps = export.dev.caps();
                            p.extend_from_slice(&caps.min_block.max(1).to_be_bytes());
                            p.extend_from_slice(
                                &caps.preferred_block.max(PREFERRED_BLOCK).to_be_bytes(),
                            );
                            p.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
                        }
                        _ => continue,
                    }
                    reply(&mut s, opt, REP_INFO, &p).await?;
                }
                reply(&mut s, opt, REP_ACK, &[]).await?;
                s.flush().await?;
                if opt == OPT_GO {
                    let base_allocation = match &meta {
                        Some((name, sel)) => {
                            *sel && shared
                                .lookup(peer, name)
                                .is_ok_and(|e| Arc::ptr_eq(&e, &export))
                        }
                        None => false,
                    };
                    return Ok((
                        s,
                        Session {
                            export,
                            structured,
                            base_allocation,
                            tls,
                            peer: peer.to_string(),
                            warned_read_only: Default::default(),
                        },
                    ));
                }
            }
            _ => {
                error_reply(&mut s, opt, REP_ERR_UNSUP, "option not supported").await?;
            }
        }
    }
    Err(violation("too many options"))
}
