//! The return path: what a destination sends its source on the same
//! socket (page requests, the end, recovery's bitmaps), read defensively
//! — a wrong length or an unknown message is an error, never a panic
//! (fuzz target `migration_return_path`).

use std::io::Read;

use crate::error::{Error, Result};
use crate::proto::*;

/// The largest received-pages bitmap accepted (a 2 TiB block).
pub const MAX_BITMAP: u64 = 64 << 20;

/// One message from the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RpMessage {
    /// The destination is done (0) or failed (1); nothing follows.
    Shut(u32),
    Pong(u32),
    /// A host page wanted now: the block (named in this request or an
    /// earlier one), its byte offset and length.
    ReqPages {
        block: String,
        start: u64,
        len: u32,
    },
    /// Recovery: the pages of `block` the destination holds, one bit per
    /// target page, little-endian.
    RecvBitmap {
        block: String,
        bitmap: Vec<u8>,
    },
    ResumeAck(u32),
    SwitchoverAck,
}

/// Messages read off a return path.
pub struct RpReader<R: Read> {
    r: R,
    at: u64,
    last_block: Option<String>,
}

fn corrupt<T>(what: impl Into<String>, at: u64) -> Result<T> {
    Err(Error::Corrupt {
        what: format!("return path: {}", what.into()),
        at,
    })
}

impl<R: Read> RpReader<R> {
    pub fn new(r: R) -> RpReader<R> {
        RpReader {
            r,
            at: 0,
            last_block: None,
        }
    }

    /// Bytes read so far.
    pub fn position(&self) -> u64 {
        self.at
    }

    /// Read `buf` whole: `Ok(false)` if the stream ended before its first
    /// byte and `eof_ok`.
    fn fill(&mut self, buf: &mut [u8], eof_ok: bool) -> Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) if got == 0 && eof_ok => return Ok(false),
                Ok(0) => return corrupt("the destination closed it within a message", self.at),
                Ok(n) => {
                    got += n;
                    self.at += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(Error::Io {
                        at: self.at,
                        source: e,
                    })
                }
            }
        }
        Ok(true)
    }

    /// The next message; `None` when the destination closed the path
    /// between messages.
    pub fn read(&mut self) -> Result<Option<RpMessage>> {
        let at = self.at;
        let mut h = [0u8; 4];
        if !self.fill(&mut h, true)? {
            return Ok(None);
        }
        let kind = u16::from_be_bytes([h[0], h[1]]);
        let len = u16::from_be_bytes([h[2], h[3]]) as usize;
        let mut d = vec![0u8; len];
        self.fill(&mut d, false)?;
        let be32 = |d: &[u8]| u32::from_be_bytes(d[..4].try_into().expect("4 bytes"));
        let fixed = |want: usize| -> Result<()> {
            if len != want {
                return corrupt(format!("message {kind} of {len} bytes, not {want}"), at);
            }
            Ok(())
        };
        Ok(Some(match kind {
            RP_SHUT => {
                fixed(4)?;
                RpMessage::Shut(be32(&d))
            }
            RP_PONG => {
                fixed(4)?;
                RpMessage::Pong(be32(&d))
            }
            RP_RESUME_ACK => {
                fixed(4)?;
                RpMessage::ResumeAck(be32(&d))
            }
            RP_SWITCHOVER_ACK => {
                fixed(0)?;
                RpMessage::SwitchoverAck
            }
            RP_REQ_PAGES | RP_REQ_PAGES_ID => {
                if len < 12 {
                    return corrupt(format!("a page request of {len} bytes"), at);
                }
                let start = u64::from_be_bytes(d[..8].try_into().expect("8 bytes"));
                let plen = be32(&d[8..]);
                if kind == RP_REQ_PAGES_ID {
                    let n = *d.get(12).unwrap_or(&0) as usize;
                    if n == 0 || len != 13 + n {
                        return corrupt(
                            format!("a page request naming a block in {len} bytes"),
                            at,
                        );
                    }
                    self.last_block = Some(String::from_utf8_lossy(&d[13..]).into_owned());
                } else {
                    fixed(12)?;
                }
                let Some(block) = self.last_block.clone() else {
                    return corrupt("a page request of no block", at);
                };
                RpMessage::ReqPages {
                    block,
                    start,
                    len: plen,
                }
            }
            RP_RECV_BITMAP => {
                let n = *d.first().unwrap_or(&0) as usize;
                if n == 0 || len != 1 + n {
                    return corrupt(format!("a bitmap header of {len} bytes"), at);
                }
                let block = String::from_utf8_lossy(&d[1..]).into_owned();
                let mut w = [0u8; 8];
                self.fill(&mut w, false)?;
                let size = u64::from_be_bytes(w);
                if size > MAX_BITMAP || size % 8 != 0 {
                    return corrupt(format!("a bitmap of {size} bytes for {block:?}"), at);
                }
                let mut bitmap = vec![0u8; size as usize];
                self.fill(&mut bitmap, false)?;
                self.fill(&mut w, false)?;
                if u64::from_be_bytes(w) != RECV_BITMAP_ENDING {
                    return corrupt(format!("the bitmap of {block:?} without its end mark"), at);
                }
                RpMessage::RecvBitmap { block, bitmap }
            }
            other => return corrupt(format!("an unknown message type {other}"), at),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write;

    #[test]
    fn messages_read_back_as_written() {
        let mut b = Vec::new();
        write::rp_request(&mut b, Some("pc.ram"), 0xca000, 4096);
        write::rp_request(&mut b, None, 0x1000, 4096);
        write::rp_recv_bitmap(&mut b, "pc.rom", &[0xff; 16]);
        write::rp_resume_ack(&mut b);
        write::rp_shut(&mut b, 0);
        let mut r = RpReader::new(&b[..]);
        assert_eq!(
            r.read().unwrap(),
            Some(RpMessage::ReqPages {
                block: "pc.ram".into(),
                start: 0xca000,
                len: 4096
            })
        );
        assert_eq!(
            r.read().unwrap(),
            Some(RpMessage::ReqPages {
                block: "pc.ram".into(),
                start: 0x1000,
                len: 4096
            })
        );
        assert_eq!(
            r.read().unwrap(),
            Some(RpMessage::RecvBitmap {
                block: "pc.rom".into(),
                bitmap: vec![0xff; 16]
            })
        );
        assert_eq!(r.read().unwrap(), Some(RpMessage::ResumeAck(1)));
        assert_eq!(r.read().unwrap(), Some(RpMessage::Shut(0)));
        assert_eq!(r.read().unwrap(), None);
    }

    #[test]
    fn a_request_of_no_block_and_truncations_are_errors() {
        let mut b = Vec::new();
        write::rp_request(&mut b, None, 0, 4096);
        assert!(RpReader::new(&b[..]).read().is_err());
        let mut b = Vec::new();
        write::rp_request(&mut b, Some("pc.ram"), 0, 4096);
        for cut in 1..b.len() {
            assert!(RpReader::new(&b[..cut]).read().is_err(), "cut at {cut}");
        }
        assert!(RpReader::new(&[0u8, 9, 0, 0][..]).read().is_err());
    }
}
