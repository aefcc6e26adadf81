//! The layer kinds of this crate for stack specs:
//!
//! - `cas[store=S,key-file=F,token-file=T,ca=C,zero-detect=on|off,prefetch=on|off,readahead=on|off]:SESSION` — a session's
//!   writable disk (see `crate::session`);
//! - `cas-version[store=S,key-file=F,token-file=T,ca=C]:USER/IMAGE[@REV]` — a committed
//!   version, read-only (time travel without materialising).

use std::path::PathBuf;
use std::sync::Arc;

use roamdisk_blockdev::{BlockDev, LayerKind, OpenCtx};

use crate::cache::SharedChoice;
use crate::session::dev::{CasDev, Host, SessionOpen};
use crate::view::VersionView;
use roamdisk_chunkstore::store::http::Credentials;

/// The `token-file` and `ca` options of a layer.
fn credentials(ctx: &OpenCtx<'_>) -> Credentials {
    Credentials {
        token_file: ctx.opt("token-file").map(PathBuf::from),
        ca_file: ctx.opt("ca").map(PathBuf::from),
    }
}

/// What the program running the layer says when nothing else does: the
/// registry's `default-token-file` and `default-ca` (its environment).
fn fallback_credentials(ctx: &OpenCtx<'_>) -> Credentials {
    Credentials {
        token_file: ctx.opt("default-token-file").map(PathBuf::from),
        ca_file: ctx.opt("default-ca").map(PathBuf::from),
    }
}

/// This host as the program described it (`Registry::set_context`), with
/// the layer's `host-cache` and `s3-index-cache` (`off`: nowhere) over it.
fn host(ctx: &OpenCtx<'_>) -> Host {
    let mut h = ctx.registry.context::<Host>().cloned().unwrap_or_default();
    if let Some(c) = ctx.opt("host-cache") {
        h.cache = Some(PathBuf::from(c));
    }
    if let Some(d) = ctx.opt("s3-index-cache") {
        h.s3.index_cache = (d != "off").then(|| PathBuf::from(d));
    }
    h
}

/// The session folder of a `cas:` layer and how its options open it.
pub fn session_open(ctx: &OpenCtx<'_>) -> roamdisk_blockdev::Result<(PathBuf, SessionOpen)> {
    let dir = ctx.path("cas", "session")?;
    let opts = SessionOpen {
        read_only: ctx.read_only,
        store: ctx.opt("store").map(str::to_string),
        key_file: ctx.opt("key-file").map(PathBuf::from),
        credentials: credentials(ctx),
        fallback_credentials: fallback_credentials(ctx),
        host: host(ctx),
        zero_detect: ctx.flag("cas", "zero-detect")?,
        shared_cache: SharedChoice::parse(ctx.opt("shared-cache")),
        lookaside: crate::lookaside::parse_media(ctx.opt("lookaside")),
        no_prefetch: ctx.flag("cas", "prefetch")? == Some(false),
        no_readahead: ctx.flag("cas", "readahead")? == Some(false),
        ..SessionOpen::default()
    };
    Ok((dir, opts))
}

