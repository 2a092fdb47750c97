//! The rules against the libraries' own messages: tests/corpus/source_messages.toml lists
//! failure messages as PyTorch, NCCL, XLA, TensorFlow, vLLM, CUDA, the kernel, Slurm and the
//! physics engines format them (from their source, with the URL), and healthy output that
//! shares their words. Each message's first finding (the likeliest cause) must be the rule it
//! names (or `rule/variant`); each lookalike must raise nothing.
//!
//! This is the test the rules are written against (docs/explain.md, "The source-message
//! table"): a pattern generalises when it matches the stable part of a library's message across
//! its versions, which this table holds, rather than one log's line.

use std::collections::BTreeSet;
use std::path::Path;

use gpuvisor_observe::explain::{Finding, KnowledgeBase, Report};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    message: Vec<Message>,
    lookalike: Vec<Lookalike>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    expect: String,
    source: String,
    versions: String,
    text: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Lookalike {
    source: String,
    why: String,
    text: String,
}

fn table() -> Table {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/source_messages.toml");
    let text = std::fs::read_to_string(&path).expect("read the source-message table");
    toml::from_str(&text).unwrap_or_else(|error: toml::de::Error| {
        panic!(
            "{}: {} at {:?}",
            path.display(),
            error.message(),
            error.span()
        )
    })
}

fn named(finding: &Finding) -> String {
    match &finding.variant {
        Some(variant) => format!("{}/{variant}", finding.rule),
        None => finding.rule.clone(),
    }
}

/// Whether `finding` is what `expect` names: the rule, and the variant when one is given.
fn is_expected(finding: &Finding, expect: &str) -> bool {
    match expect.split_once('/') {
        Some((rule, variant)) => {
            finding.rule == rule && finding.variant.as_deref() == Some(variant)
        }
        None => finding.rule == expect,
    }
}

/// Each entry with what explain reports on its text.
fn explained<T>(entries: &[T], text: fn(&T) -> &str) -> Vec<(&T, Report)> {
    let knowledge = KnowledgeBase::builtin();
    entries
        .iter()
        .map(|entry| (entry, knowledge.explain_text("source table", text(entry))))
        .collect()
}

#[test]
fn every_source_message_names_its_rule_first() {
    let table = table();
    let mut wrong = Vec::new();
    let reports = explained(&table.message, |message| &message.text);
    for (index, (message, report)) in reports.iter().enumerate() {
        let first = report.findings.first();
        if !first.is_some_and(|finding| is_expected(finding, &message.expect)) {
            wrong.push(format!(
                "#{} ({}): expected {}, got {}\n    {}",
                index + 1,
                message.source,
                message.expect,
                first.map_or("nothing".to_string(), named),
                message.text.trim().lines().next().unwrap_or_default()
            ));
        }
    }
    eprintln!(
        "source messages: {} of {} name the expected rule first",
        table.message.len() - wrong.len(),
        table.message.len()
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn lookalikes_raise_nothing() {
    let table = table();
    let mut alarms = Vec::new();
    for (lookalike, report) in explained(&table.lookalike, |lookalike| &lookalike.text) {
        for finding in &report.findings {
            alarms.push(format!(
                "{} ({}): {} on {:?}",
                lookalike.why,
                lookalike.source,
                named(finding),
                finding.evidence.first().map(|evidence| &evidence.text)
            ));
        }
    }
    assert!(alarms.is_empty(), "{}", alarms.join("\n"));
}

#[test]
fn every_entry_is_sourced_and_names_a_known_rule() {
    let table = table();
    let knowledge = KnowledgeBase::builtin();
    let mut problems = Vec::new();
    let mut texts = BTreeSet::new();
    let sources = table
        .message
        .iter()
        .map(|m| (&m.source, &m.text))
        .chain(table.lookalike.iter().map(|l| (&l.source, &l.text)));
    for (source, text) in sources {
        if !source.starts_with("https://") {
            problems.push(format!("not a URL: {source}"));
        }
        if text.trim().is_empty() || !texts.insert(text.trim().to_string()) {
            problems.push(format!("empty or repeated text ({source})"));
        }
    }
    for message in &table.message {
        let (rule_id, variant) = match message.expect.split_once('/') {
            Some((rule, variant)) => (rule, Some(variant)),
            None => (message.expect.as_str(), None),
        };
        let Some(rule) = knowledge.rules().iter().find(|rule| rule.id == rule_id) else {
            problems.push(format!("no rule {rule_id} ({})", message.source));
            continue;
        };
        if let Some(variant) = variant {
            if !rule.variant.iter().any(|known| known.id == variant) {
                problems.push(format!("rule {rule_id} has no variant {variant}"));
            }
        }
        if message.versions.trim().is_empty() {
            problems.push(format!("no versions for {}", message.source));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
