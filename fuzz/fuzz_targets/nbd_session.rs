//! The whole NBD server state machine: the input is everything one client
//! sends (handshake, then requests), played against `negotiate` and
//! `serve` with fresh `mem:` exports by `roamdisk_nbd::fuzzing::run_session`.
//! Finds panics anywhere in the server (including the blocking workers)
//! and hangs (a session that outlives its timeout panics).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    roamdisk_nbd::fuzzing::run_session(data);
});
