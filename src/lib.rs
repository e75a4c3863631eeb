//! nri-qos: Kubernetes QoS classes made real in the kernel through the
//! container runtime's Node Resource Interface, plus a node memory-pressure
//! monitor that evicts in QoS order.
//!
//! One folder per concern: `nri` speaks the wire protocol, `qos` is the pure
//! policy, `keeper` keeps the pod/QoS-level hierarchy, `pressure` watches the
//! node's memory, `guard` the containers throttled at their memory.high,
//! and both evict through `evict`.

pub mod app;
pub mod audit;
pub mod config;
pub mod evict;
pub mod explain;
pub mod guard;
pub mod keeper;
pub mod kube;
pub mod metrics;
pub mod node;
pub mod nri;
pub mod observability;
pub mod pressure;
pub mod qos;
pub mod table;
