//! The repository speaks of the product as it is, never of how it was made:
//! documents, comments, scripts and configs must not narrate development
//! (work sessions, engineers, leads, reviewers, this project's own issue
//! numbers, dated runs, "used to", "until the eighth"). Upstream references
//! such as containerd#10085 or KEP-2570 are facts and pass. Std only.
//!
//! A phrase that is a protocol term rather than narration goes into
//! `ALLOWED` (matched case-insensitively and blanked before the rules run).

use std::path::{Path, PathBuf};

/// Files and folders scanned, relative to the repository root.
const ROOTS: &[&str] = &[
    "README.md",
    "ARCHITECTURE.md",
    "Cargo.toml",
    "build.rs",
    "deny.toml",
    "clippy.toml",
    "rust-toolchain.toml",
    ".gitignore",
    ".ci",
    "docs",
    "src",
    "tests",
    "benches",
    "scripts",
    "config",
    "examples",
    "proto",
];

/// Never scanned: upstream downloads and the VM harness's output (the
/// directories .gitignore names), and this file, whose word list would
/// match itself.
const SKIPPED: &[&str] = &[
    "tests/e2e/cache",
    "tests/e2e/work",
    "tests/upstream/cache",
    "tests/process_words.rs",
];

/// The VM harness's per-run output directories (`tests/e2e/work-*`).
const SKIPPED_PREFIX: &str = "tests/e2e/work-";

/// Protocol and product terms that contain a flagged word.
const ALLOWED: &[&str] = &["nri session", "ttrpc session", "plugin session"];

const ORDINALS: &[&str] = &[
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
    "eleventh", "twelfth",
];

/// Words before "used to" that make it the passive ("is used to write").
const PASSIVE: &[&str] = &[
    "is", "are", "was", "were", "be", "been", "being", "get", "gets", "got", "not", "also", "only",
    "never", "then", "now", "commonly", "often",
];

/// One flagged phrase on one line.
#[derive(Debug, PartialEq)]
struct Finding {
    line: usize,
    what: &'static str,
}

/// Every flagged phrase of `text`, line by line.
fn findings(text: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let mut line = raw.to_lowercase();
        for allowed in ALLOWED {
            line = line.replace(allowed, &" ".repeat(allowed.len()));
        }
        for what in line_findings(&line) {
            out.push(Finding { line: i + 1, what });
        }
    }
    out
}

/// Lower-case words of a line. A hyphen joins (`--session-every` is one
/// word), an apostrophe splits ("lead's" → lead, s).
fn words(line: &str) -> Vec<&str> {
    line.split(|c: char| !c.is_alphanumeric() && c != '-')
        .map(|w| w.trim_matches('-'))
        .filter(|w| !w.is_empty())
        .collect()
}

fn is_ordinal(w: &str) -> bool {
    if ORDINALS.contains(&w) {
        return true;
    }
    let digits = w.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &w[digits.len()..];
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && matches!(suffix, "st" | "nd" | "rd" | "th")
}

fn is_number(w: &str) -> bool {
    !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit())
}

fn line_findings(line: &str) -> Vec<&'static str> {
    let w = words(line);
    let at = |i: usize| w.get(i).copied().unwrap_or("");
    let mut out = Vec::new();
    for i in 0..w.len() {
        let (a, b, c) = (at(i), at(i + 1), at(i + 2));
        if is_ordinal(a) && matches!(b, "session" | "sessions") {
            out.push("a numbered work session (\"the third session\")");
        }
        if matches!(a, "engineer" | "engineers") {
            out.push("engineers");
        }
        if matches!(a, "reviewer" | "reviewers") {
            out.push("reviewers");
        }
        if (a == "the" && b == "lead") || (a == "lead" && b == "s") {
            out.push("the lead");
        }
        if matches!(a, "issue" | "issues") && is_number(b) {
            out.push("an issue number of this project (\"issue 17\")");
        }
        if a == "issue" && b == "s" {
            out.push("an issue's wishes");
        }
        if matches!(a, "morning" | "evening") {
            out.push("a time of day of a run");
        }
        if a == "used" && b == "to" && !PASSIVE.contains(&at(i.wrapping_sub(1))) {
            out.push("\"used to\"");
        }
        if a == "until" && (is_ordinal(b) || (b == "the" && is_ordinal(c))) {
            out.push("\"until the eighth\"");
        }
        if (a == "earlier" && matches!(b, "run" | "runs")) || (a == "previous" && b == "runs") {
            out.push("earlier runs");
        }
        if a == "as" && b == "it" && c == "always" {
            out.push("\"as it always did\"");
        }
        if a == "fixed" && b == "since" {
            out.push("\"fixed since\"");
        }
        if a == "tried" && ((b == "not" && c == "kept") || (b == "and" && c == "not")) {
            out.push("\"tried, not kept\"");
        }
    }
    if has_numbered_session(line) {
        out.push("a numbered work session (\"session 3\")");
    }
    if has_own_issue_ref(line) {
        out.push("an issue number of this project (\"#17\")");
    }
    if has_date(line) && !line.contains("rustc") {
        out.push("a dated run (YYYY-MM-DD)");
    }
    out
}

