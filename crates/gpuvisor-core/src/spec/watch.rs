//! The runtime-policy keys: `[job] sample_interval`, `[gpus] headroom_alarm` and
//! `[process.NAME] on_budget_exceeded`, `on_gpu_use`, `stall_after`, `untracked_alarm`.

use super::reader::{suggest, Field, Table};
use super::restart::duration;
use super::values::size_allowing_zero;
use super::{BudgetAction, Diagnostic, GpuUseAction, WatchSpec};

/// `[job] sample_interval` when not written, ms.
pub const DEFAULT_SAMPLE_INTERVAL_MS: u64 = 500;
/// The shortest `sample_interval`, ms.
const MIN_SAMPLE_INTERVAL_MS: u64 = 50;
/// The shortest `stall_after`, ms (shorter would flag every pause between log lines).
const MIN_STALL_AFTER_MS: u64 = 1000;

/// Reads `[job] sample_interval`.
pub(super) fn sample_interval(field: &Field<'_, '_>) -> Result<u64, Diagnostic> {
    duration(field, MIN_SAMPLE_INTERVAL_MS).map_err(|error| {
        if error.hint.is_some() {
            error
        } else {
            error.with_hint(
                "the sampler reads GPUs and /proc this often: 500ms by default, 50ms at the least",
            )
        }
    })
}

/// Reads `[gpus] headroom_alarm`: a positive size.
pub(super) fn headroom_alarm(field: &Field<'_, '_>) -> Result<u64, Diagnostic> {
    match size_allowing_zero(field)? {
        0 => Err(field
            .error("must be more than 0, found \"0\"")
            .with_hint("the alarm fires when a GPU has less free memory than this, e.g. headroom_alarm = \"1GiB\"; remove the key for no alarm")),
        bytes => Ok(bytes),
    }
}

/// Reads a process's policy keys. `on_gpu_use` is for processes that must not use a GPU
/// (`device = "cpu"`, or children with `children_cpu_only`); `on_budget_exceeded` for
/// processes with a budget.
pub(super) fn process_watch(
    table: &Table<'_, '_>,
    cpu_only: bool,
    children_cpu_only: bool,
) -> Result<WatchSpec, Diagnostic> {
    let mut watch = WatchSpec::default();
    if let Some(field) = table.get("on_budget_exceeded") {
        if cpu_only {
            return Err(field
                .key_error("is not allowed with device = \"cpu\"")
                .with_hint("a CPU-only process has no GPU budget; use `on_gpu_use` to act when it touches a GPU"));
        }
        watch.on_budget_exceeded = choice(
            &field,
            &[
                ("warn", BudgetAction::Warn),
                ("kill", BudgetAction::Kill),
                ("restart", BudgetAction::Restart),
            ],
            "warn records an event; kill stops the replica for good; restart starts it again",
        )?;
    }
    if let Some(field) = table.get("on_gpu_use") {
        if !cpu_only && !children_cpu_only {
            return Err(field
                .key_error("applies only to processes that must not use a GPU")
                .with_hint("add device = \"cpu\" (the process and its children) or children_cpu_only = true (its children), or remove `on_gpu_use`"));
        }
        watch.on_gpu_use = choice(
            &field,
            &[("warn", GpuUseAction::Warn), ("kill", GpuUseAction::Kill)],
            "warn records an event naming the process; kill also sends it SIGKILL",
        )?;
    }
    if let Some(field) = table.get("stall_after") {
        watch.stall_after_ms = Some(duration(&field, MIN_STALL_AFTER_MS).map_err(|error| {
            if error.hint.is_some() {
                error
            } else {
                error.with_hint(
                    "a replica quiet this long is reported as stalled, e.g. stall_after = \"10m\"",
                )
            }
        })?);
    }
    if let Some(field) = table.get("untracked_alarm") {
        if cpu_only {
            return Err(field
                .key_error("is not allowed with device = \"cpu\"")
                .with_hint("a CPU-only process holds no GPU memory to compare with its ledger; remove `untracked_alarm`"));
        }
        watch.untracked_alarm_bytes = Some(match size_allowing_zero(&field)? {
            0 => return Err(field
                .error("must be more than 0, found \"0\"")
                .with_hint("an `untracked-memory` event is recorded when GPU memory nobody charged passes this, e.g. untracked_alarm = \"1GiB\"; remove the key for the default, max(10% of the budget, 512MiB)")),
            bytes => bytes,
        });
    }
    Ok(watch)
}

/// One of `choices` by name, with a "did you mean" for near misses.
pub(super) fn choice<T: Copy>(
    field: &Field<'_, '_>,
    choices: &[(&str, T)],
    explain: &str,
) -> Result<T, Diagnostic> {
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    let quoted: Vec<String> = names.iter().map(|name| format!("\"{name}\"")).collect();
    let expected = format!("one of {}", quoted.join(", "));
    let text = field.string(&expected)?;
    match choices.iter().find(|(name, _)| *name == text) {
        Some((_, value)) => Ok(*value),
        None => {
            let error = field.wrong(&expected);
            Err(match suggest(text, names) {
                Some(near) => error.with_hint(format!("did you mean \"{near}\"?")),
                None => error.with_hint(explain.to_string()),
            })
        }
    }
}
