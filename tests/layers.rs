//! The floor rule of ARCHITECTURE.md, checked on the source: every `crate::…`
//! and `super::…` path in `src/` (in `use` lines, `use crate::{a, b::c}`
//! groups and inline paths alike) must point to the importer's own room or a
//! floor below it, never up and never sideways between the rooms of floor 2.
//!
//! Test code is checked too (inline `#[cfg(test)]` modules and files like
//! `pressure/tests.rs`): cargo compiles it into the same crate, and a unit
//! test that needs a room above its own is testing something that lives
//! upstairs (it belongs there or in `tests/`).
//!
//! No dependencies beyond std: a small tokenizer blanks comments and
//! literals, then follows paths token by token.
//!
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// Each room of `src/` (its first path component, `.rs` dropped) and its
/// floor. Keep in step with ARCHITECTURE.md.
const ROOMS: &[(&str, u8)] = &[
    ("node", 0),
    ("metrics", 0),
    ("observability", 0),
    ("qos", 1),
    ("evict", 1),
    ("keeper", 2),
    ("pressure", 2),
    ("guard", 2),
    ("nri", 2),
    ("kube", 2),
    ("config", 3),
    ("audit", 3),
    ("explain", 3),
    ("table", 0),
    ("app", TOP),
    ("lib", TOP),
    ("main", TOP),
];
/// `main.rs`, the app wiring it calls and `lib.rs` (which only declares the
/// rooms) may use anything.
const TOP: u8 = 4;
/// The one floor-0 room the infrastructure rooms (`metrics`,
/// `observability`, `table`) may import.
const GROUND: &str = "node";

fn floor(room: &str) -> Option<u8> {
    ROOMS.iter().find(|(r, _)| *r == room).map(|&(_, f)| f)
}

// ---------------------------------------------------------------- the rule

#[derive(Debug, PartialEq)]
enum Verdict {
    Allowed,
    Up,
    Sideways,
    UnknownRoom,
}

/// May a file in room `from` import room `to`? Down is always fine; on
/// floors 2 and 3 no room imports another; on floor 0 only `node` may be
/// imported (the ground under `metrics`, `observability` and `table`).
fn verdict(from: &str, to: &str) -> Verdict {
    let (Some(f), Some(t)) = (floor(from), floor(to)) else {
        return Verdict::UnknownRoom;
    };
    if from == to || f == TOP || t < f {
        Verdict::Allowed
    } else if t > f {
        Verdict::Up
    } else if f == 2 || f == 3 || (f == 0 && to != GROUND) {
        Verdict::Sideways
    } else {
        Verdict::Allowed
    }
}

// ---------------------------------------------------------------- the scanner

