//! Where the kubelet puts pods, for both cgroup drivers: the one home of
//! its cgroup naming. Everything else (policy, hierarchy keeper, monitor,
//! explain, audit) asks here.
//!
//! | driver   | Guaranteed                                | Burstable / BestEffort                                               |
//! |----------|-------------------------------------------|----------------------------------------------------------------------|
//! | cgroupfs | `kubepods/pod<uid>`                       | `kubepods/{burstable,besteffort}/pod<uid>`                           |
//! | systemd  | `kubepods.slice/kubepods-pod<uid_>.slice` | `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice` |
//!
//! With systemd a dash in the pod UID becomes `_`, and every slice nests
//! under each dash-separated prefix of its name.

use std::path::{Path, PathBuf};

use super::{join_inside, relative_inside, QosClass};

/// cgroup driver of the kubelet and runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

impl Driver {
    /// The kubepods cgroup's name below the cgroup root.
    pub fn kubepods(self) -> &'static str {
        match self {
            Driver::Cgroupfs => "kubepods",
            Driver::Systemd => "kubepods.slice",
        }
    }

    /// The name of a QoS class's parent below kubepods; `None` for
    /// Guaranteed, whose pods sit directly under kubepods.
    pub fn qos_dir(self, class: QosClass) -> Option<&'static str> {
        Some(match (self, class) {
            (_, QosClass::Guaranteed) => return None,
            (Driver::Cgroupfs, QosClass::Burstable) => "burstable",
            (Driver::Cgroupfs, QosClass::BestEffort) => "besteffort",
            (Driver::Systemd, QosClass::Burstable) => "kubepods-burstable.slice",
            (Driver::Systemd, QosClass::BestEffort) => "kubepods-besteffort.slice",
        })
    }
}

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
    let p = parse(cgroup_parent)?;
    Some(pod_cgroups_below(p.driver, p.qos, p.pod))
}

/// The QoS class the kubelet's cgroup parent says, as [`pod_cgroups`]
/// would give it, without building the paths (the hooks ask per container).
pub fn pod_class(cgroup_parent: &str) -> Option<QosClass> {
    parse(cgroup_parent).map(|p| class_of(p.qos))
}

/// A kubelet cgroup parent taken apart: the driver, the QoS level's name
/// (`burstable`/`besteffort`, none for Guaranteed) and the pod's cgroup
/// name (`pod<uid>`, or the pod's slice with systemd).
struct Parsed<'a> {
    driver: Driver,
    qos: Option<&'a str>,
    pod: &'a str,
}

fn parse(cgroup_parent: &str) -> Option<Parsed<'_>> {
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

/// The class of a `burstable` / `besteffort` QoS level, Guaranteed without one.
fn class_of(qos: Option<&str>) -> QosClass {
    match qos {
        None => QosClass::Guaranteed,
        Some("burstable") => QosClass::Burstable,
        Some(_) => QosClass::BestEffort,
    }
}

fn pod_cgroups_below(driver: Driver, qos: Option<&str>, pod: &str) -> PodCgroups {
    let class = class_of(qos);
    let kubepods = PathBuf::from(driver.kubepods());
    let qos_path = driver.qos_dir(class).map(|q| kubepods.join(q));
    let pod_path = qos_path
        .clone()
        .unwrap_or_else(|| kubepods.clone())
        .join(pod);
    PodCgroups {
        kubepods,
        qos: qos_path,
        pod: pod_path,
        class,
    }
}

/// `/kubepods[/burstable|/besteffort]/pod<uid>`.
fn cgroupfs(path: &str) -> Option<Parsed<'_>> {
    let mut parts = path.split('/');
    let (qos, pod) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("kubepods"), Some(pod), None, None) => (None, pod),
        (Some("kubepods"), Some(q @ ("burstable" | "besteffort")), Some(pod), None) => {
            (Some(q), pod)
        }
        _ => return None,
    };
    valid_pod_name(pod).then_some(Parsed {
        driver: Driver::Cgroupfs,
        qos,
        pod,
    })
}

/// `kubepods[-burstable|-besteffort]-pod<uid_>.slice`.
fn systemd(slice: &str) -> Option<Parsed<'_>> {
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
    (valid_pod_name(pod) && !pod.contains('-')).then_some(Parsed {
        driver: Driver::Systemd,
        qos,
        pod: slice,
    })
}

/// The cgroup parent the kubelet gives a pod sandbox of `class` (a slice
/// name with systemd) and the pod cgroup's path from the cgroup root
/// (with a leading `/`): the reverse of [`pod_cgroups`].
pub fn pod_cgroup_parent(driver: Driver, class: QosClass, uid: &str) -> (String, String) {
    match driver {
        Driver::Cgroupfs => {
            let qos = match class {
                QosClass::Guaranteed => "",
                QosClass::Burstable => "/burstable",
                QosClass::BestEffort => "/besteffort",
            };
            let parent = format!("/kubepods{qos}/pod{uid}");
            (parent.clone(), parent)
        }
        Driver::Systemd => {
            let qos = match class {
                QosClass::Guaranteed => "",
                QosClass::Burstable => "-burstable",
                QosClass::BestEffort => "-besteffort",
            };
            let escaped = uid.replace('-', "_");
            let slice = format!("kubepods{qos}-pod{escaped}.slice");
            let mut path = "/kubepods.slice".to_string();
            if !qos.is_empty() {
                path.push_str(&format!("/kubepods{qos}.slice"));
            }
            path.push_str(&format!("/{slice}"));
            (slice, path)
        }
    }
}

