//! The pod-level and QoS-level cgroup hierarchy keeper: memory protection
//! set on a container only works if every ancestor carries it too, and no
//! runtime writes those ancestors.

pub mod hierarchy;
pub mod plan;

pub use hierarchy::{run, HierarchyConfig, Keeper};
