//! A volume's writes flushed before its snapshot is taken. The mount holding a
//! volume's lease acknowledges a write once its daemon holds it (a write-back
//! cache: the write reaches the blob within seconds), so a blob snapshot taken
//! at once could lack a write the application was told was done, where a cloud
//! disk's snapshot has it. Before CreateSnapshot snapshots a volume that a node
//! holds, the controller asks that node to flush it, through the account (the
//! only way the controller reaches a node): it makes a small blob
//! `blobdrive-csi/flush/NODE/VOLUME@NONCE` in the driver's container; the node
//! plugin, which looks for such blobs every second while it has a writable
//! volume staged, flushes that volume's daemon (`flush` on its control socket)
//! and writes how it went into the blob's metadata; the controller waits for
//! that answer for at most [`WAIT`], then deletes the blob.
//!
//! A node that does not answer in time (dead, or cut off) is not waited for
//! longer: the snapshot then holds what reached the blob, as after a crash,
//! and the controller's log says so.

use std::time::{Duration, Instant};

use super::publish::published_to;
use super::volume::VolumeId;
use super::Driver;
use crate::azure::xml::BlobItem;
use crate::azure::{BlobClient, BlobProperties, BlobService, DeleteSnapshots};
use crate::mount::{daemon, record};

/// Where the requests are, in the driver's container (a volume's blob is
/// `NAME.vhd` without a `/`, so none is ever taken for a request).
const PREFIX: &str = "blobdrive-csi/flush/";

/// The metadata name of a node's answer: `ok`, or why not.
const ANSWER_META: &str = "blobdrive_csi_flushed";

/// How long the controller waits for a node's answer: a node flushes a
/// volume's daemon (at most its dirty data, half its cache) within seconds
/// while the service answers.
pub const WAIT: Duration = Duration::from_secs(15);

/// How often a node plugin with a writable volume staged looks for requests.
const NODE_POLL: Duration = Duration::from_secs(1);

/// How often the controller looks for the node's answer.
const ANSWER_POLL: Duration = Duration::from_millis(100);

/// The longest answer written: a metadata value is a header.
const ANSWER_MAX: usize = 300;

/// Has the node that holds `volume` (its lease held, published to it for
/// writing) flush what its mount acknowledged, so the snapshot taken next
/// holds every write the application was told was done. A node that cannot
/// (dead, cut off, no answer in [`WAIT`]) is said in the log, and the
/// snapshot holds what reached the blob, as after a crash.
pub async fn before_snapshot(driver: &Driver, volume: &VolumeId, props: &BlobProperties) {
    if props.lease_state.as_deref() != Some("leased") {
        return;
    }
    let (Some(node), Some(container)) = (published_to(props), driver.container.as_deref()) else {
        return;
    };
    let started = std::time::Instant::now();
    match ask(&driver.service, container, node, volume, WAIT).await {
        Ok(()) => tracing::info!(
            "node {node} flushed volume {} for a snapshot in {:.1?}",
            volume.spec(),
            started.elapsed()
        ),
        Err(why) => tracing::warn!(
            "the snapshot of volume {} holds what reached the blob, as after a crash: {why}",
            volume.spec()
        ),
    }
}

fn requests_of(node: &str) -> String {
    format!("{PREFIX}{node}/")
}

/// Asks `node` to flush `volume` and waits at most `wait` for it: `Ok` once
/// the node said it did, otherwise why not (its answer, or none in time).
pub async fn ask(
    svc: &BlobService,
    container: &str,
    node: &str,
    volume: &VolumeId,
    wait: Duration,
) -> Result<(), String> {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let name = format!("{}{}@{nonce}", requests_of(node), volume.spec());
    let blob = svc.blob(container, &name);
    blob.create_page_blob(512)
        .await
        .map_err(|e| format!("cannot ask node {node}: {e}"))?;
    let answer = answer_to(&blob, node, wait).await;
    match blob.delete(DeleteSnapshots::None, None).await {
        Err(e) if !e.is_not_found() => {
            tracing::warn!("cannot delete the flush request {name}: {e}")
        }
        _ => {}
    }
    answer
}

