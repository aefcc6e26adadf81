//! The cache layer against a memory device: hits, misses, write-through,
//! trims, several devices on one cache, and the engine's counts.

use super::*;
use crate::sharded::shard_hint;
use crate::testkit::Lcg;
use roamdisk_blockdev::layers::mem::MemDev;

fn dev(policy: &str, size: u64, block: u64, shards: usize) -> (Arc<MemDev>, CacheDev) {
    let mem = Arc::new(MemDev::new(8 << 20 | 1000));
    let c = CacheDev::new(
        mem.clone(),
        CacheOptions {
            policy: PolicySpec::parse(policy).unwrap(),
            size,
            block,
            shards,
            report: None,
        },
    )
    .unwrap();
    (mem, c)
}

/// Random reads, writes, zeroes and trims against a model, for every
/// policy and two block sizes, over a disk whose last block is short.
#[test]
fn reads_equal_a_model_under_random_operations() {
    for policy in ["lru", "fmpq", "2q", "arc", "s3fifo", "fbr", "mq"] {
        for block in [4096u64, 16384] {
            let (_mem, c) = dev(policy, 24 * block, block, 4);
            let size = c.size();
            let mut model = vec![0u8; size as usize];
            let mut rng = Lcg(99);
            let mut rnd = |n: u64| (rng.next() >> 33) % n;
            for step in 0..3000u64 {
                let off = rnd(size);
                let len = (1 + rnd(3 * block)).min(size - off);
                match rnd(10) {
                    0..=5 => {
                        let mut buf = vec![0u8; len as usize];
                        c.read_at(&mut buf, off).unwrap();
                        assert!(
                            buf == model[off as usize..(off + len) as usize],
                            "{policy} {block}: read {off}+{len} at step {step}"
                        );
                    }
                    6 | 7 => {
                        let buf: Vec<u8> = (0..len).map(|i| (i + step) as u8 | 1).collect();
                        c.write_at(&buf, off, WriteFlags::default()).unwrap();
                        model[off as usize..(off + len) as usize].copy_from_slice(&buf);
                    }
                    8 => {
                        c.write_zeroes(off, len, ZeroFlags::default()).unwrap();
                        model[off as usize..(off + len) as usize].fill(0);
                    }
                    _ => {
                        // MemDev trims to zeroes.
                        c.trim(off, len, WriteFlags::default()).unwrap();
                        let mut buf = vec![0u8; len as usize];
                        c.next.read_at(&mut buf, off).unwrap();
                        model[off as usize..(off + len) as usize].copy_from_slice(&buf);
                    }
                }
            }
            let s = c.stats();
            assert!(
                s.totals.hits > 0 && s.totals.bytes_from_cache > 0,
                "{policy}: {s:?}"
            );
            assert!(s.totals.resident <= s.capacity as u64);
        }
    }
}

/// Writers and readers of the same few blocks in threads: at the end
/// the cache's every byte equals NEXT's, and readers never see a block
/// mixing two writes (each write fills whole blocks with one value).
#[test]
fn racing_writes_and_reads_leave_no_stale_or_torn_block() {
    for (policy, block) in [("lru", 4096u64), ("s3fifo", 1 << 20), ("fmpq", 64 << 10)] {
        let pages = block / 4096;
        let (mem, c) = dev(policy, 4 * block, block, 2);
        let c = Arc::new(c);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let c = c.clone();
                s.spawn(move || {
                    let mut rng = Lcg(t + 1);
                    let mut buf = vec![0u8; block as usize];
                    for i in 0..600u64 {
                        let x = rng.next();
                        let b = (x >> 33) % 6;
                        if t % 2 == 0 {
                            // Whole pages of one value.
                            let p0 = (x >> 20) % pages;
                            let np = 1 + (x >> 40) % (pages - p0);
                            let v = (t * 60 + i % 60) as u8 + 1;
                            let data = vec![v; (np * 4096) as usize];
                            c.write_at(&data, b * block + p0 * 4096, WriteFlags::default())
                                .unwrap();
                        } else {
                            c.read_at(&mut buf, b * block).unwrap();
                            for (p, page) in buf.chunks(4096).enumerate() {
                                assert!(
                                    page.iter().all(|&x| x == page[0]),
                                    "{policy} {block}: torn page {p} of block {b}"
                                );
                            }
                        }
                    }
                });
            }
        });
        for b in 0..6u64 {
            let (mut a, mut m) = (vec![0u8; block as usize], vec![0u8; block as usize]);
            c.read_at(&mut a, b * block).unwrap();
            mem.read_at(&mut m, b * block).unwrap();
            assert!(
                a == m,
                "{policy} {block}: block {b}: the cache disagrees with NEXT"
            );
        }
    }
}

