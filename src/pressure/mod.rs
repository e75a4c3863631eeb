//! The node memory-pressure monitor.
