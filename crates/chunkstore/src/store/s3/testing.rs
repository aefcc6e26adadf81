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
