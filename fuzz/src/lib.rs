//! Helpers shared by the fuzz targets, and the seed corpus.
//!
//! The seeds in `fuzz/seeds/<target>/` are generated here and checked by
//! the test below: `cargo test --manifest-path fuzz/Cargo.toml`
//! fails when they are stale, and rewrites them when run with
//! `ROAMDISK_WRITE_SEEDS=1`.

pub mod corpus;
pub mod disk;
pub mod fixup;
pub mod memory;
pub mod overlay;
pub mod trace;

use roamdisk_blockdev::layers::cow::map;
use roamdisk_blockdev::overlay::log::{HEADER_SIZE, RECORD_SIZE};
use roamdisk_nbd::proto::*;

/// First byte of an `nbd_options` input: which parser gets the rest.
pub const OPT_SEL_INFO: u8 = 0;
pub const OPT_SEL_META: u8 = 1;
pub const OPT_SEL_EXPORT_NAME: u8 = 2;
pub const OPT_SEL_ENCODERS: u8 = 3;
pub const OPT_SELECTORS: u8 = 4;

/// First byte of a `cow_map` input: odd means "fix every checksum first".
pub const COW_RAW: u8 = 0;
pub const COW_FIXUP: u8 = 1;

/// Rewrite the header checksum and the record chain of a cow map file so
/// that the fuzzer's mutations reach the record logic instead of dying at
/// a CRC check. Partial trailing records are left alone.
pub fn fix_cow_map_checksums(b: &mut [u8]) {
    if b.len() < HEADER_SIZE {
        return;
    }
    let hcrc = HEADER_SIZE - 4;
    let crc = crc32c::crc32c(&b[..hcrc]);
    b[hcrc..HEADER_SIZE].copy_from_slice(&crc.to_le_bytes());
    let mut chain = crc;
    let rcrc = RECORD_SIZE - 4;
    for r in b[HEADER_SIZE..].chunks_exact_mut(RECORD_SIZE) {
        chain = crc32c::crc32c_append(chain, &r[..rcrc]);
        r[rcrc..].copy_from_slice(&chain.to_le_bytes());
    }
}

/// The input of a target for a text format, parsed: `None` when it is
/// not UTF-8 (those formats are read as text, so such input never reaches
/// the parser) or when `parse` refuses it, and then the refusal must be of
/// `kind` and print.
pub fn parse_text<T>(
    data: &[u8],
    kind: roamdisk_blockdev::ErrorKind,
    parse: impl FnOnce(&str) -> roamdisk_blockdev::Result<T>,
) -> Option<T> {
    let text = std::str::from_utf8(data).ok()?;
    match parse(text) {
        Ok(v) => Some(v),
        Err(e) => {
            assert_eq!(e.kind(), kind, "{e}");
            let _ = e.to_string();
            None
        }
    }
}

/// Named seed inputs of one target.
pub type Seeds = Vec<(&'static str, Vec<u8>)>;

/// A client byte stream under construction.
#[derive(Default)]
pub struct Client(pub Vec<u8>);

impl Client {
    pub fn new(client_flags: u32) -> Client {
        Client(client_flags.to_be_bytes().to_vec())
    }
    pub fn option(mut self, opt: u32, payload: &[u8]) -> Client {
        self.0.extend_from_slice(&IHAVEOPT.to_be_bytes());
        self.0.extend_from_slice(&opt.to_be_bytes());
        self.0
            .extend_from_slice(&(payload.len() as u32).to_be_bytes());
        self.0.extend_from_slice(payload);
        self
    }
    pub fn request(mut self, cmd: u16, flags: u16, offset: u64, length: u32) -> Client {
        let handle = self.0.len() as u64;
        self.0.extend_from_slice(&encode_request(&Request {
            flags,
            cmd,
            handle,
            offset,
            length,
        }));
        if cmd == CMD_WRITE {
            self.0
                .extend((0..length).map(|i| (i as u8).wrapping_mul(31) ^ 0x5a));
        }
        self
    }
}

/// An OPT_INFO / OPT_GO payload.
pub fn info_payload(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut p = (name.len() as u32).to_be_bytes().to_vec();
    p.extend_from_slice(name.as_bytes());
    p.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        p.extend_from_slice(&i.to_be_bytes());
    }
    p
}

