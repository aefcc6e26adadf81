//! Hostile and malformed NBD traffic against `roamdisk serve`.
//!
//! Each test sends something a well-behaved client never sends, checks the
//! documented answer (an option error, a request errno, or a hang-up), and
//! then checks that the server still serves: the same connection where it
//! should stay open, and always a fresh connection doing a write and a
//! read-back. The raw client is `nbdwire` (written from the protocol
//! specification); a few cases are cross-checked with libnbd via `nbdsh`.

#![allow(
    clippy::disallowed_methods,
    reason = "tests read their environment (ROAMDISK_BIN, the S3 endpoint)"
)]

mod common;
mod nbdwire;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Output};

use common::{assert_success, require_tool, tempdir, Server};
use nbdwire::*;

const SIZE: u64 = 64 << 20;

/// A server that serves two connections at a time.
const TWO_CONNECTIONS: &[&str] = &["mem:64M", "--max-connections", "2"];

/// A server whose one export is named and described.
const DESCRIBED_DISK: &[&str] = &["mem:64M", "--export", "disk", "--description", "test disk"];

/// Start `roamdisk serve ARGS` in a new temporary folder, run the test
/// body against it, then check that the server still serves
/// ([`assert_serves`]); the body's result.
fn against<T>(args: &[&str], body: impl FnOnce(&Server) -> T) -> T {
    let dir = tempdir();
    let srv = Server::start(dir.path(), args);
    let out = body(&srv);
    assert_serves(&srv);
    out
}

/// [`against`] a 64 MiB `mem:` disk.
fn against_mem<T>(body: impl FnOnce(&Server) -> T) -> T {
    against(&["mem:64M"], body)
}

fn structured() -> Opts<'static> {
    Opts {
        structured: true,
        ..Default::default()
    }
}

fn with_meta() -> Opts<'static> {
    Opts {
        structured: true,
        meta: &["base:allocation"],
        ..Default::default()
    }
}

/// The server is alive and sane: a fresh connection negotiates, writes and
/// reads back, and nothing in its log says it panicked.
fn assert_serves(srv: &Server) {
    for o in [Opts::default(), structured()] {
        let mut c = Client::open(&srv.socket, &o);
        assert_eq!(c.size, SIZE);
        c.check_io(40 << 20, 0x5a);
        c.disconnect();
    }
    let log = srv.log_text();
    assert!(!log.contains("panicked"), "server panicked:\n{log}");
}

fn greeted(srv: &Server) -> UnixStream {
    let mut s = connect(&srv.socket);
    greet(&mut s).expect("greeting");
    s
}

/// The server hangs up on S once it is sent BYTES (WHAT, for the message).
fn hangs_up_after(mut s: impl Read + Write, bytes: &[u8], what: &str) {
    s.write_all(bytes).unwrap();
    expect_closed(&mut s, what);
}

/// A structured connection that wrote the first 64 KiB of the disk
/// (pattern `seed`), and what it wrote.
fn first_64k_written(srv: &Server, seed: u8) -> (Client<UnixStream>, Vec<u8>) {
    let mut c = Client::open(&srv.socket, &structured());
    let data = pattern(64 << 10, seed);
    c.write(0, &data);
    (c, data)
}

/// The 4 KiB at `off` read back as zeroes: `what` did not land.
fn assert_unwritten(c: &mut Client<UnixStream>, off: u64, what: &str) {
    assert_eq!(c.read(off, 4096), vec![0u8; 4096], "{what} landed");
}

/// The handshake on `s` goes on after what the test sent: it negotiates
/// `o` and the connection writes and reads back (pattern `seed`).
fn continues(s: UnixStream, o: &Opts, seed: u8) {
    let mut c = Client::negotiate(s, o).unwrap();
    c.check_io(0, seed);
}

/// One connection for each of `modes`: the test body on it, then a write
/// and read-back on the same connection (pattern `seed`).
fn in_each_mode(
    srv: &Server,
    modes: [Opts; 2],
    seed: u8,
    mut body: impl FnMut(&mut Client<UnixStream>, &Opts),
) {
    for o in modes {
        let mut c = Client::open(&srv.socket, &o);
        body(&mut c, &o);
        c.check_io(0, seed);
    }
}

// ---------------------------------------------------------------- handshake

#[test]
fn unknown_client_flags_hang_up() {
    against_mem(|srv| {
        let mut s = connect(&srv.socket);
        read_greeting(&mut s).unwrap();
        let flags = FLAG_C_FIXED_NEWSTYLE | 1 << 7;
        hangs_up_after(s, &flags.to_be_bytes(), "unknown client flags");
    });
}

#[test]
fn bad_option_magic_hangs_up() {
    against_mem(|srv| {
        let mut h = option_header(OPT_GO, 0);
        h[7] ^= 0xff;
        hangs_up_after(greeted(srv), &h, "bad option magic");
    });
}

