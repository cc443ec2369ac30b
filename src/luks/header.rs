//! Both copies of a LUKS2 header, as cryptsetup reads and writes them.
//!
//! Reading takes each copy that is whole (magic, checksum, JSON that holds
//! together) and uses the one with the higher sequence id, the first on a tie;
//! a damaged first copy is found by looking for the second where each allowed
//! header size would put it. Writing raises the sequence id and writes the
//! second copy, then the first, so that a write stopped between the two leaves
//! one whole copy of each version and the newer wins.

use rand::RngCore;

use super::binary::{self, Binary, BINARY_SIZE, HDR_SIZES};
use super::metadata::Metadata;
use super::{HeaderDisk, LuksError};

/// Which copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy {
    First,
    Second,
}

impl Copy {
    /// "first" or "second", as messages and `info` name it.
    pub fn name(self) -> &'static str {
        match self {
            Copy::First => "first",
            Copy::Second => "second",
        }
    }
}

/// The header in use, and what was found wrong with the other copy.
#[derive(Debug, Clone)]
pub struct Header {
    pub binary: Binary,
    pub metadata: Metadata,
    /// The copy that was used.
    pub used: Copy,
    /// The other copy, when it was damaged or older (and why), to be repaired
    /// by the next write.
    pub other_bad: Option<String>,
}

impl Header {
    /// Whether `other` is the same version of the same volume's header: the
    /// same UUID, sequence id and JSON area (whichever copy each was read
    /// from). A keyslot added, removed or changed rewrites the JSON area and
    /// raises the sequence id.
    pub fn same_version(&self, other: &Header) -> bool {
        self.binary.uuid == other.binary.uuid
            && self.binary.seqid == other.binary.seqid
            && self.metadata == other.metadata
    }
}

/// The places a header copy's magic may sit on a disk of `disk_size` bytes
/// (a whole 4096-byte binary header there): the first copy's at the start,
/// the second's wherever each allowed header size puts it. A disk is LUKS when
/// either magic is at one of them: [`read`] searches these places, and says
/// [`LuksError::NotLuks`] only when neither magic is at any of them (as far as
/// the disk could be read); callers that only ask whether a disk is encrypted
/// compare the magic at these places, so both answer alike.
pub fn places(disk_size: u64) -> impl Iterator<Item = (u64, &'static [u8; 6])> {
    std::iter::once((0, binary::MAGIC_FIRST))
        .chain(HDR_SIZES.iter().map(|&at| (at, binary::MAGIC_SECOND)))
        .filter(move |&(at, _)| at + BINARY_SIZE as u64 <= disk_size)
}

/// Reads both copies and picks the one to use. A magic found with no whole
/// copy is [`LuksError::Damaged`], never "not LUKS".
pub async fn read<D: HeaderDisk>(disk: &D) -> Result<Header, LuksError> {
    let first = read_copy(disk, 0).await;
    let second_at: Vec<u64> = match &first {
        Ok((b, _)) => vec![b.hdr_size],
        Err(_) => places(u64::MAX).skip(1).map(|(at, _)| at).collect(),
    };
    let mut second = Err(LuksError::NotLuks);
    for at in second_at {
        second = read_copy(disk, at).await;
        if !matches!(second, Err(LuksError::NotLuks)) {
            break;
        }
    }
    match (first, second) {
        (Ok((b1, m1)), Ok((b2, m2))) => Ok(if b2.seqid > b1.seqid {
            header(b2, m2, Copy::Second, Some("the first copy is older".into()))
        } else {
            let stale = (b2.seqid < b1.seqid).then(|| "the second copy is older".to_string());
            header(b1, m1, Copy::First, stale)
        }),
        (Ok((b, m)), Err(e)) => Ok(header(
            b,
            m,
            Copy::First,
            Some(format!("the second copy: {e}")),
        )),
        (Err(e), Ok((b, m))) => Ok(header(
            b,
            m,
            Copy::Second,
            Some(format!("the first copy: {e}")),
        )),
        (Err(first), Err(second)) => Err(neither(first, second)),
    }
}

