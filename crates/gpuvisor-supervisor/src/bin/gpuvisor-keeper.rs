//! A stand-alone keeper for the supervisor crate's own tests (`gpuvisor-test-keeper`; the
//! product's is the CLI package's `gpuvisor-keeper`, the same code).

fn main() {
    gpuvisor_supervisor::keeper::main()
}
