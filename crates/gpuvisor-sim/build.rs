//! Gives the simulator the soname of the real driver library, so programs linked with
//! `-lcuda` against it record `libcuda.so.1` and load it through LD_LIBRARY_PATH.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
