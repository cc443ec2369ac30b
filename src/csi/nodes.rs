//! The nodes that serve this driver, as each node plugin records itself in
//! the account, next to the volumes: a small blob `blobdrive-csi/nodes/NODE`
//! in the driver's `--container`, made at the plugin's start and again at
//! NodeGetInfo (the call node-driver-registrar makes before the kubelet uses
//! the node). Its metadata holds how many volumes the node takes and which
//! volumes are published to it, so that the controller publishes only to a
//! node that exists (an unknown node id is NOT_FOUND, never written into a
//! volume's record) and no more volumes to a node than it takes
//! (RESOURCE_EXHAUSTED), and publishing again with other arguments is
//! ALREADY_EXISTS.
//!
//! Every change is made on the condition of the ETag as read, so two
//! controllers (or a controller and the node re-recording itself) never lose
//! each other's entries.

use sha2::{Digest, Sha256};
use tonic::Status;

use super::proto::VolumeCapability;
use super::status_of;
use super::volume::VolumeId;
use crate::azure::{BlobClient, BlobProperties, BlobService};
use crate::mount::system::{has_capability, CAP_SYS_RESOURCE};

/// Where the node records are, in the driver's container. A volume's blob is
/// `NAME.vhd` without a `/`, so none is ever taken for a node's.
pub const PREFIX: &str = "blobdrive-csi/nodes/";

/// The most volumes a node may say it takes: each publication is an entry of
/// about 30 bytes in the record's metadata, which the service holds to 8 KiB.
pub const MOST_VOLUMES: u32 = 128;

/// The metadata name of how many volumes the node takes.
const MAX_META: &str = "blobdrive_csi_max_volumes";

/// The metadata name of whether the node can grow a mounted ext4 (its plugin
/// has CAP_SYS_RESOURCE, which the kernel asks for that): the controller
/// leaves the growth of such a volume to a node that can, and otherwise grows
/// it once it is not in use.
const EXT4_META: &str = "blobdrive_csi_grows_mounted_ext4";

/// The start of a publication's metadata name; the rest is a digest of the
/// volume's id (a metadata name is an identifier, an id is not).
const PUBLICATION: &str = "v";

/// How often a change is tried again when the record changed between reading
/// it and writing it.
const ROUNDS: usize = 5;

/// Whether `id` can be a node's id here: Kubernetes' node names (a DNS
/// subdomain) and csi-sanity's fit; it becomes part of a blob's name.
pub fn is_node_id(id: &str) -> bool {
    (1..=253).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        && !id.starts_with('.')
}

fn record_blob(svc: &BlobService, container: &str, node: &str) -> BlobClient {
    svc.blob(container, &format!("{PREFIX}{node}"))
}

