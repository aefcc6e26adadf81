//! MSR-Cambridge CSV (SNIA IOTTA "MSR Cambridge Traces") → trace records.
//!
//! Each line is `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`
//! with no header: Timestamp and ResponseTime in Windows file-time units
//! (100 ns), Type `Read` or `Write`, Offset and Size in bytes. The time
//! becomes nanoseconds since the first line (or since 1601 with
//! `absolute_time`), the host name a client id (in order of first
//! appearance), DiskNumber the device. ResponseTime has no field in a
//! trace record and is dropped.

use std::collections::HashMap;
use std::io::BufRead;

use super::{bad_line, ConvertReport, Sink};
use crate::format::{Record, TraceError, TraceOp};

/// Options of the MSR converter.
#[derive(Debug, Clone, Default)]
pub struct MsrOptions {
    /// Keep absolute times (ns since 1601-01-01) instead of times since
    /// the first line.
    pub absolute_time: bool,
}

/// Convert MSR-Cambridge CSV.
pub fn convert(
    input: impl BufRead,
    opts: &MsrOptions,
    sink: Sink<'_>,
) -> Result<ConvertReport, TraceError> {
    let mut rep = ConvertReport::default();
    let mut hosts: HashMap<String, u32> = HashMap::new();
    let mut t0: Option<u64> = None;
    for line in input.lines() {
        let line = line.map_err(|e| TraceError::io(e, None))?;
        rep.lines += 1;
        let n = rep.lines;
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with("Timestamp") {
            rep.skipped += 1;
            continue;
        }
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        if f.len() != 7 {
            return Err(bad_line(
                n,
                format!(
                    "{} fields; MSR lines have 7: Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime",
                    f.len()
                ),
            ));
        }
        let num = |i: usize, what: &str| -> Result<u64, TraceError> {
            f[i].parse::<u64>()
                .map_err(|_| bad_line(n, format!("{what} '{}' is not a whole number", f[i])))
        };
        let ts = num(0, "Timestamp")?;
        let disk = u32::try_from(num(2, "DiskNumber")?)
            .map_err(|_| bad_line(n, "DiskNumber too large".into()))?;
        let op = match f[3].to_ascii_lowercase().as_str() {
            "read" => TraceOp::Read,
            "write" => TraceOp::Write,
            _ => {
                return Err(bad_line(
                    n,
                    format!("Type '{}' is neither Read nor Write", f[3]),
                ))
            }
        };
        let offset = num(4, "Offset")?;
        let size =
            u32::try_from(num(5, "Size")?).map_err(|_| bad_line(n, "Size above 4 GiB".into()))?;
        num(6, "ResponseTime")?;
        let base = if opts.absolute_time {
            0
        } else {
            *t0.get_or_insert(ts)
        };
        let time_ns = ts
            .checked_sub(base)
            .ok_or_else(|| bad_line(n, "Timestamp earlier than the first line's".into()))?
            .checked_mul(100)
            .ok_or_else(|| bad_line(n, "Timestamp too large".into()))?;
        let next_id = hosts.len() as u32;
        let client = *hosts.entry(f[1].to_string()).or_insert_with(|| {
            rep.clients.push(f[1].to_string());
            next_id
        });
        sink(&Record {
            time_ns,
            client,
            device: disk,
            op,
            offset,
            len: size,
            fragment: 0,
        })?;
        rep.records += 1;
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msr_lines_become_records() {
        let text = "128166372003061629,usr,0,Read,7014609920,24576,41286\n\
                    128166372016853766,src1,2,Write,1541570560,4096,8242\n\
                    128166372026382522,usr,1,write,2000,512,100\n";
        let mut v = Vec::new();
        let rep = convert(
            text.as_bytes(),
            &MsrOptions::default(),
            &mut |r: &Record| {
                v.push(*r);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(rep.clients, vec!["usr", "src1"]);
        assert_eq!(v[0].time_ns, 0);
        assert_eq!(
            v[1].time_ns,
            (128166372016853766 - 128166372003061629) * 100
        );
        assert_eq!(
            (v[1].client, v[1].device, v[1].op, v[1].offset, v[1].len),
            (1, 2, TraceOp::Write, 1541570560, 4096)
        );
        assert_eq!((v[2].client, v[2].device), (0, 1));
    }

    #[test]
    fn bad_lines_are_errors() {
        for (text, want) in [
            ("1,usr,0,Read,0,512\n", "have 7"),
            ("1,usr,0,Erase,0,512,1\n", "neither Read nor Write"),
            ("x,usr,0,Read,0,512,1\n", "Timestamp"),
            ("5,usr,0,Read,0,512,1\n4,usr,0,Read,0,512,1\n", "earlier"),
            ("1,usr,0,Read,0,99999999999,1\n", "Size"),
        ] {
            let e = convert(
                text.as_bytes(),
                &MsrOptions::default(),
                &mut |_: &Record| Ok(()),
            )
            .unwrap_err();
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
    }
}
