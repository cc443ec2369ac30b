use super::*;
use crate::luks::volume::{format, unlock, KdfChoice};
use crate::luks::MemDisk;

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// A disk whose writes fail after `allowed` of them.
struct Stopping {
    disk: MemDisk,
    allowed: std::sync::atomic::AtomicUsize,
}

impl HeaderDisk for Stopping {
    async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, LuksError> {
        self.disk.read(offset, len).await
    }
    async fn write(&self, offset: u64, data: Vec<u8>) -> Result<(), LuksError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self
            .allowed
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            return Err(LuksError::Io("stopped".into()));
        }
        self.disk.write(offset, data).await
    }
    async fn clear(&self, offset: u64, len: u64) -> Result<(), LuksError> {
        self.disk.clear(offset, len).await
    }
}

#[test]
fn a_write_stopped_between_the_copies_leaves_the_newer_one_in_use() {
    run(async {
        let s = Stopping {
            disk: MemDisk::new(20 << 20),
            allowed: usize::MAX.into(),
        };
        format(&s, b"pw", 4096, KdfChoice::Pbkdf2 { iterations: 1000 })
            .await
            .unwrap();
        let mut h = read(&s).await.unwrap();
        assert_eq!(h.binary.seqid, 1);
        let mut m = h.metadata.clone();
        m.doc["tokens"]["0"] = serde_json::json!({"type": "blobdrive-test", "keyslots": []});
        // The second copy is written, the first is not.
        s.allowed.store(1, std::sync::atomic::Ordering::SeqCst);
        assert!(write(&s, &mut h, m).await.is_err());
        let now = read(&s).await.unwrap();
        assert_eq!((now.used, now.binary.seqid), (Copy::Second, 2));
        assert!(now.other_bad.unwrap().contains("older"));
        assert_eq!(now.metadata.doc["tokens"]["0"]["type"], "blobdrive-test");
        assert!(unlock(&s, b"pw").await.is_ok());
    });
}

#[test]
fn copies_whose_layout_does_not_hold_are_refused() {
    run(async {
        let disk = MemDisk::new(20 << 20);
        format(&disk, b"pw", 4096, KdfChoice::Pbkdf2 { iterations: 1000 })
            .await
            .unwrap();
        let mut h = read(&disk).await.unwrap();
        let mut m = h.metadata.clone();
        m.doc["keyslots"]["0"]["area"]["offset"] = serde_json::json!("1024");
        assert!(write(&disk, &mut h, m.clone()).await.is_err());
        let mut m = h.metadata.clone();
        m.doc["segments"]["0"]["offset"] = serde_json::json!("4096");
        let e = write(&disk, &mut h, m).await.unwrap_err();
        assert!(e.to_string().contains("detached"), "{e}");
    });
}
