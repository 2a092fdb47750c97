//! The `gpuvisor` command (being written).
fn main() {}
