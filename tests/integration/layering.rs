//! The layering of every crate's modules: no two sibling modules of a crate,
//! at any depth, import each other, directly or around a circle (Cargo
//! enforces the same between crates), and each crate's top-level modules
//! keep the order its lib.rs claims (a paragraph starting "Layering inside
//! the crate", each module using only those listed before it).
//!
//! Each file is a module path (`src/model/kda.rs` is `model::kda`). Every
//! path it names (`crate::a::b`, `super::b`, `super::super::c::d`,
//! `self::x`, and the items of `{..}` groups after them) is resolved
//! against it; a path from inside sibling `a` into sibling `b` of the same
//! parent is an edge `a -> b` of that parent's graph. A module and its own
//! parent or children are not siblings (mod.rs declaring its children and a
//! child using its parent's helpers is the normal shape). Test code is left
//! out: files named `tests*.rs` and each file's trailing `#[cfg(test)]`
//! module. Names in comments count: a doc comment that points at a module
//! is a dependency of the reader's understanding too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The crates' source roots, named for the messages.
const CRATES: &[(&str, &str)] = &[
    ("waste-kernels", "host/kernels/src"),
    ("waste-engine", "host/engine/src"),
    ("waste-host", "host/runtime/src"),
    ("waste-cli", "cli/src"),
    ("waste-server", "server/src"),
    ("waste-ffi", "ffi/src"),
    ("waste-guest", "guest/src"),
];

type ModPath = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module a file is: `a.rs` and `a/mod.rs` are `a`, `a/b.rs` is `a::b`;
/// the crate root and binaries are `[]`.
fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    if parts.first().is_some_and(|p| p == "bin") {
        return Vec::new();
    }
    match last.trim_end_matches(".rs") {
        "mod" => {}
        "lib" | "main" if parts.is_empty() => {}
        name => parts.push(name.to_string()),
    }
    parts
}

/// The code of a file without its inline test module (by convention the
/// last item of a file, `#[cfg(test)] mod tests { .. }`); a declaration
/// `#[cfg(test)] mod tests;` is kept (its file is skipped by name).
fn non_test_code(text: &str) -> &str {
    const MARK: &str = "#[cfg(test)]\nmod ";
    let mut from = 0;
    while let Some(at) = text[from..].find(MARK) {
        let at = from + at;
        let (_, after) = ident_at(&text[at + MARK.len()..]);
        if after.trim_start().starts_with('{') {
            return &text[..at];
        }
        from = at + MARK.len();
    }
    text
}

