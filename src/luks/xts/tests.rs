use super::*;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// IEEE 1619-2007 XTS-AES-256 test vector 10 (data unit 0xff, 512 bytes).
#[test]
fn matches_ieee_1619_vector_10() {
    let key = unhex(concat!(
        "2718281828459045235360287471352662497757247093699959574966967627",
        "3141592653589793238462643383279502884197169399375105820974944592"
    ));
    let c = XtsCipher::new(&key, 512, 0).unwrap();
    let mut buf: Vec<u8> = (0..512).map(|i| i as u8).collect();
    // Sector 0xff of a segment is its byte 0xff * 512.
    c.encrypt(0xff * 512, &mut buf);
    assert_eq!(
        buf[..32],
        unhex("1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b")[..]
    );
    assert_eq!(buf[496..], unhex("c4f36ffda9fcea70b9c6e693e148c151")[..]);
    c.decrypt(0xff * 512, &mut buf);
    assert!(buf.iter().enumerate().all(|(i, &b)| b == i as u8));
}

/// A 4096-byte sector's tweak counts 512-byte units (LUKS2 never sets
/// dm-crypt's iv_large_sectors), and a page of it is encrypted alone exactly as
/// within the whole sector. Expected bytes from Python's `cryptography`
/// (OpenSSL): AES-128-XTS, key 0..31, tweak 8, plaintext 0..255 sixteen times.
#[test]
fn a_page_of_a_large_sector_is_encrypted_alone() {
    let key: Vec<u8> = (0..32).collect();
    let c = XtsCipher::new(&key, 4096, 0).unwrap();
    let plain: Vec<u8> = (0..4096).map(|i| i as u8).collect();
    let mut whole = plain.clone();
    c.encrypt(4096, &mut whole);
    assert_eq!(
        whole[512..528],
        unhex("552ad6056c37229ebcb223f443330858")[..]
    );
    assert_eq!(whole[4080..], unhex("a13605b032e6b15f45fdb9d5f641c13e")[..]);
    let mut page = plain[512..1024].to_vec();
    c.encrypt(4096 + 512, &mut page);
    assert_eq!(page, whole[512..1024]);
    // Three pages across the end of one sector and the start of the next.
    let mut two = vec![0u8; 8192];
    two[..4096].copy_from_slice(&plain);
    two[4096..].copy_from_slice(&plain);
    let mut all = two.clone();
    c.encrypt(0, &mut all);
    let mut across = two[3584..5120].to_vec();
    c.encrypt(3584, &mut across);
    assert_eq!(across, all[3584..5120]);
    c.decrypt(3584, &mut across);
    assert_eq!(across, two[3584..5120]);
}

#[test]
fn holes_stay_zeros_and_data_pages_beside_them_decrypt() {
    let key = [9u8; 64];
    let c = XtsCipher::new(&key, 4096, 0).unwrap();
    let plain: Vec<u8> = (0..8192).map(|i| (i * 7) as u8).collect();
    let mut ct = plain.clone();
    c.encrypt(0, &mut ct);
    // Page 3 of the first sector and the whole second sector never written.
    ct[1536..2048].fill(0);
    ct[4096..].fill(0);
    c.decrypt_data(0, &mut ct);
    assert_eq!(ct[..1536], plain[..1536]);
    assert!(ct[1536..2048].iter().all(|&b| b == 0));
    assert_eq!(ct[2048..4096], plain[2048..4096]);
    assert!(ct[4096..].iter().all(|&b| b == 0));
}

#[test]
fn the_iv_tweak_shifts_every_sector() {
    let key = [3u8; 64];
    let a = XtsCipher::new(&key, 512, 0).unwrap();
    let b = XtsCipher::new(&key, 512, 8).unwrap();
    let mut x = vec![5u8; 512];
    let mut y = x.clone();
    a.encrypt(8 * 512, &mut x);
    b.encrypt(0, &mut y);
    assert_eq!(x, y);
}

#[test]
fn unknown_key_sizes_and_sector_sizes_are_refused() {
    assert!(XtsCipher::new(&[0; 48], 512, 0).is_err());
    assert!(XtsCipher::new(&[0; 64], 8192, 0).is_err());
}

/// The `xts-mode` crate's answer, sector by sector, for random keys and data
/// at both key sizes and every sector size.
#[test]
fn matches_the_xts_mode_crate() {
    use aes::cipher::generic_array::GenericArray;
    use aes::cipher::KeyInit;
    use rand::{Rng, RngCore};
    let mut rng = rand::thread_rng();
    for (key_len, sector) in [(32, 512), (64, 512), (32, 4096), (64, 4096), (64, 1024)] {
        let mut key = vec![0u8; key_len];
        rng.fill_bytes(&mut key);
        let mut plain = vec![0u8; 4 * sector];
        rng.fill_bytes(&mut plain);
        let tweak_base: u64 = rng.gen_range(0..1 << 40);
        let c = XtsCipher::new(&key, sector, tweak_base).unwrap();
        let at = 3 * sector as u64;
        let mut ours = plain.clone();
        c.encrypt(at, &mut ours);
        let mut theirs = plain.clone();
        let first = (at / 512 + tweak_base) as u128;
        let step = sector as u128 / 512;
        let h = key_len / 2;
        if key_len == 32 {
            let x = xts_mode::Xts128::new(
                aes::Aes128::new(GenericArray::from_slice(&key[..h])),
                aes::Aes128::new(GenericArray::from_slice(&key[h..])),
            );
            for (i, s) in theirs.chunks_mut(sector).enumerate() {
                x.encrypt_sector(s, (first + i as u128 * step).to_le_bytes());
            }
        } else {
            let x = xts_mode::Xts128::new(
                aes::Aes256::new(GenericArray::from_slice(&key[..h])),
                aes::Aes256::new(GenericArray::from_slice(&key[h..])),
            );
            for (i, s) in theirs.chunks_mut(sector).enumerate() {
                x.encrypt_sector(s, (first + i as u128 * step).to_le_bytes());
            }
        }
        assert_eq!(ours, theirs, "key {key_len} bytes, sector {sector}");
        c.decrypt(at, &mut ours);
        assert_eq!(ours, plain);
    }
}
