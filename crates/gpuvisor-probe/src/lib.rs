//! What the machine says, read one way for every reader: GPUs through NVML (or the
//! simulator's NVML stand-in, or its shared state file) and processes through /proc.
//!
//! - [`gpu_source`] owns the one reading type ([`GpuReading`]: devices and the processes
//!   holding memory on them) and the [`GpuSource`] trait the supervisor's sampler polls, with
//!   the simulator's state file as a source ([`gpu_source::SimSource`]);
//! - [`nvml`] is the one NVML adapter ([`NvmlGpus`]: one handle, opened once per reader) that
//!   `gpus`, `plan`, the sampler, `top` and `doctor` read through;
//! - [`sampler_source`] is the choice of a run's source (NVML, the simulator's NVML stand-in,
//!   its state file), made once per run for the supervisor's sampler;
//! - [`inventory`] converts a reading to and from the planner's [`Inventory`] model;
//! - [`procfs`] is the one /proc reader (stat, status, children, cmdline, environ, maps) of the
//!   supervisor, `exec` and `top`.
//!
//! It must not depend on the supervisor, the observation crate or the CLI: they depend on it.
//! (The ledger keeps its own allocation-free /proc reader, and the shim and the simulator
//! theirs: they run inside other people's programs.)
//!
//! [`Inventory`]: gpuvisor_core::inventory::Inventory

pub mod gpu_source;
pub mod inventory;
pub mod nvml;
pub mod procfs;
pub mod sampler_source;

pub use gpu_source::{DeviceModes, DeviceReading, GpuProcessReading, GpuReading, GpuSource};
pub use nvml::{NvmlGpus, NvmlUnavailable};