/// A container's (or sandbox's) cgroup below its pod cgroup as containerd
/// names it: `<id>` (cgroupfs) or `cri-containerd-<id>.scope` (systemd).
pub fn container_cgroup(driver: Driver, pod_path: &str, id: &str) -> String {
    match driver {
        Driver::Cgroupfs => format!("{pod_path}/{id}"),
        Driver::Systemd => format!("{pod_path}/cri-containerd-{id}.scope"),
    }
}

/// Container id from a container cgroup name: `cri-containerd-<id>.scope`,
/// `crio-<id>.scope`, `docker-<id>.scope` (systemd) or `<id>` (cgroupfs).
pub fn container_id(name: &str) -> &str {
    let base = name.strip_suffix(".scope").unwrap_or(name);
    base.rsplit('-').next().unwrap_or(base)
}

/// Locates the kubepods cgroup below `root`: `setting` is "auto" or a path
/// relative to the cgroup root.
pub fn find_kubepods(root: &Path, setting: &str) -> Option<(PathBuf, Driver)> {
    if setting != "auto" {
        // Validated at load; checked again so no caller can leave the root.
        let p = join_inside(root, setting).ok()?;
        let driver = if setting.trim_end_matches('/').ends_with(".slice") {
            Driver::Systemd
        } else {
            Driver::Cgroupfs
        };
        return p.is_dir().then_some((p, driver));
    }
    [Driver::Systemd, Driver::Cgroupfs]
        .into_iter()
        .map(|d| (root.join(d.kubepods()), d))
        .find(|(p, _)| p.is_dir())
}

/// What a directory name under kubepods (or under a QoS cgroup) means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    QosParent(QosClass),
    Pod { uid: String, class: QosClass },
}

fn valid_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= 64 && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// Pure name classifier. `parent` is the QoS class of the directory the name
/// sits in, `None` for kubepods itself. A pod's UID comes back with dashes
/// (systemd's `_` turned back into `-`).
pub fn classify(driver: Driver, parent: Option<QosClass>, name: &str) -> Option<Entry> {
    let pod = |uid: &str, class| {
        valid_uid(uid).then(|| Entry::Pod {
            uid: uid.to_string(),
            class,
        })
    };
    if parent.is_none() {
        for class in [QosClass::Burstable, QosClass::BestEffort] {
            if driver.qos_dir(class) == Some(name) {
                return Some(Entry::QosParent(class));
            }
        }
    }
    match (driver, parent) {
        (Driver::Cgroupfs, None) => pod(name.strip_prefix("pod")?, QosClass::Guaranteed),
        (Driver::Cgroupfs, Some(class)) => pod(name.strip_prefix("pod")?, class),
        (Driver::Systemd, None) => {
            let uid = name.strip_prefix("kubepods-pod")?.strip_suffix(".slice")?;
            pod(&uid.replace('_', "-"), QosClass::Guaranteed)
        }
        (Driver::Systemd, Some(class)) => {
            let prefix = match class {
                QosClass::Burstable => "kubepods-burstable-pod",
                QosClass::BestEffort => "kubepods-besteffort-pod",
                QosClass::Guaranteed => return None,
            };
            let uid = name.strip_prefix(prefix)?.strip_suffix(".slice")?;
            pod(&uid.replace('_', "-"), class)
        }
    }
}

/// The container's cgroup directory, relative to the cgroup root, from the
/// runtime's cgroups path: `/parent/id` (cgroupfs) or `slice:prefix:id`
/// (systemd). `None` for anything else, including paths that would leave
/// the root (`..`, NUL).
pub fn container_cgroup_dir(cgroups_path: &str) -> Option<PathBuf> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    let rel = match parts.as_slice() {
        [path] if !path.is_empty() => PathBuf::from(path),
        [slice, prefix, id] if slice.ends_with(".slice") && !id.is_empty() => {
            systemd_slice_path(slice).join(format!("{prefix}-{id}.scope"))
        }
        _ => return None,
    };
    relative_inside(rel)
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
}

/// [`container_cgroup_dir`] below `root`, for reading it: the cgroupfs
/// form `/parent/id` in one allocation (a Synchronize asks for every
/// running container).
pub fn container_cgroup_dir_in(root: &Path, cgroups_path: &str) -> Option<PathBuf> {
    if cgroups_path.contains(':') {
        return container_cgroup_dir(cgroups_path).map(|rel| root.join(rel));
    }
    let dir = join_inside(root, cgroups_path).ok()?;
    // Nothing below the root (`""`, `/`) is no container's cgroup.
    (dir.as_os_str().len() > root.as_os_str().len()).then_some(dir)
}

/// `a-b-c.slice` -> `a.slice/a-b.slice/a-b-c.slice` (systemd's nesting).
pub fn systemd_slice_path(slice: &str) -> PathBuf {
    let name = slice.strip_suffix(".slice").unwrap_or(slice);
    let mut path = PathBuf::new();
    let mut prefix = String::new();
    for part in name.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    path
}

#[cfg(test)]
mod tests;
