//! Request sizes for a given count per size class and a given total.

use rand::RngExt;

/// Smallest request of the "1 KB" class, and its usual and largest
/// whole-sector sizes (the class is "below 2 KiB").
pub const SMALL_MIN: u32 = 512;
pub const SMALL_USUAL: u32 = 1024;
pub const SMALL_MAX_SECTORS: u32 = 1536;
pub const SMALL_MAX: u32 = 2047;
/// The "≤ 4 KB" class: 2 KiB to 4 KiB.
pub const MEDIUM_MIN: u32 = 2048;
pub const MEDIUM_MAX: u32 = 4096;
/// The "> 4 KB" class, from one sector above 4 KiB.
pub const LARGE_MIN: u32 = 4608;
pub const LARGE_MAX: u32 = 512 * 1024;
const SECTOR: u32 = 512;

/// The bound [`spread`] moves sizes toward: up to a cap or down to a
/// floor.
#[derive(Clone, Copy)]
enum Toward {
    Cap(u32),
    Floor(u32),
}

impl Toward {
    /// How far `x` may move before it reaches the bound.
    fn room(self, x: u32) -> u32 {
        match self {
            Toward::Cap(cap) => cap.saturating_sub(x),
            Toward::Floor(floor) => x.saturating_sub(floor),
        }
    }

    fn apply(self, x: &mut u32, by: u32) {
        match self {
            Toward::Cap(_) => *x += by,
            Toward::Floor(_) => *x -= by,
        }
    }
}

/// Add `amount` bytes to `items` (toward a cap) or take them away (toward
/// a floor), in `step`s, evenly, never past the bound. Returns what could
/// not be moved.
fn spread(items: &mut [u32], mut amount: u64, step: u32, to: Toward) -> u64 {
    loop {
        let open: Vec<usize> = (0..items.len())
            .filter(|&i| to.room(items[i]) >= step)
            .collect();
        let steps = amount / step as u64;
        if open.is_empty() || steps == 0 {
            return amount;
        }
        let per = steps / open.len() as u64;
        if per == 0 {
            for &i in open.iter().take(steps as usize) {
                to.apply(&mut items[i], step);
                amount -= step as u64;
            }
            return amount;
        }
        for i in open {
            let room = (to.room(items[i]) / step) as u64;
            let by = per.min(room) * step as u64;
            to.apply(&mut items[i], by as u32);
            amount -= by;
        }
    }
}

/// Sizes for `small`, `medium` and `large` requests (Table 3's classes)
/// summing to `total` bytes, or as close as the class bounds allow. Whole
/// sectors are used wherever they can reach the total; large requests get
/// exponentially distributed sizes. The result is shuffled.
pub fn allocate(
    small: u64,
    medium: u64,
    large: u64,
    total: u64,
    rng: &mut impl rand::Rng,
) -> Vec<u32> {
    let mut s = vec![SMALL_USUAL; small as usize];
    let mut m = vec![MEDIUM_MAX; medium as usize];
    let mut l = vec![LARGE_MIN; large as usize];
    let base: u64 = s.iter().chain(&m).chain(&l).map(|&x| x as u64).sum();
    if total >= base {
        let mut extra = total - base;
        if !l.is_empty() {
            let w: Vec<f64> = (0..l.len())
                .map(|_| -(1.0 - rng.random::<f64>()).ln())
                .collect();
            let wsum: f64 = w.iter().sum();
            let share = extra as f64;
            for (x, wi) in l.iter_mut().zip(&w) {
                let add = ((share * wi / wsum) as u64 / SECTOR as u64 * SECTOR as u64)
                    .min((LARGE_MAX - *x) as u64);
                *x += add as u32;
                extra -= add;
            }
            extra = spread(&mut l, extra, SECTOR, Toward::Cap(LARGE_MAX));
        }
        extra = spread(&mut s, extra, SECTOR, Toward::Cap(SMALL_MAX_SECTORS));
        extra = spread(&mut s, extra, 1, Toward::Cap(SMALL_MAX));
        spread(&mut l, extra, 1, Toward::Cap(LARGE_MAX));
    } else {
        let mut deficit = base - total;
        deficit = spread(&mut m, deficit, SECTOR, Toward::Floor(MEDIUM_MIN));
        deficit = spread(&mut s, deficit, SECTOR, Toward::Floor(SMALL_MIN));
        spread(&mut m, deficit, 1, Toward::Floor(MEDIUM_MIN));
    }
    let mut all: Vec<u32> = s.into_iter().chain(m).chain(l).collect();
    rand::seq::SliceRandom::shuffle(all.as_mut_slice(), rng);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(v: &[u32]) -> (u64, u64, u64) {
        let mut c = (0, 0, 0);
        for &x in v {
            if x < 2048 {
                c.0 += 1
            } else if x <= 4096 {
                c.1 += 1
            } else {
                c.2 += 1
            }
        }
        c
    }

    #[test]
    fn sizes_keep_classes_and_hit_feasible_totals() {
        let mut r = crate::synth::rng(3);
        for (s, m, l, kib) in [
            (21, 39, 1215, 18562u64),
            (24, 0, 0, 28),
            (7, 1, 1, 18),
            (90, 7, 0, 112),
            (2, 1, 0, 6),
            (313, 228, 1121, 43895),
            (7, 0, 0, 11),
        ] {
            let v = allocate(s, m, l, kib * 1024, &mut r);
            assert_eq!(classes(&v), (s, m, l));
            let sum: u64 = v.iter().map(|&x| x as u64).sum();
            assert_eq!(sum, kib * 1024, "{s} {m} {l} {kib}");
        }
    }

    #[test]
    fn infeasible_totals_come_as_close_as_the_classes_allow() {
        let mut r = crate::synth::rng(3);
        let v = allocate(4, 0, 0, 100 * 1024, &mut r);
        assert_eq!(v, vec![SMALL_MAX; 4]);
        let v = allocate(0, 4, 0, 1024, &mut r);
        assert_eq!(v, vec![MEDIUM_MIN; 4]);
    }
}
