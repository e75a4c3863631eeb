//! Our parser (src/qos/quantity.rs, copied in by the script): bytes and
//! millicores of each argument.
#[path = "../quantity.rs"]
#[allow(dead_code)]
mod quantity;

fn main() {
    for a in std::env::args().skip(1) {
        println!("{:?} {:?}", quantity::parse_bytes(&a), quantity::parse_milli(&a));
    }
}
