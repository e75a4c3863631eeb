//! The product's two Pod readers: kube's (k8s-openapi Pod from JSON, always
//! linked) and explain's (our manifest types from YAML).
fn main() {
    let text = std::fs::read_to_string(std::env::args().nth(1).expect("file")).expect("read");
    if let Ok(p) = serde_json::from_str::<k8s_openapi::api::core::v1::Pod>(&text) {
        println!(
            "json: {} containers",
            p.spec.map_or(0, |s| s.containers.len())
        );
    }
    match crate_costs::qos::pod::parse_pod(&text) {
        Ok(p) => println!("ours: {} containers", p.spec.containers.len()),
        Err(e) => println!("ours: {e}"),
    }
}
