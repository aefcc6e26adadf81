//! The house rules of the workspace, checked on the source tree
//! (`docs/ARCHITECTURE.md`):
//!
//! * no source file under `crates/` is longer than 1,000 lines;
//! * no command file (`crates/cli/src/commands/*.rs`, or the parts of a
//!   command in its own folder) is longer than 300 lines, and none imports
//!   another command (shared CLI code lives beside `commands/`, not in
//!   it);
//! * no two files of a crate import each other, directly or around a
//!   circle: every `use crate::…`, `use super::…` and qualified
//!   `crate::…`/`super::…` path outside test code is an arrow from its file
//!   to the file of the module it names, and the arrows of a crate form no
//!   cycle.
//!
//! The import graph is read from the text (module paths resolved to files
//! the way rustc maps `mod` declarations to files), so the check needs no
//! compiler and runs in a few milliseconds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest source file under `crates/`.
const MAX_FILE_LINES: usize = 1000;
/// Longest command file, help text included.
const MAX_COMMAND_LINES: usize = 300;

/// Files still over their limit, with the issue that brings them under it
/// (empty once the architecture step is done).
const OVER_LIMIT: &[&str] = &[];

/// Circles still standing, each named by one of its files.
const CIRCLES_LEFT: &[&str] = &["crates/chunkstore/src/store/mod.rs"];

/// Commands still importing another.
const COMMAND_IMPORTS_LEFT: &[&str] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root())
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.map(|e| e.expect("dir entry").path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn crates() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    v.sort();
    v
}

#[test]
fn no_source_file_is_over_its_limit() {
    let mut over = Vec::new();
    for c in crates() {
        let mut files = Vec::new();
        rust_files(&c, &mut files);
        for f in files {
            let name = rel(&f);
            let lines = std::fs::read_to_string(&f).expect("read").lines().count();
            let limit = if name.starts_with("crates/cli/src/commands/") {
                MAX_COMMAND_LINES
            } else {
                MAX_FILE_LINES
            };
            if lines > limit && !OVER_LIMIT.contains(&name.as_str()) {
                over.push(format!("{name}: {lines} lines (at most {limit})"));
            }
            if lines <= limit && OVER_LIMIT.contains(&name.as_str()) {
                over.push(format!(
                    "{name} is {lines} lines now: take it off OVER_LIMIT"
                ));
            }
        }
    }
    assert!(over.is_empty(), "{}", over.join("\n"));
}

/// The text of a file with comments and test modules removed.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    let mut block_comment = false;
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if block_comment {
            if t.contains("*/") {
                block_comment = false;
            }
            continue;
        }
        if t.starts_with("/*") {
            block_comment = !t.contains("*/");
            continue;
        }
        if t.starts_with("//") {
            continue;
        }
        // `#[cfg(test)]` on a module: the rest of an inline one is test
        // code (test modules come last), a `mod x;` is its own file.
        if t.starts_with("#[cfg(test)]") {
            if let Some(next) = lines.peek() {
                let n = next.trim_start();
                if (n.starts_with("mod ") || n.starts_with("pub mod ")) && n.ends_with('{') {
                    break;
                }
            }
        }
        out.push_str(strip_line_comment(line));
        out.push('\n');
    }
    out
}

/// `line` without a trailing `// comment` (not one inside a string).
fn strip_line_comment(line: &str) -> &str {
    let mut in_str = false;
    let b = line.as_bytes();
    let mut i = 0;
    while i + 1 < b.len() {
        match b[i] {
            b'\\' if in_str => i += 1,
            b'"' => in_str = !in_str,
            b'/' if !in_str && b[i + 1] == b'/' => return &line[..i],
            _ => {}
        }
        i += 1;
    }
    line
}

/// Expand `use` trees: `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], &base, out);
    } else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        out.push(join(prefix, path));
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}::{b}"),
    }
}

