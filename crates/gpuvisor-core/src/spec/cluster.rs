//! The multi-node parts of a job file: the `[cluster]` and `[nccl]` tables, and a process's
//! `nodes` and `distributed` keys.
//!
//! These only matter when a job runs over several nodes (under Slurm): on one machine
//! `nodes` is ignored (every process runs there), `[cluster]` is unused, and `[nccl]` still sets
//! the NCCL variables of GPU replicas.

use std::collections::BTreeMap;

use serde::Serialize;
use toml::de::DeValue;

use super::reader::{entries_in_file_order, suggest, Field, Source, Table};
use super::restart::duration;
use super::{Diagnostic, Span};

/// Keys accepted in `[cluster]`.
pub(super) const CLUSTER_KEYS: &[&str] = &[
    "preflight_timeout",
    "node_timeout",
    "on_node_failure",
    "node_restarts",
];

/// Keys accepted in `[nccl]`.
pub(super) const NCCL_KEYS: &[&str] = &["presets", "env"];

/// `[cluster] preflight_timeout` and `node_timeout` when not written, ms.
pub const DEFAULT_CLUSTER_TIMEOUT_MS: u64 = 30_000;

/// `[cluster] node_restarts` when not written.
pub const DEFAULT_NODE_RESTARTS: u32 = 3;

/// The `[cluster]` table: how a job spread over nodes starts and what happens when a node fails.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterSpec {
    /// `preflight_timeout`: how long every node's agent may take to reach the coordinator's
    /// address and port before the job is stopped, ms (default 30 s).
    pub preflight_timeout_ms: u64,
    /// `node_timeout`: a node agent silent this long counts as lost, ms (default 30 s).
    pub node_timeout_ms: u64,
    /// `on_node_failure`: what a lost node (or an agent that lost its processes) does to the job.
    pub on_node_failure: NodeFailurePolicy,
    /// `node_restarts`: how many whole-job restarts `on_node_failure = "restart"` allows
    /// (default 3).
    pub node_restarts: u32,
    /// Where the `[cluster]` table starts; `None` when the job file has none.
    #[serde(skip)]
    pub span: Option<Span>,
    /// Where `preflight_timeout` was written, if it was.
    #[serde(skip)]
    pub preflight_timeout_span: Option<Span>,
    /// Where `node_timeout` was written, if it was.
    #[serde(skip)]
    pub node_timeout_span: Option<Span>,
    /// Where `on_node_failure` was written, if it was.
    #[serde(skip)]
    pub on_node_failure_span: Option<Span>,
    /// Where `node_restarts` was written, if it was.
    #[serde(skip)]
    pub node_restarts_span: Option<Span>,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            preflight_timeout_ms: DEFAULT_CLUSTER_TIMEOUT_MS,
            node_timeout_ms: DEFAULT_CLUSTER_TIMEOUT_MS,
            on_node_failure: NodeFailurePolicy::Stop,
            node_restarts: DEFAULT_NODE_RESTARTS,
            span: None,
            preflight_timeout_span: None,
            node_timeout_span: None,
            on_node_failure_span: None,
            node_restarts_span: None,
        }
    }
}

impl ClusterSpec {
    /// Whether this is what a job file without `[cluster]` gets (spans aside).
    pub fn is_default(&self) -> bool {
        let default = ClusterSpec::default();
        self.preflight_timeout_ms == default.preflight_timeout_ms
            && self.node_timeout_ms == default.node_timeout_ms
            && self.on_node_failure == default.on_node_failure
            && self.node_restarts == default.node_restarts
    }
}

/// What a job does when one of its nodes fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeFailurePolicy {
    /// `"stop"` (default): stop the whole job and report the node.
    #[default]
    Stop,
    /// `"restart"`: stop every node's processes and start the whole job again, at most
    /// `node_restarts` times.
    Restart,
}

