//! Linux swap areas and the hibernation signatures written over them.
//!
//! The header is the first page (4 KiB on x86; 8-64 KiB on other
//! architectures, found by where the signature sits): bootbits [1024],
//! version u32 @1024 (1), last page u32 @1028, bad page count u32 @1032,
//! UUID [16] @1036, label [16] @1052, bad page numbers u32 from @1536; the
//! signature "SWAPSPACE2" ends the page. Swap written on a machine of the
//! other byte order has its fields byte-swapped.
//!
//! Hibernation replaces the signature with "S1SUSPEND", "S2SUSPEND"
//! (kernel swsusp), "ULSUSPEND" (uswsusp) or "LINHIB0001"; TuxOnIce writes
//! its own magic at byte 0. Any of these means the pages hold a saved
//! system: the area is not used.
//!
//! Free area: pages 1 ..= last page, minus bad pages.

use roamdisk_blockdev::Result;

use crate::bytes::{corrupt, sha256, text, uuid_text, Fields, Region};
use crate::extent::Merger;
use crate::volume::{FsKind, Health, Probe, Reason};

const PAGE_SIZES: [usize; 5] = [4096, 8192, 16384, 32768, 65536];
const HIBERNATION: [&[u8]; 4] = [b"S1SUSPEND", b"S2SUSPEND", b"ULSUSPEND", b"LINHIB0001"];
const TUXONICE: &[u8] = b"\xed\xc3\x02\xe9\x98\x56\xe5\x0c";
const BAD_PAGES_AT: usize = 1536;

/// The signature found: (page size, text).
pub fn signature(head: &[u8]) -> Option<(usize, &'static str)> {
    if head.starts_with(TUXONICE) {
        return Some((4096, "TuxOnIce"));
    }
    for ps in PAGE_SIZES {
        let Some(tail) = head.get(ps - 10..ps) else {
            break;
        };
        if tail == b"SWAPSPACE2" {
            return Some((ps, "SWAPSPACE2"));
        }
        if tail == b"SWAP-SPACE" {
            return Some((ps, "SWAP-SPACE"));
        }
        for h in HIBERNATION {
            if tail.starts_with(h) {
                return Some((ps, std::str::from_utf8(h).unwrap_or("hibernation")));
            }
        }
    }
    None
}

/// A parsed swap header.
pub(crate) struct Swap {
    page: u64,
    last_page: u64,
    bad: Vec<u64>,
    sig: &'static str,
    uuid: [u8; 16],
    label: Option<String>,
    identity: [u8; 32],
    region_len: u64,
}

impl Swap {
    pub fn open(r: &Region<'_>, head: &[u8]) -> Result<std::result::Result<Swap, Probe>> {
        let (ps, sig) = signature(head).ok_or_else(|| corrupt("swap", "no swap signature"))?;
        let page = head
            .get(..ps)
            .ok_or_else(|| corrupt("swap", "volume shorter than its header page"))?;
        let identity = sha256(&[page]);
        if sig == "SWAP-SPACE" {
            return Ok(Err(Probe::unsupported(
                "swap",
                "old-style (v0) swap area: not supported".into(),
                identity,
            )));
        }
        let raw_version = page.le32(1024).unwrap_or(0);
        let swapped = raw_version.swap_bytes() == 1 && raw_version != 1;
        let get = |o: usize| {
            let v = page.le32(o).unwrap_or(0);
            if swapped {
                v.swap_bytes()
            } else {
                v
            }
        };
        // A hibernated area may have had its header rewritten; only the
        // signature matters then.
        let hibernated = sig != "SWAPSPACE2";
        if !hibernated && get(1024) != 1 {
            return Err(corrupt(
                "swap",
                format!("header version {raw_version:#x} is not 1"),
            ));
        }
        let pages_in_region = r.len / ps as u64;
        let last_page = get(1028) as u64;
        let nbad = get(1032) as usize;
        let max_bad = (ps - BAD_PAGES_AT - 10) / 4;
        if !hibernated {
            if last_page == 0 || last_page >= pages_in_region {
                return Err(corrupt(
                    "swap",
                    format!(
                        "last page {last_page} is outside the {pages_in_region}-page partition: truncated image or wrong partition table"
                    ),
                ));
            }
            if nbad > max_bad {
                return Err(corrupt(
                    "swap",
                    format!("{nbad} bad pages is more than the header holds"),
                ));
            }
        }
        let mut bad = Vec::new();
        if !hibernated {
            for i in 0..nbad {
                let b = get(BAD_PAGES_AT + 4 * i) as u64;
                if b == 0 || b > last_page {
                    return Err(corrupt(
                        "swap",
                        format!("bad page {b} is outside the swap area"),
                    ));
                }
                bad.push(b);
            }
        }
        bad.sort_unstable();
        bad.dedup();
        Ok(Ok(Swap {
            page: ps as u64,
            last_page,
            bad,
            sig,
            uuid: page[1036..1052].try_into().expect("16"),
            label: text(&page[1052..1068]),
            identity,
            region_len: r.len,
        }))
    }

    pub fn probe(&self) -> Probe {
        let health = if self.sig == "SWAPSPACE2" {
            Health::Clean
        } else {
            Health::unsafe_(
                Reason::Hibernated,
                format!(
                    "a Linux hibernation image is stored here (signature {}): resume the host and shut it down instead",
                    self.sig
                ),
            )
        };
        Probe {
            kind: FsKind::Swap,
            type_name: "swap".into(),
            uuid: (self.uuid != [0; 16]).then(|| uuid_text(&self.uuid)),
            label: self.label.clone(),
            unit: self.page,
            fs_bytes: if self.sig == "SWAPSPACE2" {
                (self.last_page + 1) * self.page
            } else {
                self.region_len
            },
            health,
            notes: vec![
                format!("page size {}", self.page),
                format!("signature {}", self.sig),
                format!("{} bad pages", self.bad.len()),
            ],
            identity: self.identity,
        }
    }

    /// Pages 1 ..= last page minus bad pages (nothing when hibernated).
    pub fn free(&self, region_start: u64, m: &mut Merger<'_>) {
        if self.sig != "SWAPSPACE2" {
            return;
        }
        let mut p = 1;
        for &b in &self.bad {
            if b > p {
                m.push(region_start + p * self.page, (b - p) * self.page);
            }
            p = b + 1;
        }
        if p <= self.last_page {
            m.push(
                region_start + p * self.page,
                (self.last_page + 1 - p) * self.page,
            );
        }
    }
}