/// Two devices in front of one cache: the accesses of both are counted
/// by the engine as `roamdisk sim` counts a two-device trace (keys and
/// shards by `shard_hint(device, block)`), each device's counters sum
/// to the cache's, and each device reads its own bytes.
#[test]
fn devices_share_one_cache_as_the_simulator_models_it() {
    let spec = PolicySpec::parse("fmpq").unwrap();
    let cache = BlockCache::new(CacheOptions {
        policy: spec.clone(),
        size: 40 * 4096,
        block: 4096,
        shards: 4,
        report: None,
    })
    .unwrap();
    let mems: Vec<Arc<MemDev>> = (0..2).map(|_| Arc::new(MemDev::new(1 << 20))).collect();
    for (i, m) in mems.iter().enumerate() {
        m.write_at(&vec![i as u8 + 1; 1 << 20], 0, WriteFlags::default())
            .unwrap();
    }
    let devs: Vec<CacheDev> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| cache.attach(i as u32, m.clone()).unwrap())
        .collect();
    let mut eng = ShardedCache::<u64>::new::<HashIndex<u64>>(&spec, 40, 4).unwrap();
    let mut rng = Lcg(11);
    let mut buf = [0u8; 4096];
    for _ in 0..5000 {
        let x = rng.next();
        let (d, b) = ((x >> 60) as u32 & 1, (x >> 33) % 60);
        devs[d as usize].read_at(&mut buf, b * 4096).unwrap();
        assert!(buf.iter().all(|&v| v == d as u8 + 1));
        eng.access_mut(shard_hint(d, b), shard_hint(d, b));
    }
    let (s, e) = (cache.stats().totals, eng.counts());
    assert_eq!(
        (s.hits, s.misses, s.evictions),
        (e.hits, e.misses, e.evictions)
    );
    let (a, b) = (cache.device_stats(0), cache.device_stats(1));
    assert!(a.hits > 0 && b.hits > 0, "{a:?} {b:?}");
    assert_eq!(a.hits + b.hits, s.hits);
    assert_eq!(a.misses + b.misses, s.misses);
    assert_eq!(a.evictions + b.evictions, s.evictions);
    assert_eq!(a.resident + b.resident, s.resident);
    assert_eq!(s.resident, 40);
}

/// The layer's hits are the simulator's for the same accesses.
#[test]
fn hits_equal_the_engine_run_alone() {
    for policy in ["lru", "fmpq", "2q"] {
        let (_mem, c) = dev(policy, 40 * 4096, 4096, 4);
        let spec = PolicySpec::parse(policy).unwrap();
        let mut eng = ShardedCache::<u64>::new::<HashIndex<u64>>(&spec, 40, 4).unwrap();
        let mut rng = Lcg(5);
        let mut buf = [0u8; 4096];
        for _ in 0..5000 {
            let b = (rng.next() >> 33) % 100;
            c.read_at(&mut buf, b * 4096).unwrap();
            eng.access_mut(shard_hint(0, b), b);
        }
        let (s, e) = (c.stats().totals, eng.counts());
        assert_eq!(
            (s.hits, s.misses, s.evictions),
            (e.hits, e.misses, e.evictions)
        );
    }
}

/// NEXT, slow, counting the reads it serves.
struct SlowCounting {
    mem: MemDev,
    reads: std::sync::atomic::AtomicU64,
}

impl BlockDev for SlowCounting {
    fn layer(&self) -> &'static str {
        "slow"
    }
    fn next(&self) -> Option<&dyn BlockDev> {
        Some(&self.mem)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        self.mem.read_at(buf, off)
    }
}

/// Sixteen readers of the same blocks at the same moment (a boot
/// storm): NEXT reads each block once, every reader gets its bytes,
/// and the hit counts are the engine's (one miss per block).
#[test]
fn readers_of_a_block_being_fetched_wait_for_that_fetch() {
    let slow = Arc::new(SlowCounting {
        mem: MemDev::new(1 << 20),
        reads: Default::default(),
    });
    let mut want = vec![0u8; 1 << 20];
    for (i, b) in want.iter_mut().enumerate() {
        *b = (i / 4096 * 7 + i % 251) as u8;
    }
    slow.mem.write_at(&want, 0, WriteFlags::default()).unwrap();
    let c = Arc::new(
        CacheDev::new(
            slow.clone(),
            CacheOptions {
                policy: PolicySpec::parse("fmpq").unwrap(),
                size: 1 << 20,
                block: 4096,
                shards: 4,
                report: None,
            },
        )
        .unwrap(),
    );
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (c, barrier, want) = (c.clone(), barrier.clone(), want.clone());
            std::thread::spawn(move || {
                barrier.wait();
                // Blocks 3..11, half of the readers unaligned.
                let off = 3 * 4096 + if t % 2 == 0 { 0 } else { 100 };
                let mut buf = vec![0u8; 8 * 4096 - 200];
                c.read_at(&mut buf, off).unwrap();
                assert!(buf[..] == want[off as usize..off as usize + buf.len()]);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let reads = slow.reads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(reads <= 8, "NEXT served {reads} reads for 8 blocks");
    let s = c.stats().totals;
    assert_eq!(s.misses, 8);
    assert_eq!(s.hits, 15 * 8);
    assert_eq!(s.bytes_from_next, 8 * 4096);
}

#[test]
fn the_policy_may_be_left_out_and_is_lru_then() {
    let mut reg = roamdisk_blockdev::Registry::with_builtin();
    reg.add(&CACHE);
    let short = reg.parse("cache:64K:mem:1M").unwrap();
    assert_eq!(short, reg.parse("cache:lru:64K:mem:1M").unwrap());
    let named = reg.parse("cache[block=8K]:fmpq:64K:mem:1M").unwrap();
    assert_eq!(named.params["policy"], "fmpq");
    assert_eq!(named.params["size"], "64K");
    // A policy that is not one is still read as POLICY (and refused
    // when the layer opens: "unknown policy").
    let bad = reg.parse("cache:nosuch:64K:mem:1M").unwrap();
    assert_eq!(bad.params["policy"], "nosuch");
    // TOML: without a policy key.
    let t: toml::Table =
        toml::from_str("kind = \"cache\"\nsize = \"64K\"\n[next]\nkind = \"mem\"\nsize = \"1M\"\n")
            .unwrap();
    assert_eq!(reg.from_toml(&t).unwrap(), short);
}
