//! Hand-rendered text, hyper's HTTP/1 server.
fn main() {
    crate_costs::serve::hyper(crate_costs::hand::Metrics::new());
}
