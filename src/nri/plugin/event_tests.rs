//! The events a runtime may send on their own RPC (NRI v0.12) or through
//! StateChange leave the same plugin behind either way; Configure's quirks
//! and event mask; the pod-level resize.

use std::path::Path;

use proptest::prelude::*;
use protobuf::MessageField;

use super::*;
use crate::node::runtime::RuntimeQuirks;

const MI: i64 = 1 << 20;

fn plugin(root: &Path) -> QosPlugin {
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

fn ctx() -> TtrpcContext {
    TtrpcContext::default()
}

/// Configure as `name` `version` with `nri` (empty before v0.12) sends it.
async fn configured(p: &QosPlugin, name: &str, version: &str, nri: &str) -> api::ConfigureResponse {
    let req = api::ConfigureRequest {
        runtime_name: name.into(),
        runtime_version: version.into(),
        NRI_version: nri.into(),
        request_timeout: 2000,
        registration_timeout: 5000,
        ..Default::default()
    };
    p.configure(&ctx(), req).await.unwrap()
}

/// Pod `i` in the Burstable QoS cgroup, with a pod-level memory limit.
fn pod(i: usize, limit: i64) -> api::PodSandbox {
    let mut linux = api::LinuxPodSandbox::new();
    linux.cgroup_parent = format!("/kubepods/burstable/podu{i}");
    let resources = linux.pod_resources.mut_or_insert_default();
    resources
        .memory
        .mut_or_insert_default()
        .limit
        .mut_or_insert_default()
        .value = limit;
    api::PodSandbox {
        id: format!("p{i}"),
        uid: format!("u{i}"),
        name: format!("pod{i}"),
        namespace: "ns".into(),
        linux: MessageField::some(linux),
        ..Default::default()
    }
}

/// Container `j` of pod `i`: 256 shares, `limit`, the kubelet's 985.
fn container(i: usize, j: usize, limit: i64) -> api::Container {
    let mut res = api::LinuxResources::new();
    res.cpu
        .mut_or_insert_default()
        .shares
        .mut_or_insert_default()
        .value = 256;
    res.memory
        .mut_or_insert_default()
        .limit
        .mut_or_insert_default()
        .value = limit;
    let mut linux = api::LinuxContainer::new();
    linux.resources = MessageField::some(res);
    linux.oom_score_adj = MessageField::some(api::OptionalInt {
        value: 985,
        ..Default::default()
    });
    linux.cgroups_path = format!("/kubepods/burstable/podu{i}/c{i}{j}");
    api::Container {
        id: format!("c{i}{j}"),
        pod_sandbox_id: format!("p{i}"),
        name: format!("app{j}"),
        state: protobuf::EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING),
        linux: MessageField::some(linux),
        ..Default::default()
    }
}

/// A tree where container 0 of pod 0 and container 1 of pod 1 hold the
/// kubelet's hidden memory.min: learnt at their start on a runtime hiding
/// `unified`.
fn tree(root: &Path) {
    for i in 0..3 {
        let pod_cg = root.join(format!("kubepods/burstable/podu{i}"));
        std::fs::create_dir_all(&pod_cg).unwrap();
        for f in ["memory.min", "memory.low"] {
            std::fs::write(pod_cg.join(f), "0\n").unwrap();
        }
        for j in 0..2 {
            let c = pod_cg.join(format!("c{i}{j}"));
            std::fs::create_dir_all(&c).unwrap();
            let hidden = matches!((i, j), (0, 0) | (1, 1));
            let min = if hidden { "268435456" } else { "0" };
            std::fs::write(c.join("memory.min"), format!("{min}\n")).unwrap();
        }
    }
}

/// Everything the plugin holds that an event may change.
fn state(p: &QosPlugin) -> (Vec<String>, Vec<String>, Counters) {
    let reg = lock(&p.registry);
    let mut records: Vec<String> = reg.pods.values().map(|r| format!("{r:?}")).collect();
    records.extend(reg.containers.values().map(|r| format!("{r:?}")));
    records.sort();
    let mut owners: Vec<String> = reg.owners.iter().map(|o| format!("{o:?}")).collect();
    owners.sort();
    drop(reg);
    (records, owners, p.counters())
}

