//! Helpers of the borrow (TransPart) tests: build the corpus with the real
//! tools (tests/corpus/make-borrow-corpus.sh), read partition layouts with
//! sfdisk, get the tools' view of each file system's free space, and parse
//! roamdisk's plain-text outputs.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{path_str, rd, run, run_stdout};

/// One line of the corpus manifest.
#[derive(Debug, Clone)]
pub struct Row {
    pub disk: String,
    pub part: u32,
    pub name: String,
    pub fs: String,
    pub used: bool,
    pub reason: String,
    pub swap_bytes: Option<u64>,
}

/// A host file and where its original content is.
#[derive(Debug, Clone)]
pub struct FileRow {
    pub disk: String,
    pub part: u32,
    pub fs: String,
    pub path: String,
    pub source: PathBuf,
}

pub struct Corpus {
    pub dir: PathBuf,
    pub rows: Vec<Row>,
    pub files: Vec<FileRow>,
}

impl Corpus {
    pub fn disk(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.img"))
    }

    /// `roamdisk borrow scan GPT MBR --min-extent 4K --plan PLAN`: every
    /// free extent of both disks, the most fragmented plan. Returns the
    /// summary.
    pub fn scan_all(&self, plan: &Path) -> String {
        let (gpt, mbr) = (self.disk("gpt"), self.disk("mbr"));
        let disks = [path_str(&gpt), path_str(&mbr)];
        scan(
            &[
                &disks[..],
                &["--min-extent", "4K", "--plan", path_str(plan)],
            ]
            .concat(),
        )
    }
}

/// Build the corpus in `dir` with the generator script.
pub fn corpus(dir: &Path) -> Corpus {
    for t in [
        "mke2fs",
        "debugfs",
        "tune2fs",
        "mkntfs",
        "ntfscp",
        "ntfsinfo",
        "ntfstruncate",
        "ntfsfix",
        "mkswap",
        "sfdisk",
        "python3",
    ] {
        crate::common::require_tool(t);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/make-borrow-corpus.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(dir)
        .output()
        .expect("run the corpus generator");
    assert!(
        out.status.success(),
        "corpus generator failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = tsv(&dir.join("manifest.tsv"))
        .iter()
        .map(|f| Row {
            used: f[4] == "used",
            disk: f[0].clone(),
            part: f[1].parse().expect("part"),
            name: f[2].clone(),
            fs: f[3].clone(),
            reason: f[5].clone(),
            swap_bytes: f[6]
                .strip_prefix("swap_bytes=")
                .map(|v| v.parse().expect("swap size")),
        })
        .collect();
    let files = tsv(&dir.join("files.tsv"))
        .iter()
        .map(|f| FileRow {
            disk: f[0].clone(),
            part: f[1].parse().expect("part"),
            fs: f[2].clone(),
            path: f[3].clone(),
            source: dir.join(&f[4]),
        })
        .collect();
    Corpus {
        dir: dir.to_path_buf(),
        rows,
        files,
    }
}

/// The tab-separated fields of each line of a corpus file.
fn tsv(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| l.split('\t').map(String::from).collect())
        .collect()
}

/// Partition number -> (start, length) in bytes, from `sfdisk -d`.
pub fn layout(disk: &Path) -> BTreeMap<u32, (u64, u64)> {
    let text = run_stdout("sfdisk", &["-d", disk.to_str().expect("utf8")]);
    let prefix = disk.to_str().expect("utf8");
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            continue;
        };
        let Some((num, attrs)) = rest.split_once(':') else {
            continue;
        };
        let num: u32 = num.trim().parse().expect("partition number");
        let field = |k: &str| -> u64 {
            attrs
                .split(',')
                .find_map(|a| {
                    a.trim().strip_prefix(k).map(|v| {
                        v.trim_start_matches(['=', ' '])
                            .trim()
                            .parse()
                            .expect("number")
                    })
                })
                .unwrap_or_else(|| panic!("no {k} in {line}"))
        };
        m.insert(num, (field("start") * 512, field("size") * 512));
    }
    m
}

/// Copy `len` bytes at `off` of `src` into a new file `dst`.
pub fn extract(src: &Path, off: u64, len: u64, dst: &Path) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::File::open(src).expect("open");
    f.seek(SeekFrom::Start(off)).expect("seek");
    let mut o = std::fs::File::create(dst).expect("create");
    let mut left = len;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..n]).expect("read");
        o.write_all(&buf[..n]).expect("write");
        left -= n as u64;
    }
}

/// One partition of `roamdisk borrow free`: file system, health, extents.
pub type FreeRow = (String, String, Vec<(u64, u64)>);

/// `roamdisk borrow free DISK`: partition -> its row.
pub fn roamdisk_free(disk: &Path) -> BTreeMap<u32, FreeRow> {
    let out = rd(&["borrow", "free", path_str(disk)]);
    let mut m = BTreeMap::new();
    let mut cur = None;
    for line in out.lines() {
        if let Some(h) = line.strip_prefix("# ") {
            let f: Vec<&str> = h.split(' ').collect();
            let part: u32 = f[1].parse().expect("part");
            m.insert(part, (f[2].to_string(), f[3].to_string(), Vec::new()));
            cur = Some(part);
        } else {
            let (a, b) = line.split_once(' ').expect("START LEN");
            m.get_mut(&cur.expect("header first"))
                .expect("part")
                .2
                .push((a.parse().expect("start"), b.parse().expect("len")));
        }
    }
    m
}

