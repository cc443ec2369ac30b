//! Text that came from the network, made safe to print.
//!
//! An error's `<Message>`, its code, a token endpoint's answer: a hostile
//! endpoint chooses these bytes, and printed raw to root's terminal an escape
//! sequence can clear the screen, set the title, or (on some terminals) answer
//! back as typed input. Every piece of service text that reaches a message goes
//! through [`service_text`] first.

use std::fmt::Write;

/// How many characters of one piece of service text a message keeps: enough for
/// any real Azure or Entra ID message's first line (the longest seen are about
/// 200), short enough that a hostile one cannot fill a screen.
pub const SERVICE_TEXT_MAX: usize = 300;

/// The first line of `text`, trimmed, with control characters escaped and cut
/// to [`SERVICE_TEXT_MAX`] characters (an ellipsis marks a cut).
pub fn service_text(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    let mut out = String::new();
    for (n, c) in line.chars().enumerate() {
        if n == SERVICE_TEXT_MAX {
            out.push('…');
            break;
        }
        push_printable(&mut out, c);
    }
    out
}

/// `text` whole, with control characters escaped: for a message assembled from
/// several sources, as the last guard before it is printed.
pub fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_printable(&mut out, c);
    }
    out
}

/// The bytes of a log, as whoever reads it with `cat` or `less` sees them:
/// lines (newlines and tabs) kept, every other control character escaped as
/// [`escape_controls`] does, bytes that are not UTF-8 as U+FFFD. `carry` holds
/// the start of a character cut at the end of `bytes` (at most 3 bytes) for the
/// next call, which joins it; at the end of the stream, call with no bytes and
/// `last` set to flush it.
pub fn escape_log_bytes(bytes: &[u8], carry: &mut Vec<u8>, last: bool) -> Vec<u8> {
    let mut input = std::mem::take(carry);
    input.extend_from_slice(bytes);
    let mut out = String::with_capacity(input.len());
    let push = |out: &mut String, text: &str| {
        for c in text.chars() {
            if c == '\n' || c == '\t' {
                out.push(c);
            } else {
                push_printable(out, c);
            }
        }
    };
    let mut rest = &input[..];
    loop {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                push(&mut out, text);
                break;
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                // (from_utf8 said this much is valid.)
                push(&mut out, std::str::from_utf8(valid).unwrap_or_default());
                match e.error_len() {
                    None if !last => {
                        carry.extend_from_slice(after);
                        break;
                    }
                    None => {
                        out.push('\u{FFFD}');
                        break;
                    }
                    Some(n) => {
                        out.push('\u{FFFD}');
                        rest = &after[n..];
                    }
                }
            }
        }
    }
    out.into_bytes()
}

/// Pushes `c`, or `\u{..}` for a character a terminal would act on: C0 and C1
/// controls, DEL, and the bidirectional overrides that reorder what is shown.
fn push_printable(out: &mut String, c: char) {
    let acts = c.is_control()
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}');
    if acts {
        let _ = write!(out, "\\u{{{:x}}}", c as u32);
    } else {
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_keeps_its_lines_and_shows_every_other_control_character() {
        let mut carry = Vec::new();
        let hostile = "a\tb\n\x1b]0;owned\x07\r\u{9b}2J\n".as_bytes();
        let out = escape_log_bytes(hostile, &mut carry, false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "a\tb\n\\u{1b}]0;owned\\u{7}\\u{d}\\u{9b}2J\n"
        );
        // A character cut between two reads is joined, not replaced.
        let e_acute = "é".as_bytes();
        let out = escape_log_bytes(&[b'x', e_acute[0]], &mut carry, false);
        assert_eq!(out, b"x");
        assert_eq!(carry, [e_acute[0]]);
        let out = escape_log_bytes(&e_acute[1..], &mut carry, false);
        assert_eq!(String::from_utf8(out).unwrap(), "é");
        // Bytes that are no UTF-8, and a cut one at the very end.
        let out = escape_log_bytes(&[0xff, b'y', 0xc3], &mut carry, true);
        assert_eq!(String::from_utf8(out).unwrap(), "\u{FFFD}y\u{FFFD}");
        assert!(carry.is_empty());
    }

    #[test]
    fn escape_sequences_are_shown_not_acted_on() {
        let hostile = "\x1b[2J\x1b]0;owned\x07Server busy\r\x7f\u{9b}31m";
        let s = service_text(hostile);
        assert!(!s.chars().any(|c| c.is_control()), "{s:?}");
        assert_eq!(
            s,
            "\\u{1b}[2J\\u{1b}]0;owned\\u{7}Server busy\\u{d}\\u{7f}\\u{9b}31m"
        );
    }

    #[test]
    fn only_the_first_line_is_kept_and_it_is_cut_to_a_sane_length() {
        assert_eq!(service_text("  One.\nRequestId:1\n"), "One.");
        let long = "x".repeat(100_000);
        let s = service_text(&long);
        assert_eq!(s.chars().count(), SERVICE_TEXT_MAX + 1);
        assert!(s.ends_with('…'));
    }

    #[test]
    fn bidirectional_overrides_are_escaped() {
        assert_eq!(escape_controls("a\u{202E}b"), "a\\u{202e}b");
        assert_eq!(escape_controls("plain, ünïcödé"), "plain, ünïcödé");
    }
}
