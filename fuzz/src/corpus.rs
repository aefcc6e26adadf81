//! Seed inputs for the targets added with the cas, workload, fsmeta and
//! borrow parsers, made by the crates' own encoders (and, for the foreign
//! formats, by mke2fs, mkntfs, mkswap and sfdisk). They are not committed
//! (real images are big): the corpus step writes them where libFuzzer
//! reads them,
//!
//! ```sh
//! ROAMDISK_CORPUS_DIR=/tmp/roamdisk-corpus cargo test \
//!     --manifest-path fuzz/Cargo.toml corpus
//! ```
//!
//! and the test checks that every seed parses (so a stale fix-up or mode
//! byte shows up as a failing test, not as a shallow fuzzer).

use std::path::Path;

use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::testkit::run_tool;
use roamdisk_blockdev::{BlockDev, WriteFlags};
use roamdisk_borrow::plan::{Device, Histogram, Partition, PlanExtent, PlanOptions};
use roamdisk_borrow::{Plan, Status};
use roamdisk_chunkserver::users::Users;
use roamdisk_chunkstore::catalog::{Catalog, Entry};
use roamdisk_chunkstore::chunk::{ChunkCodec, Key};
use roamdisk_chunkstore::index::{Index, SectorState};
use roamdisk_chunkstore::store::config::StoreConfig;
use roamdisk_chunkstore::store::PutOutcome;
use roamdisk_chunkstore::store::{pack, wire, ObjectEntry};
use roamdisk_chunkstore::token::Token;
use roamdisk_chunkstore::version::{Memory, Version};
use roamdisk_chunkstore::{ChunkId, HashKind};
use roamdisk_roam::session::map;
use roamdisk_trace::format::binary::{Encoder, CHUNK_HEADER_LEN, HEADER_LEN};
use roamdisk_trace::format::csvfmt::CsvEncoder;
use roamdisk_trace::format::{Record, TraceOp};

use crate::disk::{segments_of, MIN_IMAGE};
use crate::fixup::FIXUP;

/// Named seeds of one target.
pub type Seeds = Vec<(String, Vec<u8>)>;

/// The plaintext whose convergent key is the `cas_chunk` target's fixed
/// key (compressible, so sealing it with zstd compresses).
pub const CHUNK_PLAINTEXT: &[u8] =
    b"roamdisk fuzz chunk. roamdisk fuzz chunk. roamdisk fuzz chunk. \
roamdisk fuzz chunk. roamdisk fuzz chunk. roamdisk fuzz chunk. roamdisk fuzz chunk. roamdisk \
fuzz chunk. 0123456789 0123456789 0123456789 0123456789 0123456789 0123456789 0123456789 \
0123456789 0123456789 0123456789 end.";

/// The `cas_version` target's user key.
pub const VERSION_USER_KEY: Key = [0x42; 32];

/// The fixed key of the `cas_chunk` target for a hash function.
pub fn chunk_key(hash: HashKind) -> Key {
    ChunkCodec {
        hash,
        zstd_level: None,
    }
    .convergent_key(CHUNK_PLAINTEXT)
}

/// The name of an encrypted chunk (`docs/formats/cas-chunk.md`: the hash
/// of a domain string and the ciphertext). The corpus test checks it
/// against `ChunkCodec::seal`.
pub fn encrypted_chunk_id(hash: HashKind, payload: &[u8]) -> ChunkId {
    hash.hash_parts(&[b"roamdisk-cas encrypted chunk v1\0", payload])
}

fn with_mode(mode: u8, b: &[u8]) -> Vec<u8> {
    [&[mode][..], b].concat()
}

fn both(name: &str, b: &[u8]) -> Seeds {
    vec![
        (format!("{name}-raw"), with_mode(0, b)),
        (format!("{name}-fixup"), with_mode(FIXUP, b)),
    ]
}

pub fn cas_catalog() -> Seeds {
    let entry = |n: u8, tags: Vec<String>| Entry {
        version: ChunkId([n; 32]),
        parent: (n > 1).then_some(ChunkId([n - 1; 32])),
        created: 1_763_700_000_000_000_000 + n as i64 * 86_400_000_000_000,
        disk_size: 1 << 30,
        encrypted: n % 2 == 0,
        new_objects: 10,
        reused_objects: 20,
        uploaded_bytes: 30,
        data_bytes: 40,
        description: format!("version {n}: after installing things"),
        tags,
    };
    let c = Catalog {
        generation: 3,
        segments: Vec::new(),
        entries: vec![
            entry(1, vec![]),
            entry(2, vec!["stable".into(), "v1.0".into()]),
            entry(3, vec!["latest-good".into()]),
        ],
    };
    let mut s = both("three", &c.encode());
    s.extend(both("empty", &Catalog::default().encode()));
    // Version 2: the oldest entry sealed into a segment object.
    let mut seg = c.clone();
    let sealed: Vec<Entry> = seg.entries.drain(..1).collect();
    seg.add_segment(ChunkId::from_hex(&"5e".repeat(32)).expect("hex"), &sealed);
    s.extend(both("segmented", &seg.encode()));
    s
}

pub fn cas_chunk() -> Seeds {
    let mut s = Seeds::new();
    for (hname, hash, hbit) in [
        ("blake3", HashKind::Blake3, 0u8),
        ("sha256", HashKind::Sha256, 2),
    ] {
        for (cname, level) in [("plain", None), ("zstd", Some(3))] {
            let codec = ChunkCodec {
                hash,
                zstd_level: level,
            };
            for (ename, enc) in [("clear", false), ("encrypted", true)] {
                let sealed = codec.seal(CHUNK_PLAINTEXT, enc);
                let name = format!("{hname}-{cname}-{ename}");
                s.push((format!("{name}-named"), with_mode(4 | hbit, &sealed.object)));
                s.push((
                    format!("{name}-named-fixup"),
                    with_mode(4 | hbit | FIXUP, &sealed.object),
                ));
                s.push((format!("{name}-fixed-id"), with_mode(hbit, &sealed.object)));
            }
        }
    }
    s
}

