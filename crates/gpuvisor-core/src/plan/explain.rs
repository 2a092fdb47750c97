//! Error messages for jobs that do not fit: the arithmetic of every GPU, then a concrete hint.
//!
//! The message is what a user reads when a job will not start, so it shows who asked for what on
//! each GPU, what is usable and why, and by how much the failing replica misses; the hint comes
//! from [`super::hint`].

use crate::size::{ByteSize, GIB};
use crate::spec::{MemoryAsk, ProcessSpec};

use super::hint::{fewer_replicas, free_foreign, more_gpus, smaller_ask};
use super::place::{ask_of, fixed_footprint, gpus_per_replica, percent_of, Planner, Room};
use super::{PlanError, MIN_REST_BUDGET_BYTES};

/// A byte count in GiB without the unit, for arithmetic lines: one decimal, two below 1 GiB so
/// context overheads and minimum shares do not print as 0.5 or 0.3.
fn gib(bytes: u64) -> String {
    let value = bytes as f64 / GIB as f64;
    if bytes > 0 && bytes < GIB {
        format!("{value:.2}")
    } else {
        format!("{value:.1}")
    }
}

fn gpus_text(count: usize) -> String {
    if count == 1 {
        "1 GPU".to_string()
    } else {
        format!("{count} GPUs")
    }
}

/// `name` for a single-replica process, `name[3]` otherwise (the record's label).
fn replica_label(process: &ProcessSpec, replica: u32) -> String {
    gpuvisor_record::label::format(&process.name, replica, process.replicas)
}

/// `actor[0..2]` (inclusive) for a run, `actor[0,2,4]` or `actor[0,2,..,98]` otherwise.
fn group_label(process: &ProcessSpec, replicas: &[u32]) -> String {
    match replicas {
        [] => process.name.clone(),
        [one] => replica_label(process, *one),
        [first, .., last] if (*last - *first) as usize + 1 == replicas.len() => {
            format!("{}[{first}..{last}]", process.name)
        }
        _ if replicas.len() <= 4 => {
            let list: Vec<String> = replicas.iter().map(u32::to_string).collect();
            format!("{}[{}]", process.name, list.join(","))
        }
        [first, second, .., last] => format!("{}[{first},{second},..,{last}]", process.name),
        _ => process.name.clone(),
    }
}

/// "a, b, or c".
fn either(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [one] => one.clone(),
        [first, second] => format!("{first} or {second}"),
        [rest @ .., last] => format!("{}, or {last}", rest.join(", ")),
    }
}

/// Consecutive replicas of one process with the same footprint on one GPU.
struct Group {
    process: usize,
    replicas: Vec<u32>,
    footprint_bytes: u64,
    budget_bytes: u64,
}

fn groups(planner: &Planner, room: &Room) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for &(process, replica) in &room.placed {
        let placed = planner.placed[process][replica as usize].as_ref();
        let (footprint_bytes, budget_bytes) = placed.map_or((0, 0), |placed| {
            (placed.footprint_bytes, placed.budget_bytes)
        });
        match groups.last_mut() {
            Some(last) if last.process == process && last.footprint_bytes == footprint_bytes => {
                last.replicas.push(replica);
            }
            _ => groups.push(Group {
                process,
                replicas: vec![replica],
                footprint_bytes,
                budget_bytes,
            }),
        }
    }
    groups
}

/// What one group holds, e.g. `3 x (16.0 + 0.49 context) = 49.5 GiB`.
fn group_amount(planner: &Planner, room: &Room, group: &Group) -> String {
    let process = &planner.job.processes[group.process];
    let overhead = planner.job.gpus.context_overhead_bytes;
    let count = group.replicas.len() as u64;
    let (budget, context) = (gib(group.budget_bytes), gib(overhead));
    let total = gib(group.footprint_bytes * count);
    let each = if count > 1 {
        format!("{count} x ")
    } else {
        String::new()
    };
    match ask_of(process) {
        Some(MemoryAsk::Bytes(_)) if count == 1 => {
            format!("{budget} + {context} context = {total} GiB")
        }
        Some(MemoryAsk::Bytes(_)) => format!("{each}({budget} + {context} context) = {total} GiB"),
        Some(MemoryAsk::Percent(pct)) => {
            let of = if percent_of(room.usable_bytes, pct) == group.footprint_bytes {
                "of usable"
            } else {
                "of usable on its smallest GPU"
            };
            let each_word = if count > 1 { " each" } else { "" };
            let parts = if count > 1 {
                format!("({budget} + {context} context)")
            } else {
                format!("{budget} + {context} context")
            };
            format!("{each}{parts} = {total} GiB ({pct}% {of}{each_word})")
        }
        _ => {
            let minimum = MIN_REST_BUDGET_BYTES + overhead;
            let parts = format!("{} + {context} context", gib(MIN_REST_BUDGET_BYTES));
            let parts = if count > 1 {
                format!("({parts})")
            } else {
                parts
            };
            format!(
                "{each}rest, needs at least {each}{parts} = {} GiB",
                gib(minimum * count)
            )
        }
    }
}