/// Every path a file names that starts with `crate`, `super` or `self`,
/// or with one of `children` (the file's own submodules, which 2018 paths
/// name bare: `http::Credentials` in `store/mod.rs`).
fn paths_in(code: &str, children: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    // `use` statements (possibly over several lines).
    let mut rest = code;
    while let Some(pos) = find_use(rest) {
        let after = &rest[pos..];
        let end = after.find(';').unwrap_or(after.len());
        let stmt = &after[after.find("use ").expect("use") + 4..end];
        expand(&stmt.replace(['\n', ' '], ""), "", &mut out);
        rest = &after[end.min(after.len())..];
    }
    // Qualified paths in code, and bare paths into the file's own
    // submodules.
    for start in ["crate::", "super::"] {
        out.extend(paths_from(code, start));
    }
    for child in children {
        out.extend(paths_from(code, &format!("{child}::")).map(|p| format!("self::{p}")));
    }
    out.retain(|p| p.starts_with("crate") || p.starts_with("super") || p.starts_with("self"));
    out
}

/// Every path in `code` that starts with `start` (not in the middle of
/// another path), without a trailing `::`.
fn paths_from<'a>(code: &'a str, start: &'a str) -> impl Iterator<Item = String> + 'a {
    code.match_indices(start).filter_map(move |(at, _)| {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            return None;
        }
        let p: String = code[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        Some(p.trim_end_matches(':').to_string())
    })
}

/// Where the next `use` statement of `s` starts.
fn find_use(s: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = s[from..].find("use ") {
        let at = from + i;
        let line_start = s[..at].rfind('\n').map_or(0, |n| n + 1);
        let lead = s[line_start..at].trim();
        if lead.is_empty() || lead == "pub" || lead.starts_with("pub(") {
            return Some(line_start);
        }
        from = at + 4;
    }
    None
}

/// One crate's modules: module path (`a::b`) to file, and back.
struct Modules {
    by_path: BTreeMap<Vec<String>, PathBuf>,
    of_file: BTreeMap<PathBuf, Vec<String>>,
    test_only: BTreeSet<PathBuf>,
}

fn modules(src: &Path) -> Modules {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut m = Modules {
        by_path: BTreeMap::new(),
        of_file: BTreeMap::new(),
        test_only: BTreeSet::new(),
    };
    for f in &files {
        let r = f.strip_prefix(src).expect("under src");
        let mut parts: Vec<String> = r
            .iter()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        if parts.first().is_some_and(|p| p == "bin" || p == "examples") {
            continue;
        }
        m.by_path.insert(parts.clone(), f.clone());
        m.of_file.insert(f.clone(), parts);
    }
    // Files declared as `#[cfg(test)] mod x;` are test code.
    for (f, path) in m.of_file.clone() {
        let text = std::fs::read_to_string(&f).expect("read");
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for w in lines.windows(2) {
            if w[0].starts_with("#[cfg(test)]") {
                let decl = w[1].trim_start_matches("pub ");
                if let Some(name) = decl.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
                    let mut p = path.clone();
                    p.push(name.to_string());
                    if let Some(tf) = m.by_path.get(&p) {
                        m.test_only.insert(tf.clone());
                    }
                }
            }
        }
    }
    m
}

/// The file a path names, seen from the module `here` of a file (`is_dir`:
/// the file is a `mod.rs`/`lib.rs`, whose `super` is one level up).
fn resolve(m: &Modules, here: &[String], path: &str) -> Option<PathBuf> {
    let mut parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    let mut base: Vec<String> = match parts.first().copied() {
        Some("crate") => {
            parts.remove(0);
            Vec::new()
        }
        Some("self") => {
            parts.remove(0);
            here.to_vec()
        }
        Some("super") => {
            let mut b = here.to_vec();
            while parts.first() == Some(&"super") {
                parts.remove(0);
                b.pop();
            }
            b
        }
        _ => return None,
    };
    // The longest prefix that is a module file.
    let mut best = m.by_path.get(&base).cloned();
    for p in parts {
        base.push(p.to_string());
        match m.by_path.get(&base) {
            Some(f) => best = Some(f.clone()),
            None => break,
        }
    }
    best
}

/// The import arrows between the non-test files of one crate.
fn arrows(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let m = modules(src);
    let mut g: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (f, here) in &m.of_file {
        if m.test_only.contains(f) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(f).expect("read"));
        let children: BTreeSet<String> = m
            .by_path
            .keys()
            .filter(|k| k.len() == here.len() + 1 && k.starts_with(here))
            .map(|k| k[here.len()].clone())
            .collect();
        let targets = g.entry(f.clone()).or_default();
        for p in paths_in(&code, &children) {
            if let Some(t) = resolve(&m, here, &p) {
                // A module's own root file (lib.rs) is where names are
                // re-exported, not a dependency of its children.
                if &t != f && !m.test_only.contains(&t) && !m.of_file[&t].is_empty() {
                    targets.insert(t);
                }
            }
        }
    }
    g
}

