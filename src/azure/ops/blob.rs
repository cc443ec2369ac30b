//! The blob itself: [`BlobClient`] and its accessors, and the operations on the whole
//! blob (create, properties, delete, metadata, copy). Pages, leases and snapshots
//! have their own files next to this one.

use std::time::Duration;

use reqwest::Method;

use super::container::ContainerClient;
use crate::azure::error::{AzureError, Op};
use crate::azure::pipeline::{BlobService, Request};
use crate::azure::stats::ClientStats;

pub use crate::azure::ranges::PAGE;

/// Metadata name of the token that makes a retried create recognise its own blob.
pub const CREATE_TOKEN_META: &str = "blobdrivecreate";
/// Largest page blob.
pub const MAX_PAGE_BLOB: u64 = 8 * 1024 * 1024 * 1024 * 1024;

/// What to do with snapshots when deleting a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteSnapshots {
    /// Delete fails with `SnapshotsPresent` if there are any.
    None,
    /// The blob and all its snapshots.
    Include,
    /// Only the snapshots, keeping the blob.
    Only,
}

/// Properties from a HEAD request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobProperties {
    pub content_length: u64,
    pub blob_type: String,
    /// `available`, `leased`, `expired`, `breaking` or `broken`.
    pub lease_state: Option<String>,
    /// `locked` or `unlocked`.
    pub lease_status: Option<String>,
    /// `infinite` or `fixed`, only while leased.
    pub lease_duration: Option<String>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub sequence_number: Option<u64>,
    pub copy_status: Option<String>,
    pub copy_status_description: Option<String>,
    /// The source of the last copy onto this blob (`x-ms-copy-source`).
    pub copy_source: Option<String>,
    /// The id of the last copy onto this blob (`x-ms-copy-id`): new for each copy.
    pub copy_id: Option<String>,
    /// `x-ms-meta-*` headers, names without the prefix, lower-cased.
    pub metadata: Vec<(String, String)>,
}

/// One blob (or one snapshot of it).
#[derive(Clone)]
pub struct BlobClient {
    pub(in crate::azure) svc: BlobService,
    pub(in crate::azure) container: String,
    pub(in crate::azure) name: String,
    pub(in crate::azure) snapshot: Option<String>,
}

impl BlobClient {
    pub fn service(&self) -> &BlobService {
        &self.svc
    }