/// A small index: 4 KiB chunks, a short last chunk, data, zero and (for
/// a session) CLEAN/DIRTY sectors.
pub fn sample_index(encrypted: bool, session: bool) -> Index {
    let mut idx = Index::new_zero(HashKind::Blake3, 4096, 5 * 4096 + 1024, encrypted).unwrap();
    let mut data = vec![0u8; 4096];
    data[512 * 3] = 1;
    idx.set_record(1, HashKind::Blake3.hash(&data), Some([3; 32]), &data);
    let short = vec![9u8; 1024];
    idx.set_record(5, HashKind::Blake3.hash(&short), Some([4; 32]), &short);
    if session {
        idx.set_state(2, 1, SectorState::Dirty);
        idx.set_state(2, 2, SectorState::Clean);
    }
    idx
}

pub fn cas_index() -> Seeds {
    let mut s = Seeds::new();
    for enc in [false, true] {
        for (lname, level) in [("raw", None), ("zstd", Some(3))] {
            let name = format!("{}-{lname}", if enc { "keys" } else { "plain" });
            s.extend(both(&name, &sample_index(enc, false).encode(level)));
        }
    }
    s.extend(both(
        "session-states",
        &sample_index(false, true).encode(None),
    ));
    s
}

pub fn sample_version(encrypted: bool) -> Version {
    Version {
        created: 1_763_700_000_000_000_000,
        parent: Some(ChunkId([1; 32])),
        description: "after work".into(),
        config: b"memory = 2G\ncpus = 2\n".to_vec(),
        memory: Memory {
            size: 4096 + 100,
            ids: vec![ChunkId([7; 32]), ChunkId([8; 32])],
            keys: if encrypted {
                vec![[1; 32], [2; 32]]
            } else {
                vec![]
            },
        },
        index: sample_index(encrypted, false),
        working_set: Vec::new(),
        pages: None,
    }
}

pub fn cas_version() -> Seeds {
    let mut s = Seeds::new();
    let plain = sample_version(false);
    s.extend(both("plain", &plain.encode(None).unwrap()));
    let mut with_set = sample_version(false);
    with_set.working_set = (0..with_set.index.records() as u32).rev().collect();
    s.extend(both("working-set", &with_set.encode(None).unwrap()));
    s.extend(both(
        "plain-raw-index",
        &plain
            .encode_with_index(&plain.index.encode(None), None)
            .unwrap(),
    ));
    s.extend(both(
        "encrypted",
        &sample_version(true)
            .encode(Some(&VERSION_USER_KEY))
            .unwrap(),
    ));
    s
}

pub fn cas_session_map() -> Seeds {
    let h = map::Header {
        disk_size: 1 << 20,
        base: ChunkId([1; 32]),
    };
    use roamdisk_blockdev::overlay::log::{KIND_COMMIT, KIND_SET};
    let (hb, f) = crate::overlay::map_file(
        &h,
        &[
            (KIND_SET, 3, 8, 0),
            (KIND_SET, 1, 16, 100),
            (KIND_COMMIT, 0, 0, 1),
            (KIND_SET, 2, 1, 2047),
            (KIND_COMMIT, 0, 0, 2),
            (KIND_SET, 3, 4, 7),
        ],
    );
    let mut s = both("two-commits-torn", &f);
    s.extend(both("header-only", &hb));
    s
}

pub fn cas_wire() -> Seeds {
    let ids = [ChunkId([1; 32]), ChunkId([2; 32]), ChunkId([3; 32])];
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(1_763_700_000_123_456_789);
    let mut list = wire::encode_list_header();
    for (i, id) in ids.iter().enumerate() {
        wire::encode_list_entry(
            &mut list,
            &ObjectEntry {
                id: *id,
                mtime: now,
                size: 1000 * i as u64,
            },
        );
    }
    let mut answer = vec![1u8];
    answer.extend(wire::encode_have_answer(&[true, false, true]));
    vec![
        (
            "have-request".into(),
            with_mode(0, &wire::encode_have_request(&ids)),
        ),
        (
            "have-request-fix".into(),
            with_mode(12, &wire::encode_have_request(&ids)),
        ),
        ("have-answer".into(), with_mode(1, &answer)),
        ("have-answer-fix".into(), with_mode(4, &answer)),
        ("list".into(), with_mode(2, &list)),
    ]
}

/// A pack of sealed chunks, as a local store writes one: header, objects
/// back to back, index and trailer (`docs/formats/cas-pack.md`).
pub fn cas_wire_get() -> Seeds {
    let ids = [ChunkId([1; 32]), ChunkId([2; 32]), ChunkId([3; 32])];
    let request = wire::encode_get_request(&ids);
    let got = [
        wire::Got::Found(b"an object".to_vec()),
        wire::Got::Missing,
        wire::Got::NotSent,
    ];
    let mut answer = vec![3u8];
    answer.extend(wire::encode_get_answer(&got));
    // The same entries for the framing of the fix-up mode: status, then a
    // length and the object for a found one.
    let mut framed = vec![0u8, wire::GOT_FOUND, 9];
    framed.extend(b"an object");
    framed.extend([wire::GOT_MISSING, wire::GOT_NOT_SENT]);
    vec![
        ("request".into(), with_mode(0, &request)),
        ("request-fix".into(), with_mode(FIXUP, &request)),
        ("answer".into(), with_mode(2, &answer)),
        ("answer-fix".into(), with_mode(2 | FIXUP, &framed)),
    ]
}

