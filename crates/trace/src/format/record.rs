//! The record of the trace: what one block request was, and the names of
//! its fields in the CSV form. Every other part of the format (binary and
//! CSV codecs, errors, payload sidecar) builds on this module.

/// The CSV form's required first line (also its "magic"): the fields of a
/// [`Record`], in order.
pub const HEADER: &str = "time_ns,client,device,op,offset,len,fragment";

/// The operation of a traced request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TraceOp {
    Read,
    Write,
    Trim,
    WriteZeroes,
    /// A barrier: every earlier request of the stream completes, then the
    /// device's write cache is flushed, before any later request starts.
    Flush,
}

impl TraceOp {
    /// Every op, in code order.
    pub const ALL: [TraceOp; 5] = [
        TraceOp::Read,
        TraceOp::Write,
        TraceOp::Trim,
        TraceOp::WriteZeroes,
        TraceOp::Flush,
    ];

    /// The one-byte code of the binary format.
    pub fn code(self) -> u8 {
        match self {
            TraceOp::Read => 0,
            TraceOp::Write => 1,
            TraceOp::Trim => 2,
            TraceOp::WriteZeroes => 3,
            TraceOp::Flush => 4,
        }
    }

    /// The op for a binary code.
    pub fn from_code(c: u8) -> Option<TraceOp> {
        TraceOp::ALL.get(c as usize).copied()
    }

    /// The name used in CSV and in reports.
    pub fn name(self) -> &'static str {
        match self {
            TraceOp::Read => "read",
            TraceOp::Write => "write",
            TraceOp::Trim => "trim",
            TraceOp::WriteZeroes => "write-zeroes",
            TraceOp::Flush => "flush",
        }
    }

    /// The op for a CSV name.
    pub fn from_name(s: &str) -> Option<TraceOp> {
        TraceOp::ALL.into_iter().find(|o| o.name() == s)
    }

    /// Whether the op changes the device's contents.
    pub fn is_write_like(self) -> bool {
        matches!(self, TraceOp::Write | TraceOp::Trim | TraceOp::WriteZeroes)
    }
}

impl std::fmt::Display for TraceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One block request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    /// Issue time in nanoseconds since the start of the trace.
    pub time_ns: u64,
    /// The client (VM, connection) that issued it.
    pub client: u32,
    /// The device or partition it addressed.
    pub device: u32,
    pub op: TraceOp,
    /// Byte offset within the device (0 for a flush).
    pub offset: u64,
    /// Length in bytes (0 for a flush).
    pub len: u32,
    /// Index of this piece when one logical request was split into several
    /// (LBS Table 4's "fragment"); 0 for an unsplit request.
    pub fragment: u16,
}

impl Record {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len as u64)
    }
}