/// Strongly connected components of more than one file (Tarjan).
fn circles(g: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct T<'a> {
        g: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        next: usize,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a PathBuf) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[w].min(t.low[v]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.index[w].min(t.low[v]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_import_circles_inside_a_crate() {
    let mut bad = Vec::new();
    let mut left: BTreeSet<&str> = CIRCLES_LEFT.iter().copied().collect();
    for c in crates() {
        for comp in circles(&arrows(&c.join("src"))) {
            let names: Vec<String> = comp.iter().map(|f| rel(f)).collect();
            match names.iter().find(|n| left.contains(n.as_str())) {
                Some(n) => {
                    left.remove(n.as_str());
                }
                None => bad.push(format!("import circle: {}", names.join(" <-> "))),
            }
        }
    }
    for n in left {
        bad.push(format!(
            "no circle through {n} any more: take it off CIRCLES_LEFT"
        ));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The command a file of `commands/` belongs to: the file's stem, or the
/// folder a command's parts live in (`store/user.rs` is `store`).
fn command_of(dir: &Path, f: &Path) -> String {
    let r = f.strip_prefix(dir).expect("under commands/");
    let first = r.iter().next().expect("a file").to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

#[test]
fn no_command_imports_another() {
    let dir = root().join("crates/cli/src/commands");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let names: BTreeSet<String> = files.iter().map(|f| command_of(&dir, f)).collect();
    let mut bad = Vec::new();
    for f in &files {
        let me = command_of(&dir, f);
        if me == "mod" {
            continue;
        }
        // A command's own parts live in its folder: `super::x` there is a
        // part of the same command, `super::super::x` another command.
        let in_folder = f.parent() != Some(dir.as_path());
        let code = code_of(&std::fs::read_to_string(f).expect("read"));
        let mut used = BTreeSet::new();
        for p in paths_in(&code, &BTreeSet::new()) {
            let parts: Vec<&str> = p.split("::").collect();
            let other = match (in_folder, parts.as_slice()) {
                (false, ["super", x, ..]) => Some(*x),
                (true, ["super", "super", x, ..]) => Some(*x),
                (_, ["crate", "commands", x, ..]) => Some(*x),
                _ => None,
            };
            if let Some(x) = other.filter(|x| names.contains(*x) && *x != me) {
                used.insert(x.to_string());
            }
        }
        let name = rel(f);
        if !used.is_empty() && !COMMAND_IMPORTS_LEFT.contains(&name.as_str()) {
            bad.push(format!("{name} imports the command(s) {used:?}"));
        }
        if used.is_empty() && COMMAND_IMPORTS_LEFT.contains(&name.as_str()) {
            bad.push(format!(
                "{name} imports no other command now: take it off COMMAND_IMPORTS_LEFT"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_checker_sees_a_circle_and_a_grouped_import() {
    let d = tempfile::tempdir().expect("tempdir");
    let src = d.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").expect("write");
    std::fs::write(
        src.join("a.rs"),
        "use crate::{b::Thing, c};\n// use crate::c::Never;\npub fn f() {}\n",
    )
    .expect("write");
    std::fs::write(
        src.join("b.rs"),
        "pub struct Thing;\nfn g() { super::a::f() }\n#[cfg(test)]\nmod tests {\n    use crate::c::X;\n}\n",
    )
    .expect("write");
    std::fs::write(src.join("c.rs"), "pub struct X;\n").expect("write");
    let g = arrows(src);
    let comps = circles(&g);
    assert_eq!(comps.len(), 1, "{g:?}");
    assert_eq!(comps[0], vec![src.join("a.rs"), src.join("b.rs")]);
    assert!(g[&src.join("a.rs")].contains(&src.join("c.rs")));
    assert!(
        !g[&src.join("b.rs")].contains(&src.join("c.rs")),
        "test code"
    );
}
