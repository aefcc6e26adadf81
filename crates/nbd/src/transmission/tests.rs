//! The layers see the connection's client id on every request: inline,
//! on the blocking pool and in the settle at disconnect (by default a
//! flush, which is what the witness layer sees).

use parking_lot::Mutex;
use std::sync::Arc;

use roamdisk_blockdev::context;
use roamdisk_blockdev::Access;
use roamdisk_blockdev::{BlockDev, Registry, Result, WriteFlags};
use tokio::io::AsyncWriteExt;

use super::serve;
use crate::export::Export;
use crate::handshake::negotiate;
use crate::proto::*;
use crate::shared::Shared;
use crate::stream::BoxStream;
use crate::tls::TlsMode;

/// Passes everything to `next` and notes which client each write and
/// flush came from.
struct Witness {
    next: Arc<dyn BlockDev>,
    seen: Mutex<Vec<(&'static str, u32, Option<u32>)>>,
}

impl BlockDev for Witness {
    roamdisk_blockdev::layer!("witness", next);
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let who = context::current().client;
        self.seen.lock().push(("write", buf.len() as u32, who));
        self.next.write_at(buf, off, flags)
    }
    fn flush(&self) -> Result<()> {
        let who = context::current().client;
        self.seen.lock().push(("flush", 0, who));
        self.next.flush()
    }
}

/// One client's bytes: handshake (OPT_GO on the default export), then
/// WRITEs of `lens` bytes, then it hangs up without a FLUSH.
fn client_bytes(lens: &[u32]) -> Vec<u8> {
    let mut v = 3u32.to_be_bytes().to_vec();
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&OPT_GO.to_be_bytes());
    v.extend_from_slice(&6u32.to_be_bytes());
    v.extend_from_slice(&0u32.to_be_bytes());
    v.extend_from_slice(&0u16.to_be_bytes());
    for (i, &length) in lens.iter().enumerate() {
        let w = Request {
            flags: 0,
            cmd: CMD_WRITE,
            handle: i as u64,
            offset: 0,
            length,
        };
        v.extend_from_slice(&encode_request(&w));
        v.extend(std::iter::repeat_n(0x5a, length as usize));
    }
    v
}

async fn session(shared: &Arc<Shared>, input: Vec<u8>) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (mut from_server, mut to_server) = tokio::io::split(client);
    let send = async move {
        to_server.write_all(&input).await.unwrap();
        to_server.shutdown().await.unwrap();
    };
    let drain = async move {
        tokio::io::copy(&mut from_server, &mut tokio::io::sink())
            .await
            .unwrap()
    };
    let run = async {
        let s: BoxStream = Box::new(server);
        let (stream, session) = negotiate(s, shared).await.expect("transmission");
        let client = shared.new_client(&session.export);
        serve(stream, session, shared.clone(), client)
            .await
            .unwrap();
    };
    tokio::join!(send, drain, run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_runs_in_its_connections_context() {
    let mem = Registry::with_builtin()
        .build("mem:1M", Access::ReadWrite)
        .unwrap();
    let witness = Arc::new(Witness {
        next: mem,
        seen: Mutex::new(Vec::new()),
    });
    let export = Export {
        name: String::new(),
        description: String::new(),
        dev: witness.clone(),
    };
    let (shared, _shutdown) = Shared::detached(vec![export], TlsMode::Off, 4);
    // A small write runs inline, one above INLINE_MAX_LEN on the pool.
    let big = super::INLINE_MAX_LEN * 2;
    session(&shared, client_bytes(&[512, big])).await;
    session(&shared, client_bytes(&[1024])).await;
    let seen = witness.seen.lock().clone();
    assert_eq!(
        seen,
        vec![
            ("write", 512, Some(1)),
            ("write", big, Some(1)),
            ("flush", 0, Some(1)),
            ("write", 1024, Some(2)),
            ("flush", 0, Some(2)),
        ]
    );
    // Outside a request the context is empty again.
    assert_eq!(context::current().client, None);
    // Every connection that had requests in flight has left the busy count.
    assert_eq!(shared.busy.count(), 0);
}
