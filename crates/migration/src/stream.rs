//! Reading the precopy stream QEMU writes for a *stopped* VM with the
//! default migration capabilities (what `roamdisk suspend --qmp` asks
//! for): the header and configuration, the RAM section's block list, every
//! page once (data or zero), then the device sections, the end mark and
//! the optional JSON description. [`Parser::next`] hands these out one
//! [`Event`] at a time as the stream arrives, so a stream the size of RAM
//! is never held whole.
//!
//! Anything else is refused with an error naming what was met — another
//! capability set (XBZRLE, compression, multifd, huge pages, ignored
//! shared RAM), another iterable section (`block`, `dirty-bitmap`, VFIO),
//! an unknown command or subsection — before any version names what was
//! read (chunks uploaded so far are left to gc), so the VM can run on. Every length is bounded and checked; a truncated or
//! hostile stream is an error, never a panic (fuzz target
//! `migration_stream`).

use std::io::{BufRead, BufReader, Read};

use crate::error::{Error, Result, HINT_DEFAULTS, HINT_DEVICE};
use crate::proto::*;

/// The most RAM blocks a stream may announce (a PC has about ten).
pub const MAX_BLOCKS: usize = 1024;
/// The most bytes after the RAM: device state, end mark and description;
/// the longest description and prologue (the page image's bounds,
/// `cas-memory.md`: a stream beyond them is refused here, before the VM
/// is stopped for good).
pub const MAX_TAIL: usize = 256 << 20;
pub const MAX_VMDESC: usize = 64 << 20;
pub const MAX_PROLOGUE: usize = 64 << 10;
/// The longest machine-type name in the configuration.
const MAX_MACHINE: usize = 256;

/// The stream's header and configuration section, verbatim and parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prologue {
    /// Bytes 0.. up to the first section: `QEVM`, the version and the
    /// configuration section; a destination is sent them as they are.
    pub bytes: Vec<u8>,
    /// The machine type (`pc-i440fx-7.2`), when the stream names one.
    pub machine: Option<String>,
    /// The VM's UUID, when the source validates it.
    pub uuid: Option<[u8; 16]>,
}

/// One RAM block of the `ram` section's list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamBlock {
    /// QEMU's id string (`pc.ram`, `0000:00:02.0/vga.vram`, `pc.bios`).
    pub name: String,
    /// Bytes in use (a multiple of the target page).
    pub length: u64,
}

/// The `ram` section as its START announced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamSection {
    pub section_id: u32,
    pub instance_id: u32,
    pub version_id: u32,
    pub blocks: Vec<RamBlock>,
    /// Sections end with a footer (`7E`, be32 id): every machine type
    /// since QEMU 2.4.
    pub footers: bool,
}

/// A page's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageData<'a> {
    /// Every byte is this one (QEMU sends 0).
    Fill(u8),
    Bytes(&'a [u8; TARGET_PAGE]),
}

/// What follows the RAM: the device sections (each `04` FULL section,
/// back to back, up to but not including the `00` end mark) and the JSON
/// description QEMU appends after the end mark (absent with
/// `suppress-vmdesc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tail {
    pub devices: Vec<u8>,
    pub vmdesc: Option<Vec<u8>>,
}

/// One step of the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    Prologue(Prologue),
    RamStart(RamSection),
    /// A page: block number (in the START list), byte offset in it.
    Page {
        block: usize,
        offset: u64,
        data: PageData<'a>,
    },
    /// The device state and the end: the last event.
    End(Tail),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Header,
    Sections,
    /// Inside a PART or END section's page records.
    Records {
        end: bool,
    },
    Done,
}

