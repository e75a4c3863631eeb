//! `audit` end to end on a fake runtime and a temp cgroup tree: the snapshot
//! comes over a real NRI session, the values from files shaped like cgroupfs.

// Test code: a failed unwrap is the test failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use nri_qos::audit;
use nri_qos::keeper::HierarchyConfig;
use nri_qos::node::cgroupfs::Owner;
use nri_qos::node::registry::{ContainerRequests, RequestSource};
use nri_qos::node::runtime::RuntimeQuirks;
use nri_qos::nri::convert;
use nri_qos::nri::convert::OomField;
use nri_qos::nri::proto::api;
use nri_qos::qos::{self, NodeFacts};
use tokio::net::UnixListener;

const NODE: NodeFacts = NodeFacts {
    memory_capacity: 16 << 30,
    memory_allocatable: 15 << 30,
    page_size: 4096,
    cgroup_v2: true,
};

/// Burstable pod `b` (cgroupfs layout) with its container `cb`: 256
/// shares, cpu.max 50000, memory.max 512Mi, oom_score_adj 985.
fn burstable_pod() -> (api::PodSandbox, api::Container) {
    let mut c = container("cb", "b", 256, 50_000, 512 << 20, 985);
    c.linux.mut_or_insert_default().cgroups_path = "/kubepods/burstable/podb/cb".into();
    (pod("b", "/kubepods/burstable/podb"), c)
}

/// Writes what a correct node would have for `c` into the temp tree.
fn write_expected(root: &Path, p: &api::PodSandbox, c: &api::Container) {
    write_expected_with(root, p, c, None);
}

/// [`write_expected`] for a plugin that has `api_request` from the API server.
fn write_expected_with(
    root: &Path,
    p: &api::PodSandbox,
    c: &api::Container,
    api_request: Option<u64>,
) {
    let mut facts = convert::container_from_wire(c);
    facts.api_memory_request = api_request;
    let d = qos::decide(
        &convert::pod_from_wire(p),
        &facts,
        &NODE,
        &Default::default(),
    );
    let spec = convert::container_from_wire(c).resources;
    let dir =
        root.join(nri_qos::node::layout::container_cgroup_dir(&c.linux.cgroups_path).unwrap());
    std::fs::create_dir_all(&dir).unwrap();
    let unified = |k: &str, default: &str| {
        d.adjustment
            .unified
            .get(k)
            .or(spec.unified.get(k))
            .cloned()
            .unwrap_or_else(|| default.into())
    };
    let quota = d.adjustment.cpu_quota.or(spec.cpu_quota);
    let period = d
        .adjustment
        .cpu_period
        .or(spec.cpu_period)
        .unwrap_or(100_000);
    let cpu_max = quota.map_or(format!("max {period}"), |q| format!("{q} {period}"));
    let limit = d.adjustment.memory_limit.or(spec.memory_limit);
    std::fs::write(dir.join("cpu.max"), cpu_max).unwrap();
    std::fs::write(
        dir.join("memory.max"),
        limit.map_or("max".into(), |l| l.to_string()),
    )
    .unwrap();
    std::fs::write(dir.join("cpu.weight"), unified("cpu.weight", "100")).unwrap();
    for (k, def) in [
        ("memory.min", "0"),
        ("memory.low", "0"),
        ("memory.high", "max"),
    ] {
        std::fs::write(dir.join(k), unified(k, def)).unwrap();
    }
}

/// `audit` of `snap` against the temp tree at `root`: the default policy,
/// no `/proc`.
fn audit_tree(
    snap: &audit::Snapshot,
    hierarchy: &HierarchyConfig,
    root: &Path,
) -> audit::AuditReport {
    audit::audit(
        snap,
        &quirks(snap),
        &NODE,
        &Default::default(),
        hierarchy,
        root,
        Path::new("/nonexistent"),
        None,
    )
}

/// The runtime's quirks as its name alone tells them (version unknown).
fn quirks(snap: &audit::Snapshot) -> RuntimeQuirks {
    RuntimeQuirks::decide(&snap.runtime, "", "", true)
}

/// The exact requests of the pods audit listed from the API server.
struct ApiRequests(Vec<(&'static str, &'static str, u64)>);

