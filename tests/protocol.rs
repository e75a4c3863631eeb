//! The plugin binary against a runtime-side peer over a real unix socket:
//! lifecycle, chunked sync, every event, both launch modes, and hostile
//! input (garbage protobuf, oversized and truncated frames, floods,
//! disconnects mid-call). The plugin must never die or grow without bound.

// Test code: a failed unwrap is the test failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use nri_qos::nri::convert;
use nri_qos::nri::plugin::EVENTS;
use nri_qos::nri::proto::api;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;

fn node() -> nri_qos::qos::NodeFacts {
    nri_qos::node::read_node_facts(
        std::path::Path::new("/proc"),
        std::path::Path::new("/sys/fs/cgroup"),
        0,
    )
    .expect("read node facts")
}

/// What the plugin should answer, from the same pure policy.
fn expected_adjustment(
    pod: &api::PodSandbox,
    c: &api::Container,
    with_oom: bool,
) -> api::ContainerAdjustment {
    let d = nri_qos::qos::decide(
        &convert::pod_from_wire(pod),
        &convert::container_from_wire(c),
        &node(),
        &Default::default(),
    );
    nri_qos::nri::view::create_adjustment(d.adjustment, with_oom)
}

#[tokio::test]
async fn full_lifecycle_over_a_real_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &[]);
    let mut s = accept(&listener, false).await;

    let (name, index, nri) = s.expect_registered_nri().await;
    assert_eq!((name.as_str(), index.as_str()), ("nri-qos", "10"));
    // What containerd 2.3 logs as "registered ... with NRI version".
    assert_eq!(nri, "v0.12.2");
    let cfg = s
        .plugin
        .configure(
            ctx(),
            &api::ConfigureRequest {
                runtime_name: "containerd".into(),
                runtime_version: "v2.1.9".into(),
                registration_timeout: 5000,
                request_timeout: 2000,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(cfg.events, EVENTS);

    // Chunked sync: every chunk but the last is answered more=true, no updates.
    let pods: Vec<_> = (0..10)
        .map(|i| pod(&format!("p{i}"), &format!("/kubepods/burstable/podp{i}")))
        .collect();
    let ctrs: Vec<_> = (0..10)
        .map(|i| {
            container(
                &format!("c{i}"),
                &format!("p{i}"),
                256,
                50_000,
                256 << 20,
                500,
            )
        })
        .collect();
    let r = s
        .plugin
        .synchronize(
            ctx(),
            &api::SynchronizeRequest {
                pods: pods.clone(),
                more: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(r.more && r.update.is_empty());
    let r = s
        .plugin
        .synchronize(
            ctx(),
            &api::SynchronizeRequest {
                containers: ctrs[..5].to_vec(),
                more: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(r.more && r.update.is_empty());
    let r = s
        .plugin
        .synchronize(
            ctx(),
            &api::SynchronizeRequest {
                containers: ctrs[5..].to_vec(),
                more: false,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(!r.more);
    // Updates only for containers the policy wants changed, each tolerant of failure.
    for u in &r.update {
        assert!(u.ignore_failure);
        assert!(ctrs.iter().any(|c| c.id == u.container_id));
    }

    // CreateContainer returns exactly the policy's adjustment.
    let p = pod("p-new", "/kubepods/burstable/podp-new");
    let c = container("c-new", "p-new", 256, 50_000, 512 << 20, 985);
    let resp = s
        .plugin
        .create_container(
            ctx(),
            &api::CreateContainerRequest {
                pod: protobuf::MessageField::some(p.clone()),
                container: protobuf::MessageField::some(c.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(*resp.adjust, expected_adjustment(&p, &c, true));
    assert!(resp.update.is_empty() && resp.evict.is_empty());

    // UpdateContainer answers for that container only.
    let resp = s
        .plugin
        .update_container(
            ctx(),
            &api::UpdateContainerRequest {
                pod: protobuf::MessageField::some(p.clone()),
                container: protobuf::MessageField::some(c.clone()),
                linux_resources: c.linux.resources.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    for u in &resp.update {
        assert_eq!(u.container_id, "c-new");
    }

    s.plugin
        .stop_container(
            ctx(),
            &api::StopContainerRequest {
                pod: protobuf::MessageField::some(p.clone()),
                container: protobuf::MessageField::some(c.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    for ev in [
        api::Event::RUN_POD_SANDBOX,
        api::Event::POST_CREATE_CONTAINER,
        api::Event::START_CONTAINER,
        api::Event::POST_START_CONTAINER,
        api::Event::POST_UPDATE_CONTAINER,
        api::Event::REMOVE_CONTAINER,
        api::Event::STOP_POD_SANDBOX,
        api::Event::REMOVE_POD_SANDBOX,
        api::Event::UNKNOWN,
    ] {
        s.plugin
            .state_change(
                ctx(),
                &api::StateChangeEvent {
                    event: ev.into(),
                    pod: protobuf::MessageField::some(p.clone()),
                    container: protobuf::MessageField::some(c.clone()),
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("state change {ev:?}: {e:?}"));
    }

    // v0.12 per-event RPCs: each answered OK over the wire (an UNIMPLEMENTED
    // would send a v0.12 runtime back to StateChange for every event).
    let pod = || protobuf::MessageField::some(p.clone());
    let ctr = || protobuf::MessageField::some(c.clone());
    let rpc = &s.plugin;
    rpc.run_pod_sandbox(
        ctx(),
        &api::RunPodSandboxRequest {
            pod: pod(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    rpc.update_pod_sandbox(
        ctx(),
        &api::UpdatePodSandboxRequest {
            pod: pod(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    rpc.post_update_pod_sandbox(
        ctx(),
        &api::PostUpdatePodSandboxRequest {
            pod: pod(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    rpc.stop_pod_sandbox(
        ctx(),
        &api::StopPodSandboxRequest {
            pod: pod(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    rpc.post_create_container(
        ctx(),
        &api::PostCreateContainerRequest {
            pod: pod(),
            container: ctr(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    rpc.start_container(
        ctx(),
        &api::StartContainerRequest {
            pod: pod(),
            container: ctr(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    rpc.post_start_container(
        ctx(),
        &api::PostStartContainerRequest {
            pod: pod(),
            container: ctr(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    rpc.post_update_container(
        ctx(),
        &api::PostUpdateContainerRequest {
            pod: pod(),
            container: ctr(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    rpc.remove_container(
        ctx(),
        &api::RemoveContainerRequest {
            pod: pod(),
            container: ctr(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    rpc.remove_pod_sandbox(
        ctx(),
        &api::RemovePodSandboxRequest {
            pod: pod(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let v = rpc
        .validate_container_adjustment(ctx(), &api::ValidateContainerAdjustmentRequest::new())
        .await
        .unwrap();
    assert!(!v.reject);
    s.plugin.shutdown(ctx(), &api::Empty::new()).await.unwrap();

    // Every frame the plugin sent is readable through Go's 4096-byte bufio.
    assert!(s.frames.load(std::sync::atomic::Ordering::SeqCst) > 0);
    assert!(s.max_frame.load(std::sync::atomic::Ordering::SeqCst) <= 4096);
    assert!(plugin.is_running(), "{}", plugin.log_text());
}

#[tokio::test]
async fn v0_6_runtimes_get_no_oom_score_adj_field() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let _plugin = PluginProcess::external(&sock, dir.path(), &[]);
    let mut s = accept(&listener, true).await;
    s.handshake(false).await;
    for (parent, oom) in [
        ("/kubepods/podg", -997),
        ("/kubepods/burstable/podb", 985),
        ("/kubepods/besteffort/pode", 1000),
    ] {
        let p = pod("p", parent);
        let c = container("c", "p", 256, 50_000, 256 << 20, oom);
        let resp = s
            .plugin
            .create_container(
                ctx(),
                &api::CreateContainerRequest {
                    pod: protobuf::MessageField::some(p.clone()),
                    container: protobuf::MessageField::some(c.clone()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(resp.adjust.linux.oom_score_adj.is_none());
        assert_eq!(*resp.adjust, expected_adjustment(&p, &c, false));
    }
}

#[tokio::test]
async fn odd_input_never_fails_container_creation() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &[]);
    let mut s = accept(&listener, false).await;
    s.handshake(true).await;
    let weird = [
        (api::PodSandbox::new(), api::Container::new()),
        (
            pod("p", "/kubepods/burstable/podp"),
            container("c", "p", u64::MAX, i64::MIN, -5, i64::MAX),
        ),
        (
            pod("p", "kubepods-besteffort-podx.slice"),
            container("c", "p", 0, -1, i64::MAX, -1_000_000),
        ),
        (
            pod("p", "/not/kubepods/at/all"),
            container("c", "p", 2, 1, 1, 0),
        ),
    ];
    for (p, c) in weird {
        let r = s
            .plugin
            .create_container(
                ctx(),
                &api::CreateContainerRequest {
                    pod: protobuf::MessageField::some(p),
                    container: protobuf::MessageField::some(c),
                    ..Default::default()
                },
            )
            .await;
        assert!(r.is_ok(), "{r:?}");
    }
    assert!(plugin.is_running(), "{}", plugin.log_text());
}

#[tokio::test]
async fn garbage_protobuf_gets_an_error_status_and_the_plugin_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &[]);
    let mut s = accept(&listener, false).await;
    s.handshake(true).await;
    for payload in [
        vec![0xff; 64],
        vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
        b"not protobuf at all".to_vec(),
    ] {
        let req = ttrpc::Request {
            service: "nri.pkg.api.v1alpha1.Plugin".into(),
            method: "CreateContainer".into(),
            payload,
            timeout_nano: 2_000_000_000,
            ..Default::default()
        };
        let resp = s.client.request(req).await;
        // Either a transport-level error or an error status; never a crash.
        if let Ok(r) = resp {
            assert!(r.status.is_some());
        }
    }
    // An unknown method is answered, too.
    let req = ttrpc::Request {
        service: "nri.pkg.api.v1alpha1.Plugin".into(),
        method: "NoSuchMethod".into(),
        timeout_nano: 2_000_000_000,
        ..Default::default()
    };
    let _ = s.client.request(req).await;
    let p = pod("p", "/kubepods/podp");
    let c = container("c", "p", 1024, 100_000, 1 << 30, -997);
    s.plugin
        .create_container(
            ctx(),
            &api::CreateContainerRequest {
                pod: protobuf::MessageField::some(p),
                container: protobuf::MessageField::some(c),
                ..Default::default()
            },
        )
        .await
        .expect("plugin still serves after garbage");
    assert!(plugin.is_running(), "{}", plugin.log_text());
}

#[tokio::test]
async fn oversized_frame_disconnects_and_the_plugin_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &[]);
    let mut s = accept(&listener, false).await;
    s.handshake(true).await;
    let mut header = 1u32.to_be_bytes().to_vec();
    header.extend_from_slice(&0xFFFF_FFF0u32.to_be_bytes());
    s.send_raw(&header).await;
    assert!(s.wait_closed().await, "plugin kept an insane frame open");
    let mut s2 = accept(&listener, false).await;
    let (name, _) = s2.expect_registered().await;
    assert_eq!(name, "nri-qos");
    assert!(plugin.is_running(), "{}", plugin.log_text());
}

#[tokio::test]
async fn truncated_frame_then_disconnect_mid_call_then_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &[]);
    let mut s = accept(&listener, false).await;
    s.handshake(true).await;
    // Half a frame, then the runtime goes away.
    let f = frame(1, &[0u8; 100]);
    s.send_raw(&f[..30]).await;
    let _ = s.raw.lock().await.shutdown().await;
    assert!(s.wait_closed().await);
    drop(s);
    // The plugin dials again, registers and can be configured again.
    let mut s2 = accept(&listener, false).await;
    let cfg = s2.handshake(true).await;
    assert_eq!(cfg.events, EVENTS);
    // Now a disconnect while the plugin is in the middle of a sync.
    let big: Vec<_> = (0..2000)
        .map(|i| container(&format!("c{i}"), "p0", 256, 50_000, 256 << 20, 500))
        .collect();
    let req = api::SynchronizeRequest {
        pods: vec![pod("p0", "/kubepods/burstable/podp0")],
        containers: big,
        ..Default::default()
    };
    let call = s2.plugin.synchronize(ctx(), &req);
    let raw = s2.raw.clone();
    let closer = async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let _ = raw.lock().await.shutdown().await;
    };
    let _ = tokio::join!(call, closer);
    drop(s2);
    let mut s3 = accept(&listener, false).await;
    s3.expect_registered().await;
    assert!(plugin.is_running(), "{}", plugin.log_text());
}

#[tokio::test]
async fn memory_stays_bounded_under_a_frame_flood_and_a_large_sync() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &["--log-level", "warn"]);
    let mut s = accept(&listener, true).await;
    s.handshake(true).await;
    let before = plugin.rss_kib();
    // 80 MiB of frames for connections nobody opened: dropped, not buffered.
    let junk = frame(9, &[0x42u8; 8192]);
    let mut burst = Vec::new();
    for _ in 0..64 {
        burst.extend_from_slice(&junk);
    }
    for _ in 0..160 {
        s.send_raw(&burst).await;
    }
    // A node-sized sync: 1,000 pods, 3,000 containers.
    let pods: Vec<_> = (0..1000)
        .map(|i| pod(&format!("p{i}"), &format!("/kubepods/burstable/podp{i}")))
        .collect();
    let ctrs: Vec<_> = (0..3000)
        .map(|i| {
            container(
                &format!("c{i}"),
                &format!("p{}", i % 1000),
                256,
                50_000,
                256 << 20,
                900,
            )
        })
        .collect();
    s.plugin
        .synchronize(
            ctx(),
            &api::SynchronizeRequest {
                pods,
                containers: ctrs,
                ..Default::default()
            },
        )
        .await
        .expect("sync");
    let after = plugin.rss_kib();
    assert!(plugin.is_running(), "{}", plugin.log_text());
    assert!(
        after < before + 32 * 1024,
        "rss grew from {before} KiB to {after} KiB"
    );
}

#[test]
fn prelaunched_mode_talks_on_fd3_and_exits_when_the_runtime_goes() {
    use std::os::unix::process::CommandExt;

    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let their_fd = raw_fd_of(&theirs);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_nri-qos"));
    cmd.env_clear()
        .env("NRI_PLUGIN_NAME", "qos-test")
        .env("NRI_PLUGIN_IDX", "42")
        .env("NRI_PLUGIN_SOCKET", "3")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(std::env::temp_dir().join("nri-qos-prelaunch.log")).unwrap());
    // SAFETY: dup2 is async-signal-safe; runs in the child before exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(their_fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(theirs);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        ours.set_nonblocking(true).unwrap();
        let stream = tokio::net::UnixStream::from_std(ours).unwrap();
        let mut s = attach(stream, false).await;
        let (name, index) = s.expect_registered().await;
        assert_eq!((name.as_str(), index.as_str()), ("qos-test", "42"));
        let cfg = s
            .plugin
            .configure(ctx(), &api::ConfigureRequest::new())
            .await
            .unwrap();
        assert_eq!(cfg.events, EVENTS);
        let _ = s.raw.lock().await.shutdown().await;
    });
    drop(rt);
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "plugin did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn drop_in_config_from_configure_is_applied_and_bad_config_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &[]);
    // Valid drop-in that turns on dry run: no adjustment comes back.
    let mut s = accept(&listener, false).await;
    s.expect_registered().await;
    s.plugin
        .configure(
            ctx(),
            &api::ConfigureRequest {
                config: "[plugin]\ndry-run = true\n".into(),
                request_timeout: 2000,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let p = pod("p", "/kubepods/besteffort/podp");
    let c = container("c", "p", 2, 0, 0, 1000);
    let resp = s
        .plugin
        .create_container(
            ctx(),
            &api::CreateContainerRequest {
                pod: protobuf::MessageField::some(p.clone()),
                container: protobuf::MessageField::some(c.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(resp.adjust.is_none() || resp.adjust.linux.is_none());
    // Garbage drop-in: Configure still succeeds, the plugin keeps serving.
    let r = s
        .plugin
        .configure(
            ctx(),
            &api::ConfigureRequest {
                config: "this is = = not toml [".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(r.events, EVENTS);
    assert!(plugin.is_running());
    assert!(plugin
        .log_text()
        .contains("ignoring the runtime's drop-in config"));
}

#[tokio::test]
async fn configure_may_arrive_before_the_registration_reply() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &[]);
    let (stream, _) = tokio::time::timeout(TIMEOUT, listener.accept())
        .await
        .unwrap()
        .unwrap();
    let mut s = attach_with(stream, false, true).await;
    let cfg = tokio::time::timeout(TIMEOUT, s.configured_first.recv())
        .await
        .expect("configure inside RegisterPlugin timed out")
        .unwrap();
    assert_eq!(cfg.events, EVENTS);
    s.expect_registered().await;
    // The session is fully usable afterwards.
    let r = s
        .plugin
        .synchronize(ctx(), &api::SynchronizeRequest::new())
        .await
        .unwrap();
    assert!(!r.more);
    assert!(plugin.is_running(), "{}", plugin.log_text());
}

#[tokio::test]
async fn metrics_endpoint_counts_adjustments_and_connection() {
    // A free loopback port for the plugin's endpoint.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!("[metrics]\nenabled = true\naddress = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(
        &sock,
        dir.path(),
        &["--config", cfg.to_str().unwrap(), "--log-level", "info"],
    );
    let mut s = accept(&listener, false).await;
    s.handshake(true).await;
    let p = pod("p", "/kubepods/burstable/podp");
    let c = container("c", "p", 256, 50_000, 512 << 20, 985);
    s.plugin
        .create_container(
            ctx(),
            &api::CreateContainerRequest {
                pod: protobuf::MessageField::some(p),
                container: protobuf::MessageField::some(c),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let body = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        let _ = conn.read_to_string(&mut out);
        out
    })
    .await
    .unwrap();
    // "applied" on a cgroup v2 host; "unchanged" on v1, where the kubelet's
    // values are already all a v1 node can take.
    assert!(
        body.contains("nri_qos_adjustments_total{class=\"Burstable\",result=\"applied\"} 1")
            || body
                .contains("nri_qos_adjustments_total{class=\"Burstable\",result=\"unchanged\"} 1"),
        "{body}"
    );
    assert!(body.contains("nri_qos_runtime_connected 1"), "{body}");
    assert!(
        body.contains("nri_qos_hook_duration_seconds_count 1"),
        "{body}"
    );
    assert!(plugin.is_running(), "{}", plugin.log_text());
}

/// containerd 1.7 before 1.7.26 can deadlock between Configure and
/// Synchronize (containerd#10085): the plugin cannot end that, but it says so.
#[tokio::test]
async fn an_external_plugin_configured_but_never_synchronized_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &[]);
    let mut s = accept(&listener, false).await;
    s.handshake(false).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !plugin.log_text().contains("containerd#10085") {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            plugin.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(plugin.is_running());
    // Once the sync comes, the session carries on as usual.
    let r = s
        .plugin
        .synchronize(ctx(), &api::SynchronizeRequest::new())
        .await
        .unwrap();
    assert!(r.update.is_empty());
}

/// The benches' blocking peer (`common::lean_peer`) drives the binary the
/// way containerd does: registration served on conn 2, Configure, a
/// Synchronize in `more` chunks of 4 KiB frames, then CreateContainer.
#[test]
fn the_benches_blocking_peer_drives_the_plugin() {
    use common::lean_peer::LeanPeer;
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let _plugin = PluginProcess::external(&sock, dir.path(), &["--log-level", "warn"]);
    let mut peer = LeanPeer::accept(&listener);
    let _: api::ConfigureResponse = peer.handshake();
    assert_eq!(peer.registered.len(), 1, "one RegisterPlugin");
    let pods: Vec<_> = (0..20)
        .map(|i| pod(&format!("p{i}"), &format!("/kubepods/burstable/podp{i}")))
        .collect();
    let ctrs: Vec<_> = (0..200)
        .map(|i| {
            let id = format!("c{i}");
            container(&id, &format!("p{}", i % 20), 512, 0, 1 << 30, 900)
        })
        .collect();
    for (k, part) in ctrs.chunks(100).enumerate() {
        let req = api::SynchronizeRequest {
            pods: if k == 0 { pods.clone() } else { Vec::new() },
            containers: part.to_vec(),
            more: k == 0,
            ..Default::default()
        };
        let resp: api::SynchronizeResponse = peer.call_message("Synchronize", &req);
        assert_eq!(resp.more, req.more);
    }
    let req = api::CreateContainerRequest {
        pod: protobuf::MessageField::some(pods[1].clone()),
        container: protobuf::MessageField::some(container("new", "p1", 512, 0, 1 << 30, 900)),
        ..Default::default()
    };
    let resp: api::CreateContainerResponse = peer.call_message("CreateContainer", &req);
    assert!(
        resp.adjust.is_some(),
        "an adjustment for a burstable container"
    );
}

/// The benches' blocking peer answers the plugin's calls on conn 2 that
/// arrive while it waits for an answer on conn 1, even between the frames
/// of that answer: UpdateContainers succeeds, an unknown method gets an
/// error status.
#[test]
fn the_benches_blocking_peer_serves_conn_2_between_a_call_and_its_answer() {
    use common::lean_peer::{
        frames, read_frame, request_message, response_message, LeanPeer, PLUGIN_CONN, RUNTIME_CONN,
    };
    use protobuf::Message;
    use std::io::Write;
    use ttrpc::MessageHeader;
    fn call(id: u32, method: &str, payload: Vec<u8>) -> Vec<u8> {
        let req = ttrpc::Request {
            service: "nri.pkg.api.v1alpha1.Runtime".into(),
            method: method.into(),
            payload,
            ..Default::default()
        };
        let mut out = Vec::new();
        frames(RUNTIME_CONN, &request_message(id, &req), &mut out);
        out
    }
    let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let plugin = std::thread::spawn(move || {
        let register = api::RegisterPluginRequest {
            plugin_name: "fake".into(),
            plugin_idx: "10".into(),
            ..Default::default()
        };
        theirs
            .write_all(&call(
                1,
                "RegisterPlugin",
                register.write_to_bytes().unwrap(),
            ))
            .unwrap();
        let mut buf = Vec::new();
        let mut conns = Vec::new();
        // The RegisterPlugin answer and the Configure call, in either order.
        while !conns.contains(&PLUGIN_CONN) {
            conns.push(read_frame(&mut theirs, &mut buf));
        }
        let configure = MessageHeader::from(&buf[..10]);
        let answer = ttrpc::Response {
            payload: api::ConfigureResponse::new().write_to_bytes().unwrap(),
            ..Default::default()
        };
        let answer = response_message(configure.stream_id, &answer);
        let (head, tail) = answer.split_at(6);
        let mut out = common::frame(PLUGIN_CONN, head);
        out.extend(call(3, "UpdateContainers", Vec::new()));
        out.extend(call(5, "NoSuchMethod", Vec::new()));
        out.extend(common::frame(PLUGIN_CONN, tail));
        theirs.write_all(&out).unwrap();
        // The answers to UpdateContainers and NoSuchMethod.
        let mut statuses = Vec::new();
        while statuses.len() < 2 {
            if read_frame(&mut theirs, &mut buf) == RUNTIME_CONN {
                let h = MessageHeader::from(&buf[..10]);
                let r = ttrpc::Response::parse_from_bytes(&buf[10..]).unwrap();
                statuses.push((h.stream_id, r.status.code()));
            }
        }
        statuses
    });
    let mut peer = LeanPeer::new(ours);
    let _: api::ConfigureResponse = peer.handshake();
    assert_eq!(peer.registered, [("fake".to_string(), "10".to_string())]);
    assert_eq!(peer.updates, 1);
    assert_eq!(
        plugin.join().unwrap(),
        [(3, ttrpc::Code::OK), (5, ttrpc::Code::UNIMPLEMENTED)]
    );
}