/// An event of the kind that has two forms, delivered on `path`.
async fn deliver(
    p: &QosPlugin,
    event: api::Event,
    pod: &api::PodSandbox,
    c: &api::Container,
    path: EventPath,
) {
    if path == EventPath::StateChange {
        let req = api::StateChangeEvent {
            event: event.into(),
            pod: MessageField::some(pod.clone()),
            // A pod event carries no container.
            container: MessageField::from_option((!c.id.is_empty()).then(|| c.clone())),
            ..Default::default()
        };
        p.state_change(&ctx(), req).await.unwrap();
        return;
    }
    let (pod, ctr) = (
        MessageField::some(pod.clone()),
        MessageField::some(c.clone()),
    );
    use api::Event as E;
    match event {
        E::RUN_POD_SANDBOX => {
            let req = api::RunPodSandboxRequest {
                pod,
                ..Default::default()
            };
            p.run_pod_sandbox(&ctx(), req).await.map(drop)
        }
        E::STOP_POD_SANDBOX => {
            let req = api::StopPodSandboxRequest {
                pod,
                ..Default::default()
            };
            p.stop_pod_sandbox(&ctx(), req).await.map(drop)
        }
        E::REMOVE_POD_SANDBOX => {
            let req = api::RemovePodSandboxRequest {
                pod,
                ..Default::default()
            };
            p.remove_pod_sandbox(&ctx(), req).await.map(drop)
        }
        E::POST_UPDATE_POD_SANDBOX => {
            let req = api::PostUpdatePodSandboxRequest {
                pod,
                ..Default::default()
            };
            p.post_update_pod_sandbox(&ctx(), req).await.map(drop)
        }
        E::POST_CREATE_CONTAINER => {
            let req = api::PostCreateContainerRequest {
                pod,
                container: ctr,
                ..Default::default()
            };
            p.post_create_container(&ctx(), req).await.map(drop)
        }
        E::START_CONTAINER => {
            let req = api::StartContainerRequest {
                pod,
                container: ctr,
                ..Default::default()
            };
            p.start_container(&ctx(), req).await.map(drop)
        }
        E::POST_START_CONTAINER => {
            let req = api::PostStartContainerRequest {
                pod,
                container: ctr,
                ..Default::default()
            };
            p.post_start_container(&ctx(), req).await.map(drop)
        }
        E::POST_UPDATE_CONTAINER => {
            let req = api::PostUpdateContainerRequest {
                pod,
                container: ctr,
                ..Default::default()
            };
            p.post_update_container(&ctx(), req).await.map(drop)
        }
        E::REMOVE_CONTAINER => {
            let req = api::RemoveContainerRequest {
                pod,
                container: ctr,
                ..Default::default()
            };
            p.remove_container(&ctx(), req).await.map(drop)
        }
        other => panic!("{other:?} has one form only"),
    }
    .unwrap();
}

/// Every event a runtime may send either way.
const TWO_FORMS: [api::Event; 9] = [
    api::Event::RUN_POD_SANDBOX,
    api::Event::STOP_POD_SANDBOX,
    api::Event::REMOVE_POD_SANDBOX,
    api::Event::POST_UPDATE_POD_SANDBOX,
    api::Event::POST_CREATE_CONTAINER,
    api::Event::START_CONTAINER,
    api::Event::POST_START_CONTAINER,
    api::Event::POST_UPDATE_CONTAINER,
    api::Event::REMOVE_CONTAINER,
];

