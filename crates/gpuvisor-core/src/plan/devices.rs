//! Plan-time checks of the job against the machine: which GPUs `[gpus] devices` allows, and
//! whether every process can have the GPUs per replica it asks for. Failures are diagnostics that
//! point into the job file.

use std::collections::BTreeSet;

use crate::inventory::{Gpu, Inventory};
use crate::spec::{DeviceSelector, Diagnostic, JobSpec, Span};

use super::place::{ask_of, gpus_per_replica};
use super::PlanError;

/// The GPUs `[gpus] devices` allows, in index order.
pub(super) fn allowed_gpus<'a>(
    job: &JobSpec,
    inventory: &'a Inventory,
) -> Result<Vec<&'a Gpu>, PlanError> {
    let Some(selectors) = &job.gpus.devices else {
        let mut all: Vec<&Gpu> = inventory.gpus.iter().collect();
        all.sort_by_key(|gpu| gpu.index);
        return Ok(all);
    };
    let mut indices = BTreeSet::new();
    for selector in selectors {
        let found = match selector {
            DeviceSelector::Index(index) => inventory.gpus.iter().find(|gpu| gpu.index == *index),
            DeviceSelector::Uuid(uuid) => inventory
                .gpus
                .iter()
                .find(|gpu| gpu.uuid.eq_ignore_ascii_case(uuid)),
        };
        match found {
            Some(gpu) => {
                indices.insert(gpu.index);
            }
            None => return Err(unknown_device(job, inventory, selector)),
        }
    }
    Ok(indices
        .into_iter()
        .filter_map(|index| inventory.gpus.iter().find(|gpu| gpu.index == index))
        .collect())
}

/// A diagnostic at `span` (or about the whole file when the spec has no span).
fn diagnostic_at(job: &JobSpec, span: Option<Span>, message: String) -> Diagnostic {
    match span {
        Some(span) => Diagnostic::at(&job.path, &job.source, span, message),
        None => Diagnostic::whole_file(&job.path, message),
    }
}

fn machine_has(inventory: &Inventory) -> String {
    let mut indices: Vec<u32> = inventory.gpus.iter().map(|gpu| gpu.index).collect();
    indices.sort_unstable();
    match indices.as_slice() {
        [] => "this machine has no GPUs".to_string(),
        [only] => format!("this machine has only GPU {only}"),
        [first, .., last] if (*last - *first) as usize + 1 == indices.len() => {
            format!("this machine has GPUs {first} to {last}")
        }
        _ => format!(
            "this machine has GPUs {}",
            indices
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn unknown_device(job: &JobSpec, inventory: &Inventory, selector: &DeviceSelector) -> PlanError {
    let has = machine_has(inventory);
    let (message, hint) = match selector {
        DeviceSelector::Index(index) => (
            format!("`[gpus] devices` names GPU {index}, but {has}"),
            "list only GPUs that exist (`gpuvisor gpus` shows them), or leave `devices` out to use all".to_string(),
        ),
        DeviceSelector::Uuid(uuid) => {
            let nearest = inventory
                .gpus
                .iter()
                .map(|gpu| (strsim::levenshtein(&gpu.uuid.to_ascii_lowercase(), &uuid.to_ascii_lowercase()), gpu))
                .min_by_key(|(distance, gpu)| (*distance, gpu.index))
                .filter(|(distance, _)| *distance <= 4);
            let hint = match nearest {
                Some((_, gpu)) => format!("did you mean `{}` (GPU {})?", gpu.uuid, gpu.index),
                None => "use a UUID that `gpuvisor gpus` lists, or a device index".to_string(),
            };
            (format!("`[gpus] devices` names `{uuid}`, but no GPU here has that UUID ({has})"), hint)
        }
    };
    PlanError::Spec(Box::new(
        diagnostic_at(job, job.gpus.devices_span, message).with_hint(hint),
    ))
}

pub(super) fn check_gpus_per_replica(
    job: &JobSpec,
    inventory: &Inventory,
    allowed: usize,
) -> Result<(), PlanError> {
    for process in &job.processes {
        if ask_of(process).is_none() {
            continue;
        }
        let wanted = gpus_per_replica(process);
        if wanted <= allowed {
            continue;
        }
        let plural = if wanted == 1 { "" } else { "s" };
        let (message, hint) = match &job.gpus.devices {
            Some(_) => (
                format!(
                    "process `{}` asks for {wanted} GPU{plural} per replica, but `[gpus] devices` allows only {allowed}",
                    process.name
                ),
                format!(
                    "lower `gpus` to at most {allowed}, or allow more devices in `[gpus] devices` ({})",
                    machine_has(inventory)
                ),
            ),
            None => (
                format!(
                    "process `{}` asks for {wanted} GPU{plural} per replica, but {}",
                    process.name,
                    machine_has(inventory)
                ),
                match allowed {
                    0 => "run it on a machine with GPUs, set `device = \"cpu\"`, or try the layout with --simulate".to_string(),
                    _ => format!("lower `gpus` to at most {allowed}, or try the layout with --simulate {wanted}xh100"),
                },
            ),
        };
        let diagnostic =
            Diagnostic::at(&job.path, &job.source, process.gpus_span, message).with_hint(hint);
        return Err(PlanError::Spec(Box::new(diagnostic)));
    }
    Ok(())
}
