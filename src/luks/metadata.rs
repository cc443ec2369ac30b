//! The JSON area of a LUKS2 header: keyslots, the data segment, digests and
//! the layout (`config`). The document is kept whole as read, and only the
//! parts blobdrive changes (a keyslot, a digest's list of keyslots) are edited,
//! so that what another tool put there (tokens, a label, flags) survives a
//! passphrase being added or removed.
//!
//! Every typed view checks what it reads: sizes and offsets within the layout,
//! the one cipher blobdrive serves (aes-xts-plain64), KDF costs within bounds.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Map, Value};

use super::kdf::{Hash, Kdf};
use super::LuksError;

/// The cipher blobdrive reads and writes, for keyslot areas and the data.
pub const CIPHER: &str = "aes-xts-plain64";
/// The most keyslots, tokens or segments LUKS2 allows.
pub const MAX_OBJECTS: u32 = 32;

/// The data segment: where the ciphertext starts, its sector size, and the
/// first sector's tweak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub sector_size: u32,
    pub iv_tweak: u64,
}

/// A keyslot: where its split key is, and how its key is derived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyslot {
    pub id: u32,
    /// Bytes of the volume key it holds.
    pub key_size: usize,
    pub stripes: u32,
    pub af_hash: Hash,
    pub area_offset: u64,
    pub area_size: u64,
    /// Bytes of the key the area is encrypted with (the KDF's output).
    pub area_key_size: usize,
    pub kdf: Kdf,
    /// 0: used only when named; 1 (absent): normal; 2: tried first.
    pub priority: u32,
}

/// A digest of the volume key, and what it vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestEntry {
    pub id: u32,
    pub keyslots: Vec<u32>,
    pub segments: Vec<u32>,
    pub hash: Hash,
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub digest: Vec<u8>,
}

/// The sizes the layout is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub json_size: u64,
    pub keyslots_size: u64,
}

/// The whole JSON document.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata {
    pub doc: Value,
}

fn invalid<T>(why: impl Into<String>) -> Result<T, LuksError> {
    Err(LuksError::Invalid(why.into()))
}

/// A 64-bit number, which LUKS2 writes as a decimal string.
fn u64_of(v: &Value, what: &str) -> Result<u64, LuksError> {
    match v {
        Value::String(s) => s
            .parse()
            .or_else(|_| invalid(format!("{what} is not a number: {s:?}"))),
        Value::Number(n) => n
            .as_u64()
            .map_or_else(|| invalid(format!("{what} is not a number")), Ok),
        _ => invalid(format!("{what} is missing")),
    }
}

/// A 32-bit number, which LUKS2 writes as a JSON integer.
fn u32_of(v: &Value, what: &str) -> Result<u32, LuksError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .map_or_else(|| invalid(format!("{what} is missing or not a number")), Ok)
}

fn str_of<'a>(v: &'a Value, what: &str) -> Result<&'a str, LuksError> {
    v.as_str()
        .map_or_else(|| invalid(format!("{what} is missing")), Ok)
}

fn b64_of(v: &Value, what: &str) -> Result<Vec<u8>, LuksError> {
    B64.decode(str_of(v, what)?)
        .or_else(|_| invalid(format!("{what} is not base64")))
}

/// An object id: "0" to "31".
fn id_of(key: &str, what: &str) -> Result<u32, LuksError> {
    match key.parse::<u32>() {
        Ok(n) if n < MAX_OBJECTS && n.to_string() == key => Ok(n),
        _ => invalid(format!("{what} id {key:?}")),
    }
}

fn ids_of(v: &Value, what: &str) -> Result<Vec<u32>, LuksError> {
    let list = v
        .as_array()
        .map_or_else(|| invalid(format!("{what} is missing")), Ok)?;
    list.iter().map(|x| id_of(str_of(x, what)?, what)).collect()
}

impl Metadata {
    /// The document in a JSON area: text up to the first NUL.
    pub fn parse(area: &[u8]) -> Result<Metadata, LuksError> {
        let end = area.iter().position(|&b| b == 0).unwrap_or(area.len());
        let doc: Value = serde_json::from_slice(&area[..end])
            .or_else(|e| invalid(format!("the JSON area: {e}")))?;
        if !doc.is_object() {
            return invalid("the JSON area is not an object");
        }
        Ok(Metadata { doc })
    }

