//! Scenario pods given as Kubernetes Pod manifests: `nri-qos explain` (the
//! library code the command runs) computes what the kubelet would send the
//! runtime for them, which is what the client sends, and what the kernel must
//! end up with when nri-qos runs, which is what the client checks.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use nri_qos::explain::{self, ContainerReport, NodeSpec, PodReport};
use nri_qos::node::layout::Driver;
use nri_qos::qos::pod::parse_pod;
use nri_qos::qos::PolicyConfig;
use serde_json::Value;

use crate::{ContainerSpec, PodSpec, Resources};

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
        spec.resources =
            kubelet_resources(c, &spec.resources.unified.clone().into_iter().collect());
        let key = format!("{}/{}", pod.name, c.name);
        let mut want = predicted(c);
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
                spec.update = Some(kubelet_resources(rc, &BTreeMap::new()));
                let mut after = predicted(rc);
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
    Ok(expected)
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
        let expected = expand(&mut pod, dir.path(), 2_074_652_672, false).unwrap();
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
        let expected = expand(&mut pod, dir.path(), 2_074_652_672, false).unwrap();
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
        let err = expand(&mut pod, dir.path(), 2_074_652_672, false).unwrap_err();
        assert!(format!("{err:#}").contains("memory request"), "{err:#}");
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
        let expected = expand(&mut pod, dir.path(), 2_074_652_672, false).unwrap();
        assert!(pod.containers[0].update.is_none());
        assert_eq!(
            pod.containers[1].update.as_ref().unwrap().memory_limit,
            768 << 20
        );
        assert_eq!(expected["web/app@updated"]["memory.max"], "805306368");
    }
}
