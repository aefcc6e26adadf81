//! The `cow:OVERLAY:BASE` stack seen from real clients: the same writes
//! applied through the export and directly to a copy of the base give the
//! same bytes, before and after a restart; the base is never written;
//! discard releases whole clusters and keeps everything else; the
//! allocation map merges overlay and base; flushed writes survive a crash
//! (SIGKILL) of the server; a size that is not a multiple of the cluster
//! works to the last byte.

mod common;

use std::path::PathBuf;
use std::process::Stdio;

use common::*;

const MIB: u64 = 1 << 20;
const CLUSTER: u64 = 65536;

/// A base file, a pristine copy of it, and the cow spec over it.
struct Stack {
    dir: tempfile::TempDir,
    base: PathBuf,
    pristine: PathBuf,
    spec: String,
}

fn stack(size: u64, seed: u64) -> Stack {
    let dir = tempdir();
    let base = dir.path().join("base.raw");
    random_file(&base, size, seed);
    let pristine = dir.path().join("pristine.raw");
    std::fs::copy(&base, &pristine).expect("copy base");
    let spec = spec_cow_raw(dir.path(), &base);
    Stack {
        dir,
        base,
        pristine,
        spec,
    }
}

impl Stack {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn start(&self, extra: &[&str]) -> Server {
        let mut args = vec![self.spec.as_str()];
        args.extend_from_slice(extra);
        Server::start(self.dir.path(), &args)
    }
    /// The whole export, read with qemu-img convert.
    fn export_bytes(&self, srv: &Server) -> Vec<u8> {
        let out = self.path("export.raw");
        let _ = std::fs::remove_file(&out);
        qemu_img_copy(&srv.uri(), path_str(&out));
        std::fs::read(&out).expect("read export copy")
    }
    fn assert_base_untouched(&self) {
        assert_files_equal(&self.base, &self.pristine);
    }
    /// SRV stops cleanly, the stack serves again, and the restarted
    /// export passes CHECK; the base was never written.
    fn after_restart(&self, srv: Server, check: impl FnOnce(&Server)) {
        assert!(srv.stop().success());
        let srv = self.start(&[]);
        check(&srv);
        drop(srv);
        self.assert_base_untouched();
    }
    /// [`Stack::after_restart`]: the restarted export holds WANT.
    fn same_after_restart(&self, srv: Server, want: &[u8], what: &str) {
        self.after_restart(srv, |srv| {
            assert_bytes_equal(&self.export_bytes(srv), want, what)
        });
    }
}

/// A libnbd client (NAME) of SRV that has run WRITES (Python, on the
/// handle `h`) and stays connected until released.
fn connected_after(srv: &Server, writes: &str, name: &str) -> Talker {
    let script = format!(
        "import sys, nbd\nh = nbd.NBD()\nh.connect_uri(sys.argv[1])\n{writes}\n\
         print(\"written\", flush=True)\nsys.stdin.readline()\n"
    );
    let mut t = Talker::spawn(python_nbd(&script, &[&srv.uri()]), Stdio::null(), name);
    assert_eq!(t.line(), "written", "{name}");
    t
}

