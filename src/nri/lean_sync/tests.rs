use std::collections::HashMap;

use proptest::prelude::*;
use protobuf::{Message, MessageField};

use super::*;
use crate::nri::convert;
use crate::qos::policy::{
    CONTAINER_TYPE_ANNOTATION, MEMORY_HIGH_ANNOTATION, MEMORY_REQUEST_ANNOTATION,
    MEMORY_REQUEST_ANNOTATION_PREFIX,
};
use crate::qos::{self, NodeFacts};

fn some<T>(v: T) -> MessageField<T> {
    MessageField::some(v)
}

fn resources(n: i64, unified: &HashMap<String, String>) -> api::LinuxResources {
    let mut r = api::LinuxResources::new();
    r.memory = some(api::LinuxMemory {
        limit: some(api::OptionalInt64 {
            value: n,
            ..Default::default()
        }),
        swap: some(api::OptionalInt64 {
            value: n,
            ..Default::default()
        }),
        ..Default::default()
    });
    r.cpu = some(api::LinuxCPU {
        shares: some(api::OptionalUInt64 {
            value: n.unsigned_abs(),
            ..Default::default()
        }),
        cpus: "0-3".into(),
        ..Default::default()
    });
    r.unified = unified.clone();
    // Never read: skipped on the wire.
    r.hugepage_limits.push(api::HugepageLimit {
        page_size: "2MB".into(),
        limit: 7,
        ..Default::default()
    });
    r.pids = some(api::LinuxPids {
        limit: 99,
        ..Default::default()
    });
    r.devices.push(api::LinuxDeviceCgroup {
        allow: true,
        access: "rwm".into(),
        ..Default::default()
    });
    r
}

/// A pod and a container with every field we read and many we do not,
/// and fields no version of the protocol knows.
fn request(
    ids: &[String],
    map: &HashMap<String, String>,
    n: i64,
    state: i32,
    more: bool,
) -> api::SynchronizeRequest {
    let mut req = api::SynchronizeRequest::new();
    for id in ids {
        let mut pod = api::PodSandbox::new();
        pod.id = id.clone();
        pod.name = format!("name-{id}");
        pod.uid = format!("uid-{id}");
        pod.namespace = "ns".into();
        pod.labels = map.clone();
        pod.annotations = map.clone();
        // Annotations the policy reads, beside the map's, which it does not.
        pod.annotations.insert(
            format!("{MEMORY_REQUEST_ANNOTATION_PREFIX}ctr-{id}"),
            "64Mi".into(),
        );
        pod.annotations
            .insert(MEMORY_HIGH_ANNOTATION.into(), "off".into());
        pod.runtime_handler = "runc".into();
        pod.pid = 42;
        pod.ips = vec!["10.0.0.1".into()];
        let mut linux = api::LinuxPodSandbox::new();
        linux.cgroup_parent = format!("/kubepods/pod{id}");
        linux.cgroups_path = "unused".into();
        linux.pod_resources = some(resources(n, map));
        linux.pod_overhead = some(resources(n, map));
        linux.namespaces.push(api::LinuxNamespace {
            type_: "network".into(),
            path: "/proc/1/ns/net".into(),
            ..Default::default()
        });
        linux.special_fields.mut_unknown_fields().add_varint(900, 1);
        pod.linux = some(linux);
        pod.special_fields
            .mut_unknown_fields()
            .add_length_delimited(901, b"x".to_vec());
        req.pods.push(pod);

        let mut c = api::Container::new();
        c.id = format!("c-{id}");
        c.pod_sandbox_id = id.clone();
        c.name = format!("ctr-{id}");
        c.state = protobuf::EnumOrUnknown::from_i32(state);
        c.labels = map.clone();
        c.annotations = map.clone();
        c.annotations
            .insert(CONTAINER_TYPE_ANNOTATION.into(), "container".into());
        c.pid = u32::try_from(n.unsigned_abs() % 100_000).unwrap_or(1);
        c.args = vec!["/bin/app".into(), "--flag".into()];
        c.env = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
        c.mounts.push(api::Mount {
            destination: "/data".into(),
            type_: "bind".into(),
            source: "/var/data".into(),
            options: vec!["rbind".into()],
            ..Default::default()
        });
        c.hooks = some(api::Hooks::new());
        c.rlimits.push(api::POSIXRlimit {
            type_: "RLIMIT_NOFILE".into(),
            hard: 1024,
            soft: 1024,
            ..Default::default()
        });
        c.created_at = n;
        c.status_message = "running".into();
        let mut linux = api::LinuxContainer::new();
        linux.resources = some(resources(n, map));
        linux.oom_score_adj = some(api::OptionalInt {
            value: n % 1000,
            ..Default::default()
        });
        linux.cgroups_path = format!("/kubepods/pod{id}/c");
        linux.devices.push(api::LinuxDevice {
            path: "/dev/null".into(),
            type_: "c".into(),
            major: 1,
            minor: 3,
            ..Default::default()
        });
        c.linux = some(linux);
        c.special_fields.mut_unknown_fields().add_fixed64(902, 5);
        req.containers.push(c);
    }
    req.more = more;
    req.special_fields.mut_unknown_fields().add_varint(903, 3);
    req
}

