use super::*;
use crate::device::cache::{Cache, CacheConfig};
use crate::device::mem::MemBackend;
use crate::device::sparse::SparseMap;
use crate::device::LeaseLoss;
use std::sync::atomic::Ordering::Relaxed;

const OFFSET: u64 = 1 << 20;
const PLAIN: u64 = 8 << 20;

fn key() -> [u8; 64] {
    let mut k = [0u8; 64];
    k.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i * 13 + 1) as u8);
    k
}

fn layer(mem: &Arc<MemBackend>, sector: usize) -> CryptLayer {
    CryptLayer::new(
        mem.clone(),
        XtsCipher::new(&key(), sector, 0).unwrap(),
        OFFSET,
    )
}

/// A pattern no ciphertext will hold by chance.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| b"PLAINTEXT-"[i % 10] ^ seed).collect()
}

fn holds(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn writes_land_encrypted_after_the_header_and_read_back_plain() {
    for sector in [512, 4096] {
        let mem = Arc::new(MemBackend::new(OFFSET + PLAIN));
        let c = layer(&mem, sector);
        let a = pattern(3 * 4096, 1);
        // Two runs, one of them not on a sector's edge: a 512-byte page of a
        // 4096-byte sector, encrypted alone.
        let b = pattern(512, 2);
        c.write_runs(vec![
            (8192, Bytes::from(a.clone())),
            (65536 + 1536, Bytes::from(b.clone())),
        ])
        .unwrap();
        let disk = mem.contents();
        assert!(
            disk[..OFFSET as usize].iter().all(|&x| x == 0),
            "nothing lands in the header's room"
        );
        assert!(
            !holds(&disk, b"PLAINTEXT-"),
            "sector {sector}: plaintext on the disk below"
        );
        let mut want = disk[(OFFSET + 8192) as usize..][..a.len()].to_vec();
        XtsCipher::new(&key(), sector, 0)
            .unwrap()
            .decrypt(8192, &mut want);
        assert_eq!(want, a, "the segment's sector numbers count from its start");
        let mut back = vec![0u8; a.len()];
        c.read(8192, &mut back).unwrap();
        assert_eq!(back, a);
        // The page beside the lone one was never written: zeros, not noise.
        let mut around = vec![7u8; 4096];
        c.read(65536, &mut around).unwrap();
        assert!(around[..1536].iter().all(|&x| x == 0), "sector {sector}");
        assert_eq!(around[1536..2048], b[..]);
        assert!(around[2048..].iter().all(|&x| x == 0));
    }
}

#[test]
fn scattered_and_local_reads_are_decrypted_where_they_land() {
    let mem = Arc::new(MemBackend::new(OFFSET + PLAIN));
    let c = layer(&mem, 4096);
    let data = pattern(256 << 10, 3);
    c.write_runs(vec![(1 << 20, Bytes::from(data.clone()))])
        .unwrap();
    for local in [false, true] {
        mem.local.store(local, Relaxed);
        let mut a = vec![0u8; 64 << 10];
        let mut b = vec![0u8; 192 << 10];
        {
            let mut parts: Vec<&mut [u8]> = vec![&mut a, &mut b];
            if local {
                assert!(c.read_local(1 << 20, &mut parts));
            } else {
                c.read_scattered(1 << 20, &mut parts).unwrap();
            }
        }
        assert_eq!(a, data[..64 << 10]);
        assert_eq!(b, data[64 << 10..]);
    }
    // A large read is decrypted on two threads, halves meeting on a sector.
    let big = pattern(3 << 20, 4);
    c.write_runs(vec![(4 << 20, Bytes::from(big.clone()))])
        .unwrap();
    let mut back = vec![0u8; 3 << 20];
    c.read(4 << 20, &mut back).unwrap();
    assert_eq!(back, big);
}

#[test]
fn discards_clear_the_ciphertext_and_the_range_reads_zeros() {
    let mem = Arc::new(MemBackend::new(OFFSET + PLAIN));
    let c = layer(&mem, 4096);
    c.write_runs(vec![(0, Bytes::from(pattern(16384, 5)))])
        .unwrap();
    c.discard(4096, 8192).unwrap();
    let disk = mem.contents();
    assert!(disk[(OFFSET + 4096) as usize..][..8192]
        .iter()
        .all(|&x| x == 0));
    let mut back = vec![1u8; 16384];
    c.read(0, &mut back).unwrap();
    assert_eq!(back[..4096], pattern(16384, 5)[..4096]);
    assert!(back[4096..12288].iter().all(|&x| x == 0));
    assert_eq!(back[12288..], pattern(16384, 5)[12288..]);
}

/// The memory cache over the crypto layer, against a byte model: random
/// writes (whole and partial pages), discards, flushes and reads, with the
/// cache small enough to evict; the disk below never holds the plaintext.
#[test]
fn the_cache_over_it_matches_a_byte_model() {
    let mem = Arc::new(MemBackend::new(OFFSET + PLAIN));
    mem.scattered.store(true, Relaxed);
    let cache = Cache::new(
        layer(&mem, 4096),
        PLAIN,
        SparseMap::default(),
        CacheConfig::with_capacity(32 << 20),
        false,
        Arc::new(LeaseLoss::default()),
    );
    let mut model = vec![0u8; PLAIN as usize];
    let mut x: u64 = 99;
    let mut next = |m: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    for step in 0..400 {
        let at = next(PLAIN - (256 << 10));
        let len = next(256 << 10) + 1;
        match next(10) {
            0..=4 => {
                let data = pattern(len as usize, step as u8);
                cache.write(at, &data).unwrap();
                model[at as usize..][..len as usize].copy_from_slice(&data);
            }
            5 => {
                let (s, l) = (at / 512 * 512, (len / 512 + 1) * 512);
                cache.discard(s, l).unwrap();
                model[s as usize..][..l as usize].fill(0);
            }
            6 => cache.flush().unwrap(),
            _ => {
                let mut back = vec![0u8; len as usize];
                cache.read(at, &mut back).unwrap();
                assert!(
                    back == model[at as usize..][..len as usize],
                    "step {step}: read {at}+{len}"
                );
            }
        }
    }
    cache.flush().unwrap();
    assert!(!holds(&mem.contents(), b"PLAINTEXT-"));
    let plain = layer(&mem, 4096);
    let mut whole = vec![0u8; PLAIN as usize];
    plain.read(0, &mut whole).unwrap();
    assert!(
        whole == model,
        "what the disk below holds decrypts to the model"
    );
}