    /// The JSON area of `json_size` bytes: the compact text, then zeros.
    pub fn to_area(&self, json_size: u64) -> Result<Vec<u8>, LuksError> {
        let mut text = serde_json::to_vec(&self.doc).expect("a JSON value serialises");
        if text.len() as u64 >= json_size {
            return invalid(format!(
                "the metadata ({} bytes) does not fit its JSON area ({json_size} bytes)",
                text.len()
            ));
        }
        text.resize(json_size as usize, 0);
        Ok(text)
    }

    fn section(&self, name: &str) -> Result<&Map<String, Value>, LuksError> {
        self.doc[name]
            .as_object()
            .map_or_else(|| invalid(format!("no {name} in the metadata")), Ok)
    }

    fn section_mut(&mut self, name: &str) -> Result<&mut Map<String, Value>, LuksError> {
        self.doc[name]
            .as_object_mut()
            .map_or_else(|| invalid(format!("no {name} in the metadata")), Ok)
    }

    pub fn config(&self) -> Result<Config, LuksError> {
        let c = &self.doc["config"];
        Ok(Config {
            json_size: u64_of(&c["json_size"], "config.json_size")?,
            keyslots_size: u64_of(&c["keyslots_size"], "config.keyslots_size")?,
        })
    }

    /// The one data segment, refusing what blobdrive cannot serve.
    pub fn segment(&self) -> Result<Segment, LuksError> {
        let segments = self.section("segments")?;
        if segments.len() != 1 || !segments.contains_key("0") {
            return Err(LuksError::Unsupported(format!(
                "{} data segments (a reencryption under way?): blobdrive serves a drive with one",
                segments.len()
            )));
        }
        let s = &segments["0"];
        if str_of(&s["type"], "segment type")? != "crypt" {
            return Err(LuksError::Unsupported(
                "a data segment that is not encrypted".into(),
            ));
        }
        let cipher = str_of(&s["encryption"], "segment encryption")?;
        if cipher != CIPHER {
            return Err(LuksError::Unsupported(format!(
                "the cipher {cipher} (blobdrive serves {CIPHER})"
            )));
        }
        if !s["integrity"].is_null() {
            return Err(LuksError::Unsupported(
                "a segment with integrity protection".into(),
            ));
        }
        if s["size"].as_str() != Some("dynamic") {
            return Err(LuksError::Unsupported(
                "a data segment of fixed size (blobdrive serves segments that fill the disk, size \"dynamic\")".into(),
            ));
        }
        let sector_size = u32_of(&s["sector_size"], "segment sector_size")?;
        if !matches!(sector_size, 512 | 1024 | 2048 | 4096) {
            return invalid(format!("a sector size of {sector_size}"));
        }
        let offset = u64_of(&s["offset"], "segment offset")?;
        if offset % u64::from(sector_size) != 0 {
            return invalid(format!("a data offset of {offset}, not a whole sector"));
        }
        Ok(Segment {
            offset,
            sector_size,
            iv_tweak: u64_of(&s["iv_tweak"], "segment iv_tweak")?,
        })
    }

    /// Every keyslot, lowest id first.
    pub fn keyslots(&self) -> Result<Vec<Keyslot>, LuksError> {
        let mut out = self
            .section("keyslots")?
            .iter()
            .map(|(k, v)| keyslot_of(id_of(k, "keyslot")?, v))
            .collect::<Result<Vec<_>, _>>()?;
        out.sort_by_key(|k| k.id);
        Ok(out)
    }

    /// Every digest.
    pub fn digests(&self) -> Result<Vec<DigestEntry>, LuksError> {
        self.section("digests")?
            .iter()
            .map(|(k, v)| digest_of(id_of(k, "digest")?, v))
            .collect()
    }

    /// Requirements another tool set that blobdrive does not know (an
    /// unfinished reencryption) stop it, as they stop an older cryptsetup.
    pub fn check_requirements(&self) -> Result<(), LuksError> {
        match self.doc["config"]["requirements"]["mandatory"].as_array() {
            Some(list) if !list.is_empty() => Err(LuksError::Unsupported(format!(
                "the header requires {} (cryptsetup can finish what it started: `cryptsetup repair` or `cryptsetup reencrypt`)",
                Value::Array(list.clone())
            ))),
            _ => Ok(()),
        }
    }

