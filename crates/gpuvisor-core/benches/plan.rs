//! Planner benchmark (being written).
fn main() {}
