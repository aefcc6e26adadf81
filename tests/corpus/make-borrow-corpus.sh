#!/usr/bin/env bash
# Build the borrow (TransPart) test corpus with the real tools: a GPT disk
# and an MBR disk (extended + logical partitions) holding ext2/3/4 in
# every layout fsmeta must read, NTFS, Linux swap, and every variant that
# must be skipped. Nothing here is committed: images go to OUTDIR.
#
# Usage: tests/corpus/make-borrow-corpus.sh OUTDIR
#
# Outputs in OUTDIR:
#   gpt.img, mbr.img     the disks (sparse files)
#   manifest.tsv         DISK PART NAME FS EXPECT REASON EXTRA
#                        EXPECT is used|skipped; REASON the skip reason
#                        (or -); EXTRA: swap_bytes=N for swap, else -
#   files.tsv            DISK PART FS PATH SOURCE: a file on the host
#                        partition and the file it was copied from
#   src/                 the source files
# Tools: mke2fs debugfs tune2fs mkntfs ntfscp ntfsinfo ntfstruncate ntfsfix
# mkswap sfdisk dd python3 (packages e2fsprogs ntfs-3g util-linux fdisk).
set -euo pipefail
out=${1:?usage: $0 OUTDIR}
mkdir -p "$out/parts" "$out/src"
out=$(cd "$out" && pwd)
cd "$out"
: > manifest.tsv
: > files.tsv

# Deterministic pseudo-random files of assorted sizes (1 KiB .. 600 KB).
python3 - "$out/src" <<'PY'
import os, random, sys
d = sys.argv[1]
r = random.Random(5)
for i in range(1, 121):
    n = r.choice([1024, 3000, 4096, 9000, 40000, 130000, 300000, 600000])
    with open(os.path.join(d, "f%03d" % i), "wb") as f:
        f.write(r.randbytes(n))
PY
# Sets of files for different partitions.
mkset() { # NAME FIRST LAST
  mkdir -p "src/$1/dir"
  for i in $(seq "$2" "$3"); do
    f=$(printf 'f%03d' "$i")
    if (( i % 3 == 0 )); then cp "src/$f" "src/$1/dir/$f"; else cp "src/$f" "src/$1/$f"; fi
  done
}
mkset A 1 60
mkset B 30 80
mkset C 60 120

note() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> manifest.tsv; }
# Record every file left in a populated ext partition (after the
# deletions ext_fragment made, listed in parts/deleted).
ext_files() { # DISK PART SET IMG
  (cd "src/$3" && find . -type f | sed 's|^\./||' | sort) | while read -r f; do
    if ! grep -qxF "$f" parts/deleted 2>/dev/null; then
      printf '%s\t%s\text\t/%s\t%s\n' "$1" "$2" "$f" "src/$3/$f" >> files.tsv
    fi
  done
  rm -f parts/deleted
}
# Delete every Nth file of an ext image to fragment its free space.
ext_fragment() { # IMG SET N
  local cmds=""
  local i=0
  while read -r f; do
    i=$((i + 1))
    if (( i % $3 == 0 )); then cmds+="rm /$f"$'\n'; echo "$f" >> parts/deleted; fi
  done < <(cd "src/$2" && find . -type f | sed 's|^\./||' | sort)
  printf '%s' "$cmds" | debugfs -w -f - "$1" >/dev/null 2>&1
}
mkext() { # IMG SIZE_MIB SET|- MKE2FS-ARGS...
  local img=$1 size=$2 set=$3
  shift 3
  rm -f "$img"
  truncate -s "${size}M" "$img"
  if [ "$set" = - ]; then
    mke2fs -q -F "$@" "$img" >/dev/null 2>&1
  else
    mke2fs -q -F "$@" -d "src/$set" "$img" >/dev/null 2>&1
  fi
}
mkntfs_img() { # IMG SIZE_MIB
  rm -f "$1"
  truncate -s "${2}M" "$1"
  mkntfs -q -F -Q -L roamdisk "$1" >/dev/null 2>&1
}
ntfs_put() { # DISK PART IMG SET [COUNT]: copy files to the root, record them
  local f
  for f in $(cd "src/$4" && find . -maxdepth 1 -type f | sed 's|^\./||' | sort | head -n "${5:-1000}"); do
    ntfscp -q "$3" "src/$4/$f" "$f" >/dev/null 2>&1
    printf '%s\t%s\tntfs\t/%s\t%s\n' "$1" "$2" "$f" "src/$4/$f" >> files.tsv
  done
}
ntfs_inode() { ntfsinfo -F "/$2" "$1" 2>/dev/null | awk '/^Dumping Inode/ {print $3; exit}'; }
# Free space inside an NTFS volume: truncate some files (the real way
# NTFS frees clusters), and drop them from the checksum list.
ntfs_free() { # DISK PART IMG NAME NEW_LEN
  local ino
  ino=$(ntfs_inode "$3" "$4")
  [ -n "$ino" ] || { echo "$0: /$4 not found in $3" >&2; exit 1; }
  ntfstruncate -q "$3" "$ino" "$5" >/dev/null 2>&1
  grep -v -P "^$1\t$2\tntfs\t/$4\t" files.tsv > files.tmp || true
  mv files.tmp files.tsv
  if [ "$5" != 0 ]; then
    head -c "$5" "src/$4" > "src/$4.cut.$1.$2"
    truncate -s "$5" "src/$4.cut.$1.$2"
    printf '%s\t%s\tntfs\t/%s\t%s\n' "$1" "$2" "$4" "src/$4.cut.$1.$2" >> files.tsv
  fi
}
mkswap_img() { # IMG SIZE_MIB -> prints the swap size mkswap reports
  rm -f "$1"
  truncate -s "${2}M" "$1"
  mkswap -L roamdisk "$1" 2>/dev/null | sed -n 's/.*(\([0-9]*\) bytes).*/\1/p'
}
hiber() { # IMG SIGNATURE: an ntfs hiberfil.sys whose header is SIGNATURE
  head -c 65536 /dev/zero > parts/hib.bin
  if [ -n "$2" ]; then printf '%s' "$2" | dd of=parts/hib.bin conv=notrunc status=none; fi
  ntfscp -q "$1" parts/hib.bin hiberfil.sys >/dev/null 2>&1
}
# A $LogFile whose restart pages show a volume left mounted (what Windows
# fast startup leaves), written into the file by ntfscp.
fast_startup() { # IMG
  python3 - parts/logfile.bin "$(ntfsinfo -F '/$LogFile' "$1" 2>/dev/null | awk '/Data Size:/ {print $3; exit}')" <<'PY'
import struct, sys
def page(lsn):
    p = bytearray(4096)
    p[0:4] = b"RSTR"
    struct.pack_into("<HHQIIHhh", p, 4, 0x1E, 9, 0, 4096, 4096, 0x30, 1, 1)
    # restart area: current LSN, 1 client, free list empty, client 0 in
    # use, flags without RESTART_VOLUME_IS_CLEAN
    struct.pack_into("<QHHHH", p, 0x30, lsn, 1, 0xFFFF, 0, 0)
    usn = b"\x01\x00"
    p[0x1E:0x20] = usn
    for i in range(1, 9):
        end = i * 512 - 2
        p[0x1E + 2 * i:0x20 + 2 * i] = p[end:end + 2]
        p[end:end + 2] = usn
    return bytes(p)
size = int(sys.argv[2])
data = page(0x2000) + page(0x1000)
open(sys.argv[1], "wb").write(data + b"\xff" * (size - len(data)))
PY
  ntfscp -q "$1" parts/logfile.bin '$LogFile' >/dev/null 2>&1
}
# A real journal transaction left for replay (debugfs's journal writer).
journal_txn() { # IMG
  head -c 8192 /dev/urandom > parts/jblk.bin
  printf 'jo\njw -b 1000,1001 %s\njc\n' "$out/parts/jblk.bin" | debugfs -w -f - "$1" >/dev/null 2>&1
}

