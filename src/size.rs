//! Human sizes on the command line: `64MiB`, `1G`, `1073741824`.
//!
//! Binary units only (K, M, G, T and their `iB` spellings all mean powers of 1024),
//! because disk sizes that are not whole MiB are refused by Azure anyway and a
//! decimal "GB" silently giving a different size would be a trap.

use thiserror::Error;

/// Why a size argument was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    #[error("empty size")]
    Empty,
    #[error("invalid size '{0}': expected a number with an optional unit (KiB, MiB, GiB, TiB or K, M, G, T)")]
    Invalid(String),
    #[error("size '{0}' is too large")]
    Overflow(String),
}

/// Parses `N`, `N<unit>` where unit is one of K/KiB, M/MiB, G/GiB, T/TiB (case-insensitive,
/// optional `B`, optional space). A fractional number is accepted when the result is a
/// whole number of bytes (`1.5G`).
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(SizeError::Invalid(text.to_string())),
    };
    if num.is_empty() {
        return Err(SizeError::Invalid(text.to_string()));
    }
    let multiplier = 1u64 << shift;
    if let Some((int, frac)) = num.split_once('.') {
        if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
            return Err(SizeError::Invalid(text.to_string()));
        }
        let int: u64 = if int.is_empty() {
            0
        } else {
            int.parse()
                .map_err(|_| SizeError::Overflow(text.to_string()))?
        };
        let frac_digits = frac.len() as u32;
        let frac_val: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse()
                .map_err(|_| SizeError::Invalid(text.to_string()))?
        };
        let denom = 10u128
            .checked_pow(frac_digits)
            .ok_or_else(|| SizeError::Invalid(text.to_string()))?;
        let frac_bytes = frac_val * multiplier as u128;
        if frac_bytes % denom != 0 {
            return Err(SizeError::Invalid(text.to_string()));
        }
        let total = int as u128 * multiplier as u128 + frac_bytes / denom;
        u64::try_from(total).map_err(|_| SizeError::Overflow(text.to_string()))
    } else {
        let n: u64 = num
            .parse()
            .map_err(|_| SizeError::Overflow(text.to_string()))?;
        n.checked_mul(multiplier)
            .ok_or_else(|| SizeError::Overflow(text.to_string()))
    }
}

/// Formats a byte count for people: the largest binary unit that keeps it readable,
/// with the exact byte count when it is not a whole unit.
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (name, shift) in UNITS {
        let unit = 1u64 << shift;
        if bytes >= unit {
            if bytes % unit == 0 {
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
        assert_eq!(parse_size("64 mb"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("1_024"), Ok(1024));
    }

    #[test]
    fn refusals() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert!(matches!(parse_size("abc"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("12X"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("-1"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("0.1"), Err(SizeError::Invalid(_))));
        assert!(matches!(
            parse_size("99999999999T"),
            Err(SizeError::Overflow(_))
        ));
    }

    #[test]
    fn human_readable() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(3 << 29), "1.50 GiB");
    }
}