#[test]
fn truncated_option_header_then_close() {
    against_mem(|srv| {
        let mut s = greeted(srv);
        s.write_all(&option_header(OPT_GO, 7)[..10]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        expect_closed(&mut s, "truncated option header");
    });
}

#[test]
fn garbage_instead_of_a_handshake_hangs_up() {
    against_mem(|srv| {
        let mut s = connect(&srv.socket);
        read_greeting(&mut s).unwrap();
        let mut junk = pattern(4096, 0xf0);
        junk[0] = 0xff; // client flags with unknown bits
                        // The server may hang up before reading it all.
        let _ = s.write_all(&junk);
        expect_closed(&mut s, "garbage");
    });
}

#[test]
fn unknown_option_is_unsupported_and_the_connection_continues() {
    against_mem(|srv| {
        let mut s = greeted(srv);
        assert_eq!(option_result(&mut s, 999, b"hello"), REP_ERR_UNSUP);
        assert_eq!(option_result(&mut s, 0x7fff_ffff, &[]), REP_ERR_UNSUP);
        continues(s, &structured(), 1);
    });
}

#[test]
fn oversized_option_is_too_big_and_the_connection_continues() {
    against_mem(|srv| {
        let mut s = greeted(srv);
        let big = vec![0u8; 100 * 1024];
        for opt in [OPT_INFO, OPT_GO, 999] {
            send_option(&mut s, opt, &big).unwrap();
            let r = option_replies(&mut s, opt).unwrap();
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(r[0].rtype, REP_ERR_TOO_BIG, "option {opt}");
        }
        // The 100 KiB payloads were consumed: the stream is still in sync.
        continues(s, &structured(), 2);
    });
}

#[test]
fn option_lengths_beyond_any_limit_hang_up() {
    against_mem(|srv| {
        // Over 16 MiB: not worth reading, the client is hostile.
        let h = option_header(OPT_INFO, 17 << 20);
        hangs_up_after(greeted(srv), &h, "17 MiB option");
        // EXPORT_NAME has no error reply, so an oversized one ends the connection.
        let h = option_header(OPT_EXPORT_NAME, 100 * 1024);
        hangs_up_after(greeted(srv), &h, "100 KiB EXPORT_NAME");
    });
}

#[test]
fn malformed_info_and_go_payloads_are_invalid() {
    against_mem(|srv| {
        let mut s = greeted(srv);
        let mut trailing = info_payload("", &[INFO_NAME]);
        trailing.push(0);
        let mut beyond = Vec::new();
        beyond.extend_from_slice(&100u32.to_be_bytes());
        beyond.extend_from_slice(b"abc\0\0");
        let mut too_many_infos = info_payload("", &[INFO_NAME]);
        too_many_infos[4..6].copy_from_slice(&5u16.to_be_bytes());
        let mut not_utf8 = info_payload("ab", &[]);
        not_utf8[4..6].copy_from_slice(&[0xff, 0xfe]);
        let cases: [(&str, Vec<u8>); 7] = [
            ("empty", Vec::new()),
            ("truncated", vec![0, 0]),
            ("trailing bytes", trailing),
            ("name length beyond payload", beyond),
            ("info count beyond payload", too_many_infos),
            ("5000-byte name", info_payload(&"a".repeat(5000), &[])),
            ("name not UTF-8", not_utf8),
        ];
        for opt in [OPT_INFO, OPT_GO] {
            for (what, p) in &cases {
                assert_eq!(
                    option_result(&mut s, opt, p),
                    REP_ERR_INVALID,
                    "option {opt}, {what}"
                );
            }
        }
        continues(s, &structured(), 3);
    });
}

#[test]
fn info_reports_the_export_and_skips_unknown_info_types() {
    against(DESCRIBED_DISK, |srv| {
        let mut s = greeted(srv);
        send_option(
            &mut s,
            OPT_INFO,
            &info_payload("disk", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE, 999]),
        )
        .unwrap();
        let r = option_replies(&mut s, OPT_INFO).unwrap();
        assert_eq!(r.last().unwrap().rtype, REP_ACK);
        let infos: Vec<(u16, &[u8])> = r
            .iter()
            .filter(|r| r.rtype == REP_INFO)
            .map(|r| (u16::from_be_bytes([r.data[0], r.data[1]]), &r.data[2..]))
            .collect();
        let get = |t: u16| infos.iter().find(|i| i.0 == t).map(|i| i.1);
        let export = get(INFO_EXPORT).expect("NBD_INFO_EXPORT");
        assert_eq!(&export[..8], &SIZE.to_be_bytes());
        assert_eq!(get(INFO_NAME), Some(&b"disk"[..]));
        assert_eq!(get(INFO_DESCRIPTION), Some(&b"test disk"[..]));
        let bs = get(INFO_BLOCK_SIZE).expect("NBD_INFO_BLOCK_SIZE");
        assert_eq!(bs.len(), 12);
        assert_eq!(&bs[8..12], &(32u32 << 20).to_be_bytes(), "maximum block");
        assert!(get(999).is_none(), "unknown info type answered");
        // INFO does not end the handshake.
        let mut c = Client::negotiate(
            s,
            &Opts {
                export: "disk",
                ..Default::default()
            },
        )
        .unwrap();
        c.check_io(0, 4);
    });
}

#[test]
fn unknown_export_via_info_and_go_is_unknown() {
    against(&["mem:64M", "--export", "disk"], |srv| {
        let mut s = greeted(srv);
        for opt in [OPT_INFO, OPT_GO] {
            assert_eq!(
                option_result(&mut s, opt, &info_payload("nope", &[])),
                REP_ERR_UNKNOWN
            );
        }
        // The empty name is the default export.
        continues(s, &structured(), 5);
    });
}

