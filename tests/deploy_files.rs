//! Every file under `config/` (except the policy's `nri-qos.toml`, tested
//! with the policy) parses, and carries the settings that matter.

// Test code: a failed unwrap is the test failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use nri_qos::config::Config;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn toml_file(rel: &str) -> toml::Table {
    read(rel)
        .parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Walks `a.b.c` through nested tables (keys may contain dots when quoted
/// in TOML, so the path is given as separate keys).
fn get<'a>(t: &'a toml::Table, keys: &[&str]) -> &'a toml::Value {
    let (last, parents) = keys.split_last().expect("keys");
    let mut cur = t;
    for k in parents {
        cur = cur
            .get(*k)
            .and_then(toml::Value::as_table)
            .unwrap_or_else(|| panic!("no table {k} in {keys:?}"));
    }
    cur.get(*last)
        .unwrap_or_else(|| panic!("no key {last} in {keys:?}"))
}

const NRI_KEYS: &[(&str, &str)] = &[
    ("plugin_path", "/opt/nri/plugins"),
    ("plugin_config_path", "/etc/nri/conf.d"),
    ("socket_path", "/var/run/nri/nri.sock"),
    ("plugin_registration_timeout", "5s"),
    ("plugin_request_timeout", "2s"),
];

fn check_containerd(rel: &str, version: i64) {
    let t = toml_file(rel);
    assert_eq!(t["version"].as_integer(), Some(version), "{rel}");
    let nri = ["plugins", "io.containerd.nri.v1.nri"];
    let key = |k: &'static str| [nri[0], nri[1], k];
    assert_eq!(get(&t, &key("disable")).as_bool(), Some(false), "{rel}");
    assert_eq!(
        get(&t, &key("disable_connections")).as_bool(),
        Some(false),
        "{rel}"
    );
    for (k, v) in NRI_KEYS {
        assert_eq!(get(&t, &key(k)).as_str(), Some(*v), "{rel}: {k}");
    }
    // Nothing else hides in the file (typos would be silently ignored by containerd).
    let table = get(&t, &nri[..]).as_table().expect("nri table");
    assert_eq!(table.len(), NRI_KEYS.len() + 2, "{rel}: {table:?}");
    assert_eq!(t.len(), 2, "{rel}: only version and plugins");
}

#[test]
fn containerd_1_7_enables_nri() {
    check_containerd("config/containerd/config-1.7.toml", 2);
    // 1.7 uses double-quoted plugin ids in its documentation; keep that form.
    assert!(read("config/containerd/config-1.7.toml")
        .contains("[plugins.\"io.containerd.nri.v1.nri\"]"));
}

#[test]
fn containerd_2_x_config() {
    check_containerd("config/containerd/config-2.x.toml", 3);
    assert!(
        read("config/containerd/config-2.x.toml").contains("[plugins.'io.containerd.nri.v1.nri']")
    );
}

#[test]
fn crio_drop_in_enables_nri() {
    let rel = "config/crio/10-nri-qos.conf";
    let t = toml_file(rel);
    let key = |k: &'static str| ["crio", "nri", k];
    assert_eq!(get(&t, &key("enable_nri")).as_bool(), Some(true));
    assert_eq!(
        get(&t, &key("nri_disable_connections")).as_bool(),
        Some(false)
    );
    for (k, v) in [
        ("nri_listen", "/var/run/nri/nri.sock"),
        ("nri_plugin_dir", "/opt/nri/plugins"),
        ("nri_plugin_config_dir", "/etc/nri/conf.d"),
        ("nri_plugin_registration_timeout", "5s"),
        ("nri_plugin_request_timeout", "2s"),
    ] {
        assert_eq!(get(&t, &key(k)).as_str(), Some(v), "{rel}: {k}");
    }
    assert_eq!(get(&t, &["crio", "nri"]).as_table().unwrap().len(), 7);
}

#[test]
fn nri_drop_in_is_our_config() {
    let rel = "config/nri/10-nri-qos.conf";
    let cfg = Config::from_toml(&read(rel), &path(rel)).unwrap();
    assert!(!cfg.plugin.dry_run);
    // Only [policy] and plugin.dry-run take effect from the drop-in; keep
    // the file to those so nobody expects more.
    let t = toml_file(rel);
    assert!(t.keys().all(|k| k == "plugin" || k == "policy"), "{t:?}");
    assert_eq!(get(&t, &["plugin"]).as_table().map(|p| p.len()), Some(1));
    // The file name is what the runtime looks up for plugin "10-nri-qos".
    let id = nri_qos::nri::Identity::from_file_name("10-nri-qos").expect("valid plugin name");
    assert_eq!((id.index.as_str(), id.name.as_str()), ("10", "nri-qos"));
}