fn lean_resources(r: &api::LinuxResources) -> api::LinuxResources {
    api::LinuxResources {
        memory: r.memory.clone(),
        cpu: r.cpu.clone(),
        unified: r.unified.clone(),
        ..Default::default()
    }
}

/// The entries of `map` whose key `reads` takes.
fn read(map: &HashMap<String, String>, reads: fn(&str) -> bool) -> HashMap<String, String> {
    let read = map.iter().filter(|(k, _)| reads(k));
    read.map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The generated parser's result reduced to the fields nri-qos reads.
fn used_fields(full: &api::SynchronizeRequest) -> api::SynchronizeRequest {
    let pods = full.pods.iter().map(|p| api::PodSandbox {
        id: p.id.clone(),
        name: p.name.clone(),
        uid: p.uid.clone(),
        namespace: p.namespace.clone(),
        annotations: read(&p.annotations, policy::reads_pod_annotation),
        linux: p
            .linux
            .as_ref()
            .map(|l| api::LinuxPodSandbox {
                cgroup_parent: l.cgroup_parent.clone(),
                pod_resources: l.pod_resources.as_ref().map(lean_resources).into(),
                ..Default::default()
            })
            .into(),
        ..Default::default()
    });
    let containers = full.containers.iter().map(|c| api::Container {
        id: c.id.clone(),
        pod_sandbox_id: c.pod_sandbox_id.clone(),
        name: c.name.clone(),
        state: c.state,
        annotations: read(&c.annotations, policy::reads_container_annotation),
        pid: c.pid,
        linux: c
            .linux
            .as_ref()
            .map(|l| api::LinuxContainer {
                resources: l.resources.as_ref().map(lean_resources).into(),
                oom_score_adj: l.oom_score_adj.clone(),
                cgroups_path: l.cgroups_path.clone(),
                ..Default::default()
            })
            .into(),
        ..Default::default()
    });
    api::SynchronizeRequest {
        pods: pods.collect(),
        containers: containers.collect(),
        more: full.more,
        ..Default::default()
    }
}

proptest! {
    #[test]
    fn lean_decode_equals_the_full_decode_on_the_fields_read(
        ids in prop::collection::vec("[a-z0-9-]{0,12}", 0..4),
        map in prop::collection::hash_map("[a-z./]{0,10}", "\\PC{0,10}", 0..4),
        n in any::<i64>(),
        state in 0i32..8,
        more in any::<bool>(),
    ) {
        let bytes = request(&ids, &map, n, state, more).write_to_bytes().unwrap();
        let full = api::SynchronizeRequest::parse_from_bytes(&bytes).unwrap();
        let lean = decode_synchronize(&bytes).unwrap();
        prop_assert_eq!(&lean, &used_fields(&full));
        prop_assert_eq!(indexed_then_decoded(&bytes).unwrap(), lean.clone());
        let objects = lean.pods.len() + lean.containers.len();
        let counted = Walked { more: lean.more, counted: objects };
        prop_assert_eq!(count_objects(&bytes).unwrap(), counted);
        // Counting from the first object on is counting.
        prop_assert_eq!(for_each_object(&bytes, |_| Next::Count).unwrap(), Walked {
            counted: objects.saturating_sub(1),
            ..counted
        });
    }

    #[test]
    fn garbage_is_an_error_or_a_message_never_a_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        // Indexing reads less (it is for our own encoding), so it may
        // refuse or take other garbage, but never panics either.
        let _ = count_objects(&bytes);
        if let (Ok(lean), Ok(indexed)) = (decode_synchronize(&bytes), indexed_then_decoded(&bytes)) {
            prop_assert_eq!(lean, indexed);
        }
    }

    #[test]
    fn a_cut_message_is_refused_where_the_generated_parser_refuses_it(cut in 0usize..600) {
        let map: HashMap<String, String> = [("k".to_string(), "v".to_string())].into();
        let ids = ["p".to_string(), "q".to_string()];
        let bytes = request(&ids, &map, 5, 2, false).write_to_bytes().unwrap();
        let cut = &bytes[..cut.min(bytes.len())];
        // Cut between two top-level fields, what is left is a valid,
        // shorter message. The generated parser also takes a submessage cut
        // between two of its fields; skipping a field cut short, we do not.
        match (api::SynchronizeRequest::parse_from_bytes(cut), decode_synchronize(cut)) {
            (Ok(full), Ok(lean)) => prop_assert_eq!(lean, used_fields(&full)),
            (Err(_), lean) => prop_assert!(lean.is_err()),
            (Ok(_), Err(_)) => {}
        }
        if let (Ok(lean), Ok(indexed)) = (decode_synchronize(cut), indexed_then_decoded(cut)) {
            prop_assert_eq!(lean, indexed);
        }
    }
}