/// `code` with comments, string, byte-string, raw-string and char literals
/// replaced by spaces (newlines kept, so line numbers stay right).
fn strip(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let prev_ident = i > 0 && ident(b[i - 1]);
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = code[i..].find('\n').map_or(b.len(), |n| i + n);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (mut depth, mut j) = (1, i + 2);
                while j < b.len() && depth > 0 {
                    if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                        depth += 1;
                        j += 1;
                    } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                        depth -= 1;
                        j += 1;
                    }
                    j += 1;
                }
                blank(&mut out, i, j);
                i = j;
            }
            // r"…", r#"…"#, br"…" (the `r` must start a token)
            b'r' if !prev_ident || (i > 0 && b[i - 1] == b'b' && (i < 2 || !ident(b[i - 2]))) => {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) == Some(&b'"') {
                    let close = format!("\"{}", "#".repeat(hashes));
                    let body = i + 2 + hashes;
                    let end = code[body..]
                        .find(&close)
                        .map_or(b.len(), |n| body + n + close.len());
                    blank(&mut out, i, end);
                    i = end;
                } else {
                    i += 1;
                }
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i, j + 1);
                i = j + 1;
            }
            // 'x' and '\n' are chars; 'a (no closing quote after one char) is a lifetime
            b'\'' => {
                let end = if b.get(i + 1) == Some(&b'\\') {
                    code[i + 2..].find('\'').map(|n| i + 2 + n + 1)
                } else {
                    let ch = code[i + 1..].chars().next().map_or(0, char::len_utf8);
                    (b.get(i + 1 + ch) == Some(&b'\'')).then_some(i + 2 + ch)
                };
                match end {
                    Some(end) => {
                        blank(&mut out, i, end);
                        i = end;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

fn tokens(stripped: &str) -> Vec<(Tok, usize)> {
    let mut toks = Vec::new();
    let mut chars = stripped.chars().peekable();
    let mut line = 1;
    while let Some(c) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let mut word = String::from(c);
            while let Some(&n) = chars.peek().filter(|n| n.is_alphanumeric() || **n == '_') {
                word.push(n);
                chars.next();
            }
            toks.push((Tok::Ident(word), line));
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            toks.push((Tok::PathSep, line));
        } else if !c.is_whitespace() {
            toks.push((Tok::Punct(c), line));
        }
    }
    toks
}

fn is_ident(toks: &[(Tok, usize)], i: usize, word: &str) -> bool {
    matches!(toks.get(i), Some((Tok::Ident(w), _)) if w == word)
}

fn is_punct(toks: &[(Tok, usize)], i: usize, c: char) -> bool {
    matches!(toks.get(i), Some((Tok::Punct(p), _)) if *p == c)
}

/// One use-tree (or inline path) from `i`: `a::b`, `a::{b, c::{d, e}}`,
/// `a::*`, `a as b`. Returns every leaf path and the index after the tree.
fn use_tree(toks: &[(Tok, usize)], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut leaves = Vec::new();
    loop {
        match toks.get(i) {
            Some((Tok::Ident(w), _)) => {
                prefix.push(w.clone());
                i += 1;
            }
            Some((Tok::Punct('*'), _)) => {
                prefix.push("*".into());
                i += 1;
                break;
            }
            Some((Tok::Punct('{'), _)) => {
                i += 1;
                while i < toks.len() && !is_punct(toks, i, '}') {
                    let (subs, next) = use_tree(toks, i);
                    leaves.extend(subs.into_iter().map(|s| [prefix.clone(), s].concat()));
                    i = if next > i { next } else { i + 1 };
                    if is_punct(toks, i, ',') {
                        i += 1;
                    }
                }
                return (leaves, i + 1);
            }
            _ => break,
        }
        if matches!(toks.get(i), Some((Tok::PathSep, _))) {
            i += 1;
        } else {
            break;
        }
    }
    if is_ident(toks, i, "as") {
        i += 2;
    }
    if !prefix.is_empty() {
        leaves.push(prefix);
    }
    (leaves, i)
}

/// A path found in a file: its line and the absolute module path it names
/// (`crate` and `super` resolved; the first element is the room).
#[derive(Debug, PartialEq)]
struct Import {
    line: usize,
    path: Vec<String>,
}

/// Every `crate::…`, `$crate::…` and `super::…` path in `code`, a file whose
/// module path is `module` (`["nri", "plugin"]` for `src/nri/plugin.rs`).
/// `super` is resolved through inline `mod x { … }` blocks; a path that
/// climbs above the crate root is dropped (rustc rejects it anyway).
fn imports(code: &str, module: &[&str]) -> Vec<Import> {
    let toks = tokens(&strip(code));
    let mut found = Vec::new();
    let mut inline_mods: Vec<(String, usize)> = Vec::new();
    let mut pending_mod = None;
    let mut depth = 0;
    let mut i = 0;
    while i < toks.len() {
        // `a::crate` is not a path start; any word before `crate` is a keyword
        let starts_path = i == 0 || toks[i - 1].0 != Tok::PathSep;
        match &toks[i].0 {
            Tok::Ident(w) if w == "mod" => {
                if let (Some((Tok::Ident(name), _)), true) =
                    (toks.get(i + 1), is_punct(&toks, i + 2, '{'))
                {
                    pending_mod = Some(name.clone());
                }
            }
            Tok::Punct('{') => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    inline_mods.push((name, depth));
                }
            }
            Tok::Punct('}') => {
                if inline_mods.last().is_some_and(|(_, d)| *d == depth) {
                    inline_mods.pop();
                }
                depth -= 1;
            }
            Tok::Ident(w)
                if (w == "crate" || w == "super")
                    && starts_path
                    && matches!(toks.get(i + 1), Some((Tok::PathSep, _))) =>
            {
                let line = toks[i].1;
                let here: Vec<String> = module
                    .iter()
                    .map(|s| s.to_string())
                    .chain(inline_mods.iter().map(|(n, _)| n.clone()))
                    .collect();
                let (leaves, next) = use_tree(&toks, i);
                for leaf in leaves {
                    if let Some(path) = resolve(&here, &leaf) {
                        found.push(Import { line, path });
                    }
                }
                // `{`/`}` inside a use group are balanced, so skipping them keeps `depth`
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

fn resolve(here: &[String], path: &[String]) -> Option<Vec<String>> {
    if path.first().map(String::as_str) == Some("crate") {
        return Some(path[1..].to_vec());
    }
    let ups = path.iter().take_while(|s| *s == "super").count();
    let base = here.len().checked_sub(ups)?;
    Some([&here[..base], &path[ups..]].concat())
}

// ---------------------------------------------------------------- the tree

struct SourceFile {
    /// Relative to `src/`, with `/` separators.
    rel: String,
    module: Vec<String>,
    code: String,
}

impl SourceFile {
    fn room(&self) -> &str {
        match self.rel.as_str() {
            "lib.rs" => "lib",
            "main.rs" => "main",
            _ => self.module.first().map_or("lib", String::as_str),
        }
    }
}

fn module_of(rel: &str) -> Vec<String> {
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn source_tree() -> Vec<SourceFile> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths
        .iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            SourceFile {
                module: module_of(&rel),
                code: fs::read_to_string(p)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", p.display())),
                rel,
            }
        })
        .collect()
}

struct Violation {
    file: String,
    line: usize,
    from: String,
    path: Vec<String>,
    verdict: Verdict,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            return write!(
                f,
                "src/{}: room {:?} is not in the floor table (ROOMS)",
                self.file, self.from
            );
        }
        let to = self.path.first().map_or("(crate root)", String::as_str);
        let floor_of = |r: &str| floor(r).map_or("?".to_string(), |n| n.to_string());
        let why = match self.verdict {
            Verdict::Up => "points UP",
            Verdict::Sideways => "points SIDEWAYS",
            Verdict::UnknownRoom => "names a room missing from the floor table",
            Verdict::Allowed => "is allowed",
        };
        write!(
            f,
            "src/{}:{}: {} (floor {}) -> crate::{} (floor {}) {}",
            self.file,
            self.line,
            self.from,
            floor_of(&self.from),
            self.path.join("::"),
            floor_of(to),
            why
        )
    }
}