/// `[Section]` → key → values, from systemd unit syntax (comments, blank
/// lines, `Key=Value`; repeated keys accumulate). Strict: anything else fails.
fn parse_unit(text: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut section: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        assert!(
            !line.ends_with('\\'),
            "line {}: continuations unsupported",
            n + 1
        );
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            assert!(
                out.insert(name.to_string(), BTreeMap::new()).is_none(),
                "duplicate section {name}"
            );
            section = Some(name.to_string());
            continue;
        }
        let s = section
            .as_ref()
            .unwrap_or_else(|| panic!("line {}: key outside a section", n + 1));
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not Key=Value: {line}", n + 1));
        assert!(
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric()),
            "line {}: bad key {k:?}",
            n + 1
        );
        out.get_mut(s)
            .expect("section exists")
            .entry(k.to_string())
            .or_default()
            .push(v.to_string());
    }
    out
}

#[test]
fn systemd_unit_has_what_we_rely_on() {
    let unit = parse_unit(&read("config/systemd/nri-qos.service"));
    let one = |s: &str, k: &str| -> String {
        let v = unit
            .get(s)
            .and_then(|m| m.get(k))
            .unwrap_or_else(|| panic!("[{s}] {k} missing"));
        assert_eq!(v.len(), 1, "[{s}] {k} repeated");
        v[0].clone()
    };
    let all = |s: &str, k: &str| -> Vec<String> {
        unit.get(s)
            .and_then(|m| m.get(k))
            .map(|v| {
                v.iter()
                    .flat_map(|x| x.split_whitespace())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        unit.keys().collect::<Vec<_>>(),
        ["Install", "Service", "Unit"]
    );
    let after = all("Unit", "After");
    assert!(after.contains(&"containerd.service".into()), "{after:?}");
    assert!(after.contains(&"crio.service".into()), "{after:?}");
    // Ordering only: requiring one runtime would break nodes with the other.
    assert!(!unit["Unit"].contains_key("Requires"));

    let exec = one("Service", "ExecStart");
    assert!(exec.starts_with("/usr/local/bin/nri-qos run"), "{exec}");
    assert_eq!(one("Service", "Restart"), "on-failure");
    assert!(!one("Service", "RestartSec").is_empty());
    assert_eq!(one("Service", "OOMScoreAdjust"), "-999");
    assert!(!one("Service", "MemoryMin").is_empty());
    assert_eq!(one("Service", "ProtectSystem"), "strict");
    assert_eq!(one("Service", "NoNewPrivileges"), "yes");
    let rw = all("Service", "ReadWritePaths");
    for p in ["/sys/fs/cgroup", "/proc", "-/var/run/nri"] {
        assert!(
            rw.contains(&p.to_string()),
            "ReadWritePaths lacks {p}: {rw:?}"
        );
    }
    // These would make our writes fail at runtime.
    for k in [
        "ProtectControlGroups",
        "ProtectKernelTunables",
        "ProtectProc",
        "PrivatePIDs",
    ] {
        assert!(
            !unit["Service"].contains_key(k),
            "{k} breaks cgroup/proc writes"
        );
    }
    // cgroup/oom_score_adj writes, PSI triggers, and the per-pid kill of
    // the guard and the monitor on kernels without cgroup.kill.
    let caps = all("Service", "CapabilityBoundingSet");
    assert_eq!(caps, ["CAP_DAC_OVERRIDE", "CAP_SYS_RESOURCE", "CAP_KILL"]);
    // lock-memory and the monitor thread's nice by resource limits, not
    // CAP_IPC_LOCK / CAP_SYS_NICE.
    let monitor = nri_qos::pressure::MonitorConfig::default();
    assert!(monitor.lock_memory);
    assert_eq!(one("Service", "LimitMEMLOCK"), "infinity");
    assert_eq!(one("Service", "LimitNICE"), monitor.nice.to_string());
    let syscalls = all("Service", "SystemCallFilter");
    assert!(
        syscalls.contains(&"process_mrelease".to_string()),
        "{syscalls:?}"
    );
    assert_eq!(one("Service", "IPAddressDeny"), "any");
    assert_eq!(one("Install", "WantedBy"), "multi-user.target");
}

/// Deserializes into the API type and back: an unknown or misspelled field
/// is dropped by the typed round trip, so the two values differ.
fn typed<T: DeserializeOwned + Serialize>(doc: &serde_json::Value) -> T {
    let obj: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{e}: {doc}"));
    let back = serde_json::to_value(&obj).unwrap();
    assert_eq!(&back, doc, "fields lost in the typed round trip");
    obj
}

struct Manifests {
    sa: ServiceAccount,
    cm: ConfigMap,
    ds: DaemonSet,
    role: ClusterRole,
    binding: ClusterRoleBinding,
}

fn manifests() -> Manifests {
    let text = read("config/kubernetes/daemonset.yaml");
    let mut sa = None;
    let mut cm = None;
    let mut ds = None;
    let mut role = None;
    let mut binding = None;
    for de in serde_norway::Deserializer::from_str(&text) {
        let doc = serde_json::Value::deserialize(de).expect("YAML document");
        if doc.is_null() {
            continue;
        }
        match doc["kind"].as_str() {
            Some("ServiceAccount") => assert!(sa.replace(typed(&doc)).is_none()),
            Some("ConfigMap") => assert!(cm.replace(typed(&doc)).is_none()),
            Some("DaemonSet") => assert!(ds.replace(typed(&doc)).is_none()),
            Some("ClusterRole") => assert!(role.replace(typed(&doc)).is_none()),
            Some("ClusterRoleBinding") => assert!(binding.replace(typed(&doc)).is_none()),
            other => panic!("unexpected document kind {other:?}"),
        }
    }
    Manifests {
        sa: sa.expect("ServiceAccount"),
        cm: cm.expect("ConfigMap"),
        ds: ds.expect("DaemonSet"),
        role: role.expect("ClusterRole"),
        binding: binding.expect("ClusterRoleBinding"),
    }
}

use serde::Deserialize as _;

#[test]
fn daemonset_manifests() {
    let Manifests {
        sa,
        cm,
        ds,
        role,
        binding,
    } = manifests();
    let ns = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.namespace.clone().unwrap_or_default()
    };
    assert_eq!(ns(&sa.metadata), "kube-system");
    assert_eq!(ns(&cm.metadata), "kube-system");
    assert_eq!(ns(&ds.metadata), "kube-system");
    assert_eq!(sa.automount_service_account_token, Some(true));

    // Exactly: pods get/list/watch, pods/eviction create, events create.
    let mut rules: Vec<(String, String, String)> = Vec::new();
    for r in role.rules.iter().flatten() {
        assert_eq!(r.api_groups.as_deref(), Some(&[String::new()][..]), "{r:?}");
        assert!(r.resource_names.is_none() && r.non_resource_urls.is_none());
        for res in r.resources.iter().flatten() {
            for v in &r.verbs {
                rules.push((String::new(), res.clone(), v.clone()));
            }
        }
    }
    rules.sort();
    let want = [
        ("events", "create"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods/eviction", "create"),
    ];
    assert_eq!(
        rules,
        want.map(|(r, v)| (String::new(), r.to_string(), v.to_string()))
    );
    assert_eq!(binding.role_ref.name, "nri-qos");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    let subjects = binding.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (
            subjects[0].kind.as_str(),
            subjects[0].name.as_str(),
            subjects[0].namespace.as_deref()
        ),
        ("ServiceAccount", "nri-qos", Some("kube-system"))
    );

    // The ConfigMap's TOML is a valid config that points at the mounts.
    let data = cm.data.as_ref().expect("data");
    let cfg = Config::from_toml(&data["nri-qos.toml"], Path::new("ConfigMap nri-qos")).unwrap();
    assert_eq!(cfg.node.proc_root, Path::new("/host/proc"));
    assert_eq!(cfg.node.cgroup_root, Path::new("/host/sys/fs/cgroup"));
    assert!(cfg.metrics.enabled, "the liveness probe needs the endpoint");
    assert!(cfg.kubernetes.enabled && cfg.kubernetes.node_name.is_empty());

    let spec = ds.spec.as_ref().expect("spec");
    let pod = spec.template.spec.as_ref().expect("pod spec");
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone());
    assert_eq!(
        spec.selector.match_labels, labels,
        "selector matches template"
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("nri-qos"));
    assert_eq!(pod.automount_service_account_token, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    // A node agent must not depend on the pod network it sets the QoS of
    // (the CNI plugin's pods among them); its one listener is loopback.
    assert_eq!(
        pod.host_network,
        Some(true),
        "independent of the pod network"
    );
    assert!(cfg.metrics.address.ip().is_loopback());
    assert_eq!(
        pod.host_pid,
        Some(true),
        "the guard and the monitor need the pods' pids (cgroup.procs names others 0)"
    );
    let tol = pod.tolerations.as_ref().expect("tolerations");
    assert!(
        tol.iter().any(|t| t.operator.as_deref() == Some("Exists")
            && t.key.is_none()
            && t.effect.is_none()),
        "must tolerate every taint"
    );

    assert_eq!(pod.containers.len(), 1);
    let c = &pod.containers[0];
    // Memory bounded (request == limit); CPU requested, never limited (a
    // limit throttles the plugin's start and the monitor under load); the
    // kubelet still gives a system-node-critical pod oom_score_adj -997.
    let res = c.resources.as_ref().expect("resources");
    let (req, lim) = (
        res.requests.clone().expect("requests"),
        res.limits.clone().expect("limits"),
    );
    assert_eq!(req.get("memory"), lim.get("memory"));
    assert!(req.contains_key("cpu") && !lim.contains_key("cpu"));

    // NODE_NAME from the downward API names the node whose pods we watch.
    let node_name = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == nri_qos::kube::NODE_NAME_ENV)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(node_name.as_deref(), Some("spec.nodeName"));

    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_user, Some(0));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    let mut add = caps.add.clone().unwrap_or_default();
    add.sort();
    assert_eq!(add, ["DAC_OVERRIDE", "IPC_LOCK", "KILL", "SYS_RESOURCE"]);
    // What runs there by default: the plugin, the guard and the monitor,
    // memory.high guarded; the monitor's nice left to the pod's weight.
    assert!(cfg.plugin.with_monitor && cfg.throttle.enabled);
    assert!(cfg.check_guarded().is_ok());
    assert_eq!(cfg.monitor.nice, 0);

    // Mounts: volume name -> (host path, mount path, read-only).
    let volumes = pod.volumes.as_ref().expect("volumes");
    let mounts = c.volume_mounts.as_ref().expect("volumeMounts");
    let mount = |host: &str| {
        let v = volumes
            .iter()
            .find(|v| v.host_path.as_ref().map(|h| h.path.as_str()) == Some(host))
            .unwrap_or_else(|| panic!("no hostPath volume {host}"));
        let m = mounts
            .iter()
            .find(|m| m.name == v.name)
            .unwrap_or_else(|| panic!("volume {} not mounted", v.name));
        (m.mount_path.clone(), m.read_only.unwrap_or(false))
    };
    assert_eq!(mount("/var/run/nri"), ("/var/run/nri".into(), false));
    assert_eq!(
        mount("/sys/fs/cgroup"),
        (cfg.node.cgroup_root.display().to_string(), false)
    );
    assert_eq!(
        mount("/proc"),
        (cfg.node.proc_root.display().to_string(), false)
    );
    let cm_vol = volumes
        .iter()
        .find(|v| v.config_map.as_ref().map(|c| c.name.as_str()) == Some("nri-qos"))
        .expect("config volume");
    let cm_mount = mounts
        .iter()
        .find(|m| m.name == cm_vol.name)
        .expect("config mount");
    assert_eq!(
        Path::new(&cm_mount.mount_path).join("nri-qos.toml"),
        Path::new(nri_qos::config::DEFAULT_CONFIG_PATH)
    );
    assert_eq!(cm_mount.read_only, Some(true));
    // The socket the container connects to is inside the mounted directory.
    let args = c.args.clone().unwrap_or_default();
    let socket = args
        .windows(2)
        .find(|w| w[0] == "--socket")
        .map(|w| w[1].clone())
        .unwrap_or_else(|| cfg.plugin.socket.display().to_string());
    assert!(socket.starts_with("/var/run/nri/"), "{socket}");

    // Liveness: exec (kubelet cannot reach the pod's 127.0.0.1), probing the
    // configured metrics address.
    let probe = c.liveness_probe.as_ref().expect("livenessProbe");
    assert!(probe.http_get.is_none() && probe.tcp_socket.is_none());
    let cmd = probe
        .exec
        .as_ref()
        .and_then(|e| e.command.clone())
        .expect("exec probe");
    assert_eq!(cmd[0], c.command.as_ref().expect("command")[0]);
    assert_eq!(cmd[1], "health");
    assert_eq!(
        cmd.last().map(String::as_str),
        Some(cfg.metrics.address.to_string().as_str())
    );
}

