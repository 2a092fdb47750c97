//! Analyses that need arithmetic on the figures a rule read, so cannot be plain data: which
//! reading of a PyTorch out-of-memory message the numbers support, how much memory a JAX
//! process needed, and whether the GPU was full when cuDNN could not start under XLA.

use std::collections::BTreeMap;

use gpuvisor_core::size::ByteSize;

const GIB: u64 = 1 << 30;

/// What an analysis concluded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Analysis {
    /// The variant the numbers support, if the analysis picks one.
    pub variant: Option<&'static str>,
    /// The numbers spelled out, with what they imply.
    pub text: Option<String>,
}

/// Runs analysis `name` over figures (name -> bytes).
pub fn analyse(name: &str, figures: &BTreeMap<String, u64>) -> Analysis {
    match name {
        "torch-oom" => torch_oom(figures),
        "jax-oom" => jax_oom(figures),
        "jax-outside-pool" => jax_outside_pool(figures),
        _ => Analysis::default(),
    }
}

fn size(bytes: u64) -> String {
    ByteSize(bytes).to_string()
}

/// Reads a PyTorch OOM message's figures. New messages (torch >= 2.1) say how much is
/// "reserved by PyTorch but unallocated"; old ones give "reserved in total", from which the same
/// number follows.
fn torch_oom(figures: &BTreeMap<String, u64>) -> Analysis {
    let get = |name: &str| figures.get(name).copied();
    let (Some(tried), Some(allocated)) = (get("tried"), get("allocated")) else {
        return Analysis::default();
    };
    let reserved_unallocated = get("reserved_unallocated")
        .or_else(|| get("reserved_total").map(|reserved| reserved.saturating_sub(allocated)));
    let total = get("total_capacity");
    let free = get("free");
    // "this process has 0 bytes memory in use" beside tensors PyTorch did allocate: NVML had
    // no per-process figures (a container without the host's pids), so the listed ones (all 0)
    // say nothing either.
    let nvml_blind = get("process_in_use") == Some(0) && allocated > 0;
    let process_in_use = get("process_in_use").filter(|_| !nvml_blind);
    // Old messages do not say what this process holds: what PyTorch reserved is a lower bound.
    let held =
        process_in_use.unwrap_or(allocated.saturating_add(reserved_unallocated.unwrap_or(0)));
    // Other processes: as listed, else what neither this process nor the free memory accounts for.
    let listed_others = get("other_processes").filter(|_| !nvml_blind);
    let others = listed_others.unwrap_or_else(|| match (total, free) {
        (Some(total), Some(free)) if process_in_use.is_none() => {
            total.saturating_sub(free.saturating_add(held))
        }
        _ => 0,
    });

    let mut facts = vec![format!(
        "asked for {}; PyTorch had {} allocated",
        size(tried),
        size(allocated)
    )];
    if let Some(unallocated) = reserved_unallocated {
        facts.push(format!("{} reserved but unallocated", size(unallocated)));
    }
    if let (Some(total), Some(free)) = (total, free) {
        facts.push(format!(
            "the GPU has {} with {} free",
            size(total),
            size(free)
        ));
    }
    if let Some(in_use) = process_in_use {
        facts.push(format!("this process held {} in all", size(in_use)));
    }
    if others > 0 {
        facts.push(format!("other processes held {}", size(others)));
    }
    let same_sized = same_sized_processes(figures);
    let siblings = same_sized
        .or_else(|| started_together(figures))
        .filter(|_| others >= tried);

    // Outside PyTorch's allocator but inside this process: context, cuDNN/cuBLAS workspaces,
    // NCCL, or another framework's pool.
    let outside_torch = process_in_use.map(|in_use| {
        in_use.saturating_sub(allocated.saturating_add(reserved_unallocated.unwrap_or(0)))
    });
    // The GPU is (nearly) full, this process holds under half of it and others over a quarter:
    // whatever this process's allocator does, the GPU is shared.
    let shared = matches!((total, free), (Some(total), Some(free))
        if free < tried.max(total / 20) && held < total / 2 && others > total / 4);
    let (variant, implication) = if let Some((count, each)) = siblings {
        let implication = if each == 0 {
            // NVML had no per-process figure (in a container without the host's pids it
            // reports 0 for every process, this one included): the count is the evidence.
            format!("{count} other processes have a context on this GPU (NVML gave no per-process figures: every one reads 0 bytes); that many on one GPU are this job's other ranks (or workers), each with a context here")
        } else if same_sized.is_some() {
            format!("{count} other processes hold about {} each on this GPU: alike in size, they are this job's other ranks (or workers), each with a context here", size(each))
        } else {
            format!("{count} other processes with process ids a few apart hold memory on this GPU (up to {} each): started together, they are this job's other ranks (or workers), each with a context here", size(each))
        };
        ("ranks-on-one-gpu", implication)
    } else if !shared && reserved_unallocated.is_some_and(|u| u >= tried) {
        (
            "fragmentation",
            format!(
                "the free reserved memory ({}) would hold the request but is split into blocks too small for it: fragmentation",
                size(reserved_unallocated.unwrap_or(0))
            ),
        )
    } else if shared
        || total.is_some_and(|total| others > total / 4)
        || matches!((process_in_use, total, free), (Some(in_use), Some(total), Some(free)) if in_use < total / 2 && free < tried)
    {
        (
            "other-processes",
            "most of the GPU is held outside this process: it is shared without budgets"
                .to_string(),
        )
    } else if outside_torch
        .is_some_and(|outside| outside > GIB.max(process_in_use.unwrap_or(0) / 10))
    {
        (
            "non-torch-memory",
            format!(
                "{} of this process's memory is outside PyTorch's allocator",
                size(outside_torch.unwrap_or(0))
            ),
        )
    } else {
        (
            "real-pressure",
            "PyTorch's live tensors fill the memory it can get: the work does not fit".to_string(),
        )
    };
    Analysis {
        variant: Some(variant),
        text: Some(format!("{}: {implication}", facts.join("; "))),
    }
}

