//! A short burst of the fuzzer (`examples/fuzz.rs`), so it keeps building
//! and running as the protocol code changes. The long run:
//! docs/protocol.md, "Fuzzing".

use std::process::Command;

#[test]
fn a_short_fuzz_run_finds_nothing() {
    // `cargo test` builds the examples next to the test binaries' folder.
    let exe = std::env::current_exe().unwrap();
    let fuzz = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples/fuzz"))
        .unwrap();
    if !fuzz.exists() {
        eprintln!(
            "SKIP: {} not built (run the whole `cargo test`)",
            fuzz.display()
        );
        return;
    }
    let out = Command::new(&fuzz)
        .args(["--execs", "20000", "--session-every", "200", "--seed", "3"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("crashes 0, hangs 0"), "{text}");
}
