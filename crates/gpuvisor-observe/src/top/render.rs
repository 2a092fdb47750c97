//! Drawing one frame of `gpuvisor top` from a [`TopApp`]: a pure function of the app, so a
//! test renders into ratatui's `TestBackend` and reads the text back.
//!
//! Layout, top to bottom: the title line; per GPU a header with a utilisation sparkline, a
//! memory bar split by holder with budget marks, and a legend; the process table; recent
//! events beside the selected row's log tail (the log takes the width when it has the focus);
//! the key line. Without colours every holder gets its own fill glyph, so the bar still reads.

use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Sparkline, Table, TableState};
use ratatui::{Frame, Terminal};

use super::app::{Action, Overlay, TopApp};
use super::bar::{legend, memory_bar};
use super::model::{GpuView, ProcessRow, Tone};

/// Width of the utilisation sparkline.
const SPARK_WIDTH: u16 = 30;

/// Draws the whole screen.
pub fn render(frame: &mut Frame, app: &TopApp) {
    let area = frame.area();
    let gpu_height = gpu_section_height(app, area.height);
    // The table takes what its rows need (up to half of what is left); events and the log
    // get the rest, and the log takes most of it when it has the focus.
    let left = area.height.saturating_sub(gpu_height + 2);
    let table_height = if app.log_focus {
        (app.model.rows.len() as u16 + 2).min(left / 3).max(3)
    } else {
        (app.model.rows.len() as u16 + 2).min(left / 2).max(3)
    };
    let [title, gpus, table, bottom, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(gpu_height),
        Constraint::Length(table_height),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);

    frame.render_widget(title_line(app), title);
    render_gpus(frame, gpus, app);
    render_table(frame, table, app);
    if app.log_focus {
        render_log(frame, bottom, app);
    } else {
        let [events, log] =
            Layout::horizontal([Constraint::Percentage(45), Constraint::Percentage(55)])
                .areas(bottom);
        render_events(frame, events, app);
        render_log(frame, log, app);
    }
    frame.render_widget(status_line(app), status);
    match &app.overlay {
        Overlay::None => {}
        Overlay::Help => render_help(frame, area, app),
        Overlay::Confirm(action) => render_confirm(frame, area, app, action),
    }
}

/// Renders one frame into a `width` × `height` text screen (trailing blanks trimmed): what
/// `gpuvisor top --once` prints and what the snapshot tests compare.
pub fn render_to_text(app: &TopApp, width: u16, height: u16) -> String {
    // TestBackend never fails: it draws into memory.
    let mut terminal =
        Terminal::new(TestBackend::new(width, height)).expect("a TestBackend terminal");
    let _ = terminal.draw(|frame| render(frame, app));
    buffer_text(terminal.backend().buffer())
}

