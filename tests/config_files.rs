//! Every configuration file we ship parses with our own types.

use std::path::Path;

use nri_qos::config::Config;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn shipped_nri_qos_toml_is_exactly_the_defaults() {
    let cfg = Config::load(&root().join("config/nri-qos.toml")).expect("config/nri-qos.toml");
    assert_eq!(cfg, Config::default());
}

#[test]
fn every_default_key_is_documented_in_the_shipped_file() {
    // Render the defaults and check each key appears in the commented file.
    let rendered = toml::to_string(&Config::default()).unwrap();
    let text = std::fs::read_to_string(root().join("config/nri-qos.toml")).unwrap();
    for line in rendered.lines() {
        if let Some((key, _)) = line.split_once(" = ") {
            assert!(
                text.contains(&format!("{key} = ")) || text.contains(&format!("# {key} = ")),
                "config/nri-qos.toml does not document {key}"
            );
        }
    }
}

#[test]
fn check_config_accepts_the_shipped_files_and_names_a_bad_key_and_its_file() {
    let run = |file: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_nri-qos"))
            .arg("check-config")
            .arg(file)
            .output()
            .expect("run nri-qos check-config")
    };
    for shipped in ["config/nri-qos.toml", "config/nri/10-nri-qos.conf"] {
        let out = run(&root().join(shipped));
        assert!(out.status.success(), "{shipped}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(": ok"));
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[policy]\ncpu-wieght = \"linear\"\n").unwrap();
    let out = run(&bad);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cpu-wieght") && err.contains("bad.toml"),
        "{err}"
    );
    std::fs::write(&bad, "[policy]\nmemory-throttling-factor = 1.5\n").unwrap();
    let err = String::from_utf8_lossy(&run(&bad).stderr).to_string();
    assert!(err.contains("memory-throttling-factor"), "{err}");
    // memory.high without a guard that acts: refused, naming both keys.
    std::fs::write(&bad, "[throttle]\nenabled = false\n").unwrap();
    let out = run(&bad);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.contains("policy.memory-high") && err.contains("throttle.enabled = false"),
        "{err}"
    );
    std::fs::write(
        &bad,
        "[throttle]\nenabled = false\nunguarded-memory-high = \"accept\"\n",
    )
    .unwrap();
    assert!(run(&bad).status.success());
}