impl ContainerRequests for ApiRequests {
    fn container_request(&self, pod_uid: &str, container: &str) -> Option<u64> {
        self.0
            .iter()
            .find(|(p, c, _)| *p == pod_uid && *c == container)
            .map(|(_, _, r)| *r)
    }
}

/// The plugin protects a Burstable pod with its exact request
/// from the API server, more than oom_score_adj inversion gives. Without
/// the API, audit takes that protection for the kubelet's Memory QoS and
/// checks nothing; with the pod listed from the API it expects the exact
/// values, checks them (0 drift), and names `api-server` as the source.
#[test]
fn api_server_requests_are_checked_as_ours() {
    const EXACT: u64 = 250 << 20;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let (p, c) = burstable_pod();
    let api = ApiRequests(vec![("uid-b", "ctr-cb", EXACT)]);
    write_expected_with(&root, &p, &c, Some(EXACT));
    let snap = audit::Snapshot {
        pods: vec![p],
        containers: vec![c],
        ..Default::default()
    };
    let with_api = |root: &Path| {
        audit::audit(
            &snap,
            &quirks(&snap),
            &NODE,
            &Default::default(),
            &HierarchyConfig::default(),
            root,
            Path::new("/nonexistent"),
            Some(&api),
        )
    };
    // The hierarchy as the keeper wrote it from the exact request.
    for h in &with_api(&root).hierarchy {
        std::fs::create_dir_all(root.join(&h.cgroup)).unwrap();
    }
    for h in &with_api(&root).hierarchy {
        for ch in &h.checks {
            let want = ch.expected.as_deref().expect("ours with the API");
            std::fs::write(root.join(&h.cgroup).join(&ch.key), want).unwrap();
        }
    }
    let report = with_api(&root);
    let table = audit::render_table(&report);
    assert_eq!(report.drift, 0, "{table}");
    let ctr = &report.containers[0];
    assert_eq!(
        ctr.request_source,
        Some(RequestSource::ApiServer),
        "{table}"
    );
    assert_eq!(ctr.memory_request, Some(EXACT));
    assert!(table.contains("api-server"), "{table}");
    let low = ctr.checks.iter().find(|c| c.key == "memory.low").unwrap();
    assert_eq!(
        (low.owner.label(), low.expected.clone()),
        ("nri-qos", Some(low.actual.clone())),
        "{table}"
    );
    let pod_cg = report
        .hierarchy
        .iter()
        .find(|h| h.cgroup == "kubepods/burstable/podb")
        .expect("the pod cgroup is checked");
    assert!(
        pod_cg
            .checks
            .iter()
            .all(|c| c.expected.is_some() && c.owner.label() == "nri-qos"),
        "{table}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["containers"][0]["requestSource"], "apiServer");

    // Today's behaviour without the API: the same tree reads as the
    // kubelet's protection, reported and never checked.
    let report = audit_tree(&snap, &HierarchyConfig::default(), &root);
    let table = audit::render_table(&report);
    assert_eq!(report.drift, 0, "{table}");
    assert_eq!(
        report.containers[0].request_source,
        Some(RequestSource::OomScoreAdj)
    );
    let pod_cg = report
        .hierarchy
        .iter()
        .find(|h| h.cgroup == "kubepods/burstable/podb")
        .unwrap();
    assert!(
        pod_cg
            .checks
            .iter()
            .all(|c| c.expected.is_none() && c.owner.label() == "kubelet"),
        "{table}"
    );
}

#[tokio::test]
async fn audit_reports_no_drift_on_a_correct_tree_and_flags_a_changed_value() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let root = dir.path().join("cgroup");
    let listener = UnixListener::bind(&sock).unwrap();
    let collect = tokio::spawn({
        let sock = sock.clone();
        async move { audit::collect(&sock, std::time::Duration::from_secs(10), 64 << 20).await }
    });
    let mut s = accept(&listener, false).await;
    let (name, index) = s.expect_registered().await;
    assert_eq!((name.as_str(), index.as_str()), ("nri-qos-audit", "99"));
    let cfg = s
        .plugin
        .configure(ctx(), &api::ConfigureRequest::new())
        .await
        .unwrap();
    assert_ne!(cfg.events, 0, "0 would subscribe the audit to every event");

    let pods = vec![
        pod("g", "/kubepods/podg"),
        pod("b", "/kubepods/burstable/podb"),
        pod("e", "/kubepods/besteffort/pode"),
    ];
    let mut ctrs = vec![
        container("cg", "g", 1024, 100_000, 1 << 30, -997),
        container("cb", "b", 256, 50_000, 512 << 20, 985),
        container("ce", "e", 2, 0, 0, 1000),
    ];
    for (c, parent) in ctrs.iter_mut().zip([
        "kubepods/podg",
        "kubepods/burstable/podb",
        "kubepods/besteffort/pode",
    ]) {
        c.linux.mut_or_insert_default().cgroups_path = format!("/{parent}/{}", c.id);
    }
    for (p, c) in pods.iter().zip(&ctrs) {
        write_expected(&root, p, c);
    }
    for cg in [
        "kubepods",
        "kubepods/burstable",
        "kubepods/besteffort",
        "kubepods/podg",
        "kubepods/burstable/podb",
        "kubepods/besteffort/pode",
    ] {
        std::fs::create_dir_all(root.join(cg)).unwrap();
    }
    let sync = s
        .plugin
        .synchronize(
            ctx(),
            &api::SynchronizeRequest {
                pods: pods.clone(),
                containers: ctrs.clone(),
                ..Default::default()
            },
        )
        .await;
    let (snap, quirks) = collect.await.unwrap().expect("snapshot");
    sync.expect("the audit answers Synchronize before it hangs up");
    assert_eq!(quirks, RuntimeQuirks::decide("", "", "", false));
    assert_eq!(snap.containers.len(), 3);

    // Hierarchy values as the keeper would write them.
    let report = audit_tree(&snap, &HierarchyConfig::default(), &root);
    for h in &report.hierarchy {
        for c in &h.checks {
            let want = c
                .expected
                .as_deref()
                .expect("hierarchy values are all ours");
            std::fs::write(root.join(&h.cgroup).join(&c.key), want).unwrap();
        }
    }
    let report = audit_tree(&snap, &HierarchyConfig::default(), &root);
    assert_eq!(report.drift, 0, "{}", audit::render_table(&report));
    assert_eq!(report.containers.len(), 3);
    assert!(report.hierarchy.len() >= 6, "{report:?}");

    // Someone changes a value behind our back.
    std::fs::write(
        root.join("kubepods/burstable/podb/cb/cpu.max"),
        "max 100000",
    )
    .unwrap();
    let report = audit_tree(&snap, &HierarchyConfig::default(), &root);
    assert_eq!(report.drift, 1);
    let table = audit::render_table(&report);
    assert!(
        table.contains("DRIFT") && table.contains("cpu.max"),
        "{table}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["drift"], 1);

    // The monitor's throttle guard raised memory.high to memory.max: shown
    // as relaxed, not drift; any other value there still is drift, `max`
    // under a finite memory.max too (a container created while no plugin
    // was connected: the guard writes the limit).
    let cb = root.join("kubepods/burstable/podb/cb");
    std::fs::write(cb.join("cpu.max"), "50000 100000").unwrap();
    let max = std::fs::read_to_string(cb.join("memory.max")).unwrap();
    assert_ne!(max.trim(), "max");
    for (high, drift) in [(max.as_str(), 0), ("1234", 1), ("max", 1)] {
        std::fs::write(cb.join("memory.high"), high).unwrap();
        let report = audit_tree(&snap, &HierarchyConfig::default(), &root);
        let table = audit::render_table(&report);
        assert_eq!(report.drift, drift, "{table}");
        assert_eq!(table.contains("relaxed by the throttle guard"), drift == 0);
    }
}

/// The `memoryqos` VM scenario before its kubelet protected the pod cgroup:
/// with the MemoryQoS gate the kubelet sends `unified` memory.min/high
/// through the CRI, runc writes them, but NRI before v0.10 never shows
/// plugins that map. A memory.min on a Burstable container (where the
/// policy sets memory.low) is the kubelet's Memory QoS, as the plugin
/// decides after the container started: the pod's values are the
/// kubelet's, never drift. Without that trace our values are checked.
#[test]
fn a_hidden_kubelet_key_in_a_container_makes_its_pod_the_kubelets() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let (p, c) = burstable_pod();
    write_expected(&root, &p, &c);
    let cg = root.join("kubepods/burstable/podb/cb");
    // What runc wrote from the kubelet's (invisible) unified map.
    std::fs::write(cg.join("memory.min"), "268435456").unwrap();
    let snap = audit::Snapshot {
        pods: vec![p],
        containers: vec![c],
        ..Default::default()
    };
    let hierarchy = HierarchyConfig {
        enabled: false,
        ..Default::default()
    };
    let report = audit_tree(&snap, &hierarchy, &root);
    assert_eq!(report.drift, 0, "{}", audit::render_table(&report));
    let check = |r: &audit::AuditReport, key: &str| {
        r.containers[0]
            .checks
            .iter()
            .find(|c| c.key == key)
            .unwrap()
            .clone()
    };
    let min = check(&report, "memory.min");
    assert_eq!(min.expected, None);
    assert_eq!(min.actual, "268435456");
    assert_eq!(min.owner, Owner::Kubelet);
    // memory.low is the kubelet's too (the container keeps ours from
    // before the plugin knew): not claimed, not drift.
    std::fs::write(cg.join("memory.low"), "0").unwrap();
    let report = audit_tree(&snap, &hierarchy, &root);
    assert_eq!(report.drift, 0, "{}", audit::render_table(&report));
    assert_eq!(check(&report, "memory.low").owner, Owner::Kubelet);

    // No trace of the kubelet: the value the policy claims drifts when changed.
    std::fs::write(cg.join("memory.min"), "0").unwrap();
    let report = audit_tree(&snap, &hierarchy, &root);
    assert_eq!(report.drift, 1, "{}", audit::render_table(&report));
    assert!(audit::render_table(&report).contains("(runtime)"));
}

