//! Evicting a pod, for whichever of the node-pressure monitor
//! (`crate::pressure`) and the throttle guard (`crate::guard`) run: the pods
//! on disk as candidates ([`pods`]), the kubelet's ranking ([`rank`]), the
//! kill of a pod cgroup ([`kill`]) and the one path both go through
//! ([`Evictor`]: one pod in flight across both, cooldown, never critical,
//! never Guaranteed before everything else, never a pod with only its
//! sandbox; through the Eviction API where the caller asks for it).

pub mod kill;
mod path;
pub mod pods;
pub mod rank;
#[cfg(test)]
pub mod testing;
pub mod tree;

pub use path::{
    lock, Acted, ApiOutcome, ApiRound, Cause, EvictConfig, Evictor, Hold, KillOrder, Origin,
    Settled, SharedEvictor, Unenforced,
};
pub use pods::{PauseCheck, PodScanner, PodTree};
