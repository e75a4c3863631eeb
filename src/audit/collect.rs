//! Taking the runtime's view: audit registers as a second, short-lived NRI
//! plugin, takes one Synchronize and disconnects.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::oneshot;
use ttrpc::r#async::TtrpcContext;

use super::{AuditError, Snapshot};
use crate::node::lock;
use crate::node::runtime::RuntimeQuirks;
use crate::nri::lean_sync::{self, Object};
use crate::nri::proto::{api, api_ttrpc};
use crate::nri::reassembly::SyncReassembler;
use crate::nri::session::{self, Identity};

struct SnapshotPlugin {
    partial: Mutex<SyncReassembler>,
    runtime: Mutex<RuntimeQuirks>,
    done: Mutex<Option<oneshot::Sender<Snapshot>>>,
}

/// Each message goes to the reassembler still encoded; the whole
/// Synchronize is decoded once, for the report.
#[async_trait]
impl lean_sync::SynchronizeEncoded for SnapshotPlugin {
    async fn synchronize_encoded(
        &self,
        ctx: &TtrpcContext,
        payload: Vec<u8>,
    ) -> ttrpc::Result<Vec<u8>> {
        let timeout = crate::nri::session::request_timeout(ctx);
        let whole = lock(&self.partial).push(&payload, timeout, Instant::now());
        drop(payload);
        let whole = whole.map_err(lean_sync::invalid_request)?;
        let more = whole.is_none();
        if let Some(whole) = whole {
            let mut snapshot = whole.held.decode().map_err(lean_sync::invalid_request)?;
            snapshot.left_out = whole.dropped;
            if let Some(tx) = lock(&self.done).take() {
                let _ = tx.send(snapshot);
            }
        }
        let answer = api::SynchronizeResponse {
            more,
            ..Default::default()
        };
        protobuf::Message::write_to_bytes(&answer).map_err(lean_sync::not_encodable)
    }
}

/// What audit builds from one object once the Synchronize is whole: the
/// object decoded (its strings and the structs of its resources), and for
/// a container its lines of the report, which repeat its names and paths.
/// Measured by `tests/wire_bounds.rs` against the process's peak.
fn audit_cost(o: &Object) -> usize {
    match o {
        Object::Pod(_) => 1_024 + 2 * o.framed_len(),
        Object::Container(_) => 2_048 + 3 * o.framed_len(),
    }
}

#[async_trait]
impl api_ttrpc::Plugin for SnapshotPlugin {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let timeouts = req.request_timeout > 0 || req.registration_timeout > 0;
        *lock(&self.runtime) = RuntimeQuirks::decide(
            &req.runtime_name,
            &req.runtime_version,
            &req.NRI_version,
            timeouts,
        );
        // 0 would mean "every event"; subscribe to one harmless event instead.
        Ok(api::ConfigureResponse {
            events: 1 << (api::Event::REMOVE_POD_SANDBOX as i32 - 1),
            ..Default::default()
        })
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        _req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        Ok(api::Empty::new())
    }
}

/// Takes one Synchronize from the runtime at `socket`.
/// `sync_budget` bounds the memory its Synchronize may take, as in the
/// plugin.
pub async fn collect(
    socket: &Path,
    limit: Duration,
    sync_budget: usize,
) -> Result<(Snapshot, RuntimeQuirks), AuditError> {
    let trunk = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| AuditError::Connect {
            path: socket.to_path_buf(),
            source,
        })?;
    let (tx, rx) = oneshot::channel();
    let plugin = Arc::new(SnapshotPlugin {
        partial: Mutex::new(SyncReassembler::new(sync_budget, audit_cost)),
        runtime: Mutex::new(RuntimeQuirks::default()),
        done: Mutex::new(Some(tx)),
    });
    let identity = Identity {
        name: "nri-qos-audit".into(),
        index: "99".into(),
    };
    let mut session = Box::pin(session::serve(
        trunk,
        lean_sync::create_plugin(plugin.clone()),
        &identity,
        async { true },
    ));
    let mut snap = tokio::select! {
        snap = rx => snap.map_err(|_| AuditError::Timeout(limit))?,
        end = &mut session => return Err(AuditError::Session(end)),
        _ = tokio::time::sleep(limit) => return Err(AuditError::Timeout(limit)),
    };
    // Let our Synchronize answer reach the runtime before hanging up, so it
    // does not wait out its request timeout while holding its NRI lock.
    tokio::select! {
        _ = &mut session => {}
        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
    }
    let quirks = lock(&plugin.runtime).clone();
    snap.runtime = quirks.name.clone();
    Ok((snap, quirks))
}
