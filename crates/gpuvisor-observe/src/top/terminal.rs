//! The interactive loop of `gpuvisor top` on a real terminal: raw mode and the alternate
//! screen (restored on every way out, panics included), a poll of the source each interval,
//! and keys handled as they come.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::prelude::CrosstermBackend;
use ratatui::Terminal;

use super::app::{handle_key, Action, Key, TopApp};
use super::render::{render, render_to_text};
use super::source::TopSource;

/// Whether to draw with colours: not when `NO_COLOR` is set (no-color.org) or the terminal
/// is `dumb` or unknown.
pub fn color_supported() -> bool {
    color_wanted(
        std::env::var("NO_COLOR").ok().as_deref(),
        std::env::var("TERM").ok().as_deref(),
    )
}

/// [`color_supported`] for given values of `NO_COLOR` and `TERM`.
pub fn color_wanted(no_color: Option<&str>, term: Option<&str>) -> bool {
    let no_color = no_color.is_some_and(|value| !value.is_empty());
    let term = term.unwrap_or_default();
    !no_color && !term.is_empty() && term != "dumb"
}

/// The terminal's size when standard output is one, for `--once`.
pub fn screen_size() -> Option<(u16, u16)> {
    use std::io::IsTerminal;
    if !io::stdout().is_terminal() {
        return None;
    }
    ratatui::crossterm::terminal::size()
        .ok()
        .filter(|&(width, height)| width > 0 && height > 0)
}

/// One frame as text: a single poll of the source rendered at `width` × `height`.
pub fn render_once(source: &mut dyn TopSource, width: u16, height: u16) -> String {
    let mut app = TopApp::new(source.poll(None), false);
    // The log tail is of the selected row, which is known only after the first poll.
    if app.selected.is_some() {
        let model = source.poll(app.selected.as_deref());
        app.set_model(model);
    }
    render_to_text(&app, width, height)
}

/// Puts the terminal back however the loop ends.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = disable_raw_mode();
        let _ = execute!(
            io::stdout(),
            LeaveAlternateScreen,
            ratatui::crossterm::cursor::Show
        );
    }
}

/// How the interactive loop runs.
#[derive(Debug, Clone, Default)]
pub struct LoopOptions {
    /// Time between polls of the source.
    pub interval: Duration,
    /// Set by someone else when the view should close (the job of `run --tui` ended).
    pub finished: Option<Arc<AtomicBool>>,
    /// Quitting stops the job (`run --tui`): `q` asks first.
    pub quit_stops_job: bool,
}

/// Why the interactive loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopEnd {
    /// The user quit (`q`, Ctrl-C).
    Quit,
    /// [`LoopOptions::finished`] was set.
    Finished,
}

/// Runs `top` until the user quits (or `options.finished` is set), polling `source` every
/// `options.interval`.
pub fn run_interactive(source: &mut dyn TopSource, options: &LoopOptions) -> io::Result<LoopEnd> {
    let interval = options.interval;
    let finished = || {
        options
            .finished
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::SeqCst))
    };
    let color = color_supported();
    enable_raw_mode()?;
    let _restore = Restore;
    execute!(io::stdout(), EnterAlternateScreen)?;
    let mut terminal = Terminal::new(CrosstermBackend::new(io::stdout()))?;
    terminal.clear()?;

    let mut app = TopApp::new(source.poll(None), color);
    app.quit_stops_job = options.quit_stops_job;
    let mut next_poll = Instant::now();
    // Drawn only after a poll, a key or a resize: an idle view costs nothing between ticks.
    let mut dirty = true;
    loop {
        if finished() {
            return Ok(LoopEnd::Finished);
        }
        if Instant::now() >= next_poll {
            let model = source.poll(app.selected.as_deref());
            app.set_model(model);
            next_poll = Instant::now() + interval;
            dirty = true;
        }
        if std::mem::take(&mut dirty) {
            terminal.draw(|frame| render(frame, &app))?;
        }
        // Wake at least every 100 ms to notice `finished`.
        let wait = next_poll
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        if !event::poll(wait)? {
            continue;
        }
        dirty = true;
        let Event::Key(key_event) = event::read()? else {
            // A resize: redrawn at the top of the loop.
            continue;
        };
        if key_event.kind == KeyEventKind::Release {
            continue;
        }
        let key = match key_event.code {
            KeyCode::Char('c') if key_event.modifiers.contains(KeyModifiers::CONTROL) => Key::CtrlC,
            KeyCode::Char(c) => Key::Char(c),
            KeyCode::Up => Key::Up,
            KeyCode::Down => Key::Down,
            KeyCode::PageUp => Key::PageUp,
            KeyCode::PageDown => Key::PageDown,
            KeyCode::Home => Key::Home,
            KeyCode::End => Key::End,
            KeyCode::Enter => Key::Enter,
            KeyCode::Esc => Key::Esc,
            _ => continue,
        };
        let selected_before = app.selected.clone();
        match handle_key(&mut app, key) {
            Action::Quit => return Ok(LoopEnd::Quit),
            Action::None => {}
            action => {
                app.message = Some(match source.act(&action) {
                    Ok(message) => message,
                    Err(error) => format!("failed: {error}"),
                });
                next_poll = Instant::now();
            }
        }
        // Another row's log tail is needed now, not at the next tick.
        if app.selected != selected_before {
            next_poll = Instant::now();
        }
    }
}