    /// Adds (or replaces) keyslot `k` and has digest `digest` vouch for it.
    pub fn put_keyslot(&mut self, k: &Keyslot, digest: u32) -> Result<(), LuksError> {
        let id = k.id.to_string();
        self.section_mut("keyslots")?
            .insert(id.clone(), keyslot_json(k));
        let d = self.section_mut("digests")?;
        let Some(list) = d
            .get_mut(&digest.to_string())
            .and_then(|d| d["keyslots"].as_array_mut())
        else {
            return invalid(format!("no digest {digest}"));
        };
        if !list.iter().any(|x| x.as_str() == Some(id.as_str())) {
            list.push(Value::String(id));
        }
        Ok(())
    }

    /// Removes keyslot `id`, and it from every digest.
    pub fn remove_keyslot(&mut self, id: u32) -> Result<(), LuksError> {
        let id = id.to_string();
        self.section_mut("keyslots")?.remove(&id);
        for d in self.section_mut("digests")?.values_mut() {
            if let Some(list) = d["keyslots"].as_array_mut() {
                list.retain(|x| x.as_str() != Some(id.as_str()));
            }
        }
        Ok(())
    }
}

fn keyslot_of(id: u32, v: &Value) -> Result<Keyslot, LuksError> {
    let what = |f: &str| format!("keyslot {id} {f}");
    let kind = str_of(&v["type"], &what("type"))?;
    if kind != "luks2" {
        return Err(LuksError::Unsupported(format!(
            "keyslot {id} of type {kind}"
        )));
    }
    let af = &v["af"];
    if str_of(&af["type"], &what("af.type"))? != "luks1" {
        return Err(LuksError::Unsupported(format!(
            "keyslot {id}'s anti-forensic type"
        )));
    }
    let area = &v["area"];
    if str_of(&area["type"], &what("area.type"))? != "raw" {
        return Err(LuksError::Unsupported(format!("keyslot {id}'s area type")));
    }
    let cipher = str_of(&area["encryption"], &what("area.encryption"))?;
    if cipher != CIPHER {
        return Err(LuksError::Unsupported(format!(
            "keyslot {id} encrypted with {cipher} (blobdrive knows {CIPHER})"
        )));
    }
    let k = Keyslot {
        id,
        key_size: u32_of(&v["key_size"], &what("key_size"))? as usize,
        stripes: u32_of(&af["stripes"], &what("af.stripes"))?,
        af_hash: Hash::parse(str_of(&af["hash"], &what("af.hash"))?)?,
        area_offset: u64_of(&area["offset"], &what("area.offset"))?,
        area_size: u64_of(&area["size"], &what("area.size"))?,
        area_key_size: u32_of(&area["key_size"], &what("area.key_size"))? as usize,
        kdf: kdf_of(id, &v["kdf"])?,
        priority: match &v["priority"] {
            Value::Null => 1,
            p => u32_of(p, &what("priority"))?,
        },
    };
    if !matches!(k.key_size, 32 | 64) || !matches!(k.area_key_size, 32 | 64) {
        return Err(LuksError::Unsupported(format!(
            "keyslot {id}'s key sizes ({} and {} bytes; blobdrive knows 32 and 64)",
            k.key_size, k.area_key_size
        )));
    }
    if k.stripes == 0 || k.stripes > 4000 {
        return invalid(format!("keyslot {id} has {} stripes", k.stripes));
    }
    if (k.key_size as u64 * u64::from(k.stripes)).next_multiple_of(512) > k.area_size {
        return invalid(format!("keyslot {id}'s area is too small for its key"));
    }
    Ok(k)
}

