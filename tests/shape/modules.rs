//! The module tree of a crate (or of a library and the binary beside it), read
//! from its files the way rustc finds them: from `lib.rs` and `main.rs`, each
//! `mod NAME;` is `NAME.rs` or `NAME/mod.rs` in the folder of its parent. For
//! each module: its children, what its `use` items name and what paths its code
//! spells out (`crate::…`, `super::…`, a child's name followed by `::`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::lex::{tokens, Tok, Token};

/// One `.rs` file.
pub struct File {
    /// Relative to the folder the tree was read from.
    pub path: PathBuf,
    pub lines: usize,
    /// Declared under `#[cfg(test)]` (itself or a module above it).
    pub test: bool,
    pub tokens: Vec<Token>,
    /// The module the file is (its first line's).
    pub module: usize,
}

/// What a `use` item brings in: one name (or every name, for a glob).
pub struct Import {
    pub path: Vec<String>,
    /// The name it is known by here; `None` for `*`.
    pub name: Option<String>,
    pub line: usize,
}

pub struct Module {
    /// 0 for the library (`lib.rs`), 1 for the binary (`main.rs`).
    pub krate: usize,
    pub path: Vec<String>,
    pub file: usize,
    /// Compiled for tests only (`#[cfg(test)]`, itself or a module above it).
    pub test: bool,
    pub children: BTreeMap<String, usize>,
    pub imports: Vec<Import>,
    /// Paths spelled out in code, with their line.
    pub paths: Vec<(Vec<String>, usize)>,
}

pub struct Tree {
    pub root: PathBuf,
    pub files: Vec<File>,
    pub modules: Vec<Module>,
    /// The root module of each crate: the library's, then the binary's.
    pub crates: Vec<Option<usize>>,
}

impl Tree {
    /// Reads the crate(s) under `root` (a `src/` folder).
    pub fn load(root: &Path) -> Tree {
        let mut tree = Tree {
            root: root.to_path_buf(),
            files: Vec::new(),
            modules: Vec::new(),
            crates: Vec::new(),
        };
        for (krate, name) in ["lib.rs", "main.rs"].into_iter().enumerate() {
            let top = root.join(name).exists();
            let id =
                top.then(|| tree.load_file(PathBuf::from(name), krate, Vec::new(), false, None));
            tree.crates.push(id);
        }
        tree
    }

    fn new_module(
        &mut self,
        krate: usize,
        path: Vec<String>,
        file: usize,
        parent: Option<usize>,
        test: bool,
    ) -> usize {
        self.modules.push(Module {
            krate,
            path,
            file,
            test,
            children: BTreeMap::new(),
            imports: Vec::new(),
            paths: Vec::new(),
        });
        let id = self.modules.len() - 1;
        if let (Some(p), Some(name)) = (parent, self.modules[id].path.last().cloned()) {
            self.modules[p].children.insert(name, id);
        }
        id
    }

    fn load_file(
        &mut self,
        rel: PathBuf,
        krate: usize,
        path: Vec<String>,
        test: bool,
        parent: Option<usize>,
    ) -> usize {
        let text = std::fs::read_to_string(self.root.join(&rel))
            .unwrap_or_else(|e| panic!("read {}: {e}", rel.display()));
        self.files.push(File {
            path: rel,
            lines: text.lines().count(),
            test,
            tokens: tokens(&text),
            module: self.modules.len(),
        });
        let file = self.files.len() - 1;
        let module = self.new_module(krate, path, file, parent, test);
        self.walk(file, module);
        module
    }

    /// Where `mod name;` inside module `module` (in `file`) is.
    fn child_file(&self, file: usize, inline: &[String], name: &str) -> PathBuf {
        let rel = &self.files[file].path;
        let stem = rel.file_stem().unwrap().to_str().unwrap();
        let mut dir = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        if !["mod", "lib", "main"].contains(&stem) {
            dir.push(stem);
        }
        dir.extend(inline);
        let flat = dir.join(format!("{name}.rs"));
        if self.root.join(&flat).exists() {
            flat
        } else {
            dir.join(name).join("mod.rs")
        }
    }

