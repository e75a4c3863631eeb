//! Our parser (src/qos/quantity.rs): bytes and millicores of each argument.
use crate_costs::qos::quantity;

fn main() {
    for a in std::env::args().skip(1) {
        println!(
            "{:?} {:?}",
            quantity::parse_bytes(&a),
            quantity::parse_milli(&a)
        );
    }
}