/// One named bundle of NCCL variables (`[nccl] presets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NcclPreset {
    /// `"debug"`: `NCCL_DEBUG=INFO`, `NCCL_DEBUG_SUBSYS=INIT,NET`: NCCL says what it tries
    /// at start-up (which transport, which interface), the first thing to read in a hang.
    Debug,
    /// `"p2p-off"`: `NCCL_P2P_DISABLE=1`, around PCIe ACS/IOMMU blocking peer-to-peer.
    P2pOff,
    /// `"nvls-off"`: `NCCL_NVLS_ENABLE=0`, around NVLink SHARP hangs.
    NvlsOff,
    /// `"ib-off"`: `NCCL_IB_DISABLE=1`: sockets instead of InfiniBand.
    IbOff,
}

impl NcclPreset {
    /// Every preset, in the order the job file documents them.
    pub const ALL: [NcclPreset; 4] = [
        NcclPreset::Debug,
        NcclPreset::P2pOff,
        NcclPreset::NvlsOff,
        NcclPreset::IbOff,
    ];

    /// The name used in job files and output.
    pub fn as_str(self) -> &'static str {
        match self {
            NcclPreset::Debug => "debug",
            NcclPreset::P2pOff => "p2p-off",
            NcclPreset::NvlsOff => "nvls-off",
            NcclPreset::IbOff => "ib-off",
        }
    }

    /// The variables the preset sets, as (name, value).
    pub fn vars(self) -> &'static [(&'static str, &'static str)] {
        match self {
            NcclPreset::Debug => &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NET")],
            NcclPreset::P2pOff => &[("NCCL_P2P_DISABLE", "1")],
            NcclPreset::NvlsOff => &[("NCCL_NVLS_ENABLE", "0")],
            NcclPreset::IbOff => &[("NCCL_IB_DISABLE", "1")],
        }
    }
}

/// The `[nccl]` table: NCCL variables for every GPU replica of the job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NcclSpec {
    /// `presets`, in the order written.
    pub presets: Vec<NcclPreset>,
    /// `env`: custom `NCCL_*` variables; they win over the presets.
    pub env: BTreeMap<String, String>,
}

impl NcclSpec {
    /// The final variables: the presets expanded in order, then `env` (which wins).
    pub fn env(&self) -> BTreeMap<String, String> {
        let mut vars = BTreeMap::new();
        for preset in &self.presets {
            for (name, value) in preset.vars() {
                vars.insert(name.to_string(), value.to_string());
            }
        }
        vars.extend(self.env.clone());
        vars
    }

    /// Whether the job sets no NCCL variable.
    pub fn is_empty(&self) -> bool {
        self.presets.is_empty() && self.env.is_empty()
    }
}

/// Which nodes of the job's step a process runs on (`nodes`), counted 0-based in step order
/// (the order of Slurm's node list).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeSelector {
    /// `"all"` (default): every node.
    #[default]
    All,
    /// `"first"`: node 0 only.
    First,
    /// `"last"`: the last node only.
    Last,
    /// `"rest"`: every node but the first.
    Rest,
    /// `[0, 2]`: these node indices, as written.
    List(Vec<u32>),
}

impl NodeSelector {
    /// The node indices, ascending, this selector picks out of `count` nodes. Indices of a
    /// [`NodeSelector::List`] at or past `count` are left out (the planner reports them).
    pub fn indices(&self, count: usize) -> Vec<usize> {
        match self {
            NodeSelector::All => (0..count).collect(),
            NodeSelector::First => (0..count.min(1)).collect(),
            NodeSelector::Last => count.checked_sub(1).into_iter().collect(),
            NodeSelector::Rest => (1..count).collect(),
            NodeSelector::List(list) => {
                let mut indices: Vec<usize> = list
                    .iter()
                    .map(|&index| index as usize)
                    .filter(|&index| index < count)
                    .collect();
                indices.sort_unstable();
                indices.dedup();
                indices
            }
        }
    }

