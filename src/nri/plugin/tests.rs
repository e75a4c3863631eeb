use super::*;
use crate::nri::view::{pods_with_hidden_kubelet_keys, Source};

fn kubelet_pod(root: &std::path::Path, id: &str, low: u64) -> api::PodSandbox {
    let cg = root.join(format!("kubepods/burstable/pod{id}"));
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("memory.min"), "0").unwrap();
    std::fs::write(cg.join("memory.low"), low.to_string()).unwrap();
    let mut linux = api::LinuxPodSandbox::new();
    linux.cgroup_parent = format!("/kubepods/burstable/pod{id}");
    api::PodSandbox {
        id: id.into(),
        name: id.into(),
        linux: protobuf::MessageField::some(linux),
        ..Default::default()
    }
}

/// A Burstable 64Mi → 512Mi container as containerd < 2.2 shows it: no
/// `unified`, the kubelet's oom_score_adj (997 on 16 GiB).
fn hidden_container(id: &str, pod: &str) -> api::Container {
    let mut mem = api::LinuxMemory::new();
    mem.limit = protobuf::MessageField::some(api::OptionalInt64 {
        value: 512 << 20,
        ..Default::default()
    });
    let mut res = api::LinuxResources::new();
    res.memory = protobuf::MessageField::some(mem);
    let mut linux = api::LinuxContainer::new();
    linux.resources = protobuf::MessageField::some(res);
    linux.oom_score_adj = protobuf::MessageField::some(api::OptionalInt {
        value: 997,
        ..Default::default()
    });
    api::Container {
        id: id.into(),
        pod_sandbox_id: pod.into(),
        name: "app".into(),
        state: protobuf::EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING),
        linux: protobuf::MessageField::some(linux),
        ..Default::default()
    }
}

fn plugin(root: &std::path::Path) -> QosPlugin {
    QosPlugin::new(PluginSettings {
        policy: PolicyConfig::default(),
        node: NodeFacts {
            memory_capacity: 16 << 30,
            memory_allocatable: 15 << 30,
            page_size: 4096,
            cgroup_v2: true,
        },
        dry_run: false,
        adjust_existing: true,
        proc_root: "/nonexistent".into(),
        cgroup_root: root.to_path_buf(),
    })
}

#[test]
fn a_pod_the_kubelet_protected_before_its_sandbox_keeps_the_kubelets_values() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let policy = p.live().policy;
    // First sight (RunPodSandbox): the kubelet's memory.low is already there.
    let kp = kubelet_pod(dir.path(), "k", 64 << 20);
    assert!(p.kubelet_owns_pod("k", &convert::pod_from_wire(&kp), &policy));
    let d = p.decide_and_record(&kp, &hidden_container("c1", "k"), Source::Reported);
    for key in ["memory.min", "memory.low", "memory.high"] {
        assert!(!d.adjustment.unified.contains_key(key), "{key}: {d:?}");
    }
    assert!(lock(&p.registry).containers["c1"].kubelet_memory_qos);
    // A pod with nothing in its cgroup is ours, as before.
    let ours = kubelet_pod(dir.path(), "n", 0);
    assert!(!p.kubelet_owns_pod("n", &convert::pod_from_wire(&ours), &policy));
    let d = p.decide_and_record(&ours, &hidden_container("c2", "n"), Source::Reported);
    assert!(d.adjustment.unified.contains_key("memory.low"), "{d:?}");

    // A restarted plugin reaches the same decision from the tree: the
    // kubelet's 64Mi is above our 49.2Mi estimate; our own value is not.
    std::fs::write(
        dir.path().join("kubepods/burstable/podn/memory.low"),
        "51380224",
    )
    .unwrap();
    let p2 = plugin(dir.path());
    let updates = p2.finish_sync(Complete::of(&super::super::reassembly::Snapshot {
        pods: vec![kp, ours],
        containers: vec![hidden_container("c1", "k"), hidden_container("c2", "n")],
        ..Default::default()
    }));
    let reg = lock(&p2.registry);
    assert!(reg.containers["c1"].kubelet_memory_qos);
    assert!(!reg.containers["c2"].kubelet_memory_qos);
    assert_eq!(reg.owners.len(), 1, "{:?}", reg.owners);
    drop(reg);
    let touched: Vec<&str> = updates.iter().map(|u| u.container_id.as_str()).collect();
    assert!(
        updates.iter().filter(|u| u.container_id == "c1").all(|u| u
            .linux
            .resources
            .as_ref()
            .is_none_or(
                |r| !r.unified.contains_key("memory.low") && !r.unified.contains_key("memory.high")
            )),
        "{touched:?}"
    );
}

