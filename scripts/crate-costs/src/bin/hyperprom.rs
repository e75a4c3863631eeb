//! prometheus-client behind hyper: the full "adopt both" build.
fn main() {
    crate_costs::serve::hyper(crate_costs::prom::Metrics::default());
}
