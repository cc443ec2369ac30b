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

/// Whether a magic number sits at one of [`places`] on `disk`: what
/// `encrypted::is_luks` asks of a blob, asked of memory.
async fn magic_somewhere(disk: &MemDisk, size: u64) -> bool {
    let mut found = false;
    for (at, magic) in places(size) {
        found |= disk.read(at, 512).await.unwrap().starts_with(magic);
    }
    found
}

/// Each way both copies can be unusable, with a magic left where a copy may
/// be: the disk is LUKS to the magic search and to the reader alike, which
/// says the header is damaged (both copies) and why each copy is not used.
#[test]
fn a_header_with_no_whole_copy_is_damaged_never_not_luks() {
    const SIZE: u64 = 20 << 20;
    // (what is done to the disk, what the refusal says of each copy)
    type Damage = fn(&mut [u8]);
    let cases: [(&str, Damage, [&str; 2]); 3] = [
        (
            "first missing, second damaged",
            |d| {
                d[..16384].fill(0);
                d[16384 + 4096..16384 + 4608].fill(b'x');
            },
            [
                "first copy: missing",
                "second copy: the LUKS2 header is not valid",
            ],
        ),
        (
            "first damaged, second missing",
            |d| {
                d[4096..4608].fill(b'x');
                d[16384..32768].fill(0);
            },
            [
                "first copy: the LUKS2 header is not valid",
                "second copy: missing",
            ],
        ),
        (
            "both damaged",
            |d| {
                d[4096..4608].fill(b'x');
                d[16384 + 4096..16384 + 4608].fill(b'x');
            },
            ["first copy: the LUKS2", "second copy: the LUKS2"],
        ),
    ];
    for (what, damage, said) in cases {
        run(async {
            let disk = MemDisk::new(SIZE as usize);
            format(&disk, b"pw", 4096, KdfChoice::Pbkdf2 { iterations: 1000 })
                .await
                .unwrap();
            damage(&mut disk.bytes.lock().unwrap());
            assert!(magic_somewhere(&disk, SIZE).await, "{what}");
            let e = read(&disk).await.unwrap_err();
            assert!(matches!(e, LuksError::Damaged(_)), "{what}: {e:?}");
            let line = e.to_string();
            assert!(line.contains("damaged (both copies)"), "{what}: {line}");
            for s in said {
                assert!(line.contains(s), "{what}: {line}");
            }
            assert!(!line.contains('\n'), "{what}: {line}");
        });
    }
    // The other answers stay: no magic anywhere is not LUKS to both, and a
    // whole second copy is read.
    run(async {
        let blank = MemDisk::new(SIZE as usize);
        assert!(!magic_somewhere(&blank, SIZE).await);
        assert!(matches!(read(&blank).await, Err(LuksError::NotLuks)));
        let disk = MemDisk::new(SIZE as usize);
        format(&disk, b"pw", 4096, KdfChoice::Pbkdf2 { iterations: 1000 })
            .await
            .unwrap();
        disk.bytes.lock().unwrap()[..16384].fill(0);
        assert!(magic_somewhere(&disk, SIZE).await);
        assert_eq!(read(&disk).await.unwrap().used, Copy::Second);
    });
}
