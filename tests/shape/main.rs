//! The code's shape, checked so that it holds after whoever last tidied it: no
//! file of src/ over 650 lines (tests apart: a `#[cfg(test)]` module's own
//! file), no function over 120 lines, no circle of imports among the parts of
//! src/ (a part that uses another which, directly or through others, uses it
//! back: a reader should be able to read the parts in an order in which each
//! only uses what came before), no comment citing an issue number, and no
//! helper of the tests defined twice. The checks read the source as text (no
//! compiler involved), so each is also tried here on a small made-up case it
//! must fault.

mod graph;
mod lex;
mod modules;

use std::collections::BTreeMap;
use std::path::Path;

use graph::circles;
use lex::Token;
use modules::Tree;

const MAX_FILE_LINES: usize = 650;
const MAX_FN_LINES: usize = 120;

fn src() -> Tree {
    Tree::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// Each file over `MAX_FILE_LINES` lines, but those only tests compile.
fn long_files(tree: &Tree) -> Vec<String> {
    tree.files
        .iter()
        .filter(|f| !f.test && f.lines > MAX_FILE_LINES)
        .map(|f| format!("{}: {} lines", f.path.display(), f.lines))
        .collect()
}

/// Each function (with a body) over `MAX_FN_LINES` lines, from `fn` to its
/// closing brace.
fn long_functions(tree: &Tree) -> Vec<String> {
    let mut long = Vec::new();
    for file in &tree.files {
        for (name, first, lines) in functions(&file.tokens) {
            if lines > MAX_FN_LINES {
                long.push(format!(
                    "{}:{first}: fn {name}: {lines} lines",
                    file.path.display()
                ));
            }
        }
    }
    long
}

/// Every function with a body: its name, first line and length in lines.
fn functions(toks: &[Token]) -> Vec<(String, usize, usize)> {
    function_spans(toks)
        .into_iter()
        .map(|(name, start, end)| {
            (
                name,
                toks[start].line,
                toks[end].line - toks[start].line + 1,
            )
        })
        .collect()
}

/// Every function with a body: its name and the indices of its `fn` and of its
/// closing brace.
fn function_spans(toks: &[Token]) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        let Some(name) = toks
            .get(i + 1)
            .and_then(Token::word)
            .filter(|_| t.is_word("fn"))
        else {
            continue;
        };
        if let Some(end) = body_end(toks, i + 2) {
            found.push((name.to_string(), i, end));
        }
    }
    found
}

/// From a function's parameters on: the index of its body's closing brace, or
/// `None` when a `;` comes first (a declaration in a trait).
fn body_end(toks: &[Token], from: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_body = false;
    for (j, t) in toks.iter().enumerate().skip(from) {
        if t.is('(') || t.is('[') || t.is('{') {
            in_body |= depth == 0 && t.is('{');
            depth += 1;
        } else if t.is(')') || t.is(']') || t.is('}') {
            depth = depth.saturating_sub(1);
            if in_body && depth == 0 {
                return Some(j);
            }
        } else if depth == 0 && t.is(';') {
            return None;
        }
    }
    None
}

/// Each circle of imports, its parts and the uses that close it.
fn import_circles(tree: &Tree) -> Vec<String> {
    let edges = tree.edges();
    let mut found = Vec::new();
    for group in circles(tree, &edges) {
        let mut text = format!("a circle of imports among {}:", group.parts.join(", "));
        for e in group.uses {
            text += &format!(
                "\n  {}:{} uses {} ({})",
                tree.files[e.from].path.display(),
                e.line,
                tree.files[e.to].path.display(),
                e.what,
            );
        }
        found.push(text);
    }
    found
}

