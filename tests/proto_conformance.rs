//! Our proto/nri/api.proto against the upstream containerd/nri api.proto as
//! Debian ships it (v0.6.1 from trixie, v0.8.0 from sid) and against
//! upstream's v0.12.2, the API ours follows: for every message, enum and
//! service both define, numbers, types and names must agree.
//!
//! Debian's files come from `tests/upstream/fetch-nri-protos.sh`, which the
//! README's test command runs first; v0.12.2's is kept in the repository
//! (`tests/upstream/containerd-nri-v0.12.2/`, with its license).

// Test code: a failed unwrap is the test failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use protobuf::descriptor::{DescriptorProto, FileDescriptorProto};

fn parse(dir: &Path, file: &str) -> FileDescriptorProto {
    let set = protobuf_parse::Parser::new()
        .pure()
        .include(dir)
        .input(dir.join(file))
        .file_descriptor_set()
        .unwrap_or_else(|e| panic!("cannot parse {}: {e:#}", dir.join(file).display()));
    set.file
        .into_iter()
        .find(|f| f.name().ends_with(file.rsplit('/').next().unwrap()))
        .expect("parsed file")
}

fn messages(f: &FileDescriptorProto) -> BTreeMap<String, &DescriptorProto> {
    f.message_type
        .iter()
        .map(|m| (m.name().to_string(), m))
        .collect()
}

fn upstream(suite: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/upstream/cache")
        .join(suite);
    if dir.join("api.proto").is_file() {
        return Some(dir);
    }
    if std::env::var_os("NRI_QOS_SKIP_UPSTREAM").is_some() {
        eprintln!("SKIP: upstream proto for {suite} not fetched (NRI_QOS_SKIP_UPSTREAM set)");
        return None;
    }
    panic!(
        "upstream proto for {suite} missing: run tests/upstream/fetch-nri-protos.sh \
         (or set NRI_QOS_SKIP_UPSTREAM=1 to skip)"
    );
}

/// Returns the list of mismatches between ours and theirs.
fn compare(ours: &FileDescriptorProto, theirs: &FileDescriptorProto) -> (Vec<String>, usize) {
    let mut problems = Vec::new();
    let mut compared = 0;
    if ours.package() != theirs.package() {
        problems.push(format!(
            "package {} != upstream {}",
            ours.package(),
            theirs.package()
        ));
    }
    let (om, tm) = (messages(ours), messages(theirs));
    for (name, o) in &om {
        let Some(t) = tm.get(name) else { continue };
        for of in &o.field {
            compared += 1;
            let by_number = t.field.iter().find(|tf| tf.number() == of.number());
            let by_name = t.field.iter().find(|tf| tf.name() == of.name());
            match (by_number, by_name) {
                (Some(tf), _) => {
                    if tf.name() != of.name() {
                        problems.push(format!(
                            "{name}.{} is field {} upstream called {}",
                            of.name(),
                            of.number(),
                            tf.name()
                        ));
                    }
                    if tf.type_() != of.type_()
                        || tf.label() != of.label()
                        || tf.type_name() != of.type_name()
                    {
                        problems.push(format!(
                            "{name}.{} (#{}) is {:?} {:?} {} here but {:?} {:?} {} upstream",
                            of.name(),
                            of.number(),
                            of.label(),
                            of.type_(),
                            of.type_name(),
                            tf.label(),
                            tf.type_(),
                            tf.type_name()
                        ));
                    }
                }
                (None, Some(tf)) => problems.push(format!(
                    "{name}.{} is #{} here but #{} upstream",
                    of.name(),
                    of.number(),
                    tf.number()
                )),
                // A field newer than this upstream tag: fine on the wire.
                (None, None) => {}
            }
        }
        // Nested map-entry types must agree too (key/value types).
        for on in &o.nested_type {
            if let Some(tn) = t.nested_type.iter().find(|n| n.name() == on.name()) {
                for (a, b) in on.field.iter().zip(tn.field.iter()) {
                    if a.type_() != b.type_() || a.number() != b.number() {
                        problems.push(format!("{name}.{} map entry differs", on.name()));
                    }
                }
            }
        }
    }
    for oe in &ours.enum_type {
        let Some(te) = theirs.enum_type.iter().find(|e| e.name() == oe.name()) else {
            continue;
        };
        for ov in &oe.value {
            compared += 1;
            // LAST moves as events are added; it is a bound, not an event.
            if ov.name() == "LAST" {
                continue;
            }
            if let Some(tv) = te.value.iter().find(|v| v.name() == ov.name()) {
                if tv.number() != ov.number() {
                    problems.push(format!(
                        "enum {}.{} = {} here, {} upstream",
                        oe.name(),
                        ov.name(),
                        ov.number(),
                        tv.number()
                    ));
                }
            }
            if let Some(tv) = te.value.iter().find(|v| v.number() == ov.number()) {
                if tv.name() != ov.name() && tv.name() != "LAST" {
                    problems.push(format!(
                        "enum {} value {} is {} here, {} upstream",
                        oe.name(),
                        ov.number(),
                        ov.name(),
                        tv.name()
                    ));
                }
            }
        }
    }
    for ts in &theirs.service {
        // Served by the runtime to WASM plugins only (v0.9.0 on).
        if ts.name() == "HostFunctions" {
            continue;
        }
        let Some(os) = ours.service.iter().find(|s| s.name() == ts.name()) else {
            problems.push(format!("service {} missing", ts.name()));
            continue;
        };
        for tm in &ts.method {
            compared += 1;
            match os.method.iter().find(|m| m.name() == tm.name()) {
                None => problems.push(format!("{}.{} missing", ts.name(), tm.name())),
                Some(m)
                    if m.input_type() != tm.input_type() || m.output_type() != tm.output_type() =>
                {
                    problems.push(format!(
                        "{}.{} has other message types",
                        ts.name(),
                        tm.name()
                    ))
                }
                Some(_) => {}
            }
        }
    }
    (problems, compared)
}

