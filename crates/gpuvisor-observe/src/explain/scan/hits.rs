//! What a scan keeps of the lines patterns matched: per pattern the count, the first few and
//! the last few hits, and figures read from them.

use std::collections::VecDeque;

use regex::bytes::Regex;

use super::{FIRST_HITS, LAST_HITS, MAX_LINE_TEXT};
use crate::explain::rules::Combine;
use crate::size_text::parse_log_size;

/// A line a pattern matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// 1-based line number.
    pub line: u64,
    /// The line (lossy UTF-8, cut to a maximum length).
    pub text: String,
}

/// What one pattern saw.
#[derive(Debug, Clone, Default)]
pub struct PatternHits {
    /// How many lines matched: exact for main patterns and figures; other patterns stop
    /// counting once their first hits are kept.
    pub count: u64,
    /// The first few.
    pub first: Vec<Hit>,
    /// The last few (after the first ones).
    pub last: VecDeque<Hit>,
}

impl PatternHits {
    pub(super) fn record(&mut self, line: u64, text: &str) {
        self.count += 1;
        if self.first.len() < FIRST_HITS {
            self.first.push(Hit {
                line,
                text: text.to_string(),
            });
        } else if self.last.len() == LAST_HITS {
            // Reuse the oldest hit's buffer: a pattern hit on every line allocates nothing.
            let mut oldest = self.last.pop_front().expect("full");
            oldest.line = line;
            oldest.text.clear();
            oldest.text.push_str(text);
            self.last.push_back(oldest);
        } else {
            self.last.push_back(Hit {
                line,
                text: text.to_string(),
            });
        }
    }

    /// Remembered hits, in order.
    pub fn hits(&self) -> impl Iterator<Item = &Hit> {
        self.first.iter().chain(&self.last)
    }
}

/// A line kept whole for an analysis that reads tables (`rules::ROW_ANALYSES`): its capture
/// groups, in order (an empty string for a group that did not take part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Line number (from 1).
    pub line: u64,
    /// The line as evidence text.
    pub text: String,
    /// The capture groups.
    pub fields: Vec<String>,
}

pub(super) fn read_row(regex: &Regex, line: &[u8], number: u64, text: &str) -> Option<Row> {
    let captures = regex.captures(line)?;
    let fields = captures
        .iter()
        .skip(1)
        .map(|group| {
            group.map_or_else(String::new, |group| {
                String::from_utf8_lossy(group.as_bytes()).into_owned()
            })
        })
        .collect();
    Some(Row {
        line: number,
        text: text.to_string(),
        fields,
    })
}

/// A number read from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FigureValue {
    /// The text as printed (the last capture, for sums).
    pub text: String,
    /// Bytes, when the text is a size.
    pub bytes: Option<u64>,
    /// Where it was read.
    pub line: u64,
}

pub(super) fn read_figure(
    regex: &Regex,
    combine: Combine,
    line: &[u8],
    number: u64,
) -> Option<FigureValue> {
    let captured: Vec<String> = regex
        .captures_iter(line)
        .filter_map(|captures| captures.iter().skip(1).flatten().next())
        .map(|group| String::from_utf8_lossy(group.as_bytes()).into_owned())
        .collect();
    let last = captured.last()?.clone();
    let sizes = || captured.iter().map(|text| parse_log_size(text));
    // Min and max keep the capture they came from as the text.
    let extreme = |larger: bool| -> Option<(String, u64)> {
        let sizes: Vec<u64> = sizes().collect::<Option<_>>()?;
        let places = 0..sizes.len();
        let at = if larger {
            places.max_by_key(|&at| sizes[at])
        } else {
            places.min_by_key(|&at| sizes[at])
        }?;
        Some((captured[at].clone(), sizes[at]))
    };
    let (text, bytes) = match combine {
        Combine::Last => (last.clone(), parse_log_size(&last)),
        Combine::Sum => (
            last,
            sizes().try_fold(0u64, |sum, bytes| Some(sum.saturating_add(bytes?))),
        ),
        // A count, not a size: no bytes (the analysis reads the number from the text).
        Combine::Count => (captured.len().to_string(), None),
        Combine::Min => extreme(false).map_or((last, None), |(t, b)| (t, Some(b))),
        Combine::Max => extreme(true).map_or((last, None), |(t, b)| (t, Some(b))),
    };
    Some(FigureValue {
        text,
        bytes,
        line: number,
    })
}

/// The line as text for evidence: lossy UTF-8, cut at a character boundary.
pub(super) fn line_text(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(&line[..line.len().min(MAX_LINE_TEXT + 4)]);
    if text.len() <= MAX_LINE_TEXT {
        return text.into_owned();
    }
    let mut cut = MAX_LINE_TEXT;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}