    pub fn container_name(&self) -> &str {
        &self.container
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn snapshot(&self) -> Option<&str> {
        self.snapshot.as_deref()
    }

    /// The same blob at a snapshot (or the base blob with `None`).
    pub fn at_snapshot(&self, snapshot: Option<&str>) -> BlobClient {
        BlobClient {
            snapshot: snapshot.map(str::to_string),
            ..self.clone()
        }
    }

    pub fn container(&self) -> ContainerClient {
        self.svc.container(&self.container)
    }

    /// `container/name` or `container/name@snapshot`: how the blob is named in messages.
    pub fn target(&self) -> String {
        match &self.snapshot {
            Some(s) => format!("{}/{}@{}", self.container, self.name, s),
            None => format!("{}/{}", self.container, self.name),
        }
    }

    pub(super) fn request(
        &self,
        op: Op,
        method: Method,
        query: &[(&str, &str)],
        ok: &'static [u16],
    ) -> Request {
        let mut q: Vec<(&str, &str)> = query.to_vec();
        if let Some(s) = self.snapshot.as_deref() {
            q.push(("snapshot", s));
        }
        Request::new(
            op,
            self.target(),
            method,
            self.svc.url(&[&self.container, &self.name], &q),
            ok,
        )
    }

    pub(super) fn invalid(&self, op: Op, reason: impl Into<String>) -> AzureError {
        AzureError::Invalid {
            op,
            target: self.target(),
            reason: reason.into(),
        }
    }

    pub(super) fn count(&self, f: impl FnOnce(&ClientStats)) {
        f(&self.svc.inner.stats)
    }

    /// Creates an empty page blob of `size` bytes; never replaces an existing blob
    /// (`If-None-Match: *` makes the service refuse with `BlobAlreadyExists`).
    pub async fn create_page_blob(&self, size: u64) -> Result<(), AzureError> {
        self.create_page_blob_with(size, &[]).await.map(|_| ())
    }

    /// [`Self::create_page_blob`], the blob carrying `metadata` from its
    /// first moment (beside the create token): returns the token, which tells
    /// this create's blob from any other made under the same name.
    pub async fn create_page_blob_with(
        &self,
        size: u64,
        metadata: &[(&str, &str)],
    ) -> Result<String, AzureError> {
        if !size.is_multiple_of(PAGE) || size == 0 || size > MAX_PAGE_BLOB {
            return Err(self.invalid(
                Op::CreateBlob,
                format!(
                    "page blob size {size} must be a positive multiple of 512 of at most 8 TiB"
                ),
            ));
        }
        // A create whose answer was lost may have happened; its retry then meets
        // `BlobAlreadyExists`. The token in the metadata tells our own blob from
        // someone else's, so a retried create never replaces, nor wrongly fails.
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut req = self.request(Op::CreateBlob, Method::PUT, &[], &[201]);
        req.header("x-ms-blob-type", "PageBlob");
        req.header("x-ms-blob-content-length", size.to_string());
        req.header("if-none-match", "*");
        req.header(&format!("x-ms-meta-{CREATE_TOKEN_META}"), token.clone());
        req.headers
            .extend(self.metadata_headers(Op::CreateBlob, metadata)?);
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        match self.svc.execute(req).await {
            Ok(_) => Ok(token),
            Err(e) if e.code() == Some("BlobAlreadyExists") => {
                let ours = self.properties().await.ok().is_some_and(|p| {
                    p.metadata
                        .iter()
                        .any(|(k, v)| k == CREATE_TOKEN_META && *v == token)
                });
                if ours {
                    Ok(token)
                } else {
                    Err(e)
                }
            }
            Err(e) => Err(e),
        }
    }

    pub async fn properties(&self) -> Result<BlobProperties, AzureError> {
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        let resp = self
            .svc
            .execute(self.request(Op::GetProperties, Method::HEAD, &[], &[200]))
            .await?;
        let h = |n: &str| resp.header(n);
        let content_length = h("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| AzureError::Protocol {
                op: Op::GetProperties,
                target: self.target(),
                detail: "no Content-Length".into(),
            })?;
        let mut metadata: Vec<(String, String)> = resp
            .headers
            .iter()
            .filter_map(|(k, v)| {
                let k = k.as_str().strip_prefix("x-ms-meta-")?;
                Some((k.to_string(), v.to_str().ok()?.to_string()))
            })
            .collect();
        metadata.sort();
        Ok(BlobProperties {
            content_length,
            blob_type: h("x-ms-blob-type").unwrap_or_default(),
            lease_state: h("x-ms-lease-state"),
            lease_status: h("x-ms-lease-status"),
            lease_duration: h("x-ms-lease-duration"),
            etag: h("etag"),
            last_modified: h("last-modified"),
            sequence_number: h("x-ms-blob-sequence-number").and_then(|v| v.parse().ok()),
            copy_status: h("x-ms-copy-status"),
            copy_source: h("x-ms-copy-source"),
            copy_id: h("x-ms-copy-id"),
            copy_status_description: h("x-ms-copy-status-description"),
            metadata,
        })
    }

    pub async fn delete(
        &self,
        snapshots: DeleteSnapshots,
        lease: Option<&str>,
    ) -> Result<(), AzureError> {
        self.delete_if_match(snapshots, lease, None).await
    }

