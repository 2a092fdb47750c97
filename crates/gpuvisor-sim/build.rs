//! Gives the simulator the soname of the real driver library, so programs linked with
//! `-lcuda` against it record `libcuda.so.1` and load it through LD_LIBRARY_PATH.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // The simulator's own calls between its entry points (and the jumps of the per-thread
    // stream forms) bind inside it, never to a preloaded shim's hook of the same name.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rerun-if-changed=build.rs");
}
