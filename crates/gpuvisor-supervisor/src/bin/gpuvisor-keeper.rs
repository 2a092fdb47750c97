//! A stand-alone keeper for the supervisor crate's own tests (the product runs the same code
//! as `gpuvisor __keeper`).

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match gpuvisor_supervisor::keeper::parse_args(&args) {
        Some((parent, command)) => gpuvisor_supervisor::keeper::run(parent, &command),
        None => {
            eprintln!("usage: gpuvisor-keeper --parent PID -- COMMAND...");
            std::process::exit(2);
        }
    }
}
