//! One `[process.NAME]` table -> [`ProcessSpec`].

use std::ops::Range;
use std::path::PathBuf;

use toml::de::{DeString, DeValue};
use toml::Spanned;

use super::reader::{suggest, Field, Source, Table};
use super::{restart, values};
use super::{DeviceKind, Diagnostic, Framework, MemoryAsk, ProcessSpec, ReadyWhen};

/// Keys accepted in `[process.NAME]`.
pub(super) const PROCESS_KEYS: &[&str] = &[
    "command",
    "shell",
    "cwd",
    "env",
    "replicas",
    "framework",
    "device",
    "gpus",
    "memory",
    "preallocate",
    "children_cpu_only",
    "ready",
    "logs",
    "after",
    "restart",
    "stop",
    "on_budget_exceeded",
    "on_gpu_use",
    "stall_after",
    "untracked_alarm",
    "nodes",
    "distributed",
];

/// Longest process name accepted (it becomes part of file names).
const MAX_NAME_LEN: usize = 64;

/// Names people write for a framework, mapped to ours, for "did you mean" hints.
const FRAMEWORK_ALIASES: &[(&str, Framework)] = &[
    ("pytorch", Framework::Torch),
    ("tf", Framework::Tensorflow),
    ("keras", Framework::Tensorflow),
    ("xla", Framework::Jax),
    ("flax", Framework::Jax),
    ("cpu", Framework::None),
];

/// A parsed process plus what the cross-process checks need.
pub(super) struct ParsedProcess {
    /// The validated process, except `after` names, which are checked against the whole job.
    pub spec: ProcessSpec,
    /// Byte range of each `after` entry, in the order of `spec.after`.
    pub after_ranges: Vec<Range<usize>>,
}

/// Parses `[process.NAME]`, given its key and value in the `process` table.
pub(super) fn process(
    source: Source<'_>,
    key: &Spanned<DeString<'_>>,
    value: &Spanned<DeValue<'_>>,
) -> Result<ParsedProcess, Diagnostic> {
    let name: &str = key.get_ref();
    check_name(source, name, key.span())?;
    let table_name = format!("[process.{name}]");
    let DeValue::Table(raw) = value.get_ref() else {
        let error = source.error(
            key.span(),
            format!(
                "`process.{name}` must be a table, found {}",
                source.describe(value)
            ),
        );
        return Err(if PROCESS_KEYS.contains(&name) {
            error.with_hint(format!(
                "`{name}` belongs in a named process table: write [process.NAME] (e.g. [process.train]) instead of [process]"
            ))
        } else {
            error.with_hint(format!(
                "each process is a table: [process.{name}] on its own line, then its keys (command = [...], ...)"
            ))
        });
    };
    // Unknown keys do not stop the check of the known ones: all are reported together.
    let (table, unknown) = Table::lenient(source, &table_name, value.span(), raw, PROCESS_KEYS);
    let parsed = fields(source, name, &table_name, &table, value);
    match (unknown, parsed) {
        (None, parsed) => parsed,
        (Some(unknown), Ok(_)) => Err(unknown),
        (Some(unknown), Err(error)) => {
            Err(Diagnostic::all(vec![unknown, error]).unwrap_or_else(|| unreachable!()))
        }
    }
}

