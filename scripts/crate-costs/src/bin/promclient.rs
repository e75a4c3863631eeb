//! prometheus-client's registry and encoder, hand-written server.
fn main() {
    crate_costs::serve::hand(crate_costs::prom::Metrics::default());
}