/// What [`index_synchronize`] and [`decode_container`] give, as one request;
/// each container's pod checked against the pods by id (the later wins).
fn indexed_then_decoded(bytes: &[u8]) -> protobuf::Result<api::SynchronizeRequest> {
    let indexed = index_synchronize(bytes)?;
    let mut pods = Vec::new();
    for (at, id) in &indexed.pods {
        let p = decode_pod(&bytes[at.clone()])?;
        assert_eq!(&p.id, id);
        pods.push(p);
    }
    let mut containers = Vec::new();
    for (at, pod) in &indexed.containers {
        let c = decode_container(&bytes[at.clone()])?;
        let last = pods.iter().rposition(|p| p.id == c.pod_sandbox_id);
        assert_eq!(*pod, last, "{c:?}");
        containers.push(c);
    }
    Ok(api::SynchronizeRequest {
        pods,
        containers,
        more: indexed.more,
        ..Default::default()
    })
}

#[test]
fn a_field_sent_twice_keeps_the_later_one_as_generated() {
    let mut first = api::Container::new();
    first.linux = some(api::LinuxContainer {
        cgroups_path: "/first".into(),
        oom_score_adj: some(api::OptionalInt {
            value: 1,
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut second = api::Container::new();
    second.linux = some(api::LinuxContainer {
        cgroups_path: "/second".into(),
        ..Default::default()
    });
    // Concatenated messages merge: `linux` comes twice in one container.
    let mut body = first.write_to_bytes().unwrap();
    body.extend(second.write_to_bytes().unwrap());
    let one = api::Container::parse_from_bytes(&body).unwrap();
    let req = api::SynchronizeRequest {
        containers: vec![one],
        ..Default::default()
    };
    let mut bytes = vec![18u8];
    let mut len = Vec::new();
    protobuf::CodedOutputStream::vec(&mut len)
        .write_raw_varint32(u32::try_from(body.len()).unwrap())
        .unwrap();
    bytes.extend(len);
    bytes.extend(&body);
    let full = api::SynchronizeRequest::parse_from_bytes(&bytes).unwrap();
    assert_eq!(used_fields(&full), used_fields(&req));
    assert_eq!(decode_synchronize(&bytes).unwrap(), used_fields(&full));
    assert_eq!(full.containers[0].linux.cgroups_path, "/second");
}

#[test]
fn garbage_is_refused_with_a_reason() {
    for bytes in [&[0xff, 0xff, 0xff][..], &[18, 50, 1], &[10, 3, 0x0f, 0, 0]] {
        let e = decode_synchronize(bytes).unwrap_err();
        assert!(!e.to_string().is_empty());
        assert!(index_synchronize(bytes).is_err());
    }
}

/// Annotations from a pool of the keys the policy reads and keys it does
/// not, with values it takes and values it refuses.
fn annotations() -> impl Strategy<Value = HashMap<String, String>> {
    let key = prop_oneof![
        Just(MEMORY_REQUEST_ANNOTATION.to_string()),
        Just(format!("{MEMORY_REQUEST_ANNOTATION_PREFIX}app")),
        Just(format!("{MEMORY_REQUEST_ANNOTATION_PREFIX}other")),
        Just(MEMORY_HIGH_ANNOTATION.to_string()),
        Just(CONTAINER_TYPE_ANNOTATION.to_string()),
        "[a-z./-]{1,30}",
    ];
    let value = prop_oneof![
        Just("64Mi".to_string()),
        Just("off".to_string()),
        Just("sandbox".to_string()),
        Just("container".to_string()),
        "[a-zA-Z0-9]{0,6}",
    ];
    prop::collection::hash_map(key, value, 0..8)
}

proptest! {
    /// The annotations the lean decode leaves out change no decision: the
    /// policy reads only the ones it keeps.
    #[test]
    fn the_policy_decides_alike_without_the_annotations_left_out(
        pod_annotations in annotations(),
        container_annotations in annotations(),
        limit in prop::option::of(1i64..(8 << 30)),
        shares in 0u64..4096,
    ) {
        let mut req = request(&["p".to_string()], &HashMap::new(), 1, 2, false);
        req.pods[0].annotations = pod_annotations;
        req.pods[0].linux.mut_or_insert_default().cgroup_parent = "/kubepods/burstable/podp".into();
        let c = &mut req.containers[0];
        c.annotations = container_annotations;
        c.name = "app".into();
        let r = c.linux.mut_or_insert_default().resources.mut_or_insert_default();
        r.memory.mut_or_insert_default().limit = limit
            .map(|value| api::OptionalInt64 { value, ..Default::default() })
            .into();
        r.cpu.mut_or_insert_default().shares.mut_or_insert_default().value = shares;
        let bytes = req.write_to_bytes().unwrap();
        let full = api::SynchronizeRequest::parse_from_bytes(&bytes).unwrap();
        let lean = decode_synchronize(&bytes).unwrap();
        let node = NodeFacts {
            memory_capacity: 16 << 30,
            memory_allocatable: 15 << 30,
            page_size: 4096,
            cgroup_v2: true,
        };
        let decide = |r: &api::SynchronizeRequest| {
            let pod = convert::pod_from_wire(&r.pods[0]);
            let c = convert::container_from_wire(&r.containers[0]);
            qos::decide(&pod, &c, &node, &Default::default())
        };
        prop_assert_eq!(decide(&lean), decide(&full));
    }
}