############################ GPT disk ############################
P=parts
mkext $P/g1.img 40 A -t ext4 -g 1024;              ext_fragment $P/g1.img A 3; ext_files gpt 1 A $P/g1.img
note gpt 1 ext4-fragmented ext4 used - -
mkext $P/g2.img 24 B -t ext3;                      ext_fragment $P/g2.img B 4; ext_files gpt 2 B $P/g2.img
note gpt 2 ext3 ext3 used - -
mkext $P/g3.img 20 C -t ext2 -b 1024;              ext_fragment $P/g3.img C 2; ext_files gpt 3 C $P/g3.img
note gpt 3 ext2-1k ext2 used - -
mkntfs_img $P/g4.img 40; ntfs_put gpt 4 $P/g4.img B
for f in f031 f035 f040 f047 f052 f061 f070; do ntfs_free gpt 4 $P/g4.img $f 0; done
ntfs_free gpt 4 $P/g4.img f050 5000; ntfs_free gpt 4 $P/g4.img f044 100000
note gpt 4 ntfs ntfs used - -
sw=$(mkswap_img $P/g5.img 12)
note gpt 5 swap swap used - "swap_bytes=$sw"
mkext $P/g6.img 24 A -t ext4 -O 64bit,^flex_bg -g 1024; ext_fragment $P/g6.img A 5; ext_files gpt 6 A $P/g6.img
note gpt 6 ext4-64bit-noflex ext4 used - -
mkext $P/g7.img 32 C -t ext4 -O bigalloc -C 16384; ext_fragment $P/g7.img C 3; ext_files gpt 7 C $P/g7.img
note gpt 7 ext4-bigalloc ext4 used - -
mkext $P/g8.img 16 B -t ext4 -b 1024 -O meta_bg,^resize_inode; ext_fragment $P/g8.img B 3; ext_files gpt 8 B $P/g8.img
note gpt 8 ext4-metabg-1k ext4 used - -
mkext $P/g9.img 16 B -t ext4 -b 65536;             ext_fragment $P/g9.img B 2; ext_files gpt 9 B $P/g9.img
note gpt 9 ext4-64k ext4 used - -
mkext $P/g10.img 16 A -t ext4 -O ^metadata_csum,uninit_bg -g 1024; ext_fragment $P/g10.img A 4; ext_files gpt 10 A $P/g10.img
note gpt 10 ext4-uninit-bg ext4 used - -
mkext $P/g11.img 16 B -t ext4 -O ^sparse_super,^resize_inode -g 1024; ext_files gpt 11 B $P/g11.img
note gpt 11 ext4-nosparse ext4 used - -
mkext $P/g12.img 16 C -t ext4 -O sparse_super2 -g 1024; ext_files gpt 12 C $P/g12.img
note gpt 12 ext4-sparse-super2 ext4 used - -
rm -f $P/g13.img; truncate -s 4M $P/g13.img
note gpt 13 empty empty skipped unsupported -
mkntfs_img $P/g14.img 16; ntfs_put gpt 14 $P/g14.img A 8; hiber $P/g14.img wake
note gpt 14 ntfs-hiberfil-wake ntfs used - -

