//! Which file uses which: every `use` item and every path spelled out in code,
//! followed through re-exports (`pub use`) to the file that defines the name;
//! and the circles among them, module by module. In each module the parts are
//! its children (each taken whole, with the modules below it), and they must use
//! each other one way. The module's own head (`mod.rs`, or `name.rs` beside a
//! folder `name/`) is not one of its parts: what a module's files share lives
//! there (Rust lets a child see its parent's private names for that), and it
//! names its children, so uses between a head and the files below it are no
//! circle.

use std::collections::BTreeMap;

use crate::modules::Tree;

/// File `from` (at `line`) names something defined in file `to`.
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub line: usize,
    pub what: String,
}

impl Tree {
    /// `path` as written in module `m`, made absolute: its crate and the path
    /// from that crate's root; `None` when it leads outside (std, a dependency,
    /// a local name). `code` paths may also start with a name `m` imports.
    fn absolute(&self, m: usize, path: &[String], code: bool) -> Option<(usize, Vec<String>)> {
        let module = &self.modules[m];
        let first = path.first()?.as_str();
        let (krate, mut base, rest) = match first {
            "crate" => (module.krate, Vec::new(), &path[1..]),
            "self" => (module.krate, module.path.clone(), &path[1..]),
            "super" => {
                let mut base = module.path.clone();
                let supers = path.iter().take_while(|s| *s == "super").count();
                for _ in 0..supers {
                    base.pop()?;
                }
                (module.krate, base, &path[supers..])
            }
            "blobdrive" if module.krate == 1 => (0, Vec::new(), &path[1..]),
            _ if module.children.contains_key(first) => (module.krate, module.path.clone(), path),
            _ if code => {
                let import = module
                    .imports
                    .iter()
                    .find(|i| i.name.as_deref() == Some(first))?;
                let (krate, mut base) = self.absolute(m, &import.path, false)?;
                base.extend_from_slice(&path[1..]);
                return Some((krate, base));
            }
            _ => return None,
        };
        base.extend_from_slice(rest);
        Some((krate, base))
    }

    /// The deepest module along `path` in `krate`, and how many words of it
    /// name modules.
    fn module_along(&self, krate: usize, path: &[String]) -> Option<(usize, usize)> {
        let mut m = self.crates.get(krate).copied().flatten()?;
        let mut k = 0;
        while let Some(&c) = path.get(k).and_then(|w| self.modules[m].children.get(w)) {
            m = c;
            k += 1;
        }
        Some((m, k))
    }

    /// The file that defines what absolute `path` names: the module it leads
    /// to, or, for an item, the module it is in, followed through that
    /// module's imports when the item is one of them.
    fn defined_in(&self, krate: usize, path: &[String], hops: usize) -> Option<usize> {
        let (m, k) = self.module_along(krate, path)?;
        let module = &self.modules[m];
        let Some(name) = path.get(k).filter(|_| hops < 16) else {
            return Some(module.file);
        };
        let through = |import_path: &[String], from: usize| {
            let (kr, mut p) = self.absolute(m, import_path, false)?;
            p.extend_from_slice(&path[from..]);
            self.defined_in(kr, &p, hops + 1)
        };
        if let Some(import) = module
            .imports
            .iter()
            .find(|i| i.name.as_ref() == Some(name))
        {
            return through(&import.path, k + 1).or(Some(module.file));
        }
        for glob in module.imports.iter().filter(|i| i.name.is_none()) {
            let Some((kr, g)) = self.absolute(m, &glob.path, false) else {
                continue;
            };
            let Some((gm, gk)) = self.module_along(kr, &g).filter(|&(_, gk)| gk == g.len()) else {
                continue;
            };
            let target = &self.modules[gm];
            let has = target.children.contains_key(name)
                || target.imports.iter().any(|i| i.name.as_ref() == Some(name));
            if has && gk == g.len() {
                return through(&glob.path, k);
            }
        }
        Some(module.file)
    }