    /// Whether this is the default, `"all"`.
    pub fn is_all(&self) -> bool {
        *self == NodeSelector::All
    }

    /// Whether node `index` of `count` is picked.
    pub fn includes(&self, index: usize, count: usize) -> bool {
        self.indices(count).contains(&index)
    }

    /// How the selector is written in a job file (`"first"`, `[0, 2]`).
    pub fn written(&self) -> String {
        match self {
            NodeSelector::All => "\"all\"".to_string(),
            NodeSelector::First => "\"first\"".to_string(),
            NodeSelector::Last => "\"last\"".to_string(),
            NodeSelector::Rest => "\"rest\"".to_string(),
            NodeSelector::List(list) => {
                let items: Vec<String> = list.iter().map(u32::to_string).collect();
                format!("[{}]", items.join(", "))
            }
        }
    }
}

/// Reads `[cluster]`.
pub(super) fn cluster_section(
    file: Source<'_>,
    field: Option<Field<'_, '_>>,
) -> Result<ClusterSpec, Diagnostic> {
    let mut spec = ClusterSpec::default();
    let Some(field) = field else { return Ok(spec) };
    let raw = field.table("a table").map_err(|error| {
        error.with_hint(format!(
            "[cluster] is a table: write the header [cluster] with its keys ({}) below it",
            CLUSTER_KEYS.join(", ")
        ))
    })?;
    let table = Table::new(file, "[cluster]", field.value_range(), raw, CLUSTER_KEYS)?;
    spec.span = Some(file.span(table.range.clone()));
    if let Some(field) = table.get("preflight_timeout") {
        spec.preflight_timeout_ms = duration(&field, 1)?;
        spec.preflight_timeout_span = Some(field.value_span());
    }
    if let Some(field) = table.get("node_timeout") {
        spec.node_timeout_ms = duration(&field, 1)?;
        spec.node_timeout_span = Some(field.value_span());
    }
    if let Some(field) = table.get("on_node_failure") {
        let expected = "\"stop\" or \"restart\"";
        spec.on_node_failure = match field.string(expected)? {
            "stop" => NodeFailurePolicy::Stop,
            "restart" => NodeFailurePolicy::Restart,
            other => {
                let error = field.wrong(expected);
                return Err(match suggest(other, ["stop", "restart"]) {
                    Some(near) => error.with_hint(format!("did you mean \"{near}\"?")),
                    None => error.with_hint("\"stop\" ends the job when a node fails; \"restart\" starts the whole job again, up to node_restarts times"),
                });
            }
        };
        spec.on_node_failure_span = Some(field.value_span());
    }
    if let Some(field) = table.get("node_restarts") {
        spec.node_restarts = field.integer_in(0, 1_000_000).map_err(|error| {
            super::process::or_hint(
                error,
                "`node_restarts` is how many times on_node_failure = \"restart\" may start the job again",
            )
        })? as u32;
        spec.node_restarts_span = Some(field.value_span());
    }
    Ok(spec)
}

/// Reads `[nccl]`.
pub(super) fn nccl_section(
    file: Source<'_>,
    field: Option<Field<'_, '_>>,
) -> Result<NcclSpec, Diagnostic> {
    let mut spec = NcclSpec::default();
    let Some(field) = field else { return Ok(spec) };
    let raw = field.table("a table").map_err(|error| {
        error.with_hint(
            "[nccl] is a table: write the header [nccl] with presets = [...] and env = { ... } below it",
        )
    })?;
    let table = Table::new(file, "[nccl]", field.value_range(), raw, NCCL_KEYS)?;
    if let Some(field) = table.get("presets") {
        spec.presets = presets(file, &field)?;
    }
    if let Some(field) = table.get("env") {
        spec.env = nccl_env(file, &field)?;
    }
    Ok(spec)
}

