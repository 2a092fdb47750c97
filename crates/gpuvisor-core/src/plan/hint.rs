//! Hints for jobs that do not fit, with numbers that are checked, not estimated: "the whole job
//! fits with N replicas" and "with memory = X the whole job fits" come from binary searches that
//! re-plan variants of the job quietly (no messages), so applying a hint gives a job that plans.

use crate::size::{parse_size, ByteSize, MIB};
use crate::spec::{MemoryAsk, ProcessSpec};

use super::place::{choose_fixed, fits, fixed_charge, gpus_per_replica, Planner};

/// "more GPUs (...)", with what `[gpus] devices` leaves out.
pub(super) fn more_gpus(planner: &Planner) -> String {
    let here = planner.inventory.gpus.len();
    let allowed = planner.rooms.len();
    if planner.job.gpus.devices.is_some() && allowed < here {
        format!("more GPUs (`[gpus] devices` allows {allowed} of the {here} here)")
    } else {
        format!("more or larger GPUs (this machine has {here}; --simulate tries a layout)")
    }
}

/// "freeing the 10.0 GiB held by other processes (pids 4242, 4243)", when any is held.
pub(super) fn free_foreign(planner: &Planner) -> Option<String> {
    let held: u64 = planner.rooms.iter().map(|room| room.foreign_bytes).sum();
    if held == 0 {
        return None;
    }
    let pids: Vec<String> = planner
        .rooms
        .iter()
        .flat_map(|room| {
            room.gpu
                .processes
                .iter()
                .map(|process| process.pid.to_string())
        })
        .collect();
    let pids = if pids.is_empty() {
        String::new()
    } else {
        format!(" (pid {})", pids.join(", "))
    };
    Some(format!(
        "freeing the {} held by other processes{pids}",
        ByteSize(held)
    ))
}

/// Simulates placing all replicas of `process` with `ask`, from what was left before it.
fn all_replicas_fit(planner: &Planner, process: &ProcessSpec, ask: MemoryAsk) -> bool {
    let overhead = planner.job.gpus.context_overhead_bytes;
    let usables: Vec<u64> = planner.rooms.iter().map(|room| room.usable_bytes).collect();
    let mut lefts = planner.left_before_process.clone();
    let mut chosen = Vec::new();
    let k = gpus_per_replica(process);
    for _ in 0..process.replicas {
        if !choose_fixed(
            &lefts,
            &usables,
            ask,
            overhead,
            k,
            planner.job.gpus.placement,
            &mut chosen,
        ) {
            return false;
        }
        let (_, footprint) = fixed_charge(ask, &usables, overhead, &chosen);
        for &i in &chosen {
            lefts[i] -= footprint;
        }
    }
    true
}

/// The largest `n` in `1..=high` with `fits(n)`, assuming `fits` is monotone; `None` if `fits(1)`
/// fails.
fn largest(high: u64, fits: impl Fn(u64) -> bool) -> Option<u64> {
    if high == 0 || !fits(1) {
        return None;
    }
    let (mut low, mut high) = (1, high);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if fits(mid) {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    Some(low)
}

/// Whether the whole job plans once `change` is applied to process `process_index`.
fn job_fits_with(
    planner: &Planner,
    process_index: usize,
    change: impl Fn(&mut ProcessSpec),
) -> bool {
    let mut job = planner.job.clone();
    change(&mut job.processes[process_index]);
    fits(&job, planner.inventory)
}

/// The largest ask below `ask` (a `memory = "..."` value) for which `fits` holds.
fn largest_ask(ask: MemoryAsk, most_left: u64, fits: impl Fn(MemoryAsk) -> bool) -> Option<String> {
    match ask {
        MemoryAsk::Bytes(bytes) => {
            let high = bytes.saturating_sub(1).min(most_left) / MIB;
            let mib = largest(high, |mib| fits(MemoryAsk::Bytes(mib * MIB)))?;
            // Prefer a round GiB figure, if it still fits once parsed back.
            let tenths = mib * 10 / 1024;
            let text = format!("{}.{}GiB", tenths / 10, tenths % 10);
            let round_fits =
                tenths > 0 && parse_size(&text).is_ok_and(|bytes| fits(MemoryAsk::Bytes(bytes)));
            Some(if round_fits {
                text
            } else {
                format!("{mib}MiB")
            })
        }
        MemoryAsk::Percent(pct) => {
            let high = (pct.ceil() as u64).saturating_sub(1);
            let pct = largest(high, |pct| fits(MemoryAsk::Percent(pct as f64)))?;
            Some(format!("{pct}%"))
        }
        MemoryAsk::Rest => None,
    }
}

/// What to ask for instead: an ask with which the whole job fits, or failing that, one with
/// which every replica of the process fits next to the processes before it.
pub(super) fn smaller_ask(planner: &Planner, process_index: usize, ask: MemoryAsk) -> String {
    let process = &planner.job.processes[process_index];
    let most_left = planner
        .left_before_process
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    let whole_job = largest_ask(ask, most_left, |ask| {
        job_fits_with(planner, process_index, |process| process.memory = Some(ask))
    });
    if let Some(smaller) = whole_job {
        return format!(
            "a smaller ask (with memory = \"{smaller}\" for {} the whole job fits)",
            process.name
        );
    }
    let whom = if process.replicas > 1 {
        format!("all {} replicas of {}", process.replicas, process.name)
    } else {
        process.name.clone()
    };
    match largest_ask(ask, most_left, |ask| {
        all_replicas_fit(planner, process, ask)
    }) {
        Some(smaller) => format!(
            "a smaller ask (memory = \"{smaller}\" fits {whom} next to the processes before it)"
        ),
        None => format!(
            "a smaller memory ask for {} or the processes before it",
            process.name
        ),
    }
}

/// "fewer replicas of actor (...)": how many make the whole job fit, or failing that, how many
/// were placed before the failure.
pub(super) fn fewer_replicas(planner: &Planner, process_index: usize, placed: u32) -> String {
    let process = &planner.job.processes[process_index];
    let most = largest(u64::from(process.replicas.saturating_sub(1)), |replicas| {
        job_fits_with(planner, process_index, |process| {
            process.replicas = replicas as u32
        })
    });
    match most {
        Some(most) => format!(
            "fewer replicas of {} (the whole job fits with {most} of the {})",
            process.name, process.replicas
        ),
        None => format!(
            "fewer replicas of {} ({placed} of {} fit next to the processes before it)",
            process.name, process.replicas
        ),
    }
}
