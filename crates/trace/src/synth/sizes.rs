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

/// Add up to `amount` bytes to `items` in `step`s, evenly, never above
/// `cap`. Returns what could not be placed.
fn grow(items: &mut [u32], mut amount: u64, step: u32, cap: u32) -> u64 {
    loop {
        let open: Vec<usize> = (0..items.len())
            .filter(|&i| items[i] + step <= cap)
            .collect();
        let steps = amount / step as u64;
        if open.is_empty() || steps == 0 {
            return amount;
        }
        let per = steps / open.len() as u64;
        if per == 0 {
            for &i in open.iter().take(steps as usize) {
                items[i] += step;
                amount -= step as u64;
            }
            return amount;
        }
        for i in open {
            let room = ((cap - items[i]) / step) as u64;
            let add = per.min(room) * step as u64;
            items[i] += add as u32;
            amount -= add;
        }
    }
}

/// Remove up to `amount` bytes from `items` in `step`s, evenly, never
/// below `floor`. Returns what could not be removed.
fn shrink(items: &mut [u32], mut amount: u64, step: u32, floor: u32) -> u64 {
    loop {
        let open: Vec<usize> = (0..items.len())
            .filter(|&i| items[i] >= floor + step)
            .collect();
        let steps = amount / step as u64;
        if open.is_empty() || steps == 0 {
            return amount;
        }
        let per = steps / open.len() as u64;
        if per == 0 {
            for &i in open.iter().take(steps as usize) {
                items[i] -= step;
                amount -= step as u64;
            }
            return amount;
        }
        for i in open {
            let room = ((items[i] - floor) / step) as u64;
            let sub = per.min(room) * step as u64;
            items[i] -= sub as u32;
            amount -= sub;
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
            extra = grow(&mut l, extra, SECTOR, LARGE_MAX);
        }
        extra = grow(&mut s, extra, SECTOR, SMALL_MAX_SECTORS);
        extra = grow(&mut s, extra, 1, SMALL_MAX);
        grow(&mut l, extra, 1, LARGE_MAX);
    } else {
        let mut deficit = base - total;
        deficit = shrink(&mut m, deficit, SECTOR, MEDIUM_MIN);
        deficit = shrink(&mut s, deficit, SECTOR, SMALL_MIN);
        shrink(&mut m, deficit, 1, MEDIUM_MIN);
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
