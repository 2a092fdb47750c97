//! `gpuvisor top`: a live terminal view of a run (or of every GPU process on the machine).
//!
//! Split so that all of it is testable without a terminal or processes:
//! - [`model`]: the view model, plain data ([`TopModel`]);
//! - [`app`]: the UI state around it and [`handle_key`], a pure key → [`Action`] step;
//! - [`render()`]: a pure function drawing a frame from the app (tests draw into ratatui's
//!   `TestBackend`; `--once` prints the same text);
//! - [`source`]: where models come from ([`TopSource`]; [`RunSource`]: a run directory
//!   through its control socket or record), [`machine`] the machine-wide source, [`procfs`]
//!   CPU percentages from gpuvisor-probe's /proc readings;
//! - [`record`]: reading a run directory's plan, events and logs for the screen;
//! - [`terminal`]: the interactive loop on a real terminal (crossterm draws; [`input`] reads
//!   keys and notices a terminal that went away).

pub mod app;
mod bar;
pub mod input;
pub mod machine;
pub mod model;
pub mod procfs;
pub mod record;
pub mod render;
pub mod source;
pub mod terminal;

#[cfg(test)]
mod tests;

pub use app::{handle_key, Action, Key, Overlay, SortKey, TopApp};
pub use machine::MachineSource;
pub use model::{EventLine, GpuView, LogLine, ProcessRow, Segment, Tone, TopModel};
pub use render::{render, render_to_text};
pub use source::{GpuSample, RunSource, TopSource};