#[test]
fn unknown_export_via_export_name_hangs_up() {
    against(&["mem:64M", "--export", "disk"], |srv| {
        let mut s = greeted(srv);
        send_option(&mut s, OPT_EXPORT_NAME, b"nope").unwrap();
        expect_closed(&mut s, "EXPORT_NAME of an unknown export");
    });
}

#[test]
fn export_name_enters_transmission_with_and_without_zeroes() {
    against(&["mem:64M", "--export", "disk"], |srv| {
        // NO_ZEROES: 10 bytes.
        let mut s = greeted(srv);
        send_option(&mut s, OPT_EXPORT_NAME, b"disk").unwrap();
        let mut c = Client::from_export_name(s).unwrap();
        assert_eq!(c.size, SIZE);
        assert!(c.tflags & TF_HAS_FLAGS != 0);
        assert!(
            c.tflags & TF_SEND_DF == 0,
            "DF advertised without structured"
        );
        c.check_io(0, 6);
        c.disconnect();
        // Without NO_ZEROES: 10 bytes and 124 zeroes.
        let mut s = connect(&srv.socket);
        read_greeting(&mut s).unwrap();
        s.write_all(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
        send_option(&mut s, OPT_EXPORT_NAME, b"").unwrap();
        let mut c = Client::from_export_name(s).unwrap();
        let mut pad = [1u8; 124];
        std::io::Read::read_exact(&mut c.s, &mut pad).unwrap();
        assert!(pad.iter().all(|&b| b == 0));
        c.check_io(4096, 7);
        c.disconnect();
    });
}

#[test]
fn list_names_every_export() {
    against(DESCRIBED_DISK, |srv| {
        let mut s = greeted(srv);
        send_option(&mut s, OPT_LIST, &[]).unwrap();
        let r = option_replies(&mut s, OPT_LIST).unwrap();
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].rtype, REP_SERVER);
        let d = &r[0].data;
        let n = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
        assert_eq!(&d[4..4 + n], b"disk");
        assert_eq!(&d[4 + n..], b"test disk");
        assert_eq!(r[1].rtype, REP_ACK);
        assert_eq!(option_result(&mut s, OPT_LIST, b"x"), REP_ERR_INVALID);
        let mut c = Client::negotiate(
            s,
            &Opts {
                export: "disk",
                structured: true,
                ..Default::default()
            },
        )
        .unwrap();
        c.check_io(0, 8);
    });
}

#[test]
fn abort_is_acknowledged_then_closed() {
    against_mem(|srv| {
        let mut s = greeted(srv);
        assert_eq!(option_result(&mut s, OPT_STRUCTURED_REPLY, &[]), REP_ACK);
        send_option(&mut s, OPT_ABORT, &[]).unwrap();
        let r = read_option_reply(&mut s).unwrap();
        assert_eq!((r.opt, r.rtype), (OPT_ABORT, REP_ACK));
        expect_closed(&mut s, "after ABORT");
    });
}

#[test]
fn starttls_without_tls_is_refused_by_policy() {
    against_mem(|srv| {
        let mut s = greeted(srv);
        assert_eq!(option_result(&mut s, OPT_STARTTLS, &[]), REP_ERR_POLICY);
        continues(s, &Opts::default(), 9);
    });
}

#[test]
fn structured_reply_twice_is_invalid() {
    against_mem(|srv| {
        let mut s = greeted(srv);
        assert_eq!(
            option_result(&mut s, OPT_STRUCTURED_REPLY, b"x"),
            REP_ERR_INVALID
        );
        assert_eq!(option_result(&mut s, OPT_STRUCTURED_REPLY, &[]), REP_ACK);
        assert_eq!(
            option_result(&mut s, OPT_STRUCTURED_REPLY, &[]),
            REP_ERR_INVALID
        );
        // Still negotiated once: reads come back structured.
        let mut c = Client::go(s, "", true, Default::default()).unwrap();
        assert!(c.tflags & TF_SEND_DF != 0);
        c.write(0, &pattern(4096, 10));
        let r = c.call(0, CMD_READ, 0, 4096, &[]);
        assert!(r.is_structured(), "{r:?}");
        assert_eq!(r.read_data(0, 4096), pattern(4096, 10));
    });
}

#[test]
fn meta_context_before_structured_replies_is_invalid() {
    against_mem(|srv| {
        let mut s = greeted(srv);
        let p = meta_payload("", &["base:allocation"]);
        assert_eq!(
            option_result(&mut s, OPT_SET_META_CONTEXT, &p),
            REP_ERR_INVALID
        );
        assert_eq!(
            option_result(&mut s, OPT_LIST_META_CONTEXT, &p),
            REP_ERR_INVALID
        );
        // The connection continues and can negotiate properly afterwards.
        let mut c = Client::negotiate(s, &with_meta()).unwrap();
        let id = c.meta_ids["base:allocation"];
        let r = c.call(0, CMD_BLOCK_STATUS, 0, 65536, &[]);
        assert_eq!(r.error(), 0, "{r:?}");
        assert_eq!(r.chunks()[0].extents().0, id);
    });
}