fn violations(files: &[SourceFile]) -> Vec<Violation> {
    let mut out = Vec::new();
    for f in files {
        let from = f.room();
        if floor(from).is_none() {
            out.push(Violation {
                file: f.rel.clone(),
                line: 1,
                from: from.to_string(),
                path: Vec::new(),
                verdict: Verdict::UnknownRoom,
            });
            continue;
        }
        let module: Vec<&str> = f.module.iter().map(String::as_str).collect();
        for imp in imports(&f.code, &module) {
            let to = imp.path.first().map_or("lib", String::as_str);
            let verdict = verdict(from, to);
            let seen = out
                .iter()
                .any(|v: &Violation| v.file == f.rel && v.line == imp.line && v.path == imp.path);
            if verdict != Verdict::Allowed && !seen {
                out.push(Violation {
                    file: f.rel.clone(),
                    line: imp.line,
                    from: from.to_string(),
                    path: imp.path,
                    verdict,
                });
            }
        }
    }
    out
}

// ---------------------------------------------------------------- the checks

#[test]
fn imports_only_point_down() {
    let found = violations(&source_tree());
    let list: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert!(
        found.is_empty(),
        "{} import(s) break the floor rule (ARCHITECTURE.md; the table is ROOMS in tests/layers.rs):\n  {}\n",
        found.len(),
        list.join("\n  ")
    );
}

#[test]
fn every_room_on_disk_is_in_the_floor_table() {
    // cheap and always on: a new folder must be given a floor
    let missing: Vec<String> = source_tree()
        .iter()
        .filter(|f| floor(f.room()).is_none())
        .map(|f| format!("src/{} (room {:?})", f.rel, f.room()))
        .collect();
    assert!(
        missing.is_empty(),
        "add these rooms to ROOMS and ARCHITECTURE.md: {missing:?}"
    );
}

// ---------------------------------------------------------------- the scanner's own tests

fn paths(code: &str, module: &[&str]) -> Vec<String> {
    imports(code, module)
        .into_iter()
        .map(|i| format!("{}:{}", i.line, i.path.join("::")))
        .collect()
}

