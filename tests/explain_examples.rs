//! `nri-qos explain` on every manifest in config/examples, through the real
//! binary, checked against the reference's worked values.

// Test code: a failed unwrap is the test failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use serde_json::Value;

fn explain(file: &str, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_nri-qos"))
        .args(["explain", file, "--output", "json", "--node-memory", "16Gi"])
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run nri-qos explain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json output")
}

fn container<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in {v}"))
}

#[test]
fn every_example_explains() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let v = explain(path.to_str().unwrap(), &[]);
            assert!(
                v["containers"].as_array().is_some_and(|c| !c.is_empty()),
                "{path:?}"
            );
            // Table output works too.
            let out = Command::new(env!("CARGO_BIN_EXE_nri-qos"))
                .args(["explain", path.to_str().unwrap()])
                .output()
                .unwrap();
            assert!(out.status.success());
            n += 1;
        }
    }
    assert!(n >= 5, "only {n} examples");
}

#[test]
fn guaranteed_example_matches_row_2() {
    let v = explain("config/examples/guaranteed.yaml", &[]);
    assert_eq!(v["qosClass"], "Guaranteed");
    let c = container(&v, "postgres");
    assert_eq!(c["cpuWeight"], 100);
    assert_eq!(c["cpuMax"], "100000 100000");
    assert_eq!(c["memoryMin"], 1073741824u64);
    assert_eq!(c["memoryHigh"], "max");
    assert_eq!(c["memoryMax"], 1073741824u64);
    assert_eq!(c["oomScoreAdj"], -997);
    assert_eq!(v["sandbox"]["oomScoreAdj"], -998);
}

#[test]
fn burstable_example_with_annotation() {
    let v = explain("config/examples/burstable.yaml", &[]);
    assert_eq!(v["qosClass"], "Burstable");
    let c = container(&v, "app");
    assert_eq!(c["cpuShares"], 256);
    assert_eq!(c["cpuWeight"], 35);
    assert_eq!(c["memoryLow"], 268435456u64);
    // floor((256Mi + 0.9 * (1Gi - 256Mi)) / 4096) * 4096
    assert_eq!(c["memoryHigh"], 993210368u64);
    assert_eq!(c["oomScoreAdj"], 985);
    assert_eq!(v["podCgroup"]["memoryLow"], 268435456u64);
}

#[test]
fn multi_container_sidecar_and_init() {
    let v = explain("config/examples/multi-container.yaml", &[]);
    let envoy = container(&v, "envoy");
    assert_eq!(envoy["init"], true);
    assert_eq!(envoy["sidecar"], true);
    // The sidecar takes the adj of the smallest regular request (512Mi → 969).
    assert_eq!(envoy["oomScoreAdj"], 969);
    assert_eq!(container(&v, "migrate")["oomScoreAdj"], 993);
    // request == limit on memory: no memory.high, as the kubelet
    let cache = container(&v, "cache");
    assert_eq!(cache["memoryLow"], 1073741824u64);
    assert_eq!(cache["memoryHigh"], "max");
}

#[test]
fn pod_level_example_matches_row_11() {
    let v = explain("config/examples/pod-level-resources.yaml", &[]);
    assert_eq!(v["qosClass"], "Burstable");
    for name in ["frontend", "backend"] {
        let c = container(&v, name);
        assert_eq!(c["oomScoreAdj"], 938);
        assert_eq!(c["cpuMax"], "200000 100000");
        assert_eq!(c["memoryMax"], 4294967296u64);
    }
}

#[test]
fn linear_config_and_systemd_driver() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[policy]\ncpu-weight = \"linear\"\n").unwrap();
    let v = explain(
        "config/examples/guaranteed.yaml",
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--cgroup-driver",
            "systemd",
        ],
    );
    let c = container(&v, "postgres");
    assert_eq!(c["cpuWeight"], 39);
    assert!(c["cgroupPath"]
        .as_str()
        .unwrap()
        .starts_with("/kubepods.slice/kubepods-pod6b1e0c1a_4f7e_4a57_9c55_3a1a2f0d9e01.slice/"));
}

#[test]
fn bad_manifest_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "kind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: a\n  - name: b\n    resources:\n      limits: {memory: 12x}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nri-qos"))
        .args(["explain", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.containers[1].resources.limits.memory: invalid quantity \"12x\""),
        "{err}"
    );
}

#[test]
fn bad_node_and_kindless_manifest_are_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.yaml");
    std::fs::write(&pod, "kind: Pod\nspec:\n  containers:\n  - name: a\n").unwrap();
    let kindless = dir.path().join("kindless.yaml");
    std::fs::write(&kindless, "spec:\n  containers:\n  - name: a\n").unwrap();
    for (file, extra, needle) in [
        (&pod, &["--node-memory", "0"][..], "--node-memory"),
        (&pod, &["--node-allocatable", "0"][..], "--node-allocatable"),
        (&kindless, &[][..], "kind: missing"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_nri-qos"))
            .arg("explain")
            .arg(file)
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
}

/// The request source the plugin would use. `auto` follows the
/// config (`[kubernetes] kubeconfig` set: api-server); the flag overrides.
#[test]
fn request_source_follows_the_config_or_the_flag() {
    let file = "config/examples/multi-container.yaml";
    let dir = tempfile::tempdir().unwrap();
    let with = dir.path().join("with.toml");
    std::fs::write(
        &with,
        "[kubernetes]\nkubeconfig = \"/etc/nri-qos/kubeconfig\"\n",
    )
    .unwrap();
    let off = dir.path().join("off.toml");
    std::fs::write(
        &off,
        "[kubernetes]\nenabled = false\nkubeconfig = \"/etc/nri-qos/kubeconfig\"\n",
    )
    .unwrap();
    let source = |v: &Value| container(v, "api")["memoryRequestSource"].clone();
    let plain = explain(file, &[]);
    assert_eq!(source(&plain), "oomScoreAdj");
    assert!(plain.get("requestSource").is_none());
    for args in [
        vec!["--config", with.to_str().unwrap()],
        vec!["--request-source", "api-server"],
    ] {
        let v = explain(file, &args);
        assert_eq!(v["requestSource"], "api-server", "{args:?}");
        assert_eq!(source(&v), "apiServer", "{args:?}");
        assert_eq!(container(&v, "api")["memoryRequest"], 512u64 << 20);
    }
    for args in [
        vec!["--config", off.to_str().unwrap()],
        vec![
            "--config",
            with.to_str().unwrap(),
            "--request-source",
            "runtime",
        ],
    ] {
        let v = explain(file, &args);
        assert_eq!(v, plain, "{args:?}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_nri-qos"))
        .args(["explain", file, "--request-source", "guess"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--request-source"));
}
