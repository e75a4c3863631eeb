//! Scenario pods given as Kubernetes Pod manifests: `nri-qos explain` (the
//! library code the command runs) computes what the kubelet would send the
//! runtime for them, which is what the client sends, and what the kernel must
//! end up with when nri-qos runs, which is what the client checks.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use nri_qos::explain::{self, ContainerReport, NodeSpec, PodReport};
use nri_qos::node::layout::Driver;
use nri_qos::qos::formulas as f;
use nri_qos::qos::pod::{parse_pod, Pod, Resolved};
use nri_qos::qos::{PolicyConfig, QosClass};
use serde_json::Value;

use crate::{ContainerSpec, PodResize, PodSpec, Resources};

/// Expected kernel values per result key (`pod/ctr`, `pod/ctr@updated`).
pub type Expected = BTreeMap<String, BTreeMap<String, String>>;

/// The VM as `nri-qos` sees it: MemTotal is capacity and allocatable (the
/// plugin's default `memory-allocatable = 0`), cgroupfs driver, cgroup v2.
fn node(mem_total: u64) -> NodeSpec {
    NodeSpec {
        memory_capacity: mem_total,
        memory_allocatable: mem_total,
        page_size: 4096,
        driver: Driver::Cgroupfs,
        cgroup_v2: true,
    }
}

/// Reads a manifest and sets the scenario's name and uid on it, so one
/// manifest can serve several scenarios (each with its own pod cgroup).
fn load(path: &Path, name: &str, uid: &str) -> Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut v: serde_norway::Value =
        serde_norway::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let meta = v
        .get_mut("metadata")
        .and_then(|m| m.as_mapping_mut())
        .with_context(|| format!("{}: no metadata", path.display()))?;
    for (key, value) in [("name", name), ("uid", uid)] {
        if !value.is_empty() {
            meta.insert(key.into(), value.into());
        }
    }
    Ok(serde_norway::to_string(&v)?)
}

fn explain_file(
    path: &Path,
    name: &str,
    uid: &str,
    mem_total: u64,
    api_server: bool,
) -> Result<(String, PodReport)> {
    let yaml = load(path, name, uid)?;
    let kubelet = explain::KubeletMemoryQosSim::default();
    let report = explain::explain_with(
        &yaml,
        &node(mem_total),
        &PolicyConfig::default(),
        &kubelet,
        api_server,
    )
    .with_context(|| format!("explaining {}", path.display()))?;
    Ok((yaml, report))
}

fn value_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The kernel values explain predicts for one container.
fn predicted(c: &ContainerReport) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cpu.weight".into(), c.cpu_weight.to_string()),
        ("cpu.max".into(), c.cpu_max.clone()),
        ("memory.min".into(), c.memory_min.to_string()),
        ("memory.low".into(), c.memory_low.to_string()),
        ("memory.high".into(), value_str(&c.memory_high)),
        ("memory.max".into(), value_str(&c.memory_max)),
        ("oom_score_adj".into(), c.oom_score_adj.to_string()),
    ])
}

/// The kubelet's memory.swap.max and memory.oom.group as the kernel holds
/// them (nri-qos never writes either): memory.swap.max in whole pages.
fn kernel_unified(unified: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(v) = unified.get("memory.oom.group") {
        out.insert("memory.oom.group".into(), v.clone());
    }
    if let Some(b) = unified
        .get("memory.swap.max")
        .and_then(|v| v.parse::<u64>().ok())
    {
        out.insert("memory.swap.max".into(), (b - b % 4096).to_string());
    }
    out
}

/// The node's swap as the kubelet sees it (`memorySwap.swapBehavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swap {
    /// NoSwap, the default: memory.swap.max 0 for every container.
    NoSwap,
    /// LimitedSwap with this much swap on the node (SwapTotal, bytes).
    Limited { swap_total: u64 },
}

