//! The state of the UI around the model (selection, sort, overlays) and what keys do to it.
//!
//! [`handle_key`] is pure: it changes the [`TopApp`] and says what the caller must do outside
//! (quit, send a restart or stop over the control socket). Keys come as [`Key`], not
//! crossterm's type, so tests need no terminal.

use std::cmp::Ordering;

use super::model::{ProcessRow, TopModel};

/// A key press, reduced to what `top` reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// A printable character.
    Char(char),
    /// ↑
    Up,
    /// ↓
    Down,
    /// Page up.
    PageUp,
    /// Page down.
    PageDown,
    /// Home.
    Home,
    /// End.
    End,
    /// Enter.
    Enter,
    /// Escape.
    Esc,
    /// Ctrl-C.
    CtrlC,
}

/// What the caller must do after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing outside the app.
    None,
    /// Leave `top`.
    Quit,
    /// Ask the supervisor to restart this job-file process (every replica of it).
    Restart(String),
    /// Ask the supervisor to stop this job-file process (every replica of it).
    Stop(String),
}

/// The column the table is sorted by; `s` cycles through them in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    /// Plan order (run) or pid order (machine-wide): the source's order.
    #[default]
    Plan,
    /// GPU memory held, largest first.
    Memory,
    /// GPU utilisation, highest first.
    GpuUtil,
    /// CPU use, highest first.
    Cpu,
    /// Restarts, most first.
    Restarts,
    /// Name, A to Z.
    Name,
}

impl SortKey {
    /// The next key in the cycle.
    pub fn next(self) -> Self {
        match self {
            Self::Plan => Self::Memory,
            Self::Memory => Self::GpuUtil,
            Self::GpuUtil => Self::Cpu,
            Self::Cpu => Self::Restarts,
            Self::Restarts => Self::Name,
            Self::Name => Self::Plan,
        }
    }

    /// How the status line names it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Plan => "plan",
            Self::Memory => "memory",
            Self::GpuUtil => "gpu%",
            Self::Cpu => "cpu%",
            Self::Restarts => "restarts",
            Self::Name => "name",
        }
    }
}

/// A window over the screen, at most one at a time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Overlay {
    /// None.
    #[default]
    None,
    /// The key help.
    Help,
    /// Waiting for `y` to confirm an action.
    Confirm(Action),
}

/// The model plus the UI's own state.
#[derive(Debug, Clone, Default)]
pub struct TopApp {
    /// The data, as the source last gave it.
    pub model: TopModel,
    /// The key of the selected row (kept across refreshes and re-sorting).
    pub selected: Option<String>,
    /// The sort column.
    pub sort: SortKey,
    /// The open overlay.
    pub overlay: Overlay,
    /// Whether the log tail has the focus (it grows, and ↑/↓ scroll it).
    pub log_focus: bool,
    /// Lines scrolled up from the end of the log tail.
    pub log_scroll: usize,
    /// A one-line message for the status bar (the result of the last action).
    pub message: Option<String>,
    /// Whether to draw with colours.
    pub color: bool,
    /// Whether quitting stops the job (`gpuvisor run --tui`): `q` then asks first.
    pub quit_stops_job: bool,
}

impl TopApp {
    /// An app over a first model, the first row selected.
    pub fn new(model: TopModel, color: bool) -> Self {
        let mut app = Self {
            color,
            ..Self::default()
        };
        app.set_model(model);
        app
    }

    /// Takes a fresh model from the source, keeping the selection when its row still exists.
    pub fn set_model(&mut self, model: TopModel) {
        self.model = model;
        let still_there = self
            .selected
            .as_ref()
            .is_some_and(|key| self.model.rows.iter().any(|row| &row.key == key));
        if !still_there {
            self.selected = self.sorted_rows().first().map(|row| row.key.clone());
        }
    }

    /// The rows in display order.
    pub fn sorted_rows(&self) -> Vec<&ProcessRow> {
        let mut rows: Vec<&ProcessRow> = self.model.rows.iter().collect();
        // Stable sort: ties keep the source's (plan) order.
        rows.sort_by(|a, b| compare(self.sort, a, b));
        rows
    }

    /// The position of the selected row in display order.
    pub fn selected_index(&self) -> Option<usize> {
        let key = self.selected.as_ref()?;
        self.sorted_rows().iter().position(|row| &row.key == key)
    }

