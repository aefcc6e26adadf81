//! Object stores for the S3 store's unit tests: object_store's in-memory
//! store behind a wrapper that answers some requests as a given S3 server
//! would.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// In memory, refusing a suffix range longer than the object as
/// `rclone serve s3` does (416 Range Not Satisfiable) where AWS answers
/// with the whole object.
#[derive(Debug, Default)]
pub struct NoLongSuffix {
    inner: InMemory,
    /// Suffix reads refused.
    pub refused: AtomicUsize,
}

impl NoLongSuffix {
    pub fn new() -> Arc<NoLongSuffix> {
        Arc::new(NoLongSuffix::default())
    }
}

impl fmt::Display for NoLongSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NoLongSuffix({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for NoLongSuffix {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if let Some(GetRange::Suffix(n)) = options.range {
            let size = self.inner.head(location).await?.size;
            if n > size {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(object_store::Error::Generic {
                    store: "S3",
                    source: format!(
                        "Client error with status 416 Range Not Satisfiable: bytes=-{n} of {size}"
                    )
                    .into(),
                });
            }
        }
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// In memory, losing the power at the N-th request (a client process that
/// dies): that request takes effect or not, as `lands` says (an S3 request
/// is atomic, but its answer may be lost), and every later one fails.
/// `inner` is what a client started after the crash finds.
#[derive(Debug)]
pub struct PowerCut {
    pub inner: Arc<InMemory>,
    /// Requests made so far.
    pub calls: AtomicUsize,
    /// The request that fails (1-based), `usize::MAX` for none.
    at: usize,
    lands: bool,
}

impl PowerCut {
    pub fn new(inner: Arc<InMemory>, at: usize, lands: bool) -> Arc<PowerCut> {
        Arc::new(PowerCut {
            inner,
            calls: AtomicUsize::new(0),
            at,
            lands,
        })
    }

    /// Whether this request may run (`Ok`), and whether its effect stays
    /// without an answer (`Err(true)`) or never happens (`Err(false)`).
    fn power(&self) -> Result<(), bool> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        match n.cmp(&self.at) {
            std::cmp::Ordering::Less => Ok(()),
            std::cmp::Ordering::Equal => Err(self.lands),
            std::cmp::Ordering::Greater => Err(false),
        }
    }
}

fn lost() -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: "simulated power loss: the client is gone".into(),
    }
}

impl fmt::Display for PowerCut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PowerCut({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for PowerCut {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        match self.power() {
            Ok(()) => self.inner.put_opts(location, payload, opts).await,
            Err(true) => {
                let _ = self.inner.put_opts(location, payload, opts).await;
                Err(lost())
            }
            Err(false) => Err(lost()),
        }
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.power().map_err(|_| lost())?;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.power().map_err(|_| lost())?;
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        use futures::StreamExt;
        match self.power() {
            Ok(()) => self.inner.delete_stream(locations),
            Err(lands) => {
                let inner = self.inner.clone();
                // Some of a batch delete may land before the answer is lost.
                futures::stream::once(async move {
                    if lands {
                        let _ = inner.delete_stream(locations).collect::<Vec<_>>().await;
                    }
                    Err(lost())
                })
                .boxed()
            }
        }
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        use futures::StreamExt;
        match self.power() {
            Ok(()) => self.inner.list(prefix),
            Err(_) => futures::stream::once(async { Err(lost()) }).boxed(),
        }
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.power().map_err(|_| lost())?;
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        match self.power() {
            Ok(()) => self.inner.copy_opts(from, to, options).await,
            Err(true) => {
                let _ = self.inner.copy_opts(from, to, options).await;
                Err(lost())
            }
            Err(false) => Err(lost()),
        }
    }
}
