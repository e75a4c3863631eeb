//! The NRI wire protocol: generated messages, the connection multiplexer and
//! the plugin lifecycle.

pub mod proto;
