//! Builds the three libraries the `gpuvisor` binary carries inside itself, so installing this
//! crate alone is enough: the ledger (rlib, linked into the shim), the shim (the LD_PRELOAD
//! cdylib) and the GPU simulator (a cdylib with the soname `libcuda.so.1`).
//!
//! They are compiled with the same `rustc` cargo uses, into OUT_DIR, and hashed (SHA-256) so
//! the binary can check the copies it writes to its cache directory (src/shim.rs).

#[path = "src/sha256.rs"]
#[allow(dead_code)]
mod sha256;

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let crates = manifest.parent().expect("crates directory").to_path_buf();
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    for name in ["gpuvisor-ledger", "gpuvisor-shim", "gpuvisor-sim"] {
        let source = crates.join(name).join("src");
        // The libraries are built from the workspace's sources; a lone CLI package has none.
        assert!(
            source.join("lib.rs").is_file(),
            "gpuvisor-cli embeds {name}, but its sources are not at {}: build gpuvisor from the \
             workspace (cargo install --path crates/gpuvisor-cli)",
            source.display()
        );
        println!("cargo:rerun-if-changed={}", source.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/sha256.rs");

    let ledger = out.join("libgpuvisor_ledger.rlib");
    rustc(
        &crates.join("gpuvisor-ledger/src/lib.rs"),
        "gpuvisor_ledger",
        "rlib",
        &ledger,
        &[],
    );
    let shim = out.join("libgpuvisor_shim.so");
    let extern_ledger = format!("gpuvisor_ledger={}", ledger.display());
    rustc(
        &crates.join("gpuvisor-shim/src/lib.rs"),
        "gpuvisor_shim",
        "cdylib",
        &shim,
        &["--extern", &extern_ledger],
    );
    let sim = out.join("libcuda.so.1");
    rustc(
        &crates.join("gpuvisor-sim/src/lib.rs"),
        "gpuvisor_sim",
        "cdylib",
        &sim,
        &["-C", "link-arg=-Wl,-soname,libcuda.so.1"],
    );

    for (variable, path) in [("SHIM", &shim), ("SIM", &sim)] {
        let bytes = std::fs::read(path)
            .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
        println!(
            "cargo:rustc-env=GPUVISOR_EMBEDDED_{variable}_PATH={}",
            path.display()
        );
        println!(
            "cargo:rustc-env=GPUVISOR_EMBEDDED_{variable}_SHA256={}",
            sha256::sha256_hex(&bytes)
        );
    }
}

/// Compiles one crate root with plain rustc, optimised, for the target cargo builds for.
fn rustc(root: &Path, crate_name: &str, crate_type: &str, output: &Path, extra: &[&str]) {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let out_dir = output.parent().expect("output directory");
    let mut command = Command::new(rustc);
    command
        .args([
            "--edition",
            "2021",
            "--crate-name",
            crate_name,
            "--crate-type",
            crate_type,
        ])
        .args([
            "-C",
            "opt-level=3",
            "-C",
            "debuginfo=0",
            "-C",
            "strip=debuginfo",
            "--cap-lints",
            "warn",
        ])
        .arg("-L")
        .arg(out_dir)
        .arg("-o")
        .arg(output)
        .args(extra)
        .arg(root);
    let (target, host) = (
        std::env::var("TARGET").unwrap_or_default(),
        std::env::var("HOST").unwrap_or_default(),
    );
    if !target.is_empty() && target != host {
        command.args(["--target", &target]);
    }
    let status = command
        .status()
        .unwrap_or_else(|error| panic!("running rustc for {crate_name}: {error}"));
    assert!(
        status.success(),
        "rustc failed to build {crate_name} from {} ({status})",
        root.display()
    );
}