#[test]
fn no_file_in_src_is_over_650_lines_outside_tests() {
    let long = long_files(&src());
    assert!(
        long.is_empty(),
        "split these along a seam a reader would name:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_in_src_is_over_120_lines() {
    let long = long_functions(&src());
    assert!(
        long.is_empty(),
        "split these into named steps:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_import_circle_among_the_files_of_src() {
    let found = import_circles(&src());
    assert!(
        found.is_empty(),
        "move each shared name to the file it belongs in, so imports run one way:\n{}",
        found.join("\n")
    );
}

/// Each function of the test files (`tests/`) whose parameters and body are
/// those of another one there, word for word: a helper written again instead of
/// shared from tests/common. Methods (two types may each pass a call on the
/// same way) and functions of a few words do not count.
fn helpers_twice(root: &Path) -> Vec<String> {
    let mut seen: BTreeMap<Vec<lex::Tok>, String> = BTreeMap::new();
    let mut twice = Vec::new();
    for path in rust_files(root) {
        let text = std::fs::read_to_string(&path).unwrap();
        let toks = lex::tokens(&text);
        let shown = path.strip_prefix(root).unwrap().display().to_string();
        for (name, start, end) in function_spans(&toks) {
            let body = without_module_paths(&toks[start + 2..=end]);
            let first_parameter = body.iter().take_while(|t| **t != lex::Tok::Punct(','));
            let method = first_parameter
                .take_while(|t| **t != lex::Tok::Punct(')'))
                .any(|t| *t == lex::Tok::Word("self".into()));
            if body.len() < 24 || method {
                continue;
            }
            let here = format!("{shown}:{} fn {name}", toks[start].line);
            match seen.get(&body) {
                Some(first) => twice.push(format!("{here} is {first} again")),
                None => {
                    seen.insert(body, here);
                }
            }
        }
    }
    twice
}

/// `toks` without the modules in front of names (`std::net::TcpListener` is
/// `TcpListener`), so that a copy that spells a name out is a copy still.
fn without_module_paths(toks: &[Token]) -> Vec<lex::Tok> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let module = toks[i]
            .word()
            .is_some_and(|w| w.starts_with(|c: char| c.is_ascii_lowercase()))
            && toks.get(i + 1).is_some_and(|t| t.tok == lex::Tok::Sep);
        if module {
            i += 2;
            continue;
        }
        out.push(toks[i].tok.clone());
        i += 1;
    }
    out
}

/// The `.rs` files under `dir`, in a stable order.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files.extend(rust_files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            files.push(p);
        }
    }
    files
}

#[test]
fn no_helper_is_defined_twice_in_the_tests() {
    let twice = helpers_twice(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"));
    assert!(
        twice.is_empty(),
        "share these from tests/common:\n{}",
        twice.join("\n")
    );
}

/// Each place in `text` that cites a tracker's issue by number (`issue 42`,
/// `Issue #7`, `issues 3`): the tracker is not part of the code, so a comment
/// says the reason itself.
fn issue_numbers(text: &str) -> Vec<usize> {
    let lower = text.to_ascii_lowercase();
    let mut found = Vec::new();
    for (at, _) in lower.match_indices("issue") {
        let rest = lower[at + 5..].trim_start_matches('s');
        // Across a comment's line break too (`issue\n//! 42`).
        let rest = rest.trim_start_matches(|c: char| c.is_whitespace() || "#/!*".contains(c));
        let word_start = at == 0 || !lower.as_bytes()[at - 1].is_ascii_alphanumeric();
        if word_start && rest.starts_with(|c: char| c.is_ascii_digit()) {
            found.push(lower[..at].matches('\n').count() + 1);
        }
    }
    found
}

#[test]
fn no_file_in_src_cites_an_issue_number() {
    let tree = src();
    let mut cited = Vec::new();
    for file in &tree.files {
        let text = std::fs::read_to_string(tree.root.join(&file.path)).unwrap();
        for line in issue_numbers(&text) {
            cited.push(format!("{}:{line}", file.path.display()));
        }
    }
    assert!(
        cited.is_empty(),
        "say the reason itself:\n{}",
        cited.join("\n")
    );
    assert_eq!(issue_numbers("a\n// see issue 42.\n"), [2]);
    assert_eq!(
        issue_numbers("Issue #7; issues 3 and 4\n//! (issue\n//! 5)"),
        [1, 1, 2]
    );
    assert!(issue_numbers("tissue 4, the issue's test, issued 3").is_empty());
}

/// A made-up crate in a temporary folder, `files` as (path under src/, text).
fn made_up(files: &[(&str, String)]) -> (tempfile::TempDir, Tree) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let tree = Tree::load(dir.path());
    (dir, tree)
}

