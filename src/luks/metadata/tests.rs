use super::*;

/// A change made to cryptsetup's document.
type Change = Box<dyn Fn(&mut Value)>;

/// The JSON area `cryptsetup luksFormat --type luks2` (2.6.1) wrote on a plain
/// file, as `luksDump` showed it.
const CRYPTSETUP: &str = r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"argon2id","time":4,"memory":65536,"cpus":2,"salt":"/3OovHBzRFWnxZtU7XGm9g9xhR39QhZ3BfbCq7dSThA="}}},"tokens":{},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256","iterations":1000,"salt":"iWBJ3+rjVzM4yLZQINsl+KSa53H9jbGnbZwpbHZcrmA=","digest":"5bthDBR3bjoRmwDUjtEq9hLceBC0zNYD5FIpu3hPd/Q="}},"config":{"json_size":"12288","keyslots_size":"16744448"}}"#;

fn cryptsetups() -> Metadata {
    let mut area = CRYPTSETUP.as_bytes().to_vec();
    area.resize(12288, 0);
    Metadata::parse(&area).unwrap()
}

#[test]
fn reads_what_cryptsetup_writes() {
    let m = cryptsetups();
    assert_eq!(
        m.segment().unwrap(),
        Segment {
            offset: 16 << 20,
            sector_size: 4096,
            iv_tweak: 0
        }
    );
    assert_eq!(
        m.config().unwrap(),
        Config {
            json_size: 12288,
            keyslots_size: 16744448
        }
    );
    let ks = m.keyslots().unwrap();
    assert_eq!(ks.len(), 1);
    let k = &ks[0];
    assert_eq!(
        (k.id, k.key_size, k.stripes, k.af_hash),
        (0, 64, 4000, Hash::Sha256)
    );
    assert_eq!(
        (k.area_offset, k.area_size, k.area_key_size),
        (32768, 258048, 64)
    );
    assert!(matches!(
        k.kdf,
        Kdf::Argon2 {
            id: true,
            time: 4,
            memory_kib: 65536,
            lanes: 2,
            ..
        }
    ));
    let d = &m.digests().unwrap()[0];
    assert_eq!(
        (d.keyslots.clone(), d.segments.clone(), d.iterations),
        (vec![0], vec![0], 1000)
    );
    assert_eq!(d.digest.len(), 32);
    // Written back as cryptsetup wrote it.
    assert_eq!(keyslot_json(k), m.doc["keyslots"]["0"]);
    assert_eq!(digest_json(d), m.doc["digests"]["0"]);
}

#[test]
fn keyslots_are_added_and_removed_with_their_digest_binding() {
    let mut m = cryptsetups();
    let mut k = m.keyslots().unwrap()[0].clone();
    k.id = 3;
    k.area_offset = 32768 + 258048;
    m.put_keyslot(&k, 0).unwrap();
    assert_eq!(m.keyslots().unwrap().len(), 2);
    assert_eq!(m.digests().unwrap()[0].keyslots, vec![0, 3]);
    m.remove_keyslot(0).unwrap();
    assert_eq!(m.keyslots().unwrap()[0].id, 3);
    assert_eq!(m.digests().unwrap()[0].keyslots, vec![3]);
    // Tokens and the rest are kept.
    assert_eq!(m.doc["tokens"], json!({}));
    let area = m.to_area(12288).unwrap();
    assert_eq!(area.len(), 12288);
    assert_eq!(Metadata::parse(&area).unwrap(), m);
}

#[test]
fn what_blobdrive_cannot_serve_is_refused_by_name() {
    let cases: Vec<(&str, Change, &str)> = vec![
        (
            "two segments",
            Box::new(|d| d["segments"]["1"] = d["segments"]["0"].clone()),
            "2 data segments",
        ),
        (
            "integrity",
            Box::new(|d| d["segments"]["0"]["integrity"] = json!({"type": "hmac(sha256)"})),
            "integrity",
        ),
        (
            "fixed size",
            Box::new(|d| d["segments"]["0"]["size"] = json!("1048576")),
            "fixed size",
        ),
        (
            "serpent",
            Box::new(|d| d["segments"]["0"]["encryption"] = json!("serpent-xts-plain64")),
            "serpent",
        ),
        (
            "requirements",
            Box::new(|d| {
                d["config"]["requirements"] = json!({"mandatory": ["online-reencrypt-v2"]})
            }),
            "online-reencrypt",
        ),
    ];
    for (name, change, says) in cases {
        let mut m = cryptsetups();
        change(&mut m.doc);
        let e = m
            .segment()
            .and_then(|_| m.check_requirements())
            .expect_err(name)
            .to_string();
        assert!(e.contains(says), "{name}: {e}");
    }
}

#[test]
fn hostile_keyslots_are_refused_before_any_work() {
    let cases: Vec<(&str, Change)> = vec![
        (
            "memory",
            Box::new(|d| d["keyslots"]["0"]["kdf"]["memory"] = json!(4_194_304)),
        ),
        (
            "stripes",
            Box::new(|d| d["keyslots"]["0"]["af"]["stripes"] = json!(400_000)),
        ),
        (
            "area too small",
            Box::new(|d| d["keyslots"]["0"]["area"]["size"] = json!("4096")),
        ),
        (
            "id",
            Box::new(|d| {
                let k = d["keyslots"]["0"].clone();
                d["keyslots"]["99"] = k;
            }),
        ),
        (
            "key size",
            Box::new(|d| d["keyslots"]["0"]["key_size"] = json!(1 << 20)),
        ),
        (
            "salt",
            Box::new(|d| d["keyslots"]["0"]["kdf"]["salt"] = json!("not base64!")),
        ),
    ];
    for (name, change) in cases {
        let mut m = cryptsetups();
        change(&mut m.doc);
        assert!(m.keyslots().is_err(), "{name}");
    }
    let mut m = cryptsetups();
    m.doc["digests"]["0"]["iterations"] = json!(0);
    assert!(m.digests().is_err());
}

#[test]
fn an_area_too_small_for_the_text_is_an_error() {
    assert!(cryptsetups().to_area(100).is_err());
    assert!(Metadata::parse(b"[1, 2]\0\0").is_err());
    assert!(Metadata::parse(b"{not json").is_err());
}