/// The node's answer to the request `blob`, waiting at most `wait` for it.
async fn answer_to(blob: &BlobClient, node: &str, wait: Duration) -> Result<(), String> {
    let until = Instant::now() + wait;
    let mut last = String::new();
    loop {
        match blob.properties().await {
            Ok(p) => match answer_in(&p.metadata) {
                Some("ok") => return Ok(()),
                Some(why) => return Err(format!("node {node} could not flush it: {why}")),
                None => {}
            },
            Err(e) => last = format!(" (the last look failed: {e})"),
        }
        if Instant::now() >= until {
            return Err(format!(
                "node {node} did not answer in {} s{last}",
                wait.as_secs()
            ));
        }
        tokio::time::sleep(ANSWER_POLL).await;
    }
}

fn answer_in(metadata: &[(String, String)]) -> Option<&str> {
    metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(ANSWER_META))
        .map(|(_, v)| v.as_str())
}

/// Answers the flush requests to `node` in `container` for as long as the
/// plugin runs: every second while a writable volume is staged here, each
/// request not answered yet is carried out and answered.
pub async fn serve(svc: BlobService, container: String, node: String) {
    let prefix = requests_of(&node);
    let mut failing = false;
    loop {
        tokio::time::sleep(NODE_POLL).await;
        if !record::load_all()
            .iter()
            .any(|r| !r.read_only && record::alive(r))
        {
            continue;
        }
        let items = match svc.container(&container).list_blobs(&prefix, true).await {
            Ok(items) => items,
            Err(e) => {
                if !failing {
                    tracing::warn!("cannot look for flush requests to node {node}: {e}");
                }
                failing = true;
                continue;
            }
        };
        failing = false;
        for item in items.iter().filter(|i| i.snapshot.is_none()) {
            if answer_in(&item.metadata).is_none() {
                answer(&svc, &container, &prefix, item).await;
            }
        }
    }
}

/// Carries out the request `item` and writes the answer into it.
async fn answer(svc: &BlobService, container: &str, prefix: &str, item: &BlobItem) {
    let volume = item
        .name
        .strip_prefix(prefix)
        .and_then(|rest| rest.rsplit_once('@'))
        .map(|(spec, _)| spec.to_string())
        .unwrap_or_default();
    let said = flush_here(&volume).await;
    if said == "ok" {
        tracing::info!("flushed volume {volume} for a snapshot");
    } else {
        tracing::warn!("could not flush volume {volume} for a snapshot: {said}");
    }
    let said = header_value(&said);
    let blob = svc.blob(container, &item.name);
    if let Err(e) = blob.set_metadata(&[(ANSWER_META, &said)], None).await {
        if !e.is_not_found() {
            tracing::warn!("cannot answer the flush request {}: {e}", item.name);
        }
    }
}

/// Flushes the writable mount of `volume` staged here: `ok`, or why not.
async fn flush_here(volume: &str) -> String {
    let Some(mount) = record::load_all()
        .into_iter()
        .find(|r| r.blob == volume && r.snapshot.is_none() && !r.read_only && record::alive(r))
    else {
        return format!("volume {volume} is not staged for writing here");
    };
    let asked = tokio::task::spawn_blocking(move || {
        daemon::control(&mount.socket, daemon::FLUSH_CMD, Some(WAIT))
    })
    .await;
    match asked {
        Ok(Ok(a)) if a == "ok" => a,
        Ok(Ok(a)) => a.strip_prefix("error ").unwrap_or(&a).to_string(),
        Ok(Err(e)) => format!("cannot reach the daemon of {volume}: {e}"),
        Err(e) => format!("cannot reach the daemon of {volume}: {e}"),
    }
}

/// `text` as a metadata value: printable ASCII on one line, bounded.
fn header_value(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
        .take(ANSWER_MAX)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_one_bounded_line_of_printable_ascii() {
        assert_eq!(header_value("ok"), "ok");
        assert_eq!(header_value("lost\nthe lease é\r"), "lost the lease   ");
        assert_eq!(header_value(&"x".repeat(1000)).len(), ANSWER_MAX);
        let meta = vec![("Blobdrive_CSI_Flushed".to_string(), "ok".to_string())];
        assert_eq!(answer_in(&meta), Some("ok"));
        assert_eq!(answer_in(&[]), None);
    }
}