/// A migration stream being read (see the module's doc).
pub struct Parser<R: Read> {
    r: BufReader<R>,
    at: u64,
    state: State,
    ram: Option<RamSection>,
    ram_ended: bool,
    last_block: Option<usize>,
    page: Box<[u8; TARGET_PAGE]>,
    /// The bytes read while the prologue is being read.
    copy: Option<Vec<u8>>,
    /// The source opened a return path (`OPEN_RETURN_PATH`): it expects a
    /// `SHUT` once the stream is read.
    pub return_path: bool,
    /// Page records read so far, and those of zero pages.
    pub pages: u64,
    pub zero_pages: u64,
}

fn corrupt<T>(what: impl Into<String>, at: u64) -> Result<T> {
    Err(Error::Corrupt {
        what: what.into(),
        at,
    })
}

fn unsupported<T>(what: impl Into<String>, at: u64, hint: &'static str) -> Result<T> {
    Err(Error::Unsupported {
        what: what.into(),
        at,
        hint,
    })
}

impl<R: Read> Parser<R> {
    pub fn new(r: R) -> Parser<R> {
        Parser {
            r: BufReader::with_capacity(256 << 10, r),
            at: 0,
            state: State::Header,
            ram: None,
            ram_ended: false,
            last_block: None,
            page: Box::new([0; TARGET_PAGE]),
            copy: None,
            return_path: false,
            pages: 0,
            zero_pages: 0,
        }
    }

    /// Bytes read so far.
    pub fn position(&self) -> u64 {
        self.at
    }

