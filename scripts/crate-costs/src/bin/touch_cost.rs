//! The hook-path cost of recording (what `observe_hook` and
//! `record_adjustment` do on every NRI call), hand-written atomics vs
//! prometheus-client's families and histogram.
use crate_costs::touch_ns;

fn main() {
    let hand = touch_ns(&crate_costs::hand::Metrics::new());
    let prom = touch_ns(&crate_costs::prom::Metrics::default());
    println!("hand        {hand:.1} ns per touch");
    println!("promclient  {prom:.1} ns per touch ({:.1}x)", prom / hand);
}
