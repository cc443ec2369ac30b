//! Operations on a container: [`ContainerClient`] (create, exists, list blobs).

use reqwest::Method;

use crate::azure::error::{AzureError, Op};
use crate::azure::pipeline::{BlobService, Expect, Request};
use crate::azure::stats::ClientStats;
use crate::azure::xml::{self, BlobItem, ListingKeep};

/// A container of one account.
#[derive(Clone)]
pub struct ContainerClient {
    pub(in crate::azure) svc: BlobService,
    pub(in crate::azure) name: String,
}

/// The most `NextMarker` pages one listing follows (each up to 5000 blobs).
const LIST_MAX_PAGES: usize = 1000;
/// The most blobs one listing gathers: far more than the snapshots of a drive.
const LIST_MAX_ENTRIES: usize = 200_000;
/// The most bytes of blobs one listing keeps (names, metadata, the structs):
/// about 100,000 CSI snapshots with their metadata (some 600 bytes each), or
/// all [`LIST_MAX_ENTRIES`] blobs listed without it. Past the service's own
/// limits (a name of 1,024 characters, 8 KiB of metadata) an entry is refused.
const LIST_MAX_BYTES: usize = 64 << 20;

impl ContainerClient {
    pub fn name(&self) -> &str {
        &self.name
    }

    fn request(
        &self,
        op: Op,
        method: Method,
        query: &[(&str, &str)],
        ok: &'static [u16],
    ) -> Request {
        let mut q = vec![("restype", "container")];
        q.extend_from_slice(query);
        Request::new(
            op,
            self.name.clone(),
            method,
            self.svc.url(&[&self.name], &q),
            ok,
        )
    }

    /// Creates the container; `Ok(false)` if it already existed.
    pub async fn create(&self) -> Result<bool, AzureError> {
        match self
            .svc
            .execute(self.request(Op::CreateContainer, Method::PUT, &[], &[201]))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("ContainerAlreadyExists") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether the container exists (a 404 is `Ok(false)`, other errors are errors).
    pub async fn exists(&self) -> Result<bool, AzureError> {
        match self
            .svc
            .execute(self.request(Op::ContainerProperties, Method::HEAD, &[], &[200]))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Blobs whose names start with `prefix`, with snapshots (and everyone's
    /// metadata) if asked; all pages, keeping at most [`LIST_MAX_BYTES`] of them.
    pub async fn list_blobs(
        &self,
        prefix: &str,
        include_snapshots: bool,
    ) -> Result<Vec<BlobItem>, AzureError> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        let mut keep = ListingKeep::new(include_snapshots, LIST_MAX_BYTES);
        let mut guard = super::PageGuard::new(
            Op::ListBlobs,
            self.name.clone(),
            LIST_MAX_PAGES,
            LIST_MAX_ENTRIES,
        );
        loop {
            let mut q: Vec<(&str, &str)> = vec![("comp", "list")];
            if !prefix.is_empty() {
                q.push(("prefix", prefix));
            }
            if include_snapshots {
                // With each one's metadata: what a snapshot was taken as (a
                // CSI snapshot's name) is in it.
                q.push(("include", "snapshots,metadata"));
            }
            if let Some(m) = marker.as_deref() {
                q.push(("marker", m));
            }
            ClientStats::add(&self.svc.inner.stats.other_requests, 1);
            let mut req = self.request(Op::ListBlobs, Method::GET, &q, &[200]);
            // Anything but one whole listing is garbled, and asked again.
            req.expect = Some(Expect::Body(xml::check_blob_list));
            let resp = self.svc.execute(req).await?;
            let page = xml::parse_blob_list(&resp.body, &mut keep).map_err(|detail| {
                AzureError::Protocol {
                    op: Op::ListBlobs,
                    target: self.name.clone(),
                    detail,
                }
            })?;
            guard.page(page.items.len(), page.next_marker.as_deref())?;
            out.extend(page.items);
            match page.next_marker {
                Some(m) => marker = Some(m),
                None => return Ok(out),
            }
        }
    }
}

impl BlobService {
    /// A client of the container `name`.
    pub fn container(&self, name: &str) -> ContainerClient {
        ContainerClient {
            svc: self.clone(),
            name: name.to_string(),
        }
    }
}