/// A meta-context option payload.
pub fn meta_payload(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut p = (export.len() as u32).to_be_bytes().to_vec();
    p.extend_from_slice(export.as_bytes());
    p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        p.extend_from_slice(&(q.len() as u32).to_be_bytes());
        p.extend_from_slice(q.as_bytes());
    }
    p
}

const FLAGS: u32 = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
const ALL_INFOS: [u16; 3] = [INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE];

/// Seeds for `nbd_session`: whole client streams that reach transmission.
pub fn session_seeds() -> Seeds {
    let structured = Client::new(FLAGS)
        .option(OPT_STRUCTURED_REPLY, &[])
        .option(OPT_SET_META_CONTEXT, &meta_payload("", &[BASE_ALLOCATION]))
        .option(OPT_GO, &info_payload("", &ALL_INFOS))
        .request(CMD_WRITE, CMD_FLAG_FUA, 0, 1024)
        .request(CMD_READ, 0, 0, 4096)
        .request(CMD_BLOCK_STATUS, 0, 0, 1 << 20)
        .request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 65536, 65536)
        .request(CMD_READ, CMD_FLAG_DF, 0, 8192)
        .request(CMD_TRIM, 0, 131072, 65536)
        .request(CMD_CACHE, 0, 0, 4096)
        .request(CMD_FLUSH, 0, 0, 0)
        .request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20)
        .request(CMD_DISC, 0, 0, 0);
    let simple = Client::new(FLAG_C_FIXED_NEWSTYLE)
        .option(OPT_EXPORT_NAME, b"rw")
        .request(CMD_WRITE, 0, 4096, 512)
        .request(CMD_READ, 0, 4096, 512)
        .request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 4096)
        .request(CMD_FLUSH, 0, 0, 0)
        .request(CMD_DISC, 0, 0, 0);
    let read_only = Client::new(FLAGS)
        .option(OPT_LIST, &[])
        .option(OPT_INFO, &info_payload("ro", &ALL_INFOS))
        .option(OPT_STRUCTURED_REPLY, &[])
        .option(OPT_LIST_META_CONTEXT, &meta_payload("ro", &["base:"]))
        .option(
            OPT_SET_META_CONTEXT,
            &meta_payload("ro", &[BASE_ALLOCATION]),
        )
        .option(OPT_GO, &info_payload("ro", &[]))
        .request(CMD_WRITE, 0, 0, 512)
        .request(CMD_READ, 0, 0, 4096)
        .request(CMD_BLOCK_STATUS, 0, 0, 4096)
        .request(CMD_DISC, 0, 0, 0);
    let refused = Client::new(FLAGS)
        .option(OPT_STARTTLS, &[])
        .option(OPT_SET_META_CONTEXT, &meta_payload("", &[BASE_ALLOCATION]))
        .option(99, b"unknown")
        .option(OPT_GO, &info_payload("nosuch", &[]))
        .option(OPT_ABORT, &[]);
    vec![
        ("structured", structured.0),
        ("simple", simple.0),
        ("read-only", read_only.0),
        ("refused", refused.0),
    ]
}

/// Seeds for `nbd_request`: valid request headers.
pub fn request_seeds() -> Seeds {
    let q = |cmd, flags, offset, length| {
        encode_request(&Request {
            flags,
            cmd,
            handle: 7,
            offset,
            length,
        })
        .to_vec()
    };
    vec![
        ("read", q(CMD_READ, CMD_FLAG_DF, 4096, 512)),
        ("write", q(CMD_WRITE, CMD_FLAG_FUA, 0, 65536)),
        (
            "write-zeroes",
            q(
                CMD_WRITE_ZEROES,
                CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                0,
                1,
            ),
        ),
        (
            "block-status",
            q(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, u32::MAX),
        ),
        ("disc", q(CMD_DISC, 0, 0, 0)),
    ]
}

