//! Small matters of English in messages.

/// "a" or "an" before `word` as it is read aloud: a filesystem's or a blob
/// type's name (`an ext4`, `an xfs`, `a btrfs`, `an AppendBlob`). Names spelled
/// out letter by letter take "an" when their first letter's name starts with a
/// vowel sound (f, h, l, m, n, r, s, x); words read as words go by their first
/// letter.
pub fn article(word: &str) -> &'static str {
    let lower = word.to_ascii_lowercase();
    // Read letter by letter.
    const SPELLED: [&str; 8] = [
        "ntfs",
        "hfs",
        "hfsplus",
        "f2fs",
        "lvm2_member",
        "ufs",
        "udf",
        "xfs",
    ];
    let first = lower.chars().next().unwrap_or('x');
    let vowel_sound = if SPELLED.contains(&lower.as_str()) {
        "fhlmnrsx".contains(first) || "aeio".contains(first)
    } else {
        "aeiox".contains(first)
    };
    if vowel_sound {
        "an"
    } else {
        "a"
    }
}

#[cfg(test)]
mod tests {
    use super::article;

    #[test]
    fn the_article_goes_by_how_the_name_is_read() {
        for (word, a) in [
            ("ext4", "an"),
            ("xfs", "an"),
            ("btrfs", "a"),
            ("vfat", "a"),
            ("ntfs", "an"),
            ("exfat", "an"),
            ("f2fs", "an"),
            ("swap", "a"),
            ("squashfs", "a"),
            ("iso9660", "an"),
            ("BlockBlob", "a"),
            ("AppendBlob", "an"),
            ("udf", "a"),
        ] {
            assert_eq!(article(word), a, "{word}");
        }
    }
}