#[test]
fn use_lines_groups_and_nested_groups() {
    let code = "use crate::qos::Class;\nuse crate::{node::layout, keeper::{plan::Plan, keeper as k}, metrics::*};\n";
    assert_eq!(
        paths(code, &["nri", "plugin"]),
        [
            "1:qos::Class",
            "2:node::layout",
            "2:keeper::plan::Plan",
            "2:keeper::keeper",
            "2:metrics::*"
        ]
    );
}

#[test]
fn inline_paths_and_macro_paths() {
    let code = "fn f() -> crate::node::Facts {\n    let x = crate::keeper::plan::PAGE_SIZE;\n    $crate::metrics::inc!();\n    Vec::<crate::qos::Q>::new()\n}";
    assert_eq!(
        paths(code, &["pressure"]),
        [
            "1:node::Facts",
            "2:keeper::plan::PAGE_SIZE",
            "3:metrics::inc",
            "4:qos::Q"
        ]
    );
}

#[test]
fn comments_strings_and_visibility_are_not_imports() {
    let code = r##"
// use crate::pressure::Monitor;
/* crate::nri::x /* nested crate::kube */ still comment */
/// doc: crate::audit::Report
pub(crate) fn f(c: char) -> &'static str {
    let _ = ('"', '\'', b'x');
    let _ = r#"crate::config "quoted" "#;
    "crate::app::run \" still a string"
}
pub(in crate::qos) struct S;
"##;
    assert_eq!(paths(code, &["keeper", "plan"]), ["10:qos"]);
}

#[test]
fn super_is_resolved_through_files_and_inline_modules() {
    let code = "use super::layout;\nuse super::super::nri::Session;\nmod tests {\n    use super::super::Candidate;\n    mod deeper { use super::super::super::super::kube::Client; }\n}\nuse super::super::super::too_far;\n";
    assert_eq!(
        paths(code, &["pressure", "rank"]),
        [
            "1:pressure::layout",
            "2:nri::Session",
            "4:pressure::Candidate",
            "5:kube::Client"
        ]
    );
    // from a mod.rs, one `super` is already the crate root
    assert_eq!(
        paths("use super::node::Facts;", &["qos"]),
        ["1:node::Facts"]
    );
}

#[test]
fn the_rule() {
    use Verdict::*;
    assert_eq!(verdict("nri", "qos"), Allowed);
    assert_eq!(verdict("nri", "nri"), Allowed);
    assert_eq!(verdict("qos", "keeper"), Up);
    assert_eq!(verdict("nri", "config"), Up);
    assert_eq!(verdict("node", "metrics"), Sideways);
    assert_eq!(verdict("metrics", "node"), Allowed);
    assert_eq!(verdict("metrics", "kube"), Up);
    assert_eq!(verdict("nri", "pressure"), Sideways);
    assert_eq!(verdict("pressure", "keeper"), Sideways);
    assert_eq!(verdict("audit", "explain"), Sideways);
    assert_eq!(verdict("explain", "table"), Allowed);
    assert_eq!(verdict("app", "config"), Allowed);
    assert_eq!(verdict("main", "app"), Allowed);
    assert_eq!(verdict("weird", "node"), UnknownRoom);
    assert_eq!(verdict("nri", "weird"), UnknownRoom);
}

#[test]
fn module_paths_of_files() {
    assert_eq!(module_of("nri/mod.rs"), ["nri"]);
    assert_eq!(module_of("nri/plugin.rs"), ["nri", "plugin"]);
    assert_eq!(module_of("lib.rs"), Vec::<String>::new());
}

#[test]
fn violations_read_clearly() {
    let v = Violation {
        file: "qos/policy.rs".into(),
        line: 7,
        from: "qos".into(),
        path: vec!["keeper".into(), "layout".into()],
        verdict: Verdict::Up,
    };
    assert_eq!(
        v.to_string(),
        "src/qos/policy.rs:7: qos (floor 1) -> crate::keeper::layout (floor 2) points UP"
    );
    let stray = Violation {
        file: "util.rs".into(),
        line: 1,
        from: "util".into(),
        path: Vec::new(),
        verdict: Verdict::UnknownRoom,
    };
    assert_eq!(
        stray.to_string(),
        "src/util.rs: room \"util\" is not in the floor table (ROOMS)"
    );
}
