//! Fuzzes the streaming log matcher: any bytes are a log; none may panic.

#![no_main]

use gpuvisor_observe::explain::render::render;
use gpuvisor_observe::explain::KnowledgeBase;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let report = KnowledgeBase::builtin()
        .explain_reader("fuzz", data)
        .expect("reading from memory cannot fail");
    let _ = render(std::slice::from_ref(&report));
});
