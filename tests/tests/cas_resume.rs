//! Suspend and resume (Machine Bank 3.3, ISR): `roamdisk suspend` commits
//! a session with its memory image and the working set the guest read,
//! and writes the resume set to a folder; `roamdisk resume` on another
//! host (another folder, another shared cache) fetches that set first —
//! from the folder, verified — and the session then reads it with the
//! network gone. A wrong or damaged folder costs only the fetch.

mod cas_common;
mod common;

use std::path::{Path, PathBuf};

use cas_common::{commit_version, json_num, open_session, Cas, ChunkServer};
use common::{path_str, qemu_img_compare, qemu_io, random_file, rd, run_python_nbd, Server};

const SIZE: u64 = 8 << 20;
const K64: u64 = 65536;
/// What the guest reads in the first session: 1 MiB at 0, 512 KiB at 5 MiB.
const READS: [(u64, u64); 2] = [(0, 1 << 20), (5 << 20, 512 << 10)];
const WS_CHUNKS: u64 = 16 + 8;
const MEMORY: u64 = 1 << 20;

struct Suspended {
    cas: Cas,
    /// The disk as the session left it.
    want: PathBuf,
    memory: PathBuf,
    media: PathBuf,
    server: ChunkServer,
}

/// Commit an 8 MiB random disk, run a session over HTTP that reads READS
/// and writes 64 KiB at 4 MiB, and suspend it with a memory image and
/// `--to-media`.
fn suspended() -> Suspended {
    let cas = Cas::new();
    let dir = cas.dir().to_path_buf();
    let src = cas.random_file("disk.raw", SIZE, 21);
    commit_version(cas.s(), path_str(&src), "u/vm", &[]);
    let server = ChunkServer::start(cas.s(), &[]);
    let s1 = dir.join("s1");
    open_session(&server.url, "u/vm", &s1, &[]);
    let srv = Server::start(
        &dir,
        &[&format!(
            "cas[shared-cache={}]:{}",
            dir.join("shared1").display(),
            s1.display()
        )],
    );
    let mut cmds: Vec<String> = READS.iter().map(|(o, l)| format!("read {o} {l}")).collect();
    cmds.push(format!("write -P 0x5a {} {K64}", 4 << 20));
    qemu_io(&srv.uri(), &cmds);
    srv.stop();
    let want = dir.join("want.raw");
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[(4 << 20)..(4 << 20) + K64 as usize].fill(0x5a);
    std::fs::write(&want, &bytes).unwrap();
    let memory = dir.join("vm.mem");
    random_file(&memory, MEMORY, 22);
    let media = dir.join("usb");
    let out = rd(&[
        "suspend",
        path_str(&s1),
        "--memory",
        path_str(&memory),
        "--to-media",
        path_str(&media),
        "--json",
    ]);
    assert_eq!(json_num(&out, "working_set_chunks"), WS_CHUNKS, "{out}");
    assert_eq!(json_num(&out, "memory_chunks"), MEMORY / K64, "{out}");
    // The one chunk the session wrote goes with the resume set.
    assert_eq!(json_num(&out, "written_chunks"), 1, "{out}");
    // The committed version holds the session's write.
    let co = dir.join("co.raw");
    cas_common::checkout(&server.url, "u/vm", &co, &[]);
    qemu_img_compare(path_str(&want), path_str(&co));
    Suspended {
        cas,
        want,
        memory,
        media,
        server,
    }
}

/// `roamdisk resume u/vm --store URL --session DIR/NAME --shared-cache
/// SHARED`.
fn resume_args(s: &Suspended, name: &str, shared: &str) -> Vec<String> {
    vec![
        "resume".to_string(),
        "u/vm".into(),
        "--store".into(),
        s.server.url.clone(),
        "--session".into(),
        s.cas.dir().join(name).display().to_string(),
        "--shared-cache".into(),
        shared.into(),
    ]
}