/// A publication's metadata name for volume `id`.
fn publication_key(id: &VolumeId) -> String {
    let h = Sha256::digest(id.spec().as_bytes());
    let hex: String = h[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("{PUBLICATION}{hex}")
}

/// What a publication records of how the volume is published: for reading
/// only or for writing, and a digest of the capability.
pub fn publication(read_only: bool, cap: &VolumeCapability) -> String {
    let h = Sha256::digest(prost::Message::encode_to_vec(cap));
    let hex: String = h[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}{hex}", if read_only { 'r' } else { 'w' })
}

/// Records node `node` in `container` as taking `max` volumes: made if it is
/// not there yet, its publications kept if it is.
pub async fn register(
    svc: &BlobService,
    container: &str,
    node: &str,
    max: u32,
) -> Result<(), Status> {
    svc.container(container).create().await.map_err(status_of)?;
    let blob = record_blob(svc, container, node);
    for _ in 0..ROUNDS {
        let Some(props) = properties(&blob).await? else {
            match blob.create_page_blob(512).await {
                Ok(()) => {}
                Err(e) if e.code() == Some("BlobAlreadyExists") => {}
                Err(e) => return Err(status_of(e)),
            }
            continue;
        };
        let mut record = NodeRecord::from(blob.clone(), &props);
        let tidy = props.metadata.len() == record.publications.len() + 2;
        let grows = has_capability(CAP_SYS_RESOURCE);
        if record.max == Some(max) && record.grows_mounted_ext4 == grows && tidy {
            return Ok(());
        }
        record.grows_mounted_ext4 = grows;
        if record.write(Some(max), &record.publications).await? {
            tracing::info!("node {node} recorded in {container}, taking {max} volumes");
            return Ok(());
        }
    }
    Err(Status::aborted(format!(
        "the record of node {node} kept changing while it was being written; try again"
    )))
}

async fn properties(blob: &BlobClient) -> Result<Option<BlobProperties>, Status> {
    match blob.properties().await {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(status_of(e)),
    }
}

/// A node's record as read.
pub struct NodeRecord {
    blob: BlobClient,
    etag: Option<String>,
    /// How many volumes it takes; `None` until its plugin has said.
    max: Option<u32>,
    /// Each publication's metadata name and what it records.
    publications: Vec<(String, String)>,
    /// Whether it can grow a mounted ext4 (true when it did not say).
    pub grows_mounted_ext4: bool,
}

impl NodeRecord {
    /// The record of `node` in `container`; `None` when it never recorded
    /// itself there.
    pub async fn read(
        svc: &BlobService,
        container: &str,
        node: &str,
    ) -> Result<Option<NodeRecord>, Status> {
        if !is_node_id(node) {
            return Ok(None);
        }
        let blob = record_blob(svc, container, node);
        Ok(properties(&blob)
            .await?
            .map(|props| NodeRecord::from(blob, &props)))
    }

    fn from(blob: BlobClient, props: &BlobProperties) -> NodeRecord {
        let publications = props
            .metadata
            .iter()
            .filter(|(k, _)| k.starts_with(PUBLICATION) && k.len() == 21)
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        let max = props
            .metadata
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(MAX_META))
            .and_then(|(_, v)| v.parse().ok());
        let grows_mounted_ext4 = props
            .metadata
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(EXT4_META))
            .is_none_or(|(_, v)| v == "true");
        NodeRecord {
            blob,
            etag: props.etag.clone(),
            max,
            publications,
            grows_mounted_ext4,
        }
    }

    /// What is recorded of volume `id`'s publication to this node, if any.
    pub fn publication_of(&self, id: &VolumeId) -> Option<&str> {
        let key = publication_key(id);
        self.publications
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the node takes one more volume.
    pub fn has_room(&self) -> bool {
        let max = self.max.unwrap_or(MOST_VOLUMES) as usize;
        self.publications.len() < max
    }

    pub fn max(&self) -> u32 {
        self.max.unwrap_or(MOST_VOLUMES)
    }

    /// Writes `max` and `publications` on the condition of the record as read;
    /// false when it changed since, and nothing was written.
    async fn write(
        &self,
        max: Option<u32>,
        publications: &[(String, String)],
    ) -> Result<bool, Status> {
        let max = max.map(|m| m.to_string());
        let mut metadata: Vec<(&str, &str)> = publications
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if let Some(m) = &max {
            metadata.push((MAX_META, m));
        }
        let grows = self.grows_mounted_ext4.to_string();
        metadata.push((EXT4_META, &grows));
        match self
            .blob
            .set_metadata_if_match(&metadata, None, self.etag.as_deref())
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.is_changed_since_read() => Ok(false),
            Err(e) => Err(status_of(e)),
        }
    }

    /// Records volume `id` as published to this node (`entry` says how),
    /// re-reading the record while it changes under the write; RESOURCE_EXHAUSTED
    /// when the node took as many volumes as it takes meanwhile.
    pub async fn add(mut self, id: &VolumeId, entry: &str, node: &str) -> Result<(), Status> {
        for _ in 0..ROUNDS {
            match self.publication_of(id) {
                Some(e) if e == entry => return Ok(()),
                Some(_) => return Err(incompatible(id, node)),
                None if !self.has_room() => return Err(full(node, self.max())),
                None => {}
            }
            let mut publications = self.publications.clone();
            publications.push((publication_key(id), entry.to_string()));
            if self.write(self.max, &publications).await? {
                return Ok(());
            }
            self = self.reread().await?;
        }
        Err(Status::aborted(format!(
            "the record of node {node} kept changing; try again"
        )))
    }

    /// Takes volume `id`'s publication out of the record (nothing if there is none).
    pub async fn remove(mut self, id: &VolumeId) -> Result<(), Status> {
        let key = publication_key(id);
        for _ in 0..ROUNDS {
            if !self.publications.iter().any(|(k, _)| *k == key) {
                return Ok(());
            }
            let kept: Vec<(String, String)> = self
                .publications
                .iter()
                .filter(|(k, _)| *k != key)
                .cloned()
                .collect();
            if self.write(self.max, &kept).await? {
                return Ok(());
            }
            self = self.reread().await?;
        }
        Err(Status::aborted(format!(
            "the record {} kept changing; try again",
            self.blob.target()
        )))
    }

    async fn reread(&self) -> Result<NodeRecord, Status> {
        let props = properties(&self.blob).await?.ok_or_else(|| {
            Status::aborted(format!("{} was deleted meanwhile", self.blob.target()))
        })?;
        Ok(NodeRecord::from(self.blob.clone(), &props))
    }
}

/// The answer to publishing a volume again to a node with other arguments.
pub fn incompatible(id: &VolumeId, node: &str) -> Status {
    Status::already_exists(format!(
        "volume {} is published to node {node} already, with another capability or readonly: unpublish it first",
        id.spec()
    ))
}

/// The answer to publishing one volume more than a node takes.
pub fn full(node: &str, max: u32) -> Status {
    Status::resource_exhausted(format!(
        "node {node} has {max} volumes published, as many as it takes (its max_volumes_per_node)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_names_that_fit_in_a_blobs() {
        for good in [
            "node-a",
            "aks-nodepool1-12345-vmss000000",
            "fake-node-id-0123456789",
            "ip-10-0-0-1.ec2.internal",
        ] {
            assert!(is_node_id(good), "{good}");
        }
        for bad in ["", "a/b", "../x", ".hidden", "a b", &"n".repeat(254)] {
            assert!(!is_node_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_publication_is_a_short_identifier_and_says_how() {
        let id = VolumeId::parse("vols/pvc-1.vhd").unwrap();
        let key = publication_key(&id);
        assert_eq!(key.len(), 21);
        assert!(key.chars().all(|c| c.is_ascii_alphanumeric()));
        let cap = VolumeCapability::default();
        assert!(publication(true, &cap).starts_with('r'));
        assert!(publication(false, &cap).starts_with('w'));
        assert_eq!(publication(false, &cap).len(), 9);
    }
}