    /// The selected row.
    pub fn selected_row(&self) -> Option<&ProcessRow> {
        let key = self.selected.as_ref()?;
        self.model.rows.iter().find(|row| &row.key == key)
    }

    fn move_selection(&mut self, delta: isize) {
        let rows = self.sorted_rows();
        if rows.is_empty() {
            return;
        }
        let current = self.selected_index().unwrap_or(0) as isize;
        let last = rows.len() as isize - 1;
        let next = (current + delta).clamp(0, last) as usize;
        let key = rows[next].key.clone();
        if self.selected.as_ref() != Some(&key) {
            self.log_scroll = 0;
        }
        self.selected = Some(key);
    }

    /// The action `r` or `k` asks to confirm, or why there is none.
    fn control_action(&self, make: fn(String) -> Action) -> Result<Action, String> {
        if !self.model.supervised {
            return Err(
                "no run: restart and stop need `gpuvisor top RUN` (a run started by `gpuvisor run`)"
                    .to_string(),
            );
        }
        match self.selected_row() {
            Some(row) => Ok(make(row.name.clone())),
            None => Err("no process selected".to_string()),
        }
    }
}

fn compare(sort: SortKey, a: &ProcessRow, b: &ProcessRow) -> Ordering {
    // Largest first for figures; rows without a figure go last.
    fn desc<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Ordering {
        match (a, b) {
            (Some(a), Some(b)) => b.partial_cmp(&a).unwrap_or(Ordering::Equal),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        }
    }
    match sort {
        SortKey::Plan => Ordering::Equal,
        SortKey::Memory => desc(a.gpu_used_bytes, b.gpu_used_bytes),
        SortKey::GpuUtil => desc(a.gpu_util_percent, b.gpu_util_percent),
        SortKey::Cpu => desc(a.cpu_percent, b.cpu_percent),
        SortKey::Restarts => b.restarts.cmp(&a.restarts),
        SortKey::Name => a.key.cmp(&b.key),
    }
}

/// Applies one key to the app and says what the caller must do.
pub fn handle_key(app: &mut TopApp, key: Key) -> Action {
    if key == Key::CtrlC {
        return Action::Quit;
    }
    match std::mem::take(&mut app.overlay) {
        Overlay::Help => {
            // Any key closes the help; q still quits.
            return if key == Key::Char('q') {
                Action::Quit
            } else {
                Action::None
            };
        }
        Overlay::Confirm(action) => {
            return match key {
                Key::Char('y') | Key::Char('Y') | Key::Enter => action,
                _ => {
                    app.message = Some("cancelled".to_string());
                    Action::None
                }
            };
        }
        Overlay::None => {}
    }
    match key {
        Key::Char('q') if app.quit_stops_job => app.overlay = Overlay::Confirm(Action::Quit),
        Key::Char('q') => return Action::Quit,
        Key::Esc if app.log_focus => app.log_focus = false,
        Key::Char('?') | Key::Char('h') => app.overlay = Overlay::Help,
        Key::Enter => {
            app.log_focus = !app.log_focus;
            app.log_scroll = 0;
        }
        Key::Up if app.log_focus => app.log_scroll = app.log_scroll.saturating_add(1),
        Key::Down if app.log_focus => app.log_scroll = app.log_scroll.saturating_sub(1),
        Key::PageUp if app.log_focus => app.log_scroll = app.log_scroll.saturating_add(10),
        Key::PageDown if app.log_focus => app.log_scroll = app.log_scroll.saturating_sub(10),
        Key::Up => app.move_selection(-1),
        Key::Down => app.move_selection(1),
        Key::PageUp => app.move_selection(-10),
        Key::PageDown => app.move_selection(10),
        Key::Home => app.move_selection(isize::MIN / 2),
        Key::End => app.move_selection(isize::MAX / 2),
        Key::Char('s') => {
            app.sort = app.sort.next();
            app.message = Some(format!("sorted by {}", app.sort.label()));
        }
        Key::Char('r') => match app.control_action(Action::Restart) {
            Ok(action) => app.overlay = Overlay::Confirm(action),
            Err(why) => app.message = Some(why),
        },
        Key::Char('k') => match app.control_action(Action::Stop) {
            Ok(action) => app.overlay = Overlay::Confirm(action),
            Err(why) => app.message = Some(why),
        },
        _ => {}
    }
    Action::None
}
