//! What a probe says of a volume: its kind ([`FsKind`]), the read-only
//! safety verdict ([`Health`], [`Reason`]) and the facts found
//! ([`Probe`]). Each parser fills these in; [`crate::probe`] dispatches
//! to the parsers and sits above them.

use serde::{Serialize, Serializer};

use crate::bytes::hex;

/// The file systems this crate reads free space from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    Ext2,
    Ext3,
    Ext4,
    Ntfs,
    Swap,
    /// Anything else: see [`Probe::type_name`].
    Unsupported,
}

/// Why a volume is not safe to borrow from (or to trust the free map of).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// ext: `s_state` lacks VALID_FS, or the orphan file is marked present.
    NotClean,
    /// ext: ERROR_FS in `s_state` or a nonzero error count.
    ErrorsRecorded,
    /// ext: the journal must be replayed (needs_recovery flag or a journal
    /// with transactions).
    NeedsRecovery,
    /// ext: multi-mount protection says the volume is in use.
    MmpInUse,
    /// NTFS: the volume's dirty flag (or chkdsk-underway) is set.
    Dirty,
    /// NTFS `hiberfil.sys` or a Linux swap area holds a hibernation image.
    Hibernated,
    /// NTFS: `$LogFile` shows the volume was left mounted (Windows fast
    /// startup / hybrid shutdown).
    FastStartup,
    /// Not a file system this crate reads (its type is named), or a feature
    /// it does not understand.
    Unsupported,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotClean => "not-clean",
            Reason::ErrorsRecorded => "errors-recorded",
            Reason::NeedsRecovery => "needs-recovery",
            Reason::MmpInUse => "mmp-in-use",
            Reason::Dirty => "dirty",
            Reason::Hibernated => "hibernated",
            Reason::FastStartup => "fast-startup",
            Reason::Unsupported => "unsupported",
        }
    }
}

/// The read-only safety check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Health {
    /// Cleanly unmounted, no errors, nothing to replay, not hibernated:
    /// the free map on disk is the truth.
    Clean,
    /// Not safe; the free map may be stale or the free blocks may hold
    /// state the owner needs (a hibernation image).
    Unsafe { reason: Reason, detail: String },
}

impl Health {
    pub fn is_clean(&self) -> bool {
        matches!(self, Health::Clean)
    }
    pub(crate) fn unsafe_(reason: Reason, detail: impl Into<String>) -> Health {
        Health::Unsafe {
            reason,
            detail: detail.into(),
        }
    }
}

/// What a byte range holds.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub kind: FsKind,
    /// `ext4`, `ntfs`, `swap`, or for unsupported ones the name of the
    /// signature found (`vfat`, `xfs`, `LVM2_member`, ...), `empty` (all
    /// zero start) or `unknown`.
    pub type_name: String,
    pub uuid: Option<String>,
    pub label: Option<String>,
    /// Allocation unit in bytes (ext cluster, NTFS cluster, swap page);
    /// 0 when unsupported.
    pub unit: u64,
    /// Bytes of the range the file system covers.
    pub fs_bytes: u64,
    pub health: Health,
    /// Facts worth showing (features, page size, hibernation header...).
    pub notes: Vec<String>,
    /// SHA-256 over the volume's identifying metadata (ext superblock;
    /// NTFS boot sector, `$Volume` record and `$LogFile` restart pages;
    /// swap header page): changes when the host mounts or writes it.
    #[serde(serialize_with = "ser_hex")]
    pub identity: [u8; 32],
}

fn ser_hex<S: Serializer>(v: &[u8; 32], s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&hex(v))
}

impl Probe {
    pub fn supported(&self) -> bool {
        self.kind != FsKind::Unsupported
    }

    pub(crate) fn unsupported(type_name: &str, detail: String, identity: [u8; 32]) -> Probe {
        Probe {
            kind: FsKind::Unsupported,
            type_name: type_name.to_string(),
            uuid: None,
            label: None,
            unit: 0,
            fs_bytes: 0,
            health: Health::unsafe_(Reason::Unsupported, detail),
            notes: Vec::new(),
            identity,
        }
    }
}
