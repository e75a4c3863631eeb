//! The NRI wire protocol: generated messages, the connection multiplexer,
//! the Plugin service and the session lifecycle.

pub mod convert;
pub mod lean_sync;
pub mod mux;
pub mod oom_fallback;
pub mod plugin;
pub mod proto;
pub mod reassembly;
pub mod relax;
pub mod session;
pub mod view;

pub use plugin::{DropInLayer, PluginSettings, QosPlugin};
pub use session::{Identity, Transport};