/// Proof 2: pattern writes at unaligned offsets, zeroing (with and without
/// unmap, partial and whole clusters, at the end of the device), FUA and
/// aio writes — through the cow export and with qemu-io directly on a copy
/// of the base: identical, and still identical after the server restarts
/// on the same overlay (also read-only).
#[test]
fn cow_writes_match_raw_reference_and_persist() {
    let size = 64 * MIB;
    let st = stack(size, 3);
    let reference = st.path("reference.raw");
    std::fs::copy(&st.base, &reference).expect("copy");
    let cmds: Vec<String> = [
        "write -P 0x11 0 1".to_string(),
        "write -P 0x22 65535 2".into(),
        "write -P 0x33 100000 300000".into(),
        "write -z 1000 200000".into(),
        "write -P 0x44 150000 100".into(),
        "write -z 1048576 1048576".into(),
        "write -P 0x55 1052672 4096".into(),
        "write -z -u 3000000 500000".into(),
        "write -z 33554432 8388608".into(),
        "write -P 0x5a 35000000 3".into(),
        format!("write -P 0x66 {} 777", size - 777),
        format!("write -P 0x77 {} 131072", size - 196_603),
        format!("write -z {} 100", size - 100),
        "write -P 0x88 10485760 4194304".into(),
        "write -P 0x99 20000000 70000".into(),
        "write -z 20000000 70000".into(),
        "write -f -P 0xaa 30000000 12345".into(),
        "aio_write -P 0xbb 40000000 10000".into(),
        "aio_write -P 0xcc 40100000 200000".into(),
        "aio_write -P 0xdd 45000001 65536".into(),
        "aio_flush".into(),
        "write -P 0xee 50003 7".into(),
        "write -z 65536 65536".into(),
        "write -P 0xef 65536 1".into(),
        "flush".into(),
    ]
    .into();
    let srv = st.start(&[]);
    qemu_io(&srv.uri(), &cmds);
    qemu_io(path_str(&reference), &cmds);

    let check = |srv: &Server, when: &str| {
        qemu_img_compare(path_str(&reference), &srv.uri());
        assert_bytes_equal(
            &st.export_bytes(srv),
            &std::fs::read(&reference).expect("read reference"),
            when,
        );
    };
    check(&srv, "export after writes");
    st.assert_base_untouched();

    let status = srv.stop();
    assert!(status.success(), "exit status {status}");
    assert!(st.path("overlay.img.cowmap").exists(), "no cow map written");
    let srv = st.start(&[]);
    check(&srv, "export after restart");
    drop(srv);

    let srv = st.start(&["--read-only"]);
    check(&srv, "read-only export after restart");
    let out = qemu_io_command(&srv.uri(), &["write -P 1 0 512".into()])
        .output()
        .expect("qemu-io");
    assert!(
        !out.status.success(),
        "write to a read-only cow export worked"
    );
    drop(srv);
    st.assert_base_untouched();
}

/// One NBD base:allocation run: (offset, length, type), merged.
fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, u32)> {
    let mut out: Vec<(u64, u64, u32)> = Vec::new();
    for l in run_stdout("nbdinfo", &["--map", uri]).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert!(f.len() >= 3, "unexpected nbdinfo --map line: {l:?}");
        let (off, len, ty): (u64, u64, u32) = (
            f[0].parse().expect("offset"),
            f[1].parse().expect("length"),
            f[2].parse().expect("type"),
        );
        match out.last_mut() {
            Some(last) if last.2 == ty && last.0 + last.1 == off => last.1 += len,
            _ => out.push((off, len, ty)),
        }
    }
    out
}

/// Every range the map calls zero (type bit 2) reads as zeroes.
fn assert_zero_claims_hold(map: &[(u64, u64, u32)], bytes: &[u8]) {
    for &(off, len, ty) in map {
        if ty & 2 != 0 {
            let r = &bytes[off as usize..(off + len) as usize];
            if let Some(i) = r.iter().position(|&b| b != 0) {
                panic!(
                    "map says {off}+{len} reads as zero, but byte {} is {:#04x}",
                    off + i as u64,
                    r[i]
                );
            }
        }
    }
}

/// Discard never breaks anything: outside the discarded ranges every byte
/// is what was written; inside, each byte is what was there or zero; whole
/// discarded clusters become holes that read as zero; data written into
/// them afterwards reads back, and all of it survives a restart.
#[test]
fn cow_discard_keeps_everything_else() {
    let size = 16 * MIB;
    let st = stack(size, 5);
    let srv = st.start(&[]);
    let uri = srv.uri();
    qemu_io(&uri, &["write -P 0x11 0 4194304".into()]);
    let mut want = std::fs::read(&st.base).expect("read base");
    want[..4 * MIB as usize].fill(0x11);
    let discards = [
        (CLUSTER, 16 * CLUSTER),
        (2_000_000, 300_000),
        (8 * MIB + 1, 3 * CLUSTER),
    ];
    qemu_io(
        &uri,
        &discards
            .iter()
            .map(|(o, l)| format!("discard {o} {l}"))
            .collect::<Vec<_>>(),
    );
    let got = st.export_bytes(&srv);
    let discarded = |i: u64| discards.iter().any(|&(o, l)| o <= i && i < o + l);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let i = i as u64;
        if discarded(i) {
            assert!(
                g == w || g == 0,
                "discarded byte {i} is {g:#04x}: neither old nor zero"
            );
        } else {
            assert_eq!(g, w, "byte {i} outside the discarded ranges changed");
        }
    }
    // Whole discarded clusters are holes, and holes read as zero.
    let map = nbdinfo_map(&uri);
    for (o, l) in [(CLUSTER, 16 * CLUSTER), (8 * MIB + CLUSTER, 2 * CLUSTER)] {
        assert!(
            map.iter()
                .any(|&(mo, ml, t)| mo <= o && o + l <= mo + ml && t == 3),
            "discarded clusters {o}+{l} are not a hole in {map:?}"
        );
    }
    assert_zero_claims_hold(&map, &got);
    // Write into a discarded cluster, partially.
    qemu_io(
        &uri,
        &[
            "write -P 0x22 70000 1000".into(),
            "read -P 0x22 70000 1000".into(),
            "read -P 0 65536 4464".into(),
        ],
    );
    let mut after = got.clone();
    after[70000..71000].fill(0x22);
    after[65536..70000].fill(0);
    after[71000..131072].fill(0);
    assert_bytes_equal(
        &st.export_bytes(&srv),
        &after,
        "after writing into a discarded cluster",
    );
    st.same_after_restart(srv, &after, "after restart");
}