/// Why neither copy is used: no magic anywhere (or only past where the disk
/// could be read) is "not LUKS"; a version blobdrive does not read, or a
/// failed read of the first copy, is said as it is; anything else is a
/// damaged header, each copy's fault named.
fn neither(first: LuksError, second: LuksError) -> LuksError {
    match (first, second) {
        (LuksError::NotLuks, LuksError::NotLuks | LuksError::Io(_)) => LuksError::NotLuks,
        (e @ (LuksError::Unsupported(_) | LuksError::Io(_)), _) => e,
        (_, e @ LuksError::Unsupported(_)) => e,
        (first, second) => {
            let say = |e: LuksError| match e {
                LuksError::NotLuks => "missing".to_string(),
                other => other.to_string(),
            };
            LuksError::Damaged(format!(
                "the first copy: {}; the second copy: {}",
                say(first),
                say(second)
            ))
        }
    }
}

fn header(binary: Binary, metadata: Metadata, used: Copy, other_bad: Option<String>) -> Header {
    Header {
        binary,
        metadata,
        used,
        other_bad,
    }
}

/// The copy at `offset`, whole and consistent, or why not.
async fn read_copy<D: HeaderDisk>(disk: &D, offset: u64) -> Result<(Binary, Metadata), LuksError> {
    let head = disk.read(offset, BINARY_SIZE).await?;
    let b = Binary::parse(&head, offset)?;
    let rest = disk
        .read(
            offset + BINARY_SIZE as u64,
            (b.hdr_size as usize) - BINARY_SIZE,
        )
        .await?;
    let mut copy = head;
    copy.extend_from_slice(&rest);
    if !binary::verify(&copy, b.checksum) {
        return Err(LuksError::Invalid(format!(
            "the header copy at {offset} fails its checksum"
        )));
    }
    let m = Metadata::parse(&copy[BINARY_SIZE..])?;
    check_layout(&m, b.hdr_size)?;
    Ok((b, m))
}

/// The layout holds together: the JSON area is the rest of the copy, keyslot
/// areas lie in the keyslots area after both copies, and the data after that.
pub fn check_layout(m: &Metadata, hdr_size: u64) -> Result<(), LuksError> {
    let c = m.config()?;
    if c.json_size != hdr_size - BINARY_SIZE as u64 {
        return Err(LuksError::Invalid(format!(
            "a JSON area of {} bytes in a header of {hdr_size}",
            c.json_size
        )));
    }
    let area_start = 2 * hdr_size;
    let area_end = area_start
        .checked_add(c.keyslots_size)
        .ok_or_else(|| LuksError::Invalid("the keyslots area's size".into()))?;
    for k in m.keyslots()? {
        let end = k.area_offset.checked_add(k.area_size);
        if k.area_offset < area_start || end.is_none_or(|e| e > area_end) {
            return Err(LuksError::Invalid(format!(
                "keyslot {}'s area is outside the keyslots area",
                k.id
            )));
        }
    }
    let seg = m.segment()?;
    if seg.offset < area_end {
        return Err(LuksError::Unsupported(format!(
            "a data segment at {} inside the header's {area_end} bytes (a detached header?)",
            seg.offset
        )));
    }
    Ok(())
}

/// Writes `metadata` as the next version of `h` (both copies, the second
/// first), and makes it `h`'s.
pub async fn write<D: HeaderDisk>(
    disk: &D,
    h: &mut Header,
    metadata: Metadata,
) -> Result<(), LuksError> {
    check_layout(&metadata, h.binary.hdr_size)?;
    let seqid = h.binary.seqid + 1;
    let json = metadata.to_area(h.binary.hdr_size - BINARY_SIZE as u64)?;
    for at in [h.binary.hdr_size, 0] {
        let mut b = h.binary.clone();
        b.seqid = seqid;
        b.hdr_offset = at;
        rand::rngs::OsRng.fill_bytes(&mut b.salt);
        let mut copy = b.to_bytes();
        copy.extend_from_slice(&json);
        binary::seal(&mut copy, b.checksum);
        disk.write(at, copy).await?;
    }
    h.binary.seqid = seqid;
    h.binary.hdr_offset = 0;
    h.metadata = metadata;
    h.used = Copy::First;
    h.other_bad = None;
    Ok(())
}

#[cfg(test)]
mod tests;