/// Three or more other processes on the GPU, the largest within 10% of the smallest: the
/// footprint of one job's ranks or workers that each created a context (and maybe tensors) on
/// this GPU, not of unrelated jobs, whose sizes differ. Returns how many, and the largest.
/// Every one at 0 bytes counts too: NVML then had no per-process figure (the caller checks that
/// other processes do hold the memory the request needed).
fn same_sized_processes(figures: &BTreeMap<String, u64>) -> Option<(u64, u64)> {
    let count = *figures.get("other_count")?;
    let smallest = *figures.get("other_smallest")?;
    let largest = *figures.get("other_largest")?;
    (count >= 3 && largest <= smallest + smallest / 10).then_some((count, largest))
}

/// Two or more other processes whose process ids are within a few of each other (at most 4
/// apart per process listed): one launcher (torchrun, mp.spawn, a job script) started them in
/// a burst, so they are this job's ranks or workers, not unrelated jobs, whose ids lie far
/// apart. Returns how many, and the largest.
fn started_together(figures: &BTreeMap<String, u64>) -> Option<(u64, u64)> {
    let count = *figures.get("other_count")?;
    let lowest = *figures.get("other_lowest_pid")?;
    let highest = *figures.get("other_highest_pid")?;
    let largest = *figures.get("other_largest")?;
    (count >= 2 && highest.saturating_sub(lowest) <= 4 * count).then_some((count, largest))
}

/// Reads XLA's "Memory usage: F bytes free, T bytes total", logged when cuDNN's handle could
/// not be made: with most of the GPU free, memory was not what failed.
fn jax_outside_pool(figures: &BTreeMap<String, u64>) -> Analysis {
    let (Some(free), Some(total)) = (figures.get("free"), figures.get("total")) else {
        return Analysis::default();
    };
    let facts = format!(
        "{} of the GPU's {} was free when cuDNN could not start",
        size(*free),
        size(*total)
    );
    if free.saturating_mul(2) > *total {
        Analysis {
            variant: Some("gpu-mostly-free"),
            text: Some(format!(
                "{facts}: more than half, so not memory; a driver or cuDNN mismatch"
            )),
        }
    } else {
        Analysis {
            variant: None,
            text: Some(format!("{facts}: the GPU was full")),
        }
    }
}

