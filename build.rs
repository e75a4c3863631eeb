//! Generates the NRI protobuf messages and ttrpc service code from our own
//! `proto/nri/api.proto` into OUT_DIR (pure Rust, no `protoc` needed).

use std::{fs, path::Path};

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

// A build script fails by returning an error: cargo prints it and stops.
fn main() -> Result<(), String> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = std::env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?;
    Codegen::new()
        .out_dir(&out_dir)
        .inputs(["proto/nri/api.proto"])
        .include("proto")
        .rust_protobuf()
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .run()
        .map_err(|e| format!("ttrpc-codegen failed on proto/nri/api.proto: {e}"))?;

    // `include!` rejects inner attributes and inner doc comments; src/nri/proto.rs
    // puts the equivalent allows on the wrapping modules instead.
    for name in ["api.rs", "api_ttrpc.rs"] {
        let path = Path::new(&out_dir).join(name);
        let text =
            fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("#![") && !l.starts_with("//!"))
            .collect();
        fs::write(&path, kept.join("\n")).map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    Ok(())
}
