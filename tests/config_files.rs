//! Every configuration file we ship parses with our own types.

use std::path::Path;

use nri_qos::config::Config;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn shipped_nri_qos_toml_is_exactly_the_defaults() {
    let cfg = Config::load(&root().join("config/nri-qos.toml")).expect("config/nri-qos.toml");
    assert_eq!(cfg, Config::default());
}

#[test]
fn every_default_key_is_documented_in_the_shipped_file() {
    // Render the defaults and check each key appears in the commented file.
    let rendered = toml::to_string(&Config::default()).unwrap();
    let text = std::fs::read_to_string(root().join("config/nri-qos.toml")).unwrap();
    for line in rendered.lines() {
        if let Some((key, _)) = line.split_once(" = ") {
            assert!(
                text.contains(&format!("{key} = ")) || text.contains(&format!("# {key} = ")),
                "config/nri-qos.toml does not document {key}"
            );
        }
    }
}
