//! Jobs over several nodes: Slurm host lists and the layout of the nodes a job's step runs on.
//!
//! A job spread over nodes is planned node by node with [`crate::plan::plan_node`]: each node's
//! agent plans only the processes whose `nodes` selector picks it, and the head merges the node
//! plans into one with [`crate::plan::merge_node_plans`]. This module holds what that needs
//! besides the planner: [`expand_hostlist`] turns Slurm's compressed node lists
//! (`SLURM_STEP_NODELIST`, `gpu[01-04,07]`) into names, and [`NodeLayout`] says which nodes
//! there are, in step order, and which one is this node.

pub use crate::plan::{merge_node_plans, plan_node};

/// The most names one host list may expand to (a guard against `n[1-999999999]`).
pub const MAX_HOSTLIST_NAMES: usize = 65_536;

/// The nodes of a job's step, in step order, and which of them this is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    /// Node names in step order (the order of Slurm's node list); empty on one machine.
    pub names: Vec<String>,
    /// This node's position in `names` (0 on one machine).
    pub index: usize,
}

impl NodeLayout {
    /// One machine, not a cluster: `nodes` selectors are ignored and every process runs here.
    pub fn single() -> NodeLayout {
        NodeLayout {
            names: Vec::new(),
            index: 0,
        }
    }

    /// Node `index` of the step whose nodes are `names`.
    pub fn node(names: Vec<String>, index: usize) -> NodeLayout {
        NodeLayout { names, index }
    }

    /// Whether this is [`NodeLayout::single`] (no node names).
    pub fn is_single(&self) -> bool {
        self.names.is_empty()
    }

    /// How many nodes the step has (1 on one machine).
    pub fn count(&self) -> usize {
        self.names.len().max(1)
    }

    /// This node's name; `None` on one machine.
    pub fn this_node(&self) -> Option<&str> {
        self.names.get(self.index).map(String::as_str)
    }
}

/// Why a host list could not be expanded. Positions are 1-based character columns of the
/// expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    /// Nothing to expand.
    #[error(
        "the host list is empty\n  hint: write node names such as \"n1,n2\" or \"gpu[01-04]\""
    )]
    Empty,
    /// Two commas in a row, or a comma at an end.
    #[error("host list \"{expr}\" has an empty name at character {at}\n  hint: separate names with single commas: \"n1,n2\"")]
    EmptyName {
        /// The whole expression.
        expr: String,
        /// Where the empty name is.
        at: usize,
    },
    /// A character that is not allowed in a host name.
    #[error("host list \"{expr}\" has `{found}` at character {at}, which is not allowed in a host name\n  hint: host names are letters, digits, `-`, `_` and `.`; ranges go in brackets: \"n[1-3]\"")]
    BadCharacter {
        /// The whole expression.
        expr: String,
        /// Where.
        at: usize,
        /// The character.
        found: char,
    },
    /// A `[` with no `]`, or a `]` with no `[`.
    #[error("host list \"{expr}\" has an unmatched `{found}` at character {at}\n  hint: a range is written in one pair of brackets: \"n[1-3,5]\"")]
    Unmatched {
        /// The whole expression.
        expr: String,
        /// Where.
        at: usize,
        /// `[` or `]`.
        found: char,
    },
    /// A second bracket group in one name (`n[1-2]x[1-2]`), which this parser does not expand.
    #[error("host list \"{expr}\" has a second bracket group in one name at character {at}\n  hint: one bracket group per name is supported: list the names as \"n1x[1-2],n2x[1-2]\"")]
    SecondGroup {
        /// The whole expression.
        expr: String,
        /// Where the second `[` is.
        at: usize,
    },
    /// A range item that is not `N` or `N-M` with digits.
    #[error("host list \"{expr}\" has range `{item}` at character {at}, which is not N or N-M\n  hint: ranges are numbers: \"n[1-3,7]\", zero-padded to keep a width: \"gpu[01-12]\"")]
    BadRange {
        /// The whole expression.
        expr: String,
        /// Where the item starts.
        at: usize,
        /// The item as written.
        item: String,
    },
    /// A range whose end is below its start.
    #[error("host list \"{expr}\" has range `{item}` at character {at}, which counts down\n  hint: write the smaller number first: \"n[1-3]\"")]
    Descending {
        /// The whole expression.
        expr: String,
        /// Where the item starts.
        at: usize,
        /// The item as written.
        item: String,
    },
    /// More names than [`MAX_HOSTLIST_NAMES`].
    #[error(
        "host list \"{expr}\" expands to more than {max} names\n  hint: check the ranges' bounds"
    )]
    TooMany {
        /// The whole expression.
        expr: String,
        /// The limit.
        max: usize,
    },
}