#[test]
fn event_mask_is_accepted_by_nri_v0_6_runtimes() {
    assert_eq!(EVENTS & !0x7FF, 0, "mask {EVENTS:#x}");
    // CreateContainer, UpdateContainer and PostStartContainer are the ones we act on.
    assert_ne!(EVENTS & 0x8, 0);
    assert_ne!(EVENTS & 0x80, 0);
    assert_ne!(EVENTS & 0x40, 0);
}

#[tokio::test]
async fn synchronized_is_said_once_the_last_chunk_is_answered_and_forgotten_on_reset() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let short = Duration::from_millis(10);
    assert!(!p.wait_synchronized(short).await);
    let chunk = |more| api::SynchronizeRequest {
        more,
        ..Default::default()
    };
    p.synchronize(&TtrpcContext::default(), chunk(true))
        .await
        .unwrap();
    assert!(!p.wait_synchronized(short).await, "only a chunk so far");
    p.synchronize(&TtrpcContext::default(), chunk(false))
        .await
        .unwrap();
    assert!(p.wait_synchronized(short).await);
    p.reset_session();
    assert!(
        !p.wait_synchronized(short).await,
        "a new session syncs anew"
    );
}

#[test]
fn synchronize_decides_from_the_kernels_limits_after_a_resize_the_runtime_forgot() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let pod = kubelet_pod(dir.path(), "r", 0);
    // CRI-O restarted after the kubelet resized 512Mi -> 768Mi and 0.5 -> 1
    // CPU: it still reports 512Mi and no quota change, the kernel has both.
    let mut c = hidden_container("c1", "r");
    {
        let linux = c.linux.as_mut().unwrap();
        linux.cgroups_path = "/kubepods/burstable/podr/c1".into();
        let cpu = linux
            .resources
            .as_mut()
            .unwrap()
            .cpu
            .mut_or_insert_default();
        cpu.quota.mut_or_insert_default().value = 50_000;
        cpu.period.mut_or_insert_default().value = 100_000;
    }
    let cg = dir.path().join("kubepods/burstable/podr/c1");
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("memory.max"), "805306368\n").unwrap();
    std::fs::write(cg.join("cpu.max"), "100000 100000\n").unwrap();
    let fixed = p.resources_from_kernel(&c).expect("limits differ");
    let facts = convert::resources_from_wire(&fixed);
    assert_eq!(facts.memory_limit, Some(805306368));
    assert_eq!(facts.cpu_quota, Some(100_000));
    assert_eq!(facts.cpu_period, Some(100_000));

    // containerd's report is current: the kernel is not consulted.
    let containerd = p.finish_sync(Complete::of(&super::super::reassembly::Snapshot {
        pods: vec![pod.clone()],
        containers: vec![c.clone()],
        ..Default::default()
    }));
    *lock(&p.runtime) = Some(RuntimeInfo {
        quirks: RuntimeQuirks::decide("cri-o", "1.37.0", "v0.12.0", true),
        ..Default::default()
    });
    let updates = p.finish_sync(Complete::of(&super::super::reassembly::Snapshot {
        pods: vec![pod],
        containers: vec![c.clone()],
        ..Default::default()
    }));
    assert_eq!(updates.len(), 1, "{updates:?}");
    let high = |u: &api::ContainerUpdate| {
        u.linux.resources.as_ref().unwrap().unified["memory.high"].clone()
    };
    let stale = plugin(dir.path()).decide_and_record(
        &kubelet_pod(dir.path(), "r", 0),
        &c,
        Source::Reported,
    );
    let fresh = plugin(dir.path()).decide_and_record(
        &kubelet_pod(dir.path(), "r", 0),
        &c,
        Source::KernelLimits(&fixed),
    );
    assert_ne!(
        stale.adjustment.unified["memory.high"],
        fresh.adjustment.unified["memory.high"]
    );
    assert_eq!(high(&updates[0]), fresh.adjustment.unified["memory.high"]);
    assert_eq!(
        high(&containerd[0]),
        stale.adjustment.unified["memory.high"]
    );

    // Same values (the kernel keeps whole pages), no file, or no limit:
    // the runtime's report stands.
    std::fs::write(cg.join("memory.max"), "536870912\n").unwrap();
    std::fs::write(cg.join("cpu.max"), "50000 100000\n").unwrap();
    assert!(p.resources_from_kernel(&c).is_none());
    std::fs::remove_file(cg.join("memory.max")).unwrap();
    std::fs::remove_file(cg.join("cpu.max")).unwrap();
    assert!(p.resources_from_kernel(&c).is_none());
    std::fs::write(cg.join("memory.max"), "max\n").unwrap();
    assert!(p.resources_from_kernel(&c).is_none());
}

