//! The page blob as a [`Backend`]: ranged reads, parallel Put Page runs carrying the
//! lease id, Clear Pages for discard, and fencing.
//!
//! Fencing: the first answer saying the lease is gone (412/409 lease codes) flips a
//! flag that no write ever passes again, so nothing is written without the lease,
//! not even a retry of a run that was in flight.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tracing::error;

use super::{Backend, DeviceError, MAX_RUN};
use crate::azure::{AzureError, BlobClient};

/// Put Page calls in flight at once, over all concurrent flush units: enough to
/// fill a link, few enough to stay far below the per-blob request rate.
const PARALLEL: usize = 8;
/// Clear Pages is cheap per call but a huge range can time out server-side.
const MAX_CLEAR: u64 = 1024 * 1024 * 1024;

pub struct RemoteBackend {
    blob: BlobClient,
    lease: Option<String>,
    rt: Handle,
    fenced: Arc<AtomicBool>,
    puts: Arc<Semaphore>,
}

impl RemoteBackend {
    /// `lease` is `None` for read-only mounts; every write is then refused.
    pub fn new(blob: BlobClient, lease: Option<String>, rt: Handle) -> RemoteBackend {
        RemoteBackend {
            blob,
            lease,
            rt,
            fenced: Arc::new(AtomicBool::new(false)),
            puts: Arc::new(Semaphore::new(PARALLEL)),
        }
    }

    /// Shared flag: set once the lease is lost.
    pub fn fence(&self) -> Arc<AtomicBool> {
        self.fenced.clone()
    }

    pub fn blob(&self) -> &BlobClient {
        &self.blob
    }

    fn check_writable(&self) -> Result<&str, DeviceError> {
        if self.fenced.load(Ordering::SeqCst) {
            return Err(DeviceError::LeaseLost(
                "fenced after an earlier failure".into(),
            ));
        }
        self.lease.as_deref().ok_or(DeviceError::ReadOnly)
    }

    fn map(&self, e: AzureError) -> DeviceError {
        map_error(&self.fenced, e)
    }
}

/// Turns a service error into a device error, fencing on lease loss.
pub fn map_error(fenced: &AtomicBool, e: AzureError) -> DeviceError {
    if e.is_lease_lost() {
        if !fenced.swap(true, Ordering::SeqCst) {
            error!("LEASE LOST: {e}; no further writes will be sent, reads continue");
        }
        DeviceError::LeaseLost(e.to_string())
    } else {
        DeviceError::Io(e.to_string())
    }
}

impl Backend for RemoteBackend {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        // Bodies stream straight into `buf`. Large reads go out as parallel ranged
        // GETs of at most 4 MiB, each waited for by its own thread.
        if buf.len() as u64 <= MAX_RUN {
            return self
                .rt
                .block_on(self.blob.read_into(offset, buf))
                .map_err(|e| self.map(e));
        }
        let results: Vec<Result<(), DeviceError>> = std::thread::scope(|s| {
            let tasks: Vec<_> = buf
                .chunks_mut(MAX_RUN as usize)
                .enumerate()
                .map(|(i, chunk)| {
                    let at = offset + i as u64 * MAX_RUN;
                    s.spawn(move || {
                        self.rt
                            .block_on(self.blob.read_into(at, chunk))
                            .map_err(|e| self.map(e))
                    })
                })
                .collect();
            tasks
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(DeviceError::Io("read thread failed".into())))
                })
                .collect()
        });
        results.into_iter().collect()
    }

    fn write_runs(&self, runs: Vec<(u64, Bytes)>) -> Result<(), DeviceError> {
        let lease = self.check_writable()?.to_string();
        let sem = self.puts.clone();
        let fenced = self.fenced.clone();
        let results =
            self.rt.block_on(async {
                let mut tasks = Vec::with_capacity(runs.len());
                for (offset, data) in runs {
                    let blob = self.blob.clone();
                    let lease = lease.clone();
                    let sem = sem.clone();
                    let fenced = fenced.clone();
                    tasks.push(tokio::spawn(async move {
                        let _permit = sem.acquire_owned().await.expect("semaphore open");
                        if fenced.load(Ordering::SeqCst) {
                            return Err(DeviceError::LeaseLost("fenced".into()));
                        }
                        blob.put_pages(offset, data, Some(&lease))
                            .await
                            .map_err(|e| map_error(&fenced, e))
                    }));
                }
                let mut out = Vec::with_capacity(tasks.len());
                for t in tasks {
                    out.push(t.await.unwrap_or_else(|e| {
                        Err(DeviceError::Io(format!("write task failed: {e}")))
                    }));
                }
                out
            });
        // A lost lease outranks any other failure.
        let mut first = None;
        for r in results {
            if let Err(e) = r {
                if matches!(e, DeviceError::LeaseLost(_)) || first.is_none() {
                    first = Some(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let lease = self.check_writable()?.to_string();
        let mut pos = offset;
        while pos < offset + len {
            let l = (offset + len - pos).min(MAX_CLEAR);
            self.rt
                .block_on(self.blob.clear_pages(pos, l, Some(&lease)))
                .map_err(|e| self.map(e))?;
            pos += l;
        }
        Ok(())
    }
}