/// A buffer's symbols as lines of text, trailing blanks trimmed.
pub fn buffer_text(buffer: &Buffer) -> String {
    let area = buffer.area;
    let mut out = String::new();
    for y in area.top()..area.bottom() {
        let mut line = String::new();
        for x in area.left()..area.right() {
            line.push_str(buffer[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Three lines per GPU, but at most a third of the screen (then one line each: the bar).
fn gpu_section_height(app: &TopApp, screen: u16) -> u16 {
    let count = app.model.gpus.len() as u16;
    if count == 0 {
        return 1;
    }
    if count * 3 <= screen / 3 {
        count * 3
    } else {
        count.min(screen / 3).max(1)
    }
}

pub(super) fn style(app: &TopApp, style: Style) -> Style {
    if app.color {
        style
    } else {
        Style::default()
    }
}

fn title_line(app: &TopApp) -> Paragraph<'static> {
    let mut spans = vec![
        Span::styled(
            "gpuvisor top",
            style(app, Style::default().add_modifier(Modifier::BOLD)),
        ),
        Span::raw(format!(" — {}", app.model.title)),
    ];
    if !app.model.source_note.is_empty() {
        spans.push(Span::raw(format!(" ({})", app.model.source_note)));
    }
    Paragraph::new(Line::from(spans))
}

fn render_gpus(frame: &mut Frame, area: Rect, app: &TopApp) {
    if app.model.gpus.is_empty() {
        frame.render_widget(Paragraph::new("no GPUs"), area);
        return;
    }
    let compact = area.height < app.model.gpus.len() as u16 * 3;
    let per_gpu = if compact { 1 } else { 3 };
    for (slot, gpu) in app.model.gpus.iter().enumerate() {
        let y = area.y + slot as u16 * per_gpu;
        if y + per_gpu > area.bottom() {
            break;
        }
        if compact {
            let label = format!("GPU{} ", gpu.index);
            let width = area.width.saturating_sub(label.len() as u16 + 16);
            let mut spans = vec![Span::raw(label)];
            spans.extend(memory_bar(app, gpu, width));
            spans.push(Span::raw(format!(" {}", used_text(gpu))));
            frame.render_widget(
                Paragraph::new(Line::from(spans)),
                Rect::new(area.x, y, area.width, 1),
            );
            continue;
        }
        let header = Rect::new(area.x, y, area.width, 1);
        let [text, spark] =
            Layout::horizontal([Constraint::Min(20), Constraint::Length(SPARK_WIDTH + 10)])
                .areas(header);
        frame.render_widget(
            Paragraph::new(Line::from(vec![
                Span::styled(
                    format!("GPU{} ", gpu.index),
                    style(app, Style::default().add_modifier(Modifier::BOLD)),
                ),
                Span::raw(format!("{}  {}", gpu.name, used_text(gpu))),
            ])),
            text,
        );
        render_util(frame, spark, app, gpu);
        let bar_width = area.width.saturating_sub(2);
        let mut bar = vec![Span::raw("[")];
        bar.extend(memory_bar(app, gpu, bar_width));
        bar.push(Span::raw("]"));
        frame.render_widget(
            Paragraph::new(Line::from(bar)),
            Rect::new(area.x, y + 1, area.width, 1),
        );
        frame.render_widget(
            Paragraph::new(legend(app, gpu)),
            Rect::new(area.x, y + 2, area.width, 1),
        );
    }
}

fn used_text(gpu: &GpuView) -> String {
    let used = gpu
        .used_bytes
        .unwrap_or_else(|| gpu.segments.iter().map(|s| s.used_bytes).sum());
    format!("{} / {}", short_bytes(used), short_bytes(gpu.total_bytes))
}

/// `util  87% ▂▃▅▇` on the right of a GPU's header.
fn render_util(frame: &mut Frame, area: Rect, app: &TopApp, gpu: &GpuView) {
    let [label, spark] =
        Layout::horizontal([Constraint::Length(10), Constraint::Min(1)]).areas(area);
    let Some(&last) = gpu.util_history.back() else {
        frame.render_widget(Paragraph::new("util   n/a"), label);
        return;
    };
    frame.render_widget(Paragraph::new(format!("util {last:>3}% ")), label);
    // The newest samples, right-aligned.
    let data: Vec<u64> = gpu
        .util_history
        .iter()
        .rev()
        .take(spark.width as usize)
        .rev()
        .map(|&percent| u64::from(percent))
        .collect();
    frame.render_widget(
        Sparkline::default()
            .data(&data)
            .max(100)
            .style(style(app, Style::default().fg(Color::Green))),
        spark,
    );
}

fn render_table(frame: &mut Frame, area: Rect, app: &TopApp) {
    let header = Row::new([
        "NAME",
        "R",
        "PID",
        "STATE",
        "MEM/BUDGET",
        "PEAK",
        "UNTRK",
        "GPU%",
        "CPU%",
        "RSS",
        "RST",
        "LOG",
    ])
    .style(style(
        app,
        Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED),
    ));
    let rows: Vec<Row> = app
        .sorted_rows()
        .into_iter()
        .map(|row| table_row(app, row))
        .collect();
    let widths = [
        Constraint::Min(10),
        Constraint::Length(3),
        Constraint::Length(7),
        Constraint::Length(18),
        Constraint::Length(11),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(4),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(3),
        Constraint::Length(5),
    ];
    let title = if app.model.rows.is_empty() {
        if app.model.supervised {
            " processes: none yet ".to_string()
        } else {
            " processes: no process holds GPU memory ".to_string()
        }
    } else {
        format!(" processes ({}) ", app.model.rows.len())
    };
    let table = Table::new(rows, widths)
        .header(header)
        .block(Block::default().borders(Borders::TOP).title(title))
        .row_highlight_style(if app.color {
            Style::default()
                .bg(Color::DarkGray)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::default().add_modifier(Modifier::REVERSED)
        })
        .highlight_symbol("▶ ")
        .column_spacing(1);
    let mut state = TableState::default().with_selected(app.selected_index());
    frame.render_stateful_widget(table, area, &mut state);
}

fn table_row<'a>(app: &TopApp, row: &'a ProcessRow) -> Row<'a> {
    let dash = || "-".to_string();
    let memory = match (row.gpu_used_bytes, row.budget_bytes) {
        (used, Some(budget)) if budget > 0 => format!(
            "{}/{}",
            used.map_or("?".to_string(), short_bytes),
            short_bytes(budget)
        ),
        // A CPU-only replica (no budget) holding nothing: no GPU figure at all.
        (Some(0), Some(0)) | (None, _) => dash(),
        (Some(used), _) => short_bytes(used),
    };
    let over =
        matches!((row.gpu_used_bytes, row.budget_bytes), (Some(u), Some(b)) if b > 0 && u > b);
    let state_style = match row.state.as_str() {
        s if s.starts_with("running") => Style::default().fg(Color::Green),
        s if s.contains("fail") || s == "crash-loop" => Style::default().fg(Color::Red),
        "backoff" | "stopping" | "starting" | "waiting" => Style::default().fg(Color::Yellow),
        // Waiting for GPU room (admission = "queue").
        s if s.starts_with("queued") => Style::default().fg(Color::Yellow),
        _ => Style::default(),
    };
    // A stall says more than `running`: it is why a quiet process is quiet.
    let (state, state_style) = match &row.stall {
        Some(stall) => (
            // Short enough for the column: `stall: compile/cpu`.
            format!(
                "stall: {}",
                match stall.as_str() {
                    "compiling-or-cpu-bound" => "compile/cpu",
                    other => other,
                }
            ),
            Style::default().fg(Color::Magenta),
        ),
        None => (row.state.clone(), state_style),
    };
    Row::new(vec![
        Cell::from(row.name.as_str()),
        Cell::from(row.replica.map_or_else(dash, |r| r.to_string())),
        Cell::from(row.pid.map_or_else(dash, |pid| pid.to_string())),
        Cell::from(state).style(style(app, state_style)),
        Cell::from(memory).style(if over {
            style(app, Style::default().fg(Color::Red))
        } else {
            Style::default()
        }),
        Cell::from(row.gpu_peak_bytes.map_or_else(dash, short_bytes)),
        Cell::from(row.untracked_bytes.map_or_else(dash, short_bytes)).style(
            match row.untracked_alarm {
                true => style(app, Style::default().fg(Color::Red)),
                false => Style::default(),
            },
        ),
        Cell::from(row.gpu_util_percent.map_or_else(dash, |p| format!("{p}"))),
        Cell::from(row.cpu_percent.map_or_else(dash, |p| format!("{p:.0}"))),
        Cell::from(row.rss_bytes.map_or_else(dash, short_bytes)),
        Cell::from(row.restarts.to_string()),
        Cell::from(row.since_log_secs.map_or_else(dash, short_secs)),
    ])
}

fn render_events(frame: &mut Frame, area: Rect, app: &TopApp) {
    let height = area.height.saturating_sub(1) as usize;
    let events = &app.model.events;
    let lines: Vec<Line> = events[events.len().saturating_sub(height)..]
        .iter()
        .map(|event| {
            let kind_style = match event.tone {
                Tone::Bad => Style::default().fg(Color::Red),
                Tone::Notice => Style::default().fg(Color::Yellow),
                Tone::Good => Style::default().fg(Color::Green),
                Tone::Plain => Style::default(),
            };
            Line::from(vec![
                Span::raw(format!("{} ", event.time)),
                Span::styled(event.kind.clone(), style(app, kind_style)),
                Span::raw(format!(" {}", event.text)),
            ])
        })
        .collect();
    let block = Block::default().borders(Borders::TOP).title(" events ");
    let body = if lines.is_empty() {
        Paragraph::new("no events")
    } else {
        Paragraph::new(lines)
    };
    frame.render_widget(body.block(block), area);
}

fn render_log(frame: &mut Frame, area: Rect, app: &TopApp) {
    let height = area.height.saturating_sub(1) as usize;
    let tail = &app.model.log_tail;
    let end = tail.len().saturating_sub(app.log_scroll);
    let start = end.saturating_sub(height);
    let lines: Vec<Line> = tail[start..end]
        .iter()
        .map(|line| {
            let text_style = if line.stderr {
                style(app, Style::default().fg(Color::LightRed))
            } else {
                Style::default()
            };
            let time = if line.time.is_empty() {
                String::new()
            } else {
                format!("{} ", line.time)
            };
            Line::from(vec![
                Span::styled(time, style(app, Style::default().fg(Color::DarkGray))),
                Span::styled(line.text.clone(), text_style),
            ])
        })
        .collect();
    let focus = if app.log_focus {
        " [focus: ↑↓ scroll, ⏎ back]"
    } else {
        ""
    };
    let scrolled = if app.log_scroll > 0 {
        format!(" (-{})", app.log_scroll)
    } else {
        String::new()
    };
    let title = format!(" log: {}{scrolled}{focus} ", app.model.log_title);
    let block = Block::default()
        .borders(Borders::TOP)
        .title(title)
        .border_style(if app.log_focus {
            style(app, Style::default().fg(Color::Cyan))
        } else {
            Style::default()
        });
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

fn status_line(app: &TopApp) -> Paragraph<'static> {
    let keys = format!(
        "q quit  ↑↓ select  s sort:{}  r restart  k stop  ⏎ log  ? help",
        app.sort.label()
    );
    let mut spans = vec![Span::styled(
        keys,
        style(app, Style::default().add_modifier(Modifier::REVERSED)),
    )];
    if let Some(warning) = &app.model.warning {
        spans.push(Span::styled(
            format!("  {warning}"),
            style(app, Style::default().fg(Color::Red)),
        ));
    } else if let Some(message) = &app.message {
        spans.push(Span::raw(format!("  {message}")));
    }
    Paragraph::new(Line::from(spans))
}

fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(area.width);
    let height = height.min(area.height);
    Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    )
}