fn in_cgroup(mut c: api::Container, path: &str) -> api::Container {
    c.linux.as_mut().unwrap().cgroups_path = path.into();
    c
}

fn event(
    e: api::Event,
    pod: &api::PodSandbox,
    c: Option<&api::Container>,
) -> api::StateChangeEvent {
    api::StateChangeEvent {
        event: protobuf::EnumOrUnknown::new(e),
        pod: protobuf::MessageField::some(pod.clone()),
        container: protobuf::MessageField::from_option(c.cloned()),
        ..Default::default()
    }
}

/// containerd before 2.2, a kubelet that did not protect the pod cgroup
/// first: the first container's cgroup after start holds the kubelet's
/// alpha memory.min, which a Burstable container never gets from us.
#[tokio::test]
async fn a_started_container_holding_a_key_we_did_not_set_gives_its_pod_to_the_kubelet() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let ctx = TtrpcContext::default();
    let (pa, pb) = (
        kubelet_pod(dir.path(), "a", 0),
        kubelet_pod(dir.path(), "b", 0),
    );
    let c1 = in_cgroup(hidden_container("c1", "a"), "/kubepods/burstable/poda/c1");
    let cb = in_cgroup(hidden_container("cb", "b"), "/kubepods/burstable/podb/cb");
    let mut ours = std::collections::BTreeMap::new();
    for (pod, c) in [(&pa, &c1), (&pb, &cb)] {
        p.state_change(&ctx, event(api::Event::RUN_POD_SANDBOX, pod, None))
            .await
            .unwrap();
        let d = p.decide_and_record(pod, c, Source::Reported);
        let (low, high) = (
            &d.adjustment.unified["memory.low"],
            &d.adjustment.unified["memory.high"],
        );
        assert!(!d.adjustment.unified.contains_key("memory.min"), "{d:?}");
        // What runc applied: ours, and (in pod a) the CRI's hidden memory.min.
        let cg = dir
            .path()
            .join(c.linux.cgroups_path.trim_start_matches('/'));
        std::fs::create_dir_all(&cg).unwrap();
        let min = if pod.id == "a" { "268435456" } else { "0" };
        for (f, v) in [
            ("memory.min", min),
            ("memory.low", low),
            ("memory.high", high),
        ] {
            std::fs::write(cg.join(f), format!("{v}\n")).unwrap();
        }
        ours.insert(pod.id.clone(), d.adjustment.unified.clone());
    }
    assert!(
        lock(&p.registry).owners.is_empty(),
        "nothing tells before the start"
    );
    // The keeper's first pass, before the starts, took both pods as ours.
    for id in ["a", "b"] {
        let cg = std::path::PathBuf::from(format!("kubepods/burstable/pod{id}"));
        lock(&p.registry).owners.insert(cg, Owner::NriQos);
    }
    let changes = p.subscribe_changes();
    for (pod, c) in [(&pa, &c1), (&pb, &cb)] {
        p.state_change(&ctx, event(api::Event::POST_START_CONTAINER, pod, Some(c)))
            .await
            .unwrap();
    }
    assert!(changes.has_changed().unwrap(), "the keeper hears of it");
    let pod_a = std::path::PathBuf::from("kubepods/burstable/poda");
    {
        let reg = lock(&p.registry);
        assert_eq!(reg.owners[&pod_a], Owner::Kubelet);
        assert_eq!(
            reg.owners[std::path::Path::new("kubepods/burstable/podb")],
            Owner::NriQos,
            "pod b holds only ours"
        );
        assert!(reg.containers["c1"].kubelet_memory_qos);
        assert!(!reg.containers["cb"].kubelet_memory_qos);
    }
    // The pod's later containers get no memory.min/low/high from us.
    let c2 = in_cgroup(hidden_container("c2", "a"), "/kubepods/burstable/poda/c2");
    let d = p.decide_and_record(&pa, &c2, Source::Reported);
    for key in ["memory.min", "memory.low", "memory.high"] {
        assert!(!d.adjustment.unified.contains_key(key), "{key}: {d:?}");
    }

    // `nri-qos audit` applies the same rule to the runtime's view.
    let (pods, containers) = (vec![pa, pb], vec![c1, c2, cb]);
    let by_id = pods.iter().map(|p| (p.id.as_str(), p)).collect();
    let settings = p.settings();
    let hidden = pods_with_hidden_kubelet_keys(
        &containers,
        &by_id,
        &RuntimeQuirks::default(),
        (&settings.node, &settings.policy),
        dir.path(),
        None,
    );
    assert_eq!(hidden, ["a".to_string()].into());

    // A restarted plugin comes to the same decision from Synchronize.
    let p2 = plugin(dir.path());
    let updates = p2.finish_sync(Complete::of(&super::super::reassembly::Snapshot {
        pods: pods.clone(),
        containers: containers.clone(),
        ..Default::default()
    }));
    let reg = lock(&p2.registry);
    assert_eq!(reg.owners.keys().collect::<Vec<_>>(), [&pod_a]);
    assert!(reg.containers["c1"].kubelet_memory_qos && reg.containers["c2"].kubelet_memory_qos);
    assert!(!reg.containers["cb"].kubelet_memory_qos);
    drop(reg);
    for u in &updates {
        let unified = u
            .linux
            .resources
            .as_ref()
            .map(|r| r.unified.clone())
            .unwrap_or_default();
        if u.container_id == "cb" {
            assert_eq!(unified["memory.low"], ours["b"]["memory.low"]);
        } else {
            for key in ["memory.min", "memory.low", "memory.high"] {
                assert!(
                    !unified.contains_key(key),
                    "{}: {key} {unified:?}",
                    u.container_id
                );
            }
        }
    }
    assert!(
        updates.iter().any(|u| u.container_id == "cb"),
        "{updates:?}"
    );
}