/// `nbdinfo --map` through a cow stack: clusters written are data, zeroed
/// ones holes, untouched ones whatever the base file has there; the same
/// after a restart; and the bytes match the same writes on a raw copy.
#[test]
fn cow_block_status_merges_overlay_and_base() {
    let dir = tempdir();
    let size = 8 * MIB;
    let base = dir.path().join("base.raw");
    let islands = [(0, CLUSTER), (MIB, 4 * CLUSTER), (4 * MIB, CLUSTER)];
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&base).expect("create");
        f.set_len(size).expect("set_len");
        for &(off, len) in &islands {
            f.write_all_at(&vec![0xa5; len as usize], off)
                .expect("write");
        }
        f.sync_all().expect("sync");
    }
    let reference = dir.path().join("reference.raw");
    std::fs::copy(&base, &reference).expect("copy");
    let spec = spec_cow_raw(dir.path(), &base);
    let cmds: Vec<String> = [
        format!("write -P 0x11 {} 10", 2 * MIB + 100),
        format!("write -z {} {}", MIB, CLUSTER),
        format!("write -P 0x22 {} 10", 4 * MIB + CLUSTER - 5),
        format!("write -z -u {} {}", 6 * MIB, 2 * CLUSTER),
        format!("write -z 0 {CLUSTER}"),
    ]
    .into();
    // The model: per cluster, data (true) or hole.
    let n = (size / CLUSTER) as usize;
    let mut data = vec![false; n];
    for &(off, len) in &islands {
        data[(off / CLUSTER) as usize..((off + len) / CLUSTER) as usize].fill(true);
    }
    data[(2 * MIB / CLUSTER) as usize] = true;
    data[(MIB / CLUSTER) as usize] = false;
    data[(4 * MIB / CLUSTER) as usize] = true;
    data[(4 * MIB / CLUSTER) as usize + 1] = true;
    data[0] = false;
    let mut want: Vec<(u64, u64, u32)> = Vec::new();
    for (c, &d) in data.iter().enumerate() {
        let ty = if d { 0 } else { 3 };
        match want.last_mut() {
            Some(last) if last.2 == ty => last.1 += CLUSTER,
            _ => want.push((c as u64 * CLUSTER, CLUSTER, ty)),
        }
    }

    let srv = Server::start(dir.path(), &[&spec]);
    qemu_io(&srv.uri(), &cmds);
    qemu_io(path_str(&reference), &cmds);
    assert_eq!(nbdinfo_map(&srv.uri()), want, "map through the cow stack");
    qemu_img_compare(path_str(&reference), &srv.uri());
    assert!(srv.stop().success());
    let srv = Server::start(dir.path(), &[&spec]);
    assert_eq!(nbdinfo_map(&srv.uri()), want, "map after restart");
    qemu_img_compare(path_str(&reference), &srv.uri());
}

