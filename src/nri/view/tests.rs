use std::collections::BTreeMap;

use proptest::prelude::*;
use protobuf::MessageField;

use super::*;

const MI: i64 = 1 << 20;

fn node() -> NodeFacts {
    NodeFacts {
        memory_capacity: 16 << 30,
        memory_allocatable: 15 << 30,
        page_size: 4096,
        cgroup_v2: true,
    }
}

fn quirks(name: &str, version: &str, nri: &str) -> RuntimeQuirks {
    RuntimeQuirks::decide(name, version, nri, true)
}

/// containerd 2.3: shows the CRI's map, merged with adjustments after a restart.
fn containerd_2_3() -> RuntimeQuirks {
    quirks("containerd", "v2.3.4", "v0.12.0")
}

fn pod(parent: &str) -> api::PodSandbox {
    let mut linux = api::LinuxPodSandbox::new();
    linux.cgroup_parent = parent.into();
    api::PodSandbox {
        id: "p".into(),
        uid: "u".into(),
        linux: MessageField::some(linux),
        ..Default::default()
    }
}

/// A container as the CRI asked for it: shares, memory limit, the
/// kubelet's oom_score_adj and `unified` map.
fn container(shares: u64, limit: i64, oom: i64, unified: &[(&str, String)]) -> api::Container {
    let mut r = api::LinuxResources::new();
    let cpu = r.cpu.mut_or_insert_default();
    cpu.shares.mut_or_insert_default().value = shares;
    if limit > 0 {
        r.memory
            .mut_or_insert_default()
            .limit
            .mut_or_insert_default()
            .value = limit;
    }
    r.unified = unified
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let mut linux = api::LinuxContainer::new();
    linux.resources = MessageField::some(r);
    linux.oom_score_adj = MessageField::some(api::OptionalInt {
        value: oom,
        ..Default::default()
    });
    api::Container {
        id: "c".into(),
        pod_sandbox_id: "p".into(),
        name: "app".into(),
        linux: MessageField::some(linux),
        ..Default::default()
    }
}

/// What the runtime keeps in the container's spec once it applied
/// `adjust` at creation, and reports in a Synchronize after a restart.
fn as_the_runtime_keeps_it(
    c: &api::Container,
    adjust: &api::ContainerAdjustment,
) -> api::Container {
    let mut kept = c.clone();
    for (k, v) in &adjust.annotations {
        kept.annotations.insert(k.clone(), v.clone());
    }
    if let Some(r) = adjust.linux.as_ref().and_then(|l| l.resources.as_ref()) {
        let spec = kept
            .linux
            .mut_or_insert_default()
            .resources
            .mut_or_insert_default();
        for (k, v) in &r.unified {
            spec.unified.insert(k.clone(), v.clone());
        }
    }
    kept
}