/// One plugin per path, each with pod 0 run and its two containers
/// created, on a runtime that hides `unified` (so a start reads the tree).
async fn twins(root: &Path) -> [QosPlugin; 2] {
    let twins = [plugin(root), plugin(root)];
    for (p, path) in twins
        .iter()
        .zip([EventPath::Dedicated, EventPath::StateChange])
    {
        configured(p, "containerd", "2.1.9", "").await;
        let none = api::Container::default();
        deliver(p, api::Event::RUN_POD_SANDBOX, &pod(0, 0), &none, path).await;
        for j in 0..2 {
            let req = api::CreateContainerRequest {
                pod: MessageField::some(pod(0, 0)),
                container: MessageField::some(container(0, j, 512 * MI)),
                ..Default::default()
            };
            p.create_container(&ctx(), req).await.unwrap();
        }
    }
    twins
}

/// Each event on its own RPC changes what its StateChange changes: the
/// same registry, owners and counters, only the path counted differs.
#[tokio::test]
async fn every_per_event_rpc_does_what_its_state_change_does() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    for event in TWO_FORMS {
        let [dedicated, state_change] = twins(dir.path()).await;
        assert_eq!(state(&dedicated), state(&state_change), "before {event:?}");
        let before = state(&dedicated);
        let is_pod_event = matches!(
            event,
            api::Event::RUN_POD_SANDBOX
                | api::Event::STOP_POD_SANDBOX
                | api::Event::REMOVE_POD_SANDBOX
                | api::Event::POST_UPDATE_POD_SANDBOX
        );
        let c = if is_pod_event {
            api::Container::default()
        } else {
            container(0, 0, 512 * MI)
        };
        let p = pod(0, 0);
        deliver(&dedicated, event, &p, &c, EventPath::Dedicated).await;
        deliver(&state_change, event, &p, &c, EventPath::StateChange).await;
        let after = state(&dedicated);
        assert_eq!(after, state(&state_change), "{event:?}");
        let changes = matches!(
            event,
            api::Event::REMOVE_POD_SANDBOX
                | api::Event::POST_START_CONTAINER
                | api::Event::REMOVE_CONTAINER
        );
        assert_eq!(
            after != before,
            changes,
            "{event:?}: {before:?} -> {after:?}"
        );
        let label = super::events::event_label(event);
        for (p, path) in [(&dedicated, "dedicated"), (&state_change, "state_change")] {
            let line = format!("nri_qos_events_total{{event=\"{label}\",path=\"{path}\"}}");
            assert!(p.metrics().render().contains(&line), "{line}");
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    RunPod(usize),
    Create(usize, usize),
    Update(usize, usize, i64),
    Stop(usize, usize),
    Resize(usize, i64),
    /// An event with two forms, for a pod and maybe one of its containers.
    Event(api::Event, usize, Option<usize>),
}

/// Ops on two pods of two containers each; the two-form events most often.
fn arb_op() -> impl Strategy<Value = Op> {
    let (pods, ctrs) = (0..2usize, 0..2usize);
    let limit = 1i64..2048;
    prop_oneof![
        1 => pods.clone().prop_map(Op::RunPod),
        2 => (pods.clone(), ctrs.clone()).prop_map(|(i, j)| Op::Create(i, j)),
        1 => (pods.clone(), ctrs.clone(), limit.clone()).prop_map(|(i, j, l)| Op::Update(i, j, l * MI)),
        1 => (pods.clone(), ctrs.clone()).prop_map(|(i, j)| Op::Stop(i, j)),
        1 => (pods.clone(), limit).prop_map(|(i, l)| Op::Resize(i, l * MI)),
        6 => (prop::sample::select(TWO_FORMS.to_vec()), pods, prop::option::weighted(0.8, ctrs))
            .prop_map(|(e, i, j)| Op::Event(e, i, j)),
    ]
}

/// Both pods run and their containers created, then `ops`.
fn with_setup(ops: Vec<Op>) -> Vec<Op> {
    let mut all = vec![Op::RunPod(0), Op::RunPod(1)];
    all.extend((0..2).flat_map(|i| (0..2).map(move |j| Op::Create(i, j))));
    all.extend(ops);
    all
}

/// What the runtime gets back from the events that answer.
#[derive(Debug, PartialEq)]
enum Answer {
    None,
    Create(api::CreateContainerResponse),
    Update(api::UpdateContainerResponse),
    Stop(api::StopContainerResponse),
    Resize(api::UpdatePodSandboxResponse),
}

/// Applies `op` to `p`, events with two forms on `path`.
async fn apply(p: &QosPlugin, op: &Op, path: EventPath) -> Answer {
    let pod_msg = |i| MessageField::some(pod(i, 1 << 30));
    match *op {
        Op::RunPod(i) => {
            let none = api::Container::default();
            deliver(
                p,
                api::Event::RUN_POD_SANDBOX,
                &pod(i, 1 << 30),
                &none,
                path,
            )
            .await;
            Answer::None
        }
        Op::Create(i, j) => {
            let req = api::CreateContainerRequest {
                pod: pod_msg(i),
                container: MessageField::some(container(i, j, 512 * MI)),
                ..Default::default()
            };
            Answer::Create(p.create_container(&ctx(), req).await.unwrap())
        }
        Op::Update(i, j, limit) => {
            let c = container(i, j, 512 * MI);
            let req = api::UpdateContainerRequest {
                pod: pod_msg(i),
                linux_resources: container(i, j, limit).linux.resources.clone(),
                container: MessageField::some(c),
                ..Default::default()
            };
            Answer::Update(p.update_container(&ctx(), req).await.unwrap())
        }
        Op::Stop(i, j) => {
            let req = api::StopContainerRequest {
                pod: pod_msg(i),
                container: MessageField::some(container(i, j, 512 * MI)),
                ..Default::default()
            };
            Answer::Stop(p.stop_container(&ctx(), req).await.unwrap())
        }
        Op::Resize(i, limit) => {
            let req = api::UpdatePodSandboxRequest {
                pod: pod_msg(i),
                linux_resources: pod(i, limit).linux.pod_resources.clone(),
                ..Default::default()
            };
            Answer::Resize(p.update_pod_sandbox(&ctx(), req).await.unwrap())
        }
        Op::Event(event, i, j) => {
            let c = j.map_or_else(api::Container::default, |j| container(i, j, 512 * MI));
            deliver(p, event, &pod(i, 1 << 30), &c, path).await;
            Answer::None
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any sequence of pod and container events, those with two forms
    /// delivered on their own RPC to one plugin and through StateChange to
    /// the other: every answer and the state left behind are the same.
    #[test]
    fn random_event_sequences_delivered_either_way_leave_identical_state(
        ops in prop::collection::vec(arb_op(), 1..40).prop_map(with_setup),
        hides_unified in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (a, b) = (plugin(dir.path()), plugin(dir.path()));
            let version = if hides_unified { "2.1.9" } else { "v2.3.4" };
            for p in [&a, &b] {
                configured(p, "containerd", version, "").await;
            }
            for op in &ops {
                let answers = (
                    apply(&a, op, EventPath::Dedicated).await,
                    apply(&b, op, EventPath::StateChange).await,
                );
                prop_assert_eq!(answers.0, answers.1, "{:?}", op);
            }
            prop_assert_eq!(state(&a), state(&b));
            Ok(())
        })?;
    }
}

/// Configure decides the quirks once, and the mask asks a runtime for no
/// event it does not know.
#[tokio::test]
async fn configure_decides_the_quirks_and_an_event_mask_the_runtime_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let update_pod = 1 << (api::Event::UPDATE_POD_SANDBOX as i32 - 1);
    for (name, version, nri, valid, pod_updates) in [
        ("containerd", "1.7.24~ds1", "", 0x7FF, false),
        ("containerd", "2.1.9", "", 0x7FF, false),
        ("containerd", "v2.2.7", "", 0x3FFF, true),
        ("containerd", "v2.3.4", "v0.12.0", 0x3FFF, true),
        ("cri-o", "1.37.0", "v0.12.0", 0x3FFF, true),
        ("something", "1.0", "", 0x7FF, false),
    ] {
        let p = plugin(dir.path());
        let events = configured(&p, name, version, nri).await.events;
        assert_eq!(events & !valid, 0, "{name} {version}: {events:#x}");
        assert_eq!(events & update_pod != 0, pod_updates, "{name} {version}");
        assert_eq!(events & EVENTS, EVENTS);
        let q = p.quirks();
        assert_eq!(q, RuntimeQuirks::decide(name, version, nri, true));
        assert_eq!(
            p.runtime_info().unwrap().request_timeout,
            Some(Duration::from_secs(2))
        );
    }
}

