//! The throttle guard's relax over a real NRI session with a fake runtime:
//! it travels as `Runtime/UpdateContainers` on conn 2 carrying only
//! `unified["memory.high"]`, and when the runtime does not apply it (as NRI
//! v0.6 runtimes drop the unified map; this fake applies nothing) the
//! cgroup file is written instead; a runtime without containerd/nri#301
//! never gets the call.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use nri_qos::guard::{EventCounts, FileRelaxer, Sample};
use nri_qos::node::relax::Relaxer;
use nri_qos::nri::relax::{relaxer, LINK};
use nri_qos::nri::{session, Identity};
use nri_qos::qos::QosClass;

#[tokio::test]
async fn throttle_relax_goes_through_update_containers_then_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cg = dir.path().join("cri-containerd-abc123.scope");
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("memory.high"), "247463936\n").unwrap();
    std::fs::write(cg.join("memory.max"), "268435456\n").unwrap();
    let sample = Sample {
        path: cg.clone(),
        id: "abc123".into(),
        pod_uid: "u1".into(),
        pod_path: PathBuf::from(dir.path()),
        class: QosClass::Burstable,
        counters: EventCounts { high: 5000, max: 0 },
        psi_some_avg10: 30.0,
        high: Some(247_463_936),
        max: Some(268_435_456),
    };
    let (relaxer, task) = relaxer(std::sync::Arc::new(FileRelaxer));
    tokio::spawn(task);

    let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
    let identity = Identity::new("nri-qos", "10").unwrap();
    let session = tokio::spawn(async move {
        session::serve(ours, HashMap::new(), &identity, async { true }).await
    });
    let mut rt = attach(theirs, false).await;
    rt.expect_registered().await;
    for _ in 0..100 {
        if LINK.connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // What Configure says of a runtime carrying containerd/nri#301.
    LINK.set_update_deadlock_fixed(true);
    assert_eq!(
        relaxer.relax(&sample.relax_request()).unwrap(),
        "nri-update-containers"
    );
    let req = loop {
        match tokio::time::timeout(Duration::from_secs(5), rt.events.recv())
            .await
            .expect("UpdateContainers in time")
            .expect("runtime events")
        {
            RuntimeEvent::UpdateContainers(req) => break req,
            RuntimeEvent::Registered { .. } => continue,
        }
    };
    assert_eq!(req.update.len(), 1);
    assert_eq!(req.update[0].container_id, "abc123");
    let res = req.update[0].linux.resources.as_ref().unwrap();
    assert_eq!(
        res.unified.iter().collect::<Vec<_>>(),
        vec![(&"memory.high".to_string(), &"268435456".to_string())]
    );
    // The fake runtime applies nothing: the relaxer writes the file.
    let mut value = String::new();
    for _ in 0..200 {
        value = std::fs::read_to_string(cg.join("memory.high")).unwrap();
        if value.trim() == "268435456" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(value.trim(), "268435456");
    // A runtime without the fix (every containerd 1.7-2.3 and CRI-O 1.37
    // release) never gets the call: the file is written at once.
    LINK.set_update_deadlock_fixed(false);
    std::fs::write(cg.join("memory.high"), "247463936\n").unwrap();
    assert_eq!(
        relaxer.relax(&sample.relax_request()).unwrap(),
        "cgroup-file (the runtime lacks containerd/nri#301)"
    );
    let value = std::fs::read_to_string(cg.join("memory.high")).unwrap();
    assert_eq!(value.trim(), "268435456");
    session.abort();
}
