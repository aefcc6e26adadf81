//! `flashsim:PARAMS:NEXT` — an SD-card model layered over any stack: data
//! goes to NEXT unchanged, and every request is charged the time the
//! modelled card would take ([`model`]). The simulated elapsed time is
//! reported in the log, in an optional JSON report file, and to in-process
//! tools (`roamdisk sperf`, `roamdisk replay`), so the seed's SD-card
//! experiments run without an SD card.

pub mod model;

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use roamdisk_blockdev::layers::report::{write_report, ReportAt};
use roamdisk_blockdev::{
    BlockDev, Error, ErrorKind, Extent, LayerKind, Op, OpenCtx, Result, WriteFlags, ZeroFlags,
};

pub use model::{FlashModel, FlashParams, FlashStats, ParamsError};

/// Options of the layer besides the card's parameters.
#[derive(Debug, Clone, Default)]
pub struct FlashSimOptions {
    /// Sleep for each request's simulated time, so outside clients see the
    /// card's speed in wall-clock time.
    pub sleep: bool,
    /// Write the statistics as JSON to this file at every flush and when
    /// the stack is closed.
    pub report: Option<PathBuf>,
}

/// The flashsim layer.
pub struct FlashSimDev {
    next: Arc<dyn BlockDev>,
    model: Mutex<FlashModel>,
    opts: FlashSimOptions,
}

impl FlashSimDev {
    pub fn new(
        next: Arc<dyn BlockDev>,
        params: FlashParams,
        opts: FlashSimOptions,
    ) -> Result<Self> {
        let model = FlashModel::new(params, next.size()).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                "flashsim",
                e.to_string(),
            )
        })?;
        Ok(FlashSimDev {
            next,
            model: Mutex::new(model),
            opts,
        })
    }

    /// Statistics so far, the simulated elapsed time among them.
    pub fn stats(&self) -> FlashStats {
        self.model.lock().stats().clone()
    }

    /// The card's parameters.
    pub fn params(&self) -> FlashParams {
        self.model.lock().params().clone()
    }

    fn charge(&self, f: impl FnOnce(&mut FlashModel) -> u64) {
        let ns = f(&mut self.model.lock());
        if self.opts.sleep && ns > 0 {
            std::thread::sleep(Duration::from_nanos(ns));
        }
    }

    fn write_report(&self, at: ReportAt) {
        if let Some(path) = &self.opts.report {
            let report = serde_json::json!({
                "params": self.params(),
                "stats": self.stats(),
            });
            write_report("flashsim", path, &report, at);
        }
    }
}

impl Drop for FlashSimDev {
    fn drop(&mut self) {
        let s = self.stats();
        tracing::info!(
            simulated_s = s.elapsed_ns as f64 / 1e9,
            reads = s.reads,
            writes = s.writes,
            copied_mib = s.bytes_copied as f64 / 1048576.0,
            "flashsim: simulated card time"
        );
        self.write_report(ReportAt::Close);
    }
}

impl BlockDev for FlashSimDev {
    roamdisk_blockdev::layer!("flashsim", next);
    fn describe(&self) -> String {
        let p = self.params();
        format!(
            "flashsim: AU {} KiB, page {} KiB, {} open unit(s), write {:.1} MB/s, read {:.1} MB/s{}",
            p.au >> 10,
            p.page >> 10,
            p.open_units,
            p.write_rate / 1e6,
            p.read_rate / 1e6,
            if self.opts.sleep { ", real time" } else { "" }
        )
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.charge(|m| m.read(off, buf.len() as u64));
        self.next.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.charge(|m| m.write(off, buf.len() as u64));
        self.next.write_at(buf, off, flags)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.charge(|m| m.write(off, len));
        self.next.write_zeroes(off, len, flags)
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.charge(|m| m.trim(off, len));
        self.next.trim(off, len, flags)
    }
    fn flush(&self) -> Result<()> {
        self.charge(|m| m.flush());
        let r = self.next.flush();
        self.write_report(ReportAt::Flush);
        r
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        self.next.block_status(off, len)
    }
}