/// A pod-level resize: the pod's memory limit follows, and with it the
/// request the monitor ranks it by and (through the keeper) its
/// protection; the class stays; later reports of the pod carrying its
/// first resources (containerd, CRI-O) do not undo it.
#[tokio::test]
async fn a_pod_level_resize_moves_the_pods_limit_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let p = plugin(dir.path());
    configured(&p, "containerd", "v2.3.4", "v0.12.0").await;
    // Two containers inheriting a 1Gi pod-level limit, each asking ~1Gi
    // (the kubelet's 938 on 16 GiB).
    let shared = 1 << 30;
    let sandbox = pod(1, shared);
    let none = api::Container::default();
    deliver(
        &p,
        api::Event::RUN_POD_SANDBOX,
        &sandbox,
        &none,
        EventPath::Dedicated,
    )
    .await;
    for j in 0..2 {
        let mut c = container(1, j, shared);
        c.linux
            .mut_or_insert_default()
            .oom_score_adj
            .mut_or_insert_default()
            .value = 938;
        let req = api::CreateContainerRequest {
            pod: MessageField::some(sandbox.clone()),
            container: MessageField::some(c),
            ..Default::default()
        };
        p.create_container(&ctx(), req).await.unwrap();
    }
    let info = |p: &QosPlugin| {
        let reg = lock(&p.registry);
        let record = reg.pods["p1"].clone();
        (record.memory_limit, reg.pod_info(&record).memory_request)
    };
    let classes = |p: &QosPlugin| {
        let reg = lock(&p.registry);
        let mut c: Vec<_> = reg
            .containers
            .values()
            .map(|c| (c.id.clone(), c.class))
            .collect();
        c.sort();
        c
    };
    let sum: u64 = lock(&p.registry)
        .containers
        .values()
        .filter_map(|c| c.memory_request)
        .sum();
    assert!(
        sum > 1 << 30,
        "the containers' requests add up past the pod: {sum}"
    );
    assert_eq!(info(&p), (Some(1 << 30), Some(1 << 30)));
    let before = classes(&p);

    let changes = p.subscribe_changes();
    let resized = api::UpdatePodSandboxRequest {
        pod: MessageField::some(sandbox.clone()),
        linux_resources: pod(1, 3 << 29).linux.pod_resources.clone(),
        ..Default::default()
    };
    p.update_pod_sandbox(&ctx(), resized.clone()).await.unwrap();
    assert!(changes.has_changed().unwrap(), "the keeper is told");
    assert_eq!(info(&p), (Some(3 << 29), Some(sum.min(3 << 29))));
    assert_eq!(classes(&p), before, "the class never changes on resize");

    // containerd's later reports still carry the pod's first resources.
    let req = api::CreateContainerRequest {
        pod: MessageField::some(sandbox.clone()),
        container: MessageField::some(container(1, 1, shared)),
        ..Default::default()
    };
    p.create_container(&ctx(), req).await.unwrap();
    let sync = api::SynchronizeRequest {
        pods: vec![sandbox],
        containers: vec![container(1, 0, shared), container(1, 1, shared)],
        ..Default::default()
    };
    p.synchronize(&ctx(), sync).await.unwrap();
    assert_eq!(info(&p).0, Some(3 << 29));
    // An update without resources changes nothing.
    let bare = api::UpdatePodSandboxRequest {
        linux_resources: MessageField::none(),
        ..resized
    };
    p.update_pod_sandbox(&ctx(), bare).await.unwrap();
    assert_eq!(info(&p).0, Some(3 << 29));
}
