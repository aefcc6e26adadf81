//! Whether small requests run inline on the connection's task or on the
//! blocking pool, from how long recent ones took.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// An inline-eligible request slower than this (plus `SLOW_NS_PER_KIB` per
/// KiB) counts as slow: the stack blocked, or the thread lost its CPU.
const SLOW_BASE: Duration = Duration::from_micros(200);
const SLOW_NS_PER_KIB: u64 = 1000;
/// Eligible requests run inline unless `SLOW_MAX` of the last `WINDOW` were
/// slow: a blocking stack is slow every time, a busy machine now and then.
const WINDOW: u32 = 32;
const SLOW_MAX: u32 = 8;
/// Whether inline-eligible requests run inline, from how long recent ones
/// took (wherever they ran).
#[derive(Default)]
pub(super) struct Pace {
    /// Bits 0-7: requests seen in this window; 8-15: slow ones; 16: offload.
    state: AtomicU32,
}

const PACE_SLOW: u32 = 1 << 8;
const PACE_OFFLOAD: u32 = 1 << 16;

impl Pace {
    pub(super) fn inline(&self) -> bool {
        self.state.load(Ordering::Relaxed) & PACE_OFFLOAD == 0
    }

    /// Account an inline-eligible request of `len` bytes that took `took`.
    pub(super) fn observe(&self, len: u32, took: Duration) {
        let limit = SLOW_BASE + Duration::from_nanos(SLOW_NS_PER_KIB * (len as u64 >> 10));
        let slow = took > limit;
        let was = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                let seen = (s & 0xff) + 1;
                let slows = ((s >> 8) & 0xff) + slow as u32;
                Some(if slows >= SLOW_MAX {
                    PACE_OFFLOAD
                } else if seen >= WINDOW {
                    0
                } else {
                    (s & PACE_OFFLOAD) | (slows * PACE_SLOW) | seen
                })
            })
            .unwrap_or_default();
        if was & PACE_OFFLOAD != self.state.load(Ordering::Relaxed) & PACE_OFFLOAD {
            tracing::debug!(
                inline = self.inline(),
                "small requests switch between inline and the blocking pool"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_offloads_a_blocking_stack_and_comes_back_when_it_is_fast() {
        let pace = Pace::default();
        let slow = Duration::from_millis(5);
        let fast = Duration::from_micros(5);
        // The odd slow request (a busy machine) keeps requests inline.
        for i in 0..WINDOW * 4 {
            pace.observe(4096, if i % 16 == 0 { slow } else { fast });
            assert!(pace.inline());
        }
        for _ in 0..SLOW_MAX {
            pace.observe(4096, slow);
        }
        assert!(!pace.inline());
        // A large request may take longer before it counts as slow.
        for _ in 0..WINDOW {
            pace.observe(1 << 20, Duration::from_micros(600));
        }
        assert!(pace.inline());
    }
}
