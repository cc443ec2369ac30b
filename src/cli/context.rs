//! What every command needs: the default account and an async runtime.

use anyhow::{Context as _, Result};
use blobdrive::azure::{Account, BlobClient, BlobService};
use blobdrive::blobref::BlobRef;

/// The parsed global options.
pub struct Context {
    pub account: Account,
}

impl Context {
    pub fn new(connection_string: Option<&str>) -> Result<Context> {
        let account = match connection_string.map(str::trim).filter(|s| !s.is_empty()) {
            Some(cs) => Account::from_connection_string(cs)?,
            None => Account::development(),
        };
        Ok(Context { account })
    }

    /// Parses a BLOB argument and makes a client for it.
    pub fn blob(&self, spec: &str) -> Result<(BlobRef, BlobClient)> {
        let r = BlobRef::parse(spec)?;
        let svc = BlobService::new(r.account(&self.account));
        let client = r.client(&svc);
        Ok((r, client))
    }

    /// Runs a future to completion on a fresh runtime. Commands are short-lived, so
    /// a small runtime per command keeps `main` free of async.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> Result<F::Output> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        Ok(rt.block_on(f))
    }
}
