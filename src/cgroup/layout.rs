//! Where the kubelet puts pods: the pod-level and QoS-level cgroups for both
//! cgroup drivers, derived from a pod's CRI cgroup parent.

use std::path::PathBuf;

use crate::qos::QosClass;

/// The kubelet-owned cgroups above a pod's containers, relative to the
/// cgroup mount point, outermost first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodCgroups {
    /// `kubepods` or `kubepods.slice`.
    pub kubepods: PathBuf,
    /// `kubepods/burstable`, `kubepods.slice/kubepods-besteffort.slice`, or
    /// `None` for Guaranteed pods, which sit directly under kubepods.
    pub qos: Option<PathBuf>,
    /// The pod's own cgroup.
    pub pod: PathBuf,
    pub class: QosClass,
}

/// Parses a CRI cgroup parent of either driver. Returns `None` for layouts
/// that are not the kubelet's (crictl with a custom parent, other tools).
pub fn pod_cgroups(cgroup_parent: &str) -> Option<PodCgroups> {
    let trimmed = cgroup_parent.trim_matches('/');
    if trimmed.is_empty() {
        return None;
    }
    let last = trimmed.rsplit('/').next()?;
    if last.ends_with(".slice") {
        systemd(last)
    } else {
        cgroupfs(trimmed)
    }
}

fn valid_pod_name(name: &str) -> bool {
    name.len() > 3
        && name.starts_with("pod")
        && name[3..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// `/kubepods[/burstable|/besteffort]/pod<uid>`.
fn cgroupfs(path: &str) -> Option<PodCgroups> {
    let parts: Vec<&str> = path.split('/').collect();
    let (qos, pod) = match parts.as_slice() {
        ["kubepods", pod] => (None, *pod),
        ["kubepods", q @ ("burstable" | "besteffort"), pod] => (Some(*q), *pod),
        _ => return None,
    };
    if !valid_pod_name(pod) {
        return None;
    }
    let kubepods = PathBuf::from("kubepods");
    let class = match qos {
        None => QosClass::Guaranteed,
        Some("burstable") => QosClass::Burstable,
        Some(_) => QosClass::BestEffort,
    };
    let qos_path = qos.map(|q| kubepods.join(q));
    let pod_path = qos_path
        .clone()
        .unwrap_or_else(|| kubepods.clone())
        .join(pod);
    Some(PodCgroups {
        kubepods,
        qos: qos_path,
        pod: pod_path,
        class,
    })
}

/// `kubepods[-burstable|-besteffort]-pod<uid_>.slice`; systemd nests a slice
/// under every dash-separated prefix of its name.
fn systemd(slice: &str) -> Option<PodCgroups> {
    let name = slice.strip_suffix(".slice")?;
    let (qos, pod) = if let Some(rest) = name.strip_prefix("kubepods-burstable-") {
        (Some("burstable"), rest)
    } else if let Some(rest) = name.strip_prefix("kubepods-besteffort-") {
        (Some("besteffort"), rest)
    } else if let Some(rest) = name.strip_prefix("kubepods-") {
        (None, rest)
    } else {
        return None;
    };
    if !valid_pod_name(pod) || pod.contains('-') {
        return None;
    }
    let kubepods = PathBuf::from("kubepods.slice");
    let qos_path = qos.map(|q| kubepods.join(format!("kubepods-{q}.slice")));
    let pod_path = qos_path
        .clone()
        .unwrap_or_else(|| kubepods.clone())
        .join(slice);
    let class = match qos {
        None => QosClass::Guaranteed,
        Some("burstable") => QosClass::Burstable,
        Some(_) => QosClass::BestEffort,
    };
    Some(PodCgroups {
        kubepods,
        qos: qos_path,
        pod: pod_path,
        class,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroupfs_layouts() {
        let g = pod_cgroups("/kubepods/pod1234-ab").unwrap();
        assert_eq!(g.class, QosClass::Guaranteed);
        assert_eq!(g.pod, PathBuf::from("kubepods/pod1234-ab"));
        assert_eq!(g.qos, None);
        let b = pod_cgroups("/kubepods/burstable/podabc").unwrap();
        assert_eq!(b.class, QosClass::Burstable);
        assert_eq!(b.qos, Some(PathBuf::from("kubepods/burstable")));
        assert_eq!(b.pod, PathBuf::from("kubepods/burstable/podabc"));
        let e = pod_cgroups("kubepods/besteffort/podx/").unwrap();
        assert_eq!(e.class, QosClass::BestEffort);
    }

    #[test]
    fn systemd_layouts() {
        let b = pod_cgroups("kubepods-burstable-pod12_34.slice").unwrap();
        assert_eq!(b.class, QosClass::Burstable);
        assert_eq!(
            b.pod,
            PathBuf::from(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice"
            )
        );
        let g = pod_cgroups("/kubepods.slice/kubepods-pod99.slice").unwrap();
        assert_eq!(g.class, QosClass::Guaranteed);
        assert_eq!(g.pod, PathBuf::from("kubepods.slice/kubepods-pod99.slice"));
        assert_eq!(g.kubepods, PathBuf::from("kubepods.slice"));
        let e = pod_cgroups("kubepods-besteffort-podz.slice").unwrap();
        assert_eq!(
            e.qos,
            Some(PathBuf::from("kubepods.slice/kubepods-besteffort.slice"))
        );
    }

    #[test]
    fn unknown_layouts_are_none() {
        for p in [
            "",
            "/",
            "/system.slice",
            "/kubepods",
            "/kubepods/burstable",
            "/kubepods/guaranteed/podx",
            "/custom/pod1",
            "/kubepods/burstable/pod",
            "/kubepods/burstable/pod../../etc",
            "kubepods-burstable-pod1-2.slice",
            "user.slice",
        ] {
            assert_eq!(pod_cgroups(p), None, "{p}");
        }
    }
}