fn ident_at(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// The module-like part of a path after its prefix: lowercase segments
/// (`a::b::Item` gives `[a, b]`), or, for a `{..}` group, each item's.
fn tails(rest: &str) -> Vec<ModPath> {
    if let Some(group) = rest.strip_prefix('{') {
        let end = group.find('}').unwrap_or(group.len());
        return group[..end].split(',').flat_map(|item| tails(item.trim())).collect();
    }
    let mut path = Vec::new();
    let mut s = rest;
    loop {
        let (id, after) = ident_at(s);
        if id.is_empty() || !id.starts_with(|c: char| c.is_ascii_lowercase()) {
            break;
        }
        path.push(id.to_string());
        match after.strip_prefix("::") {
            Some(next) if next.starts_with('{') => {
                let base = path.clone();
                return tails(next)
                    .into_iter()
                    .map(|t| base.iter().cloned().chain(t).collect())
                    .chain(std::iter::once(base.clone()))
                    .collect();
            }
            Some(next) => s = next,
            None => break,
        }
    }
    vec![path]
}

/// Every module path `code` (in module `at`) names, resolved to absolute.
fn named_paths(code: &str, at: &ModPath) -> Vec<ModPath> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let starts_word =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
        let rest = &code[i..];
        let base: Option<(ModPath, &str)> = if !starts_word {
            None
        } else if let Some(r) = rest.strip_prefix("crate::") {
            Some((Vec::new(), r))
        } else if let Some(r) = rest.strip_prefix("self::") {
            Some((at.clone(), r))
        } else if rest.starts_with("super::") {
            let mut r = rest;
            let mut up = 0;
            while let Some(next) = r.strip_prefix("super::") {
                up += 1;
                r = next;
            }
            Some((at[..at.len().saturating_sub(up)].to_vec(), r))
        } else {
            None
        };
        match base {
            Some((base, r)) => {
                for t in tails(r) {
                    out.push(base.iter().cloned().chain(t).collect());
                }
                i = code.len() - r.len();
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// Per parent module, the graph of its children: child -> the siblings
/// whose code it names.
fn sibling_graphs(src: &Path) -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<ModPath> = files.iter().map(|f| module_of(src, f)).collect();
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for m in &modules {
        if let Some((name, parent)) = m.split_last() {
            graphs.entry(parent.to_vec()).or_default().entry(name.clone()).or_default();
        }
    }
    for f in &files {
        if f.file_name().is_some_and(|n| n.to_string_lossy().starts_with("tests")) {
            continue;
        }
        let at = module_of(src, f);
        let text = std::fs::read_to_string(f).unwrap();
        for target in named_paths(non_test_code(&text), &at) {
            let common = at.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common >= at.len() || common >= target.len() {
                continue; // the same module, an ancestor or a descendant
            }
            let parent = at[..common].to_vec();
            let (from, to) = (&at[common], &target[common]);
            let mut sibling = parent.clone();
            sibling.push(to.clone());
            if modules.contains(&sibling) {
                graphs.entry(parent).or_default().entry(from.clone()).or_default().insert(to.clone());
            }
        }
    }
    graphs
}

/// A cycle through the graph, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let start = path.iter().position(|p| p == m).unwrap();
                    let mut cycle = path[start..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, g, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Every circle of every graph: after each one found, its closing edge is
/// taken out and the search runs again, so a second circle is not hidden
/// behind the first (one was, and cost a CI run to find).
fn circles(src: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (parent, mut g) in sibling_graphs(src) {
        let at = if parent.is_empty() { "crate".to_string() } else { format!("crate::{}", parent.join("::")) };
        while let Some(c) = find_cycle(&g) {
            out.push(format!("under {at}: {}", c.join(" -> ")));
            let (from, to) = (&c[c.len() - 2], &c[c.len() - 1]);
            if let Some(edges) = g.get_mut(from) {
                edges.remove(to);
            }
        }
    }
    out
}

/// The top-level order `lib` claims: the backticked names of its doc
/// paragraph that starts with `Layering inside the crate`.
fn claimed_order(lib: &str) -> Option<Vec<String>> {
    let docs: Vec<&str> = lib.lines().filter_map(|l| l.strip_prefix("//!")).map(str::trim).collect();
    let start = docs.iter().position(|l| l.starts_with("Layering inside the crate"))?;
    let paragraph: String = docs[start..].iter().take_while(|l| !l.is_empty()).copied().collect::<Vec<_>>().join(" ");
    Some(paragraph.split('`').skip(1).step_by(2).map(str::to_string).collect())
}

/// Where the top-level modules of `src` break the order its lib.rs
/// claims: a module missing from the claim, a claimed name that is no
/// module, or a module that names one listed after it.
fn order_violations(src: &Path) -> Vec<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let Some(order) = claimed_order(&lib) else {
        return vec!["lib.rs claims no order (a doc paragraph starting \"Layering inside the crate\")".into()];
    };
    let graphs = sibling_graphs(src);
    let top = graphs.get(&Vec::new()).cloned().unwrap_or_default();
    let mut out = Vec::new();
    for module in top.keys().filter(|m| !order.contains(m)) {
        out.push(format!("`{module}` is not in the claimed order"));
    }
    for name in order.iter().filter(|n| !top.contains_key(*n)) {
        out.push(format!("`{name}` is claimed but is no module"));
    }
    let at = |m: &str| order.iter().position(|n| n == m);
    for (from, uses) in &top {
        for to in uses {
            if let (Some(f), Some(t)) = (at(from), at(to)) {
                if t > f {
                    out.push(format!("`{from}` uses `{to}`, which is listed after it"));
                }
            }
        }
    }
    out
}

#[test]
fn every_crate_keeps_the_module_order_its_lib_rs_claims() {
    let mut found = Vec::new();
    for (name, dir) in CRATES {
        found.extend(order_violations(&root().join(dir)).into_iter().map(|v| format!("{name}: {v}")));
    }
    assert!(found.is_empty(), "module order:\n{}", found.join("\n"));
}

/// The order check itself: a use of a later module, an unlisted module and
/// a listed name that is no module are each reported; test code is not.
#[test]
fn the_order_check_sees_a_use_of_a_later_module() {
    let dir = crate::common::TempDir::new("layering-order");
    let src = dir.path();
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).unwrap();
    write(
        "lib.rs",
        "//! Layering inside the crate: `a`, `b`,\n//! `c`.\n//!\n//! `zz` is not claimed.\nmod a; mod b; mod c;",
    );
    write("a.rs", "fn f() {}\n#[cfg(test)]\nmod tests { use crate::c::X; }");
    write("b.rs", "use crate::a::X;");
    write("c.rs", "use crate::b::Y;");
    assert_eq!(order_violations(src), Vec::<String>::new());
    write("a.rs", "use crate::c::X;");
    write("d.rs", "fn d() {}");
    write("lib.rs", "//! Layering inside the crate: `a`, `b`, `c`, `e`.\nmod a; mod b; mod c; mod d;");
    let found = order_violations(src);
    assert!(found.contains(&"`a` uses `c`, which is listed after it".to_string()), "{found:?}");
    assert!(found.contains(&"`d` is not in the claimed order".to_string()), "{found:?}");
    assert!(found.contains(&"`e` is claimed but is no module".to_string()), "{found:?}");
    assert_eq!(found.len(), 3, "{found:?}");
}

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    let mut found = Vec::new();
    for (name, dir) in CRATES {
        let src = root().join(dir);
        assert!(sibling_graphs(&src).get(&Vec::new()).is_some_and(|g| g.len() > 1), "{name}: no modules under {dir}");
        found.extend(circles(&src).into_iter().map(|c| format!("{name}: {c}")));
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The checker itself: a circle of top-level modules, a second one among
/// the same modules, one among the submodules of a module, `super::` chains, groups, and test code left out.
#[test]
fn the_layering_check_sees_circles_at_every_depth() {
    let dir = crate::common::TempDir::new("layering");
    let src = dir.path();
    let write = |name: &str, text: &str| {
        let p = src.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "mod a; mod b; mod c; mod d; mod e;");
    write("a.rs", "use crate::b::X;");
    // A second circle among the same siblings, reported beside the first.
    write("d.rs", "use crate::e::X;");
    write("e.rs", "use crate::d::Y;");
    write("b/mod.rs", "mod x; mod y;");
    // `super::x` here is `b::x` (a sibling), `super::super::c` is `crate::c`.
    write("b/y.rs", "use super::x::Z;\nuse super::super::c::Y;");
    write("b/x.rs", "use crate::b::{y::W, Q};");
    write("c.rs", "#[cfg(test)]\nmod more_tests;\nfn f() { crate::a::g() }\n#[cfg(test)]\nmod tests { use crate::b; }");
    let found = circles(src);
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(found.iter().filter(|c| c.starts_with("under crate: ")).count(), 2, "{found:?}");
    assert!(found.iter().any(|c| c.starts_with("under crate::b: ")), "{found:?}");
    write("b/x.rs", "fn z() {}");
    write("e.rs", "fn e() {}");
    write("c.rs", "fn f() {}\n#[cfg(test)]\nmod tests { use crate::a; }");
    assert_eq!(circles(src), Vec::<String>::new());
}
