//! `gpuvisor gpus`: the inventory, as a table or JSON.

use std::process::ExitCode;

use gpuvisor_core::inventory::{Inventory, InventorySource};
use gpuvisor_core::size::ByteSize;

use crate::cli::GpusArgs;
use crate::failure::Failure;
use crate::inventory::load_inventory;
use crate::table::Table;

/// Prints the inventory.
pub fn run(args: GpusArgs) -> Result<ExitCode, Failure> {
    let inventory = load_inventory(args.inventory.simulate.as_deref())?;
    if args.json {
        let json = serde_json::to_string_pretty(&inventory).map_err(Failure::unavailable)?;
        println!("{json}");
    } else {
        print!("{}", render(&inventory));
    }
    Ok(ExitCode::SUCCESS)
}

/// The human table: one row per GPU, then the processes holding memory.
pub fn render(inventory: &Inventory) -> String {
    let source = match &inventory.source {
        InventorySource::Nvml => match &inventory.driver_version {
            Some(version) => format!("NVML, driver {version}"),
            None => "NVML".to_string(),
        },
        InventorySource::Simulated(spec) => format!("simulated: {spec}"),
    };
    let mut out = format!(
        "{} GPU{} ({source})\n",
        inventory.gpus.len(),
        if inventory.gpus.len() == 1 { "" } else { "s" }
    );
    let mut table = Table::new(&[
        "GPU", "NAME", "TOTAL", "USED", "FREE", "MIG", "PROCS", "UUID",
    ]);
    for gpu in &inventory.gpus {
        table.row(vec![
            gpu.index.to_string(),
            gpu.name.clone(),
            ByteSize(gpu.total_bytes).to_string(),
            ByteSize(gpu.used_bytes()).to_string(),
            ByteSize(gpu.free_bytes).to_string(),
            if gpu.mig_enabled { "on" } else { "off" }.to_string(),
            gpu.processes.len().to_string(),
            gpu.uuid.clone(),
        ]);
    }
    out.push_str(&table.render(""));
    let holders: Vec<_> = inventory
        .gpus
        .iter()
        .flat_map(|gpu| {
            gpu.processes
                .iter()
                .map(move |process| (gpu.index, process))
        })
        .collect();
    if !holders.is_empty() {
        out.push_str("\nprocesses holding GPU memory:\n");
        let mut table = Table::new(&["GPU", "PID", "MEMORY", "COMMAND"]);
        for (index, process) in holders {
            table.row(vec![
                index.to_string(),
                process.pid.to_string(),
                process
                    .used_bytes
                    .map_or("?".to_string(), |bytes| ByteSize(bytes).to_string()),
                process.name.clone().unwrap_or_else(|| "?".to_string()),
            ]);
        }
        out.push_str(&table.render("  "));
    }
    out
}