#[test]
fn a_circle_through_a_re_export_or_a_path_in_code_is_found_and_a_module_s_own_head_is_none() {
    let (_dir, tree) = made_up(&[
        ("lib.rs", "pub mod a;\npub mod b;\nmod c;\nmod e;\n".into()),
        // a uses b's B.
        ("a.rs", "use crate::b::B;\npub struct A(B);\n".into()),
        // b names D through c's re-export, in code.
        (
            "b.rs",
            "pub struct B;\nfn f() { let _ = crate::c::D; }\n".into(),
        ),
        // c's head re-exports d's D and holds what d shares; d uses a: the circle
        // a -> b -> c -> a. Neither the head's use of d nor d's of its head count.
        (
            "c/mod.rs",
            "mod d;\npub use d::D;\npub(crate) struct Shared;\nfn g() { d::h(); }\n".into(),
        ),
        (
            "c/d.rs",
            "use super::Shared;\npub struct D;\npub fn h() { let _ = crate::a::A; }\n".into(),
        ),
        // The same between a head beside its folder (e.rs) and its child.
        ("e.rs", "mod f;\npub struct E;\nfn g() { f::h(); }\n".into()),
        ("e/f.rs", "pub fn h() { let _ = super::E; }\n".into()),
    ]);
    let found = import_circles(&tree);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("a circle of imports among a, b, c:"),
        "{found:?}"
    );
    assert!(
        found[0].contains("b.rs:2 uses c/d.rs (crate::c::D)"),
        "{found:?}"
    );
    assert!(!found[0].contains("Shared"), "{found:?}");
}

#[test]
fn tests_comments_strings_and_visibilities_make_no_circle() {
    let (_dir, tree) = made_up(&[
        ("lib.rs", "pub mod a;\npub mod b;\n".into()),
        ("a.rs", "use crate::b::B;\npub struct A(B);\n".into()),
        (
            "b.rs",
            "pub struct B;\n// crate::a::A\nconst S: &str = \"crate::a::A\";\n\
             pub(in crate::b) struct C;\n\
             #[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n#[cfg(test)]\nmod more;\n"
                .into(),
        ),
        ("b/more.rs", "use crate::a::A;\n".into()),
    ]);
    let found = import_circles(&tree);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_long_file_or_function_is_found_but_a_long_test_file_is_not() {
    let body = |n: usize| "    let _ = 1;\n".repeat(n);
    let (_dir, tree) = made_up(&[
        ("lib.rs", "mod long;\n#[cfg(test)]\nmod tests;\n".into()),
        (
            "long.rs",
            format!(
                "fn ok() {{\n{}}}\nfn too_long() {{\n{}}}\n{}",
                body(MAX_FN_LINES - 2),
                body(MAX_FN_LINES - 1),
                "\n".repeat(MAX_FILE_LINES - 2 * MAX_FN_LINES)
            ),
        ),
        ("tests.rs", "\n".repeat(MAX_FILE_LINES * 2)),
    ]);
    assert_eq!(
        long_files(&tree),
        [format!("long.rs: {} lines", MAX_FILE_LINES + 1)]
    );
    let first = MAX_FN_LINES + 1;
    assert_eq!(
        long_functions(&tree),
        [format!(
            "long.rs:{first}: fn too_long: {} lines",
            MAX_FN_LINES + 1
        )]
    );
}
