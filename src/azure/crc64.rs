//! Azure Storage's CRC64, the transactional checksum of a request's or an
//! answer's body (`x-ms-content-crc64`).
//!
//! The Azure SDKs compute it with the reflected polynomial 0x9A6C9329AC4BC9B5,
//! starting from all ones and complementing the result: the parameters of the
//! catalogued CRC-64/NVME, which `crc-fast` computes with the processor's
//! carry-less multiply. The header carries its eight bytes little-endian, in
//! base64. The SDKs' own test vectors are the unit tests below.

use base64::Engine;
use crc_fast::{CrcAlgorithm, Digest};

/// The CRC64 of `data`.
pub fn of(data: &[u8]) -> u64 {
    crc_fast::checksum(CrcAlgorithm::Crc64Nvme, data)
}

/// The CRC64 of `parts` one after another, as if they were one buffer.
pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut d = Digest::new(CrcAlgorithm::Crc64Nvme);
    for p in parts {
        d.update(p);
    }
    d.finalize()
}

/// `crc` as the value of an `x-ms-content-crc64` header.
pub fn header(crc: u64) -> String {
    base64::engine::general_purpose::STANDARD.encode(crc.to_le_bytes())
}

/// The CRC64 an `x-ms-content-crc64` header's value stands for; `None` if it
/// is not eight bytes in base64.
pub fn parse_header(value: &str) -> Option<u64> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .ok()?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_azure_sdks_vectors() {
        // Azure SDK for C++, CryptFunctionsTest.Crc64: "" and "Hello Azure!".
        assert_eq!(header(of(b"")), "AAAAAAAAAAA=");
        assert_eq!(header(of(b"Hello Azure!")), "DtjZpL9/o8c=");
        // The catalogue's check value of CRC-64/NVME, which the SDKs'
        // parameters (reflected 0x9A6C9329AC4BC9B5, all ones in and out) are.
        assert_eq!(of(b"123456789"), 0xae8b_1486_0a79_9888);
    }

    #[test]
    fn parts_are_one_buffer_and_the_header_round_trips() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let (a, rest) = data.split_at(3);
        let (b, c) = rest.split_at(65_536);
        assert_eq!(of_parts([a, &[][..], b, c]), of(&data));
        let crc = of(&data);
        assert_eq!(parse_header(&header(crc)), Some(crc));
        assert_eq!(parse_header("not base64"), None);
        assert_eq!(parse_header("AAAA"), None, "three bytes");
    }
}
