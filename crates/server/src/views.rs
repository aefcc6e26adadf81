//! Golden images, opened once and read-only, and each client's view of
//! them: the golden stack under the client's own copy-on-write overlay,
//! made on its first open, shared by its connections and kept in the
//! state directory. [`Views`] is the NBD server's [`ExportResolver`].
//!
//! With a `[cache]` in the config, one [`BlockCache`] sits in front of
//! every cached golden image (each image its own device of it), below
//! the views' overlays: what the cache holds is golden data only, which
//! never changes while the server runs (golden stacks are opened
//! read-only; nothing writes to them through the server). Each client's
//! export device is wrapped in a [`Metered`] layer counting into its own
//! counters.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use roamdisk_blockdev::layers::cow::{CowDev, CowOptions};
use roamdisk_blockdev::{Access, BlockDev, Checked, LayerSpec, Registry};
use roamdisk_cachesim::layer::BlockCache;
use roamdisk_nbd::access::ConnectionGuard;
use roamdisk_nbd::{Export, ExportResolver, Peer, Refusal};

use crate::access::{grant, grants, identify, Grant};
use crate::config::ServerConfig;
use crate::metered::Metered;
use crate::metrics::{Connection, Metrics, NOT_GRANTED, UNKNOWN_CLIENT, VIEW_FAILED};
use crate::state::overlay_path;

/// Why the golden images, the cache or a client's view cannot be opened
/// (each says which image and what to fix).
#[derive(Debug, thiserror::Error)]
pub enum ViewsError {
    /// An image's `stack` or `view-layers` does not parse or open.
    #[error("image '{image}' key '{key}': {error}")]
    Key {
        image: String,
        key: &'static str,
        error: Box<roamdisk_blockdev::Error>,
    },
    /// An image's stack does not open.
    #[error("cannot open image '{image}': {error}")]
    Image {
        image: String,
        error: Box<roamdisk_blockdev::Error>,
    },
    /// The `[cache]` table's cache cannot be made.
    #[error("[cache]: {0}")]
    Cache(Box<roamdisk_blockdev::Error>),
    /// An image cannot be put behind the cache.
    #[error("image '{image}': {error}")]
    Attach {
        image: String,
        error: Box<roamdisk_blockdev::Error>,
    },
    /// A client's view (its overlay) does not open.
    #[error("cannot open the view: {0}")]
    View(Box<roamdisk_blockdev::Error>),
    /// The layers of an image's `view-layers` do not open over a view.
    #[error("cannot open the view's view-layers: {0}")]
    ViewLayers(Box<roamdisk_blockdev::Error>),
}