    /// Every use of one file by another, in code that is built (a test may use
    /// whatever it tests with).
    pub fn edges(&self) -> Vec<Edge> {
        let mut edges = Vec::new();
        for (m, module) in self.modules.iter().enumerate().filter(|(_, m)| !m.test) {
            let imports = module.imports.iter().map(|i| (&i.path, i.line, false));
            let paths = module.paths.iter().map(|(p, line)| (p, *line, true));
            for (path, line, code) in imports.chain(paths) {
                let Some((krate, abs)) = self.absolute(m, path, code) else {
                    continue;
                };
                let Some(to) = self.defined_in(krate, &abs, 0) else {
                    continue;
                };
                if to != module.file {
                    edges.push(Edge {
                        from: module.file,
                        to,
                        line,
                        what: path.join("::"),
                    });
                }
            }
        }
        edges
    }
}

/// A circle: children of one module (each taken whole) that all reach each
/// other, and the uses between them.
pub struct Circle<'a> {
    pub parts: Vec<String>,
    pub uses: Vec<&'a Edge>,
}

/// Where a file stands: its crate, then the path of the module it is, so that
/// the head of a module (`mod.rs`, or `name.rs` beside a folder `name/`)
/// stands above the files of its children.
fn place(tree: &Tree, file: usize) -> Vec<String> {
    let module = &tree.modules[tree.files[file].module];
    let krate = ["lib", "main"][module.krate].to_string();
    std::iter::once(krate)
        .chain(module.path.iter().cloned())
        .collect()
}

/// The two parts of one module that a use from `from` to `to` joins: below the
/// deepest module both are in, the child holding each (named by its path);
/// `None` when one of them is the head of a module that holds the other.
fn parts_joined(from: &[String], to: &[String]) -> Option<(String, String)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return None;
    }
    let name = |p: &[String]| p[1..].join("::");
    Some((name(&from[..=common]), name(&to[..=common])))
}

/// Every circle of uses among the children of a module.
pub fn circles<'a>(tree: &Tree, edges: &'a [Edge]) -> Vec<Circle<'a>> {
    let mut ids: BTreeMap<String, usize> = BTreeMap::new();
    let mut joined = Vec::new();
    for e in edges {
        let from = place(tree, e.from);
        let to = place(tree, e.to);
        if let Some((a, b)) = parts_joined(&from, &to) {
            let n = ids.len();
            let a = *ids.entry(a).or_insert(n);
            let n = ids.len();
            let b = *ids.entry(b).or_insert(n);
            joined.push((a, b, e));
        }
    }
    let mut names = vec![String::new(); ids.len()];
    for (name, &id) in &ids {
        names[id] = name.clone();
    }
    let mut next = vec![Vec::new(); ids.len()];
    for &(a, b, _) in &joined {
        next[a].push(b);
    }
    strongly_connected(next)
        .into_iter()
        .map(|group| Circle {
            parts: group.iter().map(|&p| names[p].clone()).collect(),
            uses: joined
                .iter()
                .filter(|(a, b, _)| group.contains(a) && group.contains(b))
                .map(|&(_, _, e)| e)
                .collect(),
        })
        .collect()
}

/// The groups of more than one node that all reach each other (Tarjan's
/// strongly connected components), each sorted.
fn strongly_connected(next: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
    let n = next.len();
    let mut t = Tarjan {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        groups: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.groups
}

struct Tarjan {
    next: Vec<Vec<usize>>,
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    counter: usize,
    groups: Vec<Vec<usize>>,
}

impl Tarjan {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.counter);
        self.low[v] = self.counter;
        self.counter += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for w in self.next[v].clone() {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut group = Vec::new();
            loop {
                let w = self.stack.pop().unwrap();
                self.on_stack[w] = false;
                group.push(w);
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                self.groups.push(group);
            }
        }
    }
}