#[test]
fn operations_doc_lists_every_variable_and_metric() {
    let doc = read("docs/operations.md");
    for (var, field) in nri_qos::config::env_variables() {
        assert!(
            doc.contains(&format!("| `{var}` | `{field}` |")),
            "docs/operations.md: no table row for {var}"
        );
    }
    for name in [
        "nri_qos_adjustments_total",
        "nri_qos_hook_duration_seconds",
        "nri_qos_pressure",
        "nri_qos_evictions_total",
        "nri_qos_runtime_connected",
        "nri_qos_kube_connected",
        "nri_qos_kube_pods",
        "nri_qos_kube_watch_lag_seconds",
        "nri_qos_kube_evictions_total",
    ] {
        assert!(doc.contains(&format!("`{name}`")), "docs: {name}");
        let m = nri_qos::metrics::Metrics::new();
        m.set_kube_configured();
        assert!(m.render().contains(&format!("# TYPE {name} ")));
    }
}

#[test]
fn image_puts_the_binary_where_the_daemonset_runs_it() {
    let Manifests { ds, .. } = manifests();
    let pod = ds.spec.and_then(|s| s.template.spec).expect("pod spec");
    let bin = pod.containers[0].command.clone().expect("command")[0].clone();
    // Both image builds lay the filesystem with scripts/image-rootfs.sh.
    let rootfs = read("scripts/image-rootfs.sh");
    assert!(
        rootfs.contains(&format!("\"$root{bin}\"")),
        "scripts/image-rootfs.sh does not install {bin}"
    );
    let dockerfile = read("config/kubernetes/Dockerfile");
    assert!(dockerfile.contains("scripts/image-rootfs.sh target/release/nri-qos /rootfs"));
    assert!(dockerfile.contains("COPY --from=build /rootfs/ /"));
    assert!(
        dockerfile.contains("--locked"),
        "reproducible: build with Cargo.lock"
    );
    assert!(read("scripts/build-image.sh").contains("cargo build --release --locked --bin nri-qos"));
}