#[test]
fn meta_context_list_and_set_results() {
    against(&["mem:64M", "--export", "disk"], |srv| {
        let mut s = greeted(srv);
        assert_eq!(option_result(&mut s, OPT_STRUCTURED_REPLY, &[]), REP_ACK);
        fn listed(s: &mut UnixStream, opt: u32, q: &[&str]) -> Vec<(u32, String)> {
            send_option(s, opt, &meta_payload("disk", q)).unwrap();
            let r = option_replies(s, opt).unwrap();
            assert_eq!(r.last().unwrap().rtype, REP_ACK, "{q:?}: {r:?}");
            r[..r.len() - 1].iter().map(parse_meta_context).collect()
        }
        let l = listed(&mut s, OPT_LIST_META_CONTEXT, &[]);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].1, "base:allocation");
        let l = listed(&mut s, OPT_LIST_META_CONTEXT, &["base:"]);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].1, "base:allocation");
        assert!(listed(&mut s, OPT_LIST_META_CONTEXT, &["qemu:dirty-bitmap:x"]).is_empty());
        assert!(listed(&mut s, OPT_SET_META_CONTEXT, &["nope:ctx"]).is_empty());
        let set = listed(
            &mut s,
            OPT_SET_META_CONTEXT,
            &["nope:ctx", "base:allocation"],
        );
        assert_eq!(set.len(), 1);
        assert_eq!(set[0].1, "base:allocation");
        let id = set[0].0;
        // Errors: unknown export, malformed payload.
        assert_eq!(
            option_result(
                &mut s,
                OPT_SET_META_CONTEXT,
                &meta_payload("other", &["base:allocation"])
            ),
            REP_ERR_UNKNOWN
        );
        let mut bad = meta_payload("disk", &["base:allocation"]);
        bad.truncate(bad.len() - 3);
        assert_eq!(
            option_result(&mut s, OPT_SET_META_CONTEXT, &bad),
            REP_ERR_INVALID
        );
        // The last successful SET still holds; the errors did not clear it.
        let mut c = Client::go(s, "disk", true, Default::default()).unwrap();
        c.write(0, &pattern(4096, 11));
        let r = c.call(0, CMD_BLOCK_STATUS, 0, 1 << 20, &[]);
        assert_eq!(r.error(), 0, "{r:?}");
        let (ctx, ext) = r.chunks()[0].extents();
        assert_eq!(ctx, id, "block status carries the id SET_META_CONTEXT gave");
        assert_eq!(ext[0], (65536, 0), "first 64 KiB page is data");
        // A SET that selected nothing leaves BLOCK_STATUS unavailable.
        let mut s = greeted(srv);
        assert_eq!(option_result(&mut s, OPT_STRUCTURED_REPLY, &[]), REP_ACK);
        assert!(listed(&mut s, OPT_SET_META_CONTEXT, &["nope:ctx"]).is_empty());
        let mut c = Client::go(s, "disk", true, Default::default()).unwrap();
        assert_eq!(c.call(0, CMD_BLOCK_STATUS, 0, 4096, &[]).error(), EINVAL);
        c.check_io(0, 12);
    });
}

// ------------------------------------------------------------- transmission

#[test]
fn block_status_without_a_context_is_invalid() {
    against_mem(|srv| {
        in_each_mode(srv, [Opts::default(), structured()], 13, |c, o| {
            let r = c.call(0, CMD_BLOCK_STATUS, 0, 4096, &[]);
            assert_eq!(r.error(), EINVAL, "{r:?}");
            assert_eq!(r.is_structured(), o.structured);
        });
    });
}

#[test]
fn unknown_commands_are_invalid() {
    against_mem(|srv| {
        in_each_mode(srv, [Opts::default(), structured()], 14, |c, o| {
            for (cmd, len) in [(42u16, 0u32), (8, 512), (0xffff, 4096)] {
                let r = c.call(0, cmd, 0, len, &[]);
                assert_eq!(r.error(), EINVAL, "command {cmd}: {r:?}");
                if o.structured {
                    assert!(r.message().is_some_and(|m| !m.is_empty()), "{r:?}");
                }
            }
        });
    });
}

#[test]
fn flags_not_valid_for_the_command_are_invalid() {
    against_mem(|srv| {
        let mut c = Client::open(&srv.socket, &with_meta());
        let data = pattern(512, 15);
        let cases: [(&str, u16, u16, &[u8]); 9] = [
            ("READ+NO_HOLE", CMD_FLAG_NO_HOLE, CMD_READ, &[]),
            ("READ+REQ_ONE", CMD_FLAG_REQ_ONE, CMD_READ, &[]),
            ("WRITE+REQ_ONE", CMD_FLAG_REQ_ONE, CMD_WRITE, &data),
            ("WRITE+unknown bit", 1 << 10, CMD_WRITE, &data),
            ("TRIM+DF", CMD_FLAG_DF, CMD_TRIM, &[]),
            ("WRITE_ZEROES+DF", CMD_FLAG_DF, CMD_WRITE_ZEROES, &[]),
            ("BLOCK_STATUS+DF", CMD_FLAG_DF, CMD_BLOCK_STATUS, &[]),
            ("CACHE+NO_HOLE", CMD_FLAG_NO_HOLE, CMD_CACHE, &[]),
            ("FLUSH+REQ_ONE", CMD_FLAG_REQ_ONE, CMD_FLUSH, &[]),
        ];
        for (what, flags, cmd, payload) in cases {
            let len = if cmd == CMD_FLUSH { 0 } else { 512 };
            let r = c.call(flags, cmd, 8192, len, payload);
            assert_eq!(r.error(), EINVAL, "{what}: {r:?}");
        }
        // The refused WRITEs' payloads were consumed and not written.
        assert_eq!(c.read(8192, 512), vec![0u8; 512]);
        c.check_io(0, 16);
        // DF without structured replies.
        let mut c = Client::open(&srv.socket, &Opts::default());
        assert_eq!(c.call(CMD_FLAG_DF, CMD_READ, 0, 512, &[]).error(), EINVAL);
        c.check_io(0, 17);
    });
}

