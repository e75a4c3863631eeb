//! The bounds of the wire path, against the plugin binary over a real unix
//! socket: a peer that never reads our answers, and Synchronize chunks
//! beyond the byte budget, for both the plugin and `nri-qos audit`.
//! Peak memory is the child's VmHWM.

// Test code: a failed unwrap is the test failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests, benches and tools cast small, known values; the cast lints guard
// the product code.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    clippy::cast_lossless
)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use nri_qos::nri::proto::api;
use protobuf::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use ttrpc::MessageHeader;

fn ttrpc_message(header: MessageHeader, body: &[u8]) -> Vec<u8> {
    let mut m: Vec<u8> = header.into();
    m.extend_from_slice(body);
    m
}

/// Answers the plugin's RegisterPlugin by hand (conn 2), reading nothing
/// else: afterwards the trunk is never read again.
async fn register_by_hand(stream: &mut UnixStream) {
    let mut conn2 = Vec::new();
    loop {
        let mut h = [0u8; 8];
        stream.read_exact(&mut h).await.unwrap();
        let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        let mut p = vec![0u8; len];
        stream.read_exact(&mut p).await.unwrap();
        if conn != 2 {
            continue;
        }
        conn2.extend_from_slice(&p);
        if conn2.len() < 10 {
            continue;
        }
        let header = MessageHeader::from(&conn2[..10]);
        if conn2.len() < 10 + header.length as usize {
            continue;
        }
        let reply = ttrpc::Response {
            payload: api::Empty::new().write_to_bytes().unwrap(),
            ..Default::default()
        }
        .write_to_bytes()
        .unwrap();
        let m = ttrpc_message(
            MessageHeader::new_response(header.stream_id, reply.len() as u32),
            &reply,
        );
        stream.write_all(&frame(2, &m)).await.unwrap();
        return;
    }
}

#[tokio::test]
async fn a_peer_that_never_reads_answers_cannot_grow_memory() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &["--log-level", "warn"]);
    let (mut stream, _) = tokio::time::timeout(TIMEOUT, listener.accept())
        .await
        .unwrap()
        .unwrap();
    register_by_hand(&mut stream).await;
    // The debug binary's own size (text pages, the kube client) varies
    // with the build; what a peer can add on top is what is bounded.
    let idle = plugin.status_value("VmHWM");

    let create = api::CreateContainerRequest {
        pod: protobuf::MessageField::some(pod("p", "/kubepods/burstable/podp")),
        container: protobuf::MessageField::some(container("c", "p", 256, 50_000, 256 << 20, 900)),
        ..Default::default()
    }
    .write_to_bytes()
    .unwrap();
    let writer = tokio::spawn(async move {
        let mut sent = 0u32;
        let mut batch = Vec::new();
        while sent < 120_000 {
            batch.clear();
            for _ in 0..100 {
                let req = ttrpc::Request {
                    service: "nri.pkg.api.v1alpha1.Plugin".into(),
                    method: "CreateContainer".into(),
                    payload: create.clone(),
                    timeout_nano: 2_000_000_000,
                    ..Default::default()
                }
                .write_to_bytes()
                .unwrap();
                let m = ttrpc_message(
                    MessageHeader::new_request(2 * sent + 1, req.len() as u32),
                    &req,
                );
                batch.extend_from_slice(&frame(1, &m));
                sent += 1;
            }
            if stream.write_all(&batch).await.is_err() {
                break;
            }
        }
        (sent, stream)
    });
    // Watch the plugin while the peer writes (it blocks once the plugin
    // stops reading: that is the back-pressure) or finishes.
    let started = Instant::now();
    let mut peak = 0;
    while !writer.is_finished() && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        peak = peak.max(plugin.rss_kib());
    }
    let hwm = plugin.status_value("VmHWM");
    eprintln!("unread answers: plugin peak {hwm} KiB, {idle} KiB before the flood");
    assert!(plugin.is_running(), "{}", plugin.log_text());
    assert!(
        hwm < idle + 8 * 1024,
        "plugin peaked at {hwm} KiB (sampled max {peak} KiB, {idle} KiB before) under unread answers"
    );
    writer.abort();
}

