//! The free space roamdisk finds in every partition of the corpus is
//! exactly what the real tools see, before any size filter: dumpe2fs's
//! per-group free lists and e2freefrag's count for ext2/3/4 (every layout:
//! 1 KiB blocks with first data block 1, 64 KiB blocks, 64bit without
//! flex_bg, meta_bg, bigalloc, uninit_bg, no sparse_super,
//! sparse_super2), `$Bitmap` read with ntfscat and ntfsinfo's free count
//! for NTFS, mkswap's size for swap; hibernated swap and unformatted
//! space yield nothing.

mod borrow_common;
mod common;

use borrow_common::*;

/// Our free extents REL of partition NAME against a tool's view (its free
/// extents, its count of free units, the unit's size): the same extents
/// (`WHAT differ from TOOL`) and the same total (`free total differs from
/// COUNTER`).
fn assert_same_free(
    name: &str,
    rel: &[(u64, u64)],
    (tool, free_units, unit): (Vec<(u64, u64)>, u64, u64),
    [what, tool_name, counter]: [&str; 3],
) {
    assert_eq!(rel, tool, "{name}: {what} differ from {tool_name}");
    let ours_bytes: u64 = rel.iter().map(|e| e.1).sum();
    assert_eq!(
        ours_bytes,
        free_units * unit,
        "{name}: free total differs from {counter}"
    );
}

#[test]
fn every_partition_free_set_equals_the_tools_view() {
    let tmp = common::tempdir();
    let c = corpus(tmp.path());
    let mut checked = 0;
    for disk in ["gpt", "mbr"] {
        let img = c.disk(disk);
        let lay = layout(&img);
        let ours = roamdisk_free(&img);
        for row in c.rows.iter().filter(|r| r.disk == disk) {
            let (start, len) = lay[&row.part];
            let (fs, _health, extents) = ours.get(&row.part).unwrap_or_else(|| {
                panic!(
                    "{disk} partition {} ({}) missing from `borrow free`",
                    row.part, row.name
                )
            });
            assert_eq!(fs, &row.fs, "{disk}#{} {}: file system", row.part, row.name);
            let rel: Vec<(u64, u64)> = extents.iter().map(|&(s, l)| (s - start, l)).collect();
            for &(s, l) in &rel {
                assert!(
                    s + l <= len,
                    "{}: extent {s}+{l} outside the partition",
                    row.name
                );
            }
            let part = tmp.path().join(format!("{disk}-{}.part", row.part));
            extract(&img, start, len, &part);
            match row.fs.as_str() {
                // e2freefrag counts blocks; a bigalloc cluster is
                // several blocks, all free together.
                "ext2" | "ext3" | "ext4" => assert_same_free(
                    &row.name,
                    &rel,
                    ext_tool_view(&part),
                    ["free extents", "dumpe2fs", "e2freefrag"],
                ),
                "ntfs" => assert_same_free(
                    &row.name,
                    &rel,
                    ntfs_tool_view(&part),
                    ["free clusters", "$Bitmap", "ntfsinfo"],
                ),
                "swap" if row.used => {
                    let size = row.swap_bytes.expect("mkswap size");
                    assert_eq!(
                        rel,
                        vec![(4096, size)],
                        "{}: the swap area after the header page",
                        row.name
                    );
                }
                "swap" | "empty" => assert!(rel.is_empty(), "{}: nothing is free", row.name),
                other => panic!("unexpected file system {other}"),
            }
            checked += 1;
            std::fs::remove_file(&part).expect("rm");
        }
    }
    assert_eq!(checked, c.rows.len());
    assert!(
        checked >= 24,
        "the corpus has every variant ({checked} partitions)"
    );
}
