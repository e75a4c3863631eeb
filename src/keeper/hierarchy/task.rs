//! The keeper's task: passes off the NRI handler path, on registry changes
//! and on a timer, with the ownership decisions handed back to the plugin.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use super::Keeper;
use crate::node::cgroupfs::Owner;
use crate::node::lock;
use crate::node::registry::SharedRegistry;

/// Runs the keeper next to the plugin: a pass on every registry change and
/// every `resync_seconds`. File I/O runs off the NRI handler path.
pub async fn run(
    keeper: Keeper,
    registry: SharedRegistry,
    mut changes: tokio::sync::watch::Receiver<u64>,
    resync: Duration,
    metrics: Option<Arc<crate::metrics::Metrics>>,
) {
    let keeper = Arc::new(Mutex::new(keeper));
    loop {
        let reg = registry.clone();
        let k = keeper.clone();
        let metrics = metrics.clone();
        let pass = tokio::task::spawn_blocking(move || {
            let mut k = lock(&k);
            let pods = {
                let reg = lock(&reg);
                k.pods_from_registry(&reg)
            };
            let report = k.reconcile(&pods);
            if let Some(m) = &metrics {
                let kubelet = k
                    .owners()
                    .values()
                    .filter(|o| **o == Owner::Kubelet)
                    .count();
                m.set_protection_owners(kubelet as u64, (k.owners().len() - kubelet) as u64);
            }
            // The plugin reads the decisions for later containers of these pods.
            let mut reg = lock(&reg);
            reg.owners
                .retain(|cg, _| k.owners.contains_key(cg) || k.root.join(cg).exists());
            hand_back(&mut reg.owners, k.owners());
            report
        })
        .await;
        match pass {
            Ok(r) if r.written > 0 || r.failed > 0 => info!(
                written = r.written,
                failed = r.failed,
                missing = r.missing,
                scaled = r.scaled,
                "pod and QoS cgroup protection updated"
            ),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "hierarchy pass did not finish"),
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(resync) => {}
        }
    }
}

/// Hands the keeper's decisions to the registry. Only ever towards the
/// kubelet: the plugin may have learnt during this pass that the kubelet
/// owns a pod (a started container holding its keys), and a decision the
/// pass made before must not undo that.
fn hand_back(registry: &mut HashMap<PathBuf, Owner>, keeper: &HashMap<PathBuf, Owner>) {
    for (cg, owner) in keeper {
        let e = registry.entry(cg.clone()).or_insert(*owner);
        if *e != Owner::Kubelet {
            *e = *owner;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubelet_decision_the_plugin_made_during_a_pass_stands() {
        let cg = |s: &str| PathBuf::from(s);
        let mut reg = HashMap::from([(cg("pod-a"), Owner::Kubelet), (cg("pod-b"), Owner::NriQos)]);
        let keeper = HashMap::from([
            (cg("pod-a"), Owner::NriQos),
            (cg("pod-b"), Owner::Kubelet),
            (cg("pod-c"), Owner::NriQos),
        ]);
        hand_back(&mut reg, &keeper);
        assert_eq!(reg[&cg("pod-a")], Owner::Kubelet);
        assert_eq!(reg[&cg("pod-b")], Owner::Kubelet);
        assert_eq!(reg[&cg("pod-c")], Owner::NriQos);
    }
}
