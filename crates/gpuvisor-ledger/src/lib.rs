//! The shared-memory ledger of a gpuvisor job (being written).