/// Expands a Slurm host list into node names, in the order written.
///
/// Accepted: names separated by commas (`n1,n2`), each with at most one bracket group of
/// comma-separated numbers and ranges anywhere in the name (`n[1-3]`, `gpu[01-04,07]`,
/// `a[1-2]-ib`). A range keeps the width of its first number, so zero padding survives
/// (`gpu[08-10]` -> `gpu08, gpu09, gpu10`). Two bracket groups in one name
/// (`n[1-2]x[1-2]`, which Slurm expands as a product) are refused with
/// [`HostlistError::SecondGroup`]. Names are kept as written, repeats included; surrounding
/// whitespace of the whole list is ignored.
pub fn expand_hostlist(expr: &str) -> Result<Vec<String>, HostlistError> {
    let trimmed = expr.trim();
    if trimmed.is_empty() {
        return Err(HostlistError::Empty);
    }
    let offset = expr.len() - expr.trim_start().len();
    let column = |byte: usize| expr[..offset + byte].chars().count() + 1;
    let owned = || expr.to_string();
    let mut names = Vec::new();
    // Split at commas outside brackets.
    let mut start = 0;
    let mut open: Option<usize> = None;
    let mut items: Vec<(usize, &str)> = Vec::new();
    for (at, c) in trimmed.char_indices() {
        match c {
            '[' if open.is_some() => {
                return Err(HostlistError::Unmatched {
                    expr: owned(),
                    at: column(open.unwrap_or(at)),
                    found: '[',
                })
            }
            '[' => open = Some(at),
            ']' if open.is_none() => {
                return Err(HostlistError::Unmatched {
                    expr: owned(),
                    at: column(at),
                    found: ']',
                })
            }
            ']' => open = None,
            ',' if open.is_none() => {
                items.push((start, &trimmed[start..at]));
                start = at + 1;
            }
            _ => {}
        }
    }
    if let Some(at) = open {
        return Err(HostlistError::Unmatched {
            expr: owned(),
            at: column(at),
            found: '[',
        });
    }
    items.push((start, &trimmed[start..]));
    for (item_start, item) in items {
        if item.is_empty() {
            return Err(HostlistError::EmptyName {
                expr: owned(),
                at: column(item_start),
            });
        }
        if let Some((at, found)) = item
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || "-_.[],".contains(c)))
        {
            return Err(HostlistError::BadCharacter {
                expr: owned(),
                at: column(item_start + at),
                found,
            });
        }
        let Some(open) = item.find('[') else {
            names.push(item.to_string());
            continue;
        };
        let close = open + item[open..].find(']').unwrap_or(item.len() - open);
        let (prefix, body, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
        if let Some(second) = suffix.find('[') {
            return Err(HostlistError::SecondGroup {
                expr: owned(),
                at: column(item_start + close + 1 + second),
            });
        }
        let mut body_at = item_start + open + 1;
        for range in body.split(',') {
            let bad = |make: fn(String, usize, String) -> HostlistError| {
                make(owned(), column(body_at), range.to_string())
            };
            let (low, high) = range.split_once('-').unwrap_or((range, range));
            let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
            if !digits(low) || !digits(high) {
                return Err(bad(|expr, at, item| HostlistError::BadRange {
                    expr,
                    at,
                    item,
                }));
            }
            let (Ok(first), Ok(last)) = (low.parse::<u64>(), high.parse::<u64>()) else {
                return Err(bad(|expr, at, item| HostlistError::BadRange {
                    expr,
                    at,
                    item,
                }));
            };
            if last < first {
                return Err(bad(|expr, at, item| HostlistError::Descending {
                    expr,
                    at,
                    item,
                }));
            }
            if (last - first) as usize >= MAX_HOSTLIST_NAMES - names.len().min(MAX_HOSTLIST_NAMES) {
                return Err(HostlistError::TooMany {
                    expr: owned(),
                    max: MAX_HOSTLIST_NAMES,
                });
            }
            let width = low.len();
            for number in first..=last {
                names.push(format!("{prefix}{number:0width$}{suffix}"));
            }
            body_at += range.len() + 1;
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        expand_hostlist(expr).unwrap_or_else(|error| panic!("{expr}: {error}"))
    }

    #[test]
    fn expands_the_forms_slurm_prints() {
        assert_eq!(names("n1"), ["n1"]);
        assert_eq!(names("n[1-3]"), ["n1", "n2", "n3"]);
        assert_eq!(
            names("gpu[01-04,07]"),
            ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]
        );
        assert_eq!(names("a[1-2]-ib,b3"), ["a1-ib", "a2-ib", "b3"]);
        assert_eq!(names("gpu[08-10]"), ["gpu08", "gpu09", "gpu10"]);
        assert_eq!(names("n[9-10]"), ["n9", "n10"]);
        assert_eq!(names("  n1,n[3]  "), ["n1", "n3"]);
        assert_eq!(names("node-a.cluster,x_2"), ["node-a.cluster", "x_2"]);
    }

    #[test]
    fn errors_name_the_position() {
        let error = expand_hostlist("n1,,n2").unwrap_err();
        assert_eq!(
            error,
            HostlistError::EmptyName {
                expr: "n1,,n2".into(),
                at: 4
            }
        );
        assert!(error.to_string().contains("character 4"), "{error}");
        assert!(matches!(
            expand_hostlist("n[1-3"),
            Err(HostlistError::Unmatched {
                at: 2,
                found: '[',
                ..
            })
        ));
        assert!(matches!(
            expand_hostlist("n1]"),
            Err(HostlistError::Unmatched {
                at: 3,
                found: ']',
                ..
            })
        ));
        assert!(matches!(
            expand_hostlist("n[1-2]x[1-2]"),
            Err(HostlistError::SecondGroup { at: 8, .. })
        ));
        assert_eq!(
            expand_hostlist("n[1,3-x]").unwrap_err(),
            HostlistError::BadRange {
                expr: "n[1,3-x]".into(),
                at: 5,
                item: "3-x".into()
            }
        );
        assert!(matches!(
            expand_hostlist("n[5-2]"),
            Err(HostlistError::Descending { at: 3, .. })
        ));
        assert!(matches!(
            expand_hostlist("n 1"),
            Err(HostlistError::BadCharacter {
                at: 2,
                found: ' ',
                ..
            })
        ));
        assert!(matches!(
            expand_hostlist("n[[1]]"),
            Err(HostlistError::Unmatched { at: 2, .. })
        ));
        assert_eq!(expand_hostlist(" "), Err(HostlistError::Empty));
        assert!(matches!(
            expand_hostlist("n[0-99999999]"),
            Err(HostlistError::TooMany { .. })
        ));
    }

    #[test]
    fn layouts() {
        let single = NodeLayout::single();
        assert!(single.is_single());
        assert_eq!(single.count(), 1);
        assert_eq!(single.this_node(), None);
        let layout = NodeLayout::node(names("n[1-3]"), 2);
        assert_eq!(layout.count(), 3);
        assert_eq!(layout.this_node(), Some("n3"));
    }
}
