//! Golden images, opened once and read-only, and each client's view of
//! them: the golden stack under the client's own copy-on-write overlay,
//! made on its first open, shared by its connections and kept in the
//! state directory. [`Views`] is the NBD server's [`ExportResolver`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use roamdisk_blockdev::layers::cow::{CowDev, CowOptions};
use roamdisk_blockdev::{Access, BlockDev, Checked, Registry};
use roamdisk_nbd::{Export, ExportResolver, Peer, Refusal};

use crate::access::{grant, grants, identify, Grant};
use crate::config::ServerConfig;
use crate::state::overlay_path;

/// The golden images and the views opened so far.
pub struct Views {
    cfg: Arc<ServerConfig>,
    state: PathBuf,
    /// Each image's stack, read-only, shared by every view of it.
    golden: HashMap<String, Arc<dyn BlockDev>>,
    /// Each image as a read-only export (for `read-only` grants).
    read_only: HashMap<String, Arc<Export>>,
    /// (client, image) -> that client's view, opened on first use.
    views: Mutex<HashMap<(String, String), Arc<Export>>>,
}

/// Open every golden image of `cfg`, read-only.
pub fn open_golden(
    cfg: &ServerConfig,
    reg: &Registry,
) -> Result<HashMap<String, Arc<dyn BlockDev>>, String> {
    let mut golden = HashMap::new();
    for im in &cfg.image {
        let spec = reg
            .parse(&im.stack)
            .map_err(|e| format!("image '{}' key 'stack': {e}", im.name))?;
        let dev = reg
            .open(&spec, Access::ReadOnly)
            .map_err(|e| format!("cannot open image '{}': {e}", im.name))?;
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
) -> roamdisk_blockdev::Result<Arc<dyn BlockDev>> {
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

impl Views {
    /// Open the golden images; views open on demand.
    pub fn open(cfg: Arc<ServerConfig>, state: &Path, reg: &Registry) -> Result<Views, String> {
        let golden = open_golden(&cfg, reg)?;
        let read_only = cfg
            .image
            .iter()
            .map(|im| {
                let dev: Arc<dyn BlockDev> =
                    Arc::new(Checked::new(golden[&im.name].clone(), Access::ReadOnly));
                let e = Export {
                    name: im.name.clone(),
                    description: im.description.clone(),
                    dev,
                };
                (im.name.clone(), Arc::new(e))
            })
            .collect();
        Ok(Views {
            cfg,
            state: state.to_path_buf(),
            golden,
            read_only,
            views: Mutex::new(HashMap::new()),
        })
    }

    /// `client`'s view of `image`, opened (and its overlay created) on
    /// first use.
    fn view(&self, client: &str, image: &str) -> Result<Arc<Export>, String> {
        let mut views = self.views.lock().expect("views lock");
        let key = (client.to_string(), image.to_string());
        if let Some(e) = views.get(&key) {
            return Ok(e.clone());
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
            format!("cannot open the view: {e}")
        })?;
        let description = self
            .cfg
            .image(image)
            .map(|im| im.description.clone())
            .unwrap_or_default();
        let e = Arc::new(Export {
            name: image.to_string(),
            description,
            dev: Arc::new(Checked::new(cow, Access::ReadWrite)),
        });
        tracing::info!(client, image, "view opened");
        views.insert(key, e.clone());
        Ok(e)
    }
}

impl ExportResolver for Views {
    fn list(&self, peer: &Peer) -> Vec<(String, String)> {
        let Some(c) = identify(&self.cfg, peer) else {
            tracing::warn!(%peer, "refused: LIST from an unknown client");
            return Vec::new();
        };
        grants(c)
            .map(|(name, _)| {
                let d = self.cfg.image(name).map(|i| i.description.clone());
                (name.to_string(), d.unwrap_or_default())
            })
            .collect()
    }

    fn resolve(&self, peer: &Peer, name: &str) -> Result<Arc<Export>, Refusal> {
        let refuse = |reason: String| Refusal { reason };
        let Some(c) = identify(&self.cfg, peer) else {
            return Err(refuse(
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
            return Err(refuse(format!("client '{}' has no grant for it", c.name)));
        };
        match g {
            Grant::ReadOnly => Ok(self.read_only[image].clone()),
            Grant::View => self
                .view(&c.name, image)
                .map_err(|e| refuse(format!("client '{}': {e}", c.name))),
        }
    }

    fn opened(&self) -> Vec<Arc<Export>> {
        self.views
            .lock()
            .expect("views lock")
            .values()
            .cloned()
            .collect()
    }
}
