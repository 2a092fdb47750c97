//! The knowledge base's data model: the rules file (`rules/failures.toml`) as Rust types, and
//! its validation. The format is documented in docs/explain.md.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

/// The rules file shipped inside the binary.
pub const BUILTIN_RULES: &str = include_str!("../../rules/failures.toml");

/// The analyses implemented in code that a rule may name with `analysis = "..."`, and the
/// variant ids each may choose (they must exist in the rule).
pub const ANALYSES: &[(&str, &[&str])] = &[
    (
        "torch-oom",
        &[
            "fragmentation",
            "other-processes",
            "non-torch-memory",
            "real-pressure",
            "ranks-on-one-gpu",
        ],
    ),
    ("jax-oom", &[]),
    ("jax-outside-pool", &["gpu-mostly-free"]),
    ("ranks-on-first-gpu", &[]),
];

/// The analyses that read table rows rather than figures: every line one of the rule's
/// patterns matches is kept as a row (its capture groups, up to `scan::MAX_ROWS`), and the
/// rule fires only if the analysis finds what it looks for in them.
pub const ROW_ANALYSES: &[&str] = &["ranks-on-first-gpu"];

/// How sure a finding is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Confidence {
    /// The signature is suggestive; check the evidence.
    Low,
    /// Usually right.
    #[default]
    Medium,
    /// The log says it in so many words.
    High,
}

impl Confidence {
    /// One level up (high stays high).
    pub fn raised(self) -> Self {
        match self {
            Confidence::Low => Confidence::Medium,
            _ => Confidence::High,
        }
    }

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// Whether a rule names a cause or a symptom of some other cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RuleKind {
    /// The failure itself.
    #[default]
    Cause,
    /// Noise a failure leaves behind; the real cause is elsewhere (ranked after causes).
    Symptom,
}

/// How repeated captures of one figure combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Combine {
    /// The last value seen in the log.
    #[default]
    Last,
    /// The sum of every capture on the last line that had one (e.g. "Process N has X memory
    /// in use", repeated for each process in one message).
    Sum,
    /// How many captures the last line that had one held: a count, not a size (shown as the
    /// number; the analysis gets it as is).
    Count,
    /// The smallest capture on the last line that had one.
    Min,
    /// The largest capture on the last line that had one.
    Max,
}

/// One regex or several.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One.
    One(String),
    /// Several, any of which may match.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The regexes.
    pub fn all(&self) -> &[String] {
        match self {
            OneOrMany::One(one) => std::slice::from_ref(one),
            OneOrMany::Many(many) => many,
        }
    }
}

/// A number to read out of the log: one capture group holding a size.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FigureSpec {
    /// The regex, or several (the latest line any of them matched gives the value); the first
    /// capture group that took part in the match is the size text.
    pub pattern: OneOrMany,
    /// How repeated captures combine.
    #[serde(default)]
    pub combine: Combine,
}

/// A more specific reading of a rule, with its own cause and fix.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Short id, shown as `rule/variant`.
    pub id: String,
    /// Chosen when any of these is found anywhere in the log (first variant wins). Empty: only
    /// the rule's analysis can choose it.
    #[serde(default)]
    pub when: Vec<String>,
    /// Messages that both mark the failure and choose this variant: parsing moves each into the
    /// rule's `patterns` and this variant's `when`, so one line does not have to be written
    /// twice. Empty once parsed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<String>,
    /// Replaces the rule's name.
    pub name: Option<String>,
    /// Replaces the rule's cause.
    pub cause: String,
    /// Replaces the rule's fix.
    pub fix: String,
    /// Replaces the rule's confidence.
    pub confidence: Option<Confidence>,
}

