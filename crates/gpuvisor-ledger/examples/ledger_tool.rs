//! A small command-line tool over the ledger API, for manual tests and shell-level checks:
//!
//! ```text
//! ledger_tool create PATH DEVICES GROUP...   DEVICES = UUID=BYTES[,UUID=BYTES...]
//!                                            GROUP   = NAME:LIMIT[,LIMIT..]:PER_PROCESS[,..][:cpu|children-cpu]
//!                                            (LIMIT "-" = none; bytes)
//! ledger_tool show PATH                      prints the snapshot (Debug)
//! ledger_tool reclaim PATH                   frees slots of dead processes
//! ledger_tool remove PATH
//! ```

use gpuvisor_ledger::{DeviceInfo, GroupConfig, Ledger, NO_LIMIT};

fn limits(text: &str) -> Vec<u64> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s == "-" {
                NO_LIMIT
            } else {
                s.parse().expect("limit in bytes or -")
            }
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = std::path::Path::new(args.get(1).expect("usage: ledger_tool COMMAND PATH ..."));
    match args[0].as_str() {
        "create" => {
            let devices: Vec<DeviceInfo> = args[2]
                .split(',')
                .map(|d| {
                    let (uuid, bytes) = d.split_once('=').expect("UUID=BYTES");
                    DeviceInfo {
                        uuid: uuid.into(),
                        total_bytes: bytes.parse().expect("bytes"),
                    }
                })
                .collect();
            let groups: Vec<GroupConfig> = args[3..]
                .iter()
                .map(|g| {
                    let parts: Vec<&str> = g.split(':').collect();
                    GroupConfig {
                        name: parts[0].into(),
                        limit_bytes: limits(parts.get(1).unwrap_or(&"")),
                        per_process_limit_bytes: limits(parts.get(2).unwrap_or(&"")),
                        cpu_only: parts.get(3) == Some(&"cpu"),
                        children_cpu_only: parts.get(3) == Some(&"children-cpu"),
                    }
                })
                .collect();
            Ledger::create(path, &devices, &groups).unwrap_or_else(|e| panic!("{e}"));
        }
        "show" => println!(
            "{:#?}",
            Ledger::open(path)
                .unwrap_or_else(|e| panic!("{e}"))
                .snapshot()
        ),
        "reclaim" => println!(
            "{:?}",
            Ledger::open(path)
                .unwrap_or_else(|e| panic!("{e}"))
                .reclaim_dead()
        ),
        "remove" => Ledger::open(path)
            .unwrap_or_else(|e| panic!("{e}"))
            .remove()
            .unwrap_or_else(|e| panic!("{e}")),
        other => panic!("unknown command {other}"),
    }
}