/// The known keys of `[process.NAME]` -> [`ParsedProcess`]; the first problem found.
fn fields(
    source: Source<'_>,
    name: &str,
    table_name: &str,
    table: &Table<'_, '_>,
    value: &Spanned<DeValue<'_>>,
) -> Result<ParsedProcess, Diagnostic> {
    let device = match table.get("device") {
        None => DeviceKind::Gpu,
        Some(field) => match field.string("\"gpu\" or \"cpu\"")? {
            "gpu" => DeviceKind::Gpu,
            "cpu" => DeviceKind::Cpu,
            _ => {
                return Err(field
                    .wrong("\"gpu\" or \"cpu\"")
                    .with_hint("\"gpu\" (the default) runs on GPUs; \"cpu\" keeps the process and its children off every GPU"))
            }
        },
    };
    let cpu_only = device == DeviceKind::Cpu;
    let framework = match table.get("framework") {
        None => Framework::None,
        Some(field) => framework(&field)?,
    };

    let shell = match table.get("shell") {
        None => false,
        Some(field) => field.boolean()?,
    };
    let command = match table.get("command") {
        Some(field) => values::command(source, &field, shell)?,
        None => {
            return Err(table.error(format!("{table_name} has no `command`")).with_hint(
                "add command = [\"python\", \"script.py\"] (program and arguments), or a string with shell = true",
            ))
        }
    };
    let cwd = match table.get("cwd") {
        None => None,
        Some(field) => {
            let text = field.string("a directory path (string)")?;
            if text.is_empty() {
                return Err(field.error("is empty").with_hint(
                    "remove `cwd` to keep the default working directory, or give a path",
                ));
            }
            let what = format!("`cwd` in {table_name}");
            values::check_passable(source, field.value_range(), &what, text, text.len())?;
            Some(PathBuf::from(text))
        }
    };
    let env = match table.get("env") {
        None => Default::default(),
        Some(field) => values::env(source, &field)?,
    };
    let replicas = match table.get("replicas") {
        None => 1,
        Some(field) => field.integer_in(1, 4096).map_err(|error| {
            or_hint(
                error,
                "`replicas` is how many copies of this process run, e.g. replicas = 4",
            )
        })? as u32,
    };

    let gpus_per_replica = match table.get("gpus") {
        None => 1,
        Some(field) if cpu_only => {
            return Err(not_on_cpu(&field, "a CPU-only process uses no GPU"))
        }
        Some(field) => field
            .integer_in(1, 64)
            .map_err(|error| {
                or_hint(error, "`gpus` is how many GPUs each replica gets; for a process without a GPU write device = \"cpu\"")
            })? as u32,
    };
    let memory = match table.get("memory") {
        None if cpu_only => None,
        None => Some(MemoryAsk::Rest),
        Some(field) if cpu_only => {
            return Err(not_on_cpu(&field, "a CPU-only process gets no GPU memory"))
        }
        // Sized later (an equal share, then the measured peak): see admission::settle_auto.
        Some(field) if field.value.get_ref().as_str() == Some("auto") => {
            Some(MemoryAsk::Percent(100.0))
        }
        Some(field) => Some(values::memory(&field)?),
    };
    let auto_memory = table
        .get("memory")
        .is_some_and(|field| field.value.get_ref().as_str() == Some("auto"));
    let preallocate = match table.get("preallocate") {
        None => true,
        Some(field) if cpu_only => {
            return Err(not_on_cpu(
                &field,
                "XLA preallocates GPU memory only, and this process has no GPU",
            ))
        }
        Some(field) if framework != Framework::Jax => return Err(field
            .key_error(format_args!(
                "applies only to framework = \"jax\"; this process has framework = \"{}\"",
                framework.as_str()
            ))
            .with_hint(
                "remove `preallocate`: it sets XLA_PYTHON_CLIENT_PREALLOCATE, which only JAX reads",
            )),
        Some(field) => field.boolean()?,
    };
    let children_cpu_only = match table.get("children_cpu_only") {
        None => false,
        Some(field) if cpu_only => {
            return Err(not_on_cpu(
                &field,
                "with device = \"cpu\" the process and all its children are CPU-only already",
            ))
        }
        Some(field) => field.boolean()?,
    };

    let ready = match table.get("ready") {
        None => ReadyWhen::Started,
        Some(field) => values::ready(&field)?,
    };

    let direct_logs = match table.get("logs") {
        None => false,
        Some(field) => super::watch::choice(
            &field,
            &[("pipe", false), ("direct", true)],
            "pipe (the default): gpuvisor reads the output through pipes into logs/NAME.log; direct: the process writes logs/NAME.out.log and logs/NAME.err.log itself and gpuvisor only dates them (for chatty processes)",
        )?,
    };

    let (after, after_ranges) = match table.get("after") {
        None => (Vec::new(), Vec::new()),
        Some(field) => after(source, &field)?,
    };
    let restart = restart::restart(source, table_name, table.get("restart"))?;
    let stop = restart::stop(source, table_name, table.get("stop"))?;
    let watch = super::watch::process_watch(table, cpu_only, children_cpu_only)?;
    let nodes = match table.get("nodes") {
        None => Default::default(),
        Some(field) => super::cluster::nodes(source, &field)?,
    };
    let distributed = match table.get("distributed") {
        None => false,
        Some(field) => field.boolean()?,
    };

    let spec = ProcessSpec {
        name: name.to_string(),
        span: source.span(value.span()),
        command,
        command_span: table.span_of("command"),
        cwd,
        cwd_span: table.span_of("cwd"),
        env,
        replicas,
        framework,
        device,
        gpus_per_replica,
        gpus_span: table.span_of("gpus"),
        memory,
        memory_span: table.span_of("memory"),
        auto_memory,
        preallocate,
        children_cpu_only,
        ready,
        direct_logs,
        after,
        restart,
        stop,
        watch,
        nodes,
        nodes_span: table.span_of("nodes"),
        distributed,
    };
    Ok(ParsedProcess { spec, after_ranges })
}

