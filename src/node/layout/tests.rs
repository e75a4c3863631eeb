use std::path::PathBuf;

use proptest::prelude::*;

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
        PathBuf::from("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice")
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
fn cgroup_dirs_for_both_drivers() {
    assert_eq!(
        container_cgroup_dir("/kubepods/burstable/poda/abc"),
        Some(PathBuf::from("kubepods/burstable/poda/abc"))
    );
    assert_eq!(
        container_cgroup_dir("kubepods-burstable-pod1.slice:cri-containerd:abc"),
        Some(PathBuf::from(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"
        ))
    );
    assert_eq!(container_cgroup_dir(""), None);
    assert_eq!(container_cgroup_dir("a:b"), None);
}

#[test]
fn cgroup_dirs_below_a_root_are_the_same_dirs() {
    let root = Path::new("/sys/fs/cgroup");
    for p in [
        "/kubepods/burstable/poda/abc",
        "kubepods/./poda//abc",
        "kubepods-burstable-pod1.slice:cri-containerd:abc",
        "",
        "/",
        "a:b",
        "/kubepods/burstable/poda/../../../../etc",
        "kubepods/x\0y",
    ] {
        assert_eq!(
            container_cgroup_dir_in(root, p),
            container_cgroup_dir(p).map(|rel| root.join(rel)),
            "{p:?}"
        );
    }
}

#[test]
fn cgroup_dirs_never_leave_the_root() {
    for p in [
        "/kubepods/burstable/poda/../../../../etc",
        "..",
        "/",
        "kubepods/x\0y",
        "kubepods-burstable-pod1.slice:cri-containerd:../../../etc",
        "kubepods-../../x.slice:cri-containerd:abc",
    ] {
        assert_eq!(container_cgroup_dir(p), None, "{p:?}");
    }
}

#[test]
fn throttle_container_ids_from_cgroup_names() {
    assert_eq!(container_id("cri-containerd-abc123.scope"), "abc123");
    assert_eq!(container_id("crio-abc.scope"), "abc");
    assert_eq!(container_id("abc123"), "abc123");
    for driver in [Driver::Cgroupfs, Driver::Systemd] {
        let path = container_cgroup(driver, "/kubepods/podx", "abc123");
        assert_eq!(container_id(path.rsplit('/').next().unwrap()), "abc123");
    }
}

proptest! {
    /// The parent explain gives a pod parses back to its class and pod
    /// cgroup, for both drivers.
    #[test]
    fn pod_cgroup_parent_parses_back(uid in "[a-z0-9]{1,8}(-[a-z0-9]{1,8}){0,4}", c in 0usize..3, systemd: bool) {
        let class = [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort][c];
        let driver = if systemd { Driver::Systemd } else { Driver::Cgroupfs };
        let (parent, path) = pod_cgroup_parent(driver, class, &uid);
        let cg = pod_cgroups(&parent).unwrap();
        prop_assert_eq!(cg.class, class);
        prop_assert_eq!(format!("/{}", cg.pod.display()), path);
        prop_assert_eq!(cg.kubepods, PathBuf::from(driver.kubepods()));
        let name = cg.pod.file_name().unwrap().to_str().unwrap();
        let parent_class = (class != QosClass::Guaranteed).then_some(class);
        prop_assert_eq!(
            classify(driver, parent_class, name),
            Some(Entry::Pod { uid: uid.clone(), class })
        );
    }
}