/// `roamdisk resume u/vm` into a new session (another host: its own
/// shared cache), with lookaside MEDIA; returns the JSON report.
fn resume(s: &Suspended, name: &str, media: &[&Path], shared: &str) -> String {
    let mem_out = s.cas.dir().join(format!("{name}.mem"));
    let mut args = resume_args(s, name, shared);
    args.extend([
        "--memory-out".into(),
        mem_out.display().to_string(),
        "--json".into(),
    ]);
    for m in media {
        args.push("--lookaside".into());
        args.push(m.display().to_string());
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = rd(&argv);
    assert_eq!(
        std::fs::read(&mem_out).unwrap(),
        std::fs::read(&s.memory).unwrap(),
        "the memory image comes back whole, whatever the medium"
    );
    out
}

/// Read READS (and, if `also`, that range) of the session through NBD and
/// compare with WANT: whether every read succeeded and matched.
fn reads_match(dir: &Path, spec: &str, want: &Path, also: Option<(u64, u64)>) -> bool {
    let srv = Server::start(dir, &[spec]);
    let ranges: Vec<String> = READS
        .iter()
        .chain(also.iter())
        .map(|(o, l)| format!("({o},{l})"))
        .collect();
    let script = format!(
        "import nbd, sys\nh = nbd.NBD()\nh.connect_uri(sys.argv[1])\nwant = open(sys.argv[2], 'rb').read()\n\
         ok = True\nfor o, l in [{}]:\n    try:\n        ok = ok and h.pread(l, o) == want[o:o + l]\n    except nbd.Error:\n        ok = False\n\
         print('match' if ok else 'differ')\n",
        ranges.join(",")
    );
    let out = run_python_nbd(&script, &[&srv.uri(), path_str(want)]);
    srv.stop();
    out.trim() == "match"
}

#[test]
fn resume_elsewhere_takes_the_resume_set_from_the_medium_and_runs_without_the_network() {
    let s = suspended();
    let dir = s.cas.dir().to_path_buf();
    let shared2 = dir.join("shared2");
    let out = resume(&s, "s2", &[&s.media], path_str(&shared2));
    // Everything of the resume set came from the medium: nothing fetched.
    assert_eq!(json_num(&out, "chunks"), MEMORY / K64, "{out}");
    assert_eq!(json_num(&out, "store_bytes"), 0, "{out}");
    assert_eq!(json_num(&out, "lookaside_bytes"), MEMORY, "{out}");
    let ws = &out[out.find("\"working_set\"").unwrap()..];
    assert_eq!(json_num(ws, "bytes"), WS_CHUNKS * K64, "{out}");
    assert_eq!(json_num(ws, "lookaside_bytes"), WS_CHUNKS * K64, "{out}");
    assert_eq!(json_num(ws, "store_bytes"), 0, "{out}");
    assert_eq!(json_num(&out, "hoard_cached"), WS_CHUNKS, "{out}");
    // The network goes away: the working set reads right from this host...
    let Suspended { server, .. } = s;
    drop(server);
    let spec = format!(
        "cas[shared-cache={}]:{}",
        shared2.display(),
        dir.join("s2").display()
    );
    let want = dir.join("want.raw");
    assert!(reads_match(&dir, &spec, &want, None));
    // ...and a chunk outside it needs the store, which is gone.
    assert!(!reads_match(&dir, &spec, &want, Some((6 << 20, K64))));
}

#[test]
fn a_resume_with_no_shared_cache_keeps_the_working_set_in_the_session() {
    let s = suspended();
    let dir = s.cas.dir().to_path_buf();
    let out = resume(&s, "s2", &[&s.media], "off");
    assert_eq!(json_num(&out, "store_bytes"), 0, "{out}");
    let Suspended { server, want, .. } = s;
    drop(server);
    let spec = format!("cas[shared-cache=off]:{}", dir.join("s2").display());
    assert!(
        reads_match(&dir, &spec, &want, None),
        "from the private cache"
    );
}

#[test]
fn a_wrong_or_damaged_medium_costs_the_fetch_and_nothing_else() {
    let s = suspended();
    let dir = s.cas.dir().to_path_buf();
    // Damaged: every object in the folder has a byte flipped.
    let damaged = dir.join("damaged");
    common::run("cp", &["-a", path_str(&s.media), path_str(&damaged)]);
    for f in cas_common::object_files(&damaged) {
        let mut b = std::fs::read(&f).unwrap();
        let n = b.len();
        b[n - 1] ^= 0x01;
        std::fs::write(&f, b).unwrap();
    }
    // Objects in pack files: a byte in every 4 KiB of the object area
    // (past the header, short of the index at the end).
    for f in cas_common::pack_files(&damaged) {
        let mut b = std::fs::read(&f).unwrap();
        let n = b.len();
        for at in (4096..n.saturating_sub(16384)).step_by(4096) {
            b[at] ^= 0x01;
        }
        std::fs::write(&f, b).unwrap();
    }
    // Wrong: the resume set of another image.
    let other = Cas::new();
    let src = other.random_file("other.raw", SIZE, 23);
    commit_version(other.s(), path_str(&src), "u/other", &[]);
    let os = other.dir().join("s");
    open_session(other.s(), "u/other", &os, &[]);
    qemu_io_reads(other.dir(), &os);
    let wrong = dir.join("wrong");
    rd(&[
        "suspend",
        path_str(&os),
        "--memory",
        path_str(&src),
        "--to-media",
        path_str(&wrong),
    ]);
    for (i, medium) in [&damaged, &wrong].into_iter().enumerate() {
        let shared = dir.join(format!("shared-{i}"));
        let out = resume(&s, &format!("r{i}"), &[medium], path_str(&shared));
        assert_eq!(
            json_num(&out, "lookaside_bytes"),
            0,
            "{}: {out}",
            medium.display()
        );
        assert_eq!(json_num(&out, "store_bytes"), MEMORY, "{out}");
        let ws = &out[out.find("\"working_set\"").unwrap()..];
        assert_eq!(json_num(ws, "store_bytes"), WS_CHUNKS * K64, "{out}");
        // The damaged medium's chunks are found, fail verification, and
        // are counted; the wrong medium simply has none of them.
        let rejected = if i == 0 { MEMORY / K64 + WS_CHUNKS } else { 0 };
        assert_eq!(json_num(&out, "lookaside_rejected"), rejected, "{out}");
        let spec = format!(
            "cas[shared-cache={}]:{}",
            shared.display(),
            dir.join(format!("r{i}")).display()
        );
        assert!(reads_match(&dir, &spec, &s.want, Some((4 << 20, K64))));
    }
}

/// Read READS of the session SESS so its working set has them.
fn qemu_io_reads(dir: &Path, sess: &Path) {
    let cmds: Vec<String> = READS.iter().map(|(o, l)| format!("read {o} {l}")).collect();
    cas_common::qemu_io_session(dir, sess, &cmds);
}

/// Media are only a cache (issue 24): a resume set whose `store.toml` is
/// damaged, a key's mount point given instead of the resume set in it, an
/// empty folder, a medium unplugged between `resume` and serving, and one
/// unplugged while the session is served: every resume succeeds, every
/// read is right, and each costs at most the fetch.
#[test]
fn media_given_oddly_damaged_or_unplugged_cost_the_fetch_only() {
    let s = suspended();
    let dir = s.cas.dir().to_path_buf();
    let copy = |to: &Path| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        common::run("cp", &["-a", path_str(&s.media), path_str(to)]);
    };
    let from_store = |out: &str| {
        assert_eq!(json_num(out, "lookaside_bytes"), 0, "{out}");
        assert_eq!(json_num(out, "store_bytes"), MEMORY, "{out}");
    };
    let from_media = |out: &str| {
        assert_eq!(json_num(out, "lookaside_bytes"), MEMORY, "{out}");
        assert_eq!(json_num(out, "store_bytes"), 0, "{out}");
    };
    let spec = |name: &str| {
        format!(
            "cas[shared-cache={}]:{}",
            dir.join(format!("shared-{name}")).display(),
            dir.join(name).display()
        )
    };
    let shared = |name: &str| dir.join(format!("shared-{name}")).display().to_string();

    // One damaged byte in the resume set's store.toml.
    let toml = dir.join("toml").join("rs");
    copy(&toml);
    let text = std::fs::read_to_string(toml.join("store.toml")).unwrap();
    let at = text.find("-chunk-store\"").expect("the magic") + 5;
    let mut b = text.into_bytes();
    b[at] ^= 0x20;
    std::fs::write(toml.join("store.toml"), b).unwrap();
    from_store(&resume(&s, "toml", &[&toml], &shared("toml")));
    assert!(reads_match(&dir, &spec("toml"), &s.want, None));

    // The key's mount point, the folder above the resume set.
    let key = dir.join("key");
    copy(&key.join("resume-set"));
    from_media(&resume(&s, "mount", &[&key], &shared("mount")));
    assert!(reads_match(&dir, &spec("mount"), &s.want, None));

    // An empty folder.
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    from_store(&resume(&s, "empty", &[&empty], &shared("empty")));
    assert!(reads_match(&dir, &spec("empty"), &s.want, None));

    // Unplugged after the resume, before the session is served (the
    // session keeps the medium in its session.toml).
    let gone = dir.join("gone").join("rs");
    copy(&gone);
    from_media(&resume(&s, "unplugged", &[&gone], &shared("unplugged")));
    std::fs::remove_dir_all(dir.join("gone")).unwrap();
    assert!(reads_match(
        &dir,
        &spec("unplugged"),
        &s.want,
        Some((4 << 20, K64))
    ));

    // Unplugged while the session is served: reads past the working set
    // then come from the store.
    let live = dir.join("live").join("rs");
    copy(&live);
    from_media(&resume(&s, "live", &[&live], &shared("live")));
    let srv = Server::start(&dir, &[&spec("live")]);
    qemu_io(&srv.uri(), &["read 0 64k".to_string()]);
    std::fs::remove_dir_all(dir.join("live")).unwrap();
    let out = dir.join("live.raw");
    common::run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &srv.uri(),
            path_str(&out),
        ],
    );
    srv.stop();
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&s.want).unwrap());
}