#[test]
fn synchronize_answers_in_the_order_sent_and_a_pod_sent_twice_keeps_the_later_description() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let [a, b, c] = ["a", "b", "c"].map(|id| kubelet_pod(dir.path(), id, 0));
    let later = |pod: &api::PodSandbox| {
        let mut later = pod.clone();
        later.name = format!("{}-later", pod.name);
        later
    };
    let (a_later, c_later) = (later(&a), later(&c));
    // Containers of two pods interleaved, and one of a pod never sent.
    let sent = ["a1", "b1", "a2", "b2", "a3"];
    let mut containers: Vec<_> = sent
        .iter()
        .map(|id| hidden_container(id, &id[..1]))
        .collect();
    containers.push(hidden_container("x", "unknown"));
    let updates = p.finish_sync(Complete::of(&super::super::reassembly::Snapshot {
        pods: vec![a, b, c, a_later, c_later],
        containers,
        ..Default::default()
    }));
    let ids: Vec<&str> = updates.iter().map(|u| u.container_id.as_str()).collect();
    assert_eq!(ids, sent);
    let reg = lock(&p.registry);
    assert_eq!(
        &*reg.pods["a"].name, "a-later",
        "its containers were decided with it"
    );
    // Pod c has no container: the first description of an id stands.
    assert_eq!(&*reg.pods["c"].name, "c");
    assert_eq!(reg.pods.len(), 3);
    assert_eq!(
        reg.containers.len(),
        5,
        "the container without a pod is skipped"
    );
}

/// A Synchronize of the pods in `pods` with `containers`, on a fresh plugin
/// over `root`; the pods the plugin then takes as the kubelet's.
fn kubelet_pods_after_sync(
    root: &std::path::Path,
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
) -> Vec<std::path::PathBuf> {
    kubelet_pods_after_sync_from(root, None, pods, containers)
}

