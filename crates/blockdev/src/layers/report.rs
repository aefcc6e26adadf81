//! A layer's `report=FILE` option (`hdd`, `cache`, `flashsim`): its
//! counters as one line of JSON, rewritten at every flush and at close.

use std::path::Path;

use serde::Serialize;

use crate::durable;

/// When a layer rewrites its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportAt {
    /// At a flush: on the I/O path, so for readers only
    /// ([`durable::write_unsynced`]: no `fsync`).
    Flush,
    /// At close: crash-safely ([`durable::write_atomically`]), so the last
    /// report survives a power cut.
    Close,
}

/// Write `report` to `path` as one line of JSON. A failure is logged and
/// the layer goes on: a report is never worth failing I/O for.
pub fn write_report(layer: &str, path: &Path, report: &impl Serialize, at: ReportAt) {
    let text = serde_json::to_string(report).unwrap_or_default() + "\n";
    let r = match at {
        ReportAt::Flush => durable::write_unsynced(path, text.as_bytes()),
        ReportAt::Close => durable::write_atomically(path, text.as_bytes()),
    };
    if let Err(e) = r {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the {layer} report");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_one_json_line_and_leave_no_temporary() {
        let (d, p) = crate::testkit::scratch("r.json");
        write_report("t", &p, &serde_json::json!({"n": 1}), ReportAt::Flush);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"n\":1}\n");
        write_report("t", &p, &serde_json::json!({"n": 2}), ReportAt::Close);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"n\":2}\n");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