    /// The `ram` section, once its START was read.
    pub fn ram(&self) -> Option<&RamSection> {
        self.ram.as_ref()
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        let at = self.at;
        self.r.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::Corrupt {
                what: format!("the stream ends within {} bytes it announced", buf.len()),
                at,
            },
            _ => Error::Io { at, source: e },
        })?;
        self.at += buf.len() as u64;
        if let Some(c) = &mut self.copy {
            c.extend_from_slice(buf);
        }
        Ok(())
    }

    fn u8(&mut self) -> Result<u8> {
        let mut b = [0u8; 1];
        self.fill(&mut b)?;
        Ok(b[0])
    }
    fn be16(&mut self) -> Result<u16> {
        let mut b = [0u8; 2];
        self.fill(&mut b)?;
        Ok(u16::from_be_bytes(b))
    }
    fn be32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        self.fill(&mut b)?;
        Ok(u32::from_be_bytes(b))
    }
    fn be64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.fill(&mut b)?;
        Ok(u64::from_be_bytes(b))
    }
    fn bytes(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; n];
        self.fill(&mut v)?;
        Ok(v)
    }
    /// A u8 length and that many bytes, as text.
    fn str8(&mut self, what: &str) -> Result<String> {
        let at = self.at;
        let n = self.u8()? as usize;
        let b = self.bytes(n)?;
        match String::from_utf8(b) {
            Ok(s) if !s.is_empty() => Ok(s),
            _ => corrupt(format!("{what} is empty or not text"), at),
        }
    }

    /// The next byte without taking it (`None` at the end of the stream).
    fn peek(&mut self) -> Result<Option<u8>> {
        let at = self.at;
        let b = self.r.fill_buf().map_err(|e| Error::Io { at, source: e })?;
        Ok(b.first().copied())
    }

    /// The next step of the stream; `None` after [`Event::End`].
    pub fn read(&mut self) -> Result<Option<Event<'_>>> {
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Header => {
                    let p = self.prologue()?;
                    self.state = State::Sections;
                    return Ok(Some(Event::Prologue(p)));
                }
                State::Records { end } => {
                    if let Some((block, offset, fill)) = self.record(end)? {
                        return Ok(Some(Event::Page {
                            block,
                            offset,
                            data: match fill {
                                Some(b) => PageData::Fill(b),
                                None => PageData::Bytes(&self.page),
                            },
                        }));
                    }
                }
                State::Sections => {
                    if let Some(e) = self.section()? {
                        return Ok(Some(e));
                    }
                }
            }
        }
    }

    /// `QEVM`, the version, and the configuration section if there is one.
    fn prologue(&mut self) -> Result<Prologue> {
        self.copy = Some(Vec::new());
        let mut p = self.prologue_fields()?;
        p.bytes = self.copy.take().expect("copying");
        if p.bytes.len() > MAX_PROLOGUE {
            return unsupported(
                format!("a configuration section of {} bytes", p.bytes.len()),
                0,
                HINT_DEFAULTS,
            );
        }
        Ok(p)
    }

    fn prologue_fields(&mut self) -> Result<Prologue> {
        let magic = self.be32()?;
        if magic != FILE_MAGIC {
            return corrupt(format!("it starts {magic:#010x}, not QEVM"), 0);
        }
        let v = self.be32()?;
        if v != FILE_VERSION {
            return unsupported(format!("stream version {v}"), 4, HINT_DEFAULTS);
        }
        let mut p = Prologue::default();
        if self.peek()? == Some(VM_CONFIGURATION) {
            self.u8()?;
            let at = self.at;
            let n = self.be32()? as usize;
            if n == 0 || n > MAX_MACHINE {
                return corrupt(format!("a machine type of {n} bytes"), at);
            }
            let name = self.bytes(n)?;
            p.machine = Some(String::from_utf8_lossy(&name).into_owned());
            while self.peek()? == Some(VM_SUBSECTION) {
                self.subsection(&mut p)?;
                if self.at > MAX_PROLOGUE as u64 {
                    return corrupt("a configuration section without end", self.at);
                }
            }
        }
        Ok(p)
    }

    fn subsection(&mut self, p: &mut Prologue) -> Result<()> {
        let at = self.at;
        self.u8()?;
        let name = self.str8("a configuration subsection's name")?;
        let _version = self.be32()?;
        match name.as_str() {
            "configuration/target-page-bits" => {
                let bits = self.be32()?;
                if bits != TARGET_PAGE_BITS {
                    return unsupported(
                        format!("target pages of 2^{bits} bytes"),
                        at,
                        "only 4 KiB target pages (x86) are stored",
                    );
                }
            }
            "configuration/capabilities" => {
                let n = self.be32()?;
                if n > 0 {
                    let cap = self.str8("a capability")?;
                    return unsupported(
                        format!("the migration capability {cap} on"),
                        at,
                        HINT_DEFAULTS,
                    );
                }
            }
            "configuration/uuid" => {
                let mut u = [0u8; 16];
                self.fill(&mut u)?;
                p.uuid = Some(u);
            }
            other => {
                return unsupported(
                    format!("a configuration subsection {other:?} it does not know"),
                    at,
                    HINT_DEFAULTS,
                )
            }
        }
        Ok(())
    }

    /// One section or command; an event if it makes one.
    fn section(&mut self) -> Result<Option<Event<'static>>> {
        let at = self.at;
        let Some(kind) = self.peek()? else {
            return corrupt("the stream ends before its end mark (truncated)", at);
        };
        match kind {
            VM_COMMAND => {
                self.u8()?;
                self.command(at)?;
                Ok(None)
            }
            VM_SECTION_START => {
                self.u8()?;
                let ram = self.ram_start(at)?;
                self.ram = Some(ram.clone());
                Ok(Some(Event::RamStart(ram)))
            }
            VM_SECTION_PART | VM_SECTION_END => {
                self.u8()?;
                let id = self.be32()?;
                match &self.ram {
                    Some(r) if r.section_id == id && !self.ram_ended => {}
                    Some(_) => {
                        return corrupt(format!("a section {id} that was never started"), at)
                    }
                    None => return corrupt("RAM pages before the RAM section", at),
                }
                self.state = State::Records {
                    end: kind == VM_SECTION_END,
                };
                Ok(None)
            }
            VM_SECTION_FULL | VM_EOF if self.ram_ended => {
                let tail = self.tail(at)?;
                self.state = State::Done;
                Ok(Some(Event::End(tail)))
            }
            VM_SECTION_FULL => {
                self.u8()?;
                let _id = self.be32()?;
                let name = self.str8("a section's name")?;
                unsupported(
                    format!("a device section {name:?} before the end of the RAM (QEMU's early set-up state, such as virtio-mem)"),
                    at,
                    HINT_DEVICE,
                )
            }
            VM_EOF => corrupt("the end mark before the RAM was complete", at),
            other => corrupt(format!("a section of unknown type {other:#04x}"), at),
        }
    }

    fn command(&mut self, at: u64) -> Result<()> {
        let cmd = self.be16()?;
        let len = self.be16()?;
        let want = match cmd {
            CMD_OPEN_RETURN_PATH | CMD_SWITCHOVER_START => Some(0),
            CMD_PING => Some(4),
            CMD_POSTCOPY_ADVISE => None,
            _ => {
                return unsupported(
                    format!(
                    "the command {} ({cmd}, {len} bytes) a stopped VM's migration does not send",
                    command_name(cmd)
                ),
                    at,
                    HINT_DEFAULTS,
                )
            }
        };
        if want.is_some_and(|w| w != len) || (cmd == CMD_POSTCOPY_ADVISE && len != 0 && len != 16) {
            return corrupt(
                format!("the command {} with {len} bytes", command_name(cmd)),
                at,
            );
        }
        match cmd {
            CMD_OPEN_RETURN_PATH => self.return_path = true,
            CMD_POSTCOPY_ADVISE if len == 16 => {
                let summary = self.be64()?;
                let target = self.be64()?;
                if target != TARGET_PAGE as u64 {
                    return unsupported(
                        format!("target pages of {target} bytes"),
                        at,
                        "only 4 KiB target pages (x86) are stored",
                    );
                }
                if summary != TARGET_PAGE as u64 {
                    return unsupported(
                        format!("RAM in pages of {summary:#x} bytes (huge pages)"),
                        at,
                        "back the VM's RAM with ordinary pages, or suspend it without --qmp",
                    );
                }
            }
            _ => {
                self.bytes(len as usize)?;
            }
        }
        Ok(())
    }

    fn ram_start(&mut self, at: u64) -> Result<RamSection> {
        let section_id = self.be32()?;
        let name = self.str8("a section's name")?;
        let instance_id = self.be32()?;
        let version_id = self.be32()?;
        if name != RAM_IDSTR {
            let what = match name.as_str() {
                "block" => "the block-migration section \"block\" (QEMU's -b / migrate blk)".into(),
                "dirty-bitmap" => {
                    "the dirty-bitmap section (capability dirty-bitmaps)".into()
                }
                other => format!("an iterable section {other:?} besides the RAM (a VFIO or other device migrated in parts)"),
            };
            return unsupported(what, at, HINT_DEFAULTS);
        }
        if self.ram.is_some() {
            return corrupt("a second RAM section", at);
        }
        if version_id != RAM_VERSION {
            return unsupported(
                format!("RAM section version {version_id}"),
                at,
                HINT_DEFAULTS,
            );
        }
        let wat = self.at;
        let (mut total, flags) = split_addr(self.be64()?);
        if flags != RAM_FLAG_MEM_SIZE {
            return corrupt(
                format!("a RAM section that starts with flags {flags:#x}"),
                wat,
            );
        }
        let mut blocks: Vec<RamBlock> = Vec::new();
        while total > 0 {
            let bat = self.at;
            let name = self.str8("a RAM block's name")?;
            let length = self.be64()?;
            if length == 0 || length % TARGET_PAGE as u64 != 0 || length > total {
                return corrupt(
                    format!(
                        "RAM block {name:?} of {length} bytes ({total} bytes left of the total)"
                    ),
                    bat,
                );
            }
            if blocks.iter().any(|b| b.name == name) {
                return corrupt(format!("RAM block {name:?} twice"), bat);
            }
            if blocks.len() == MAX_BLOCKS {
                return corrupt(format!("more than {MAX_BLOCKS} RAM blocks"), bat);
            }
            total -= length;
            blocks.push(RamBlock { name, length });
        }
        if blocks.is_empty() {
            return corrupt("a RAM section of no block", wat);
        }
        let eat = self.at;
        let eos = self.be64()?;
        if eos != RAM_FLAG_EOS {
            return self.bad_flags(eos, eat);
        }
        let footers = self.footer(section_id)?;
        Ok(RamSection {
            section_id,
            instance_id,
            version_id,
            blocks,
            footers,
        })
    }

    /// The optional section footer; whether there was one.
    fn footer(&mut self, id: u32) -> Result<bool> {
        if self.peek()? != Some(VM_SECTION_FOOTER) {
            return Ok(false);
        }
        let at = self.at;
        self.u8()?;
        let got = self.be32()?;
        if got != id {
            return corrupt(
                format!("section {id} ends with the footer of section {got}"),
                at,
            );
        }
        Ok(true)
    }

    /// A record word with flags this reader does not take.
    fn bad_flags<T>(&self, word: u64, at: u64) -> Result<T> {
        let (_, flags) = split_addr(word);
        let what = if flags & RAM_FLAG_XBZRLE != 0 {
            "XBZRLE-encoded pages (capability xbzrle)"
        } else if flags & RAM_FLAG_COMPRESS_PAGE != 0 {
            "compressed pages (capability compress)"
        } else if flags & RAM_FLAG_MULTIFD_FLUSH != 0 {
            "multifd pages (capability multifd)"
        } else if flags & RAM_FLAG_HOOK != 0 {
            "RDMA transfer hooks (an rdma: migration)"
        } else {
            return corrupt(format!("a page record with flags {flags:#x}"), at);
        };
        unsupported(what, at, HINT_DEFAULTS)
    }

    /// One page record: `None` at the section's end (its footer read).
    fn record(&mut self, end: bool) -> Result<Option<(usize, u64, Option<u8>)>> {
        let at = self.at;
        let word = self.be64()?;
        if word == RAM_FLAG_EOS {
            let ram = self.ram.as_ref().expect("records follow the RAM start");
            let (id, footers) = (ram.section_id, ram.footers);
            if self.footer(id)? != footers {
                let what = if footers {
                    format!("section {id} without its footer")
                } else {
                    format!("a footer after section {id}, whose stream has none")
                };
                return corrupt(what, self.at);
            }
            self.state = State::Sections;
            if end {
                self.ram_ended = true;
            }
            return Ok(None);
        }
        let (offset, flags) = split_addr(word);
        let kind = flags & !RAM_FLAG_CONTINUE;
        if kind != RAM_FLAG_ZERO && kind != RAM_FLAG_PAGE {
            return self.bad_flags(word, at);
        }
        let block = if flags & RAM_FLAG_CONTINUE != 0 {
            match self.last_block {
                Some(b) => b,
                None => return corrupt("a page record continues no block", at),
            }
        } else {
            let name = self.str8("a RAM block's name")?;
            let ram = self.ram.as_ref().expect("records follow the RAM start");
            match ram.blocks.iter().position(|b| b.name == name) {
                Some(b) => b,
                None => {
                    return corrupt(
                        format!("a page of RAM block {name:?}, which the RAM section did not list"),
                        at,
                    )
                }
            }
        };
        self.last_block = Some(block);
        let ram = self.ram.as_ref().expect("records follow the RAM start");
        let b = &ram.blocks[block];
        if offset >= b.length {
            return corrupt(
                format!(
                    "a page at {offset:#x} of RAM block {:?} of {:#x} bytes",
                    b.name, b.length
                ),
                at,
            );
        }
        self.pages += 1;
        if kind == RAM_FLAG_ZERO {
            let fill = self.u8()?;
            if fill == 0 {
                self.zero_pages += 1;
            }
            Ok(Some((block, offset, Some(fill))))
        } else {
            let mut page = std::mem::replace(&mut self.page, Box::new([0; TARGET_PAGE]));
            let r = self.fill(&mut page[..]);
            self.page = page;
            r?;
            Ok(Some((block, offset, None)))
        }
    }

    /// Everything after the RAM: the device sections, the end mark, the
    /// description.
    fn tail(&mut self, at: u64) -> Result<Tail> {
        let mut rest = Vec::new();
        let n = (&mut self.r)
            .take(MAX_TAIL as u64 + 1)
            .read_to_end(&mut rest)
            .map_err(|e| Error::Io { at, source: e })?;
        self.at += n as u64;
        if n > MAX_TAIL {
            return corrupt(
                format!("more than {} MiB of device state", MAX_TAIL >> 20),
                at,
            );
        }
        split_tail(rest).map_err(|what| Error::Corrupt { what, at })
    }
}