/// What a reload changed: client names added, removed, and changed (an
/// identity or a grant).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// Why a reload was refused (the config served before stays in force).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The file cannot be read or is wrong.
    #[error(transparent)]
    Config(#[from] crate::config::ServerConfigError),
    /// Settings only a restart applies changed.
    #[error("{} changed: restart the server to apply that (a reload applies [[client]] tables and the PSK file only)", .0.join(", "))]
    NeedsRestart(Vec<&'static str>),
    /// The PSK file cannot be read again.
    #[error(transparent)]
    Psk(#[from] roamdisk_nbd::TlsError),
}

/// A client's opened view: its export (metered) and the same view
/// unmetered, for the server's final flush.
struct View {
    export: Arc<Export>,
    plain: Arc<Export>,
}

/// The golden images and the views opened so far.
pub struct Views {
    /// The config being served: replaced whole by [`Views::reload`] (its
    /// clients and grants; what else it holds does not change while the
    /// server runs).
    cfg: RwLock<Arc<ServerConfig>>,
    state: PathBuf,
    /// Each image's stack, read-only, behind the server cache when it is
    /// cached, shared by every view of it.
    golden: HashMap<String, Arc<dyn BlockDev>>,
    /// (client, image) -> the image as that client's read-only export,
    /// made on first use.
    read_only: Mutex<HashMap<(String, String), Arc<Export>>>,
    /// (client, image) -> that client's view, opened on first use.
    views: Mutex<HashMap<(String, String), View>>,
    metrics: Arc<Metrics>,
    /// Wrap exports in [`Metered`] (only when something will read the
    /// counters: a `metrics` address).
    metered: bool,
    /// Each image's `view-layers`, parsed, and the registry to open them.
    view_layers: HashMap<String, LayerSpec>,
    registry: Registry,
}

/// Open every golden image of `cfg`, read-only.
pub fn open_golden(
    cfg: &ServerConfig,
    reg: &Registry,
) -> Result<HashMap<String, Arc<dyn BlockDev>>, ViewsError> {
    let mut golden = HashMap::new();
    for im in &cfg.image {
        let spec = reg.parse(&im.stack).map_err(|error| ViewsError::Key {
            image: im.name.clone(),
            key: "stack",
            error: Box::new(error),
        })?;
        let dev = reg
            .open(&spec, Access::ReadOnly)
            .map_err(|error| ViewsError::Image {
                image: im.name.clone(),
                error: Box::new(error),
            })?;
        golden.insert(im.name.clone(), dev);
    }
    Ok(golden)
}

/// `client`'s view of `golden` as a device: its overlay under `state`,
/// created when `read_only` is false and there is none yet.
pub fn open_view(
    state: &Path,
    client: &str,
    image: &str,
    golden: Arc<dyn BlockDev>,
    read_only: bool,
) -> roamdisk_blockdev::Result<Arc<CowDev>> {
    let ovl = overlay_path(state, client, image);
    if let Some(dir) = ovl.parent() {
        if !read_only {
            std::fs::create_dir_all(dir).map_err(|e| {
                roamdisk_blockdev::Error::io(roamdisk_blockdev::Op::Open, "server", e).path(dir)
            })?;
        }
    }
    Ok(Arc::new(CowDev::open(
        &ovl,
        golden,
        read_only,
        &CowOptions::default(),
    )?))
}

/// `dev` counted into `pair` when `metered`.
fn meter(
    dev: Arc<dyn BlockDev>,
    pair: Arc<crate::metrics::Pair>,
    metrics: &Arc<Metrics>,
    metered: bool,
) -> Arc<dyn BlockDev> {
    if metered {
        Arc::new(Metered::new(dev, pair, metrics.clone()))
    } else {
        dev
    }
}

impl Views {
    /// Open the golden images, behind the server cache if the config has
    /// one; views open on demand.
    pub fn open(cfg: Arc<ServerConfig>, state: &Path, reg: &Registry) -> Result<Views, ViewsError> {
        let mut golden = open_golden(&cfg, reg)?;
        let mut view_layers = HashMap::new();
        for im in &cfg.image {
            if let Some(v) = &im.view_layers {
                let bad = |error| ViewsError::Key {
                    image: im.name.clone(),
                    key: "view-layers",
                    error: Box::new(error),
                };
                let spec = reg.parse_over(v).map_err(bad)?;
                // Their options are checked when they open: open them
                // once now, over a stand-in, so a mistake stops the start.
                let stand_in = Arc::new(roamdisk_blockdev::layers::mem::MemDev::new(1 << 20));
                reg.open_over(&spec, Access::ReadWrite, stand_in)
                    .map_err(bad)?;
                view_layers.insert(im.name.clone(), spec);
            }
        }
        let cache = match cfg.cache_options() {
            Some(o) => Some(BlockCache::new(o).map_err(|e| ViewsError::Cache(Box::new(e)))?),
            None => None,
        };
        let mut metrics = Metrics::new(&cfg, state);
        let mut images = Vec::new();
        for (i, im) in cfg.image.iter().enumerate() {
            let dev = golden[&im.name].clone();
            let mut device = None;
            if let Some(c) = cache.as_ref().filter(|_| im.cache) {
                // The image's index is its device number in the cache.
                let d = u32::try_from(i).unwrap_or(u32::MAX);
                let front = c
                    .attach(d, dev.clone())
                    .map_err(|error| ViewsError::Attach {
                        image: im.name.clone(),
                        error: Box::new(error),
                    })?;
                golden.insert(im.name.clone(), Arc::new(front));
                device = Some(d);
            }
            images.push((im.name.clone(), dev.size(), device));
        }
        metrics.set_images(images, cache);
        let metrics = Arc::new(metrics);
        let metered = cfg.metrics.is_some();
        Ok(Views {
            cfg: RwLock::new(cfg),
            state: state.to_path_buf(),
            golden,
            read_only: Mutex::new(HashMap::new()),
            views: Mutex::new(HashMap::new()),
            metrics,
            metered,
            view_layers,
            registry: reg.clone(),
        })
    }

    /// What the server counts.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The config being served.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.cfg.read().clone()
    }

    /// Serve `next` from now on, if it differs from the config being served
    /// only in its clients (who they are, how they prove it, what they may
    /// open): new connections are identified and granted by it at once,
    /// and `tls` reads its PSK file again first. Anything else changed
    /// needs a restart, and refuses the reload (nothing changes).
    pub fn reload(
        &self,
        next: ServerConfig,
        tls: Option<&roamdisk_nbd::TlsAcceptor>,
    ) -> Result<Reloaded, ReloadError> {
        let now = self.config();
        let changed = now.restart_needed(&next);
        if !changed.is_empty() {
            return Err(ReloadError::NeedsRestart(changed));
        }
        if let Some(t) = tls {
            t.reload_psk()?;
        }
        let names =
            |c: &ServerConfig| -> Vec<String> { c.client.iter().map(|c| c.name.clone()).collect() };
        let (old, new) = (names(&now), names(&next));
        let r = Reloaded {
            added: new.iter().filter(|n| !old.contains(n)).cloned().collect(),
            removed: old.iter().filter(|n| !new.contains(n)).cloned().collect(),
            changed: next
                .client
                .iter()
                .filter(|c| now.client(&c.name).is_some_and(|o| o != *c))
                .map(|c| c.name.clone())
                .collect(),
        };
        self.metrics.add_grants(&next);
        *self.cfg.write() = Arc::new(next);
        Ok(r)
    }

    /// `client`'s read-only export of `image`, made on first use.
    fn read_only_export(&self, cfg: &ServerConfig, client: &str, image: &str) -> Arc<Export> {
        let mut ro = self.read_only.lock();
        let key = (client.to_string(), image.to_string());
        if let Some(e) = ro.get(&key) {
            return e.clone();
        }
        let checked: Arc<dyn BlockDev> =
            Arc::new(Checked::new(self.golden[image].clone(), Access::ReadOnly));
        let dev = match self.metrics.pair(client, image) {
            Some(pair) => meter(checked, pair, &self.metrics, self.metered),
            None => checked,
        };
        let e = Arc::new(Export {
            name: image.to_string(),
            description: cfg
                .image(image)
                .map(|i| i.description.clone())
                .unwrap_or_default(),
            dev,
        });
        ro.insert(key, e.clone());
        e
    }

    /// `client`'s view of `image`, opened (and its overlay created) on
    /// first use.
    fn view(&self, client: &str, image: &str) -> Result<Arc<Export>, ViewsError> {
        let mut views = self.views.lock();
        let key = (client.to_string(), image.to_string());
        if let Some(v) = views.get(&key) {
            return Ok(v.export.clone());
        }
        let cow = open_view(
            &self.state,
            client,
            image,
            self.golden[image].clone(),
            false,
        )
        .map_err(|e| {
            // The client is refused; the admin has something to fix.
            tracing::error!(client, image, error = %e, "cannot open a client's view");
            ViewsError::View(Box::new(e))
        })?;
        let description = self
            .config()
            .image(image)
            .map(|im| im.description.clone())
            .unwrap_or_default();
        let pair = self.metrics.pair(client, image);
        if let Some(p) = &pair {
            p.set_cow(cow.clone());
        }
        let mut dev: Arc<dyn BlockDev> = cow;
        if let Some(spec) = self.view_layers.get(image) {
            dev = self
                .registry
                .open_over(spec, Access::ReadWrite, dev)
                .map_err(|e| {
                    tracing::error!(client, image, error = %e, "cannot open a client's view");
                    ViewsError::ViewLayers(Box::new(e))
                })?;
        }
        let checked: Arc<dyn BlockDev> = Arc::new(Checked::new(dev, Access::ReadWrite));
        let plain = Arc::new(Export {
            name: image.to_string(),
            description: description.clone(),
            dev: checked.clone(),
        });
        let dev = match pair {
            Some(pair) => meter(checked, pair, &self.metrics, self.metered),
            None => checked,
        };
        let export = Arc::new(Export {
            name: image.to_string(),
            description,
            dev,
        });
        tracing::info!(client, image, "view opened");
        views.insert(
            key,
            View {
                export: export.clone(),
                plain,
            },
        );
        Ok(export)
    }
}

impl ExportResolver for Views {
    fn list(&self, peer: &Peer) -> Vec<(String, String)> {
        let cfg = self.config();
        let Some(c) = identify(&cfg, peer) else {
            tracing::warn!(%peer, "refused: LIST from an unknown client");
            return Vec::new();
        };
        grants(c)
            .map(|(name, _)| {
                let d = cfg.image(name).map(|i| i.description.clone());
                (name.to_string(), d.unwrap_or_default())
            })
            .collect()
    }

    fn resolve(&self, peer: &Peer, name: &str) -> Result<Arc<Export>, Refusal> {
        let refuse = |kind: &'static str, reason: String| Refusal { reason, kind };
        let cfg = self.config();
        let Some(c) = identify(&cfg, peer) else {
            return Err(refuse(
                UNKNOWN_CLIENT,
                "unknown client (no configured identity matches)".into(),
            ));
        };
        // The empty name is the client's first grant.
        let found = if name.is_empty() {
            grants(c).next()
        } else {
            grant(c, name).map(|g| (name, g))
        };
        let Some((image, g)) = found else {
            return Err(refuse(
                NOT_GRANTED,
                format!("client '{}' has no grant for it", c.name),
            ));
        };
        match g {
            Grant::ReadOnly => Ok(self.read_only_export(&cfg, &c.name, image)),
            Grant::View => self
                .view(&c.name, image)
                .map_err(|e| refuse(VIEW_FAILED, format!("client '{}': {e}", c.name))),
        }
    }

    fn opened(&self) -> Vec<Arc<Export>> {
        self.views
            .lock()
            .values()
            .map(|v| v.plain.clone())
            .collect()
    }

    fn refused(&self, _peer: &Peer, kind: &'static str) {
        self.metrics.refused(kind);
    }

    fn connected(&self, peer: &Peer, export: &Arc<Export>) -> Option<ConnectionGuard> {
        let cfg = self.config();
        let c = identify(&cfg, peer)?;
        let pair = self.metrics.pair(&c.name, &export.name)?;
        Some(Box::new(Connection::new(pair)))
    }
}