/// Refuses a process name that would not make a safe file name or label.
fn check_name(source: Source<'_>, name: &str, range: Range<usize>) -> Result<(), Diagnostic> {
    let valid_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if name.is_empty() || !valid_chars || name.len() > MAX_NAME_LEN {
        let cleaned: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(MAX_NAME_LEN)
            .collect();
        let hint = if cleaned.is_empty() {
            "use letters, digits, `_` and `-` only, e.g. [process.learner]".to_string()
        } else {
            format!("use letters, digits, `_` and `-` only (at most {MAX_NAME_LEN}), e.g. [process.{cleaned}]")
        };
        return Err(source
            .error(range, format!("process name {name:?} is not allowed"))
            .with_hint(format!("the name becomes a file name and a label; {hint}")));
    }
    Ok(())
}

/// `error` with `hint` unless it already has a more specific one.
pub(super) fn or_hint(error: Diagnostic, hint: &str) -> Diagnostic {
    if error.hint.is_some() {
        error
    } else {
        error.with_hint(hint)
    }
}

/// "`key` in [process.x] is not allowed with device = \"cpu\"", at the key.
fn not_on_cpu(field: &Field<'_, '_>, why: &str) -> Diagnostic {
    field
        .key_error("is not allowed with device = \"cpu\"")
        .with_hint(format!(
            "{why}; remove `{}`, or remove device = \"cpu\" to give the process a GPU",
            field.key
        ))
}

/// Reads `framework`.
fn framework(field: &Field<'_, '_>) -> Result<Framework, Diagnostic> {
    let names: Vec<String> = Framework::ALL
        .iter()
        .map(|framework| format!("\"{}\"", framework.as_str()))
        .collect();
    let expected = format!("one of {}", names.join(", "));
    let text = field.string(&expected)?;
    if let Some(framework) = Framework::ALL
        .iter()
        .find(|framework| framework.as_str() == text)
    {
        return Ok(*framework);
    }
    let lower = text.trim().to_ascii_lowercase();
    let near = FRAMEWORK_ALIASES
        .iter()
        .find(|(alias, _)| *alias == lower)
        .map(|(_, framework)| framework.as_str())
        .or_else(|| {
            suggest(
                text,
                Framework::ALL.iter().map(|framework| framework.as_str()),
            )
        });
    let error = field.wrong(&expected);
    Err(match near {
        Some(near) => error.with_hint(format!("did you mean \"{near}\"?")),
        None => error
            .with_hint("use \"none\" for a process whose framework gpuvisor has no settings for"),
    })
}

/// Reads `after`: an array of process names, each written once.
fn after(
    source: Source<'_>,
    field: &Field<'_, '_>,
) -> Result<(Vec<String>, Vec<Range<usize>>), Diagnostic> {
    let expected = "an array of process names";
    if let Some(name) = field.value.get_ref().as_str() {
        return Err(field
            .wrong(expected)
            .with_hint(format!("write a list: after = [\"{name}\"]")));
    }
    let elements = field.array(expected)?;
    let mut names: Vec<String> = Vec::with_capacity(elements.len());
    let mut ranges = Vec::with_capacity(elements.len());
    for element in elements {
        let Some(name) = element.get_ref().as_str() else {
            return Err(source.error(
                element.span(),
                format!(
                    "`after` in {} must be {expected}; found {}",
                    field.table,
                    source.describe(element)
                ),
            ));
        };
        if names.iter().any(|seen| seen == name) {
            return Err(source
                .error(
                    element.span(),
                    format!("`after` in {} lists \"{name}\" twice", field.table),
                )
                .with_hint("remove the repeated name"));
        }
        names.push(name.to_string());
        ranges.push(element.span());
    }
    Ok((names, ranges))
}
