//! A runtime restart leaves ownership, request sources and every kernel
//! value as they were, and a pod created after it is protected in its
//! parents like one created before: the plugin and the hierarchy keeper on
//! a temp cgroup tree, the runtime replayed as each kind reports after a
//! restart. containerd 2.2/2.3 and CRI-O show the CRI's `unified` map with
//! every plugin's earlier adjustment merged in (the spec holds both);
//! containerd 1.7/2.1 show none of it.

// Test code: a failed unwrap is the test failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use nri_qos::keeper::{HierarchyConfig, Keeper};
use nri_qos::node::lock;
use nri_qos::nri::proto::api;
use nri_qos::nri::proto::api_ttrpc::Plugin;
use nri_qos::nri::{PluginSettings, QosPlugin};
use nri_qos::qos::{NodeFacts, PolicyConfig};
use protobuf::MessageField;
use ttrpc::r#async::TtrpcContext;

const MI: i64 = 1 << 20;
const MEM: u64 = 16 << 30;
const CGROUPS: [&str; 5] = [
    "kubepods",
    "kubepods/burstable",
    "kubepods/burstable/poda",
    "kubepods/burstable/podb",
    "kubepods/burstable/podc",
];

/// A runtime as Configure describes it.
#[derive(Debug, Clone, Copy)]
struct Runtime {
    name: &'static str,
    version: &'static str,
    nri: &'static str,
    /// It shows plugins the `unified` map, merged with adjustments.
    shows_unified: bool,
}

const RUNTIMES: [Runtime; 5] = [
    Runtime {
        name: "containerd",
        version: "v2.3.4",
        nri: "v0.12.0",
        shows_unified: true,
    },
    Runtime {
        name: "containerd",
        version: "v2.2.7",
        nri: "",
        shows_unified: true,
    },
    Runtime {
        name: "cri-o",
        version: "1.37.0",
        nri: "v0.12.0",
        shows_unified: true,
    },
    Runtime {
        name: "containerd",
        version: "2.1.9",
        nri: "",
        shows_unified: false,
    },
    Runtime {
        name: "containerd",
        version: "1.7.24~ds1",
        nri: "",
        shows_unified: false,
    },
];

fn ctx() -> TtrpcContext {
    TtrpcContext::default()
}

fn plugin(root: &Path) -> QosPlugin {
    QosPlugin::new(PluginSettings {
        policy: PolicyConfig::default(),
        node: NodeFacts {
            memory_capacity: MEM,
            memory_allocatable: MEM - (1 << 30),
            page_size: 4096,
            cgroup_v2: true,
        },
        dry_run: false,
        adjust_existing: true,
        proc_root: "/nonexistent".into(),
        cgroup_root: root.to_path_buf(),
    })
}

async fn configure(p: &QosPlugin, rt: Runtime) {
    let req = api::ConfigureRequest {
        runtime_name: rt.name.into(),
        runtime_version: rt.version.into(),
        NRI_version: rt.nri.into(),
        request_timeout: 2000,
        registration_timeout: 5000,
        ..Default::default()
    };
    p.configure(&ctx(), req).await.unwrap();
}

fn pod(id: &str) -> api::PodSandbox {
    let mut linux = api::LinuxPodSandbox::new();
    linux.cgroup_parent = format!("/kubepods/burstable/pod{id}");
    api::PodSandbox {
        id: id.into(),
        uid: format!("uid-{id}"),
        name: id.into(),
        namespace: "ns".into(),
        linux: MessageField::some(linux),
        ..Default::default()
    }
}

/// A Burstable 256Mi → 512Mi container as the kubelet asks for it (the
/// kubelet's oom_score_adj 985 on 16 GiB; `unified`: memory.oom.group, and
/// the Memory QoS keys when `memory_qos`).
fn cri_container(id: &str, pod: &str, memory_qos: bool) -> api::Container {
    let mut r = api::LinuxResources::new();
    r.cpu
        .mut_or_insert_default()
        .shares
        .mut_or_insert_default()
        .value = 256;
    r.memory
        .mut_or_insert_default()
        .limit
        .mut_or_insert_default()
        .value = 512 * MI;
    r.unified.insert("memory.oom.group".into(), "1".into());
    if memory_qos {
        // TieredReservation: memory.low = request; factor 0.9.
        r.unified
            .insert("memory.low".into(), (256 * MI).to_string());
        r.unified.insert("memory.high".into(), "510025728".into());
    }
    let mut linux = api::LinuxContainer::new();
    linux.resources = MessageField::some(r);
    linux.oom_score_adj = MessageField::some(api::OptionalInt {
        value: 985,
        ..Default::default()
    });
    linux.cgroups_path = format!("/kubepods/burstable/pod{pod}/{id}");
    api::Container {
        id: id.into(),
        pod_sandbox_id: pod.into(),
        name: "app".into(),
        state: protobuf::EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING),
        linux: MessageField::some(linux),
        ..Default::default()
    }
}

