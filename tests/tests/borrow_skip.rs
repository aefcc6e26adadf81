//! Every partition that must not be borrowed from is skipped with the
//! right reason (ext4 with errors, not clean, needs_recovery with a real
//! journal transaction, a journal holding transactions with the flag
//! cleared, NTFS dirty, NTFS hibernated, NTFS fast startup, hibernated
//! swap, unformatted space), no plan extent touches it, and everything
//! else in the corpus is used. `--min-size` failures say how much was
//! found and where.

mod borrow_common;
mod common;

use borrow_common::*;

#[test]
fn each_variant_is_skipped_with_its_reason_and_no_extent_touches_it() {
    let tmp = common::tempdir();
    let c = corpus(&tmp.path().join("corpus"));
    let plan = tmp.path().join("plan.json");
    let summary = c.scan_all(&plan);
    let parts = plan_partitions(&plan);
    let extents = plan_extents(&plan);
    let mut skipped = 0;
    for row in &c.rows {
        let img = c.disk(&row.disk).to_str().unwrap().to_string();
        let (fs, status, reason, borrowed) = parts
            .get(&(img.clone(), row.part))
            .unwrap_or_else(|| panic!("{} partition {} missing from the plan", row.disk, row.part));
        assert_eq!(fs, &row.fs, "{}: file system", row.name);
        let (start, len) = layout(&c.disk(&row.disk))[&row.part];
        let inside: Vec<_> = extents
            .iter()
            .filter(|(d, off, l)| *d == img && *off < start + len && off + l > start)
            .collect();
        if row.used {
            assert_eq!(status, "used", "{}: {reason}", row.name);
            assert!(
                *borrowed > 0 && !inside.is_empty(),
                "{}: used but nothing borrowed",
                row.name
            );
            for (_, off, l) in inside {
                assert!(
                    *off >= start && off + l <= start + len,
                    "{}: extent crosses the partition",
                    row.name
                );
            }
        } else {
            skipped += 1;
            assert_eq!(status, "skipped", "{}", row.name);
            assert_eq!(reason, &row.reason, "{}: skip reason", row.name);
            assert_eq!(*borrowed, 0, "{}", row.name);
            assert!(
                inside.is_empty(),
                "{}: skipped but extents {inside:?} lie in it",
                row.name
            );
            assert!(
                summary.contains(&row.reason),
                "the summary names reason {}",
                row.reason
            );
        }
    }
    assert_eq!(skipped, 9, "the corpus has nine skip variants");

    // Too little space: the error says how much was found and where.
    let out = common::roamdisk(&[
        "borrow",
        "scan",
        c.disk("mbr").to_str().unwrap(),
        "--min-size",
        "1G",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("found only") && err.contains("1 GiB are needed"),
        "{err}"
    );
    assert!(
        err.contains("mbr.img #10 ext4") && err.contains("mbr.img #7 ntfs (hibernated)"),
        "{err}"
    );
}