const HELP: &[(&str, &str)] = &[
    (
        "↑ ↓ PgUp PgDn",
        "select a process (in log focus: scroll the log)",
    ),
    ("Home End", "first / last process"),
    ("s", "sort by: plan, memory, gpu%, cpu%, restarts, name"),
    ("⏎", "log tail focus on / off (Esc leaves it)"),
    ("r", "restart the selected process (asks first)"),
    ("k", "stop the selected process (asks first)"),
    ("? h", "this help (any key closes it)"),
    ("q  Ctrl-C", "quit (the run goes on)"),
];

fn render_help(frame: &mut Frame, area: Rect, app: &TopApp) {
    let mut lines: Vec<Line> = HELP
        .iter()
        .map(|(keys, what)| {
            let what = if keys.starts_with('q') && app.quit_stops_job {
                "stop the job and quit (q asks first)"
            } else {
                what
            };
            Line::from(format!(" {keys:<14} {what}"))
        })
        .collect();
    lines.push(Line::from(""));
    lines.push(Line::from(
        " bar: █▓▒ held  · unused budget  ▕ budget end  ░ others",
    ));
    let box_area = centered(area, 70, lines.len() as u16 + 2);
    frame.render_widget(Clear, box_area);
    frame.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(" keys ")),
        box_area,
    );
}

