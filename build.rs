//! Generates the NRI protobuf messages and ttrpc service code from our own
//! `proto/nri/api.proto` into OUT_DIR (pure Rust, no `protoc` needed), and
//! has release links of the `nri-qos` binary place the functions a plugin run
//! executes side by side (`link/hot-functions.txt`).

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
    hot_functions_together();
    Ok(())
}

/// The code a plugin run executes (~0.9 MiB) is spread over 9 MiB of
/// `.text`, and the kernel maps code by 64 KiB fault-around windows: listing
/// those functions first in the link (lld's `--symbol-ordering-file`) packs
/// them into few windows and cuts the resident code (docs/benchmarks.md,
/// "hot code together"). Only for release-like profiles (PROFILE is
/// "release" for `release`, `bench` and profiles inheriting them) and only
/// when the link is rustc's own rust-lld: GNU ld and gold do not know the
/// option. `--no-warn-symbol-ordering`: names gone since the list was made
/// are skipped silently; a stale list costs RSS, never a build.
/// `NRI_QOS_LINK_ORDER=0` turns it off.
fn hot_functions_together() {
    const LIST: &str = "link/hot-functions.txt";
    println!("cargo:rerun-if-changed={LIST}");
    println!("cargo:rerun-if-env-changed=NRI_QOS_LINK_ORDER");
    if env("PROFILE") != "release" || env("NRI_QOS_LINK_ORDER") == "0" || !links_with_rust_lld() {
        return;
    }
    let list = Path::new(&env("CARGO_MANIFEST_DIR")).join(LIST);
    // The link reads the copy in OUT_DIR: a path into the checkout could be
    // gone when a target dir shared by two checkouts relinks without
    // rerunning this script, and the release link would fail.
    let copy = Path::new(&env("OUT_DIR")).join("hot-functions.txt");
    if fs::copy(&list, &copy).is_err() {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=nri-qos=-Wl,--symbol-ordering-file={},--no-warn-symbol-ordering",
        copy.display()
    );
}

/// rustc links x86_64-unknown-linux-gnu with its bundled rust-lld by default
/// since 1.90, unless told to use another linker: a configured linker
/// (`RUSTC_LINKER`, from `target.<triple>.linker`) or any linker flag in
/// RUSTFLAGS (`-C linker=`, `-C link-arg=-fuse-ld=bfd`, `-C
/// link-self-contained=-linker`, …) means we cannot tell, so no ordering.
fn links_with_rust_lld() -> bool {
    if env("TARGET") != "x86_64-unknown-linux-gnu"
        || std::env::var_os("RUSTC_LINKER").is_some()
        || env("CARGO_ENCODED_RUSTFLAGS").contains("link")
    {
        return false;
    }
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(out) = std::process::Command::new(rustc).arg("--version").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = String::from_utf8_lossy(&out.stdout);
    let mut numbers = version
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('.')
        .map(|n| n.parse::<u32>().ok());
    match (numbers.next().flatten(), numbers.next().flatten()) {
        (Some(major), Some(minor)) => major > 1 || minor >= 90,
        _ => false,
    }
}

/// A variable cargo sets for build scripts, empty when unset.
fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}
