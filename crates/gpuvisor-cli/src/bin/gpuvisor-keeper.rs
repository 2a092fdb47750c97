//! `gpuvisor-keeper --parent PID -- COMMAND...`: the keeper `gpuvisor run` starts in front of
//! every replica (see gpuvisor_supervisor::keeper). A binary of its own because one is started
//! per replica: it links only the keeper's code, so it loads and forks far faster than
//! `gpuvisor __keeper` (the fallback where this binary is not installed beside `gpuvisor`).

fn main() {
    gpuvisor_supervisor::keeper::main()
}