/// kustomization.yaml is the one place the image is named: the DaemonSet's
/// placeholder is its `name`, and the tag is the crate's version.
#[test]
fn kustomization_names_the_image() {
    let kust: serde_json::Value =
        serde_norway::from_str(&read("config/kubernetes/kustomization.yaml")).unwrap();
    assert_eq!(kust["resources"], serde_json::json!(["daemonset.yaml"]));
    let images = kust["images"].as_array().expect("images");
    assert_eq!(images.len(), 1);
    let Manifests { ds, .. } = manifests();
    let pod = ds.spec.and_then(|s| s.template.spec).expect("pod spec");
    assert_eq!(
        pod.containers[0].image.as_deref(),
        images[0]["name"].as_str(),
        "the DaemonSet's image is the kustomization's placeholder"
    );
    assert_eq!(images[0]["newTag"], env!("CARGO_PKG_VERSION"));
    assert!(images[0]["newName"]
        .as_str()
        .is_some_and(|n| n.contains('/')));
}

/// The example Pods users feed `nri-qos explain`, and the ones the VM tests
/// send the runtime, are real Kubernetes Pods: typed with the API's own
/// types, without a field lost.
#[test]
fn example_and_e2e_manifests_are_kubernetes_pods() {
    use k8s_openapi::api::core::v1::Pod;
    let mut n = 0;
    for dir in [
        "config/examples",
        "tests/e2e/scenarios/pods",
        "tests/e2e/kube/pods",
    ] {
        for entry in std::fs::read_dir(path(dir)).unwrap() {
            let file = entry.unwrap().path();
            if file.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let doc: serde_json::Value =
                serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(doc["kind"], "Pod", "{}", file.display());
            let pod: Pod = typed(&doc);
            assert!(
                !pod.spec.unwrap().containers.is_empty(),
                "{}",
                file.display()
            );
            n += 1;
        }
    }
    assert!(n >= 15, "only {n} manifests");
}