    /// [`Self::delete`] only while the blob's ETag is `etag` (else 412
    /// `ConditionNotMet`): an attempt given up on that lands after the blob was
    /// created anew under the same name is refused instead of deleting the new
    /// drive. A retry after an attempt that did delete it may then be answered
    /// 412 rather than 404 (Azurite does): the caller tells which by looking.
    pub async fn delete_if_match(
        &self,
        snapshots: DeleteSnapshots,
        lease: Option<&str>,
        etag: Option<&str>,
    ) -> Result<(), AzureError> {
        let mut req = self.request(Op::Delete, Method::DELETE, &[], &[202]);
        req.if_match(etag);
        // A retried delete whose first attempt was carried out finds nothing.
        req.gone_after_unknown_is_done = true;
        match snapshots {
            DeleteSnapshots::None => {}
            DeleteSnapshots::Include => req.header("x-ms-delete-snapshots", "include"),
            DeleteSnapshots::Only => req.header("x-ms-delete-snapshots", "only"),
        }
        req.lease(lease);
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        self.svc.execute(req).await.map(|_| ())
    }

    /// Sets the page blob's length to `size` bytes (Set Blob Properties with
    /// `x-ms-blob-content-length`): pages past the old end read as zeros, pages
    /// past a smaller one are gone. Setting the length it has changes nothing, so
    /// a retry after a lost answer is safe. With `if_match` (an ETag) the service
    /// refuses it (412 `ConditionNotMet`) once the blob has changed since: an attempt
    /// given up on cannot then land after later writes and cut the blob back.
    pub async fn resize(
        &self,
        size: u64,
        lease: Option<&str>,
        if_match: Option<&str>,
    ) -> Result<(), AzureError> {
        if !size.is_multiple_of(PAGE) || size == 0 || size > MAX_PAGE_BLOB {
            return Err(self.invalid(
                Op::SetProperties,
                format!(
                    "page blob size {size} must be a positive multiple of 512 of at most 8 TiB"
                ),
            ));
        }
        let mut req = self.request(
            Op::SetProperties,
            Method::PUT,
            &[("comp", "properties")],
            &[200],
        );
        req.header("x-ms-blob-content-length", size.to_string());
        req.lease(lease);
        req.if_match(if_match);
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        self.svc.execute(req).await.map(|_| ())
    }

    /// Replaces the blob's metadata. Names must be valid C# identifiers.
    pub async fn set_metadata(
        &self,
        metadata: &[(&str, &str)],
        lease: Option<&str>,
    ) -> Result<(), AzureError> {
        self.set_metadata_if_match(metadata, lease, None).await
    }

    /// [`Self::set_metadata`] only while the blob's ETag is `etag` (else 412
    /// `ConditionNotMet`): a record kept in the metadata (a CSI publication)
    /// changes only from the state it was read in.
    /// The `x-ms-meta-*` headers of `metadata`; an error for a name that is no
    /// identifier (the service would refuse it).
    fn metadata_headers(
        &self,
        op: Op,
        metadata: &[(&str, &str)],
    ) -> Result<Vec<(String, String)>, AzureError> {
        let mut names = Vec::new();
        for (k, v) in metadata {
            if k.is_empty()
                || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                || k.starts_with(|c: char| c.is_ascii_digit())
            {
                return Err(self.invalid(op, format!("metadata name '{k}' is not an identifier")));
            }
            names.push((format!("x-ms-meta-{k}"), v.to_string()));
        }
        Ok(names)
    }

    pub async fn set_metadata_if_match(
        &self,
        metadata: &[(&str, &str)],
        lease: Option<&str>,
        etag: Option<&str>,
    ) -> Result<(), AzureError> {
        let mut req = self.request(
            Op::SetMetadata,
            Method::PUT,
            &[("comp", "metadata")],
            &[200],
        );
        req.headers
            .extend(self.metadata_headers(Op::SetMetadata, metadata)?);
        req.lease(lease);
        req.if_match(etag);
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        self.svc.execute(req).await.map(|_| ())
    }

