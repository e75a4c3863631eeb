//! The parts of a Kubernetes Pod manifest that decide its QoS class and
//! kernel values. Unknown fields are ignored, so real manifests (and whole
//! `kubectl get pod -o yaml` output) load as they are.
//!
//! YAML through `serde_norway`, the maintained fork of the archived
//! `serde_yaml` with the same API; `serde_path_to_error` turns a type error
//! into the path of the field (`spec.containers[1].resources`).

use std::collections::BTreeMap;

use serde::Deserialize;
use thiserror::Error;

use super::quantity::{self, QuantityError};
use crate::node::QosClass;

#[derive(Debug, Error)]
pub enum ManifestError {
    #[error("not YAML: {0}")]
    Yaml(#[source] serde_norway::Error),
    /// An API object that does not convert to a JSON value.
    #[error("not YAML: {0}")]
    Json(#[source] serde_json::Error),
    #[error("{path}: {message}")]
    Field { path: String, message: String },
    #[error("{path}: {source}")]
    Quantity {
        path: String,
        #[source]
        source: QuantityError,
    },
    #[error("kind is {0:?}, expected Pod")]
    NotAPod(String),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Pod {
    pub kind: String,
    pub metadata: Metadata,
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Metadata {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub annotations: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec {
    pub priority: Option<i32>,
    pub priority_class_name: String,
    /// Pod-level resources (KEP-2837).
    pub resources: Option<ResourceRequirements>,
    pub init_containers: Vec<Container>,
    pub containers: Vec<Container>,
    /// RuntimeClass overhead, added to the pod's request by the kubelet.
    pub overhead: BTreeMap<String, QuantityText>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Container {
    pub name: String,
    /// `Always` on an init container makes it a sidecar.
    pub restart_policy: Option<String>,
    pub resources: ResourceRequirements,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceRequirements {
    pub requests: BTreeMap<String, QuantityText>,
    pub limits: BTreeMap<String, QuantityText>,
}

/// A quantity as written: YAML may give `1` or `0.5` as numbers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum QuantityText {
    Text(String),
    Int(i64),
    Float(f64),
}

impl QuantityText {
    pub fn as_text(&self) -> String {
        match self {
            QuantityText::Text(s) => s.clone(),
            QuantityText::Int(i) => i.to_string(),
            QuantityText::Float(f) => f.to_string(),
        }
    }
}

/// CPU (millicores) and memory (bytes) of one requests or limits map;
/// `None` = not set; zero counts as not set, as in the kubelet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuMem {
    pub cpu_milli: Option<u64>,
    pub memory: Option<u64>,
}

/// Requests and limits with API defaulting applied (a limit without a
/// request makes the request equal the limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resolved {
    pub requests: CpuMem,
    pub limits: CpuMem,
}

fn resolve_map(map: &BTreeMap<String, QuantityText>, path: &str) -> Result<CpuMem, ManifestError> {
    let get = |key: &str, milli: bool| -> Result<Option<u64>, ManifestError> {
        let Some(q) = map.get(key) else {
            return Ok(None);
        };
        let text = q.as_text();
        let v = if milli {
            quantity::parse_milli(&text)
        } else {
            quantity::parse_bytes(&text)
        }
        .map_err(|source| ManifestError::Quantity {
            path: format!("{path}.{key}"),
            source,
        })?;
        Ok(Some(v).filter(|v| *v > 0))
    };
    Ok(CpuMem {
        cpu_milli: get("cpu", true)?,
        memory: get("memory", false)?,
    })
}

impl ResourceRequirements {
    pub fn resolve(&self, path: &str) -> Result<Resolved, ManifestError> {
        let limits = resolve_map(&self.limits, &format!("{path}.limits"))?;
        let mut requests = resolve_map(&self.requests, &format!("{path}.requests"))?;
        requests.cpu_milli = requests.cpu_milli.or(limits.cpu_milli);
        requests.memory = requests.memory.or(limits.memory);
        Ok(Resolved { requests, limits })
    }
}

impl Container {
    pub fn is_sidecar(&self) -> bool {
        self.restart_policy.as_deref() == Some("Always")
    }
}

/// Every container's own memory request (bytes, 0 when none; a limit
/// without a request counts as the request), init containers first, in
/// spec order, as `(name, request)`.
pub fn container_memory_requests(pod: &Pod) -> Result<Vec<(String, u64)>, ManifestError> {
    let mut out = Vec::new();
    for (i, c) in pod.spec.init_containers.iter().enumerate() {
        let r = c
            .resources
            .resolve(&format!("spec.initContainers[{i}].resources"))?;
        out.push((c.name.clone(), r.requests.memory.unwrap_or(0)));
    }
    for (i, c) in pod.spec.containers.iter().enumerate() {
        let r = c
            .resources
            .resolve(&format!("spec.containers[{i}].resources"))?;
        out.push((c.name.clone(), r.requests.memory.unwrap_or(0)));
    }
    Ok(out)
}

/// The pod's memory request as the kubelet's eviction manager counts it
/// (`resourcehelper.PodRequests`): regular containers and sidecars add up;
/// each init container needs its own request plus the sidecars started
/// before it, and the pod needs the larger of the two; pod-level requests
/// replace the sum; RuntimeClass overhead comes on top.
pub fn pod_memory_request(pod: &Pod) -> Result<u64, ManifestError> {
    let pod_level = match &pod.spec.resources {
        Some(r) => r.resolve("spec.resources")?.requests.memory,
        None => None,
    };
    let mut total = match pod_level {
        Some(m) => m,
        None => {
            let mut running: u64 = 0;
            for (i, c) in pod.spec.containers.iter().enumerate() {
                let r = c
                    .resources
                    .resolve(&format!("spec.containers[{i}].resources"))?;
                running = running.saturating_add(r.requests.memory.unwrap_or(0));
            }
            let (mut sidecars, mut init_peak) = (0u64, 0u64);
            for (i, c) in pod.spec.init_containers.iter().enumerate() {
                let own = c
                    .resources
                    .resolve(&format!("spec.initContainers[{i}].resources"))?
                    .requests
                    .memory
                    .unwrap_or(0);
                let need = if c.is_sidecar() {
                    running = running.saturating_add(own);
                    sidecars = sidecars.saturating_add(own);
                    sidecars
                } else {
                    own.saturating_add(sidecars)
                };
                init_peak = init_peak.max(need);
            }
            running.max(init_peak)
        }
    };
    if let Some(q) = pod.spec.overhead.get("memory") {
        let bytes =
            quantity::parse_bytes(&q.as_text()).map_err(|source| ManifestError::Quantity {
                path: "spec.overhead.memory".into(),
                source,
            })?;
        total = total.saturating_add(bytes);
    }
    Ok(total)
}

/// Parses a Pod manifest; errors name the offending field.
pub fn parse_pod(yaml: &str) -> Result<Pod, ManifestError> {
    let value: serde_norway::Value = serde_norway::from_str(yaml).map_err(ManifestError::Yaml)?;
    let pod: Pod = serde_path_to_error::deserialize(value).map_err(|e| ManifestError::Field {
        path: e.path().to_string(),
        message: e.into_inner().to_string(),
    })?;
    if !pod.kind.is_empty() && pod.kind != "Pod" {
        return Err(ManifestError::NotAPod(pod.kind));
    }
    if pod.spec.containers.is_empty() {
        return Err(ManifestError::Field {
            path: "spec.containers".into(),
            message: "a pod needs at least one container".into(),
        });
    }
    Ok(pod)
}

/// kubelet `ComputePodQOS`, including pod-level resources (KEP-2837).
pub fn pod_qos(pod: &Pod) -> Result<(QosClass, String), ManifestError> {
    if let Some(r) = &pod.spec.resources {
        let r = r.resolve("spec.resources")?;
        let class = resolved_class(&r);
        return Ok((
            class,
            format!("pod-level resources decide ({})", class_rule(class)),
        ));
    }
    let mut classes = Vec::new();
    for (i, c) in pod.spec.init_containers.iter().enumerate() {
        classes.push(resolved_class(
            &c.resources
                .resolve(&format!("spec.initContainers[{i}].resources"))?,
        ));
    }
    for (i, c) in pod.spec.containers.iter().enumerate() {
        classes.push(resolved_class(
            &c.resources
                .resolve(&format!("spec.containers[{i}].resources"))?,
        ));
    }
    let all = |k| classes.iter().all(|c| *c == k);
    let class = if all(QosClass::Guaranteed) {
        QosClass::Guaranteed
    } else if all(QosClass::BestEffort) {
        QosClass::BestEffort
    } else {
        QosClass::Burstable
    };
    Ok((class, class_rule(class).to_string()))
}

fn class_rule(c: QosClass) -> &'static str {
    match c {
        QosClass::Guaranteed => "every container has CPU and memory limits equal to its requests",
        QosClass::BestEffort => "no container has CPU or memory requests or limits",
        QosClass::Burstable => "some requests are below their limits or some limits are missing",
    }
}

/// One container's (or the pod level's) class: G-like when CPU and memory
/// both have limits equal to requests, BE-like when nothing is set.
fn resolved_class(r: &Resolved) -> QosClass {
    let none = r.requests == CpuMem::default() && r.limits == CpuMem::default();
    if none {
        return QosClass::BestEffort;
    }
    let g = |req: Option<u64>, lim: Option<u64>| lim.is_some() && req == lim;
    if g(r.requests.cpu_milli, r.limits.cpu_milli) && g(r.requests.memory, r.limits.memory) {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_strings_both_parse() {
        let pod = parse_pod(
            "kind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - name: c\n    resources:\n      limits: {cpu: 1, memory: 1Gi}\n      requests: {cpu: 0.5}\n",
        )
        .unwrap();
        let r = pod.spec.containers[0].resources.resolve("x").unwrap();
        assert_eq!(r.requests.cpu_milli, Some(500));
        assert_eq!(r.requests.memory, Some(1 << 30)); // defaulted to the limit
        assert_eq!(r.limits.cpu_milli, Some(1000));
    }

    #[test]
    fn pod_request_follows_the_kubelet_rules() {
        let pod = |spec: &str| parse_pod(&format!("spec:\n{spec}")).unwrap();
        // Regular containers add up.
        let p = pod("  containers:\n  - {name: a, resources: {requests: {memory: 100Mi}}}\n  - {name: b, resources: {limits: {memory: 50Mi}}}\n");
        assert_eq!(pod_memory_request(&p).unwrap(), 150 << 20);
        // A big init container decides; a sidecar adds to both sides.
        let p = pod("  initContainers:\n  - {name: side, restartPolicy: Always, resources: {requests: {memory: 10Mi}}}\n  - {name: init, resources: {requests: {memory: 500Mi}}}\n  containers:\n  - {name: a, resources: {requests: {memory: 100Mi}}}\n");
        assert_eq!(pod_memory_request(&p).unwrap(), 510 << 20);
        let p = pod("  initContainers:\n  - {name: init, resources: {requests: {memory: 50Mi}}}\n  - {name: side, restartPolicy: Always, resources: {requests: {memory: 10Mi}}}\n  containers:\n  - {name: a, resources: {requests: {memory: 100Mi}}}\n");
        assert_eq!(pod_memory_request(&p).unwrap(), 110 << 20);
        // Pod-level requests replace the sum; overhead comes on top.
        let p = pod("  resources: {requests: {memory: 1Gi}}\n  overhead: {memory: 64Mi}\n  containers:\n  - {name: a, resources: {requests: {memory: 100Mi}}}\n");
        assert_eq!(pod_memory_request(&p).unwrap(), (1 << 30) + (64 << 20));
        assert_eq!(
            container_memory_requests(&p).unwrap(),
            vec![("a".to_string(), 100 << 20)]
        );
    }

    #[test]
    fn errors_name_the_field() {
        let err = parse_pod("kind: Pod\nspec:\n  containers:\n  - name: c\n    resources: 7\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("spec.containers[0].resources"), "{err}");
        let pod = parse_pod(
            "kind: Pod\nspec:\n  containers:\n  - name: a\n  - name: b\n    resources:\n      limits: {memory: 12x}\n",
        )
        .unwrap();
        let err = pod.spec.containers[1]
            .resources
            .resolve("spec.containers[1].resources")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "spec.containers[1].resources.limits.memory: invalid quantity \"12x\""
        );
        assert!(parse_pod("kind: Service\nspec: {containers: [{name: a}]}").is_err());
        assert!(parse_pod("kind: Pod\nspec: {containers: []}").is_err());
        assert!(parse_pod(": : :").is_err());
    }
}