/// [`kubelet_pods_after_sync`] with the runtime `runtime` (name, version).
fn kubelet_pods_after_sync_from(
    root: &std::path::Path,
    runtime: Option<(&str, &str)>,
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
) -> Vec<std::path::PathBuf> {
    let p = plugin(root);
    *lock(&p.runtime) = runtime.map(|(name, version)| RuntimeInfo {
        quirks: RuntimeQuirks::decide(name, version, "", true),
        ..Default::default()
    });
    p.finish_sync(Complete::of(&super::super::reassembly::Snapshot {
        pods,
        containers,
        ..Default::default()
    }));
    let reg = lock(&p.registry);
    let mut owned: Vec<_> = reg.owners.keys().cloned().collect();
    owned.sort();
    owned
}

/// Writes `files` into the container cgroup at `cgroups_path` below `root`.
fn container_files(root: &std::path::Path, cgroups_path: &str, files: &[(&str, &str)]) {
    let cg = root.join(cgroups_path.trim_start_matches('/'));
    std::fs::create_dir_all(&cg).unwrap();
    for (f, v) in files {
        std::fs::write(cg.join(f), format!("{v}\n")).unwrap();
    }
}

/// The reads a Synchronize skips change nothing the kubelet can have done:
/// a Guaranteed container's memory.low/high and a BestEffort one's
/// memory.min/low are never the kubelet's (whoever wrote them), while a
/// Burstable container's hidden memory.min still gives its pod away.
#[test]
fn synchronize_reads_only_the_keys_the_kubelet_may_set_on_the_class() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let placed = |id: &str, parent: &str| {
        let mut pod = kubelet_pod(root, id, 0);
        std::fs::create_dir_all(root.join(parent)).unwrap();
        for f in ["memory.min", "memory.low"] {
            std::fs::write(root.join(parent).join(f), "0\n").unwrap();
        }
        pod.linux.mut_or_insert_default().cgroup_parent = format!("/{parent}");
        pod
    };
    let g = placed("g", "kubepods/podg");
    let e = placed("e", "kubepods/besteffort/pode");
    let b = placed("b", "kubepods/burstable/podb");
    let (cg, ce, cb) = (
        in_cgroup(hidden_container("cg", "g"), "/kubepods/podg/cg"),
        in_cgroup(hidden_container("ce", "e"), "/kubepods/besteffort/pode/ce"),
        in_cgroup(hidden_container("cb", "b"), "/kubepods/burstable/podb/cb"),
    );
    let foreign = [("memory.low", "268435456"), ("memory.high", "509943808")];
    container_files(root, "/kubepods/podg/cg", &foreign);
    let foreign = [("memory.min", "268435456"), ("memory.low", "268435456")];
    container_files(root, "/kubepods/besteffort/pode/ce", &foreign);
    assert!(kubelet_pods_after_sync(
        root,
        vec![g.clone(), e.clone()],
        vec![cg.clone(), ce.clone()]
    )
    .is_empty());
    container_files(
        root,
        "/kubepods/burstable/podb/cb",
        &[("memory.min", "268435456")],
    );
    assert_eq!(
        kubelet_pods_after_sync(root, vec![g, e, b], vec![cg, ce, cb]),
        [std::path::PathBuf::from("kubepods/burstable/podb")]
    );
}