/// A chunk of one container carrying `bytes` of annotation.
fn fat_chunk(i: usize, bytes: usize) -> api::SynchronizeRequest {
    let mut c = container(&format!("c{i}"), "p0", 256, 50_000, 256 << 20, 900);
    c.annotations.insert("fat".into(), "x".repeat(bytes));
    api::SynchronizeRequest {
        containers: vec![c],
        more: true,
        ..Default::default()
    }
}

/// Sends 40 chunks of 3.5 MiB (140 MiB, more than the 64 MiB budget), then
/// the last chunk; returns how much the peer's peak RSS grew before the
/// last chunk and how long the last chunk took to be answered.
async fn flood_sync(s: &PeerSession, process: &PluginProcess) -> (u64, Duration) {
    // Growth over the process's own peak so far: the binary's size varies.
    let base = process.status_value("VmHWM");
    for i in 0..40 {
        let r = s
            .plugin
            .synchronize(ctx(), &fat_chunk(i, 3_500_000))
            .await
            .expect("every chunk is answered");
        assert!(r.more && r.update.is_empty());
    }
    let hwm = process.status_value("VmHWM").saturating_sub(base);
    let last = api::SynchronizeRequest {
        pods: vec![pod("p0", "/kubepods/burstable/podp0")],
        ..Default::default()
    };
    let t = Instant::now();
    let r = s
        .plugin
        .synchronize(ctx(), &last)
        .await
        .expect("last chunk");
    assert!(!r.more);
    (hwm, t.elapsed())
}

#[tokio::test]
async fn synchronize_reassembly_is_bounded_in_bytes_and_answers_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &["--log-level", "warn"]);
    let mut s = accept(&listener, true).await;
    s.handshake(true).await;
    let (hwm, last) = flood_sync(&s, &plugin).await;
    eprintln!("140 MiB of chunks: plugin peak grew {hwm} KiB, last chunk answered in {last:?}");
    assert!(plugin.is_running(), "{}", plugin.log_text());
    assert!(
        hwm < 100 * 1024,
        "plugin grew by {hwm} KiB for 140 MiB of chunks"
    );
    assert!(last < Duration::from_secs(2), "last chunk took {last:?}");
    let log = plugin.log_text();
    assert_eq!(
        log.matches("answering with what fits").count(),
        1,
        "logged once: {log}"
    );
}

/// `plugin.sync-budget-mib` lowers the bound: 8 MiB holds two of the
/// 3.5 MiB chunks, so the plugin grows far less than under the default.
#[tokio::test]
async fn the_synchronize_budget_is_configurable() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    let cfg = dir.path().join("nri-qos.toml");
    std::fs::write(&cfg, "[plugin]\nsync-budget-mib = 8\n").unwrap();
    let cfg = cfg.to_str().unwrap();
    let mut plugin = PluginProcess::external(&sock, dir.path(), &["--config", cfg]);
    let mut s = accept(&listener, true).await;
    s.handshake(true).await;
    let (hwm, last) = flood_sync(&s, &plugin).await;
    eprintln!("140 MiB of chunks, 8 MiB budget: plugin peak grew {hwm} KiB, last chunk {last:?}");
    assert!(plugin.is_running(), "{}", plugin.log_text());
    assert!(
        hwm < 32 * 1024,
        "plugin grew by {hwm} KiB under an 8 MiB budget"
    );
    assert!(plugin.log_text().contains("answering with what fits"));
}

#[tokio::test]
async fn audit_reassembly_is_bounded_too() {
    let dir = tempfile::tempdir().unwrap();
    let sock = socket_in(&dir);
    let listener = UnixListener::bind(&sock).unwrap();
    // NRI_QOS_BIN: another build, as for PluginProcess::external.
    let bin =
        std::env::var_os("NRI_QOS_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_nri-qos").into());
    let args: Vec<&std::ffi::OsStr> = ["audit", "--timeout-seconds", "60", "--socket"]
        .iter()
        .map(std::ffi::OsStr::new)
        .chain([sock.as_os_str()])
        .collect();
    let audit = PluginProcess::spawn(bin.as_ref(), &args, &dir.path().join("audit.log"));
    let mut s = accept(&listener, true).await;
    s.handshake(true).await;
    let (hwm, _) = flood_sync(&s, &audit).await;
    eprintln!("140 MiB of chunks: audit peak grew {hwm} KiB");
    assert!(
        hwm < 100 * 1024,
        "audit grew by {hwm} KiB for 140 MiB of chunks: {}",
        audit.log_text()
    );
}
