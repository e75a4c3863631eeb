use serde_json::json;

use super::*;

const NODE: NodeSpec = NodeSpec {
    memory_capacity: 16 << 30,
    memory_allocatable: 15 << 30,
    page_size: 4096,
    driver: Driver::Cgroupfs,
    cgroup_v2: true,
};

fn one(yaml: &str) -> PodReport {
    let yaml = format!("kind: Pod\n{yaml}");
    explain(&yaml, &NODE, &PolicyConfig::default()).unwrap()
}

#[test]
fn guaranteed_one_cpu_one_gi() {
    let r = one("metadata: {name: g, uid: abc}\nspec:\n  containers:\n  - name: app\n    resources:\n      limits: {cpu: '1', memory: 1Gi}\n");
    assert_eq!(r.qos_class, QosClass::Guaranteed);
    let c = &r.containers[0];
    assert_eq!((c.cpu_shares, c.cpu_weight), (1024, 100));
    assert_eq!(c.cpu_max, "100000 100000");
    assert_eq!(c.memory_min, 1 << 30);
    assert_eq!(c.memory_high, json!("max"));
    assert!(!c.throttle_guard);
    assert_eq!(c.memory_max, json!(1u64 << 30));
    assert_eq!(c.oom_score_adj, -997);
    assert_eq!(c.cgroup_path, "/kubepods/podabc/<container-id>");
}

#[test]
fn burstable_vector_row_4() {
    let r = one("metadata: {name: b}\nspec:\n  containers:\n  - name: app\n    resources:\n      requests: {cpu: 100m, memory: 128Mi}\n      limits: {cpu: 500m, memory: 512Mi}\n");
    assert_eq!(r.qos_class, QosClass::Burstable);
    let c = &r.containers[0];
    assert_eq!((c.cpu_shares, c.cpu_weight), (102, 17));
    assert_eq!(c.cpu_max, "50000 100000");
    assert_eq!(c.oom_score_adj, 993);
    // The request is recovered from oom_score_adj, as the plugin would.
    assert_eq!(c.memory_low, 120_258_560);
    assert_eq!(c.memory_request_source, RequestSource::OomScoreAdj);
}

#[test]
fn sidecar_takes_the_smallest_regular_adj() {
    // §8 row 10: sidecar 64Mi (own 997), app 512Mi (969) → sidecar 969.
    let r = one("metadata: {name: s}\nspec:\n  initContainers:\n  - name: proxy\n    restartPolicy: Always\n    resources: {requests: {memory: 64Mi}}\n  containers:\n  - name: app\n    resources: {requests: {memory: 512Mi}}\n");
    assert_eq!(r.containers[0].name, "proxy");
    assert!(r.containers[0].sidecar);
    assert_eq!(r.containers[0].oom_score_adj, 969);
    assert_eq!(r.containers[1].oom_score_adj, 969);
}

#[test]
fn pod_level_resources_decide_the_class_and_spread_the_request() {
    // §8 row 11: pod req 2Gi/1 CPU, lim 4Gi/2 CPU; two empty containers → 938 each.
    let r = one("metadata: {name: pl}\nspec:\n  resources:\n    requests: {cpu: '1', memory: 2Gi}\n    limits: {cpu: '2', memory: 4Gi}\n  containers:\n  - name: a\n  - name: b\n");
    assert_eq!(r.qos_class, QosClass::Burstable);
    for c in &r.containers {
        assert_eq!(c.oom_score_adj, 938, "{c:?}");
        assert_eq!(c.cpu_max, "200000 100000");
        assert_eq!(c.cpu_shares, 2048);
        assert_eq!(c.memory_max, json!(4u64 << 30));
    }
}

#[test]
fn a_manifest_without_kind_is_an_error_naming_it() {
    let yaml = "spec: {containers: [{name: a}]}";
    let err = explain(yaml, &NODE, &PolicyConfig::default())
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("kind: missing"), "{err}");
}

#[test]
fn huge_requests_saturate_instead_of_wrapping() {
    let r = one("metadata: {name: h}\nspec:\n  resources:\n    requests: {memory: 8Ei}\n  containers:\n  - name: a\n    resources: {requests: {memory: 8Ei}}\n  - name: b\n    resources: {requests: {memory: 8Ei}}\n");
    assert_eq!(r.containers.len(), 2);
}

#[test]
fn node_critical_and_systemd_paths() {
    let yaml = "kind: Pod\nmetadata: {name: c, uid: a-b}\nspec:\n  priorityClassName: system-node-critical\n  containers:\n  - name: app\n    resources: {requests: {memory: 256Mi}}\n";
    let node = NodeSpec {
        driver: Driver::Systemd,
        ..NODE
    };
    let r = explain(yaml, &node, &PolicyConfig::default()).unwrap();
    assert_eq!(r.containers[0].oom_score_adj, -997);
    assert_eq!(
        r.containers[0].cgroup_path,
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda_b.slice/cri-containerd-<container-id>.scope"
    );
}