/// The container as the runtime's spec keeps it once `adjust` was applied
/// (and runc wrote its `unified` map into the cgroup), and as it reports it
/// after a restart: the map merged, or none at all before NRI v0.10.
fn created(
    root: &Path,
    rt: Runtime,
    c: &api::Container,
    adjust: &api::ContainerAdjustment,
    annotate: bool,
) -> api::Container {
    let mut spec = c.clone();
    if annotate {
        spec.annotations.extend(adjust.annotations.clone());
    }
    let unified = &mut spec
        .linux
        .mut_or_insert_default()
        .resources
        .mut_or_insert_default()
        .unified;
    if let Some(r) = adjust.linux.as_ref().and_then(|l| l.resources.as_ref()) {
        unified.extend(r.unified.clone());
    }
    let dir = root.join(c.linux.cgroups_path.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).unwrap();
    for (key, default) in [
        ("memory.min", "0"),
        ("memory.low", "0"),
        ("memory.high", "max"),
    ] {
        let v = unified.get(key).map_or(default, String::as_str);
        std::fs::write(dir.join(key), format!("{v}\n")).unwrap();
    }
    if !rt.shows_unified {
        unified.clear();
    }
    spec
}

/// The kubelet's Memory QoS writes a pod's cgroup before its sandbox.
fn kubelet_protects_pod(root: &Path, id: &str) {
    let dir = root.join(format!("kubepods/burstable/pod{id}"));
    std::fs::write(dir.join("memory.low"), format!("{}\n", 256 * MI)).unwrap();
}

/// Every pod/QoS/kubepods value of the tree.
fn tree_values(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for cg in CGROUPS {
        for f in ["memory.min", "memory.low"] {
            let v = std::fs::read_to_string(root.join(cg).join(f)).unwrap();
            out.insert(format!("{cg}/{f}"), v.trim().to_string());
        }
    }
    out
}

/// Every pod and container record, and the owners decided.
fn records(p: &QosPlugin) -> (Vec<String>, Vec<String>) {
    let reg = p.registry();
    let reg = lock(&reg);
    let mut records: Vec<String> = reg.pods.values().map(|r| format!("{r:?}")).collect();
    records.extend(reg.containers.values().map(|r| format!("{r:?}")));
    records.sort();
    let mut owners: Vec<String> = reg.owners.iter().map(|o| format!("{o:?}")).collect();
    owners.sort();
    (records, owners)
}

/// One keeper pass over what `p` knows: (written, kubelet-owned).
fn keep(k: &mut Keeper, p: &QosPlugin) -> (usize, usize) {
    let reg = p.registry();
    let pods = k.pods_from_registry(&lock(&reg));
    let r = k.reconcile(&pods);
    assert_eq!(r.failed, 0, "{r:?}");
    (r.written, r.kubelet_owned)
}

/// Pod `id` run and its one container created on `p`; the container as
/// the runtime then keeps it.
async fn run_pod(
    root: &Path,
    p: &QosPlugin,
    rt: Runtime,
    id: &str,
    memory_qos: bool,
    annotate: bool,
) -> (api::PodSandbox, api::Container, api::ContainerAdjustment) {
    if memory_qos {
        kubelet_protects_pod(root, id);
    }
    let sandbox = pod(id);
    let req = api::RunPodSandboxRequest {
        pod: MessageField::some(sandbox.clone()),
        ..Default::default()
    };
    p.run_pod_sandbox(&ctx(), req).await.unwrap();
    let c = cri_container(&format!("c{id}"), id, memory_qos);
    let req = api::CreateContainerRequest {
        pod: MessageField::some(sandbox.clone()),
        container: MessageField::some(c.clone()),
        ..Default::default()
    };
    let adjust = p
        .create_container(&ctx(), req)
        .await
        .unwrap()
        .adjust
        .unwrap();
    let kept = created(root, rt, &c, &adjust, annotate);
    (sandbox, kept, adjust)
}