/// One failure signature.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Stable id (kebab-case), used in output, tests and the corpus directory name.
    pub id: String,
    /// What the failure is, in a few words.
    pub name: String,
    /// Cause or symptom.
    #[serde(default)]
    pub kind: RuleKind,
    /// The confidence when the rule fires.
    #[serde(default)]
    pub confidence: Confidence,
    /// The rule fires when any of these regexes matches a line.
    pub patterns: Vec<String>,
    /// Found anywhere: the confidence goes up one level.
    #[serde(default)]
    pub supporting: Vec<String>,
    /// CUDA error codes the rule owns, read where a check macro prints only the number
    /// (docs/explain.md, "Bare CUDA error codes"): each list adds [`bare_code_patterns`] to
    /// `patterns` when the file is parsed.
    #[serde(default)]
    pub cuda_codes: Vec<u32>,
    /// Each group needs at least one of its regexes found somewhere, or the rule stays quiet.
    #[serde(default)]
    pub requires: Vec<Vec<String>>,
    /// Any of these found anywhere keeps the rule quiet (another rule covers that case).
    #[serde(default)]
    pub unless: Vec<String>,
    /// Numbers to read out of the log, by name.
    #[serde(default)]
    pub figures: BTreeMap<String, FigureSpec>,
    /// An analysis implemented in code (see [`ANALYSES`]).
    pub analysis: Option<String>,
    /// Why it happens.
    pub cause: String,
    /// What to change: the exact setting or job-file change.
    pub fix: String,
    /// Where the facts come from.
    #[serde(default)]
    pub references: Vec<String>,
    /// More specific readings.
    #[serde(default)]
    pub variant: Vec<Variant>,
}

/// The parsed rules file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    rule: Vec<Rule>,
}

/// Why a rules file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// Not valid TOML for the rules format.
    #[error("rules file: {0}\n  hint: see docs/explain.md for the format")]
    Toml(#[from] toml::de::Error),
    /// A pattern does not compile.
    #[error("rule `{rule}`: pattern `{pattern}` is not a valid regex: {reason}\n  hint: patterns use the Rust regex crate's syntax; escape `(`, `[`, `.` with `\\`")]
    Pattern {
        /// The rule id.
        rule: String,
        /// The pattern.
        pattern: String,
        /// The regex error.
        reason: String,
    },
    /// Something else is wrong with a rule.
    #[error("rule `{rule}`: {reason}\n  hint: {hint}")]
    Invalid {
        /// The rule id.
        rule: String,
        /// What is wrong.
        reason: String,
        /// The fix.
        hint: String,
    },
}

/// Parses and validates a rules file (patterns compile, ids unique, figures have a group, no
/// pattern matches an empty line, analyses and their variants exist).
pub fn parse_rules(text: &str) -> Result<Vec<Rule>, RulesError> {
    parse_rules_checking(text, true)
}

/// [`parse_rules`] for the built-in rules file, without compiling every pattern to check it:
/// the tests check that file (`builtin_rules_are_valid`), and the scan compiles a pattern only
/// when a line needs it.
pub(crate) fn parse_builtin_rules(text: &str) -> Result<Vec<Rule>, RulesError> {
    parse_rules_checking(text, false)
}

/// The three forms a bare CUDA error code takes in programs' own check macros: `CUDA error
/// 700 at f.cu:41` (also `Cuda error: 35`, `CUDA error code=2`), `CUresult error: 2` and
/// `Return value 46 from 'cudaStreamCreate(...)'`.
pub fn bare_code_patterns(codes: &[u32]) -> [String; 3] {
    let codes = codes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join("|");
    [
        format!(r"[Cc](UDA|uda) [Ee]rror( code)?( ?[=:] ?| )({codes})([^\w.]|\.?$)"),
        format!(r"CUresult error:? +(result=)?({codes})\b"),
        format!("value ({codes}) from 'cuda"),
    ]
}