/// Reads `[nccl] presets`: an array of known preset names, each once.
fn presets(file: Source<'_>, field: &Field<'_, '_>) -> Result<Vec<NcclPreset>, Diagnostic> {
    let names: Vec<&str> = NcclPreset::ALL
        .iter()
        .map(|preset| preset.as_str())
        .collect();
    let quoted: Vec<String> = names.iter().map(|name| format!("\"{name}\"")).collect();
    let accepted = quoted.join(", ");
    let expected = "an array of preset names";
    if let Some(name) = field.value.get_ref().as_str() {
        return Err(field
            .wrong(expected)
            .with_hint(format!("write a list: presets = [\"{name}\"]")));
    }
    let elements = field.array(expected)?;
    let mut presets = Vec::with_capacity(elements.len());
    for element in elements {
        let at =
            |message: String| file.error(element.span(), format!("`presets` in [nccl] {message}"));
        let Some(name) = element.get_ref().as_str() else {
            return Err(at(format!(
                "must be {expected}; found {}",
                file.describe(element)
            ))
            .with_hint(format!("accepted presets: {accepted}")));
        };
        let Some(preset) = NcclPreset::ALL
            .iter()
            .find(|preset| preset.as_str() == name)
        else {
            let error = at(format!("has unknown preset \"{name}\""));
            return Err(match suggest(name, names.iter().copied()) {
                Some(near) => error.with_hint(format!(
                    "did you mean \"{near}\"? accepted presets: {accepted}"
                )),
                None => error.with_hint(format!(
                    "accepted presets: {accepted}; set other NCCL variables in [nccl] env"
                )),
            });
        };
        if presets.contains(preset) {
            return Err(
                at(format!("lists \"{name}\" twice")).with_hint("remove the repeated preset")
            );
        }
        presets.push(*preset);
    }
    Ok(presets)
}

/// Reads `[nccl] env`: a table of `NCCL_*` = "value" strings.
fn nccl_env(
    file: Source<'_>,
    field: &Field<'_, '_>,
) -> Result<BTreeMap<String, String>, Diagnostic> {
    let table = field.table("a table of NCCL_NAME = \"value\" strings")?;
    let mut env = BTreeMap::new();
    for (name, value) in entries_in_file_order(table) {
        let name_text: &str = name.get_ref();
        if !name_text.starts_with("NCCL_") || name_text.len() == "NCCL_".len() {
            let upper = name_text.to_ascii_uppercase();
            let hint = if upper.starts_with("NCCL_") && upper.len() > "NCCL_".len() {
                format!("NCCL's variables are upper case: {upper}")
            } else {
                "[nccl] env holds NCCL_* variables only (e.g. NCCL_SOCKET_IFNAME = \"eth0\"); put other variables in a process's `env`".to_string()
            };
            return Err(file
                .error(
                    name.span(),
                    format!("`env` in [nccl] has variable `{name_text}`, which does not start with NCCL_"),
                )
                .with_hint(hint));
        }
        let DeValue::String(text) = value.get_ref() else {
            let written = file.text.get(value.span()).unwrap_or("");
            return Err(file
                .error(
                    value.span(),
                    format!(
                        "`env.{name_text}` in [nccl] must be a string, found {}",
                        file.describe(value)
                    ),
                )
                .with_hint(format!(
                    "environment values are strings; quote it: {name_text} = \"{written}\""
                )));
        };
        env.insert(name_text.to_string(), text.to_string());
    }
    Ok(env)
}

