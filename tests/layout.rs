//! The module layout: no import cycles between sibling modules, nor
//! between the crates; the protocol crate free of I/O and `unsafe`.
//!
//! A newcomer reads a folder as layers: `qp/half.rs` is below
//! `qp/ingress/`, which is below `qp/engine/`. A cycle between siblings
//! (engine uses expiry, expiry uses engine) means neither can be read, tested
//! or moved without the other, and the layers the folder names are not real.
//! So this test parses the library crates with `syn`, follows every path that
//! starts with `crate`, `self` or `super` (in `use` trees and in code), and
//! fails on any strongly connected set of sibling modules, naming for each
//! edge one place that makes it.
//!
//! Production code only: `#[cfg(test)]` modules and items are left out (a
//! test module is a leaf nobody imports). A path through a re-export (`use
//! crate::qp::HalfKey` where `qp` re-exports `half::HalfKey`) names the
//! parent and counts as no sibling edge, so the test can miss a cycle made
//! that way but never reports one that is not there.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

type ModPath = Vec<String>;

/// Where one module refers to another: (from, to) → first place seen.
type Edges = BTreeMap<(ModPath, ModPath), String>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// Resolves a path's leading `crate` / `self` / `super`s against `module`;
/// `None` for paths into other crates or local names.
fn resolve(module: &[String], segments: &[String]) -> Option<ModPath> {
    let mut it = segments.iter().peekable();
    let mut base: ModPath = match it.peek().map(|s| s.as_str()) {
        Some("crate") => {
            it.next();
            Vec::new()
        }
        Some("self") => {
            it.next();
            module.to_vec()
        }
        Some("super") => module.to_vec(),
        _ => return None,
    };
    while it.peek().map(|s| s.as_str()) == Some("super") {
        it.next();
        base.pop()?;
    }
    base.extend(it.cloned());
    Some(base)
}

struct ModVisitor<'a> {
    file: &'a Path,
    module: ModPath,
    edges: &'a mut Edges,
    /// `mod x;` declarations found, to be read from their own files.
    children: Vec<(ModPath, bool)>,
}

