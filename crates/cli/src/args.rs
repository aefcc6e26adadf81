//! Option-value grammars several commands share (sizes, durations and
//! rates are `roamdisk_blockdev::units`).

use anyhow::Context;

/// The items of a comma-separated list, trimmed, empty ones skipped,
/// each parsed by `f`.
pub fn list<T>(s: &str, f: impl Fn(&str) -> anyhow::Result<T>) -> anyhow::Result<Vec<T>> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(f)
        .collect()
}

/// One `DEVICE=VALUE` item of option `flag` (`what` names VALUE in the
/// error): the device number and the value as given.
pub fn device_pair(kv: &str, flag: &str, what: &str) -> anyhow::Result<(u32, String)> {
    let (k, v) = kv
        .split_once('=')
        .with_context(|| format!("{flag}: '{kv}' is not DEVICE={what}"))?;
    let d: u32 = k
        .trim()
        .parse()
        .with_context(|| format!("{flag}: '{k}' is not a device number"))?;
    Ok((d, v.to_string()))
}

/// A chunk size argument (`64K`): a power of two from 4 KiB to 4 MiB.
pub fn chunk_size(s: &str) -> anyhow::Result<u32> {
    let n = roamdisk_blockdev::units::parse_size(s).map_err(anyhow::Error::msg)?;
    match u32::try_from(n) {
        Ok(c) if roamdisk_chunkstore::index::valid_chunk_size(c) => Ok(c),
        _ => anyhow::bail!("chunk size {s}: a power of two from 4K to 4M"),
    }
}