    /// Reads one file's words: its modules (inline ones and files), imports and paths.
    fn walk(&mut self, file: usize, top: usize) {
        let toks = self.files[file].tokens.clone();
        let test = self.files[file].test;
        // The modules open at this point, with the brace depth each closes at.
        let mut open: Vec<(usize, usize, bool)> = vec![(top, 0, test)];
        let mut depth = 0;
        let mut i = 0;
        while i < toks.len() {
            let (cur, _, cur_test) = *open.last().unwrap();
            let t = &toks[i];
            if t.is('{') {
                depth += 1;
            } else if t.is('}') {
                depth -= 1;
                if open.len() > 1 && open.last().unwrap().1 == depth {
                    open.pop();
                }
            } else if let (true, Some(name)) =
                (t.is_word("mod"), toks.get(i + 1).and_then(Token::word))
            {
                let name = name.to_string();
                let is_test = cur_test || under_cfg_test(&toks, i);
                let mut path = self.modules[cur].path.clone();
                path.push(name.clone());
                let krate = self.modules[cur].krate;
                if toks.get(i + 2).is_some_and(|t| t.is(';')) {
                    let inline: Vec<String> = open[1..]
                        .iter()
                        .map(|&(m, _, _)| self.modules[m].path.last().unwrap().clone())
                        .collect();
                    let rel = self.child_file(file, &inline, &name);
                    self.load_file(rel, krate, path, is_test, Some(cur));
                    i += 3;
                    continue;
                }
                if toks.get(i + 2).is_some_and(|t| t.is('{')) {
                    let m = self.new_module(krate, path, file, Some(cur), is_test);
                    open.push((m, depth, is_test));
                    depth += 1;
                    i += 3;
                    continue;
                }
            } else if t.is_word("use") {
                let mut imports = Vec::new();
                i += 1;
                use_tree(&toks, &mut i, Vec::new(), &mut imports);
                let line = t.line;
                let imports = imports
                    .into_iter()
                    .map(|(path, name)| Import { path, name, line });
                self.modules[cur].imports.extend(imports);
                continue;
            } else if starts_path(&toks, i) {
                let (path, end) = read_path(&toks, i);
                if path.len() >= 2 {
                    self.modules[cur].paths.push((path, t.line));
                }
                i = end;
                continue;
            }
            i += 1;
        }
    }
}

/// A word followed by `::` that is not itself the tail of a path, nor the path
/// of a visibility (`pub(in crate::azure)`, which imports nothing).
fn starts_path(toks: &[Token], i: usize) -> bool {
    let before = i.checked_sub(1).map(|k| &toks[k]);
    toks[i].word().is_some()
        && toks.get(i + 1).is_some_and(|t| t.tok == Tok::Sep)
        && !before.is_some_and(|t| t.tok == Tok::Sep || t.is_word("in"))
}

/// `a::b::c` from `i`: the words and the index after them.
fn read_path(toks: &[Token], mut i: usize) -> (Vec<String>, usize) {
    let mut path = vec![toks[i].word().unwrap().to_string()];
    i += 1;
    while toks.get(i).is_some_and(|t| t.tok == Tok::Sep) {
        match toks.get(i + 1).and_then(Token::word) {
            Some(w) => path.push(w.to_string()),
            None => break,
        }
        i += 2;
    }
    (path, i)
}

/// One use tree from `i` (after `use`, or inside braces), its imports appended
/// with `prefix` before them; `i` ends after the tree (and after the `;` that
/// ends a whole `use` item).
fn use_tree(
    toks: &[Token],
    i: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix;
    while let Some(t) = toks.get(*i) {
        *i += 1;
        match &t.tok {
            Tok::Sep => {}
            Tok::Punct('*') => out.push((path.clone(), None)),
            Tok::Punct('{') => {
                while toks.get(*i).is_some_and(|t| !t.is('}')) {
                    use_tree(toks, i, path.clone(), out);
                    if toks.get(*i).is_some_and(|t| t.is(',')) {
                        *i += 1;
                    }
                }
                *i += 1;
            }
            Tok::Word(w) if toks.get(*i).is_some_and(|t| t.tok == Tok::Sep) => path.push(w.clone()),
            Tok::Word(w) => {
                let mut name = w.clone();
                if w != "self" {
                    path.push(w.clone());
                } else {
                    name = path.last().cloned().unwrap_or_default();
                }
                if toks.get(*i).is_some_and(|t| t.is_word("as")) {
                    name = toks
                        .get(*i + 1)
                        .and_then(Token::word)
                        .unwrap_or("_")
                        .to_string();
                    *i += 2;
                }
                out.push((path.clone(), Some(name)));
            }
            _ => {}
        }
        match toks.get(*i) {
            Some(t) if t.is(';') => {
                *i += 1;
                return;
            }
            Some(t) if t.is(',') || t.is('}') => return,
            _ => {}
        }
    }
}

/// The index of the bracket that `close` (at `k`) closes.
fn matching_open(toks: &[Token], k: usize, open: char, close: char) -> Option<usize> {
    let mut depth = 0;
    for j in (0..=k).rev() {
        if toks[j].is(close) {
            depth += 1;
        } else if toks[j].is(open) {
            depth -= 1;
            if depth == 0 {
                return Some(j);
            }
        }
    }
    None
}

/// Whether the item at `i` carries `#[cfg(test)]` among its attributes.
fn under_cfg_test(toks: &[Token], i: usize) -> bool {
    let mut k = i;
    while k > 0 {
        let t = &toks[k - 1];
        if t.is_word("pub") {
            k -= 1;
        } else if t.is(')') {
            match matching_open(toks, k - 1, '(', ')') {
                Some(j) if j > 0 && toks[j - 1].is_word("pub") => k = j - 1,
                _ => return false,
            }
        } else if t.is(']') {
            let Some(j) =
                matching_open(toks, k - 1, '[', ']').filter(|&j| j > 0 && toks[j - 1].is('#'))
            else {
                return false;
            };
            let words: Vec<&str> = toks[j + 1..k - 1].iter().filter_map(Token::word).collect();
            if words.first() == Some(&"cfg") && words.contains(&"test") && !words.contains(&"not") {
                return true;
            }
            k = j - 1;
        } else {
            return false;
        }
    }
    false
}
