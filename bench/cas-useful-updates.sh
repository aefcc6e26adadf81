#!/usr/bin/env bash
# The content-addressed image experiments that run as black-box tests,
# with their numbers printed: store growth per step for two users derived
# from one golden image (ext4 and NTFS), and the useful-update filters on a
# guest-like session (the seed's Figure 9).
#
# Usage: bench/cas-useful-updates.sh
# Needs: a release build, and what scripts/test installs.
set -euo pipefail
cd "$(dirname "$0")/.."
export ROAMDISK_BIN=${ROAMDISK_BIN:-$PWD/target/release/roamdisk}
cargo nextest run -p roamdisk-tests --no-capture \
  -E 'binary(cas_two_users) | binary(cas_guest_session)' 2>&1 \
  | grep -E '^(ext4|ntfs): |^written |^(USER|alice|bob|golden|dave) ' || true