fn parse_rules_checking(text: &str, compile: bool) -> Result<Vec<Rule>, RulesError> {
    let mut file: RulesFile = toml::from_str(text)?;
    for rule in &mut file.rule {
        if !rule.cuda_codes.is_empty() {
            let generated = bare_code_patterns(&rule.cuda_codes);
            rule.patterns.extend(generated);
        }
        for variant in &mut rule.variant {
            let own = std::mem::take(&mut variant.patterns);
            rule.patterns.extend(own.iter().cloned());
            variant.when.extend(own);
        }
    }
    let mut ids = HashSet::new();
    for rule in &file.rule {
        let invalid = |reason: String, hint: &str| RulesError::Invalid {
            rule: rule.id.clone(),
            reason,
            hint: hint.to_string(),
        };
        if !ids.insert(rule.id.clone()) {
            return Err(invalid(
                "the id is used twice".into(),
                "give every rule its own id",
            ));
        }
        if rule.id.is_empty()
            || !rule
                .id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(invalid(
                "the id must be kebab-case (a-z, 0-9, -)".into(),
                "e.g. `torch-oom`",
            ));
        }
        if rule.patterns.is_empty() {
            return Err(invalid(
                "no `patterns`".into(),
                "add at least one regex that marks the failure",
            ));
        }
        for pattern in all_patterns(rule) {
            check_pattern(&rule.id, pattern, compile)?;
        }
        for (name, figure) in &rule.figures {
            for pattern in figure.pattern.all() {
                check_pattern(&rule.id, pattern, compile)?;
                if !compile {
                    continue;
                }
                let regex = regex::Regex::new(pattern).map_err(|error| RulesError::Pattern {
                    rule: rule.id.clone(),
                    pattern: pattern.clone(),
                    reason: error.to_string(),
                })?;
                if regex.captures_len() < 2 {
                    return Err(invalid(
                        format!("figure `{name}` has no capture group"),
                        "wrap the size in ( ), e.g. `Tried to allocate ([0-9.]+ [KMGT]iB)`",
                    ));
                }
            }
        }
        let mut variant_ids = HashSet::new();
        for variant in &rule.variant {
            if !variant_ids.insert(variant.id.as_str()) {
                return Err(invalid(
                    format!("variant `{}` is defined twice", variant.id),
                    "give every variant of a rule its own id",
                ));
            }
        }
        if let Some(analysis) = &rule.analysis {
            let Some((_, chosen)) = ANALYSES.iter().find(|(name, _)| name == analysis) else {
                let known: Vec<_> = ANALYSES.iter().map(|(name, _)| *name).collect();
                return Err(invalid(
                    format!("unknown analysis `{analysis}`"),
                    &format!("known analyses: {}", known.join(", ")),
                ));
            };
            for id in *chosen {
                if !variant_ids.contains(id) {
                    return Err(invalid(
                        format!("analysis `{analysis}` chooses variant `{id}`, which is missing"),
                        &format!("add [[rule.variant]] with id = \"{id}\""),
                    ));
                }
            }
        }
    }
    Ok(file.rule)
}

/// Every line pattern of a rule (not figures), for validation.
fn all_patterns(rule: &Rule) -> impl Iterator<Item = &String> {
    rule.patterns
        .iter()
        .chain(&rule.supporting)
        .chain(rule.requires.iter().flatten())
        .chain(&rule.unless)
        .chain(rule.variant.iter().flat_map(|variant| &variant.when))
}

