//! Manifests `nri-qos explain` reads today, through k8s-openapi's types.
#[path = "pod_openapi.rs"]
#[allow(dead_code)]
mod openapi;

const MANIFESTS: &[(&str, &str)] = &[
    ("quantities as strings", "kind: Pod\nspec:\n  containers:\n  - name: a\n    resources:\n      requests: {cpu: 500m, memory: 128Mi}\n"),
    ("quantities as YAML numbers (cpu: 1, memory: 1e9)", "kind: Pod\nspec:\n  containers:\n  - name: a\n    resources:\n      requests: {cpu: 1, memory: 1e9}\n"),
    ("cpu: 0.5", "kind: Pod\nspec:\n  containers:\n  - name: a\n    resources:\n      limits: {cpu: 0.5}\n"),
    ("container without a name (a sketch)", "kind: Pod\nspec:\n  containers:\n  - resources:\n      requests: {memory: 1Gi}\n"),
];

fn main() {
    for (what, yaml) in MANIFESTS {
        let ours = crate_costs::qos::pod::parse_pod(yaml)
            .map(|_| "ok".to_string())
            .unwrap_or_else(|e| e.to_string());
        let theirs = openapi::parse(yaml)
            .map(|_| "ok".to_string())
            .unwrap_or_else(|e| e);
        println!("{what}: ours {ours}; k8s-openapi {theirs}");
    }
}