    /// Whether `props` (this blob's) say its last copy was from `source`, and
    /// finished: the same container, name and snapshot. (A copy from it long ago
    /// says so too, however much was written since: compare `copy_id` with the
    /// one before to know the copy is a new one.)
    pub fn last_copy_was_from(&self, props: &BlobProperties, source: &BlobClient) -> bool {
        let Some(url) = props
            .copy_source
            .as_deref()
            .and_then(|u| reqwest::Url::parse(u).ok())
        else {
            return false;
        };
        let snapshot = url
            .query_pairs()
            .find(|(k, _)| k == "snapshot")
            .map(|(_, v)| v.into_owned());
        let path = format!("/{}/{}", source.container, source.name);
        props.copy_status.as_deref() == Some("success")
            && url.path().ends_with(&path)
            && snapshot.as_deref() == source.snapshot.as_deref()
    }

    /// Copies `source` (a blob or snapshot of the same account) over this blob and
    /// waits until the service reports the copy finished. With `if_match` (an ETag)
    /// only while the blob is as it was then (else 412 `ConditionNotMet`): the copy
    /// itself changes the ETag, so an attempt given up on that lands later, after
    /// the blob was written again, is refused instead of copying the old content
    /// back over the new.
    pub async fn copy_from(
        &self,
        source: &BlobClient,
        lease: Option<&str>,
        if_match: Option<&str>,
    ) -> Result<(), AzureError> {
        let mut req = self.copy_request(source);
        req.lease(lease);
        req.if_match(if_match);
        self.finish_copy(req).await
    }

    /// Copies `source` to this blob only if it does not exist yet (`If-None-Match:
    /// *`: an existing blob is never replaced, the service refuses with 409
    /// `BlobAlreadyExists` or 412 `ConditionNotMet`), with `metadata` instead
    /// of the source's, set by the copy itself: the new blob never exists
    /// without it. Waits until the copy finished.
    pub async fn copy_new_from(
        &self,
        source: &BlobClient,
        metadata: &[(&str, &str)],
    ) -> Result<(), AzureError> {
        let mut req = self.copy_request(source);
        req.header("if-none-match", "*");
        req.headers
            .extend(self.metadata_headers(Op::Copy, metadata)?);
        self.finish_copy(req).await
    }

    /// A Copy Blob request of `source` (a blob or snapshot of the same account).
    fn copy_request(&self, source: &BlobClient) -> Request {
        let mut src = source.svc.url(&[&source.container, &source.name], &[]);
        if let Some(s) = source.snapshot.as_deref() {
            src.query_pairs_mut().append_pair("snapshot", s);
        }
        source.svc.inner.auth.authorize_copy_source(&mut src);
        let mut req = self.request(Op::Copy, Method::PUT, &[], &[202]);
        req.header("x-ms-copy-source", src.to_string());
        req
    }

    /// Sends the Copy Blob request `req` and waits until the service reports the
    /// copy finished.
    async fn finish_copy(&self, req: Request) -> Result<(), AzureError> {
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        let resp = self.svc.execute(req).await?;
        let mut status = resp
            .header("x-ms-copy-status")
            .unwrap_or_else(|| "pending".into());
        let mut delay = Duration::from_millis(100);
        while status == "pending" {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
            let props = self.properties().await?;
            status = props.copy_status.unwrap_or_else(|| "success".into());
            if status != "pending" && status != "success" {
                return Err(AzureError::Protocol {
                    op: Op::Copy,
                    target: self.target(),
                    detail: format!(
                        "copy {status}: {}",
                        props.copy_status_description.unwrap_or_default()
                    ),
                });
            }
        }
        if status != "success" {
            return Err(AzureError::Protocol {
                op: Op::Copy,
                target: self.target(),
                detail: format!("copy {status}"),
            });
        }
        Ok(())
    }
}

impl BlobService {
    /// A client of the blob `name` in `container`.
    pub fn blob(&self, container: &str, name: &str) -> BlobClient {
        BlobClient {
            svc: self.clone(),
            container: container.to_string(),
            name: name.to_string(),
            snapshot: None,
        }
    }
}