/// Checks that `pattern` has a literal and, with `compile`, that it is a regex that does not
/// match an empty line.
fn check_pattern(rule: &str, pattern: &str, compile: bool) -> Result<(), RulesError> {
    let regex = if compile {
        Some(
            regex::Regex::new(pattern).map_err(|error| RulesError::Pattern {
                rule: rule.to_string(),
                pattern: pattern.to_string(),
                reason: error.to_string(),
            })?,
        )
    } else {
        None
    };
    if super::literal::required_literal(pattern).is_none() {
        return Err(RulesError::Invalid {
            rule: rule.to_string(),
            reason: format!(
                "pattern `{pattern}` has no plain run of {} or more characters outside groups and classes",
                super::literal::MIN_LITERAL_CHARS
            ),
            hint: "the scan's prefilter looks for that run; write e.g. `CUDA (error|failure)` rather than `(CUDA error|CUDA failure)`".to_string(),
        });
    }
    // A pattern that matches nothing at all would make every line a candidate.
    if regex.is_some_and(|regex| regex.is_match("")) {
        return Err(RulesError::Invalid {
            rule: rule.to_string(),
            reason: format!("pattern `{pattern}` matches an empty line"),
            hint: "make the pattern require some text".to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_rules_are_valid() {
        let rules = parse_rules(BUILTIN_RULES).expect("builtin rules parse");
        assert!(rules.len() >= 15, "only {} rules", rules.len());
    }

    fn one_rule(body: &str) -> String {
        format!("[[rule]]\nid = \"x\"\nname = \"n\"\ncause = \"c\"\nfix = \"f\"\n{body}\n")
    }

    #[test]
    fn refuses_bad_rules() {
        let cases = [
            (one_rule("patterns = ['(']"), "not a valid regex"),
            (one_rule("patterns = ['a*']"), "no plain run"),
            (one_rule("patterns = ['abc']"), "no plain run"),
            (one_rule("patterns = []"), "no `patterns`"),
            (
                one_rule("patterns = ['abcd']\nanalysis = 'nope'"),
                "unknown analysis",
            ),
            (
                one_rule("patterns = ['abcd']\nanalysis = 'torch-oom'"),
                "which is missing",
            ),
            (
                one_rule("patterns = ['abcd']\nfigures.size = { pattern = 'bcde' }"),
                "no capture group",
            ),
            (
                one_rule("patterns = ['abcd']\ncolour = 'red'"),
                "unknown field",
            ),
            (
                format!(
                    "{}{}",
                    one_rule("patterns = ['abcd']"),
                    one_rule("patterns = ['bcde']")
                ),
                "used twice",
            ),
        ];
        for (text, expected) in cases {
            let error = parse_rules(&text).expect_err(&text).to_string();
            assert!(error.contains(expected), "{error} lacks {expected}");
        }
    }

    #[test]
    fn cuda_codes_read_the_number_in_each_bare_form() {
        let rules = parse_rules(&one_rule("patterns = []\ncuda_codes = [46, 805]"))
            .expect("codes alone make the patterns");
        let knowledge = super::super::KnowledgeBase::from_toml(&one_rule(
            "patterns = []\ncuda_codes = [46, 805]",
        ))
        .expect("compiles");
        assert_eq!(rules[0].patterns.len(), 3);
        for line in [
            "CUDA error 46 at kernel.cu:41",
            "Cuda error: 805",
            "CUresult error: result=46",
            "Return value 805 from 'cudaStreamCreate(&stream)'",
        ] {
            let report = knowledge.explain_text("t", line);
            assert_eq!(report.findings.len(), 1, "{line}");
        }
        for line in [
            "CUDA error 460 at kernel.cu:41",
            "CUDA error 4.6",
            "CUresult error: 8050",
        ] {
            let report = knowledge.explain_text("t", line);
            assert!(report.findings.is_empty(), "{line}");
        }
    }

    #[test]
    fn a_variants_own_patterns_mark_the_failure_and_choose_the_variant() {
        let text = one_rule(
            "patterns = ['abcd']\n[[rule.variant]]\nid = \"v\"\ncause = \"c\"\nfix = \"f\"\npatterns = ['wxyz']",
        );
        let rules = parse_rules(&text).expect("parses");
        assert_eq!(rules[0].patterns, ["abcd", "wxyz"]);
        assert_eq!(rules[0].variant[0].when, ["wxyz"]);
        assert!(rules[0].variant[0].patterns.is_empty());
        let knowledge = super::super::KnowledgeBase::from_toml(&text).expect("compiles");
        let report = knowledge.explain_text("t", "a wxyz line");
        assert_eq!(report.findings.len(), 1);
        assert_eq!(report.findings[0].variant.as_deref(), Some("v"));
        let report = knowledge.explain_text("t", "an abcd line");
        assert_eq!(report.findings[0].variant, None);
    }
}