fn unified(facts: &qos::ContainerFacts) -> Vec<(&str, &str)> {
    let u = &facts.resources.unified;
    u.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

#[test]
fn the_adjustment_names_the_unified_keys_it_sets() {
    let adj = qos::Adjustment {
        unified: BTreeMap::from([
            ("memory.low".into(), "1".into()),
            ("cpu.weight".into(), "17".into()),
            ("memory.high".into(), "2".into()),
        ]),
        oom_score_adj: Some(900),
        ..Default::default()
    };
    let wire = create_adjustment(adj, true);
    assert_eq!(
        wire.annotations[OWN_UNIFIED_ANNOTATION],
        "cpu.weight,memory.high,memory.low"
    );
    assert_eq!(wire.linux.oom_score_adj.value, 900);
    // Nothing set in `unified`: said too, so no key can be taken for ours.
    let wire = create_adjustment(qos::Adjustment::default(), true);
    assert_eq!(wire.annotations[OWN_UNIFIED_ANNOTATION], "");
    assert!(wire.linux.is_none());
}

/// The restart of containerd 2.2/2.3: the report holds the kubelet's
/// memory.oom.group and our cpu.weight/memory.low/memory.high, and reads as
/// the CRI's map alone. The kubelet's own memory.low (Memory QoS), equal to
/// what we would set, stays the kubelet's: we never set a key it sent.
#[test]
fn a_report_merged_with_our_adjustment_reads_as_the_cri_sent_it() {
    let q = containerd_2_3();
    let rules = (&node(), &PolicyConfig::default());
    let b = qos::PodFacts {
        cgroup_parent: "/kubepods/burstable/podu".into(),
        ..Default::default()
    };
    let oom_group = [("memory.oom.group", "1".to_string())];
    let created = container(256, 512 * MI, 985, &oom_group);
    let (_, d) = decide(&b, &created, Source::Reported, &q, rules, None);
    let low = d.adjustment.unified["memory.low"].clone();
    let adjust = create_adjustment(d.adjustment.clone(), true);
    let merged = as_the_runtime_keeps_it(&created, &adjust);
    assert!(merged.linux.resources.unified.contains_key("memory.low"));
    let facts = container_facts(&merged, Source::Reported, &q);
    assert_eq!(unified(&facts), [("memory.oom.group", "1")]);
    assert!(facts.unified_shown);
    let (_, again) = decide(&b, &merged, Source::Reported, &q, rules, None);
    assert_eq!(again, d, "the same decision as at creation");
    assert_eq!(again.request_source, qos::RequestSource::OomScoreAdj);

    // The kubelet's Memory QoS sent memory.low, the very value we would
    // set: not ours, whatever its value.
    let kubelets = [oom_group[0].clone(), ("memory.low", low.clone())];
    let created = container(256, 512 * MI, 985, &kubelets);
    let (_, d) = decide(&b, &created, Source::Reported, &q, rules, None);
    assert!(!d.adjustment.unified.contains_key("memory.low"), "{d:?}");
    let merged = as_the_runtime_keeps_it(&created, &create_adjustment(d.adjustment.clone(), true));
    let facts = container_facts(&merged, Source::Reported, &q);
    assert!(qos::policy::kubelet_memory_qos_keys(&facts.resources));
    let (_, again) = decide(&b, &merged, Source::Reported, &q, rules, None);
    assert_eq!(again.request_source, qos::RequestSource::UnifiedMemoryLow);
    assert_eq!(again, d);
}

/// A report without our annotation holding cpu.weight was adjusted by
/// nri-qos all the same (a Synchronize update carries no annotation): its
/// memory keys are nobody's for sure, so they are left out and the map
/// counts as hidden. One without either is the CRI's as it stands.
#[test]
fn an_adjusted_report_without_our_annotation_counts_as_hidden() {
    let q = containerd_2_3();
    let merged = container(
        256,
        512 * MI,
        985,
        &[
            ("memory.oom.group", "1".into()),
            ("cpu.weight", "17".into()),
            ("memory.low", "66387968".into()),
            ("memory.high", "509943808".into()),
        ],
    );
    let facts = container_facts(&merged, Source::Reported, &q);
    assert_eq!(unified(&facts), [("memory.oom.group", "1")]);
    assert!(!facts.unified_shown);
    let pristine = container(256, 512 * MI, 985, &[("memory.low", "66387968".into())]);
    let facts = container_facts(&pristine, Source::Reported, &q);
    assert_eq!(unified(&facts), [("memory.low", "66387968")]);
    assert!(facts.unified_shown);
    // containerd 2.1 shows no map: nothing shown, nothing to take out.
    let facts = container_facts(
        &pristine,
        Source::Reported,
        &quirks("containerd", "2.1.9", ""),
    );
    assert!(!facts.unified_shown);
}

/// Only keys the policy sets can be claimed by the annotation; UpdateContainer's
/// request is the kubelet's and is never touched; the kernel's limits
/// replace only the limits.
#[test]
fn the_annotation_claims_only_our_keys_and_only_in_a_report() {
    let q = containerd_2_3();
    let mut c = container(
        256,
        512 * MI,
        985,
        &[("memory.oom.group", "1".into()), ("memory.low", "5".into())],
    );
    c.annotations.insert(
        OWN_UNIFIED_ANNOTATION.into(),
        "memory.oom.group, memory.low,,bogus".into(),
    );
    let facts = container_facts(&c, Source::Reported, &q);
    assert_eq!(unified(&facts), [("memory.oom.group", "1")]);
    let request = c.linux.resources.clone().unwrap();
    let facts = container_facts(&c, Source::CriRequest(&request), &q);
    assert_eq!(
        unified(&facts),
        [("memory.low", "5"), ("memory.oom.group", "1")]
    );
    let mut kernel = request.clone();
    kernel
        .memory
        .mut_or_insert_default()
        .limit
        .mut_or_insert_default()
        .value = 768 * MI;
    let facts = container_facts(&c, Source::KernelLimits(&kernel), &q);
    assert_eq!(facts.resources.memory_limit, Some(768 * MI));
    assert_eq!(unified(&facts), [("memory.oom.group", "1")]);
}

fn arb_container() -> impl Strategy<Value = (String, api::Container)> {
    let parent = prop::sample::select(vec![
        "/kubepods/podu",
        "/kubepods/burstable/podu",
        "/kubepods/besteffort/podu",
        "/custom",
    ]);
    let kubelet = prop::collection::btree_map(
        prop::sample::select(vec![
            "memory.min",
            "memory.low",
            "memory.high",
            "memory.oom.group",
        ]),
        (1u64..4096).prop_map(|pages| (pages * 4096).to_string()),
        0..3,
    );
    (parent, 2u64..4096, 0i64..2048, -1000i64..=1000, kubelet).prop_map(
        |(parent, shares, limit_mi, oom, kubelet)| {
            let unified: Vec<(&str, String)> = kubelet.into_iter().collect();
            (
                parent.to_string(),
                container(shares, limit_mi * MI, oom, &unified),
            )
        },
    )
}

proptest! {
    /// Our own values are never mistaken for the kubelet's: whatever the
    /// CRI sent, a runtime that shows the map and keeps our adjustment in
    /// it (containerd 2.2/2.3, CRI-O) leads after a restart to the very
    /// decision made at creation (class, request and its source,
    /// adjustment), so ownership and every kernel value stay as they were.
    #[test]
    fn a_restart_replays_the_decision_made_at_creation(
        (parent, created) in arb_container(),
        cri_o in any::<bool>(),
        reservation in prop::sample::select(vec![qos::Reservation::Tiered, qos::Reservation::Min]),
    ) {
        let q = if cri_o { quirks("cri-o", "1.37.0", "v0.12.0") } else { containerd_2_3() };
        let policy = PolicyConfig { memory_reservation: reservation, ..Default::default() };
        let rules = (&node(), &policy);
        let pod = convert::pod_from_wire(&pod(&parent));
        let (_, at_creation) = decide(&pod, &created, Source::Reported, &q, rules, None);
        let adjust = create_adjustment(at_creation.adjustment.clone(), true);
        let reported = as_the_runtime_keeps_it(&created, &adjust);
        let (facts, after_restart) = decide(&pod, &reported, Source::Reported, &q, rules, None);
        prop_assert_eq!(&after_restart, &at_creation);
        prop_assert_eq!(
            facts.resources.unified,
            convert::container_from_wire(&created).resources.unified
        );
    }
}