/// Batch puts: a request of two objects and its answer, and the same
/// request as entries for the fix-up mode's framing.
pub fn cas_wire_put() -> Seeds {
    let items: [(ChunkId, &[u8]); 2] = [(ChunkId([1; 32]), b"an object"), (ChunkId([2; 32]), b"")];
    let request = wire::encode_put_request(&items);
    let mut framed = vec![1u8, 9];
    framed.extend(b"an object");
    framed.extend([2u8, 0]);
    let mut answer = vec![2u8];
    answer.extend(wire::encode_put_answer(&[
        PutOutcome::Stored,
        PutOutcome::Existed,
    ]));
    vec![
        ("request".into(), with_mode(0, &request)),
        ("request-fix".into(), with_mode(FIXUP, &framed)),
        ("answer".into(), with_mode(2, &answer)),
        ("answer-fix".into(), with_mode(2 | FIXUP, &answer)),
    ]
}

fn pack_of(hash: HashKind, contents: &[&[u8]]) -> Vec<u8> {
    let codec = ChunkCodec {
        hash,
        zstd_level: Some(3),
    };
    let header = pack::header(hash);
    let mut b = header.to_vec();
    let mut entries = Vec::new();
    for c in contents {
        let s = codec.seal(c, false);
        entries.push(pack::Entry {
            id: s.id,
            offset: b.len() as u64,
            len: s.object.len() as u32,
        });
        b.extend_from_slice(&s.object);
    }
    let at = b.len() as u64;
    b.extend(pack::encode_tail(&header, &mut entries, at));
    b
}

/// Packs of three chunks (BLAKE3 and SHA-256: mode bit 1) and an empty one.
pub fn cas_pack() -> Seeds {
    let three: [&[u8]; 3] = [CHUNK_PLAINTEXT, b"a chunk of its own", &[7u8; 5000]];
    let mut s = both("three-blake3", &pack_of(HashKind::Blake3, &three));
    for (mode, name) in [(2, "three-sha256-raw"), (3, "three-sha256-fixup")] {
        s.push((
            name.into(),
            with_mode(mode, &pack_of(HashKind::Sha256, &three)),
        ));
    }
    s.extend(both("empty", &pack_of(HashKind::Blake3, &[])));
    s
}

pub fn cas_store_config() -> Seeds {
    let mut c = StoreConfig {
        hash: HashKind::Sha256,
        ..Default::default()
    };
    c.set_compression("zstd:7").unwrap();
    c.quota = Some(1 << 30);
    let none = StoreConfig {
        zstd_level: None,
        ..Default::default()
    };
    vec![
        (
            "default".into(),
            StoreConfig::default().to_toml().into_bytes(),
        ),
        ("sha256-zstd7-quota".into(), c.to_toml().into_bytes()),
        ("none".into(), none.to_toml().into_bytes()),
    ]
}

/// Seeds of `cas_s3_names`: a location, a catalog key, a lease body, and
/// two concurrent catalog updates to merge.
pub fn cas_s3_names() -> Seeds {
    let sel = |k: u8, b: &[u8]| [&[k][..], b].concat();
    let mut a = Catalog::default();
    let mut b = Catalog::default();
    for (c, v) in [(&mut a, 1u8), (&mut b, 2u8)] {
        c.generation = 3;
        c.entries.push(Entry {
            version: ChunkId([v; 32]),
            parent: None,
            created: v as i64,
            disk_size: 1 << 20,
            encrypted: false,
            new_objects: 1,
            reused_objects: 0,
            uploaded_bytes: 1,
            data_bytes: 1,
            description: format!("v{v}"),
            tags: vec!["stable".into()],
        });
    }
    let mut two = a.encode();
    two.push(0xff);
    two.extend(b.encode());
    vec![
        (
            "location".into(),
            sel(
                0,
                b"s3://vm-images/team-a?endpoint=http://127.0.0.1:3900&region=garage&gc-margin=60s",
            ),
        ),
        (
            "catalog-key".into(),
            sel(1, b"0000000000000003-9f86d081884c7d65"),
        ),
        (
            "lease".into(),
            sel(
                2,
                b"roamdisk-lease 1\nstarted 1700000000000000000\nended 0\npid 42\n",
            ),
        ),
        ("merge-two".into(), sel(3, &two)),
    ]
}

/// The token of user `name` that the `cas_store_users` target tries: a
/// fixed secret of zeroes, whose hash the seeds give some users.
pub fn users_token(name: &str) -> Token {
    Token::parse(&format!("{name}.{}", "0".repeat(64))).expect("a valid user name")
}

pub fn cas_store_users() -> Seeds {
    let mut u = Users::default();
    u.add("alice", users_token("alice").hash(), false).unwrap();
    u.add("root", users_token("root").hash(), true).unwrap();
    u.add("b.o-b_2", users_token("other").hash(), false)
        .unwrap();
    u.add("mallory", users_token("mallory").hash(), false)
        .unwrap();
    u.revoke("mallory").unwrap();
    u.share("root/*", "alice", false).unwrap();
    u.share("b.o-b_2/shared", "alice", true).unwrap();
    u.share("alice/vm", "b.o-b_2", false).unwrap();
    vec![
        ("empty".into(), Users::default().to_toml().into_bytes()),
        ("four-users".into(), u.to_toml().into_bytes()),
    ]
}

/// Records of every op, client and device changes, sequential and
/// random offsets, fragments.
pub fn sample_records() -> Vec<Record> {
    let mut v = Vec::new();
    let mut off = 1 << 20;
    for i in 0..12u64 {
        let op = TraceOp::ALL[(i % 5) as usize];
        let flush = op == TraceOp::Flush;
        v.push(Record {
            time_ns: 1000 * i * i,
            client: (i / 4) as u32,
            device: (i % 2) as u32,
            op,
            offset: if flush { 0 } else { off },
            len: if flush { 0 } else { 4096 * (1 + i as u32 % 3) },
            fragment: (i == 7) as u16,
        });
        off = if i % 3 == 0 {
            off + 4096
        } else {
            (i * 7919) << 12
        };
    }
    v
}