impl ModVisitor<'_> {
    fn note(&mut self, segments: &[String], line: usize) {
        if let Some(to) = resolve(&self.module, segments) {
            let file = self.file.strip_prefix(workspace()).unwrap_or(self.file);
            let at = format!("{}:{line}", file.display());
            self.edges.entry((self.module.clone(), to)).or_insert(at);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.note(prefix, n.ident.span().start().line);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.note(prefix, r.ident.span().start().line);
                prefix.pop();
            }
            syn::UseTree::Glob(g) => {
                self.note(prefix, g.star_token.spans[0].start().line);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for ModVisitor<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_cfg_test(&m.attrs) {
            return;
        }
        let mut path = self.module.clone();
        path.push(m.ident.to_string());
        match &m.content {
            Some((_, items)) => {
                let outer = std::mem::replace(&mut self.module, path);
                for item in items {
                    self.visit_item(item);
                }
                self.module = outer;
            }
            None => self.children.push((path, true)),
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !is_cfg_test(&u.attrs) {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !is_cfg_test(&i.attrs) {
            syn::visit::visit_item_impl(self, i);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = p.segments.first() {
            self.note(&segments, first.ident.span().start().line);
        }
        syn::visit::visit_path(self, p);
    }
}

/// The file of module `path` declared in `parent_file` (`x.rs` or
/// `x/mod.rs` next to a `mod.rs`/`lib.rs`, else below the parent's folder).
fn child_file(parent_file: &Path, name: &str) -> Option<PathBuf> {
    let stem = parent_file.file_stem()?.to_str()?;
    let dir = parent_file.parent()?;
    let dir = if matches!(stem, "mod" | "lib" | "main") {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    [
        dir.join(format!("{name}.rs")),
        dir.join(name).join("mod.rs"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Every production module of the crate rooted at `root`, and its edges.
fn crate_edges(root: &Path) -> (BTreeSet<ModPath>, Edges) {
    let mut modules = BTreeSet::new();
    let mut edges = Edges::new();
    let mut todo = vec![(Vec::new(), root.to_path_buf())];
    while let Some((module, file)) = todo.pop() {
        let src =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let ast = syn::parse_file(&src).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut v = ModVisitor {
            file: &file,
            module: module.clone(),
            edges: &mut edges,
            children: Vec::new(),
        };
        v.visit_file(&ast);
        modules.insert(module);
        for (child, _) in v.children {
            let name = child.last().expect("a child has a name");
            let f = child_file(&file, name)
                .unwrap_or_else(|| panic!("{}: no file for `mod {name};`", file.display()));
            todo.push((child, f));
        }
    }
    (modules, edges)
}

/// Strongly connected sets (more than one member) of `graph` (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'g> {
        g: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> T<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on.insert(v);
            for w in &self.g[v] {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w.as_str()) {
                    let iw = self.index[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// One line per sibling cycle in the crate at `root`, with the places
/// that make each edge of it.
fn sibling_cycles(krate: &str, root: &Path) -> Vec<String> {
    let (modules, edges) = crate_edges(root);
    let mut found = Vec::new();
    let parents: BTreeSet<ModPath> = modules
        .iter()
        .filter(|m| !m.is_empty())
        .map(|m| m[..m.len() - 1].to_vec())
        .collect();
    for parent in parents {
        let depth = parent.len();
        let child_of = |m: &ModPath| -> Option<String> {
            (m.len() > depth && m[..depth] == parent[..]).then(|| m[depth].clone())
        };
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut why: BTreeMap<(String, String), &String> = BTreeMap::new();
        for m in &modules {
            if let Some(c) = child_of(m) {
                graph.entry(c).or_default();
            }
        }
        for ((from, to), at) in &edges {
            let (Some(a), Some(b)) = (child_of(from), child_of(to)) else {
                continue;
            };
            // Only a module this crate has (not an item of the parent
            // that shares a name with nothing) is a sibling.
            if a != b && graph.contains_key(&b) {
                graph.get_mut(&a).expect("listed").insert(b.clone());
                why.entry((a, b)).or_insert(at);
            }
        }
        for comp in cycles(&graph) {
            let members: BTreeSet<&String> = comp.iter().collect();
            let places: Vec<String> = why
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|((a, b), at)| format!("{a} → {b} ({at})"))
                .collect();
            let name = if parent.is_empty() {
                krate.to_string()
            } else {
                format!("{krate}::{}", parent.join("::"))
            };
            found.push(format!(
                "{name}::{{{}}}: {}",
                comp.join(", "),
                places.join("; ")
            ));
        }
    }
    found
}

const CRATES: [(&str, &str); 5] = [
    ("soya", "proxy/src/lib.rs"),
    ("soya_proto", "proxy/proto/src/lib.rs"),
    ("soya_io", "proxy/io/src/lib.rs"),
    ("soya_config", "config/src/lib.rs"),
    ("soya_tools", "tools/src/lib.rs"),
];

/// The workspace's crates (package name, manifest) and the layer each sits
/// in: a crate may depend only on crates of a lower layer.
const LAYERS: [(&str, &str, u8); 6] = [
    ("soya-config", "config/Cargo.toml", 0),
    ("soya-proto", "proxy/proto/Cargo.toml", 1),
    ("soya-io", "proxy/io/Cargo.toml", 2),
    ("soya", "proxy/Cargo.toml", 3),
    ("soya-tools", "tools/Cargo.toml", 4),
    ("soya-integration-tests", "tests/Cargo.toml", 5),
];

/// The workspace crates a manifest names in its `[dependencies]`,
/// `[dev-dependencies]` and `[build-dependencies]` (a dev-dependency
/// counts too: cargo allows a cycle through one, the layers do not).
fn workspace_deps(manifest: &str) -> BTreeSet<String> {
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line.ends_with("dependencies]");
            continue;
        }
        if !in_deps || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or("").trim();
        if LAYERS.iter().any(|(n, _, _)| *n == name) {
            deps.insert(name.to_string());
        }
    }
    deps
}

/// No cycle between the crates: each depends only on lower layers
/// (config, then the protocol, the I/O, the daemon, the tools).
#[test]
fn crates_depend_only_on_lower_layers() {
    let ws = workspace();
    let mut wrong = Vec::new();
    for (name, manifest, layer) in LAYERS {
        let text = std::fs::read_to_string(ws.join(manifest)).expect("manifest");
        for dep in workspace_deps(&text) {
            let (_, _, l) = LAYERS.iter().find(|(n, _, _)| *n == dep).expect("listed");
            if *l >= layer {
                wrong.push(format!("{name} ({manifest}) depends on {dep}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "crates out of their layer:\n{}",
        wrong.join("\n")
    );
    let proto = std::fs::read_to_string(ws.join("proxy/proto/Cargo.toml")).expect("manifest");
    assert_eq!(
        workspace_deps(&proto),
        BTreeSet::from(["soya-config".to_string()]),
        "the protocol crate depends on soya-config alone"
    );
}

/// Every package the protocol crate may pull in, by name, from Cargo.lock
/// (all features, dev-dependencies too: a superset of `cargo tree -p
/// soya-proto -e normal`).
fn locked_closure(root: &str) -> BTreeSet<String> {
    let lock = std::fs::read_to_string(workspace().join("Cargo.lock")).expect("Cargo.lock");
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut name = String::new();
    let mut in_deps = false;
    for line in lock.lines() {
        let line = line.trim();
        if line == "[[package]]" {
            in_deps = false;
        } else if let Some(n) = line.strip_prefix("name = ") {
            name = n.trim_matches('"').to_string();
            deps.entry(name.clone()).or_default();
        } else if line.starts_with("dependencies = [") {
            in_deps = true;
        } else if in_deps && line == "]" {
            in_deps = false;
        } else if in_deps {
            let dep = line.trim_matches([' ', '"', ',']);
            let dep = dep.split(' ').next().unwrap_or("").to_string();
            deps.entry(name.clone()).or_default().insert(dep);
        }
    }
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_string()];
    while let Some(p) = todo.pop() {
        if seen.insert(p.clone()) {
            todo.extend(deps.get(&p).into_iter().flatten().cloned());
        }
    }
    seen
}

/// The protocol crate builds without a runtime, an HTTP server, BPF,
/// netlink or a command-line parser (issue 37).
#[test]
fn the_protocol_crate_pulls_in_no_io_stack() {
    let all = locked_closure("soya-proto");
    assert!(all.contains("snow"), "Cargo.lock read: {all:?}");
    let banned: Vec<&String> = all
        .iter()
        .filter(|p| {
            ["tokio", "hyper", "aya", "clap"].contains(&p.as_str()) || p.starts_with("netlink")
        })
        .collect();
    assert!(banned.is_empty(), "soya-proto pulls in {banned:?}");
}

/// Whether `file` (Rust source) has `unsafe` code: a block, fn, impl or
/// trait (comments and strings do not count).
fn has_unsafe(src: &str) -> bool {
    #[derive(Default)]
    struct V(bool);
    impl<'ast> Visit<'ast> for V {
        fn visit_expr_unsafe(&mut self, _: &'ast syn::ExprUnsafe) {
            self.0 = true;
        }
        fn visit_signature(&mut self, s: &'ast syn::Signature) {
            self.0 |= s.unsafety.is_some();
        }
        fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
            self.0 |= i.unsafety.is_some();
            syn::visit::visit_item_impl(self, i);
        }
        fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
            self.0 |= t.unsafety.is_some();
            syn::visit::visit_item_trait(self, t);
        }
    }
    let ast = syn::parse_file(src).expect("parses");
    let mut v = V::default();
    v.visit_file(&ast);
    v.0
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `unsafe` lives in the I/O crate (and the verbs FFI of soya-tools): the
/// protocol crate and the daemon forbid it, and have none.
#[test]
fn unsafe_code_is_in_the_io_crate_only() {
    let ws = workspace();
    for (root, dirs) in [
        ("proxy/proto/src/lib.rs", &["proxy/proto/src"][..]),
        ("proxy/src/lib.rs", &["proxy/src"][..]),
    ] {
        let lib = std::fs::read_to_string(ws.join(root)).expect("lib.rs");
        assert!(
            lib.contains("#![forbid(unsafe_code)]"),
            "{root} forbids unsafe code"
        );
        let mut files = Vec::new();
        for d in dirs {
            rust_files(&ws.join(d), &mut files);
        }
        for f in files {
            let src = std::fs::read_to_string(&f).expect("source");
            assert!(!has_unsafe(&src), "{}: unsafe code", f.display());
        }
    }
    let mut io = Vec::new();
    rust_files(&ws.join("proxy/io/src"), &mut io);
    assert!(
        io.iter()
            .any(|f| has_unsafe(&std::fs::read_to_string(f).expect("source"))),
        "the checker sees the I/O crate's unsafe code"
    );
}

#[test]
fn no_import_cycles_between_sibling_modules() {
    let ws = workspace();
    let mut found = Vec::new();
    for (krate, root) in CRATES {
        found.extend(sibling_cycles(krate, &ws.join(root)));
    }
    assert!(
        found.is_empty(),
        "sibling modules that import each other (move the shared item down a \
         layer, or make one a child of the other):\n{}",
        found.join("\n")
    );
}

/// The checker itself finds a cycle, through `use` groups, `super` and
/// paths in code, and leaves test code and children alone.
#[test]
fn the_checker_sees_a_cycle_made_every_way() {
    let dir = std::env::temp_dir().join(format!("soya-layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).expect("temp dir");
    let write = |p: &str, s: &str| std::fs::write(dir.join(p), s).expect("write");
    write("lib.rs", "mod a;\nmod c;\n");
    write("a/mod.rs", "mod x;\nmod y;\nmod z;\n");
    // x → y by a use group, y → z in code, z → x by crate path: one cycle.
    write("a/x.rs", "use super::{y::Y, z};\npub struct X;\n");
    write("a/y.rs", "pub struct Y;\nfn f() { super::z::g(); }\n");
    write("a/z.rs", "pub fn g() { let _ = crate::a::x::X; }\n");
    // c's test module imports a: not production, no edge; c itself: none.
    write(
        "c.rs",
        "#[cfg(test)]\nmod tests { use crate::a::x::X; }\npub fn c() {}\n",
    );
    let found = sibling_cycles("t", &dir.join("lib.rs"));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("t::a::{x, y, z}: "), "{found:?}");
    for edge in ["x → y", "y → z", "z → x"] {
        assert!(found[0].contains(edge), "{edge} missing: {found:?}");
    }
}
