//! kube_quantity doing the same job: parse, then whole bytes (there is no
//! millicore conversion; scale by 1000 ourselves).
use kube_quantity::ParsedQuantity;

fn main() {
    for a in std::env::args().skip(1) {
        let q = ParsedQuantity::try_from(a.as_str());
        let bytes = q.as_ref().ok().and_then(|q| q.to_bytes_u64());
        let milli = q
            .as_ref()
            .ok()
            .and_then(|q| (q.clone() * 1000).to_bytes_u64());
        println!("{bytes:?} {milli:?}");
    }
}