/// The arithmetic of every GPU; `verdict` writes the last line of a GPU's block.
fn arithmetic(planner: &Planner, verdict: impl Fn(&Room) -> String) -> String {
    let mut lines: Vec<(String, String)> = Vec::new();
    let mut out = String::new();
    for room in &planner.rooms {
        lines.clear();
        for group in groups(planner, room) {
            let process = &planner.job.processes[group.process];
            lines.push((
                group_label(process, &group.replicas),
                group_amount(planner, room, &group),
            ));
        }
        let width = lines
            .iter()
            .map(|(label, _)| label.chars().count())
            .max()
            .unwrap_or(0);
        let gpu = room.gpu;
        out.push_str(&format!(
            "\n  GPU {} {}: usable {} GiB = {} total - {} reserve - {} held by others",
            gpu.index,
            gpu.name,
            gib(room.usable_bytes),
            gib(gpu.total_bytes),
            gib(room.reserve_bytes),
            gib(room.foreign_bytes)
        ));
        for (label, amount) in &lines {
            out.push_str(&format!("\n    {label:<width$}  {amount}"));
        }
        out.push_str(&format!("\n    {}", verdict(room)));
    }
    out
}

/// `  not placed yet: actor[4..7], critic, sim (rest)`, or nothing.
fn still_to_place(
    planner: &Planner,
    process_index: usize,
    replica: u32,
    fixed_stage: bool,
) -> String {
    let mut names = Vec::new();
    for (index, process) in planner.job.processes.iter().enumerate() {
        let Some(ask) = ask_of(process) else { continue };
        let is_rest = ask == MemoryAsk::Rest;
        // Fixed asks go first, so when a fixed ask fails every rest-taker is still unplaced.
        let first = if index == process_index {
            replica + 1
        } else if (index > process_index && (fixed_stage || is_rest)) || (fixed_stage && is_rest) {
            0
        } else {
            continue;
        };
        if first >= process.replicas {
            continue;
        }
        let replicas: Vec<u32> = (first..process.replicas).collect();
        let label = if first == 0 {
            process.name.clone()
        } else {
            group_label(process, &replicas)
        };
        names.push(if is_rest {
            format!("{label} (rest)")
        } else {
            label
        });
    }
    if names.is_empty() {
        String::new()
    } else {
        format!("\n  not placed yet: {}", names.join(", "))
    }
}