/// Reads a process's `nodes`: `"all"`, `"first"`, `"last"`, `"rest"` or an array of node
/// indices.
pub(super) fn nodes(file: Source<'_>, field: &Field<'_, '_>) -> Result<NodeSelector, Diagnostic> {
    let words = ["all", "first", "last", "rest"];
    let expected = "\"all\", \"first\", \"last\", \"rest\" or an array of node indices ([0, 2])";
    let hint = "nodes count from 0 in the order of the Slurm node list: \"first\" is node 0, \"rest\" every node but the first";
    match field.value.get_ref() {
        DeValue::String(text) => match text.as_ref() {
            "all" => Ok(NodeSelector::All),
            "first" => Ok(NodeSelector::First),
            "last" => Ok(NodeSelector::Last),
            "rest" => Ok(NodeSelector::Rest),
            other => {
                let error = field.wrong(expected);
                Err(match suggest(other, words) {
                    Some(near) => error.with_hint(format!("did you mean \"{near}\"?")),
                    None if other.trim().parse::<u32>().is_ok() => error.with_hint(format!(
                        "write node indices as a list: nodes = [{}]",
                        other.trim()
                    )),
                    None => error.with_hint(hint),
                })
            }
        },
        DeValue::Integer(_) => Err(field
            .wrong(expected)
            .with_hint(format!("write a list: nodes = [{}]", field.value_text()))),
        DeValue::Array(elements) => {
            if elements.is_empty() {
                return Err(field
                    .error("is an empty array")
                    .with_hint("list at least one node index, e.g. nodes = [0], or remove `nodes` to run on every node"));
            }
            let mut list: Vec<u32> = Vec::with_capacity(elements.len());
            for element in elements {
                let at = |message: String| {
                    file.error(
                        element.span(),
                        format!("`nodes` in {} {message}", field.table),
                    )
                };
                let index = match element.get_ref() {
                    DeValue::Integer(number) => {
                        i64::from_str_radix(number.as_str(), number.radix()).ok()
                    }
                    _ => None,
                };
                let Some(index) = index.filter(|index| (0..=u32::MAX as i64).contains(index))
                else {
                    return Err(at(format!(
                        "has {}, which is not a node index",
                        file.describe(element)
                    ))
                    .with_hint(hint));
                };
                let index = index as u32;
                if list.contains(&index) {
                    return Err(at(format!("lists node {index} twice"))
                        .with_hint("remove the repeated index"));
                }
                list.push(index);
            }
            Ok(NodeSelector::List(list))
        }
        _ => Err(field.wrong(expected).with_hint(hint)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_pick_their_nodes() {
        assert_eq!(NodeSelector::All.indices(3), vec![0, 1, 2]);
        assert_eq!(NodeSelector::First.indices(3), vec![0]);
        assert_eq!(NodeSelector::Last.indices(3), vec![2]);
        assert_eq!(NodeSelector::Rest.indices(3), vec![1, 2]);
        assert_eq!(NodeSelector::Rest.indices(1), Vec::<usize>::new());
        assert_eq!(NodeSelector::Last.indices(0), Vec::<usize>::new());
        assert_eq!(NodeSelector::List(vec![2, 0, 7]).indices(3), vec![0, 2]);
        assert!(NodeSelector::Rest.includes(2, 3));
        assert!(!NodeSelector::First.includes(1, 3));
        assert_eq!(NodeSelector::List(vec![0, 2]).written(), "[0, 2]");
    }

    #[test]
    fn nccl_env_expands_presets_then_custom_wins() {
        let spec = NcclSpec {
            presets: vec![NcclPreset::Debug, NcclPreset::IbOff],
            env: BTreeMap::from([
                ("NCCL_DEBUG".to_string(), "WARN".to_string()),
                ("NCCL_SOCKET_IFNAME".to_string(), "eth0".to_string()),
            ]),
        };
        let env = spec.env();
        assert_eq!(env["NCCL_DEBUG"], "WARN", "custom env wins over the preset");
        assert_eq!(env["NCCL_DEBUG_SUBSYS"], "INIT,NET");
        assert_eq!(env["NCCL_IB_DISABLE"], "1");
        assert_eq!(env["NCCL_SOCKET_IFNAME"], "eth0");
        assert_eq!(env.len(), 4);
        assert!(NcclSpec::default().env().is_empty());
    }
}