pub fn workload_trace() -> Seeds {
    let recs = sample_records();
    let mut e = Encoder::new(Vec::new()).unwrap();
    for r in &recs {
        e.write(r).unwrap();
    }
    let bin = e.finish().unwrap();
    let mut c = CsvEncoder::new(Vec::new()).unwrap();
    for r in &recs {
        c.write(r).unwrap();
    }
    let csv = c.finish().unwrap();
    // The framed form of the binary trace: [count][length][payload] per
    // chunk (one chunk here), without file header and end marker.
    let at = HEADER_LEN;
    let len = u32::from_le_bytes(bin[at..at + 4].try_into().unwrap()) as usize;
    let count = u32::from_le_bytes(bin[at + 4..at + 8].try_into().unwrap());
    assert!(
        len <= 255 && count <= 255,
        "sample trace chunk too big to frame"
    );
    let mut framed = vec![count as u8, len as u8];
    framed.extend_from_slice(&bin[at + CHUNK_HEADER_LEN..at + CHUNK_HEADER_LEN + len]);
    vec![
        ("binary".into(), with_mode(0, &bin)),
        ("binary-trickle".into(), with_mode(2, &bin)),
        ("csv".into(), with_mode(0, &csv)),
        ("framed".into(), with_mode(1, &framed)),
        ("framed-trickle".into(), with_mode(3, &framed)),
    ]
}

pub const BLKPARSE_SAMPLE: &str =
    "  8,16   0        1     0.000000000   100  Q   R 2048 + 8 [myproc]
  8,16   0        2     0.000001000   100  D   R 2048 + 8 [myproc]
  8,16   0        3     0.000002000   100  C   R 2048 + 8 [0]
  8,16   0        4     0.000003000   200  D  WS 100 + 16 [(null)]
  8,16   0        5     0.000004000   100  D  FW [myproc]
  8,16   0        6     0.000005000   100  D   D 500 + 128 [myproc]
  8,16   0        7     0.000006000   100  D  WF 900 + 8 [myproc]
  8,16   0        8     0.000007000   100  D  FN [myproc]
  8,16   1        9     0.000008000   300  Q  WFS 4096 + 8388608 [big]
  8,16   1       10     0.000009000   300  D  WFS 4096 + 8388608 [big]
CPU0 (bt):
 Reads Queued:           2,        4KiB\t Writes Queued:           4,       76KiB
";

pub fn workload_blkparse() -> Seeds {
    vec![
        ("dispatch".into(), with_mode(0, BLKPARSE_SAMPLE.as_bytes())),
        (
            "dispatch-single".into(),
            with_mode(1, BLKPARSE_SAMPLE.as_bytes()),
        ),
        ("queue".into(), with_mode(2, BLKPARSE_SAMPLE.as_bytes())),
    ]
}

pub const MSR_SAMPLE: &str = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime
128166372003061629,usr,0,Read,7014609920,24576,41286
128166372016853766,src1,2,Write,1541570560,4096,8242
# comment
128166372026382522,usr,1,write,2000,512,100
";

pub fn workload_msr() -> Seeds {
    vec![
        ("relative".into(), with_mode(0, MSR_SAMPLE.as_bytes())),
        ("absolute".into(), with_mode(1, MSR_SAMPLE.as_bytes())),
    ]
}

/// A real image made by `make(path)` on a zero file of `size` bytes.
fn image(dir: &Path, name: &str, size: u64, make: impl FnOnce(&str)) -> Vec<u8> {
    let p = dir.join(name);
    std::fs::write(&p, b"").unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(size)
        .unwrap();
    make(p.to_str().unwrap());
    std::fs::read(&p).unwrap()
}

fn size_code(size: u64) -> u8 {
    let code = (size / MIN_IMAGE).trailing_zeros() as u8;
    assert_eq!(MIN_IMAGE << code, size, "image size must be 64 KiB << n");
    code
}

fn mem(b: &[u8]) -> MemDev {
    let m = MemDev::new(b.len() as u64);
    m.write_at(b, 0, WriteFlags::default()).unwrap();
    m
}

/// What the parsers make of an image (for minimising seeds).
fn outcome(b: &[u8]) -> String {
    let d = mem(b);
    let t = roamdisk_fsmeta::read_table(&d).map(|t| format!("{:?}", t.partitions));
    let f = roamdisk_fsmeta::free_space(&d, 0, d.size())
        .map(|f| format!("{:?} {:?} {}", f.probe, f.extents, f.free_bytes));
    format!("{t:?} {f:?}")
}

/// Zero every 64 KiB stretch of `b` the parsers do not look at (same
/// table, probe and free extents without it): mkntfs fills `$LogFile`
/// and `$UpCase`, mke2fs writes directories; only metadata makes useful
/// seeds.
fn minimise(mut b: Vec<u8>) -> Vec<u8> {
    let want = outcome(&b);
    let step = 64 << 10;
    for at in (0..b.len()).step_by(step) {
        let end = (at + step).min(b.len());
        if b[at..end].iter().all(|&x| x == 0) {
            continue;
        }
        let keep = b[at..end].to_vec();
        b[at..end].fill(0);
        if outcome(&b) != want {
            // Needed somewhere: try sector by sector.
            b[at..end].copy_from_slice(&keep);
            for s in (at..end).step_by(4096) {
                let e = (s + 4096).min(end);
                let keep = b[s..e].to_vec();
                b[s..e].fill(0);
                if outcome(&b) != want {
                    b[s..e].copy_from_slice(&keep);
                }
            }
        }
    }
    b
}