#[test]
fn besteffort_gets_memory_high_from_allocatable() {
    let r = one("metadata: {name: e}\nspec:\n  containers:\n  - name: app\n");
    assert_eq!(r.qos_class, QosClass::BestEffort);
    let c = &r.containers[0];
    assert_eq!(c.oom_score_adj, 1000);
    assert_eq!(c.memory_high, json!(14_495_514_624u64));
    assert_eq!(c.cpu_weight, 1);
    assert!(c.throttle_guard);
    assert!(render_table(&r).contains("throttle guard (app)"));
}

#[test]
fn big_nodes_table_is_computed() {
    let table = inversion_table(&[16, 64, 128, 256, 512]);
    let doc = include_str!("../../docs/policy.md");
    assert!(
        doc.contains(&table),
        "docs/policy.md must carry this table (section \"Big nodes\"):\n{table}"
    );
    // §5: 16 GiB → ~17 MB resolution.
    assert!(table.contains("| 16 GiB | 16.4 MiB |"), "{table}");
}

const ROW4: &str = "metadata: {name: b}\nspec:\n  containers:\n  - name: app\n    resources:\n      requests: {cpu: 100m, memory: 128Mi}\n      limits: {cpu: 500m, memory: 512Mi}\n";

fn with_kubelet(version: &str, mode: KubeletMode, factor: Option<f64>) -> PodReport {
    let k = KubeletMemoryQosSim::for_version(version, Some(mode), factor).unwrap();
    let yaml = format!("kind: Pod\n{ROW4}");
    explain_with(&yaml, &NODE, &PolicyConfig::default(), &k, false).unwrap()
}

#[test]
fn inverted_requests_are_shown_as_the_interval_they_lie_in() {
    let c = &one(ROW4).containers[0];
    // §5 route 2: adj 993 on 16 GiB → [120.3 MB, 137.4 MB).
    assert_eq!(
        c.memory_request_range,
        Some((120_259_085, Some(137_438_954)))
    );
    assert!(render_table(&one(ROW4)).contains(".."));
}

#[test]
fn kubelet_memory_qos_values_are_marked_and_never_replaced() {
    let owner = |r: &PodReport, k: &str| r.containers[0].set_by[k];
    // 1.37 TieredReservation, no factor: memory.low is the kubelet's,
    // exact; memory.high is ours (the kubelet sets none).
    let r = with_kubelet("1.37", KubeletMode::Tiered, None);
    let c = &r.containers[0];
    assert_eq!(c.memory_low, 128 << 20);
    assert_eq!(c.memory_request_source, RequestSource::UnifiedMemoryLow);
    assert_eq!(c.memory_request_range, None);
    assert_eq!(owner(&r, "memory.low"), Owner::Kubelet);
    assert_eq!(owner(&r, "memory.high"), Owner::NriQos);
    assert_eq!(c.memory_high, json!(496_603_136u64));
    assert_eq!(r.pod_cgroup["owner"], "kubelet");
    assert_eq!(r.pod_cgroup["memoryLow"], 128u64 << 20);
    // With factor 0.9 the kubelet's memory.high stands.
    let r = with_kubelet("1.37", KubeletMode::Tiered, Some(0.9));
    assert_eq!(owner(&r, "memory.high"), Owner::Kubelet);
    assert_eq!(r.containers[0].memory_high, json!(496_603_136u64));
    // 1.34 alpha: memory.min and memory.high (0.9 default) are the kubelet's.
    let r = with_kubelet("1.34", KubeletMode::Alpha, None);
    assert_eq!(r.containers[0].memory_min, 128 << 20);
    assert_eq!(r.containers[0].memory_low, 0);
    assert_eq!(owner(&r, "memory.min"), Owner::Kubelet);
    assert_eq!(owner(&r, "memory.high"), Owner::Kubelet);
    assert_eq!(owner(&r, "cpu.weight"), Owner::NriQos);
    // No Memory QoS: everything as before, ours.
    let r = with_kubelet("1.37", KubeletMode::None, None);
    assert_eq!(owner(&r, "memory.low"), Owner::NriQos);
    assert_eq!(r.pod_cgroup["owner"], "nri-qos");
    // Versions and modes that do not exist together are refused.
    assert!(KubeletMemoryQosSim::for_version("1.37", Some(KubeletMode::Alpha), None).is_err());
    assert!(KubeletMemoryQosSim::for_version("1.35", Some(KubeletMode::Tiered), None).is_err());
    assert!(KubeletMemoryQosSim::for_version("x", None, None).is_err());
    assert!(
        KubeletMemoryQosSim::for_version("1.37", Some(KubeletMode::Tiered), Some(1.5)).is_err()
    );
}