gpt_types=(L L L "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7" S L L L L L L L L "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7")
sizes=(40 24 20 40 12 24 32 16 16 16 16 16 4 16)
total=4
for s in "${sizes[@]}"; do total=$((total + s)); done
rm -f gpt.img; truncate -s "${total}M" gpt.img
{
  echo "label: gpt"
  for i in "${!sizes[@]}"; do
    t=${gpt_types[$i]}
    case $t in L) t=0FC63DAF-8483-4772-8E79-3D69D8477DE4 ;; S) t=0657FD6D-A4AB-43C4-84E5-0933C84B4F4F ;; esac
    echo "size=${sizes[$i]}MiB, type=$t, name=part$((i + 1))"
  done
} | sfdisk -q gpt.img >/dev/null
place() { # DISK PARTNUM IMG
  local start
  start=$(sfdisk -d "$1" | awk -v p="$1$2" '$1 == p {gsub(",", "", $4); print $4}')
  dd if="$3" of="$1" bs=1M seek=$((start * 512)) oflag=seek_bytes conv=notrunc,sparse status=none
}
for i in "${!sizes[@]}"; do place gpt.img $((i + 1)) $P/g$((i + 1)).img; done

############################ MBR disk ############################
mkext $P/m1.img 16 A -t ext4; tune2fs -E force_fsck $P/m1.img >/dev/null 2>&1
note mbr 1 ext4-errors ext4 skipped errors-recorded -
mkext $P/m2.img 16 A -t ext4; debugfs -w -R "ssv state 0" $P/m2.img >/dev/null 2>&1
note mbr 2 ext4-not-clean ext4 skipped not-clean -
sw=$(mkswap_img $P/m4.img 8)
note mbr 4 swap swap used - "swap_bytes=$sw"
mkext $P/m5.img 24 B -t ext4; journal_txn $P/m5.img
note mbr 5 ext4-needs-recovery ext4 skipped needs-recovery -
mkntfs_img $P/m6.img 16; ntfs_put mbr 6 $P/m6.img A 6; ntfsfix $P/m6.img >/dev/null 2>&1
note mbr 6 ntfs-dirty ntfs skipped dirty -
mkntfs_img $P/m7.img 16; ntfs_put mbr 7 $P/m7.img C 6; hiber $P/m7.img HIBR
note mbr 7 ntfs-hibernated ntfs skipped hibernated -
mkswap_img $P/m8.img 8 >/dev/null; printf 'S1SUSPEND\0' | dd of=$P/m8.img bs=1 seek=4086 conv=notrunc status=none
note mbr 8 swap-hibernated swap skipped hibernated -
mkntfs_img $P/m9.img 16; ntfs_put mbr 9 $P/m9.img B 6; fast_startup $P/m9.img
note mbr 9 ntfs-fast-startup ntfs skipped fast-startup -
mkext $P/m10.img 16 C -t ext4; ext_fragment $P/m10.img C 2; ext_files mbr 10 C $P/m10.img
note mbr 10 ext4-logical ext4 used - -
mkext $P/m11.img 16 B -t ext4; journal_txn $P/m11.img; debugfs -w -R "feature -needs_recovery" $P/m11.img >/dev/null 2>&1
note mbr 11 ext4-journal-data-flag-clear ext4 skipped needs-recovery -

logical=(5 6 7 8 9 10 11)
lsizes=(24 16 16 8 16 16 16)
ext_total=0
for s in "${lsizes[@]}"; do ext_total=$((ext_total + s + 1)); done
total=$((1 + 16 + 16 + ext_total + 8 + 1))
rm -f mbr.img; truncate -s "${total}M" mbr.img
{
  echo "label: dos"
  echo "size=16MiB, type=83"
  echo "size=16MiB, type=83"
  echo "size=${ext_total}MiB, type=5"
  echo "size=8MiB, type=82"
  for i in "${!logical[@]}"; do
    t=83
    case ${logical[$i]} in 6|7|9) t=7 ;; 8) t=82 ;; esac
    echo "size=${lsizes[$i]}MiB, type=$t"
  done
} | sfdisk -q mbr.img >/dev/null
for p in 1 2 4 5 6 7 8 9 10 11; do place mbr.img $p $P/m$p.img; done
rm -rf parts
echo "corpus ready in $out: gpt.img mbr.img manifest.tsv files.tsv"