fn ours() -> FileDescriptorProto {
    parse(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("proto"),
        "nri/api.proto",
    )
}

#[test]
fn matches_containerd_nri_v0_6_1_from_debian_trixie() {
    let Some(dir) = upstream("trixie") else {
        return;
    };
    let (problems, compared) = compare(&ours(), &parse(&dir, "api.proto"));
    assert!(
        problems.is_empty(),
        "mismatches with v0.6.1:\n{}",
        problems.join("\n")
    );
    assert!(compared > 150, "only {compared} items compared");
}

#[test]
fn matches_containerd_nri_v0_8_0_from_debian_sid() {
    let Some(dir) = upstream("sid") else { return };
    let (problems, compared) = compare(&ours(), &parse(&dir, "api.proto"));
    assert!(
        problems.is_empty(),
        "mismatches with v0.8.0:\n{}",
        problems.join("\n")
    );
    assert!(compared > 150, "only {compared} items compared");
}

/// The newest API: the v0.10 pod update and validation RPCs, the v0.12
/// per-event RPCs and `NRI_version` in RegisterPlugin and Configure.
#[test]
fn matches_containerd_nri_v0_12_2_kept_in_the_repository() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/containerd-nri-v0.12.2");
    let (problems, compared) = compare(&ours(), &parse(&dir, "api.proto"));
    assert!(
        problems.is_empty(),
        "mismatches with v0.12.2:\n{}",
        problems.join("\n")
    );
    assert!(compared > 200, "only {compared} items compared");
    // Every Plugin RPC of v0.12.2 is ours too (a missing one is a problem
    // above); the per-event ones are what a v0.12 runtime calls first.
    let theirs = parse(&dir, "api.proto");
    let plugin = theirs
        .service
        .iter()
        .find(|s| s.name() == "Plugin")
        .unwrap();
    for rpc in [
        "RunPodSandbox",
        "UpdatePodSandbox",
        "PostStartContainer",
        "RemoveContainer",
    ] {
        assert!(plugin.method.iter().any(|m| m.name() == rpc), "{rpc}");
    }
}

#[test]
fn a_renumbered_field_is_caught() {
    let Some(dir) = upstream("sid") else { return };
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/nri/api.proto"))
            .unwrap()
            .replace("string runtime_version = 3;", "string runtime_version = 7;");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("nri")).unwrap();
    std::fs::write(tmp.path().join("nri/api.proto"), text).unwrap();
    let (problems, _) = compare(
        &parse(tmp.path(), "nri/api.proto"),
        &parse(&dir, "api.proto"),
    );
    assert!(
        problems.iter().any(|p| p.contains("runtime_version")),
        "{problems:?}"
    );
}