/// Seeds of one volume image: as is, with the fix-up, shifted to 1 MiB.
fn volume(name: &str, img: &[u8]) -> Seeds {
    let seg = segments_of(size_code(img.len() as u64), img);
    vec![
        (name.to_string(), with_mode(0, &seg)),
        (format!("{name}-fixup"), with_mode(FIXUP, &seg)),
        (format!("{name}-shifted"), with_mode(2 | FIXUP, &seg)),
    ]
}

/// The real images (made once per process): name, bytes.
pub fn images() -> &'static Vec<(&'static str, Vec<u8>)> {
    static IMAGES: std::sync::OnceLock<Vec<(&'static str, Vec<u8>)>> = std::sync::OnceLock::new();
    IMAGES.get_or_init(|| {
        let dir = tempfile_dir();
        let d = dir.as_path();
        let mke2fs = |args: &'static [&'static str]| {
            move |p: &str| {
                let mut a = vec!["-q", "-F"];
                a.extend_from_slice(args);
                a.push(p);
                run_tool("mke2fs", &a, None);
            }
        };
        let v = vec![
            ("ext4", image(d, "ext4", 4 << 20, mke2fs(&["-t", "ext4", "-g", "1024", "-N", "64"]))),
            ("ext4-64bit-4k", image(d, "ext4b", 4 << 20, mke2fs(&["-t", "ext4", "-b", "4096", "-O", "64bit", "-N", "64"]))),
            ("ext3", image(d, "ext3", 2 << 20, mke2fs(&["-t", "ext3", "-b", "1024", "-N", "64"]))),
            ("ext2-metabg", image(d, "ext2", 2 << 20, mke2fs(&["-t", "ext2", "-b", "1024", "-g", "256", "-O", "meta_bg,^resize_inode", "-N", "64"]))),
            ("ext4-uninit-bg", image(d, "ext4u", 2 << 20, mke2fs(&["-t", "ext4", "-O", "^metadata_csum,uninit_bg", "-g", "1024", "-N", "64"]))),
            ("bigalloc", image(d, "big", 8 << 20, mke2fs(&["-t", "ext4", "-O", "bigalloc", "-C", "16384", "-N", "64"]))),
            ("ntfs", image(d, "ntfs", 4 << 20, |p| run_tool("mkntfs", &["-q", "-F", "-Q", p], None))),
            ("ntfs-4k", image(d, "ntfs4", 4 << 20, |p| run_tool("mkntfs", &["-q", "-F", "-Q", "-c", "4096", p], None))),
            ("swap", image(d, "swap", 1 << 20, |p| run_tool("mkswap", &[p], None))),
            ("gpt", image(d, "gpt", 4 << 20, |p| run_tool("sfdisk", &["-q", p], Some(b"label: gpt\nsize=1MiB\nsize=1MiB\n")))),
            ("gpt-4k", gpt_4k(8 << 20)),
            ("mbr", image(d, "mbr", 8 << 20, |p| run_tool("sfdisk", &["-q", p], Some(b"label: dos\nsize=1MiB\nsize=1MiB\nsize=1MiB\nsize=4MiB, type=5\nsize=1MiB\nsize=512KiB\n")))),
        ];
        let _ = std::fs::remove_dir_all(&dir);
        // Partition tables are kept whole (their backup GPT header is not
        // read while the primary one is good, but is worth mutating).
        v.into_iter()
            .map(|(n, b)| {
                let keep = matches!(n, "gpt" | "gpt-4k" | "mbr");
                (n, if keep { b } else { minimise(b) })
            })
            .collect()
    })
}

