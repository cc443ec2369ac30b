//! Kubernetes quantities (`64Mi`, `1.5Gi`, `500M`, `1e9`), as a StorageClass
//! parameter gives a size: the grammar of `resource.Quantity`, read into a
//! whole number of bytes.

/// The largest quantity taken: far above any cache, and far from overflow.
const MAX: u128 = 1 << 60;

/// The bytes `text` stands for: a number (digits, with a fraction or not), then
/// a binary suffix (`Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`), a decimal one (`m`,
/// `k`, `M`, `G`, `T`, `P`, `E`), an exponent (`e9`, `E-3`) or none. A
/// negative, a part of a byte, or more than 2^60 is refused; the error says
/// why in words, without the value.
pub fn bytes(text: &str) -> Result<u64, String> {
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    if unsigned.starts_with('-') {
        return Err("a size cannot be negative".into());
    }
    let end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(format!("not a Kubernetes quantity ({SHAPE})"));
    }
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err("too large".into());
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits
            .parse()
            .map_err(|_| format!("not a Kubernetes quantity ({SHAPE})"))?
    };
    let (multiplier, ten_power) = scale(suffix)?;
    // value = mantissa * multiplier * 10^(ten_power - fraction digits)
    let power = ten_power - fraction.len() as i32;
    let mut value = mantissa.checked_mul(multiplier).ok_or("too large")?;
    if power >= 0 {
        for _ in 0..power {
            value = value
                .checked_mul(10)
                .filter(|v| *v <= MAX)
                .ok_or("too large")?;
        }
    } else {
        for _ in 0..-power {
            if value % 10 != 0 {
                return Err("not a whole number of bytes".into());
            }
            value /= 10;
        }
    }
    if value > MAX {
        return Err("too large".into());
    }
    Ok(value as u64)
}

/// What a quantity looks like, for errors.
const SHAPE: &str = "a number and a suffix such as Mi or Gi, e.g. 64Mi";

/// A suffix's factor: (a binary multiplier, a power of ten).
fn scale(suffix: &str) -> Result<(u128, i32), String> {
    let binary = |shift: u32| Ok((1u128 << shift, 0));
    let decimal = |power: i32| Ok((1u128, power));
    match suffix {
        "" => decimal(0),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        _ => {
            let exponent = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .filter(|e| !e.is_empty())
                .and_then(|e| e.parse::<i32>().ok())
                .filter(|e| e.abs() <= 40)
                .ok_or_else(|| format!("not a Kubernetes quantity ({SHAPE})"))?;
            decimal(exponent)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_kubernetes_reads_them() {
        for (text, want) in [
            ("64Mi", 64u64 << 20),
            ("1Gi", 1 << 30),
            ("1.5Gi", 3 << 29),
            ("0.5Ki", 512),
            (".5Ki", 512),
            ("2.Mi", 2 << 20),
            ("+64Mi", 64 << 20),
            ("100M", 100_000_000),
            ("1k", 1000),
            ("1G", 1_000_000_000),
            ("1e9", 1_000_000_000),
            ("1E3", 1000),
            ("5000e-1", 500),
            ("67108864", 64 << 20),
            ("67108864000m", 64 << 20),
            ("0", 0),
            ("1Ei", 1 << 60),
        ] {
            assert_eq!(bytes(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn anything_else_is_refused_in_words() {
        for (text, why) in [
            ("", "not a Kubernetes quantity"),
            ("Mi", "not a Kubernetes quantity"),
            ("64MiB", "not a Kubernetes quantity"),
            ("64 Mi", "not a Kubernetes quantity"),
            ("64mi", "not a Kubernetes quantity"),
            ("1.2.3", "not a Kubernetes quantity"),
            ("1e", "not a Kubernetes quantity"),
            ("1e99", "not a Kubernetes quantity"),
            ("-64Mi", "negative"),
            ("1m", "whole number of bytes"),
            ("0.3Ki", "whole number of bytes"),
            ("2Ei", "too large"),
            ("1e30", "too large"),
            ("9999999999999999999999999999999", "too large"),
        ] {
            let err = bytes(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
    }
}
