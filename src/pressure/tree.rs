//! Finds pod cgroups under kubepods for both cgroup drivers:
//!
//! | driver   | Guaranteed                       | Burstable / BestEffort                                         |
//! |----------|----------------------------------|----------------------------------------------------------------|
//! | cgroupfs | `kubepods/pod<uid>`              | `kubepods/{burstable,besteffort}/pod<uid>`                     |
//! | systemd  | `kubepods.slice/kubepods-pod<uid_>.slice` | `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice` |
//!
//! Anything else is logged once and skipped.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::qos::QosClass;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

/// A pod cgroup found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    /// Pod UID with dashes (systemd's `_` turned back into `-`).
    pub uid: String,
    /// Class implied by where the cgroup sits.
    pub class: QosClass,
    pub path: PathBuf,
}

/// Locates the kubepods cgroup: `setting` is "auto" or a path relative to
/// the cgroup root.
pub fn find_kubepods(root: &Path, setting: &str) -> Option<(PathBuf, Driver)> {
    if setting != "auto" {
        // Validated at load; checked again so no caller can leave the root.
        let p = crate::node::join_inside(root, setting).ok()?;
        let driver = if setting.trim_end_matches('/').ends_with(".slice") {
            Driver::Systemd
        } else {
            Driver::Cgroupfs
        };
        return p.is_dir().then_some((p, driver));
    }
    let slice = root.join("kubepods.slice");
    if slice.is_dir() {
        return Some((slice, Driver::Systemd));
    }
    let fs = root.join("kubepods");
    fs.is_dir().then_some((fs, Driver::Cgroupfs))
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
/// sits in, `None` for kubepods itself.
pub fn classify(driver: Driver, parent: Option<QosClass>, name: &str) -> Option<Entry> {
    let pod = |uid: &str, class| {
        valid_uid(uid).then(|| Entry::Pod {
            uid: uid.to_string(),
            class,
        })
    };
    match (driver, parent) {
        (Driver::Cgroupfs, None) => match name {
            "burstable" => Some(Entry::QosParent(QosClass::Burstable)),
            "besteffort" => Some(Entry::QosParent(QosClass::BestEffort)),
            _ => pod(name.strip_prefix("pod")?, QosClass::Guaranteed),
        },
        (Driver::Cgroupfs, Some(class)) => pod(name.strip_prefix("pod")?, class),
        (Driver::Systemd, None) => match name {
            "kubepods-burstable.slice" => Some(Entry::QosParent(QosClass::Burstable)),
            "kubepods-besteffort.slice" => Some(Entry::QosParent(QosClass::BestEffort)),
            _ => {
                let uid = name.strip_prefix("kubepods-pod")?.strip_suffix(".slice")?;
                pod(&uid.replace('_', "-"), QosClass::Guaranteed)
            }
        },
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

/// Scans kubepods; remembers which unknown names it already logged so a
/// stray directory costs one log line, not one per scan.
#[derive(Debug, Default)]
pub struct Discovery {
    logged_unknown: HashSet<PathBuf>,
}

/// Bound on remembered unknown names (bounded memory on a weird host).
const MAX_LOGGED_UNKNOWN: usize = 1024;

impl Discovery {
    pub fn scan(&mut self, kubepods: &Path, driver: Driver) -> Vec<PodCgroup> {
        let mut out = Vec::new();
        self.scan_dir(kubepods, driver, None, &mut out);
        out.sort_by(|a, b| a.uid.cmp(&b.uid));
        out
    }

    fn scan_dir(
        &mut self,
        dir: &Path,
        driver: Driver,
        parent: Option<QosClass>,
        out: &mut Vec<PodCgroup>,
    ) {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(path = %dir.display(), error = %e, "cannot list cgroup directory");
                return;
            }
        };
        for entry in entries.flatten() {
            // Only directories are cgroups; the rest are interface files.
            if !entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            match classify(driver, parent, name) {
                Some(Entry::QosParent(class)) => {
                    self.scan_dir(&entry.path(), driver, Some(class), out)
                }
                Some(Entry::Pod { uid, class }) => out.push(PodCgroup {
                    uid,
                    class,
                    path: entry.path(),
                }),
                None => {
                    let p = entry.path();
                    if self.logged_unknown.len() < MAX_LOGGED_UNKNOWN
                        && self.logged_unknown.insert(p.clone())
                    {
                        tracing::warn!(path = %p.display(), ?driver, "unknown cgroup under kubepods, skipped");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_classify_both_drivers() {
        use QosClass::*;
        let pod = |uid: &str, class| {
            Some(Entry::Pod {
                uid: uid.into(),
                class,
            })
        };
        assert_eq!(
            classify(Driver::Cgroupfs, None, "podab-12"),
            pod("ab-12", Guaranteed)
        );
        assert_eq!(
            classify(Driver::Cgroupfs, None, "besteffort"),
            Some(Entry::QosParent(BestEffort))
        );
        assert_eq!(
            classify(Driver::Cgroupfs, Some(Burstable), "podx1"),
            pod("x1", Burstable)
        );
        assert_eq!(classify(Driver::Cgroupfs, None, "pod"), None);
        assert_eq!(classify(Driver::Cgroupfs, None, "pod../x"), None);
        assert_eq!(
            classify(Driver::Systemd, None, "kubepods-podab_12.slice"),
            pod("ab-12", Guaranteed)
        );
        assert_eq!(
            classify(
                Driver::Systemd,
                Some(BestEffort),
                "kubepods-besteffort-podab_12.slice"
            ),
            pod("ab-12", BestEffort)
        );
        // A burstable pod name inside the besteffort slice is not ours to guess.
        assert_eq!(
            classify(
                Driver::Systemd,
                Some(BestEffort),
                "kubepods-burstable-podab.slice"
            ),
            None
        );
        assert_eq!(
            classify(Driver::Systemd, None, "kubepods-burstable.slice"),
            Some(Entry::QosParent(Burstable))
        );
        assert_eq!(classify(Driver::Systemd, None, "system.slice"), None);
    }

    #[test]
    fn pressure_scan_finds_pods_and_skips_unknown() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for p in [
            "kubepods.slice/kubepods-podg_1.slice/cri-containerd-a.scope",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb_1.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pode_1.slice",
            "kubepods.slice/weird",
        ] {
            std::fs::create_dir_all(root.join(p)).unwrap();
        }
        std::fs::write(root.join("kubepods.slice/memory.pressure"), "").unwrap();
        let (kp, driver) = find_kubepods(root, "auto").unwrap();
        assert_eq!(driver, Driver::Systemd);
        let mut disc = Discovery::default();
        let pods = disc.scan(&kp, driver);
        let got: Vec<_> = pods.iter().map(|p| (p.uid.as_str(), p.class)).collect();
        assert_eq!(
            got,
            vec![
                ("b-1", QosClass::Burstable),
                ("e-1", QosClass::BestEffort),
                ("g-1", QosClass::Guaranteed)
            ]
        );
        assert_eq!(disc.logged_unknown.len(), 1);
        disc.scan(&kp, driver);
        assert_eq!(disc.logged_unknown.len(), 1);
        assert!(find_kubepods(root, "nope").is_none());
        assert_eq!(
            find_kubepods(root, "/kubepods.slice").unwrap().1,
            Driver::Systemd
        );
        // A directory outside the root is never the kubepods cgroup.
        std::fs::create_dir_all(root.join("kubepods.slice/x")).unwrap();
        assert!(find_kubepods(&root.join("kubepods.slice/x"), "..").is_none());
    }
}