/// A pod the kubelet's Memory QoS (TieredReservation, factor 0.9)
/// protects. Its values are the kubelet's — never drift, owner `kubelet` —
/// whether the runtime shows its `unified` keys (containerd 2.2+) or hides
/// them (the pod cgroup carried protection before nri-qos wrote anything).
#[test]
fn kubelet_memory_qos_values_are_owned_by_the_kubelet_and_never_drift() {
    const REQ: u64 = 128 << 20;
    const HIGH: u64 = 496_603_136;
    for visible in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cgroup");
        let p = pod("b", "/kubepods/burstable/podb");
        let mut c = container("cb", "b", 102, 50_000, 512 << 20, 993);
        c.linux.mut_or_insert_default().cgroups_path = "/kubepods/burstable/podb/cb".into();
        if visible {
            let r = c
                .linux
                .mut_or_insert_default()
                .resources
                .mut_or_insert_default();
            r.unified.insert("memory.low".into(), REQ.to_string());
            r.unified.insert("memory.high".into(), HIGH.to_string());
            r.unified.insert("memory.oom.group".into(), "1".into());
        }
        write_expected(&root, &p, &c);
        let ctr = root.join("kubepods/burstable/podb/cb");
        // What runc wrote from the kubelet's unified map, and the kubelet itself above.
        std::fs::write(ctr.join("memory.low"), REQ.to_string()).unwrap();
        std::fs::write(ctr.join("memory.high"), HIGH.to_string()).unwrap();
        for (cg, min, low) in [
            ("kubepods", REQ, 0),
            ("kubepods/burstable", 0, REQ),
            ("kubepods/burstable/podb", 0, REQ),
        ] {
            std::fs::create_dir_all(root.join(cg)).unwrap();
            std::fs::write(root.join(cg).join("memory.min"), min.to_string()).unwrap();
            std::fs::write(root.join(cg).join("memory.low"), low.to_string()).unwrap();
        }
        let snap = audit::Snapshot {
            pods: vec![p],
            containers: vec![c],
            ..Default::default()
        };
        let report = audit_tree(&snap, &HierarchyConfig::default(), &root);
        let table = audit::render_table(&report);
        assert_eq!(report.drift, 0, "visible {visible}:\n{table}");
        for h in &report.hierarchy {
            for ch in &h.checks {
                assert_eq!(
                    ch.owner.label(),
                    "kubelet",
                    "{} {}:\n{table}",
                    h.cgroup,
                    ch.key
                );
            }
        }
        assert_eq!(report.hierarchy.len(), 3, "{table}");
        for key in ["memory.low", "memory.high"] {
            let ch = report.containers[0]
                .checks
                .iter()
                .find(|c| c.key == key)
                .unwrap();
            assert_eq!(ch.owner.label(), "kubelet", "{key}:\n{table}");
        }
        let w = report.containers[0]
            .checks
            .iter()
            .find(|c| c.key == "cpu.weight")
            .unwrap();
        assert_eq!(w.owner.label(), "nri-qos");
        assert!(table.contains("OWNER"), "{table}");
    }
}