/// A runtime that shows the CRI's `unified` map (NRI v0.10 on: containerd
/// 2.2) shows every key the kubelet set, so a Synchronize reads none of
/// that container's files; CRI-O, whose report after a restart can predate
/// a resize, is still read, and so is a runtime that hides the map
/// (containerd 2.1) or one we do not know. (The file here holds what the
/// report does not, to prove which was read.)
#[test]
fn synchronize_reads_no_container_key_where_the_runtime_shows_the_cris() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let pod = kubelet_pod(root, "b", 0);
    let mut cb = in_cgroup(hidden_container("cb", "b"), "/kubepods/burstable/podb/cb");
    let resources = cb
        .linux
        .mut_or_insert_default()
        .resources
        .mut_or_insert_default();
    resources
        .unified
        .insert("memory.oom.group".into(), "1".into());
    container_files(
        root,
        "/kubepods/burstable/podb/cb",
        &[("memory.min", "268435456")],
    );
    let (pods, containers) = (vec![pod], vec![cb]);
    let kubelets = [std::path::PathBuf::from("kubepods/burstable/podb")];
    for runtime in [("containerd", "v2.2.7"), ("containerd", "v2.3.4")] {
        let owned =
            kubelet_pods_after_sync_from(root, Some(runtime), pods.clone(), containers.clone());
        assert!(owned.is_empty(), "{runtime:?}: {owned:?}");
        // A map with no key at all is just as whole there.
        let bare = in_cgroup(hidden_container("cb", "b"), "/kubepods/burstable/podb/cb");
        let owned = kubelet_pods_after_sync_from(root, Some(runtime), pods.clone(), vec![bare]);
        assert!(owned.is_empty(), "{runtime:?}: {owned:?}");
    }
    for runtime in [
        None,
        Some(("cri-o", "1.37.0")),
        Some(("containerd", "2.1.9")),
    ] {
        let owned = kubelet_pods_after_sync_from(root, runtime, pods.clone(), containers.clone());
        assert_eq!(owned, kubelets, "{runtime:?}");
    }
}

/// A pod cgroup without memory.min (gone, or no memory controller) has no
/// memory files below it, so its containers' cgroups are not read; one
/// placed elsewhere still is. (The kernel never shows the tree below: it
/// is made here to prove the reads are skipped.)
#[test]
fn synchronize_skips_the_containers_below_a_pod_cgroup_without_memory_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let pod = kubelet_pod(root, "a", 0);
    let pod_dir = root.join("kubepods/burstable/poda");
    std::fs::remove_file(pod_dir.join("memory.min")).unwrap();
    let hidden_min = [("memory.min", "268435456")];
    container_files(root, "/kubepods/burstable/poda/c1", &hidden_min);
    let c1 = in_cgroup(hidden_container("c1", "a"), "/kubepods/burstable/poda/c1");
    assert!(kubelet_pods_after_sync(root, vec![pod.clone()], vec![c1.clone()]).is_empty());
    container_files(root, "/elsewhere/c2", &hidden_min);
    let c2 = in_cgroup(hidden_container("c2", "a"), "/elsewhere/c2");
    assert_eq!(
        kubelet_pods_after_sync(root, vec![pod], vec![c1, c2]),
        [std::path::PathBuf::from("kubepods/burstable/poda")]
    );
}

/// containerd 2.2 and later show the CRI's `unified` map at creation, so a
/// started container's cgroup is not read for keys the kubelet hid: even
/// one holding a memory.min we did not set leaves its pod as it was.
#[tokio::test]
async fn a_started_container_is_not_read_where_the_runtime_shows_the_unified_map() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let p = plugin(root);
    *lock(&p.runtime) = Some(RuntimeInfo {
        quirks: RuntimeQuirks::decide("containerd", "v2.2.7", "", true),
        ..Default::default()
    });
    let ctx = TtrpcContext::default();
    let pod = kubelet_pod(root, "a", 0);
    let c = in_cgroup(hidden_container("c1", "a"), "/kubepods/burstable/poda/c1");
    p.state_change(&ctx, event(api::Event::RUN_POD_SANDBOX, &pod, None))
        .await
        .unwrap();
    p.decide_and_record(&pod, &c, Source::Reported);
    container_files(
        root,
        "/kubepods/burstable/poda/c1",
        &[("memory.min", "268435456")],
    );
    p.state_change(
        &ctx,
        event(api::Event::POST_START_CONTAINER, &pod, Some(&c)),
    )
    .await
    .unwrap();
    let reg = lock(&p.registry);
    assert!(reg.owners.is_empty(), "{:?}", reg.owners);
    assert!(!reg.containers["c1"].kubelet_memory_qos);
}

/// At a container's start as in a Synchronize: memory.high on a Guaranteed
/// container is never the kubelet's, so its file is not even read.
#[tokio::test]
async fn a_started_guaranteed_container_is_not_read_for_keys_the_kubelet_never_sets_there() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let p = plugin(root);
    let ctx = TtrpcContext::default();
    let mut pod = kubelet_pod(root, "g", 0);
    pod.linux.mut_or_insert_default().cgroup_parent = "/kubepods/podg".into();
    let c = in_cgroup(hidden_container("cg", "g"), "/kubepods/podg/cg");
    p.state_change(&ctx, event(api::Event::RUN_POD_SANDBOX, &pod, None))
        .await
        .unwrap();
    p.decide_and_record(&pod, &c, Source::Reported);
    container_files(root, "/kubepods/podg/cg", &[("memory.high", "509943808")]);
    p.state_change(
        &ctx,
        event(api::Event::POST_START_CONTAINER, &pod, Some(&c)),
    )
    .await
    .unwrap();
    assert!(lock(&p.registry).owners.is_empty());
}

