//! In-memory images on crash-simulating storage, for tests and fuzzing.

use std::sync::Arc;

use roamdisk_blockdev::testkit::{Countdown, CrashDev, Rng};
use roamdisk_blockdev::{BlockDev, Result};

use crate::create::{plan, CreateOptions};
use crate::format::MetaHeader;
use crate::image::{Lbs, LbsOptions};
use crate::storage::CrashLog;

/// An image whose data device and log live in memory and can crash.
pub struct MemImage {
    pub data: Arc<CrashDev>,
    pub log: CrashLog,
    pub key: Option<[u8; 64]>,
    pub header: MetaHeader,
}

impl MemImage {
    /// A freshly created image.
    pub fn new(o: &CreateOptions, countdown: Arc<Countdown>) -> MemImage {
        let (header, ds, key) = plan(o).expect("valid options");
        let mut img = vec![0u8; header.geometry.data_file_len() as usize];
        let sb = ds.encode();
        img[..sb.len()].copy_from_slice(&sb);
        MemImage {
            data: Arc::new(CrashDev::from_image(img, countdown.clone())),
            log: CrashLog::new(header.encode(), countdown),
            key,
            header,
        }
    }

    /// Open the image (the handles share this image's storage).
    pub fn open(&self, opts: LbsOptions) -> Result<Lbs> {
        Lbs::open(
            self.data.clone() as Arc<dyn BlockDev>,
            Box::new(self.log.clone()),
            self.key,
            opts,
        )
    }

    /// The image a power loss would leave, on fresh storage counted by
    /// `countdown`.
    pub fn after_crash(&self, rng: &mut Rng, countdown: Arc<Countdown>) -> MemImage {
        MemImage {
            data: Arc::new(CrashDev::from_image(
                self.data.crash_image(rng),
                countdown.clone(),
            )),
            log: CrashLog::new(self.log.crash_image(rng), countdown),
            key: self.key,
            header: self.header.clone(),
        }
    }

    /// The current data-file bytes (for attack tests).
    pub fn data_bytes(&self) -> Vec<u8> {
        self.data.live()
    }
}
