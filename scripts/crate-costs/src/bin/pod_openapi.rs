//! The same, with explain reading k8s-openapi's Pod from YAML instead.
use k8s_openapi::api::core::v1::Pod;

pub fn parse(text: &str) -> Result<Pod, String> {
    let value: serde_norway::Value = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        format!("{path}: {}", e.into_inner())
    })
}

fn main() {
    let text = std::fs::read_to_string(std::env::args().nth(1).expect("file")).expect("read");
    if let Ok(p) = serde_json::from_str::<Pod>(&text) {
        println!(
            "json: {} containers",
            p.spec.map_or(0, |s| s.containers.len())
        );
    }
    match parse(&text) {
        Ok(p) => println!(
            "k8s-openapi: {} containers",
            p.spec.map_or(0, |s| s.containers.len())
        ),
        Err(e) => println!("k8s-openapi: {e}"),
    }
}