/// The `unified` keys a 1.36 kubelet sends on cgroup v2 (kuberuntime
/// `calculateLinuxResources`, `configureContainerSwapResources`):
/// memory.oom.group 1 and memory.swap.max, 0 unless LimitedSwap gives a
/// Burstable container whose memory request is set and below its limit
/// request / MemTotal × SwapTotal (`calcSwapForBurstablePods`).
fn kubelet_unified(
    class: QosClass,
    r: &Resolved,
    mem_total: u64,
    swap: Swap,
) -> BTreeMap<String, String> {
    let request = r.requests.memory.unwrap_or(0);
    let swap_max = match swap {
        Swap::Limited { swap_total }
            if class == QosClass::Burstable
                && request > 0
                && Some(request) != r.limits.memory
                && request <= mem_total =>
        {
            (request as f64 / mem_total as f64 * swap_total as f64) as u64
        }
        _ => 0,
    };
    BTreeMap::from([
        ("memory.oom.group".into(), "1".into()),
        ("memory.swap.max".into(), swap_max.to_string()),
    ])
}

fn kubelet_resources(c: &ContainerReport, unified: &BTreeMap<String, String>) -> Resources {
    let k = &c.kubelet;
    Resources {
        cpu_shares: k.cpu_shares as i64,
        cpu_quota: k.cpu_quota,
        cpu_period: k.cpu_period as i64,
        memory_limit: k.memory_limit.min(i64::MAX as u64) as i64,
        oom_score_adj: Some(k.oom_score_adj),
        memory_request: None,
        cpuset_cpus: String::new(),
        unified: unified.clone().into_iter().collect(),
    }
}

/// Each container's requests and limits as the API server has them.
fn resolved(pod: &Pod) -> Result<BTreeMap<String, Resolved>> {
    let all = pod.spec.init_containers.iter().chain(&pod.spec.containers);
    all.map(|c| Ok((c.name.clone(), c.resources.resolve(&c.name)?)))
        .collect()
}

/// A pod with pod-level resources (KEP-2837): the kubelet's sandbox
/// `LinuxPodSandboxConfig.resources` (and UpdatePodSandboxResources'
/// `resources`: CPU shares from the request, quota from the limit, the
/// memory limit), and the pod cgroup values it writes before the sandbox
/// and on a resize (cpu.weight by its linear conversion).
fn pod_level(pod: &Pod) -> Result<Option<(Resources, BTreeMap<String, String>)>> {
    let Some(r) = &pod.spec.resources else {
        return Ok(None);
    };
    let r = r.resolve("spec.resources")?;
    let shares = f::milli_cpu_to_shares(r.requests.cpu_milli.unwrap_or(0));
    let quota = f::milli_cpu_to_quota(r.limits.cpu_milli.unwrap_or(0), f::QUOTA_PERIOD);
    let limit = r.limits.memory.unwrap_or(0);
    let resources = Resources {
        cpu_shares: shares as i64,
        cpu_quota: quota,
        cpu_period: f::QUOTA_PERIOD as i64,
        memory_limit: limit.min(i64::MAX as u64) as i64,
        ..Resources::default()
    };
    let or_max = |v: u64| {
        if v > 0 {
            v.to_string()
        } else {
            "max".into()
        }
    };
    let cgroup = BTreeMap::from([
        (
            "cpu.weight".into(),
            f::cpu_weight_linear(shares).to_string(),
        ),
        (
            "cpu.max".into(),
            format!("{} {}", or_max(quota.max(0) as u64), f::QUOTA_PERIOD),
        ),
        ("memory.max".into(), or_max(limit)),
    ]);
    Ok(Some((resources, cgroup)))
}

