//! The borrow plan file (`docs/formats/borrow-plan.md`):
//! `roamdisk_borrow::Plan::from_json` on arbitrary text, then what the
//! CLI does with a loaded plan (`summary`, `dm_table`).
//!
//! Checks: a plan that loads is valid (`validate`), round-trips through
//! `to_json`, its extents add up to `total_bytes` and lie in used
//! partitions inside their devices; `summary` and `dm_table` do not
//! panic, and the device-mapper table has one line per extent whose
//! lengths add up to the plan's size in 512-byte sectors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_blockdev::ErrorKind;
use roamdisk_borrow::{Plan, Status, UNIT};
use roamdisk_fuzz::parse_text;

fuzz_target!(|data: &[u8]| {
    let Some(plan) = parse_text(data, ErrorKind::InvalidArgument, Plan::from_json) else {
        return;
    };
    plan.validate().expect("a loaded plan is valid");
    let json = plan.to_json();
    assert_eq!(Plan::from_json(&json).expect("to_json output loads"), plan);
    let mut total = 0u64;
    for e in &plan.extents {
        assert!(e.len > 0 && e.offset % UNIT == 0 && e.len % UNIT == 0);
        let p = plan
            .partitions
            .iter()
            .find(|p| p.device == e.device && p.number == e.partition)
            .expect("extent in a listed partition");
        assert_eq!(p.status, Status::Used);
        assert!(e.offset >= p.start && e.offset + e.len <= p.start + p.len);
        assert!(p.start + p.len <= plan.devices[p.device as usize].size);
        total += e.len;
    }
    assert_eq!(total, plan.total_bytes);
    let _ = plan.summary();
    let dm = plan.dm_table();
    // A device path with a newline would split its table line.
    if plan
        .devices
        .iter()
        .any(|d| d.path.to_string_lossy().contains('\n'))
    {
        return;
    }
    let mut sectors = 0u64;
    let mut lines = 0usize;
    for l in dm.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        assert!(f.len() >= 5 && f[2] == "linear", "{l}");
        assert_eq!(f[0].parse::<u64>().unwrap(), sectors, "{l}");
        sectors += f[1].parse::<u64>().unwrap();
        lines += 1;
    }
    assert_eq!(lines, plan.extents.len());
    assert_eq!(sectors * 512, plan.total_bytes);
});
