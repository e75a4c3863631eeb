//! The pod-level and QoS-level cgroup hierarchy keeper.