/// Replaces a manifest pod by the concrete pod the kubelet would run, and
/// returns what explain predicts for its containers. Containers listed in the
/// scenario under the same name keep their command, mounts, annotations,
/// extra `unified` keys and `expect` overrides. `api_server`: predicted for
/// a plugin with the Kubernetes API source (exact requests).
pub fn expand(
    pod: &mut PodSpec,
    scenario_dir: &Path,
    mem_total: u64,
    api_server: bool,
    swap: Swap,
) -> Result<Expected> {
    let Some(manifest) = pod.manifest.clone() else {
        return Ok(Expected::new());
    };
    let (yaml, report) = explain_file(
        &scenario_dir.join(&manifest),
        &pod.name,
        &pod.uid,
        mem_total,
        api_server,
    )?;
    let parsed = parse_pod(&yaml)?;
    let requests = resolved(&parsed)?;
    if let Some((resources, cgroup)) = pod_level(&parsed)? {
        pod.resources = Some(resources);
        pod.pod_cgroup = cgroup;
    }
    let overrides: BTreeMap<String, ContainerSpec> = std::mem::take(&mut pod.containers)
        .into_iter()
        .map(|c| (c.name.clone(), c))
        .collect();
    for name in overrides.keys() {
        if !report.containers.iter().any(|c| &c.name == name) {
            bail!("{manifest}: the scenario lists container {name:?}, the manifest has none");
        }
    }
    pod.name = parsed.metadata.name.clone();
    pod.uid = parsed.metadata.uid.clone();
    if !parsed.metadata.namespace.is_empty() {
        pod.namespace = parsed.metadata.namespace.clone();
    }
    pod.annotations.extend(parsed.metadata.annotations.clone());
    pod.labels.extend(parsed.metadata.labels.clone());
    if !pod.cgroup_parent.is_empty() && pod.cgroup_parent != report.cgroup_parent {
        bail!(
            "{manifest}: cgroup_parent {} in the scenario, {} from the manifest",
            pod.cgroup_parent,
            report.cgroup_parent
        );
    }
    pod.cgroup_parent = report.cgroup_parent.clone();

    let resized = match &pod.resize_manifest {
        Some(m) => Some(
            explain_file(
                &scenario_dir.join(m),
                &pod.name,
                &pod.uid,
                mem_total,
                api_server,
            )?
            .1,
        ),
        None => None,
    };

    let mut expected = Expected::new();
    // The pod cgroup's protection is complete once its last long-running
    // container exists: checked with that one.
    let last_running = report.containers.iter().rposition(|c| !c.init || c.sidecar);
    for (i, c) in report.containers.iter().enumerate() {
        let mut spec = overrides
            .get(&c.name)
            .cloned()
            .unwrap_or_else(|| ContainerSpec {
                name: c.name.clone(),
                ..ContainerSpec::default()
            });
        let run_to_completion = c.init && !c.sidecar;
        if run_to_completion && spec.command == crate::default_command() {
            spec.command = vec!["/bin/true".into()];
        }
        spec.run_to_completion = run_to_completion;
        let mut unified = kubelet_unified(report.qos_class, &requests[&c.name], mem_total, swap);
        // the scenario's keys (the kubelet's Memory QoS) on top
        unified.extend(spec.resources.unified.clone());
        spec.resources = kubelet_resources(c, &unified);
        let key = format!("{}/{}", pod.name, c.name);
        let mut want = predicted(c);
        want.extend(kernel_unified(&unified));
        if Some(i) == last_running {
            for (file, field) in [
                ("pod:memory.min", "memoryMin"),
                ("pod:memory.low", "memoryLow"),
            ] {
                want.insert(file.into(), value_str(&report.pod_cgroup[field]));
            }
        }
        if let Some(r) = resized.as_ref() {
            let Some(rc) = r.containers.iter().find(|rc| rc.name == c.name) else {
                bail!("{}: the resized pod lost container {}", manifest, c.name);
            };
            if rc.kubelet != c.kubelet {
                // oom_score_adj cannot change on a running container, and the
                // plugin reads the memory request from it: a resize that
                // changes the request is not something the kubelet can apply.
                if rc.kubelet.oom_score_adj != c.kubelet.oom_score_adj {
                    bail!(
                        "{}: the resize changes {}'s memory request (oom_score_adj {} -> {})",
                        manifest,
                        c.name,
                        c.kubelet.oom_score_adj,
                        rc.kubelet.oom_score_adj
                    );
                }
                spec.update = Some(kubelet_resources(rc, &unified));
                let mut after = predicted(rc);
                after.extend(kernel_unified(&unified));
                for (k, v) in &spec.expect_updated {
                    after.insert(k.clone(), v.clone());
                }
                expected.insert(format!("{key}@updated"), after);
            }
        }
        for (k, v) in &spec.expect {
            want.insert(k.clone(), v.clone());
        }
        if !run_to_completion {
            expected.insert(key, want);
        }
        pod.containers.push(spec);
    }
    if let Some(m) = pod.pod_resize_manifest.clone() {
        let (resize, after) = pod_resize(
            pod,
            &scenario_dir.join(&m),
            &report,
            mem_total,
            api_server,
            swap,
        )
        .with_context(|| format!("pod-level resize {m}"))?;
        pod.pod_resize = Some(resize);
        expected.extend(after);
    }
    Ok(expected)
}

