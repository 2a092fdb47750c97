//! The memory bar of one GPU and its legend: holders side by side in plan order, each with
//! its used part, the unused rest of its budget and a mark at the budget's end.

use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};

use super::app::TopApp;
use super::model::GpuView;
use super::render::{short_bytes, style};

/// Fill glyphs per holder without colours (cycled).
const MONO_FILLS: [char; 6] = ['█', '▓', '▒', '#', '=', '%'];
/// Holder colours with colours (cycled); every holder then fills with `█`.
const COLORS: [Color; 6] = [
    Color::Cyan,
    Color::Green,
    Color::Yellow,
    Color::Magenta,
    Color::Blue,
    Color::LightRed,
];
/// A held budget's unused part.
const UNUSED_BUDGET: char = '·';
/// The last cell of a holder's budget.
const BUDGET_MARK: char = '▕';
/// Memory held by processes outside the view (another user's, the driver's).
const OTHER: char = '░';

/// The memory bar of one GPU, `width` cells: per holder its used part (its fill), the unused
/// rest of its budget (`·`) ending in a budget mark (`▕`); then memory of others (`░`); then
/// free space. Positions come from cumulative bytes, so rounding never drifts.
pub(super) fn memory_bar(app: &TopApp, gpu: &GpuView, width: u16) -> Vec<Span<'static>> {
    let width = width as usize;
    let total = gpu.total_bytes.max(1) as u128;
    let cell = |bytes: u64| ((bytes as u128 * width as u128 / total) as usize).min(width);
    let mut cells: Vec<(char, Style)> = vec![(' ', Style::default()); width];
    let mut start = 0u64;
    for (index, segment) in gpu.segments.iter().enumerate() {
        let (fill, color) = holder_fill(app, index);
        let budget = segment.budget_bytes.unwrap_or(0);
        let used_end = start + segment.used_bytes;
        let region_end = start + segment.used_bytes.max(budget);
        let over = budget > 0 && segment.used_bytes > budget;
        let fill_style = if over {
            style(app, Style::default().fg(Color::Red))
        } else {
            color
        };
        for slot in cells.iter_mut().take(cell(used_end)).skip(cell(start)) {
            *slot = (fill, fill_style);
        }
        for slot in cells.iter_mut().take(cell(region_end)).skip(cell(used_end)) {
            *slot = (
                UNUSED_BUDGET,
                style(app, Style::default().fg(Color::DarkGray)),
            );
        }
        if budget > 0 {
            let mark = cell(start + budget).saturating_sub(1).max(cell(start));
            if mark < width {
                cells[mark] = (BUDGET_MARK, style(app, Style::default().fg(Color::White)));
            }
        }
        start = region_end;
    }
    // Others: what the GPU says is used beyond what the holders account for.
    let held: u64 = gpu.segments.iter().map(|s| s.used_bytes).sum();
    if let Some(used) = gpu.used_bytes {
        let other_end = start + used.saturating_sub(held);
        for slot in cells.iter_mut().take(cell(other_end)).skip(cell(start)) {
            *slot = (OTHER, style(app, Style::default().fg(Color::DarkGray)));
        }
    }
    // Merge runs of one style into spans.
    let mut spans = Vec::new();
    let mut run = String::new();
    let mut run_style = Style::default();
    for (glyph, glyph_style) in cells {
        if glyph_style != run_style && !run.is_empty() {
            spans.push(Span::styled(std::mem::take(&mut run), run_style));
        }
        run_style = glyph_style;
        run.push(glyph);
    }
    if !run.is_empty() {
        spans.push(Span::styled(run, run_style));
    }
    spans
}

fn holder_fill(app: &TopApp, index: usize) -> (char, Style) {
    if app.color {
        ('█', Style::default().fg(COLORS[index % COLORS.len()]))
    } else {
        (MONO_FILLS[index % MONO_FILLS.len()], Style::default())
    }
}

pub(super) fn legend(app: &TopApp, gpu: &GpuView) -> Line<'static> {
    let mut spans = Vec::new();
    for (index, segment) in gpu.segments.iter().enumerate() {
        let (fill, fill_style) = holder_fill(app, index);
        let figures = match segment.budget_bytes {
            Some(budget) if budget > 0 => format!(
                "{}/{}",
                short_bytes(segment.used_bytes),
                short_bytes(budget)
            ),
            _ => short_bytes(segment.used_bytes),
        };
        spans.push(Span::styled(fill.to_string(), fill_style));
        spans.push(Span::raw(format!(" {} {figures}  ", segment.label)));
    }
    if gpu.segments.is_empty() {
        spans.push(Span::raw("no processes"));
    }
    Line::from(spans)
}
