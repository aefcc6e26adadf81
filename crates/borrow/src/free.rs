//! Every free extent of every partition of some disks, before any size
//! filter: exactly what each file system's allocation map says is free
//! (`roamdisk borrow free`). The disks are only read.

use std::path::{Path, PathBuf};

use roamdisk_blockdev::layers::raw::RawDev;
use roamdisk_blockdev::Error;
use roamdisk_fsmeta as fsmeta;

/// One partition's free space, or why it could not be read.
#[derive(Debug)]
pub struct PartitionFree {
    /// The disk it is on.
    pub device: PathBuf,
    pub partition: fsmeta::Partition,
    pub free: Result<fsmeta::FreeSpace, Error>,
}

/// Why the disks could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum FreeError {
    /// A disk does not open.
    #[error(transparent)]
    Open(#[from] Error),
    /// A disk's partition table does not read.
    #[error("cannot read the partition table of {}", .path.display())]
    Table {
        path: PathBuf,
        #[source]
        source: Box<Error>,
    },
}

/// The free space of every partition of `devices`, disk by disk, in
/// partition-table order.
pub fn list_free(devices: &[impl AsRef<Path>]) -> Result<Vec<PartitionFree>, FreeError> {
    let mut out = Vec::new();
    for path in devices {
        let path = path.as_ref();
        let dev = RawDev::open(path, true)?;
        let table = fsmeta::read_table(&dev).map_err(|e| FreeError::Table {
            path: path.to_path_buf(),
            source: Box::new(e),
        })?;
        for p in table.partitions {
            out.push(PartitionFree {
                device: path.to_path_buf(),
                free: fsmeta::free_space(&dev, p.start, p.len),
                partition: p,
            });
        }
    }
    Ok(out)
}
