//! HPACK's Huffman code (RFC 7541, Appendix B), decoding only: the strings
//! of a header block a client sent. The code is canonical (codes of one length
//! are consecutive, in the order of their symbols, and each length starts
//! where the shorter ones left off), so the length of each symbol's code is
//! all the table needs to say.

/// The length in bits of the code of each symbol, 0 to 255 and EOS (256).
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

const EOS: usize = 256;

/// The canonical code, arranged for decoding bit by bit.
struct Code {
    /// The first code of each length (1 to 30).
    first: [u32; 31],
    /// How many codes each length has.
    count: [u32; 31],
    /// Where each length's symbols start in `symbols`.
    start: [u16; 31],
    /// The symbols, by code length, then by value.
    symbols: [u16; 257],
}

const fn build() -> Code {
    let mut c = Code {
        first: [0; 31],
        count: [0; 31],
        start: [0; 31],
        symbols: [0; 257],
    };
    let mut s = 0;
    while s < 257 {
        c.count[LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let (mut code, mut at, mut len) = (0u32, 0u16, 1);
    while len <= 30 {
        c.first[len] = code;
        c.start[len] = at;
        let mut s = 0;
        while s < 257 {
            if LENGTHS[s] as usize == len {
                c.symbols[at as usize] = s as u16;
                at += 1;
            }
            s += 1;
        }
        code = (code + c.count[len]) << 1;
        len += 1;
    }
    c
}

static CODE: Code = build();

/// Decodes a Huffman-coded string; `None` for one that is not a valid
/// encoding (EOS in it, or padding that is not the start of EOS, or longer
/// than 7 bits).
pub fn decode(bits: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bits.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0usize);
    for byte in bits {
        for i in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> i) & 1);
            len += 1;
            if len > 30 {
                return None;
            }
            let offset = code.wrapping_sub(CODE.first[len]);
            if code >= CODE.first[len] && offset < CODE.count[len] {
                let symbol = CODE.symbols[(CODE.start[len] as u32 + offset) as usize] as usize;
                if symbol == EOS {
                    return None;
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            }
        }
    }
    // What is left is padding: at most 7 bits, all ones.
    (len <= 7 && code == (1 << len) - 1).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::decode;
    use crate::csi::authority::hex;

    #[test]
    fn the_rfcs_examples_decode() {
        // RFC 7541, C.4 and C.6.
        for (coded, plain) in [
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5ba9 7d7f", "custom-key"),
            ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
            ("6402", "302"),
            ("aec3 771a 4b", "private"),
            (
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            (
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
                "https://www.example.com",
            ),
        ] {
            assert_eq!(
                decode(&hex(coded)).as_deref(),
                Some(plain.as_bytes()),
                "{plain}"
            );
        }
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        // "0" is 00000 (5 bits); padding of zeros is not EOS's start.
        assert_eq!(decode(&[0b0000_0000]), None);
        assert_eq!(decode(&[0b0000_0111]).as_deref(), Some(&b"0"[..]));
        // EOS itself (30 ones), and more than 7 bits of padding.
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(decode(&[0b0000_0111, 0xff]), None);
    }
}