/// Seeds for `nbd_options`: selector byte + valid payload.
pub fn option_seeds() -> Seeds {
    let sel = |s: u8, p: &[u8]| [&[s][..], p].concat();
    vec![
        ("info", sel(OPT_SEL_INFO, &info_payload("rw", &ALL_INFOS))),
        ("info-default", sel(OPT_SEL_INFO, &info_payload("", &[]))),
        (
            "meta",
            sel(
                OPT_SEL_META,
                &meta_payload("rw", &[BASE_ALLOCATION, "base:", "qemu:dirty-bitmap:x"]),
            ),
        ),
        ("export-name", sel(OPT_SEL_EXPORT_NAME, b"disk")),
        // One byte over the limit; also raises libFuzzer's -max_len default
        // above 4096 so longer payloads get generated.
        (
            "export-name-too-long",
            sel(OPT_SEL_EXPORT_NAME, &[b'a'; MAX_STRING + 1]),
        ),
        (
            "encoders",
            sel(OPT_SEL_ENCODERS, b"\x00\x00\x00\x07message"),
        ),
    ]
}

/// Seeds for `cow_map`: a valid map with committed runs and a torn tail.
pub fn cow_map_seeds() -> Seeds {
    let h = map::Header {
        cluster_size: 65536,
        virtual_size: 64 * 65536 + 4096,
        generation: 3,
    };
    use roamdisk_blockdev::overlay::log::{KIND_COMMIT, KIND_SET};
    let (_, f) = overlay::map_file(
        &h,
        &[
            (KIND_SET, map::State::Data as u8, 4, 0),
            (KIND_SET, map::State::Zero as u8, 2, 10),
            (KIND_COMMIT, 0, 0, 1),
            (KIND_SET, map::State::Base as u8, 1, 64),
            (KIND_COMMIT, 0, 0, 2),
            (KIND_SET, map::State::Data as u8, 1, 3),
        ],
    );
    let mut torn = f.clone();
    torn.extend_from_slice(&[0xee; 10]);
    vec![
        ("raw", [&[COW_RAW][..], &f].concat()),
        ("raw-torn", [&[COW_RAW][..], &torn].concat()),
        ("fixup", [&[COW_FIXUP][..], &f].concat()),
    ]
}

/// Every target's seeds, by target name.
pub fn all_seeds() -> Vec<(&'static str, Seeds)> {
    vec![
        ("nbd_request", request_seeds()),
        ("nbd_options", option_seeds()),
        ("nbd_session", session_seeds()),
        ("cow_map", cow_map_seeds()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn committed_seeds_are_current() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
        let write = std::env::var_os("ROAMDISK_WRITE_SEEDS").is_some();
        let mut stale = Vec::new();
        for (target, seeds) in all_seeds() {
            let dir = root.join(target);
            if write {
                std::fs::create_dir_all(&dir).unwrap();
            }
            for (name, bytes) in seeds {
                let p = dir.join(name);
                if write {
                    std::fs::write(&p, &bytes).unwrap();
                } else if std::fs::read(&p).ok().as_deref() != Some(&bytes[..]) {
                    stale.push(p.display().to_string());
                }
            }
        }
        assert!(
            stale.is_empty(),
            "stale seeds {stale:?}: rerun with ROAMDISK_WRITE_SEEDS=1"
        );
    }

    #[test]
    fn session_seeds_reach_transmission() {
        for (name, s) in session_seeds() {
            let out = roamdisk_nbd::fuzzing::run_session(&s);
            assert_eq!(out.transmission, name != "refused", "{name}");
        }
    }

    #[test]
    fn cow_map_seeds_replay() {
        for (name, s) in cow_map_seeds() {
            let mut b = s[1..].to_vec();
            if s[0] & 1 == COW_FIXUP {
                fix_cow_map_checksums(&mut b);
            }
            let r = roamdisk_blockdev::overlay::log::replay::<map::Header>(&b).unwrap();
            assert_eq!(r.last_seq, 2, "{name}");
            assert_eq!(r.runs.len(), 3, "{name}");
        }
    }
}
