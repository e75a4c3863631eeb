//! The few facts we keep per pod from the API server, computed once when the
//! watch delivers the pod: memory stays bounded by the node's pod count and
//! the hooks read a ready answer.

#[cfg(feature = "kube")]
use k8s_openapi::api::core::v1::Pod as ApiObject;

use crate::node::registry::{PodInfo, RequestSource};
use crate::qos::pod::pod_qos;
use crate::qos::pod::{container_memory_requests, pod_memory_request, ManifestError, Pod};
use crate::qos::QosClass;

/// The kubelet's `IsCriticalPodBasedOnPriority` bound (`scheduling.SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Annotation the kubelet puts on the mirror pod of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Annotation saying where the kubelet got a pod from ("api" unless static).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";

/// One pod as the API server has it, reduced to what the policy and the
/// monitor use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiPodFacts {
    /// The UID the runtime and the cgroup paths know: the API UID, except
    /// for a mirror pod, whose static pod runs under the kubelet's config
    /// hash (the mirror annotation's value).
    pub runtime_uid: String,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `spec.priority` (`None` = 0 to the kubelet).
    pub priority: Option<i32>,
    /// Static or mirror pod.
    pub static_pod: bool,
    pub class: QosClass,
    /// The pod's memory request the way the kubelet's eviction manager
    /// counts it (init max rule, sidecars, pod-level resources, overhead).
    pub memory_request: u64,
    /// Each container's own memory request (0 = none), init containers too.
    pub containers: Vec<(String, u64)>,
}

impl ApiPodFacts {
    /// The container's own request, when the pod spec lists it.
    pub fn container_request(&self, name: &str) -> Option<u64> {
        self.containers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| *r)
    }

    /// The kubelet's `IsCriticalPod`: static, mirror, or priority ≥ 2·10⁹.
    pub fn critical(&self) -> bool {
        self.static_pod || self.priority.is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
    }

    /// What the monitor ranks by.
    pub fn pod_info(&self) -> PodInfo {
        PodInfo {
            uid: self.runtime_uid.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            priority: self.priority,
            memory_request: Some(self.memory_request),
            request_source: RequestSource::ApiServer,
            class: Some(self.class),
            static_pod: self.static_pod,
        }
    }
}

/// Reduces an API object. The requests go through the same manifest
/// reading `nri-qos explain` uses, so one piece of code knows the rules.
#[cfg(feature = "kube")]
pub fn from_api(obj: &ApiObject) -> Result<ApiPodFacts, ManifestError> {
    let value = serde_json::to_value(obj).map_err(ManifestError::Json)?;
    let pod: Pod = serde_path_to_error::deserialize(value).map_err(|e| ManifestError::Field {
        path: e.path().to_string(),
        message: e.into_inner().to_string(),
    })?;
    from_manifest(&pod)
}

/// [`from_api`] on an already parsed manifest.
pub fn from_manifest(pod: &Pod) -> Result<ApiPodFacts, ManifestError> {
    let annotations = &pod.metadata.annotations;
    let static_pod = annotations.contains_key(MIRROR_POD_ANNOTATION)
        || annotations
            .get(CONFIG_SOURCE_ANNOTATION)
            .is_some_and(|s| s != "api");
    Ok(ApiPodFacts {
        runtime_uid: annotations
            .get(MIRROR_POD_ANNOTATION)
            .unwrap_or(&pod.metadata.uid)
            .clone(),
        uid: pod.metadata.uid.clone(),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        priority: pod.spec.priority,
        static_pod,
        class: pod_qos(pod)?.0,
        memory_request: pod_memory_request(pod)?,
        containers: container_memory_requests(pod)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::pod::parse_pod;

    #[test]
    fn a_manifest_reduces_to_its_facts() {
        let pod = parse_pod(
            "metadata: {name: web, namespace: shop, uid: u-1, annotations: {kubernetes.io/config.mirror: x}}\nspec:\n  priority: 100\n  initContainers:\n  - {name: init, resources: {requests: {memory: 300Mi}}}\n  containers:\n  - {name: app, resources: {requests: {memory: 100Mi}, limits: {memory: 200Mi}}}\n",
        )
        .unwrap();
        let f = from_manifest(&pod).unwrap();
        assert_eq!(
            (f.priority, f.static_pod, f.class),
            (Some(100), true, QosClass::Burstable)
        );
        assert_eq!(f.memory_request, 300 << 20);
        assert_eq!(f.container_request("app"), Some(100 << 20));
        assert_eq!(f.container_request("init"), Some(300 << 20));
        assert!(f.critical());
        assert_eq!((f.uid.as_str(), f.runtime_uid.as_str()), ("u-1", "x"));
        let info = f.pod_info();
        assert_eq!(info.request_source.to_string(), "api-server");
    }

    #[test]
    fn critical_by_priority_exactly_at_two_billion() {
        let mut f = from_manifest(&parse_pod("spec: {containers: [{name: a}]}").unwrap()).unwrap();
        f.priority = Some(SYSTEM_CRITICAL_PRIORITY - 1);
        assert!(!f.critical());
        f.priority = Some(SYSTEM_CRITICAL_PRIORITY);
        assert!(f.critical());
        assert_eq!(f.class, QosClass::BestEffort);
    }
}