/// A GPT disk of 4096-byte sectors (the sfdisk here cannot make one):
/// protective MBR, header at LBA 1, 128 entries at LBA 2, two Linux
/// partitions, backup entries and header at the end.
fn gpt_4k(size: u64) -> Vec<u8> {
    const S: usize = 4096;
    let sectors = size / S as u64;
    let mut d = vec![0u8; size as usize];
    d[446 + 4] = 0xEE;
    d[446 + 8..446 + 12].copy_from_slice(&1u32.to_le_bytes());
    d[446 + 12..446 + 16].copy_from_slice(&((sectors - 1) as u32).to_le_bytes());
    d[510] = 0x55;
    d[511] = 0xAA;
    let mut entries = vec![0u8; 128 * 128];
    let linux = [
        0xAF, 0x3D, 0xC6, 0x0F, 0x83, 0x84, 0x72, 0x47, 0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D,
        0xE4,
    ];
    for (i, (first, last)) in [(256u64, 511u64), (512, 1023)].into_iter().enumerate() {
        let e = &mut entries[i * 128..(i + 1) * 128];
        e[..16].copy_from_slice(&linux);
        e[16..32].copy_from_slice(&[i as u8 + 1; 16]);
        e[32..40].copy_from_slice(&first.to_le_bytes());
        e[40..48].copy_from_slice(&last.to_le_bytes());
        e[56..58].copy_from_slice(b"p\0");
    }
    let ecrc = crc32fast::hash(&entries);
    let header = |my: u64, alt: u64, elba: u64| {
        let mut h = vec![0u8; 92];
        h[..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&my.to_le_bytes());
        h[32..40].copy_from_slice(&alt.to_le_bytes());
        h[40..48].copy_from_slice(&6u64.to_le_bytes());
        h[48..56].copy_from_slice(&(sectors - 6).to_le_bytes());
        h[56..72].copy_from_slice(&[0x77; 16]);
        h[72..80].copy_from_slice(&elba.to_le_bytes());
        h[80..84].copy_from_slice(&128u32.to_le_bytes());
        h[84..88].copy_from_slice(&128u32.to_le_bytes());
        h[88..92].copy_from_slice(&ecrc.to_le_bytes());
        let c = crc32fast::hash(&h);
        h[16..20].copy_from_slice(&c.to_le_bytes());
        h
    };
    let last = sectors - 1;
    d[S..S + 92].copy_from_slice(&header(1, last, 2));
    d[2 * S..2 * S + entries.len()].copy_from_slice(&entries);
    let back = (last - 4) as usize * S;
    d[back..back + entries.len()].copy_from_slice(&entries);
    d[last as usize * S..last as usize * S + 92].copy_from_slice(&header(last, 1, last - 4));
    d
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("roamdisk-fuzz-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn image_named(name: &str) -> &'static [u8] {
    &images().iter().find(|(n, _)| *n == name).unwrap().1
}

pub fn fsmeta_ext() -> Seeds {
    let mut s = Seeds::new();
    for n in [
        "ext4",
        "ext4-64bit-4k",
        "ext3",
        "ext2-metabg",
        "ext4-uninit-bg",
        "bigalloc",
    ] {
        s.extend(volume(n, image_named(n)));
    }
    s
}

pub fn fsmeta_ntfs() -> Seeds {
    let mut s = volume("ntfs", image_named("ntfs"));
    s.extend(volume("ntfs-4k", image_named("ntfs-4k")));
    s
}

pub fn fsmeta_swap() -> Seeds {
    let sw = image_named("swap").to_vec();
    let mut s = volume("swap", &sw);
    // Two bad pages.
    let mut bad = sw.clone();
    bad[1032..1036].copy_from_slice(&2u32.to_le_bytes());
    bad[1536..1540].copy_from_slice(&5u32.to_le_bytes());
    bad[1540..1544].copy_from_slice(&9u32.to_le_bytes());
    s.extend(volume("swap-bad-pages", &bad));
    // Written on a machine of the other byte order.
    let mut be = sw.clone();
    for o in [1024, 1028, 1032] {
        be[o..o + 4].reverse();
    }
    s.extend(volume("swap-swapped", &be));
    for sig in [
        &b"S1SUSPEND\0"[..],
        b"S2SUSPEND\0",
        b"ULSUSPEND\0",
        b"LINHIB0001",
    ] {
        let mut h = sw.clone();
        h[4086..4096].copy_from_slice(sig);
        let name = format!("hibernated-{}", String::from_utf8_lossy(&sig[..9]));
        s.extend(volume(&name, &h));
    }
    let mut tux = sw.clone();
    tux[..8].copy_from_slice(b"\xed\xc3\x02\xe9\x98\x56\xe5\x0c");
    s.extend(volume("tuxonice", &tux));
    s
}

pub fn fsmeta_part() -> Seeds {
    let mut s = Seeds::new();
    for n in ["gpt", "gpt-4k", "mbr"] {
        let img = image_named(n);
        let seg = segments_of(size_code(img.len() as u64), img);
        s.push((n.to_string(), with_mode(0, &seg)));
        s.push((format!("{n}-fixup"), with_mode(FIXUP, &seg)));
    }
    // A disk whose partition holds a file system.
    let mut disk = vec![0u8; 8 << 20];
    let e = image_named("ext3");
    disk[1 << 20..(1 << 20) + e.len()].copy_from_slice(e);
    let mut s0 = [0u8; 512];
    s0[446 + 4] = 0x83;
    s0[446 + 8..446 + 12].copy_from_slice(&2048u32.to_le_bytes());
    s0[446 + 12..446 + 16].copy_from_slice(&((e.len() / 512) as u32).to_le_bytes());
    s0[510] = 0x55;
    s0[511] = 0xAA;
    disk[..512].copy_from_slice(&s0);
    s.push((
        "mbr-ext3".into(),
        with_mode(0, &segments_of(size_code(disk.len() as u64), &disk)),
    ));
    s
}

pub fn borrow_plan() -> Seeds {
    let mut s = Seeds::new();
    // A real scan of an ext4 and an NTFS image.
    let ext = mem(image_named("ext4"));
    let ntfs = mem(image_named("ntfs"));
    let opts = roamdisk_borrow::ScanOptions {
        min_extent: 4096,
        ..Default::default()
    };
    let plan = roamdisk_borrow::scan::scan_devices(
        &[
            (Path::new("/dev/fuzz-ext4"), &ext as &dyn BlockDev),
            (Path::new("/dev/fuzz-ntfs"), &ntfs as &dyn BlockDev),
        ],
        &opts,
        &roamdisk_borrow::NoProgress,
    )
    .expect("scan of the real images");
    s.push(("scanned".into(), plan.to_json().into_bytes()));
    // A hand-made one with a skipped partition and histograms.
    let mut free = Histogram::default();
    let mut borrowed = Histogram::default();
    for l in [4096, 8192, 1 << 20, 3 << 20] {
        free.add(l);
    }
    borrowed.add(8192);
    let part = |number, start, len, status, reason: Option<&str>| Partition {
        device: 0,
        number,
        start,
        len,
        type_name: "Linux filesystem".into(),
        fs: "ext4".into(),
        uuid: Some("0fc63daf-8483-4772-8e79-3d69d8477de4".into()),
        label: Some("root".into()),
        identity_sha256: "00".repeat(32),
        status,
        reason: reason.map(str::to_string),
        detail: reason.map(|r| format!("because {r}")),
        free_bytes: 1 << 20,
        free_extents: 4,
        borrowed_bytes: 8192,
        borrowed_extents: 2,
    };
    let p = Plan {
        format: roamdisk_borrow::plan::FORMAT.into(),
        version: roamdisk_borrow::plan::VERSION,
        created_unix: 1_763_700_000,
        tool: "roamdisk fuzz corpus".into(),
        options: PlanOptions {
            min_extent: 4096,
            max_extents: 10,
            size_limit: 0,
        },
        devices: vec![Device {
            id: 0,
            path: "/dev/sdz".into(),
            size: 1 << 30,
            scheme: "gpt".into(),
            table_sha256: "ab".repeat(32),
        }],
        partitions: vec![
            part(1, 1 << 20, 100 << 20, Status::Used, None),
            part(2, 101 << 20, 100 << 20, Status::Skipped, Some("not-clean")),
        ],
        free_histogram: free,
        borrowed_histogram: borrowed,
        // Two 4 KiB extents of partition 1, at 2 and 4 MiB.
        extents: [2 << 20, 4 << 20]
            .map(|offset| PlanExtent {
                device: 0,
                partition: 1,
                offset,
                len: 4096,
            })
            .to_vec(),
        total_bytes: 8192,
    };
    s.push(("hand-made".into(), p.to_json().into_bytes()));
    s
}

/// A write-ahead log of a 2048-sector disk: generation 3 (slot 1), two
/// records, the second with data.
pub fn cas_session_wal() -> Seeds {
    use roamdisk_blockdev::overlay::Run;
    use roamdisk_roam::session::wal;
    let head = wal::Head {
        generation: 3,
        capacity: wal::MIN_CAPACITY,
        id: 0x5eed,
    };
    let mut f = vec![0u8; wal::MIN_CAPACITY as usize];
    let slot = wal::encode_slot(&head);
    let at = wal::slot_offset(3) as usize;
    f[at..at + wal::SLOT_SIZE].copy_from_slice(&slot);
    let mut chain = u32::from_le_bytes(slot[wal::SLOT_SIZE - 4..].try_into().unwrap());
    let mut pos = wal::RECORDS_AT as usize;
    let records = [
        wal::Record {
            seq: 1,
            runs: vec![Run {
                start: 0,
                count: 8,
                state: 1,
            }],
            extents: vec![],
            data: vec![],
        },
        wal::Record {
            seq: 2,
            runs: vec![Run {
                start: 100,
                count: 3,
                state: 3,
            }],
            extents: vec![wal::Extent {
                start: 100,
                count: 3,
            }],
            data: vec![0xa5; 3 * 512],
        },
    ];
    for r in &records {
        let (b, crc) = wal::encode_record(&head, chain, r);
        f[pos..pos + b.len()].copy_from_slice(&b);
        pos += b.len();
        chain = crc;
    }
    both("two-records", &f)
}

/// Every new target's seeds, by target name.
pub fn all() -> Vec<(&'static str, Seeds)> {
    vec![
        ("cas_catalog", cas_catalog()),
        ("cas_chunk", cas_chunk()),
        ("cas_index", cas_index()),
        ("cas_version", cas_version()),
        ("cas_session_map", cas_session_map()),
        ("cas_session_wal", cas_session_wal()),
        ("cas_wire", cas_wire()),
        ("cas_wire_get", cas_wire_get()),
        ("cas_wire_put", cas_wire_put()),
        ("cas_pack", cas_pack()),
        ("cas_store_config", cas_store_config()),
        ("cas_store_users", cas_store_users()),
        ("cas_s3_names", cas_s3_names()),
        ("workload_trace", workload_trace()),
        ("workload_blkparse", workload_blkparse()),
        ("workload_msr", workload_msr()),
        ("fsmeta_part", fsmeta_part()),
        ("fsmeta_ext", fsmeta_ext()),
        ("fsmeta_ntfs", fsmeta_ntfs()),
        ("fsmeta_swap", fsmeta_swap()),
        ("borrow_plan", borrow_plan()),
        ("migration_stream", crate::memory::migration_stream()),
        (
            "migration_return_path",
            crate::memory::migration_return_path(),
        ),
        ("cas_memory", crate::memory::cas_memory()),
        (
            "cas_memory_working_set",
            crate::memory::cas_memory_working_set(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::Image;
    use crate::fixup;
    use roamdisk_chunkstore::catalog::Catalog;
    use roamdisk_chunkstore::chunk::FLAG_ZSTD;

    /// Write the corpus when `ROAMDISK_CORPUS_DIR` is set; always check
    /// that the seeds parse the way their names say.
    #[test]
    fn corpus() {
        let all = all();
        if let Some(dir) = std::env::var_os("ROAMDISK_CORPUS_DIR") {
            for (target, seeds) in &all {
                let d = Path::new(&dir).join(target);
                std::fs::create_dir_all(&d).unwrap();
                for (name, bytes) in seeds {
                    std::fs::write(d.join(name), bytes).unwrap();
                }
            }
        }
        let get = |t: &str| all.iter().find(|(n, _)| *n == t).unwrap().1.clone();
        for (name, s) in get("cas_wire_put") {
            let n = if s[0] & 2 == 0 {
                let b = if s[0] & FIXUP == 0 {
                    s[1..].to_vec()
                } else {
                    // What the target frames from these entries.
                    let mut b = wire::PUT_MAGIC.to_vec();
                    b.extend(2u32.to_le_bytes());
                    b.extend([1u8; 32]);
                    b.extend(9u32.to_le_bytes());
                    b.extend(b"an object");
                    b.extend([2u8; 32]);
                    b.extend(0u32.to_le_bytes());
                    b
                };
                wire::parse_put_request(&b).map(|i| i.len())
            } else {
                wire::parse_put_answer(&s[2..], s[1] as usize).map(|o| o.len())
            };
            assert_eq!(n.unwrap_or_else(|e| panic!("{name}: {e}")), 2, "{name}");
        }
        for (name, s) in get("cas_wire_get") {
            let got = if s[0] & 2 == 0 {
                wire::parse_get_request(&s[1..]).map(|ids| ids.len())
            } else if s[0] & FIXUP == 0 {
                wire::parse_get_answer(&s[2..], s[1] as usize).map(|g| g.len())
            } else {
                // What the target frames from these entries.
                let mut b = wire::GET_MAGIC.to_vec();
                b.extend(3u32.to_le_bytes());
                b.extend([wire::GOT_FOUND, 9, 0, 0, 0]);
                b.extend(b"an object");
                b.extend([
                    wire::GOT_MISSING,
                    0,
                    0,
                    0,
                    0,
                    wire::GOT_NOT_SENT,
                    0,
                    0,
                    0,
                    0,
                ]);
                wire::parse_get_answer(&b, 3).map(|g| g.len())
            };
            assert_eq!(got.unwrap_or_else(|e| panic!("{name}: {e}")), 3, "{name}");
        }
        for (name, s) in get("cas_s3_names") {
            use roamdisk_chunkstore::store::s3::{parse_lease, refs, S3Location};
            let text = || std::str::from_utf8(&s[1..]).unwrap();
            let ok = match s[0] {
                0 => S3Location::parse(text()).is_ok(),
                1 => refs::parse_name(text()) == Some(3),
                2 => parse_lease(text()).is_some(),
                _ => {
                    let bodies: Vec<Vec<u8>> =
                        s[1..].split(|b| *b == 0xff).map(<[u8]>::to_vec).collect();
                    let m = refs::merge("u/i", &bodies).unwrap().unwrap();
                    Catalog::parse(&m).unwrap().entries.len() == 2
                }
            };
            assert!(ok, "{name}");
        }
        for (name, s) in get("cas_catalog") {
            let mut b = s[1..].to_vec();
            if s[0] & FIXUP != 0 {
                fixup::cas_catalog(&mut b);
            }
            Catalog::parse(&b).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for (name, s) in get("cas_index") {
            let mut b = s[1..].to_vec();
            if s[0] & FIXUP != 0 {
                fixup::cas_index(&mut b);
            }
            Index::parse(&b, !name.starts_with("session"))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for (name, s) in get("cas_version") {
            let mut b = s[1..].to_vec();
            if s[0] & FIXUP != 0 {
                fixup::cas_version(&mut b);
            }
            Version::decode(&b, Some(&VERSION_USER_KEY)).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for (name, s) in get("cas_session_map") {
            let mut b = s[1..].to_vec();
            if s[0] & FIXUP != 0 {
                fixup::cas_session_map(&mut b);
            }
            roamdisk_blockdev::overlay::log::replay::<map::Header>(&b)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for (name, s) in get("cas_session_wal") {
            let mut b = s[1..].to_vec();
            if s[0] & FIXUP != 0 {
                fixup::cas_session_wal(&mut b);
            }
            let r = roamdisk_roam::session::wal::replay(&b, 2048)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(r.records.len(), 2, "{name}");
        }
        for hash in [HashKind::Blake3, HashKind::Sha256] {
            let codec = ChunkCodec {
                hash,
                zstd_level: Some(3),
            };
            let sealed = codec.seal(CHUNK_PLAINTEXT, true);
            assert_eq!(encrypted_chunk_id(hash, &sealed.object[16..]), sealed.id);
            assert_eq!(sealed.key, Some(chunk_key(hash)));
            assert_ne!(sealed.object[5] & FLAG_ZSTD, 0, "the plaintext compresses");
        }
        for (name, s) in get("cas_pack") {
            let mut b = s[1..].to_vec();
            if s[0] & FIXUP != 0 {
                fixup::cas_pack(&mut b);
            }
            let hash = if s[0] & 2 != 0 {
                HashKind::Sha256
            } else {
                HashKind::Blake3
            };
            pack::parse_header(&b, hash).unwrap_or_else(|e| panic!("{name}: {e}"));
            let t = pack::Trailer::parse(&b[b.len() - pack::TRAILER_SIZE..], b.len() as u64)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let a = t.index_offset as usize;
            let e = t
                .parse_index(&b[..pack::HEADER_SIZE], &b[a..a + t.index_len()])
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(e.len(), if name.starts_with("empty") { 0 } else { 3 });
        }
        for (target, seeds) in get_fs(&all) {
            for (name, s) in seeds {
                let mut img = Image::from_segments(&s[1..]);
                if s[0] & FIXUP != 0 {
                    match target {
                        "fsmeta_part" => fixup::gpt(&mut img),
                        "fsmeta_ext" => fixup::ext(&mut img),
                        "fsmeta_ntfs" => fixup::ntfs(&mut img),
                        _ => {}
                    }
                }
                let dev = img.device(0);
                if target == "fsmeta_part" {
                    let t =
                        roamdisk_fsmeta::read_table(&dev).unwrap_or_else(|e| panic!("{name}: {e}"));
                    assert!(
                        !t.partitions.is_empty() && t.warnings.is_empty(),
                        "{name}: {t:?}"
                    );
                } else {
                    let f = roamdisk_fsmeta::free_space(&dev, 0, dev.size())
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    assert!(
                        f.probe.supported() || name.starts_with("tux") || name.starts_with("hib"),
                        "{name}: {f:?}"
                    );
                    assert!(
                        f.free_bytes > 0 || !f.probe.health.is_clean(),
                        "{name}: {f:?}"
                    );
                }
            }
        }
        for (name, s) in get("cas_store_users") {
            let u = Users::parse(std::str::from_utf8(&s).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            for (user, admitted) in [("alice", true), ("mallory", false), ("b.o-b_2", false)] {
                let got = u.authenticate(Some(users_token(user).as_str())).is_ok();
                assert!(name == "empty" || got == admitted, "{name}: {user}");
            }
        }
        for (name, s) in get("borrow_plan") {
            Plan::from_json(std::str::from_utf8(&s).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    fn get_fs(all: &[(&'static str, Seeds)]) -> Vec<(&'static str, Seeds)> {
        all.iter()
            .filter(|(n, _)| n.starts_with("fsmeta_"))
            .cloned()
            .collect()
    }
}