#[test]
fn json_shape_is_stable() {
    let r = one("metadata: {name: g, namespace: ns}\nspec:\n  containers:\n  - name: app\n    resources: {limits: {cpu: '1', memory: 1Gi}}\n");
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["pod"], "ns/g");
    assert_eq!(v["qosClass"], "Guaranteed");
    for key in [
        "name",
        "init",
        "cgroupPath",
        "cpuShares",
        "cpuWeight",
        "cpuMax",
        "memoryMin",
        "memoryLow",
        "memoryHigh",
        "memoryMax",
        "oomScoreAdj",
    ] {
        assert!(v["containers"][0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(
        v["cgroupParent"],
        "/kubepods/pod00000000-0000-0000-0000-000000000000"
    );
    let k = &v["containers"][0]["kubelet"];
    for (key, want) in [
        ("cpuShares", json!(1024)),
        ("cpuQuota", json!(100_000)),
        ("cpuPeriod", json!(100_000)),
        ("memoryLimit", json!(1u64 << 30)),
        ("oomScoreAdj", json!(-997)),
    ] {
        assert_eq!(k[key], want, "kubelet.{key}");
    }
    assert!(render_table(&r).contains("Guaranteed"));
    // Keys added to the stable shape (keys are only ever added).
    for key in ["memoryRequestRange", "kubeletUnified", "setBy"] {
        assert!(v["containers"][0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["podCgroup"]["owner"], "nri-qos");
}

/// Explained for a plugin with the Kubernetes API source, the
/// request is the spec's exact one (source `api-server`), not the
/// oom_score_adj reading; without it, the output is as before.
#[test]
fn with_the_api_source_the_request_is_exact() {
    let yaml = "kind: Pod\nmetadata: {name: b}\nspec:\n  initContainers:\n  - name: init\n    resources: {requests: {memory: 300Mi}}\n  containers:\n  - name: app\n    resources:\n      requests: {cpu: 100m, memory: 128Mi}\n      limits: {cpu: 500m, memory: 512Mi}\n";
    let sim = KubeletMemoryQosSim::default();
    let api = explain_with(yaml, &NODE, &PolicyConfig::default(), &sim, true).unwrap();
    let app = api.containers.iter().find(|c| c.name == "app").unwrap();
    assert_eq!(app.memory_request_source, RequestSource::ApiServer);
    assert_eq!(app.memory_request, Some(128 << 20));
    assert_eq!(app.memory_low, 128 << 20);
    assert_eq!(app.memory_request_range, None);
    let init = api.containers.iter().find(|c| c.name == "init").unwrap();
    assert_eq!(init.memory_request, Some(300 << 20));
    assert_eq!(api.request_source.as_deref(), Some("api-server"));
    let table = render_table(&api);
    assert!(table.contains("request source: api-server"), "{table}");
    let json = serde_json::to_value(&api).unwrap();
    assert_eq!(json["requestSource"], "api-server");

    let runtime = explain_with(yaml, &NODE, &PolicyConfig::default(), &sim, false).unwrap();
    let app = runtime.containers.iter().find(|c| c.name == "app").unwrap();
    assert_eq!(app.memory_request_source, RequestSource::OomScoreAdj);
    assert_eq!(app.memory_low, 120_258_560);
    assert!(runtime.request_source.is_none());
    assert!(!render_table(&runtime).contains("request source"));
    assert!(serde_json::to_value(&runtime)
        .unwrap()
        .get("requestSource")
        .is_none());
    assert_eq!(
        runtime,
        explain(yaml, &NODE, &PolicyConfig::default()).unwrap()
    );
}

/// The keys a Synchronize reads for the kubelet's hidden Memory QoS
/// (`kubelet_may_set`) cover every key the simulated kubelet sets on a
/// container, in every version, mode, factor and class.
#[test]
fn the_kubelet_sets_no_container_key_the_synchronize_does_not_read() {
    const KEYS: [&str; 3] = ["memory.min", "memory.low", "memory.high"];
    let gib = 1u64 << 30;
    let mut seen = [false; 3];
    for minor in 22..=38 {
        for mode in [KubeletMode::None, KubeletMode::Alpha, KubeletMode::Tiered] {
            for factor in [None, Some(0.5), Some(0.9), Some(1.0)] {
                let version = format!("1.{minor}");
                let Ok(k) = KubeletMemoryQosSim::for_version(&version, Some(mode), factor) else {
                    continue;
                };
                for (class, request, limit) in [
                    (QosClass::Guaranteed, gib, Some(gib)),
                    (QosClass::Burstable, gib / 4, Some(gib)),
                    (QosClass::Burstable, gib / 4, None),
                    (QosClass::Burstable, 0, Some(gib)),
                    (QosClass::BestEffort, 0, None),
                ] {
                    let may = crate::nri::view::kubelet_may_set(class);
                    for key in k.unified(class, request, limit, &NODE).keys() {
                        let i = KEYS.iter().position(|k| k == key).unwrap();
                        assert!(may[i], "{version} {mode:?} {factor:?} {class:?}: {key}");
                        seen[i] = true;
                    }
                }
            }
        }
    }
    assert_eq!(seen, [true; 3], "the simulation sets every key somewhere");
}