/// Merge touching ranges of a sorted list.
pub fn merged(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, l) in v {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == s => last.1 += l,
            _ => out.push((s, l)),
        }
    }
    out
}

/// The free extents of an ext image according to dumpe2fs (per-group
/// "Free blocks:" lists), as byte ranges of the image; plus the free
/// block count e2freefrag reports.
pub fn ext_tool_view(img: &Path) -> (Vec<(u64, u64)>, u64, u64) {
    let p = img.to_str().expect("utf8");
    let d = run_stdout("dumpe2fs", &[p]);
    let num = |key: &str| -> Option<u64> {
        d.lines().find_map(|l| {
            l.strip_prefix(key)
                .map(|v| v.trim().parse().expect("number"))
        })
    };
    let bs = num("Block size:").expect("block size");
    let ratio = num("Cluster size:").map_or(1, |c| c / bs);
    let mut v = Vec::new();
    for line in d.lines() {
        // Group lines are indented; the unindented one is the total.
        let Some(list) = line.strip_prefix("  Free blocks: ") else {
            continue;
        };
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (a, b) = match item.split_once('-') {
                Some((a, b)) => (a.parse::<u64>().expect("a"), b.parse::<u64>().expect("b")),
                None => {
                    let a = item.parse::<u64>().expect("a");
                    (a, a)
                }
            };
            // dumpe2fs prints the first block of the last free cluster.
            v.push((a * bs, (b - a + ratio) * bs));
        }
    }
    let ff = run_stdout("e2freefrag", &[p]);
    let free_blocks: u64 = ff
        .lines()
        .find_map(|l| {
            l.strip_prefix("Free blocks: ").map(|v| {
                v.split_whitespace()
                    .next()
                    .expect("n")
                    .parse()
                    .expect("free blocks")
            })
        })
        .expect("e2freefrag free blocks");
    (merged(v), free_blocks, bs)
}

/// The free clusters of an NTFS image according to `$Bitmap` (read with
/// ntfscat) up to the cluster count and ntfsinfo's free count.
pub fn ntfs_tool_view(img: &Path) -> (Vec<(u64, u64)>, u64, u64) {
    let p = img.to_str().expect("utf8");
    let info = run_stdout("ntfsinfo", &["-f", "-m", p]);
    let num = |key: &str| -> u64 {
        info.lines()
            .find_map(|l| {
                l.trim().strip_prefix(key).map(|v| {
                    v.trim()
                        .split(' ')
                        .next()
                        .expect("n")
                        .parse()
                        .expect("number")
                })
            })
            .unwrap_or_else(|| panic!("no {key} in ntfsinfo output:\n{info}"))
    };
    let cs = num("Cluster Size:");
    let n = num("Volume Size in Clusters:");
    let free = num("Free Clusters:");
    let bm = run("ntfscat", &["-f", p, "$Bitmap"]).stdout;
    let mut v = Vec::new();
    let mut start = None;
    for i in 0..n {
        let used = bm[(i / 8) as usize] >> (i % 8) & 1 == 1;
        match (used, start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                v.push((s * cs, (i - s) * cs));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        v.push((s * cs, (n - s) * cs));
    }
    (v, free, cs)
}

/// Plan extents from `roamdisk borrow show PLAN --dm-table`: (device
/// path, byte offset, byte length) in logical order.
pub fn plan_extents(plan: &Path) -> Vec<(String, u64, u64)> {
    let out = rd(&["borrow", "show", path_str(plan), "--dm-table"]);
    let mut logical = 0;
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 5, "dm table line: {l}");
            assert_eq!(f[2], "linear");
            let start: u64 = f[0].parse().expect("start");
            let len: u64 = f[1].parse().expect("len");
            assert_eq!(start * 512, logical, "dm table is contiguous");
            logical += len * 512;
            (
                f[3].to_string(),
                f[4].parse::<u64>().expect("offset") * 512,
                len * 512,
            )
        })
        .collect()
}

/// A plan's partition: fs, status, reason, borrowed bytes.
pub type PlanPart = (String, String, String, u64);

/// `roamdisk borrow show PLAN --partitions`: (device, number) -> its row.
pub fn plan_partitions(plan: &Path) -> BTreeMap<(String, u32), PlanPart> {
    rd(&["borrow", "show", path_str(plan), "--partitions"])
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (
                (f[0].to_string(), f[1].parse().expect("number")),
                (
                    f[2].to_string(),
                    f[3].to_string(),
                    f[4].to_string(),
                    f[6].parse().expect("bytes"),
                ),
            )
        })
        .collect()
}

/// Run `roamdisk borrow scan ARGS...` and panic unless it succeeds.
pub fn scan(args: &[&str]) -> String {
    let mut a = vec!["borrow", "scan"];
    a.extend_from_slice(args);
    rd(&a)
}

/// Copy a file keeping holes.
pub fn copy_sparse(a: &Path, b: &Path) {
    run(
        "cp",
        &[
            "--sparse=always",
            a.to_str().expect("utf8"),
            b.to_str().expect("utf8"),
        ],
    );
}