fn kdf_of(id: u32, v: &Value) -> Result<Kdf, LuksError> {
    let what = |f: &str| format!("keyslot {id} kdf.{f}");
    let salt = b64_of(&v["salt"], &what("salt"))?;
    let kdf = match str_of(&v["type"], &what("type"))? {
        "pbkdf2" => Kdf::Pbkdf2 {
            hash: Hash::parse(str_of(&v["hash"], &what("hash"))?)?,
            iterations: u32_of(&v["iterations"], &what("iterations"))?,
            salt,
        },
        t @ ("argon2id" | "argon2i") => Kdf::Argon2 {
            id: t == "argon2id",
            time: u32_of(&v["time"], &what("time"))?,
            memory_kib: u32_of(&v["memory"], &what("memory"))?,
            lanes: u32_of(&v["cpus"], &what("cpus"))?,
            salt,
        },
        other => {
            return Err(LuksError::Unsupported(format!(
                "keyslot {id}'s KDF {other}"
            )))
        }
    };
    kdf.check_bounds()?;
    Ok(kdf)
}

fn digest_of(id: u32, v: &Value) -> Result<DigestEntry, LuksError> {
    let what = |f: &str| format!("digest {id} {f}");
    if str_of(&v["type"], &what("type"))? != "pbkdf2" {
        return Err(LuksError::Unsupported(format!("digest {id}'s type")));
    }
    let d = DigestEntry {
        id,
        keyslots: ids_of(&v["keyslots"], &what("keyslots"))?,
        segments: ids_of(&v["segments"], &what("segments"))?,
        hash: Hash::parse(str_of(&v["hash"], &what("hash"))?)?,
        iterations: u32_of(&v["iterations"], &what("iterations"))?,
        salt: b64_of(&v["salt"], &what("salt"))?,
        digest: b64_of(&v["digest"], &what("digest"))?,
    };
    if d.iterations == 0 || d.iterations > super::kdf::MAX_PBKDF2_ITERATIONS {
        return invalid(format!("digest {id} asks for {} iterations", d.iterations));
    }
    if d.digest.len() != d.hash.output_len() {
        return invalid(format!("digest {id} is {} bytes", d.digest.len()));
    }
    Ok(d)
}

/// A keyslot as the header writes it.
pub fn keyslot_json(k: &Keyslot) -> Value {
    let kdf = match &k.kdf {
        Kdf::Pbkdf2 {
            hash,
            iterations,
            salt,
        } => {
            json!({"type": "pbkdf2", "hash": hash.name(), "iterations": iterations, "salt": B64.encode(salt)})
        }
        Kdf::Argon2 {
            time,
            memory_kib,
            lanes,
            salt,
            ..
        } => {
            json!({"type": k.kdf.type_name(), "time": time, "memory": memory_kib, "cpus": lanes, "salt": B64.encode(salt)})
        }
    };
    let mut v = json!({
        "type": "luks2",
        "key_size": k.key_size,
        "af": {"type": "luks1", "stripes": k.stripes, "hash": k.af_hash.name()},
        "area": {
            "type": "raw",
            "offset": k.area_offset.to_string(),
            "size": k.area_size.to_string(),
            "encryption": CIPHER,
            "key_size": k.area_key_size,
        },
        "kdf": kdf,
    });
    if k.priority != 1 {
        v["priority"] = json!(k.priority);
    }
    v
}

/// A digest as the header writes it.
pub fn digest_json(d: &DigestEntry) -> Value {
    let ids = |v: &[u32]| v.iter().map(|i| i.to_string()).collect::<Vec<_>>();
    json!({
        "type": "pbkdf2",
        "keyslots": ids(&d.keyslots),
        "segments": ids(&d.segments),
        "hash": d.hash.name(),
        "iterations": d.iterations,
        "salt": B64.encode(&d.salt),
        "digest": B64.encode(&d.digest),
    })
}

/// A new document: one keyslot, one segment filling the disk, one digest.
pub fn new_document(k: &Keyslot, seg: &Segment, d: &DigestEntry, config: Config) -> Metadata {
    Metadata {
        doc: json!({
            "keyslots": {k.id.to_string(): keyslot_json(k)},
            "tokens": {},
            "segments": {"0": {
                "type": "crypt",
                "offset": seg.offset.to_string(),
                "size": "dynamic",
                "iv_tweak": seg.iv_tweak.to_string(),
                "encryption": CIPHER,
                "sector_size": seg.sector_size,
            }},
            "digests": {d.id.to_string(): digest_json(d)},
            "config": {
                "json_size": config.json_size.to_string(),
                "keyslots_size": config.keyslots_size.to_string(),
            },
        }),
    }
}

#[cfg(test)]
mod tests;