fn render_confirm(frame: &mut Frame, area: Rect, app: &TopApp, action: &Action) {
    let question = match action {
        Action::Restart(process) => format!("Restart {}?", whom(app, process)),
        Action::Stop(process) => format!("Stop {}?", whom(app, process)),
        Action::Quit => "Stop the whole job and quit?".to_string(),
        Action::None => return,
    };
    let text = format!(" {question}  y: yes   any other key: no ");
    let box_area = centered(area, text.chars().count() as u16 + 2, 3);
    frame.render_widget(Clear, box_area);
    frame.render_widget(
        Paragraph::new(text).block(Block::default().borders(Borders::ALL).title(" confirm ")),
        box_area,
    );
}

/// A process named with its replica count, since restart and stop act on all of them.
fn whom(app: &TopApp, process: &str) -> String {
    let replicas = app
        .model
        .rows
        .iter()
        .filter(|row| row.name == process)
        .count();
    if replicas > 1 {
        format!("{process} (all {replicas} replicas)")
    } else {
        process.to_string()
    }
}

/// Bytes in at most 6 characters: `512M`, `7.5G`, `80G`.
pub fn short_bytes(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let value = bytes as f64;
    if value >= KIB * KIB * KIB * 100.0 {
        format!("{:.0}G", value / (KIB * KIB * KIB))
    } else if value >= KIB * KIB * KIB {
        format!("{:.1}G", value / (KIB * KIB * KIB))
    } else if value >= KIB * KIB {
        format!("{:.0}M", value / (KIB * KIB))
    } else if value >= KIB {
        format!("{:.0}K", value / KIB)
    } else {
        format!("{bytes}B")
    }
}

/// Seconds in at most 5 characters: `7s`, `12m`, `3h`.
pub fn short_secs(secs: u64) -> String {
    match secs {
        0..=99 => format!("{secs}s"),
        100..=5999 => format!("{}m", secs / 60),
        6000..=359_999 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}
