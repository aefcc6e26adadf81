//! The client against this crate's server, in process, over a Unix socket.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roamdisk_blockdev::{
    extents_covering, Access, Alloc, BlockDev, Checked, Registry, Result, WriteFlags, ZeroFlags,
};

use super::{NbdAddr, NbdDev, NbdOptions, NbdUri};
use crate::{serve_until, Export, Listen, ServeOptions, TlsAcceptor, TlsMode, TlsOptions};

/// [`serve_until`] on its own thread, stopped (and its socket removed) on
/// drop.
struct TestServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    fn start(sock: &Path, dev: Arc<dyn BlockDev>) -> TestServer {
        Self::start_tls(sock, dev, None)
    }

    /// With `tls`, TLS is required.
    fn start_tls(sock: &Path, dev: Arc<dyn BlockDev>, tls: Option<TlsAcceptor>) -> TestServer {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let sock = sock.to_path_buf();
        let thread = std::thread::spawn(move || {
            let export = Export {
                name: String::new(),
                description: String::new(),
                dev,
            };
            let opts = ServeOptions {
                tls_mode: if tls.is_some() {
                    TlsMode::Require
                } else {
                    TlsMode::Off
                },
                tls,
                max_connections: 16,
                busy_poll: Duration::ZERO,
                io_threads: 8,
                ..ServeOptions::default()
            };
            serve_until(vec![export], vec![Listen::Unix(sock)], opts, |_| {
                ready_tx.send(()).unwrap();
                async {
                    let _ = stopped.await;
                }
            })
            .unwrap();
        });
        ready.recv().unwrap();
        TestServer {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.thread.take().unwrap().join();
    }
}

fn uri(sock: &Path) -> NbdUri {
    NbdUri {
        addr: NbdAddr::Unix(sock.to_path_buf()),
        export: String::new(),
        tls: None,
    }
}

fn mem(size: &str) -> Arc<dyn BlockDev> {
    Registry::with_builtin()
        .build(&format!("mem:{size}"), Access::ReadWrite)
        .unwrap()
}

fn opts(structured: bool) -> NbdOptions {
    NbdOptions {
        structured,
        first_backoff: Duration::from_millis(50),
        ..NbdOptions::default()
    }
}

fn sock_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("s.sock")
}

/// Holds each read a while and records how many ran at once.
struct Slow {
    next: Arc<dyn BlockDev>,
    now: AtomicUsize,
    most: AtomicUsize,
}

impl BlockDev for Slow {
    roamdisk_blockdev::layer!("slow", next);
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.next.read_at(buf, off)
    }
}

fn pattern(thread: u64, i: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|b| (b ^ (thread * 31 + i * 7)) as u8)
        .collect()
}

/// 8 threads on one `dev`, thread t writing its `per_thread` 4 KiB blocks
/// (block t * per_thread + i, [`pattern`]`(t, i)`, `flags(i)`) and reading
/// each back at once.
fn write_and_read_back_from_8_threads(
    dev: &Arc<NbdDev>,
    per_thread: u64,
    flags: fn(u64) -> WriteFlags,
) {
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let dev = dev.clone();
            s.spawn(move || {
                for i in 0..per_thread {
                    let off = (t * per_thread + i) * 4096;
                    let p = pattern(t, i);
                    dev.write_at(&p, off, flags(i)).unwrap();
                    let mut b = vec![0u8; 4096];
                    dev.read_at(&mut b, off).unwrap();
                    assert_eq!(b, p, "thread {t} request {i}");
                }
            });
        }
    });
}

#[test]
fn threads_share_one_connection_with_requests_in_flight_together() {
    for structured in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let slow = Arc::new(Slow {
            next: mem("16M"),
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        });
        let _srv = TestServer::start(&sock_in(&dir), slow.clone());
        let dev =
            Arc::new(NbdDev::connect_with(&uri(&sock_in(&dir)), opts(structured), false).unwrap());
        assert_eq!(dev.structured(), structured);
        assert_eq!(dev.size(), 16 << 20);
        write_and_read_back_from_8_threads(&dev, 16, |i| WriteFlags { fua: i % 4 == 0 });
        dev.flush().unwrap();
        assert!(
            slow.most.load(Ordering::SeqCst) > 1,
            "reads from 8 threads never overlapped on the one connection"
        );
        // The whole disk in one read.
        let mut big = vec![0u8; 16 << 20];
        dev.read_at(&mut big, 0).unwrap();
        assert_eq!(&big[..4096], &pattern(0, 0)[..]);
    }
}