/// Before and after a restart of `rt`: records, owners, every kernel value
/// and the protection of a pod created afterwards.
async fn a_restart_changes_nothing(rt: Runtime, memory_qos: bool, annotate: bool) {
    let case = format!("{rt:?} memory_qos={memory_qos} annotated={annotate}");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for cg in CGROUPS {
        std::fs::create_dir_all(root.join(cg)).unwrap();
        for f in ["memory.min", "memory.low"] {
            std::fs::write(root.join(cg).join(f), "0\n").unwrap();
        }
    }
    let before = plugin(root);
    configure(&before, rt).await;
    let mut keeper = Keeper::new(root.to_path_buf(), HierarchyConfig::default(), MEM);
    let mut pods = Vec::new();
    let mut containers = Vec::new();
    for id in ["a", "b"] {
        let (p, c, _) = run_pod(root, &before, rt, id, memory_qos, annotate).await;
        pods.push(p);
        containers.push(c);
    }
    let (_, kubelet_owned_before) = keep(&mut keeper, &before);
    assert_eq!(kubelet_owned_before > 0, memory_qos, "{case}");
    let tree = tree_values(root);
    if !memory_qos {
        assert_ne!(
            tree["kubepods/burstable/memory.low"], "0",
            "{case}: {tree:?}"
        );
    }
    if rt.shows_unified && !memory_qos {
        // The report holds our memory.low: the kubelet's key, read naively.
        assert!(
            containers[0]
                .linux
                .resources
                .unified
                .contains_key("memory.low"),
            "{case}"
        );
    }

    // The runtime restarts: a new plugin, a new keeper, one Synchronize.
    let after = plugin(root);
    configure(&after, rt).await;
    let sync = api::SynchronizeRequest {
        pods: pods.clone(),
        containers: containers.clone(),
        ..Default::default()
    };
    let updates = after.synchronize(&ctx(), sync).await.unwrap().update;
    let (records_before, owners_before) = records(&before);
    let (records_after, owners_after) = records(&after);
    assert_eq!(records_after, records_before, "{case}");
    // Where the kubelet protects, the plugin saw it first in its pod
    // cgroup before the sandbox; after the restart its keys tell.
    if !memory_qos {
        assert_eq!(owners_after, owners_before, "{case}");
        assert!(owners_after.is_empty(), "{case}: {owners_after:?}");
    }
    // The updates hold what the kernel has: no value changes.
    for u in &updates {
        let c = containers.iter().find(|c| c.id == u.container_id).unwrap();
        let dir = root.join(c.linux.cgroups_path.trim_start_matches('/'));
        for (key, value) in &u.linux.resources.unified {
            if key.starts_with("memory.") {
                let kernel = std::fs::read_to_string(dir.join(key)).unwrap();
                assert_eq!(kernel.trim(), value, "{case}: {key} of {}", c.id);
            }
        }
    }
    let mut keeper = Keeper::new(root.to_path_buf(), HierarchyConfig::default(), MEM);
    let (written, kubelet_owned) = keep(&mut keeper, &after);
    assert_eq!(written, 0, "{case}: the tree is already right");
    assert_eq!(kubelet_owned, kubelet_owned_before, "{case}");
    assert_eq!(tree_values(root), tree, "{case}");

    // A pod created after the restart is protected in its parents.
    let (_, _, adjust) = run_pod(root, &after, rt, "c", memory_qos, annotate).await;
    keep(&mut keeper, &after);
    let now = tree_values(root);
    if memory_qos {
        assert!(
            !adjust.linux.resources.unified.contains_key("memory.low"),
            "{case}"
        );
        assert_eq!(
            now["kubepods/burstable/memory.low"], tree["kubepods/burstable/memory.low"],
            "{case}"
        );
    } else {
        let low = &adjust.linux.resources.unified["memory.low"];
        assert_eq!(&now["kubepods/burstable/podc/memory.low"], low, "{case}");
        let parent = |t: &BTreeMap<String, String>, cg: &str| -> u64 {
            t[&format!("{cg}/memory.low")].parse().unwrap()
        };
        let added = low.parse::<u64>().unwrap();
        for cg in ["kubepods/burstable", "kubepods"] {
            assert_eq!(parent(&now, cg), parent(&tree, cg) + added, "{case}: {cg}");
        }
    }
}

#[tokio::test]
async fn a_runtime_restart_leaves_ownership_and_every_value_as_it_was() {
    for rt in RUNTIMES {
        a_restart_changes_nothing(rt, false, true).await;
    }
}

/// The kubelet's own Memory QoS values (memory.low equal to what nri-qos
/// would set) stay the kubelet's across the restart.
#[tokio::test]
async fn the_kubelets_memory_qos_stays_the_kubelets_across_a_restart() {
    for rt in RUNTIMES.into_iter().filter(|rt| rt.shows_unified) {
        a_restart_changes_nothing(rt, true, true).await;
    }
}

/// Containers adjusted without the annotation (by an older nri-qos): their
/// memory keys count as hidden, and the tree decides as on containerd 2.1.
#[tokio::test]
async fn containers_adjusted_without_the_annotation_are_read_from_the_tree() {
    for rt in RUNTIMES.into_iter().filter(|rt| rt.shows_unified) {
        a_restart_changes_nothing(rt, false, false).await;
    }
}