/// The kubelet's pod-level resize to the manifest at `path` (the same pod
/// with other pod-level resources): its pod cgroup values and
/// UpdatePodSandboxResources, the UpdateContainerResources of every
/// container whose CRI values follow (a container without its own limit
/// takes the pod's), and what explain predicts then (`pod/ctr@pod-resized`).
fn pod_resize(
    pod: &PodSpec,
    path: &Path,
    before: &PodReport,
    mem_total: u64,
    api_server: bool,
    swap: Swap,
) -> Result<(PodResize, Expected)> {
    let (yaml, report) = explain_file(path, &pod.name, &pod.uid, mem_total, api_server)?;
    let parsed = parse_pod(&yaml)?;
    let Some((resources, cgroup)) = pod_level(&parsed)? else {
        bail!("the resized pod has no pod-level resources");
    };
    if report.qos_class != before.qos_class {
        bail!(
            "a resize never changes the QoS class ({:?} -> {:?})",
            before.qos_class,
            report.qos_class
        );
    }
    let requests = resolved(&parsed)?;
    let last_running = report.containers.iter().rposition(|c| !c.init || c.sidecar);
    let mut containers = BTreeMap::new();
    let mut expected = Expected::new();
    for (i, rc) in report.containers.iter().enumerate() {
        let Some(c) = before.containers.iter().find(|c| c.name == rc.name) else {
            bail!(
                "the resized pod has a container {} the pod has not",
                rc.name
            );
        };
        if rc.init && !rc.sidecar {
            continue;
        }
        if rc.kubelet != c.kubelet {
            if rc.kubelet.oom_score_adj != c.kubelet.oom_score_adj {
                bail!(
                    "the resize changes {}'s memory request (oom_score_adj {} -> {})",
                    rc.name,
                    c.kubelet.oom_score_adj,
                    rc.kubelet.oom_score_adj
                );
            }
            let mut unified =
                kubelet_unified(report.qos_class, &requests[&rc.name], mem_total, swap);
            let extra = pod.containers.iter().find(|s| s.name == rc.name);
            for (k, v) in extra.map(|s| &s.resources.unified).into_iter().flatten() {
                unified.entry(k.clone()).or_insert_with(|| v.clone());
            }
            containers.insert(rc.name.clone(), kubelet_resources(rc, &unified));
        }
        let mut want = predicted(rc);
        let unified = containers.get(&rc.name).map_or_else(
            || kubelet_unified(report.qos_class, &requests[&rc.name], mem_total, swap),
            |r: &Resources| r.unified.clone().into_iter().collect(),
        );
        want.extend(kernel_unified(&unified));
        if Some(i) == last_running {
            for (file, field) in [
                ("pod:memory.min", "memoryMin"),
                ("pod:memory.low", "memoryLow"),
            ] {
                want.insert(file.into(), value_str(&report.pod_cgroup[field]));
            }
        }
        expected.insert(format!("{}/{}@pod-resized", pod.name, rc.name), want);
    }
    let resize = PodResize {
        resources,
        pod_cgroup: cgroup,
        containers,
    };
    Ok((resize, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BURSTABLE: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  uid: \"2222\"\nspec:\n  initContainers:\n  - name: proxy\n    restartPolicy: Always\n    resources: {requests: {cpu: 100m, memory: 64Mi}}\n  containers:\n  - name: app\n    resources:\n      requests: {cpu: 250m, memory: 256Mi}\n      limits: {cpu: 500m, memory: 512Mi}\n";

    fn pod_from(yaml: &str) -> (tempfile::TempDir, PodSpec) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.yaml"), yaml).unwrap();
        let pod: PodSpec = serde_json::from_str(r#"{"manifest": "p.yaml"}"#).unwrap();
        (dir, pod)
    }

    #[test]
    fn a_manifest_becomes_the_kubelet_request_and_the_prediction() {
        let (dir, mut pod) = pod_from(BURSTABLE);
        let expected = expand(&mut pod, dir.path(), 2_074_652_672, false, Swap::NoSwap).unwrap();
        assert_eq!(pod.name, "web");
        assert_eq!(pod.cgroup_parent, "/kubepods/burstable/pod2222");
        let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["proxy", "app"]);
        let app = &pod.containers[1].resources;
        assert_eq!(
            (app.cpu_shares, app.cpu_quota, app.memory_limit),
            (256, 50_000, 512 << 20)
        );
        // kubelet: 1000 - 1000*256Mi/MemTotal
        assert_eq!(app.oom_score_adj, Some(871));
        let want = &expected["web/app"];
        assert_eq!(want["cpu.weight"], "35");
        assert_eq!(want["memory.max"], "536870912");
        assert_eq!(
            want["pod:memory.low"],
            expected["web/app"]["pod:memory.low"]
        );
        assert!(!expected["web/proxy"].contains_key("pod:memory.low"));
    }

    #[test]
    fn scenario_overrides_name_uid_and_expectations() {
        let (dir, mut pod) = pod_from(BURSTABLE);
        pod.uid = "6666".into();
        pod.name = "kl-web".into();
        pod.containers = vec![serde_json::from_str(
            r#"{"name": "app", "unified": {"memory.min": "1"}, "expect": {"memory.min": "1"}}"#,
        )
        .unwrap()];
        let expected = expand(&mut pod, dir.path(), 2_074_652_672, false, Swap::NoSwap).unwrap();
        assert_eq!(pod.cgroup_parent, "/kubepods/burstable/pod6666");
        assert_eq!(expected["kl-web/app"]["memory.min"], "1");
        assert_eq!(pod.containers[1].resources.unified["memory.min"], "1");
    }

    #[test]
    fn a_resize_that_changes_the_memory_request_is_refused() {
        let (dir, mut pod) = pod_from(BURSTABLE);
        std::fs::write(
            dir.path().join("r.yaml"),
            BURSTABLE.replace("memory: 256Mi", "memory: 300Mi"),
        )
        .unwrap();
        pod.resize_manifest = Some("r.yaml".into());
        let err = expand(&mut pod, dir.path(), 2_074_652_672, false, Swap::NoSwap).unwrap_err();
        assert!(format!("{err:#}").contains("memory request"), "{err:#}");
    }

    const MEM: u64 = 2_074_652_672;

    #[test]
    fn the_kubelet_sends_oom_group_and_swap_max_limited_swap_for_burstable_only() {
        let (dir, mut pod) = pod_from(BURSTABLE);
        let swap = Swap::Limited {
            swap_total: 1 << 30,
        };
        let expected = expand(&mut pod, dir.path(), MEM, false, swap).unwrap();
        let app = &pod.containers[1].resources.unified;
        assert_eq!(app["memory.oom.group"], "1");
        // calcSwapForBurstablePods: int64(256Mi / MemTotal * 1Gi)
        let want = ((256u64 << 20) as f64 / MEM as f64 * (1u64 << 30) as f64) as u64;
        assert_eq!(app["memory.swap.max"], want.to_string());
        // the kernel keeps whole pages
        assert_eq!(
            expected["web/app"]["memory.swap.max"],
            (want - want % 4096).to_string()
        );
        // the sidecar's request equals no limit: Burstable, so it gets swap too
        assert_ne!(pod.containers[0].resources.unified["memory.swap.max"], "0");
        // NoSwap: 0 everywhere
        let (dir, mut pod) = pod_from(BURSTABLE);
        expand(&mut pod, dir.path(), MEM, false, Swap::NoSwap).unwrap();
        assert!(pod
            .containers
            .iter()
            .all(|c| c.resources.unified["memory.swap.max"] == "0"));
        // Guaranteed: none under LimitedSwap either
        let guaranteed = "apiVersion: v1\nkind: Pod\nmetadata: {name: g, uid: \"3\"}\nspec:\n  containers:\n  - name: app\n    resources: {limits: {cpu: 100m, memory: 128Mi}}\n";
        let (dir, mut pod) = pod_from(guaranteed);
        let expected = expand(&mut pod, dir.path(), MEM, false, swap).unwrap();
        assert_eq!(pod.containers[0].resources.unified["memory.swap.max"], "0");
        assert_eq!(expected["g/app"]["memory.swap.max"], "0");
    }

    const POD_LEVEL: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: pl, uid: \"29\"}\nspec:\n  resources:\n    requests: {cpu: 500m, memory: 256Mi}\n    limits: {cpu: \"1\", memory: 512Mi}\n  containers:\n  - name: app\n  - name: side\n    resources:\n      requests: {cpu: 50m, memory: 64Mi}\n      limits: {cpu: 100m, memory: 128Mi}\n";

    #[test]
    fn pod_level_resources_reach_the_sandbox_and_the_pod_cgroup() {
        let (dir, mut pod) = pod_from(POD_LEVEL);
        expand(&mut pod, dir.path(), MEM, false, Swap::NoSwap).unwrap();
        let r = pod.resources.as_ref().unwrap();
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.cpu_period),
            (512, 100_000, 100_000)
        );
        assert_eq!(r.memory_limit, 512 << 20);
        assert_eq!(pod.pod_cgroup["memory.max"], (512u64 << 20).to_string());
        assert_eq!(pod.pod_cgroup["cpu.max"], "100000 100000");
        assert_eq!(pod.pod_cgroup["cpu.weight"], "20");
        // app has no limits of its own: it gets the pod's
        assert_eq!(pod.containers[0].resources.memory_limit, 512 << 20);
        assert_eq!(pod.containers[1].resources.memory_limit, 128 << 20);
    }

    #[test]
    fn a_pod_level_resize_updates_the_containers_that_follow_the_pod() {
        let (dir, mut pod) = pod_from(POD_LEVEL);
        std::fs::write(
            dir.path().join("r.yaml"),
            POD_LEVEL.replace(
                "limits: {cpu: \"1\", memory: 512Mi}",
                "limits: {cpu: \"2\", memory: 768Mi}",
            ),
        )
        .unwrap();
        pod.pod_resize_manifest = Some("r.yaml".into());
        let expected = expand(&mut pod, dir.path(), MEM, false, Swap::NoSwap).unwrap();
        let r = pod.pod_resize.as_ref().unwrap();
        assert_eq!(r.resources.memory_limit, 768 << 20);
        assert_eq!(r.resources.cpu_quota, 200_000);
        assert_eq!(r.pod_cgroup["memory.max"], (768u64 << 20).to_string());
        // app follows the pod's limits; side keeps its own and is not updated
        assert_eq!(r.containers.keys().collect::<Vec<_>>(), ["app"]);
        assert_eq!(r.containers["app"].memory_limit, 768 << 20);
        assert_eq!(r.containers["app"].unified["memory.oom.group"], "1");
        assert_eq!(expected["pl/app@pod-resized"]["memory.max"], "805306368");
        assert_eq!(expected["pl/side@pod-resized"]["memory.max"], "134217728");
        assert!(expected["pl/side@pod-resized"].contains_key("pod:memory.low"));
    }

    #[test]
    fn a_resize_updates_only_what_changed() {
        let (dir, mut pod) = pod_from(BURSTABLE);
        std::fs::write(
            dir.path().join("r.yaml"),
            BURSTABLE.replace("memory: 512Mi", "memory: 768Mi"),
        )
        .unwrap();
        pod.resize_manifest = Some("r.yaml".into());
        let expected = expand(&mut pod, dir.path(), 2_074_652_672, false, Swap::NoSwap).unwrap();
        assert!(pod.containers[0].update.is_none());
        assert_eq!(
            pod.containers[1].update.as_ref().unwrap().memory_limit,
            768 << 20
        );
        assert_eq!(expected["web/app@updated"]["memory.max"], "805306368");
    }
}