/// "session 3": the word, spaces, a number (not `sessions += 1`).
fn has_numbered_session(line: &str) -> bool {
    line.match_indices("session").any(|(i, _)| {
        let before = line[..i].chars().next_back();
        if before.is_some_and(char::is_alphanumeric) {
            return false;
        }
        let rest = line[i + "session".len()..].trim_start_matches('s');
        let digits = rest.trim_start_matches(' ');
        digits.len() < rest.len() && digits.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// `#17` on its own: not `owner/repo#17` (upstream), not `{:#04x}`.
fn has_own_issue_ref(line: &str) -> bool {
    let b = line.as_bytes();
    (0..b.len()).any(|i| {
        b[i] == b'#'
            && b.get(i + 1).is_some_and(u8::is_ascii_digit)
            && (i == 0 || matches!(b[i - 1], b' ' | b'(' | b'[' | b',' | b'\t'))
    })
}

/// A full date, 20YY-MM-DD.
fn has_date(line: &str) -> bool {
    let b = line.as_bytes();
    let d = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    (0..b.len()).any(|i| {
        b[i] == b'2'
            && b.get(i + 1) == Some(&b'0')
            && d(i + 2)
            && d(i + 3)
            && b.get(i + 4) == Some(&b'-')
            && d(i + 5)
            && d(i + 6)
            && b.get(i + 7) == Some(&b'-')
            && d(i + 8)
            && d(i + 9)
            && (i == 0 || !b[i - 1].is_ascii_alphanumeric())
    })
}

fn files_under(root: &Path, rel: &str, out: &mut Vec<PathBuf>) {
    if SKIPPED.contains(&rel) || rel.starts_with(SKIPPED_PREFIX) {
        return;
    }
    let path = root.join(rel);
    if path.is_file() {
        out.push(PathBuf::from(rel));
    } else if let Ok(entries) = std::fs::read_dir(&path) {
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            files_under(root, &format!("{rel}/{name}"), out);
        }
    }
}

#[test]
fn the_repository_speaks_of_the_product_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for rel in ROOTS {
        files_under(root, rel, &mut files);
    }
    assert!(files.len() > 50, "too few files scanned: {files:?}");
    let mut bad = Vec::new();
    for rel in &files {
        // Binary and non-UTF-8 files carry no prose.
        let Ok(text) = std::fs::read_to_string(root.join(rel)) else {
            continue;
        };
        for f in findings(&text) {
            bad.push(format!("{}:{}: {}", rel.display(), f.line, f.what));
        }
    }
    assert!(
        bad.is_empty(),
        "describe the product as it is, not how it was developed (tests/process_words.rs):\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn the_matcher_flags_development_narration() {
    for text in [
        "the third session",
        "Until the sixth session of the week the peer was a task",
        "measured in session 4",
        "other engineers' VMs were running",
        "the lead's runs",
        "asked by the lead",
        "a reviewer found",
        "issue 17's targets",
        "(issue 15)",
        "issue 12, defects 1-3",
        "see #27",
        "(#13 redesign)",
        "the morning run",
        "An invalid one used to fall back to info",
        "until the eighth",
        "Earlier runs and every A/B",
        "as it always did",
        "Fixed since: the message names it",
        "(tried, not kept)",
        "Measured 2026-11-24 04:44 UTC",
        "the 2nd session",
    ] {
        assert!(!findings(text).is_empty(), "not flagged: {text:?}");
    }
}

#[test]
fn the_matcher_passes_product_text() {
    for text in [
        "One NRI session (mux + ttrpc server + client + registration)",
        "Forget the previous session: a reconnect is a new plugin",
        "the first ttrpc session of the runtime",
        "the session ends when the trunk closes",
        "fixed by containerd/nri#301 (merged 2026-07); see containerd#10085",
        "KEP-2570 formula",
        "the fd is used to write memory.high",
        "{:#04x}",
        "#[derive(Debug)]",
        "# 1. comment heading",
        "\"rustc 1.95.0 (59807616e 2026-04-14)\"",
        "waits until the task is dropped",
        "the leading zeros",
        "a second session-every run",
        "- **session** (1 in `--session-every`): a whole plugin session",
        "sessions += 1;",
    ] {
        assert_eq!(findings(text), vec![], "flagged: {text:?}");
    }
}

#[test]
fn findings_name_their_line() {
    let text = "fine\nthe third session\nfine";
    assert_eq!(
        findings(text),
        vec![Finding {
            line: 2,
            what: "a numbered work session (\"the third session\")"
        }]
    );
}