/// A fixed ask (bytes or percent) found no room; `planner` holds everything placed before it.
pub(super) fn fixed_failure(
    planner: &Planner,
    process_index: usize,
    replica: u32,
    ask: MemoryAsk,
) -> PlanError {
    let process = &planner.job.processes[process_index];
    let overhead = planner.job.gpus.context_overhead_bytes;
    let k = gpus_per_replica(process);
    let label = replica_label(process, replica);
    let with_budget = planner
        .rooms
        .iter()
        .filter(|room| fixed_footprint(ask, room.usable_bytes, overhead).is_some())
        .count();
    let verdict = |room: &Room| -> String {
        let head = format!(
            "committed {} GiB, left {} GiB",
            gib(room.fixed_bytes),
            gib(room.left_bytes())
        );
        match (ask, fixed_footprint(ask, room.usable_bytes, overhead)) {
            (MemoryAsk::Percent(pct), None) => format!(
                "{head}: {pct}% of usable here is {} GiB, no more than the {} GiB context, so no budget",
                gib(percent_of(room.usable_bytes, pct)),
                gib(overhead)
            ),
            (_, Some(need)) if need <= room.left_bytes() => format!("{head}: room for {label}"),
            (_, need) => {
                let short = need.unwrap_or(0).saturating_sub(room.left_bytes());
                format!("{head}: short by {} GiB for {label}", gib(short))
            }
        }
    };
    let rest = still_to_place(planner, process_index, replica, true);
    let gpus_needed = gpus_text(k);

    if let (MemoryAsk::Percent(pct), true) = (ask, with_budget < k) {
        let message = format!(
            "the job does not fit: {label} asks {pct}% of usable memory on {gpus_needed}, but that is no more than its {} context overhead on {}{}{rest}",
            ByteSize(overhead),
            if with_budget == 0 { "any GPU".to_string() } else { format!("all but {with_budget} of the GPUs") },
            arithmetic(planner, verdict),
        );
        let mut usables: Vec<u64> = planner.rooms.iter().map(|room| room.usable_bytes).collect();
        usables.sort_unstable_by(|a, b| b.cmp(a));
        let mut parts = Vec::new();
        if let Some(&usable) = usables.get(k - 1).filter(|&&usable| usable > 0) {
            let needed = (100 * (overhead + MIN_REST_BUDGET_BYTES)).div_ceil(usable);
            if needed <= 100 {
                parts.push(format!(
                    "a larger share (memory = \"{needed}%\" leaves a budget of at least {})",
                    ByteSize(MIN_REST_BUDGET_BYTES)
                ));
            }
        }
        parts.push("an absolute size (memory = \"2GiB\")".to_string());
        parts.push(format!(
            "a smaller `[gpus] context_overhead` (now {})",
            ByteSize(overhead)
        ));
        return PlanError::Infeasible {
            message,
            hint: either(&parts),
        };
    }

    let fitting = planner
        .rooms
        .iter()
        .filter(|room| {
            fixed_footprint(ask, room.usable_bytes, overhead)
                .is_some_and(|need| need <= room.left_bytes())
        })
        .count();
    let tail = if fitting == 0 {
        "no GPU has room".to_string()
    } else {
        format!("only {fitting} of the {k} GPUs it needs have room")
    };
    let what = match ask {
        MemoryAsk::Bytes(bytes) => format!("{} + {} context", ByteSize(bytes), ByteSize(overhead)),
        MemoryAsk::Percent(pct) => format!(
            "{pct}% of usable memory ({} context included)",
            ByteSize(overhead)
        ),
        MemoryAsk::Rest => "the rest".to_string(),
    };
    let message = format!(
        "the job does not fit: {label} asks {what} on {gpus_needed}, and {tail}{}{rest}",
        arithmetic(planner, verdict)
    );
    let mut parts = Vec::new();
    if replica > 0 {
        parts.push(fewer_replicas(planner, process_index, replica));
    }
    parts.push(smaller_ask(planner, process_index, ask));
    if let Some(free) = free_foreign(planner) {
        parts.push(free);
    }
    parts.push(more_gpus(planner));
    PlanError::Infeasible {
        message,
        hint: either(&parts),
    }
}

/// A rest-taker found no GPU with room for another share of at least the minimum.
pub(super) fn rest_failure(planner: &Planner, process_index: usize, replica: u32) -> PlanError {
    let process = &planner.job.processes[process_index];
    let overhead = planner.job.gpus.context_overhead_bytes;
    let minimum = MIN_REST_BUDGET_BYTES + overhead;
    let k = gpus_per_replica(process);
    let label = replica_label(process, replica);
    let verdict = |room: &Room| -> String {
        let shares = room.rest_takers + 1;
        let share = room.left_bytes() / shares;
        let head = format!(
            "fixed asks {} GiB, left {} GiB",
            gib(room.fixed_bytes),
            gib(room.left_bytes())
        );
        let split = if shares == 1 {
            format!("{label} would get {} GiB", gib(share))
        } else {
            format!("{shares} rest shares of {} GiB", gib(share))
        };
        if share >= minimum {
            format!("{head}: {split}, room for {label}")
        } else {
            format!(
                "{head}: {split}, short by {} GiB",
                gib(minimum * shares - room.left_bytes())
            )
        }
    };
    let fitting = planner
        .rooms
        .iter()
        .filter(|room| room.left_bytes() / (room.rest_takers + 1) >= minimum)
        .count();
    let tail = if fitting == 0 {
        "no GPU has that much left for another share".to_string()
    } else {
        format!("only {fitting} of the {k} GPUs it needs have that much left for another share")
    };
    let message = format!(
        "the job does not fit: {label} asks for the rest on {}, at least {} + {} context, and {tail}{}{}",
        gpus_text(k),
        ByteSize(MIN_REST_BUDGET_BYTES),
        ByteSize(overhead),
        arithmetic(planner, verdict),
        still_to_place(planner, process_index, replica, false),
    );
    let mut parts = Vec::new();
    if replica > 0 {
        parts.push(fewer_replicas(planner, process_index, replica));
    }
    let most_left = planner
        .rooms
        .iter()
        .map(Room::left_bytes)
        .max()
        .unwrap_or(0);
    parts.push(format!(
        "smaller fixed asks (they leave at most {} on a GPU; each rest share needs {})",
        ByteSize(most_left),
        ByteSize(minimum)
    ));
    if let Some(free) = free_foreign(planner) {
        parts.push(free);
    }
    parts.push(more_gpus(planner));
    PlanError::Infeasible {
        message,
        hint: either(&parts),
    }
}
