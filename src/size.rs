//! Human sizes on the command line: `64MiB`, `1G`, `1073741824`.
//!
//! Binary units only (K, M, G, T and their `iB` spellings all mean powers of 1024),
//! because disk sizes that are not whole MiB are refused by Azure anyway. Decimal
//! spellings (KB, MB, GB, TB) are refused, not guessed: "1GB" read as either 10^9 or
//! 2^30 bytes would surprise someone. Numbers are whole.

use thiserror::Error;

/// Why a size argument was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    #[error("empty size")]
    Empty,
    #[error("invalid size '{0}': expected a whole number with an optional unit (KiB, MiB, GiB, TiB or K, M, G, T)")]
    Invalid(String),
    #[error("invalid size '{text}': whole numbers only{}", hint.as_ref().map(|h| format!(" (write {h})")).unwrap_or_else(|| " (use a smaller unit or bytes)".to_string()))]
    Fraction { text: String, hint: Option<String> },
    #[error("size '{text}' is ambiguous: write {suggestion} (1 {binary} = 1024 {lower}), the binary unit blobdrive uses; decimal {decimal} (powers of 1000) is not accepted")]
    Decimal {
        text: String,
        suggestion: String,
        decimal: String,
        binary: &'static str,
        lower: &'static str,
    },
    #[error("size '{0}' is too large")]
    Overflow(String),
}

/// Binary units by shift, as written in suggestions.
const UNITS: [(u32, &str); 5] = [
    (0, "bytes"),
    (10, "KiB"),
    (20, "MiB"),
    (30, "GiB"),
    (40, "TiB"),
];

/// Parses `N` or `N<unit>` where unit is one of K/KiB, M/MiB, G/GiB, T/TiB
/// (case-insensitive, optional space) or B; N is a whole number (`_` separators
/// allowed). Decimal spellings (KB, MB, GB, TB) are refused as ambiguous rather than
/// silently read as binary.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit_text) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let unit_text = unit_text.trim();
    let unit = unit_text.to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        "kb" | "mb" | "gb" | "tb" if !num.is_empty() => {
            let (binary, lower, shift) = match unit.as_str() {
                "kb" => ("KiB", "bytes", 10),
                "mb" => ("MiB", "KiB", 20),
                "gb" => ("GiB", "MiB", 30),
                _ => ("TiB", "GiB", 40),
            };
            let suggestion = match num.split_once('.') {
                None => format!("{num}{binary}"),
                Some((int, frac)) => whole_in_smaller_unit(int, frac, shift)
                    .unwrap_or_else(|| format!("a whole number of {binary}")),
            };
            return Err(SizeError::Decimal {
                text: text.to_string(),
                suggestion,
                decimal: unit_text.to_string(),
                binary,
                lower,
            });
        }
        _ => return Err(SizeError::Invalid(text.to_string())),
    };
    if num.is_empty() {
        return Err(SizeError::Invalid(text.to_string()));
    }
    if let Some((int, frac)) = num.split_once('.') {
        if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
            return Err(SizeError::Invalid(text.to_string()));
        }
        return Err(SizeError::Fraction {
            text: text.to_string(),
            hint: whole_in_smaller_unit(int, frac, shift),
        });
    }
    let n: u64 = num
        .parse()
        .map_err(|_| SizeError::Overflow(text.to_string()))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow(text.to_string()))
}

/// `int.frac` units of `1 << shift` written as a whole number of the largest smaller
/// unit that holds it exactly (`1.5GiB` -> `1536MiB`), if any.
fn whole_in_smaller_unit(int: &str, frac: &str, shift: u32) -> Option<String> {
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_val: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let denom = 10u128.checked_pow(frac.len() as u32)?;
    let bytes_num = (int.checked_mul(denom)? + frac_val).checked_mul(1u128 << shift)?;
    if bytes_num % denom != 0 {
        return None;
    }
    let bytes = bytes_num / denom;
    UNITS
        .iter()
        .rev()
        .filter(|(s, _)| *s < shift)
        .find(|(s, _)| bytes % (1u128 << s) == 0)
        .map(|(s, name)| match *s {
            0 => format!("{bytes}"),
            _ => format!("{}{name}", bytes >> s),
        })
}

/// Formats a byte count for people: the largest binary unit that keeps it readable,
/// with the exact byte count when it is not a whole unit.
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (name, shift) in UNITS {
        let unit = 1u64 << shift;
        if bytes >= unit {
            if bytes.is_multiple_of(unit) {
                return format!("{} {}", bytes >> shift, name);
            }
            return format!("{:.2} {}", bytes as f64 / unit as f64, name);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_units() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64 mib"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("1_024"), Ok(1024));
    }

    #[test]
    fn refusals() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert!(matches!(parse_size("abc"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("12X"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("-1"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("0.1"), Err(SizeError::Fraction { .. })));
        assert!(matches!(parse_size("."), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("GB"), Err(SizeError::Invalid(_))));
        assert!(matches!(
            parse_size("99999999999T"),
            Err(SizeError::Overflow(_))
        ));
    }

    #[test]
    fn fractions_say_whole_numbers_only() {
        let m = parse_size("1.7MiB").unwrap_err().to_string();
        assert!(m.contains("whole numbers only"), "{m}");
        assert!(!m.contains('\n'), "{m}");
        let m = parse_size("1.5G").unwrap_err().to_string();
        assert!(m.contains("whole numbers only (write 1536MiB)"), "{m}");
        let m = parse_size("0.5k").unwrap_err().to_string();
        assert!(m.contains("(write 512)"), "{m}");
    }

    #[test]
    fn decimal_units_are_refused_with_the_binary_one() {
        for (text, want) in [
            ("1GB", "write 1GiB (1 GiB = 1024 MiB)"),
            ("64 MB", "write 64MiB (1 MiB = 1024 KiB)"),
            ("4kb", "write 4KiB (1 KiB = 1024 bytes)"),
            ("2TB", "write 2TiB (1 TiB = 1024 GiB)"),
            ("1.5GB", "write 1536MiB (1 GiB = 1024 MiB)"),
        ] {
            let e = parse_size(text).unwrap_err();
            assert!(matches!(e, SizeError::Decimal { .. }), "{text}: {e:?}");
            let m = e.to_string();
            assert!(m.contains("ambiguous") && m.contains(want), "{m}");
        }
    }

    #[test]
    fn human_readable() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(3 << 29), "1.50 GiB");
    }
}
