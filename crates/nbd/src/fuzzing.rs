//! In-process NBD sessions for the `nbd_session` fuzz target (`fuzz/`,
//! `docs/FUZZING.md`). Not part of the public API.
//!
//! [`run_session`] plays one client byte stream against the real server
//! code — [`negotiate`] and, if the client reaches transmission, [`serve`] —
//! over an in-memory duplex pipe, with fresh `mem:` exports every time so
//! one input never sees another's state. The client's write side is closed
//! once the input is sent and the server's output is drained (and counted)
//! concurrently, so every run ends; a run that does not end within
//! [`SESSION_TIMEOUT`] is a hang in the server and panics.

use std::time::Duration;

use roamdisk_blockdev::Access;
use roamdisk_blockdev::Registry;
use tokio::io::AsyncWriteExt;

use crate::export::Export;
use crate::handshake::negotiate;
use crate::shared::Shared;
use crate::stream::BoxStream;
use crate::tls::TlsMode;
use crate::transmission::serve;

/// The default export (first, empty name): writable.
pub const RW_EXPORT: &str = "rw";
/// A second, read-only export.
pub const RO_EXPORT: &str = "ro";
/// Their stacks. Small, so that whole-disk reads stay cheap.
pub const RW_SPEC: &str = "mem:1M";
pub const RO_SPEC: &str = "mem:256K";
/// Requests run at once per connection (small, to exercise back-pressure).
pub const MAX_IN_FLIGHT: usize = 4;
/// How long one session may take after the client has sent everything.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(20);
/// Capacity of each direction of the in-memory pipe.
const PIPE: usize = 64 * 1024;

/// What happened in one session (for seed tests and statistics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionOutcome {
    /// The handshake ended in transmission (OPT_GO or OPT_EXPORT_NAME).
    pub transmission: bool,
    /// Bytes the server wrote back to the client.
    pub reply_bytes: u64,
}

fn exports() -> Vec<Export> {
    let reg = Registry::with_builtin();
    let dev = |spec: &str, ro: bool| {
        reg.build(spec, Access::read_only_if(ro))
            .expect("mem: stacks always build")
    };
    vec![
        Export {
            name: RW_EXPORT.to_string(),
            description: "fuzz, writable".to_string(),
            dev: dev(RW_SPEC, false),
        },
        Export {
            name: RO_EXPORT.to_string(),
            description: "fuzz, read-only".to_string(),
            dev: dev(RO_SPEC, true),
        },
    ]
}

thread_local! {
    // One runtime per thread, reused: building one (and its blocking
    // threads) per input would dominate the run time. Nothing outlives a
    // run: the session is awaited to completion inside `block_on`.
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
}

/// Feed `input` as everything a client sends on one connection, through
/// the handshake and (if reached) the transmission phase.
///
/// # Panics
///
/// If the server panics (the point of fuzzing) or does not finish within
/// [`SESSION_TIMEOUT`] after the client closed its side.
pub fn run_session(input: &[u8]) -> SessionOutcome {
    RUNTIME.with(|rt| rt.block_on(session(input)))
}

async fn session(input: &[u8]) -> SessionOutcome {
    // The sender must outlive the session: a dropped sender reads as
    // "shutting down" to `serve`.
    let (shared, _shutdown) = Shared::detached(exports(), TlsMode::Off, MAX_IN_FLIGHT);
    let (client, server) = tokio::io::duplex(PIPE);
    let (mut from_server, mut to_server) = tokio::io::split(client);

    let send = async {
        // The server may hang up early (protocol violation): that is fine.
        let _ = to_server.write_all(input).await;
        let _ = to_server.shutdown().await;
        drop(to_server);
    };
    let drain = async {
        tokio::io::copy(&mut from_server, &mut tokio::io::sink())
            .await
            .unwrap_or(0)
    };
    let run = async {
        let s: BoxStream = Box::new(server);
        match negotiate(s, &shared).await {
            Ok((stream, session)) => {
                let client = shared.new_client(&session.export);
                let _ = serve(stream, session, shared.clone(), client).await;
                true
            }
            Err(_) => false,
        }
    };
    let all = async { tokio::join!(send, drain, run) };
    match tokio::time::timeout(SESSION_TIMEOUT, all).await {
        Ok(((), reply_bytes, transmission)) => SessionOutcome {
            transmission,
            reply_bytes,
        },
        Err(_) => panic!(
            "NBD session did not end within {SESSION_TIMEOUT:?} of the client closing \
             ({} input bytes): the server hangs",
            input.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::*;

    fn opt(v: &mut Vec<u8>, o: u32, payload: &[u8]) {
        v.extend_from_slice(&IHAVEOPT.to_be_bytes());
        v.extend_from_slice(&o.to_be_bytes());
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
    }

    #[test]
    fn empty_and_garbage_inputs_end() {
        assert!(!run_session(&[]).transmission);
        assert!(!run_session(&[0xff; 100]).transmission);
        // The server greets before reading anything.
        assert_eq!(run_session(&[]).reply_bytes, 18);
    }

    #[test]
    fn go_reaches_transmission_and_serves_requests() {
        let mut v = 3u32.to_be_bytes().to_vec();
        let mut go = 0u32.to_be_bytes().to_vec();
        go.extend_from_slice(&0u16.to_be_bytes());
        opt(&mut v, OPT_GO, &go);
        let w = Request {
            flags: 0,
            cmd: CMD_WRITE,
            handle: 1,
            offset: 0,
            length: 512,
        };
        v.extend_from_slice(&encode_request(&w));
        v.extend_from_slice(&[0xa5; 512]);
        let r = Request {
            cmd: CMD_READ,
            handle: 2,
            ..w
        };
        v.extend_from_slice(&encode_request(&r));
        let out = run_session(&v);
        assert!(out.transmission);
        // greeting 18 + INFO reply (20 + 12) + ACK 20 + write reply 16 + read reply 16 + 512
        assert_eq!(out.reply_bytes, 18 + 32 + 20 + 16 + 16 + 512);
    }
}
