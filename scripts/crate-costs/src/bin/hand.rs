//! Hand-rendered text, hand-written server (what nri-qos ships).
fn main() {
    crate_costs::serve::hand(crate_costs::hand::Metrics::new());
}