/// The NBD specification: "NBD_CMD_FLAG_FUA ... is valid for all commands,
/// provided NBD_FLAG_SEND_FUA has been negotiated, in which case the server
/// MUST accept all commands with this bit set (even by ignoring the bit)
/// ... existing clients are known to set this bit on other commands" (old
/// qemu sent FLUSH with FUA).
#[test]
fn fua_is_accepted_on_every_command_when_advertised() {
    let refused = against_mem(|srv| {
        let mut c = Client::open(&srv.socket, &with_meta());
        assert!(c.tflags & TF_SEND_FUA != 0);
        let data = pattern(4096, 18);
        let mut refused = Vec::new();
        for (what, cmd, len, payload) in [
            ("WRITE", CMD_WRITE, 4096, &data[..]),
            ("TRIM", CMD_TRIM, 4096, &[][..]),
            ("WRITE_ZEROES", CMD_WRITE_ZEROES, 4096, &[][..]),
            ("READ", CMD_READ, 4096, &[][..]),
            ("FLUSH", CMD_FLUSH, 0, &[][..]),
            ("CACHE", CMD_CACHE, 4096, &[][..]),
            ("BLOCK_STATUS", CMD_BLOCK_STATUS, 4096, &[][..]),
        ] {
            let r = c.call(CMD_FLAG_FUA, cmd, 0, len, payload);
            if r.error() != 0 {
                refused.push(format!("{what}+FUA -> errno {}", r.error()));
            }
        }
        c.check_io(0, 19);
        refused
    });
    assert!(refused.is_empty(), "refused: {refused:?}");
}

#[test]
fn out_of_range_requests_get_the_documented_errno() {
    against_mem(|srv| {
        let ranges = [
            ("at the end", SIZE, 512u32),
            ("across the end", SIZE - 512, 1024),
            ("offset+length overflows u64", u64::MAX - 255, 512),
            ("huge offset", 1 << 62, 4096),
        ];
        for o in [Opts::default(), with_meta()] {
            let mut c = Client::open(&srv.socket, &o);
            for (what, off, len) in ranges {
                let data = pattern(len as usize, 20);
                let mut cases = vec![
                    ("READ", CMD_READ, EINVAL, &[][..]),
                    ("CACHE", CMD_CACHE, EINVAL, &[][..]),
                    ("WRITE", CMD_WRITE, ENOSPC, &data[..]),
                    ("TRIM", CMD_TRIM, ENOSPC, &[][..]),
                    ("WRITE_ZEROES", CMD_WRITE_ZEROES, ENOSPC, &[][..]),
                ];
                if o.structured {
                    cases.push(("BLOCK_STATUS", CMD_BLOCK_STATUS, EINVAL, &[][..]));
                }
                for (name, cmd, want, payload) in cases {
                    let r = c.call(0, cmd, off, len, payload);
                    assert_eq!(
                        r.error(),
                        want,
                        "{name} {what} (structured {}): {r:?}",
                        o.structured
                    );
                }
            }
            // Nothing landed in the last sector; the connection still works.
            assert_eq!(c.read(SIZE - 512, 512), vec![0u8; 512]);
            c.check_io(SIZE - 4096, 21);
            c.write(SIZE - 4096, &[0u8; 4096]);
        }
    });
}

#[test]
fn oversized_read_is_eoverflow() {
    against_mem(|srv| {
        in_each_mode(srv, [Opts::default(), structured()], 22, |c, _| {
            let r = c.call(0, CMD_READ, 0, (32 << 20) + 1, &[]);
            assert_eq!(r.error(), EOVERFLOW, "{r:?}");
            let r = c.call(0, CMD_READ, 0, 33 << 20, &[]);
            assert_eq!(r.error(), EOVERFLOW, "{r:?}");
        });
        // Exactly the maximum is fine.
        let mut c = Client::open(&srv.socket, &Opts::default());
        let d = c.read(0, 32 << 20);
        assert_eq!(d[..4096], pattern(4096, 22)[..]);
    });
}

#[test]
fn oversized_write_payload_is_consumed_then_eoverflow() {
    against_mem(|srv| {
        in_each_mode(srv, [Opts::default(), structured()], 23, |c, _| {
            let big = vec![0xa5u8; 33 << 20];
            let r = c.call(0, CMD_WRITE, 8 << 20, big.len() as u32, &big);
            assert_eq!(r.error(), EOVERFLOW, "{r:?}");
            // The next request parses (the 33 MiB were read and dropped)
            // and finds nothing written.
            assert_unwritten(c, 8 << 20, "refused write");
        });
    });
}

