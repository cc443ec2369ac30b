//! Whether a command's text and its `--json` say the same things: each fact
//! of the text (a name with a `/` in it, a size, a number) is in the JSON, and
//! each value of the JSON (but the keys named as the JSON's own) shows in the
//! text.
//!
//! The two often come from twin runs (a drive `...ttwin...` for the text and
//! `...jtwin...` for the JSON, made the same way), so both are read with the
//! names that differ made alike: the twins' names, snapshot ids (times), loop
//! devices, and any pairs the caller gives.

use blobdrive::size::human;
use serde_json::Value;

use super::bd::Harness;

/// The marks of the twin that prints JSON and of the one that prints text.
pub const JSON_TWIN: &str = "jtwin";
pub const TEXT_TWIN: &str = "ttwin";

/// `s` with what differs between twin runs made alike.
pub fn alike(s: &str, pairs: &[(&str, &str)]) -> String {
    let mut s = s.replace(JSON_TWIN, TEXT_TWIN);
    for (from, to) in pairs {
        s = s.replace(from, to);
    }
    unnumbered(&snapshots_named(&s), "/dev/loop")
}

/// Every snapshot id (`2026-11-22T11:05:54.5810000Z`) written `SNAPSHOT`.
fn snapshots_named(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < s.len() {
        let end = i + 28;
        let is_id = end <= b.len()
            && b[i..end].iter().enumerate().all(|(k, c)| match k {
                4 | 7 => *c == b'-',
                10 => *c == b'T',
                13 | 16 => *c == b':',
                19 => *c == b'.',
                27 => *c == b'Z',
                _ => c.is_ascii_digit(),
            });
        if is_id {
            out.push_str("SNAPSHOT");
            i = end;
        } else {
            let c = s[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `s` with the number after each `prefix` written `N`.
fn unnumbered(s: &str, prefix: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find(prefix) {
        let after = &rest[at + prefix.len()..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        out.push_str(&rest[..at + prefix.len()]);
        out.push_str(if digits > 0 { "N" } else { "" });
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// The values of `v` (strings and numbers), by key, but for the keys in `own`
/// (and what is under them).
fn leaves<'a>(v: &'a Value, key: &'a str, own: &[&str], out: &mut Vec<(&'a str, &'a Value)>) {
    if own.contains(&key) {
        return;
    }
    match v {
        Value::Object(m) => m.iter().for_each(|(k, x)| leaves(x, k, own, out)),
        Value::Array(a) => a.iter().for_each(|x| leaves(x, key, own, out)),
        Value::String(_) | Value::Number(_) => out.push((key, v)),
        Value::Null | Value::Bool(_) => {}
    }
}

const UNITS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB"];

/// The facts of `text`: names with a `/` (split at `@`), sizes as `human`
/// writes them, and whole numbers of two digits or more.
fn text_facts(text: &str) -> Vec<String> {
    let words: Vec<&str> = text
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| ",;:()'\"`[]".contains(c)))
        .map(|w| w.trim_end_matches('.'))
        .collect();
    let mut facts = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        let next = words.get(i + 1).copied().unwrap_or("");
        if w.parse::<f64>().is_ok() && UNITS.contains(&next) {
            facts.push(format!("{w} {next}"));
            i += 2;
            continue;
        }
        if w.contains('/') && !w.ends_with("/s") && !w.starts_with("http") {
            facts.extend(w.split('@').filter(|p| !p.is_empty()).map(str::to_string));
        } else if w.len() > 1 && w.bytes().all(|c| c.is_ascii_digit()) {
            facts.push(w.to_string());
        }
        i += 1;
    }
    facts
}

/// Whether the JSON's values `values` hold the text's fact `fact`.
fn json_holds(values: &[(&str, &Value)], fact: &str, pairs: &[(&str, &str)]) -> bool {
    values.iter().any(|(_, v)| match v {
        Value::String(s) => alike(s, pairs).contains(fact),
        Value::Number(n) => n
            .as_u64()
            .is_some_and(|n| n.to_string() == fact || human(n) == fact),
        _ => false,
    })
}

/// Whether `text` shows the JSON's value `v`.
fn text_shows(text: &str, v: &Value, pairs: &[(&str, &str)]) -> bool {
    match v {
        Value::String(s) => s.is_empty() || text.contains(&alike(s, pairs)),
        Value::Number(n) => match n.as_u64() {
            // A count of none is often left unsaid.
            Some(0) => true,
            Some(n) => {
                let words: Vec<&str> = text
                    .split(|c: char| !c.is_ascii_alphanumeric() && c != '.')
                    .collect();
                words.contains(&n.to_string().as_str()) || text.contains(&human(n))
            }
            None => true,
        },
        _ => true,
    }
}

/// Fails unless the text `text` of the command `what` and its JSON `json`
/// say the same (see the module's documentation). `own`: keys of facts only
/// the JSON gives (a pid, the FUSE directory of an fs mount), or whose value
/// the text words otherwise (a transfer's seconds, from another run); `*`
/// for a JSON that gives much more than the text (`stats`): then only the
/// text's facts are looked for in it.
pub fn assert_same(what: &str, text: &str, json: &Value, own: &[&str], pairs: &[(&str, &str)]) {
    let text = alike(text, pairs);
    let mut values = Vec::new();
    leaves(json, "", own, &mut values);
    let mut all = Vec::new();
    leaves(json, "", &[], &mut all);
    for fact in text_facts(&text) {
        assert!(
            json_holds(&all, &fact, pairs),
            "{what}: the text says {fact:?}, the JSON does not:\n{text}\n{json:#}"
        );
    }
    if own.contains(&"*") {
        return;
    }
    for (key, v) in values {
        assert!(
            text_shows(&text, v, pairs),
            "{what}: the JSON's {key} = {v} is not in the text:\n{text}\n{json:#}"
        );
    }
}

/// The command line `args` with `--json` added when `json`, run by `h`; what
/// it printed (standard output, then error), which must be a success.
pub fn said(h: &Harness, args: &[String], json: bool) -> String {
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    if json {
        args.push("--json");
        return h.ok(&args);
    }
    let out = h.cmd(&args).output();
    let t = super::util::output_text(&out);
    assert!(out.status.success(), "{args:?}: {t}");
    let (o, e) = (out.stdout, out.stderr);
    format!(
        "{}{}",
        String::from_utf8_lossy(&o),
        String::from_utf8_lossy(&e)
    )
}

/// Runs the command `args(twin)` through `h` as text for the twin
/// [`TEXT_TWIN`] and with `--json` for [`JSON_TWIN`] (the same one for both
/// when `same`: a command that changes nothing), and fails unless both say
/// the same (see [`assert_same`], with `own` and `pairs`). The JSON.
pub fn text_and_json(
    h: &Harness,
    args: &dyn Fn(&str) -> Vec<String>,
    same: bool,
    own: &[&str],
    pairs: &[(&str, &str)],
) -> Value {
    let text = said(h, &args(TEXT_TWIN), false);
    let twin = if same { TEXT_TWIN } else { JSON_TWIN };
    let json = super::util::json(&said(h, &args(twin), true));
    assert_same(&args(TEXT_TWIN).join(" "), &text, &json, own, pairs);
    json
}

/// Owned copies of `a`, for a command line built from borrowed parts.
pub fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}