/// Reads the BFC allocator's figures: how much the step needed against the pool's limit.
fn jax_oom(figures: &BTreeMap<String, u64>) -> Analysis {
    let get = |name: &str| figures.get(name).copied();
    let Some(tried) = get("tried") else {
        return Analysis::default();
    };
    let text = match (get("limit"), get("in_use")) {
        (Some(limit), Some(in_use)) => {
            let needed = in_use.saturating_add(tried);
            // Round up to whole GiB and add the ~0.5 GiB outside the pool (context, cuDNN).
            let budget_gib = needed.saturating_add(GIB / 2).div_ceil(GIB);
            format!(
                "the pool's limit was {}, {} was in use and the step asked for {} more: it needs at least {}; a budget of memory = \"{budget_gib}GiB\" for this process (pool plus context) would hold it",
                size(limit),
                size(in_use),
                size(tried),
                size(needed)
            )
        }
        (Some(limit), None) => format!(
            "the pool's limit was {} and the step asked for {}",
            size(limit),
            size(tried)
        ),
        _ => format!("the step asked for {}", size(tried)),
    };
    Analysis {
        variant: None,
        text: Some(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(pairs: &[(&str, f64)]) -> BTreeMap<String, u64> {
        pairs
            .iter()
            .map(|(name, gib)| (name.to_string(), (gib * GIB as f64) as u64))
            .collect()
    }

    #[test]
    fn torch_fragmentation_when_unallocated_reserve_covers_the_request() {
        let analysis = analyse(
            "torch-oom",
            &figures(&[
                ("tried", 2.0),
                ("allocated", 60.0),
                ("reserved_unallocated", 6.0),
                ("total_capacity", 79.0),
                ("free", 1.0),
                ("process_in_use", 67.0),
            ]),
        );
        assert_eq!(analysis.variant, Some("fragmentation"));
    }

    #[test]
    fn torch_old_format_reserved_total_gives_the_same_reading() {
        let analysis = analyse(
            "torch-oom",
            &figures(&[
                ("tried", 0.5),
                ("allocated", 10.0),
                ("reserved_total", 13.0),
            ]),
        );
        assert_eq!(analysis.variant, Some("fragmentation"));
    }

    #[test]
    fn torch_old_format_other_processes_follow_from_total_free_and_reserved() {
        // pytorch-CycleGAN-and-pix2pix #962: 10.76 GiB total, 2.42 allocated, 26 MiB free,
        // 2.75 reserved: about 8 GiB belong to other processes, not to fragmentation.
        let analysis = analyse(
            "torch-oom",
            &figures(&[
                ("tried", 0.02),
                ("allocated", 2.42),
                ("reserved_total", 2.75),
                ("total_capacity", 10.76),
                ("free", 0.025),
            ]),
        );
        assert_eq!(analysis.variant, Some("other-processes"));
    }

    #[test]
    fn torch_other_processes_when_the_gpu_is_held_elsewhere() {
        let analysis = analyse(
            "torch-oom",
            &figures(&[
                ("tried", 4.0),
                ("allocated", 18.0),
                ("reserved_unallocated", 0.5),
                ("total_capacity", 79.0),
                ("free", 1.0),
                ("process_in_use", 19.0),
                ("other_processes", 59.0),
            ]),
        );
        assert_eq!(analysis.variant, Some("other-processes"));
        assert!(analysis.text.unwrap().contains("59.0 GiB"));
    }

    #[test]
    fn torch_non_torch_memory_when_the_process_holds_more_than_pytorch() {
        let analysis = analyse(
            "torch-oom",
            &figures(&[
                ("tried", 4.0),
                ("allocated", 20.0),
                ("reserved_unallocated", 0.2),
                ("total_capacity", 79.0),
                ("free", 0.5),
                ("process_in_use", 78.0),
            ]),
        );
        assert_eq!(analysis.variant, Some("non-torch-memory"));
    }

    #[test]
    fn torch_real_pressure_otherwise() {
        let analysis = analyse(
            "torch-oom",
            &figures(&[
                ("tried", 4.0),
                ("allocated", 76.0),
                ("reserved_unallocated", 0.3),
                ("total_capacity", 79.0),
                ("free", 0.5),
                ("process_in_use", 77.0),
            ]),
        );
        assert_eq!(analysis.variant, Some("real-pressure"));
    }

    #[test]
    fn torch_ranks_on_one_gpu_from_same_sized_processes() {
        let mut listed = figures(&[
            ("tried", 0.06),
            ("allocated", 29.9),
            ("reserved_unallocated", 1.5),
            ("total_capacity", 39.4),
            ("free", 0.02),
            ("process_in_use", 32.2),
            ("other_processes", 7.14),
            ("other_smallest", 1.02),
            ("other_largest", 1.02),
        ]);
        listed.insert("other_count".into(), 7);
        let analysis = analyse("torch-oom", &listed);
        assert_eq!(analysis.variant, Some("ranks-on-one-gpu"));
        // Sizes that differ are other jobs, not ranks.
        listed.insert("other_largest".into(), 4 * GIB);
        assert_ne!(
            analyse("torch-oom", &listed).variant,
            Some("ranks-on-one-gpu")
        );
        // Two are not enough to tell.
        listed.insert("other_largest".into(), GIB);
        listed.insert("other_count".into(), 2);
        assert_ne!(
            analyse("torch-oom", &listed).variant,
            Some("ranks-on-one-gpu")
        );
    }

    #[test]
    fn torch_ranks_on_one_gpu_from_process_ids_started_together() {
        let mut listed = figures(&[
            ("tried", 0.03),
            ("allocated", 9.56),
            ("reserved_unallocated", 0.52),
            ("total_capacity", 79.3),
            ("free", 0.007),
            ("process_in_use", 10.58),
            ("other_processes", 68.7),
            ("other_smallest", 9.89),
            ("other_largest", 35.03),
        ]);
        listed.insert("other_count".into(), 3);
        listed.insert("other_lowest_pid".into(), 1_563_102);
        listed.insert("other_highest_pid".into(), 1_563_104);
        let analysis = analyse("torch-oom", &listed);
        assert_eq!(analysis.variant, Some("ranks-on-one-gpu"));
        let text = analysis.text.expect("text");
        assert!(text.contains("process ids a few apart"), "{text}");
        // Ids far apart, sizes that differ: other jobs share the GPU.
        listed.insert("other_highest_pid".into(), 1_790_411);
        assert_eq!(
            analyse("torch-oom", &listed).variant,
            Some("other-processes")
        );
        // One other process alone says nothing about ranks.
        listed.insert("other_count".into(), 1);
        listed.insert("other_highest_pid".into(), 1_563_102);
        assert_ne!(
            analyse("torch-oom", &listed).variant,
            Some("ranks-on-one-gpu")
        );
    }

    #[test]
    fn torch_ranks_on_one_gpu_when_nvml_reads_every_process_as_zero() {
        // NVML without per-process figures: every process, this one too, "has 0 bytes".
        let mut listed = figures(&[
            ("tried", 0.13),
            ("allocated", 10.47),
            ("reserved_unallocated", 0.09),
            ("total_capacity", 79.1),
            ("free", 0.0125),
            ("process_in_use", 0.0),
            ("other_processes", 0.0),
            ("other_smallest", 0.0),
            ("other_largest", 0.0),
        ]);
        listed.insert("other_count".into(), 7);
        let analysis = analyse("torch-oom", &listed);
        assert_eq!(analysis.variant, Some("ranks-on-one-gpu"));
        let text = analysis.text.expect("text");
        assert!(text.contains("7 other processes have a context"), "{text}");
        assert!(!text.contains("this process held 0"), "{text}");
        // One process at 0 among sizes that differ is not a sign of ranks.
        listed.insert("other_largest".into(), 4 * GIB);
        listed.insert("other_processes".into(), 4 * GIB);
        assert_ne!(
            analyse("torch-oom", &listed).variant,
            Some("ranks-on-one-gpu")
        );
        // Only two others at 0 bytes: not enough to tell.
        listed.insert("other_largest".into(), 0);
        listed.insert("other_count".into(), 2);
        assert_ne!(
            analyse("torch-oom", &listed).variant,
            Some("ranks-on-one-gpu")
        );
    }

    #[test]
    fn torch_without_figures_chooses_nothing() {
        assert_eq!(analyse("torch-oom", &BTreeMap::new()), Analysis::default());
    }

    #[test]
    fn jax_outside_pool_with_most_of_the_gpu_free_is_not_memory() {
        let free = analyse(
            "jax-outside-pool",
            &figures(&[("free", 78.5), ("total", 79.2)]),
        );
        assert_eq!(free.variant, Some("gpu-mostly-free"));
        let full = analyse(
            "jax-outside-pool",
            &figures(&[("free", 0.5), ("total", 23.6)]),
        );
        assert_eq!(full.variant, None);
        assert!(full.text.unwrap().contains("full"));
    }

    #[test]
    fn jax_needed_memory_is_in_use_plus_request() {
        let analysis = analyse(
            "jax-oom",
            &figures(&[("tried", 12.0), ("limit", 58.0), ("in_use", 55.0)]),
        );
        let text = analysis.text.unwrap();
        assert!(text.contains("67.0 GiB"), "{text}");
        assert!(text.contains("memory = \"68GiB\""), "{text}");
    }
}