/// `cas:SESSION`.
pub static CAS: LayerKind = LayerKind {
    name: "cas",
    summary: "a content-addressed image session (roamdisk checkout --session): private cache of this session's sectors over a version in a chunk store",
    args: &["session"],
    options: &[
        ("store", "chunk store (directory or http(s):// URL) instead of the session's"),
        ("key-file", "the user's key file (encrypted images)"),
        ("token-file", "token file for an HTTP store, instead of the session's (default: the session's, else $ROAMDISK_STORE_TOKEN_FILE)"),
        ("ca", "CA certificates (PEM) trusted for an https:// store, instead of the session's (default $ROAMDISK_STORE_CA, else the system's)"),
        ("zero-detect", "P1 at write time: a sector of zeroes is kept as ZERO with no data (on/off, default on)"),
        ("shared-cache", "the host's shared chunk cache: a folder, or off (default $ROAMDISK_SHARED_CACHE, else ~/.cache/roamdisk/shared)"),
        ("lookaside", "media tried before the store, separated by '+': chunk-store folders (a resume set), image files (raw, or qcow2 read through qemu-nbd), block devices; every chunk found is verified"),
        ("host-cache", "this host's cache folder: image media's chunk indexes are kept under lookaside/ in it (the roamdisk command: $XDG_CACHE_HOME/roamdisk, else ~/.cache/roamdisk)"),
        ("s3-index-cache", "where an s3:// store keeps the pack indexes it read, or off (the roamdisk command: $ROAMDISK_S3_INDEX_CACHE, else HOST-CACHE/s3-index)"),
        ("prefetch", "fetch the base version's recorded working set in the background, in the order it was first read (on/off, default on)"),
        ("readahead", "while the guest reads the base in sequence, fetch the next 4 to 32 chunks in the background, together (on/off, default on)"),
    ],
    open: |ctx: &OpenCtx<'_>, _next| {
        let (dir, opts) = session_open(ctx)?;
        let dev = Arc::new(CasDev::open(&dir, &opts, ctx.registry)?);
        dev.start_prefetch();
        dev.start_readahead();
        Ok(dev as Arc<dyn BlockDev>)
    },
    ..LayerKind::BOTTOM
};

/// `cas-version:USER/IMAGE[@REV]`.
pub static CAS_VERSION: LayerKind = LayerKind {
    name: "cas-version",
    summary: "a committed version of a content-addressed image, read-only (time travel: @VERSION, @TAG or @DATE)",
    args: &["image"],
    options: &[
        ("store", "chunk store (directory or http(s):// URL; default $ROAMDISK_STORE)"),
        ("key-file", "the user's key file (encrypted images)"),
        ("token-file", "token file for an HTTP store (default $ROAMDISK_STORE_TOKEN_FILE)"),
        ("ca", "CA certificates (PEM) trusted for an https:// store (default $ROAMDISK_STORE_CA, else the system's)"),
        ("shared-cache", "the host's shared chunk cache: a folder, or off (default $ROAMDISK_SHARED_CACHE, else ~/.cache/roamdisk/shared)"),
        ("lookaside", "media tried before the store, separated by '+': chunk-store folders (a resume set), image files (raw, or qcow2 read through qemu-nbd), block devices; every chunk found is verified"),
        ("host-cache", "this host's cache folder: image media's chunk indexes are kept under lookaside/ in it (the roamdisk command: $XDG_CACHE_HOME/roamdisk, else ~/.cache/roamdisk)"),
        ("s3-index-cache", "where an s3:// store keeps the pack indexes it read, or off (the roamdisk command: $ROAMDISK_S3_INDEX_CACHE, else HOST-CACHE/s3-index)"),
    ],
    open: |ctx: &OpenCtx<'_>, _next| {
        let target = ctx.get("cas-version", "image")?;
        let loc = ctx.get("cas-version", "store")?;
        let host = host(ctx);
        let store = roamdisk_chunkstore::store::open(
            loc,
            &roamdisk_chunkstore::store::OpenOptions {
                credentials: credentials(ctx).or(&fallback_credentials(ctx)),
                s3: host.s3.clone(),
                ..Default::default()
            },
        )?;
        let key = match ctx.opt("key-file") {
            Some(k) => Some(roamdisk_chunkstore::version::read_key_file(std::path::Path::new(k))?),
            None => None,
        };
        let (_, entry) = roamdisk_chunkstore::repo::resolve(&*store, target)?;
        let view = VersionView::open(store.clone(), entry.version, key.as_ref())?
            .with_shared_cache(SharedChoice::parse(ctx.opt("shared-cache")).open()?);
        let media = crate::lookaside::parse_media(ctx.opt("lookaside"));
        let media = crate::lookaside::open_media(
            store.config().hash,
            view.version.index.chunk_size,
            &media,
            host.lookaside_index().as_deref(),
        )?;
        let view = view.with_lookaside(media);
        Ok(view.served() as Arc<dyn BlockDev>)
    },
    ..LayerKind::BOTTOM
};