/// Split what follows the RAM into the device sections and the
/// description: the description is `06`, be32 length, that much JSON,
/// right after the `00` end mark; JSON never holds a raw `06` byte, so
/// the last one is its marker if the length and the JSON agree. Without a
/// description the end mark is the last byte.
fn split_tail(mut rest: Vec<u8>) -> std::result::Result<Tail, String> {
    // The marker's own length field may hold 06 bytes too: the last few
    // 06 bytes are candidates (JSON holds none).
    let candidates: Vec<usize> = rest
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, &b)| b == VM_VMDESCRIPTION)
        .map(|(q, _)| q)
        .take(5)
        .collect();
    for q in candidates {
        let len_ok = rest
            .get(q + 1..q + 5)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
            == Some(rest.len().saturating_sub(q + 5));
        if q >= 1 && rest[q - 1] == VM_EOF && len_ok {
            let json = &rest[q + 5..];
            if json.first() == Some(&b'{')
                && json.len() <= MAX_VMDESC
                && serde_json::from_slice::<serde_json::Value>(json).is_ok()
            {
                let vmdesc = json.to_vec();
                rest.truncate(q - 1);
                return Ok(Tail {
                    devices: rest,
                    vmdesc: Some(vmdesc),
                });
            }
        }
    }
    if rest.last() == Some(&VM_EOF) {
        rest.pop();
        return Ok(Tail {
            devices: rest,
            vmdesc: None,
        });
    }
    Err("the stream does not end with QEMU's end mark (truncated?)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_splits_at_the_description_or_the_end_mark() {
        let mut t = vec![4, 0, 0, 0, 7, 6, 6, 6, VM_EOF, VM_VMDESCRIPTION];
        let json = br#"{"page_size": 4096}"#;
        t.extend((json.len() as u32).to_be_bytes());
        t.extend(json);
        let s = split_tail(t).unwrap();
        assert_eq!(s.devices, vec![4, 0, 0, 0, 7, 6, 6, 6]);
        assert_eq!(s.vmdesc.as_deref(), Some(&json[..]));
        // A description whose length holds 06 bytes (0x0606 = 1542).
        let long = format!("{{\"a\": \"{}\"}}", "x".repeat(1542 - 9));
        assert_eq!(long.len(), 0x0606);
        let mut t = vec![4, 9, VM_EOF, VM_VMDESCRIPTION];
        t.extend((long.len() as u32).to_be_bytes());
        t.extend(long.as_bytes());
        let s = split_tail(t).unwrap();
        assert_eq!(s.devices, vec![4, 9]);
        assert_eq!(s.vmdesc.as_deref(), Some(long.as_bytes()));
        let s = split_tail(vec![4, 6, 0, 0, 0, 0, VM_EOF]).unwrap();
        assert_eq!(s.devices, vec![4, 6, 0, 0, 0, 0]);
        assert!(s.vmdesc.is_none());
        assert!(split_tail(vec![4, 1, 2]).is_err());
        assert!(split_tail(Vec::new()).is_err());
    }
}