/// Parse `PRESET[,KEY=VALUE...]` or `KEY=VALUE,...` (starting from
/// `class6`). Keys: au, page (sizes), open, read-cmd, write-cmd, erase,
/// flush, trim (microseconds), read-rate, write-rate, copy-rate (MB/s),
/// fresh (on/off).
pub fn parse_params(s: &str) -> std::result::Result<FlashParams, ParamsError> {
    let mut parts = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .peekable();
    let mut p = match parts.peek() {
        Some(first) if !first.contains('=') => {
            let name = parts.next().expect("peeked");
            FlashParams::preset(name).ok_or_else(|| ParamsError::Preset(name.to_string()))?
        }
        _ => FlashParams::class6(),
    };
    for kv in parts {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| ParamsError::NotKeyValue(kv.to_string()))?;
        let size = || {
            roamdisk_blockdev::units::parse_size(v).map_err(|error| ParamsError::Size {
                key: k.to_string(),
                error,
            })
        };
        let num = || {
            v.parse::<f64>().map_err(|_| ParamsError::Number {
                key: k.to_string(),
                value: v.to_string(),
            })
        };
        let us = || num().map(|x| (x * 1000.0) as u64);
        match k {
            "au" => p.au = size()?,
            "page" => p.page = size()?,
            "open" => p.open_units = v.parse().map_err(|_| ParamsError::Count(v.to_string()))?,
            "read-cmd" => p.read_cmd_ns = us()?,
            "write-cmd" => p.write_cmd_ns = us()?,
            "erase" => p.erase_ns = us()?,
            "flush" => p.flush_ns = us()?,
            "trim" => p.trim_ns = us()?,
            "read-rate" => p.read_rate = num()? * 1e6,
            "write-rate" => p.write_rate = num()? * 1e6,
            "copy-rate" => p.copy_rate = num()? * 1e6,
            "fresh" => {
                p.fresh = roamdisk_blockdev::spec::parse_on_off(v)
                    .ok_or_else(|| ParamsError::Fresh(v.to_string()))?
            }
            _ => return Err(ParamsError::Unknown(k.to_string())),
        }
    }
    p.validate()?;
    Ok(p)
}

/// Open a flashsim layer from its spec parameters (used by the registry
/// and by tools that want the layer's clock).
pub fn open(
    params: &std::collections::BTreeMap<String, String>,
    next: Arc<dyn BlockDev>,
) -> Result<Arc<FlashSimDev>> {
    let bad = |m: String| Error::new(ErrorKind::InvalidArgument, Op::Open, "flashsim", m);
    let card = params.get("params").map(String::as_str).unwrap_or("class6");
    let p = parse_params(card).map_err(|e| bad(e.to_string()))?;
    let sleep = match params.get("sleep").map(String::as_str) {
        None => false,
        Some(o) => roamdisk_blockdev::spec::parse_on_off(o)
            .ok_or_else(|| bad(format!("sleep must be on or off, not '{o}'")))?,
    };
    let report = params.get("report").map(|r| Path::new(r).to_path_buf());
    Ok(Arc::new(FlashSimDev::new(
        next,
        p,
        FlashSimOptions { sleep, report },
    )?))
}

/// `flashsim[sleep=on,report=FILE]:PARAMS:NEXT`.
pub static FLASHSIM: LayerKind = LayerKind {
    name: "flashsim",
    summary: "an SD-card model over NEXT: charges each request the simulated card time (PARAMS: class6, class4, class10[,key=value...])",
    args: &["params"],
    options: &[
        ("sleep", "on: sleep for the simulated time, so clients see the card's speed (default off)"),
        ("report", "write the simulated time and counters as JSON to this file at each flush and at close"),
    ],
    open: |ctx: &OpenCtx<'_>, next| {
        let next = ctx.inner("flashsim", next)?;
        Ok(open(ctx.params, next)? as Arc<dyn BlockDev>)
    },
    ..LayerKind::WRAPPING
};

#[cfg(test)]
mod tests {
    use super::*;
    use roamdisk_blockdev::Access;
    use roamdisk_blockdev::Registry;

    #[test]
    fn params_parse_with_presets_and_overrides() {
        let p = parse_params("class4,open=3,au=8M,write-rate=6.5,fresh=on").unwrap();
        assert_eq!((p.open_units, p.au, p.fresh), (3, 8 << 20, true));
        assert_eq!(p.write_rate, 6.5e6);
        assert_eq!(parse_params("").unwrap(), FlashParams::class6());
        assert_eq!(parse_params("open=2").unwrap().open_units, 2);
        for (bad, want) in [
            ("class99", "unknown card preset"),
            ("bogus=1", "unknown parameter"),
            ("open=0", "open must be"),
            ("au=3M,page=2M", "multiple of page"),
            ("write-rate=x", "not a number"),
        ] {
            let e = parse_params(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn the_layer_passes_data_through_and_reports_time() {
        let (_dir, report) = roamdisk_blockdev::testkit::scratch("card.json");
        let mut reg = Registry::with_builtin();
        reg.add(&FLASHSIM);
        let dev = reg
            .build(
                &format!("flashsim[report={}]:class6:mem:64M", report.display()),
                Access::ReadWrite,
            )
            .unwrap();
        dev.write_at(&[7u8; 4096], 1 << 20, WriteFlags::default())
            .unwrap();
        let mut b = [0u8; 4096];
        dev.read_at(&mut b, 1 << 20).unwrap();
        assert_eq!(b, [7u8; 4096]);
        dev.flush().unwrap();
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(j["stats"]["writes"], 1);
        assert!(j["stats"]["elapsed_ns"].as_u64().unwrap() > 1_000_000);
    }
}