#[test]
fn read_only_export_refuses_write_like_requests_with_eperm() {
    let dir = tempdir();
    let srv = Server::start(dir.path(), &["mem:64M", "--read-only"]);
    for o in [Opts::default(), with_meta()] {
        let mut c = Client::open(&srv.socket, &o);
        assert!(c.tflags & TF_READ_ONLY != 0);
        assert!(c.tflags & (TF_SEND_TRIM | TF_SEND_WRITE_ZEROES | TF_SEND_FUA) == 0);
        let data = pattern(4096, 24);
        for (what, flags, cmd, payload) in [
            ("WRITE", 0, CMD_WRITE, &data[..]),
            ("TRIM", 0, CMD_TRIM, &[][..]),
            ("WRITE_ZEROES", 0, CMD_WRITE_ZEROES, &[][..]),
            (
                "WRITE_ZEROES+FAST_ZERO",
                CMD_FLAG_FAST_ZERO,
                CMD_WRITE_ZEROES,
                &[][..],
            ),
        ] {
            let r = c.call(flags, cmd, 0, 4096, payload);
            assert_eq!(r.error(), EPERM, "{what}: {r:?}");
        }
        assert_eq!(c.read(0, 4096), vec![0u8; 4096]);
        assert_eq!(c.call(0, CMD_FLUSH, 0, 0, &[]).error(), 0);
        c.disconnect();
    }
    let log = srv.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn zero_length_requests_are_invalid() {
    against_mem(|srv| {
        in_each_mode(srv, [Opts::default(), with_meta()], 25, |c, o| {
            let mut cmds = vec![CMD_READ, CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES, CMD_CACHE];
            if o.structured {
                cmds.push(CMD_BLOCK_STATUS);
            }
            for cmd in cmds {
                let r = c.call(0, cmd, 4096, 0, &[]);
                assert_eq!(r.error(), EINVAL, "command {cmd}: {r:?}");
            }
            assert_eq!(c.call(0, CMD_FLUSH, 0, 0, &[]).error(), 0);
        });
    });
}

#[test]
fn block_status_req_one_returns_one_descriptor() {
    against_mem(|srv| {
        let mut c = Client::open(&srv.socket, &with_meta());
        let id = c.meta_ids["base:allocation"];
        // mem: allocates 64 KiB pages: data, hole, data, hole...
        c.write(0, &pattern(4096, 26));
        c.write(128 << 10, &pattern(4096, 27));
        let r = c.call(0, CMD_BLOCK_STATUS, 0, 256 << 10, &[]);
        assert_eq!(r.chunks().len(), 1, "{r:?}");
        let (ctx, ext) = r.chunks()[0].extents();
        assert_eq!(ctx, id);
        assert!(ext.len() >= 3, "{ext:?}");
        assert_eq!(ext[0], (65536, 0));
        assert_eq!(ext[1].0, 65536);
        assert!(ext[1].1 & STATE_HOLE != 0, "{ext:?}");
        assert_eq!(ext[2], (65536, 0));
        let total: u64 = ext.iter().map(|e| e.0 as u64).sum();
        assert!(total <= 256 << 10, "descriptors run past the request");
        for (off, want) in [(0u64, (65536u32, 0u32)), (64 << 10, (65536, STATE_HOLE))] {
            let r = c.call(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, off, 192 << 10, &[]);
            let (_, ext) = r.chunks()[0].extents();
            assert_eq!(ext.len(), 1, "REQ_ONE at {off}: {ext:?}");
            assert_eq!(ext[0].0, want.0);
            assert_eq!(ext[0].1 & STATE_HOLE, want.1);
        }
        // A request shorter than an extent gets at most its length.
        let r = c.call(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 0, 4096, &[]);
        assert_eq!(r.chunks()[0].extents().1, vec![(4096, 0)]);
    });
}

#[test]
fn structured_read_of_a_half_written_range_returns_a_hole_chunk() {
    against_mem(|srv| {
        let (mut c, data) = first_64k_written(srv, 28);
        let r = c.call(0, CMD_READ, 0, 128 << 10, &[]);
        let kinds: Vec<(u16, u64, u64)> = r
            .chunks()
            .iter()
            .map(|ch| (ch.rtype, ch.offset(), ch.len()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (REPLY_TYPE_OFFSET_DATA, 0, 64 << 10),
                (REPLY_TYPE_OFFSET_HOLE, 64 << 10, 64 << 10)
            ]
        );
        let ch = r.chunks();
        assert_eq!(ch[0].flags & REPLY_FLAG_DONE, 0);
        assert_eq!(ch[1].flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
        let mut want = data.clone();
        want.resize(128 << 10, 0);
        assert!(r.read_data(0, 128 << 10) == want);
        // An unaligned read inside the hole is one hole chunk.
        let r = c.call(0, CMD_READ, (64 << 10) + 100, 1000, &[]);
        assert_eq!(r.chunks().len(), 1);
        assert_eq!(r.chunks()[0].rtype, REPLY_TYPE_OFFSET_HOLE);
        assert_eq!(r.read_data((64 << 10) + 100, 1000), vec![0u8; 1000]);
    });
}

#[test]
fn df_read_returns_a_single_data_chunk() {
    against_mem(|srv| {
        let (mut c, data) = first_64k_written(srv, 29);
        for (off, len) in [(0u64, 128u32 << 10), (1 << 20, 64 << 10)] {
            let r = c.call(CMD_FLAG_DF, CMD_READ, off, len, &[]);
            let ch = r.chunks();
            assert_eq!(ch.len(), 1, "DF read at {off} fragmented: {r:?}");
            assert_eq!(ch[0].rtype, REPLY_TYPE_OFFSET_DATA);
            assert_eq!(ch[0].flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
            assert_eq!((ch[0].offset(), ch[0].len()), (off, len as u64));
            let mut want = if off == 0 { data.clone() } else { Vec::new() };
            want.resize(len as usize, 0);
            assert!(r.read_data(off, len) == want);
        }
    });
}

#[test]
fn bad_request_magic_closes_the_connection() {
    against_mem(|srv| {
        let mut c = Client::open(&srv.socket, &structured());
        c.check_io(0, 30);
        let mut h = request_header(0, CMD_READ, 1, 0, 512);
        h[0] ^= 0x80;
        hangs_up_after(c.s, &h, "bad request magic");
    });
}

#[test]
fn disconnect_answers_requests_in_flight_first() {
    against_mem(|srv| {
        let mut c = Client::open(&srv.socket, &Opts::default());
        let data = pattern(1 << 20, 31);
        let handles: Vec<u64> = (0..8)
            .map(|i| c.send(0, CMD_WRITE, i << 20, 1 << 20, &data))
            .collect();
        c.send(0, CMD_DISC, 0, 0, &[]);
        let mut got: Vec<u64> = (0..8)
            .map(|_| {
                let r = c.recv().expect("reply to an in-flight write");
                assert_eq!(r.error(), 0);
                r.handle()
            })
            .collect();
        got.sort();
        assert_eq!(got, handles);
        expect_closed(&mut c.s, "after DISC");
        let mut c = Client::open(&srv.socket, &Opts::default());
        assert!(c.read(7 << 20, 1 << 20) == data);
    });
}

#[test]
fn abrupt_disconnect_mid_request_header() {
    against_mem(|srv| {
        for o in [Opts::default(), structured()] {
            let mut c = Client::open(&srv.socket, &o);
            c.s.write_all(&request_header(0, CMD_WRITE, 1, 0, 512)[..10])
                .unwrap();
            drop(c);
        }
    });
}

#[test]
fn abrupt_disconnect_mid_write_payload() {
    against_mem(|srv| {
        let mut c = Client::open(&srv.socket, &Opts::default());
        let mut v = request_header(0, CMD_WRITE, 1, 2 << 20, 1 << 20);
        v.extend_from_slice(&pattern(1000, 32));
        c.s.write_all(&v).unwrap();
        drop(c);
        let mut c = Client::open(&srv.socket, &structured());
        assert_unwritten(&mut c, 2 << 20, "a truncated write");
    });
}

#[test]
fn abrupt_disconnect_with_50_requests_in_flight() {
    against_mem(|srv| {
        for round in 0..3u64 {
            let mut c = Client::open(&srv.socket, &structured());
            let data = pattern(64 << 10, 33);
            for i in 0..50u64 {
                if i % 5 == 0 {
                    c.send(0, CMD_WRITE, (round * 50 + i) << 16, 64 << 10, &data);
                } else {
                    c.send(0, CMD_READ, i << 20, 1 << 20, &[]);
                }
            }
            let _ = c.s.shutdown(std::net::Shutdown::Both);
            drop(c);
        }
    });
}

#[test]
fn fifty_concurrent_connections() {
    against_mem(|srv| {
        let sock = srv.socket.clone();
        let threads: Vec<_> = (0..50u64)
            .map(|i| {
                let sock = sock.clone();
                std::thread::spawn(move || {
                    let o = if i % 2 == 0 {
                        Opts::default()
                    } else {
                        structured()
                    };
                    let mut c = Client::open(&sock, &o);
                    c.check_io(i * 8192, i as u8);
                    c.disconnect();
                })
            })
            .collect();
        for t in threads {
            t.join().expect("client thread");
        }
        // Every client's data is where it wrote it.
        let mut c = Client::open(&srv.socket, &Opts::default());
        let all = c.read(0, 50 * 8192);
        for i in 0..50usize {
            assert!(all[i * 8192..i * 8192 + 4096] == pattern(4096, i as u8)[..]);
        }
    });
}

// ------------------------------------------------- cross-check with libnbd

/// Run `nbdsh -u URI -c SCRIPT`. nbdsh runs `python3` from PATH, and the
/// libnbd bindings belong to the distribution's python3 next to nbdsh, so
/// that directory goes first.
fn nbdsh(uri: &str, script: &str) -> Output {
    require_tool("nbdsh");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let nbdsh_dir = std::env::split_paths(&path)
        .find(|d| d.join("nbdsh").is_file())
        .expect("nbdsh on PATH");
    let mut dirs = vec![nbdsh_dir];
    dirs.extend(std::env::split_paths(&path));
    let out = Command::new("nbdsh")
        .env("PATH", std::env::join_paths(dirs).unwrap())
        .args(["-u", uri, "-c", script])
        .output()
        .expect("run nbdsh");
    assert_success(&out, &format!("nbdsh:\n{script}\n"));
    out
}

const EXPECT_ERRNO: &str = r#"
import errno
def expect(want, f, *args):
    try:
        f(*args)
    except nbd.Error as e:
        assert e.errnum == want, "%s: errno %s, want %s (%s)" % (f.__name__, e.errnum, want, e.string)
        return
    raise AssertionError("%s succeeded, want errno %s" % (f.__name__, want))
h.set_strict_mode(0)
"#;

#[test]
fn nbdsh_out_of_range_pread_is_einval() {
    against_mem(|srv| {
        let script = format!(
            "{EXPECT_ERRNO}
size = h.get_size()
assert size == {SIZE}
expect(errno.EINVAL, h.pread, 512, size)
expect(errno.EINVAL, h.pread, 1024, size - 512)
expect(errno.ENOSPC, h.pwrite, b'x' * 512, size)
h.pwrite(b'y' * 512, 0)
assert h.pread(512, 0) == b'y' * 512
"
        );
        nbdsh(&srv.uri(), &script);
    });
}

#[test]
fn nbdsh_write_like_requests_on_read_only_are_eperm() {
    let dir = tempdir();
    let srv = Server::start(dir.path(), &["mem:64M", "--read-only"]);
    let script = format!(
        "{EXPECT_ERRNO}
assert h.is_read_only()
expect(errno.EPERM, h.pwrite, b'x' * 512, 0)
expect(errno.EPERM, h.trim, 4096, 0)
expect(errno.EPERM, h.zero, 4096, 0)
expect(errno.EPERM, h.zero, 4096, 0, nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(512, 0) == bytes(512)
"
    );
    nbdsh(&srv.uri(), &script);
}

#[test]
fn nbdsh_fast_zero_and_structured_reads() {
    against_mem(|srv| {
        let script = r#"
assert h.can_fast_zero()
assert h.can_df()
h.pwrite(b'\x55' * 131072, 0)
h.zero(65536, 0, nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(131072, 0) == bytes(65536) + b'\x55' * 65536
seen = []
def chunk(buf, offset, status, err):
    seen.append((status, offset, len(buf)))
    return 0
h.pread_structured(131072, 0, chunk)
assert seen == [(nbd.READ_HOLE, 0, 65536), (nbd.READ_DATA, 65536, 65536)], seen
seen.clear()
h.pread_structured(131072, 0, chunk, nbd.CMD_FLAG_DF)
assert seen == [(nbd.READ_DATA, 0, 131072)], seen
"#;
        nbdsh(&srv.uri(), script);
    });
}

// ------------------------------------------------------ resource limits

/// A `VmRSS`/`VmHWM`-style field of /proc/PID/status, in KiB.
fn proc_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A client that sends READs and never reads the replies must be pushed
/// back through the socket (`--max-in-flight` requests at most), not have
/// every reply it ignores buffered in server memory.
#[test]
fn replies_a_client_never_reads_do_not_pile_up_in_memory() {
    let grown_mib = against(&["mem:64M", "--max-in-flight", "4"], |srv| {
        let pid = srv.pid();
        let before = proc_kib(pid, "VmRSS");
        let mut c = Client::open(&srv.socket, &Opts::default());
        for i in 0..100u64 {
            c.send(0, CMD_READ, (i % 16) << 22, 4 << 20, &[]);
        }
        // Let the server do all it is willing to do: wait until RSS settles.
        let mut last = 0;
        for _ in 0..25 {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let now = proc_kib(pid, "VmRSS");
            if now == last {
                break;
            }
            last = now;
        }
        let grown_mib = proc_kib(pid, "VmHWM").saturating_sub(before) / 1024;
        drop(c);
        grown_mib
    });
    // 4 in flight x 4 MiB plus buffers is ~25 MiB; 400 MiB were asked for.
    assert!(
        grown_mib < 100,
        "server memory grew by {grown_mib} MiB for 400 MiB of unread replies \
         with --max-in-flight 4: replies are queued without bound"
    );
}

#[test]
fn connections_beyond_the_limit_wait_for_a_free_slot() {
    against(TWO_CONNECTIONS, |srv| {
        let a = Client::open(&srv.socket, &Opts::default());
        let mut b = Client::open(&srv.socket, &Opts::default());
        let mut waiting = connect(&srv.socket);
        waiting
            .set_read_timeout(Some(std::time::Duration::from_millis(500)))
            .unwrap();
        let mut byte = [0u8; 1];
        let r = std::io::Read::read(&mut waiting, &mut byte);
        assert!(
            r.is_err(),
            "third client served over --max-connections 2: {r:?}"
        );
        waiting.set_read_timeout(Some(TIMEOUT)).unwrap();
        a.disconnect();
        let mut c = Client::handshake(waiting, &structured()).expect("served once a slot freed");
        c.check_io(0, 34);
        b.check_io(8192, 35);
        c.disconnect();
        b.disconnect();
    });
}

/// SIGTERM must close idle clients and stop, even when the connection
/// limit is reached and another client waits for a slot.
#[test]
fn sigterm_at_the_connection_limit_still_shuts_down() {
    let dir = tempdir();
    let srv = Server::start(dir.path(), TWO_CONNECTIONS);
    let mut a = Client::open(&srv.socket, &Opts::default());
    let _b = Client::open(&srv.socket, &Opts::default());
    let _waiting = connect(&srv.socket);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let st = Command::new("kill")
        .args(["-TERM", &srv.pid().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    // Shutdown closes idle transmission-phase clients. (On failure the
    // clients are dropped before the server, which frees a slot and lets
    // the server's own Drop stop it.)
    a.s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    let r = std::io::Read::read(&mut a.s, &mut buf);
    assert!(
        matches!(r, Ok(0))
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "idle client not disconnected within 5 s of SIGTERM ({r:?}): the accept loop \
         is stuck waiting for a connection slot and never sees the stop signal"
    );
}