/// The resume set carries the session (issue 24): what the guest wrote on
/// host A is on the medium, so once `resume` has started on host B the
/// store may go away: the session reads its working set and its own
/// writes from the medium and the shared cache, every byte right.
#[test]
fn after_resume_the_medium_alone_carries_what_the_guest_wrote() {
    let mut s = suspended();
    let dir = s.cas.dir().to_path_buf();
    let shared = dir.join("shared-b");
    let out = resume(&s, "b", &[&s.media], path_str(&shared));
    assert_eq!(json_num(&out, "lookaside_bytes"), MEMORY, "{out}");
    s.server.stop();
    let spec = format!(
        "cas[shared-cache={}]:{}",
        shared.display(),
        dir.join("b").display()
    );
    assert!(
        reads_match(&dir, &spec, &s.want, Some((4 << 20, K64))),
        "with the store gone, the session could not read what it wrote on host A"
    );
}

/// `resume --exec` serves until its command ends and fails when it does;
/// `--qmp` needs the disk served, and a QEMU that never answers ends the
/// resume with an error that says how to start it.
#[test]
fn resume_exec_serves_until_the_command_ends_and_qmp_failures_are_clear() {
    let s = suspended();
    let dir = s.cas.dir();
    let shared = dir.join("shared-exec").display().to_string();
    let base = |name: &str| -> Vec<String> {
        let mut a = resume_args(&s, name, &shared);
        a.extend([
            "--socket".into(),
            dir.join(format!("{name}.sock")).display().to_string(),
        ]);
        a
    };
    let run = |mut args: Vec<String>, extra: &[&str]| {
        args.extend(extra.iter().map(|a| a.to_string()));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let t0 = std::time::Instant::now();
        let o = common::roamdisk(&argv);
        (o, t0.elapsed())
    };
    // The command reads what the first session wrote, then serving ends.
    let (o, _) = run(
        base("e1"),
        &[
            "--exec",
            "qemu-io -f raw -c 'read -P 0x5a 4194304 65536' \"$ROAMDISK_NBD_URI\"",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("read 65536/65536") && !out.contains("Pattern verification failed"),
        "{out}"
    );
    // A failing command fails the resume.
    let (o, _) = run(base("e2"), &["--exec", "exit 3"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--exec command failed"),
        "{err}"
    );
    // --qmp without serving says what is missing.
    let mut no_socket = base("e3");
    no_socket.truncate(no_socket.len() - 2);
    let (o, _) = run(no_socket, &["--qmp", "/nonexistent/q.sock"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--socket"), "{err}");
    // No QEMU behind the QMP socket: the resume ends, saying how to start one.
    let q = dir.join("none.qmp");
    let (o, took) = run(base("e4"), &["--qmp", path_str(&q), "--qmp-wait", "1s"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "an error, not a signal: {err}");
    assert!(
        err.contains("-qmp unix:") && err.contains("could not be resumed"),
        "{err}"
    );
    assert!(took < std::time::Duration::from_secs(30), "{took:?}");
}