#[test]
fn zeroes_trims_and_block_status() {
    let dir = tempfile::tempdir().unwrap();
    let _srv = TestServer::start(&sock_in(&dir), mem("8M"));
    let on = NbdDev::connect_with(&uri(&sock_in(&dir)), opts(true), false).unwrap();
    assert!(on.caps().can_extents);
    on.write_at(&[7u8; 65536], 1 << 20, WriteFlags::default())
        .unwrap();
    on.write_zeroes(1 << 20, 4096, ZeroFlags::default())
        .unwrap();
    let mut b = vec![1u8; 8192];
    on.read_at(&mut b, 1 << 20).unwrap();
    assert!(b[..4096].iter().all(|&x| x == 0) && b[4096..].iter().all(|&x| x == 7));
    let ext = extents_covering(&on, 0, 8 << 20).unwrap();
    assert_eq!(ext[0].state, Alloc::Hole, "{ext:?}");
    assert!(ext.iter().any(|e| e.state == Alloc::Data), "{ext:?}");
    assert_eq!(ext.iter().map(|e| e.len).sum::<u64>(), 8 << 20);
    on.trim(1 << 20, 65536, WriteFlags::default()).unwrap();
    on.flush().unwrap();

    let off = NbdDev::connect_with(&uri(&sock_in(&dir)), opts(false), false).unwrap();
    assert!(!off.caps().can_extents);
    let ext = off.block_status(0, 8 << 20).unwrap();
    assert_eq!(ext.len(), 1);
    assert_eq!(ext[0].state, Alloc::Data);
    // Reading a hole with simple replies gives zeroes too.
    let mut b = vec![1u8; 4096];
    off.read_at(&mut b, 4 << 20).unwrap();
    assert!(b.iter().all(|&x| x == 0));
}

#[test]
fn server_errors_are_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let ro: Arc<dyn BlockDev> = Arc::new(Checked::new(mem("1M"), Access::ReadOnly));
    let _srv = TestServer::start(&sock_in(&dir), ro);
    let dev = NbdDev::connect_with(&uri(&sock_in(&dir)), opts(true), false).unwrap();
    assert!(!dev.caps().can_write);
    let e = dev
        .write_at(&[1; 512], 0, WriteFlags::default())
        .unwrap_err();
    assert_eq!(e.kind(), roamdisk_blockdev::ErrorKind::ReadOnly, "{e}");
}

#[test]
fn requests_survive_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let sock = sock_in(&dir);
    let disk = mem("4M");
    let srv = TestServer::start(&sock, disk.clone());
    let dev = Arc::new(NbdDev::connect_with(&uri(&sock), opts(true), false).unwrap());
    dev.write_at(&[5u8; 4096], 0, WriteFlags::default())
        .unwrap();
    dev.flush().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let dev = dev.clone();
                let stop = &stop;
                s.spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        let off = (1 + t * 64 + i % 64) * 4096;
                        let p = pattern(t, i);
                        dev.write_at(&p, off, WriteFlags::default()).unwrap();
                        let mut b = vec![0u8; 4096];
                        dev.read_at(&mut b, off).unwrap();
                        assert_eq!(b, p);
                        i += 1;
                    }
                    i
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        drop(srv);
        std::thread::sleep(Duration::from_millis(150));
        let srv = TestServer::start(&sock, disk.clone());
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            assert!(w.join().unwrap() > 0);
        }
        drop(srv);
    });
    assert!(dev.reconnects() >= 1, "the restart went unnoticed");
    // The server is gone for good now: a request fails after its retries.
    let quick = NbdOptions {
        reconnect_tries: 2,
        first_backoff: Duration::from_millis(10),
        ..NbdOptions::default()
    };
    let srv = TestServer::start(&sock, disk.clone());
    let dev = NbdDev::connect_with(&uri(&sock), quick, false).unwrap();
    let mut b = [0u8; 4096];
    dev.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [5u8; 4096]);
    drop(srv);
    let e = dev.read_at(&mut b, 0).unwrap_err().to_string();
    assert!(e.contains("reconnects"), "{e}");
}

#[test]
fn refused_connections_say_what_to_do() {
    let e = NbdDev::connect(&NbdUri::parse("nbd+unix:///?socket=/nonexistent/s").unwrap())
        .err()
        .unwrap();
    assert!(e.to_string().contains("is the NBD server running"), "{e}");
}

/// Why connecting to `u` with `o` fails (it must).
fn connect_err(u: &NbdUri, o: NbdOptions) -> String {
    NbdDev::connect_with(u, o, false).err().unwrap().to_string()
}

/// A PSK-only server's acceptor, its key file holding `alice`'s key.
fn psk_server(dir: &Path) -> TlsAcceptor {
    let keys = dir.join("server.psk");
    std::fs::write(&keys, "alice:00112233445566778899aabbccddeeff\n").unwrap();
    TlsAcceptor::new(&TlsOptions {
        psk_file: Some(keys),
        ..TlsOptions::default()
    })
    .unwrap()
}

fn tls_uri(sock: &Path, user: &str, key: &str, dir: &Path) -> NbdUri {
    let file = dir.join(format!("{user}-{}.psk", &key[..4]));
    std::fs::write(&file, format!("{user}:{key}\n")).unwrap();
    NbdUri::parse(&format!(
        "nbds+unix://{user}@/?socket={}&tls-psk-file={}",
        sock.display(),
        file.display()
    ))
    .unwrap()
}

