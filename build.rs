//! Generates the NRI protobuf messages and ttrpc service code from our own
//! `proto/nri/api.proto` into OUT_DIR (pure Rust, no `protoc` needed).

use std::{fs, path::Path};

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

fn main() {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
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
        .expect("ttrpc-codegen failed on proto/nri/api.proto");

    // `include!` rejects inner attributes and inner doc comments; src/nri/proto.rs
    // puts the equivalent allows on the wrapping modules instead.
    for name in ["api.rs", "api_ttrpc.rs"] {
        let path = Path::new(&out_dir).join(name);
        let text = fs::read_to_string(&path).expect("generated file is readable");
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("#![") && !l.starts_with("//!"))
            .collect();
        fs::write(&path, kept.join("\n")).expect("generated file is writable");
    }
}