/// Only CRI-O forgets an in-place resize when it restarts, so only there
/// does audit expect the kernel's memory.max; on containerd a memory.max
/// unlike the report is drift.
#[test]
fn the_kernels_limits_stand_in_for_the_report_on_cri_o_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let (p, c) = burstable_pod();
    write_expected(&root, &p, &c);
    let cg = root.join("kubepods/burstable/podb/cb");
    std::fs::write(cg.join("memory.max"), "805306368").unwrap();
    let hierarchy = HierarchyConfig {
        enabled: false,
        ..Default::default()
    };
    for (runtime, max_drifts) in [("containerd", true), ("cri-o", false)] {
        let snap = audit::Snapshot {
            pods: vec![p.clone()],
            containers: vec![c.clone()],
            runtime: runtime.into(),
            ..Default::default()
        };
        let report = audit_tree(&snap, &hierarchy, &root);
        let max = report.containers[0]
            .checks
            .iter()
            .find(|c| c.key == "memory.max")
            .unwrap();
        assert_eq!(
            max.expected.as_deref() != Some(max.actual.as_str()),
            max_drifts,
            "{runtime}: {}",
            audit::render_table(&report)
        );
    }
}

/// After a restart containerd 2.2/2.3 report the container's `unified` map
/// with nri-qos's own adjustment merged in; audit reads it as the plugin
/// does (the keys its annotation names are nri-qos's), so nothing is taken
/// for the kubelet's and the tree the plugin and keeper wrote shows no drift.
#[test]
fn a_restarted_runtimes_merged_report_is_audited_as_the_plugin_reads_it() {
    use nri_qos::nri::view;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let (p, mut c) = burstable_pod();
    let r = c
        .linux
        .mut_or_insert_default()
        .resources
        .mut_or_insert_default();
    r.unified.insert("memory.oom.group".into(), "1".into());
    write_expected(&root, &p, &c);
    let q = RuntimeQuirks::decide("containerd", "v2.3.4", "v0.12.0", true);
    let policy = Default::default();
    let (_, d) = view::decide(
        &convert::pod_from_wire(&p),
        &c,
        view::Source::Reported,
        &q,
        (&NODE, &policy),
        None,
    );
    let adjust = view::create_adjustment(d.adjustment, OomField::Carry);
    let mut merged = c.clone();
    merged.annotations.extend(adjust.annotations.clone());
    let unified = &mut merged
        .linux
        .mut_or_insert_default()
        .resources
        .mut_or_insert_default()
        .unified;
    unified.extend(adjust.linux.resources.unified.clone());
    assert!(unified.contains_key("memory.low"));
    let snap = audit::Snapshot {
        pods: vec![p],
        containers: vec![merged],
        runtime: "containerd".into(),
        ..Default::default()
    };
    let run = |root: &Path| {
        audit::audit(
            &snap,
            &q,
            &NODE,
            &policy,
            &HierarchyConfig::default(),
            root,
            Path::new("/nonexistent"),
            None,
        )
    };
    // The hierarchy as the keeper wrote it.
    for h in &run(&root).hierarchy {
        std::fs::create_dir_all(root.join(&h.cgroup)).unwrap();
        for ch in &h.checks {
            let want = ch.expected.as_deref().expect("ours, not the kubelet's");
            std::fs::write(root.join(&h.cgroup).join(&ch.key), want).unwrap();
        }
    }
    let report = run(&root);
    let table = audit::render_table(&report);
    assert_eq!(report.drift, 0, "{table}");
    assert!(
        report
            .hierarchy
            .iter()
            .all(|h| h.checks.iter().all(|c| c.owner == Owner::NriQos)),
        "{table}"
    );
    let low = report.containers[0]
        .checks
        .iter()
        .find(|c| c.key == "memory.low")
        .unwrap();
    assert_eq!(low.owner, Owner::NriQos, "{table}");
    assert_eq!(
        report.containers[0].request_source,
        Some(RequestSource::OomScoreAdj),
        "{table}"
    );
}