/// The pipeline over TLS (the relay thread): many threads with requests
/// in flight, a read larger than the relay's buffers, a server restart
/// (the reconnect runs STARTTLS again), and the refusals: a wrong key, a
/// plain client on a TLS-only server, TLS asked of a server without it.
#[test]
fn tls_psk_connections_carry_concurrent_requests_and_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let sock = sock_in(&dir);
    let disk = mem("16M");
    let srv = TestServer::start_tls(&sock, disk.clone(), Some(psk_server(dir.path())));
    let key = "00112233445566778899aabbccddeeff";
    let u = tls_uri(&sock, "alice", key, dir.path());
    let dev = Arc::new(NbdDev::connect_with(&u, opts(true), false).unwrap());
    assert!(dev.describe().contains("TLS"), "{}", dev.describe());
    write_and_read_back_from_8_threads(&dev, 32, |_| WriteFlags::default());
    let big: Vec<u8> = (0..12u64 << 20).map(|i| (i * 7 % 251) as u8).collect();
    dev.write_at(&big, 2 << 20, WriteFlags::default()).unwrap();
    dev.flush().unwrap();
    let mut back = vec![0u8; big.len()];
    dev.read_at(&mut back, 2 << 20).unwrap();
    assert!(back == big, "a 12 MiB read through the relay");

    drop(srv);
    let srv = TestServer::start_tls(&sock, disk.clone(), Some(psk_server(dir.path())));
    let mut b = vec![0u8; 4096];
    dev.read_at(&mut b, 0).unwrap();
    assert_eq!(b, pattern(0, 0));
    assert_eq!(dev.reconnects(), 1);

    let wrong = tls_uri(
        &sock,
        "alice",
        "ffeeddccbbaa99887766554433221100",
        dir.path(),
    );
    let e = connect_err(&wrong, opts(true));
    assert!(
        e.contains("TLS-PSK handshake as identity 'alice' failed"),
        "{e}"
    );
    let e = connect_err(&uri(&sock), opts(true));
    assert!(e.contains("the server requires TLS: use nbds://"), "{e}");
    drop(srv);
    let _plain = TestServer::start(&sock, disk);
    let e = connect_err(&u, opts(true));
    assert!(e.contains("the server does not offer TLS"), "{e}");
}

#[test]
fn tls_credentials_are_checked_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let connect = |uri: String| connect_err(&NbdUri::parse(&uri).unwrap(), opts(true));
    let e = connect(format!(
        "nbds://a@127.0.0.1:1/?tls-psk-file={}/none.psk",
        d.display()
    ));
    assert!(e.contains("cannot read PSK file"), "{e}");
    std::fs::write(d.join("bad.psk"), "alice:zz\n").unwrap();
    let e = connect(format!(
        "nbds://alice@127.0.0.1:1/?tls-psk-file={}/bad.psk",
        d.display()
    ));
    assert!(e.contains("not hexadecimal"), "{e}");
    std::fs::write(d.join("bob.psk"), "bob:0011\n").unwrap();
    let e = connect(format!(
        "nbds://alice@127.0.0.1:1/?tls-psk-file={}/bob.psk",
        d.display()
    ));
    assert!(e.contains("no key for identity 'alice'"), "{e}");
    let e = connect(format!(
        "nbds://127.0.0.1:1/?tls-certificates={}/nope",
        d.display()
    ));
    assert!(e.contains("no such folder"), "{e}");
    let e = connect(format!(
        "nbds://127.0.0.1:1/?tls-certificates={}",
        d.display()
    ));
    assert!(e.contains("ca-cert.pem is missing"), "{e}");
}

/// A server that accepts and says nothing (or a TLS server that stalls)
/// fails the connection after the handshake timeout instead of hanging.
#[test]
fn a_silent_server_fails_the_handshake_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let sock = sock_in(&dir);
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // The first connection waits in the backlog, never accepted.
    let quick = NbdOptions {
        handshake_timeout: Duration::from_millis(300),
        ..opts(true)
    };
    let t0 = std::time::Instant::now();
    let e = connect_err(&uri(&sock), quick.clone());
    assert!(
        e.contains("did not finish the NBD handshake within 300ms"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));

    // A server that accepts STARTTLS, then never speaks TLS.
    drop(listener);
    let sock = dir.path().join("stall.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let stall = std::thread::spawn(move || {
        use crate::proto::*;
        use std::io::{Read, Write};
        let (mut c, _) = listener.accept().unwrap();
        let mut hello = NBDMAGIC.to_be_bytes().to_vec();
        hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
        hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        c.write_all(&hello).unwrap();
        let mut b = [0u8; 4 + 16];
        c.read_exact(&mut b).unwrap();
        c.write_all(&encode_option_reply(OPT_STARTTLS, REP_ACK, &[]))
            .unwrap();
        std::thread::sleep(Duration::from_millis(900));
    });
    let u = tls_uri(
        &sock,
        "alice",
        "00112233445566778899aabbccddeeff",
        dir.path(),
    );
    let e = connect_err(&u, quick);
    assert!(
        e.contains("did not finish the NBD handshake within 300ms"),
        "{e}"
    );
    stall.join().unwrap();
}