/// Every update and record of a Synchronize, in one message or in chunks:
/// the records are built from containers taken out of the snapshot as it
/// is processed, which must not change what they say.
async fn synchronized(
    p: &QosPlugin,
    chunks: Vec<api::SynchronizeRequest>,
) -> (Vec<api::ContainerUpdate>, Vec<String>) {
    let mut updates = Vec::new();
    for chunk in chunks {
        let resp = p.synchronize(&TtrpcContext::default(), chunk).await;
        updates = resp.unwrap().update;
    }
    (updates, registry_records(p))
}

/// One Synchronize message of these pods and containers.
fn sync_message(
    pods: &[api::PodSandbox],
    containers: &[api::Container],
    more: bool,
) -> api::SynchronizeRequest {
    api::SynchronizeRequest {
        pods: pods.to_vec(),
        containers: containers.to_vec(),
        more,
        ..Default::default()
    }
}

/// Every record of the registry, sorted.
fn registry_records(p: &QosPlugin) -> Vec<String> {
    let reg = lock(&p.registry);
    let mut records: Vec<String> = reg.pods.values().map(|r| format!("{r:?}")).collect();
    records.extend(reg.containers.values().map(|r| format!("{r:?}")));
    records.sort();
    records
}

#[tokio::test]
async fn a_chunked_synchronize_gives_the_registry_and_updates_of_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let pods = ["a", "b", "c"].map(|id| kubelet_pod(dir.path(), id, 0));
    let containers: Vec<_> = ["a1", "b1", "a2", "c1", "b2"]
        .iter()
        .map(|id| {
            let path = format!("/kubepods/burstable/pod{}/{id}", &id[..1]);
            in_cgroup(hidden_container(id, &id[..1]), &path)
        })
        .collect();
    let whole = vec![sync_message(&pods, &containers, false)];
    let chunked = vec![
        sync_message(&pods[..1], &containers[..1], true),
        sync_message(&pods[1..], &containers[1..3], true),
        sync_message(&[], &containers[3..], false),
    ];
    let (updates, records) = synchronized(&plugin(dir.path()), whole).await;
    let ids: Vec<&str> = updates.iter().map(|u| u.container_id.as_str()).collect();
    assert_eq!(ids, ["a1", "b1", "a2", "c1", "b2"]);
    assert_eq!(records.len(), 8, "3 pods and 5 containers: {records:?}");
    for c in &containers {
        let path = &c.linux.cgroups_path;
        assert!(records.iter().any(|r| r.contains(path.as_str())), "{path}");
    }
    assert_eq!(
        synchronized(&plugin(dir.path()), chunked).await,
        (updates, records)
    );
}

/// [`synchronized`] through the handler of encoded messages.
async fn synchronized_encoded(
    p: &QosPlugin,
    chunks: Vec<api::SynchronizeRequest>,
) -> (Vec<api::ContainerUpdate>, Vec<String>) {
    use crate::nri::lean_sync::SynchronizeEncoded;
    let mut updates = Vec::new();
    for chunk in chunks {
        let bytes = protobuf::Message::write_to_bytes(&chunk).unwrap();
        let resp = p.synchronize_encoded(&TtrpcContext::default(), bytes).await;
        let raw = resp.unwrap();
        let resp: api::SynchronizeResponse = protobuf::Message::parse_from_bytes(&raw).unwrap();
        // Map entries come in any order; nothing but the updates is written.
        let size = protobuf::Message::compute_size(&resp);
        assert_eq!(raw.len() as u64, size);
        assert_eq!(resp.more, chunk.more);
        updates = resp.update;
    }
    (updates, registry_records(p))
}