/// A crash of the server (SIGKILL) keeps every write a flush covered; a
/// write not yet flushed is, cluster by cluster, either there or not; the
/// overlay reopens and takes further writes that persist.
#[test]
fn cow_flushed_writes_survive_server_kill9() {
    let size = 16 * MIB;
    let st = stack(size, 7);
    let srv = st.start(&[]);
    // Flushed: qemu-io flushes before it disconnects, and the server
    // flushes at disconnect too.
    qemu_io(&srv.uri(), &["write -P 0x11 100 300000".into()]);
    // Flushed by the client, then more written and left unflushed, with the
    // client still connected when the server dies.
    let client = connected_after(
        &srv,
        r#"
h.pwrite(b"\x22" * 200000, 1000000)
h.flush()
h.pwrite(b"\x33" * 500000, 4000000)
"#,
        "python client",
    );
    srv.kill9();
    client.release();

    let srv = st.start(&[]);
    let got = st.export_bytes(&srv);
    let old = std::fs::read(&st.pristine).expect("read pristine");
    let mut want = old.clone();
    want[100..300_100].fill(0x11);
    want[1_000_000..1_200_000].fill(0x22);
    // The unflushed write: each cluster it touches is all old or all new.
    let (uo, ul) = (4_000_000u64, 500_000u64);
    let mut new = want.clone();
    new[uo as usize..(uo + ul) as usize].fill(0x33);
    for c in uo / CLUSTER..(uo + ul).div_ceil(CLUSTER) {
        let r = (c * CLUSTER) as usize..((c + 1) * CLUSTER) as usize;
        assert!(
            got[r.clone()] == want[r.clone()] || got[r.clone()] == new[r.clone()],
            "cluster {c} of the unflushed write is torn"
        );
        want[r.clone()].copy_from_slice(&got[r]);
    }
    assert_bytes_equal(&got, &want, "after SIGKILL and restart");
    // The reopened overlay takes writes that persist.
    qemu_io(&srv.uri(), &["write -P 0x44 4000000 70000".into()]);
    want[4_000_000..4_070_000].fill(0x44);
    st.same_after_restart(srv, &want, "after a second restart");
}

/// A device whose size is not a multiple of the cluster (nor of 512):
/// the size is exact, the partial last cluster is written and zeroed to the
/// last byte, I/O past the end is refused by the server, and nbdcopy reads
/// the exact bytes, before and after a restart.
#[test]
fn cow_unaligned_size_to_the_last_byte() {
    let size = 5_001_234u64;
    let st = stack(size, 9);
    let srv = st.start(&[]);
    let edits = run_python_nbd(
        r#"
import sys, nbd
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(sys.argv[1])
size = h.get_size()
print("size", size)
h.pwrite(b"\x5a" * 1000, size - 1000)
h.pwrite(b"\x6b" * 5000, size - 70000)
h.zero(300, size - 300)
h.pwrite(b"\x7c" * 10, size - 10)
for name, f in (("write", lambda: h.pwrite(b"x" * 2, size - 1)),
                ("read", lambda: h.pread(2, size - 1)),
                ("zero", lambda: h.zero(512, size))):
    try:
        f()
        print(name, "accepted")
    except nbd.Error as e:
        print(name, e.errno)
h.flush()
h.shutdown()
"#,
        &[&srv.uri()],
    );
    assert_eq!(
        edits.lines().collect::<Vec<_>>(),
        [
            format!("size {size}").as_str(),
            "write ENOSPC",
            "read EINVAL",
            "zero ENOSPC"
        ],
    );
    let mut want = std::fs::read(&st.base).expect("read base");
    let s = size as usize;
    want[s - 1000..].fill(0x5a);
    want[s - 70000..s - 65000].fill(0x6b);
    want[s - 300..].fill(0);
    want[s - 10..].fill(0x7c);
    let copy = |srv: &Server, what: &str| {
        let out = st.path("copy.raw");
        let _ = std::fs::remove_file(&out);
        run("nbdcopy", &[&srv.uri(), path_str(&out)]);
        assert_bytes_equal(&std::fs::read(&out).expect("read copy"), &want, what);
    };
    copy(&srv, "nbdcopy of the export");
    st.after_restart(srv, |srv| copy(srv, "nbdcopy after restart"));
}

