//! Many clients, many requests in flight: eight connections to one export,
//! each writing its own region with 64 requests queued at once, then
//! verifying; a fresh connection and the file itself must show every byte
//! where it belongs.

mod common;

use std::process::{Child, Command, Output, Stdio};

use common::*;

const MIB: u64 = 1 << 20;
const CLIENTS: u64 = 8;
const REQUESTS: u64 = 64;
const SIZE: u64 = 256 * MIB;
const REGION: u64 = SIZE / CLIENTS;
const SLOT: u64 = REGION / REQUESTS;

/// Write `i` of client `c`: an unaligned offset and length inside its slot.
fn write_of(c: u64, i: u64, max_len: u64) -> (u64, u64, u8) {
    let off = c * REGION + i * SLOT + (c * 131 + i * 977) % 4096;
    let len = max_len / 2 + (c * 7919 + i * 104_729) % (max_len / 4);
    assert!(off + len <= c * REGION + (i + 1) * SLOT);
    let pattern = ((c * REQUESTS + i) % 255 + 1) as u8;
    (off, len, pattern)
}

/// One process for each client, made by CLIENT(c), all running at once:
/// their outputs, in client order.
fn all_at_once(client: impl Fn(u64) -> Command) -> Vec<Output> {
    let children: Vec<Child> = (0..CLIENTS)
        .map(|c| {
            client(c)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn client {c}: {e}"))
        })
        .collect();
    children
        .into_iter()
        .map(|child| child.wait_with_output().expect("wait for a client"))
        .collect()
}

/// Compare the served file with the writes every client made (zeroes
/// elsewhere).
fn assert_file_holds(img: &std::path::Path, max_len: u64) {
    let mut want = vec![0u8; SIZE as usize];
    for c in 0..CLIENTS {
        for i in 0..REQUESTS {
            let (off, len, p) = write_of(c, i, max_len);
            want[off as usize..(off + len) as usize].fill(p);
        }
    }
    assert_bytes_equal(
        &std::fs::read(img).expect("read image"),
        &want,
        "served file",
    );
}

/// Proof 3: eight qemu-io processes at once, each queueing 64 `aio_write`s
/// (qemu's NBD driver puts up to 16 of them on the wire), `aio_flush`, then
/// 64 `aio_read -P` checks; then a fresh connection checks every pattern.
#[test]
fn eight_qemu_io_clients_with_64_aio_writes_each() {
    require_tool("qemu-io");
    let (_dir, img, srv) = serve_blank(SIZE, &[]);
    let uri = srv.uri();
    let max_len = SLOT - 4096;
    let outputs = all_at_once(|c| {
        let mut cmds = Vec::new();
        for i in 0..REQUESTS {
            let (off, len, p) = write_of(c, i, max_len);
            cmds.push(format!("aio_write -P {p} {off} {len}"));
        }
        cmds.push("aio_flush".into());
        for i in 0..REQUESTS {
            let (off, len, p) = write_of(c, i, max_len);
            cmds.push(format!("aio_read -P {p} {off} {len}"));
        }
        cmds.push("aio_flush".into());
        qemu_io_command(&uri, &cmds)
    });
    for (c, out) in outputs.into_iter().enumerate() {
        check_qemu_io(&out, &format!("client {c}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.matches("wrote ").count(),
            REQUESTS as usize,
            "client {c}:\n{text}"
        );
        assert_eq!(
            text.matches("read ").count(),
            REQUESTS as usize,
            "client {c}:\n{text}"
        );
    }
    // A fresh connection sees every pattern.
    let mut cmds = Vec::new();
    for c in 0..CLIENTS {
        for i in 0..REQUESTS {
            let (off, len, p) = write_of(c, i, max_len);
            cmds.push(format!("read -P {p} {off} {len}"));
        }
    }
    let out = qemu_io(&uri, &cmds);
    assert_eq!(out.matches("read ").count(), (CLIENTS * REQUESTS) as usize);
    drop(srv);
    assert_file_holds(&img, max_len);
}

/// One libnbd client: 64 writes queued before waiting for any reply, flush,
/// then 64 reads of whole slots (pattern plus the zero gap around it, which
/// comes back as structured hole chunks), also queued together.
const LIBNBD_CLIENT: &str = r#"
import sys, nbd
uri, c, CLIENTS, REQUESTS, REGION, SLOT, MAXLEN = sys.argv[1], *map(int, sys.argv[2:8])
h = nbd.NBD()
h.add_meta_context("base:allocation")
h.connect_uri(uri)
assert h.can_multi_conn(), "server does not advertise multi-conn"

def write_of(i):
    off = c * REGION + i * SLOT + (c * 131 + i * 977) % 4096
    n = MAXLEN // 2 + (c * 7919 + i * 104729) % (MAXLEN // 4)
    return off, n, (c * REQUESTS + i) % 255 + 1

def drain(cookies):
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for ck in cookies:
        # Raises nbd.Error if the server failed the command.
        assert h.aio_command_completed(ck), "command not completed"

cookies = []
for i in range(REQUESTS):
    off, n, p = write_of(i)
    cookies.append(h.aio_pwrite(bytes([p]) * n, off))
peak = h.aio_in_flight()
drain(cookies)
h.flush()

bufs = []
cookies = []
for i in range(REQUESTS):
    b = nbd.Buffer(SLOT)
    bufs.append(b)
    cookies.append(h.aio_pread(b, c * REGION + i * SLOT))
drain(cookies)
for i, b in enumerate(bufs):
    off, n, p = write_of(i)
    got = b.to_bytearray()
    start = c * REGION + i * SLOT
    want = bytes(off - start) + bytes([p]) * n + bytes(start + SLOT - off - n)
    if got != want:
        bad = next(k for k in range(SLOT) if got[k] != want[k])
        sys.exit(f"client {c} slot {i}: byte {start + bad} is {got[bad]}, want {want[bad]}")
h.shutdown()
print(f"ok peak={peak}")
"#;

/// 64 requests really in flight on each of eight connections (libnbd has
/// no client-side cap), and reads whose replies mix data and hole chunks.
#[test]
fn eight_libnbd_clients_with_64_requests_in_flight_each() {
    let (_dir, img, srv) = serve_blank(SIZE, &[]);
    let uri = srv.uri();
    // Leave a zero gap in every slot, so reads cross data and holes.
    let max_len = SLOT / 2;
    let nums: Vec<String> = [CLIENTS, REQUESTS, REGION, SLOT, max_len]
        .iter()
        .map(|n| n.to_string())
        .collect();
    let outputs = all_at_once(|c| {
        let c = c.to_string();
        let mut args = vec![uri.as_str(), c.as_str()];
        args.extend(nums.iter().map(String::as_str));
        python_nbd(LIBNBD_CLIENT, &args)
    });
    for (c, out) in outputs.into_iter().enumerate() {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.trim() == format!("ok peak={REQUESTS}"),
            "client {c} failed ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop(srv);
    assert_file_holds(&img, max_len);
}