#[tokio::test]
async fn a_synchronize_decided_pod_by_pod_from_its_bytes_gives_what_the_decoded_one_gives() {
    use crate::nri::lean_sync::SynchronizeEncoded;
    let dir = tempfile::tempdir().unwrap();
    let [a, b, c] = ["a", "b", "c"].map(|id| kubelet_pod(dir.path(), id, 0));
    let mut a_later = a.clone();
    a_later.name = "a-later".into();
    // Out of pod order, one of a pod never sent, a pod sent twice.
    let mut containers: Vec<_> = ["b1", "a1", "c1", "a2", "b2"]
        .iter()
        .map(|id| {
            let path = format!("/kubepods/burstable/pod{}/{id}", &id[..1]);
            in_cgroup(hidden_container(id, &id[..1]), &path)
        })
        .collect();
    containers.insert(2, hidden_container("x", "unknown"));
    let pods = vec![a, b, c, a_later];
    let whole = vec![sync_message(&pods, &containers, false)];
    let decoded = synchronized(&plugin(dir.path()), whole.clone()).await;
    let ids: Vec<&str> = decoded.0.iter().map(|u| u.container_id.as_str()).collect();
    assert_eq!(ids, ["b1", "a1", "c1", "a2", "b2"]);
    assert!(decoded.1.iter().any(|r| r.contains("a-later")));
    assert_eq!(
        synchronized_encoded(&plugin(dir.path()), whole).await,
        decoded
    );
    let chunked = vec![
        sync_message(&pods[..1], &containers[..2], true),
        sync_message(&pods[1..], &containers[2..4], true),
        sync_message(&[], &containers[4..], false),
    ];
    assert_eq!(
        synchronized_encoded(&plugin(dir.path()), chunked).await,
        decoded
    );
    // Garbage is refused and leaves nothing held: a whole message after it
    // is taken as usual.
    let p = plugin(dir.path());
    let ctx = TtrpcContext::default();
    match p.synchronize_encoded(&ctx, vec![18, 50, 1]).await {
        Err(ttrpc::Error::RpcStatus(s)) => assert_eq!(s.code(), ttrpc::Code::INVALID_ARGUMENT),
        other => panic!("{other:?}"),
    }
    let whole = vec![sync_message(&pods, &containers, false)];
    assert_eq!(synchronized_encoded(&p, whole).await, decoded);
}

#[test]
fn a_container_created_at_the_synchronize_gets_its_values_at_start_if_its_start_missed_them() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    let pod = kubelet_pod(dir.path(), "s", 0);
    let mut created = in_cgroup(hidden_container("c1", "s"), "/kubepods/burstable/pods/c1");
    created.state = protobuf::EnumOrUnknown::new(api::ContainerState::CONTAINER_CREATED);
    let running = in_cgroup(hidden_container("r1", "s"), "/kubepods/burstable/pods/r1");
    let updates = p.finish_sync(Complete::of(&super::super::reassembly::Snapshot {
        pods: vec![pod.clone()],
        containers: vec![created.clone(), running.clone()],
        ..Default::default()
    }));
    assert_eq!(updates.len(), 2, "both are updated: {updates:?}");
    let sent = updates[0].linux.resources.as_ref().unwrap().unified.clone();
    assert!(
        sent.contains_key("cpu.weight") && sent.contains_key("memory.high"),
        "{sent:?}"
    );
    // The start read the runtime's record before the update landed: the
    // kernel holds the values from before.
    let cg = dir.path().join("kubepods/burstable/pods/c1");
    std::fs::create_dir_all(&cg).unwrap();
    for file in sent.keys() {
        std::fs::write(cg.join(file), "max\n").unwrap();
    }
    std::fs::write(cg.join("cpu.weight"), "2\n").unwrap();
    let start = || {
        p.on_event(
            api::Event::POST_START_CONTAINER,
            &pod,
            &created,
            EventPath::Dedicated,
        )
    };
    start();
    for (file, value) in &sent {
        assert_eq!(
            &std::fs::read_to_string(cg.join(file)).unwrap(),
            value,
            "{file}"
        );
    }
    // Once per container, and never for one that ran at the Synchronize.
    std::fs::write(cg.join("cpu.weight"), "7\n").unwrap();
    start();
    assert_eq!(
        std::fs::read_to_string(cg.join("cpu.weight")).unwrap(),
        "7\n"
    );
    assert!(lock(&p.created_at_sync).is_empty());
}