/// Proof 6 on a cow stack: `qemu-img convert -n` into the export (data,
/// and zeroes over the base's data), compared before and after a restart.
#[test]
fn qemu_img_convert_into_cow_export() {
    let size = 32 * MIB;
    let st = stack(size, 13);
    let src = st.path("src.raw");
    {
        use std::os::unix::fs::FileExt;
        random_file(&src, 8 * MIB, 17);
        let f = std::fs::File::options()
            .write(true)
            .open(&src)
            .expect("open src");
        f.set_len(size).expect("set_len");
        f.write_all_at(&[0x3c; 100_000], 20 * MIB + 12_345)
            .expect("write");
    }
    let srv = st.start(&[]);
    qemu_img_copy_into_parallel(path_str(&src), &srv.uri());
    let want = std::fs::read(&src).expect("read src");
    assert_bytes_equal(&st.export_bytes(&srv), &want, "export after convert");
    st.same_after_restart(srv, &want, "after restart");
}

/// Two servers must not have the same overlay open for writing: each keeps
/// its own cluster map and rewrites OVERLAY.cowmap, so one server's
/// acknowledged, flushed writes vanish. qemu refuses a second writer
/// (image locking); roamdisk should too.
#[test]
fn cow_overlay_is_not_served_twice_at_once() {
    let size = 8 * MIB;
    let st = stack(size, 19);
    let first = Server::start_named(st.dir.path(), "first.sock", &[&st.spec]);
    let second_sock = st.path("second.sock");
    let mut second = std::process::Command::new(bin())
        .args(["serve", &st.spec, "--socket", path_str(&second_sock)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn second server");
    let t0 = std::time::Instant::now();
    let refused = loop {
        if let Some(status) = second.try_wait().expect("try_wait") {
            break Some(status);
        }
        if std::os::unix::net::UnixStream::connect(&second_sock).is_ok()
            || t0.elapsed() > std::time::Duration::from_secs(10)
        {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    if let Some(status) = refused {
        assert!(!status.success(), "second server exited 0");
        return;
    }
    // Both serve it: show what that costs. A flushed write through the
    // first server, one through the second, both stop cleanly...
    qemu_io(
        &first.uri(),
        &["write -P 0x11 0 65536".into(), "flush".into()],
    );
    let second_uri = format!("nbd+unix:///?socket={}", second_sock.display());
    qemu_io(
        &second_uri,
        &["write -P 0x22 1048576 65536".into(), "flush".into()],
    );
    assert!(first.stop().success());
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status();
    let _ = second.wait();
    // ...and after a restart the first server's write is gone.
    let srv = st.start(&[]);
    let got = st.export_bytes(&srv);
    let first_kept = got[..65536].iter().all(|&b| b == 0x11);
    let second_kept = got[MIB as usize..MIB as usize + 65536]
        .iter()
        .all(|&b| b == 0x22);
    panic!(
        "a second server opened an overlay that another server is serving \
         read-write; after both stopped, the first server's flushed write is {} \
         and the second's is {}",
        if first_kept { "kept" } else { "LOST" },
        if second_kept { "kept" } else { "LOST" }
    );
}

/// The export advertises multi-conn, so a flush on one connection must make
/// durable every write already acknowledged on any connection: one client
/// writes without flushing and stays connected, another flushes, the server
/// is killed (SIGKILL), and after a restart both writes are there.
#[test]
fn cow_flush_on_one_connection_covers_writes_of_another() {
    let size = 16 * MIB;
    let st = stack(size, 23);
    let srv = st.start(&[]);
    let writer = connected_after(
        &srv,
        r#"
assert h.can_multi_conn()
h.pwrite(b"\x5a" * 300000, 123457)
h.pwrite(b"\x6b" * 65536, 9 * 1048576)
"#,
        "writer",
    );
    let flushed = run_python_nbd(
        r#"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
assert h.can_flush()
h.flush()
h.shutdown()
print("flushed")
"#,
        &[&srv.uri()],
    );
    assert_eq!(flushed.trim(), "flushed");
    srv.kill9();
    writer.release();
    let srv = st.start(&[]);
    let mut want = std::fs::read(&st.pristine).expect("read pristine");
    want[123_457..423_457].fill(0x5a);
    want[9 * MIB as usize..9 * MIB as usize + 65536].fill(0x6b);
    assert_bytes_equal(&st.export_bytes(&srv), &want, "after SIGKILL and restart");
}
