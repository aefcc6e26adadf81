//! Issue 6: one trace per export with client ids. Two `qemu-io` processes
//! write and read disjoint halves of one `roamdisk serve trace:FILE:mem`
//! export at the same time; every record of the trace carries the id of
//! the NBD connection that issued it, the server log says which process
//! each id was, and each id's records are exactly that process's half.

mod common;
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};

const HALF: u64 = 32 << 20;
const REQ: u64 = 64 << 10;
/// Writes (and as many verifying reads) per client.
const WRITES: u64 = 64;

/// `write` then `read -P` of WRITES pieces of the half starting at `base`,
/// after a pause that lets the other client connect too.
fn commands(base: u64, pattern: u8) -> Vec<String> {
    let at = |i: u64| base + i * (HALF / WRITES);
    let mut c = vec!["sleep 200".to_string()];
    c.extend((0..WRITES).map(|i| format!("write -P {pattern} {} {REQ}", at(i))));
    c.extend((0..WRITES).map(|i| format!("read -P {pattern} {} {REQ}", at(i))));
    c
}

/// The log without terminal colours.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(ch) = chars.next() {
        if ch == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(ch);
        }
    }
    out
}

/// The number after `key` in `line` (`client=3`, `pid 1234`).
fn number_after(line: &str, key: &str) -> Option<u32> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[test]
fn two_concurrent_clients_are_recorded_with_their_own_ids() {
    require_tool("qemu-io");
    let dir = tempdir();
    let d = dir.path();
    let trace = d.join("two.rdtrace");
    let srv = Server::start(d, &["-v", &format!("trace:{}:mem:64M", trace.display())]);
    let uri = srv.uri();
    let a = spawn_captured(qemu_io_command(&uri, &commands(0, 0xa1)));
    let b = spawn_captured(qemu_io_command(&uri, &commands(HALF, 0xb2)));
    let (pid_a, pid_b) = (a.id(), b.id());
    let (a, b) = (
        a.wait_with_output().expect("qemu-io a"),
        b.wait_with_output().expect("qemu-io b"),
    );
    check_qemu_io(&a, "client a");
    check_qemu_io(&b, "client b");
    let log = plain(&srv.log_text());
    assert!(srv.stop().success());

    // The server logged each connection's id with the peer's process.
    let mut pid_of: BTreeMap<u32, u32> = BTreeMap::new();
    for l in log.lines().filter(|l| l.contains("client connected")) {
        let client = number_after(l, "client=").expect("client=N in the log line");
        let pid = number_after(l, "pid ").expect("the peer's pid in the log line");
        assert!(
            pid_of.insert(client, pid).is_none(),
            "client id {client} given out twice:\n{log}"
        );
    }
    assert!(
        pid_of.values().any(|&p| p == pid_a) && pid_of.values().any(|&p| p == pid_b),
        "qemu-io pids {pid_a} and {pid_b} are not both in the log:\n{log}"
    );
    assert_eq!(
        pid_of.keys().copied().collect::<Vec<_>>(),
        (1..=pid_of.len() as u32).collect::<Vec<_>>(),
        "connections are numbered from 1:\n{log}"
    );

    // Every record's client is the process that issued it: qemu-io a only
    // touched the first half, qemu-io b only the second.
    let csv = rd(&["trace", "cat", path_str(&trace)]);
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("time_ns,client,device,op,offset,len,fragment")
    );
    let mut io_by_pid: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut clients = BTreeSet::new();
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        let (client, op): (u32, &str) = (f[1].parse().unwrap(), f[3]);
        let (offset, len): (u64, u64) = (f[4].parse().unwrap(), f[5].parse().unwrap());
        if op == "flush" && client == 0 {
            continue; // the server's own flush at shutdown
        }
        let pid = *pid_of
            .get(&client)
            .unwrap_or_else(|| panic!("record of unknown client {client}: {l}"));
        clients.insert(client);
        if op == "flush" {
            continue;
        }
        let half = if pid == pid_a { 0 } else { HALF };
        assert!(
            pid == pid_a || pid == pid_b,
            "client {client} (pid {pid}) is neither qemu-io: {l}"
        );
        assert!(
            offset >= half && offset + len <= half + HALF,
            "client {client} (pid {pid}, {}) recorded outside its half: {l}",
            if pid == pid_a { "a" } else { "b" }
        );
        let e = io_by_pid.entry(pid).or_default();
        match op {
            "write" => e.0 += 1,
            "read" => e.1 += 1,
            _ => {}
        }
    }
    assert!(clients.len() >= 2, "one client id only: {clients:?}");
    for (name, pid) in [("a", pid_a), ("b", pid_b)] {
        let (w, r) = io_by_pid.get(&pid).copied().unwrap_or_default();
        assert!(
            w >= WRITES && r >= WRITES,
            "qemu-io {name} (pid {pid}) has {w} writes and {r} reads in the trace, want {WRITES} each"
        );
    }
}

/// Start `c` with its output captured, for `wait_with_output`.
fn spawn_captured(mut c: Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn qemu-io")
}
