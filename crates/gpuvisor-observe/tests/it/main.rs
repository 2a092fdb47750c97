//! explain's corpus, rates, fuzz and doc-reference tests, one test binary (`cargo test -p
//! gpuvisor-observe --test it`): each former `tests/*.rs` file is a module here. Filter by module
//! as by file before: `cargo test -p gpuvisor-observe --test it -- corpus::`.

mod corpus;
mod corpus_rates;
mod doc_references;
mod fuzz;
mod source_messages;
