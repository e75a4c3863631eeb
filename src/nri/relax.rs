//! Relaxing a container's memory.high for the throttle guard
//! through the runtime (`Runtime/UpdateContainers` on the session's conn 2),
//! so the runtime's own record of the container agrees with the kernel.
//! Only with `[throttle] relax-via = "runtime"`, and only on a runtime that
//! carries containerd/nri#301 (`RuntimeQuirks::update_deadlock_fixed`):
//! before it this call can deadlock the runtime (see
//! `node::relax::RelaxVia`), so elsewhere the cgroup file is written.
//!
//! Never from inside an NRI handler (the runtime holds its lock while it
//! waits for our reply, and our call would wait for that lock): the monitor
//! thread queues a request and returns; a task of ours makes the call.
//! A runtime may accept the update and not apply its unified map (NRI v0.6
//! was expected to; containerd 1.7.24 and 2.1.9 both applied it in the VM),
//! so after every call the file is read back; where the value did not
//! arrive, the task writes the cgroup file and says so once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protobuf::MessageField;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::proto::{api, api_ttrpc::RuntimeClient};
use crate::node::lock;
use crate::node::relax::{RelaxError, RelaxRequest as Request, Relaxer};

/// Bound on queued relax requests (bounded memory; a relax is rare).
const QUEUE: usize = 64;
/// How long one UpdateContainers call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The Runtime-service client of the current session, if one is registered.
/// The session sets it after RegisterPlugin and clears it when it ends.
#[derive(Default)]
pub struct RuntimeLink {
    client: Mutex<Option<RuntimeClient>>,
    /// The session's runtime carries containerd/nri#301 (said in Configure).
    deadlock_fixed: AtomicBool,
}

/// The process's one link (one session at a time).
pub static LINK: RuntimeLink = RuntimeLink {
    client: Mutex::new(None),
    deadlock_fixed: AtomicBool::new(false),
};

impl RuntimeLink {
    /// The session's client (set after RegisterPlugin, which Configure may
    /// overtake); none when the session ended, whose runtime's quirk goes too.
    pub fn set(&self, client: Option<RuntimeClient>) {
        if client.is_none() {
            self.deadlock_fixed.store(false, Ordering::Relaxed);
        }
        *lock(&self.client) = client;
    }

    /// Whether the session's runtime carries containerd/nri#301.
    pub fn set_update_deadlock_fixed(&self, fixed: bool) {
        self.deadlock_fixed.store(fixed, Ordering::Relaxed);
    }

    fn get(&self) -> Option<RuntimeClient> {
        lock(&self.client).clone()
    }

    pub fn connected(&self) -> bool {
        lock(&self.client).is_some()
    }

    /// A session whose runtime cannot deadlock on our UpdateContainers.
    fn safe(&self) -> bool {
        self.connected() && self.deadlock_fixed.load(Ordering::Relaxed)
    }
}

/// The [`Relaxer`] the plugin gives its monitor.
pub struct NriRelaxer {
    tx: mpsc::Sender<Request>,
    /// Writes the cgroup file: without a session, or where the runtime did
    /// not apply the update.
    file: Arc<dyn Relaxer>,
}

impl Relaxer for NriRelaxer {
    fn relax(&self, r: &Request) -> Result<&'static str, RelaxError> {
        if !LINK.connected() {
            return self.file.relax(r).map(|_| "cgroup-file (no NRI session)");
        }
        if !LINK.safe() {
            return self
                .file
                .relax(r)
                .map(|_| "cgroup-file (the runtime lacks containerd/nri#301)");
        }
        match self.tx.try_send(r.clone()) {
            Ok(()) => Ok("nri-update-containers"),
            Err(mpsc::error::TrySendError::Full(_)) => Err(RelaxError::QueueFull(QUEUE)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(RelaxError::QueueClosed),
        }
    }
}

/// The relaxer and the task that serves it (spawn it on the plugin's
/// runtime); `file` writes the cgroup file when the runtime cannot.
pub fn relaxer(file: Arc<dyn Relaxer>) -> (NriRelaxer, impl std::future::Future<Output = ()>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (
        NriRelaxer {
            tx,
            file: file.clone(),
        },
        serve(rx, file),
    )
}

/// The update: only `unified["memory.high"]`; every other field unset, so
/// the runtime leaves it as it is.
fn update_for(r: &Request) -> api::UpdateContainersRequest {
    let mut resources = api::LinuxResources::new();
    resources
        .unified
        .insert("memory.high".into(), r.value.clone());
    let mut linux = api::LinuxContainerUpdate::new();
    linux.resources = MessageField::some(resources);
    let mut u = api::ContainerUpdate::new();
    u.container_id = r.container_id.clone();
    u.linux = MessageField::some(linux);
    let mut req = api::UpdateContainersRequest::new();
    req.update.push(u);
    req
}

fn arrived(r: &Request) -> bool {
    std::fs::read_to_string(r.cgroup.join("memory.high")).is_ok_and(|v| v.trim() == r.value)
}

async fn serve(mut rx: mpsc::Receiver<Request>, file: Arc<dyn Relaxer>) {
    let dropped_noted = AtomicBool::new(false);
    while let Some(r) = rx.recv().await {
        let outcome = match LINK.get() {
            Some(client) => {
                let ctx = ttrpc::context::with_timeout(crate::node::time::nanos_i64(CALL_TIMEOUT));
                match client.update_containers(ctx, &update_for(&r)).await {
                    Ok(resp) if resp.failed.is_empty() => Ok(()),
                    Ok(_) => Err("the runtime reported the update as failed".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
            None => Err("no NRI session".to_string()),
        };
        match outcome {
            Ok(()) if arrived(&r) => {
                info!(container = %r.container_id, memory_high = %r.value, "memory.high relaxed through UpdateContainers")
            }
            Ok(()) => {
                if !dropped_noted.swap(true, Ordering::Relaxed) {
                    warn!(container = %r.container_id,
                        "the runtime accepted UpdateContainers but did not apply its unified map; \
                         relaxing memory.high by writing the cgroup file, here and from now on");
                }
                write(file.as_ref(), &r);
            }
            Err(e) => {
                warn!(container = %r.container_id, error = %e, "UpdateContainers failed; writing memory.high directly");
                write(file.as_ref(), &r);
            }
        }
    }
}

fn write(file: &dyn Relaxer, r: &Request) {
    match file.relax(r) {
        Ok(_) => {
            info!(container = %r.container_id, memory_high = %r.value, "memory.high relaxed in the cgroup file")
        }
        Err(e) => warn!(container = %r.container_id, error = %e, "cannot relax memory.high"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_update_carries_only_memory_high() {
        let r = Request {
            container_id: "abc".into(),
            cgroup: std::path::PathBuf::from("/nowhere"),
            value: "268435456".into(),
        };
        let req = update_for(&r);
        assert_eq!(req.update.len(), 1);
        let u = &req.update[0];
        assert_eq!(u.container_id, "abc");
        assert!(!u.ignore_failure);
        let res = u.linux.resources.as_ref().unwrap();
        assert_eq!(res.unified.len(), 1);
        assert_eq!(res.unified["memory.high"], "268435456");
        assert!(res.memory.is_none() && res.cpu.is_none());
        assert!(!arrived(&r));
    }
}
