//! Tests of `top`: frames rendered into ratatui's TestBackend (insta snapshots of the text),
//! keys, the memory bar's arithmetic, and the run-directory source against a fake supervisor
//! socket.

use std::collections::VecDeque;

use super::app::{handle_key, Action, Key, Overlay, SortKey, TopApp};
use super::model::{EventLine, GpuView, LogLine, ProcessRow, Segment, Tone, TopModel};
use super::render::render_to_text;

const GIB: u64 = 1 << 30;

fn row(key: &str, name: &str, replica: Option<u32>, used: u64, budget: u64) -> ProcessRow {
    ProcessRow {
        key: key.to_string(),
        name: name.to_string(),
        replica,
        pid: Some(4000 + key.len() as u32 * 10 + replica.unwrap_or(0)),
        state: "running".to_string(),
        gpu_used_bytes: Some(used),
        budget_bytes: Some(budget),
        gpu_peak_bytes: Some(used + GIB / 2),
        cpu_percent: Some(12.0 * (replica.unwrap_or(0) + 1) as f32),
        rss_bytes: Some(3 * GIB / 2),
        since_log_secs: Some(2),
        ..ProcessRow::default()
    }
}

/// The S3 layout: learner 30%, two actors 10% each, a simulator with the rest, one GPU;
/// a second GPU with a single trainer over its budget.
fn s3_model() -> TopModel {
    let mut rows = vec![
        row("learner", "learner", None, 20 * GIB, 24 * GIB),
        row("actor[0]", "actor", Some(0), 7 * GIB, 8 * GIB),
        row("actor[1]", "actor", Some(1), 3 * GIB, 8 * GIB),
        row("sim", "sim", None, 30 * GIB, 38 * GIB),
        row("eval", "eval", None, 12 * GIB, 10 * GIB),
    ];
    rows[2].state = "backoff".to_string();
    rows[2].restarts = 2;
    rows[2].pid = None;
    rows[2].cpu_percent = None;
    rows[0].gpu_util_percent = Some(55);
    rows[3].gpu_util_percent = Some(32);
    rows[3].stall = Some("gpu-bound".to_string());
    rows[3].since_log_secs = Some(900);
    // A context's worth uncharged on the learner; the simulator's past its untracked_alarm.
    rows[0].untracked_bytes = Some(GIB / 2);
    rows[3].untracked_bytes = Some(4 * GIB);
    rows[3].untracked_alarm = true;
    let segment = |label: &str, used: u64, budget: u64| Segment {
        label: label.to_string(),
        used_bytes: used,
        budget_bytes: Some(budget),
    };
    TopModel {
        title: "runs/isaac-rl-20261122T001500Z".to_string(),
        source_note: "live".to_string(),
        supervised: true,
        gpus: vec![
            GpuView {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".to_string(),
                total_bytes: 80 * GIB,
                used_bytes: Some(62 * GIB),
                segments: vec![
                    segment("learner", 20 * GIB, 24 * GIB),
                    segment("actor[0]", 7 * GIB, 8 * GIB),
                    segment("actor[1]", 3 * GIB, 8 * GIB),
                    segment("sim", 30 * GIB, 38 * GIB),
                ],
                util_history: VecDeque::from(vec![10, 40, 80, 95, 60, 87]),
            },
            GpuView {
                index: 1,
                name: "NVIDIA H100 80GB HBM3".to_string(),
                total_bytes: 80 * GIB,
                used_bytes: None,
                segments: vec![segment("eval", 12 * GIB, 10 * GIB)],
                util_history: VecDeque::new(),
            },
        ],
        rows,
        events: vec![
            EventLine {
                time: "00:15:01".into(),
                kind: "start".into(),
                tone: Tone::Good,
                text: "learner pid 4071".into(),
            },
            EventLine {
                time: "00:16:40".into(),
                kind: "exit".into(),
                tone: Tone::Bad,
                text: "actor[1] exit code 1 (cuda-oom)".into(),
            },
            EventLine {
                time: "00:16:40".into(),
                kind: "restart".into(),
                tone: Tone::Notice,
                text: "actor in 2000 ms (policy)".into(),
            },
        ],
        log_tail: vec![
            LogLine {
                time: "00:16:58".into(),
                stderr: false,
                text: "step 1200 loss 0.31".into(),
            },
            LogLine {
                time: "00:16:59".into(),
                stderr: true,
                text: "W0000 slow host transfer".into(),
            },
        ],
        log_title: "logs/learner.log".to_string(),
        warning: None,
    }
}

fn frame(app: &TopApp) -> String {
    render_to_text(app, 110, 34)
}

#[test]
fn main_screen_shows_bars_budgets_table_events_and_log() {
    let app = TopApp::new(s3_model(), false);
    let text = frame(&app);
    insta::assert_snapshot!("main_screen", text);
    // Not only the snapshot: the facts a user reads off the screen.
    assert!(
        text.contains("GPU0 NVIDIA H100 80GB HBM3  62.0G / 80.0G"),
        "{text}"
    );
    assert!(text.contains("util  87%"), "{text}");
    assert!(text.contains("util   n/a"), "{text}");
    assert!(text.contains("█ learner 20.0G/24.0G"), "{text}");
    assert!(
        text.contains("▶ learner"),
        "the first row is selected:\n{text}"
    );
    assert!(text.contains("actor[1] exit code 1 (cuda-oom)"), "{text}");
    assert!(text.contains("step 1200 loss 0.31"), "{text}");
    let sim = text.lines().find(|line| line.contains("  sim ")).unwrap();
    assert!(
        sim.contains("stall: gpu-bound") && sim.contains("15m"),
        "{sim}"
    );
}

#[test]
fn the_bar_is_proportional_with_budget_marks_and_other_memory() {
    let app = TopApp::new(s3_model(), false);
    let text = render_to_text(&app, 82, 30);
    // 80 cells for 80 GiB: one cell per GiB.
    let bar = text.lines().nth(2).expect("GPU0's bar").to_string();
    let inner: Vec<char> = bar.trim_start_matches('[').chars().take(80).collect();
    let count = |glyph: char| inner.iter().filter(|&&c| c == glyph).count();
    // learner: 20 used of 24 (last budget cell is the mark): 20 fill, 3 unused, 1 mark.
    assert_eq!(&inner[..20], &['█'; 20][..], "{bar}");
    assert_eq!(&inner[20..23], &['·'; 3][..], "{bar}");
    assert_eq!(inner[23], '▕', "{bar}");
    // actor[0] 7 of 8 from cell 24; actor[1] 3 of 8 from 32; sim 30 of 38 from 40.
    assert_eq!(count('▓'), 7, "{bar}");
    assert_eq!(count('▒'), 3, "{bar}");
    assert_eq!(count('#'), 30, "{bar}");
    assert_eq!(count('▕'), 4, "{bar}");
    // 62 GiB used, 60 held by the job: 2 cells of others right after the last budget (78).
    assert_eq!(&inner[78..80], &['░'; 2][..], "{bar}");
}

#[test]
fn over_budget_memory_runs_past_the_mark() {
    let app = TopApp::new(s3_model(), false);
    let text = render_to_text(&app, 82, 30);
    let bar = text.lines().nth(5).expect("GPU1's bar");
    let inner: Vec<char> = bar.trim_start_matches('[').chars().take(80).collect();
    // 12 GiB used with a 10 GiB budget: the mark sits at cell 9, the fill goes on to 12.
    assert_eq!(inner[9], '▕', "{bar}");
    assert_eq!(inner.iter().filter(|&&c| c == '█').count(), 11, "{bar}");
    assert_eq!(inner[12], ' ', "{bar}");
}

#[test]
fn help_overlay_opens_and_any_key_closes_it() {
    let mut app = TopApp::new(s3_model(), false);
    assert_eq!(handle_key(&mut app, Key::Char('?')), Action::None);
    assert_eq!(app.overlay, Overlay::Help);
    let text = frame(&app);
    insta::assert_snapshot!("help_overlay", text);
    assert!(text.contains("restart the selected process"), "{text}");
    assert_eq!(handle_key(&mut app, Key::Down), Action::None);
    assert_eq!(app.overlay, Overlay::None);
    // The key that closed the help did not also move the selection.
    assert_eq!(app.selected.as_deref(), Some("learner"));
}

#[test]
fn restart_asks_first_and_names_every_replica() {
    let mut app = TopApp::new(s3_model(), false);
    handle_key(&mut app, Key::Down);
    assert_eq!(app.selected.as_deref(), Some("actor[0]"));
    assert_eq!(handle_key(&mut app, Key::Char('r')), Action::None);
    let text = frame(&app);
    insta::assert_snapshot!("confirm_restart", text);
    assert!(text.contains("Restart actor (all 2 replicas)?"), "{text}");
    assert_eq!(
        handle_key(&mut app, Key::Char('y')),
        Action::Restart("actor".to_string())
    );
    assert_eq!(app.overlay, Overlay::None);
}

#[test]
fn stop_is_cancelled_by_any_other_key() {
    let mut app = TopApp::new(s3_model(), false);
    handle_key(&mut app, Key::End);
    assert_eq!(app.selected.as_deref(), Some("eval"));
    handle_key(&mut app, Key::Char('k'));
    assert_eq!(
        app.overlay,
        Overlay::Confirm(Action::Stop("eval".to_string()))
    );
    assert_eq!(handle_key(&mut app, Key::Char('n')), Action::None);
    assert_eq!(app.overlay, Overlay::None);
    assert_eq!(app.message.as_deref(), Some("cancelled"));
    handle_key(&mut app, Key::Char('k'));
    assert_eq!(
        handle_key(&mut app, Key::Enter),
        Action::Stop("eval".to_string())
    );
}

#[test]
fn machine_wide_rows_cannot_be_restarted() {
    let mut model = s3_model();
    model.supervised = false;
    let mut app = TopApp::new(model, false);
    assert_eq!(handle_key(&mut app, Key::Char('r')), Action::None);
    assert_eq!(app.overlay, Overlay::None);
    assert!(app.message.as_deref().unwrap().contains("gpuvisor top RUN"));
}

#[test]
fn sort_cycles_and_selection_follows_the_row() {
    let mut app = TopApp::new(s3_model(), false);
    handle_key(&mut app, Key::Down); // actor[0]
    handle_key(&mut app, Key::Char('s'));
    assert_eq!(app.sort, SortKey::Memory);
    let order: Vec<&str> = app.sorted_rows().iter().map(|r| r.key.as_str()).collect();
    assert_eq!(order, ["sim", "learner", "eval", "actor[0]", "actor[1]"]);
    // Still actor[0], now fourth.
    assert_eq!(app.selected.as_deref(), Some("actor[0]"));
    assert_eq!(app.selected_index(), Some(3));
    let text = frame(&app);
    insta::assert_snapshot!("sorted_by_memory", text);
    assert!(text.contains("s sort:memory"), "{text}");
    for _ in 0..3 {
        handle_key(&mut app, Key::Char('s'));
    }
    assert_eq!(app.sort, SortKey::Restarts);
    assert_eq!(app.sorted_rows()[0].key, "actor[1]");
    handle_key(&mut app, Key::Char('s'));
    handle_key(&mut app, Key::Char('s'));
    assert_eq!(app.sort, SortKey::Plan);
}

#[test]
fn selection_survives_a_refresh_and_falls_back_when_its_row_goes() {
    let mut app = TopApp::new(s3_model(), false);
    handle_key(&mut app, Key::Down);
    handle_key(&mut app, Key::Down);
    assert_eq!(app.selected.as_deref(), Some("actor[1]"));
    app.set_model(s3_model());
    assert_eq!(app.selected.as_deref(), Some("actor[1]"));
    let mut smaller = s3_model();
    smaller.rows.retain(|row| row.key != "actor[1]");
    app.set_model(smaller);
    assert_eq!(app.selected.as_deref(), Some("learner"));
    // Up at the top stays at the top.
    handle_key(&mut app, Key::Up);
    assert_eq!(app.selected.as_deref(), Some("learner"));
}

#[test]
fn enter_gives_the_log_the_focus_and_arrows_scroll_it() {
    let mut app = TopApp::new(s3_model(), false);
    handle_key(&mut app, Key::Enter);
    assert!(app.log_focus);
    handle_key(&mut app, Key::Up);
    assert_eq!(app.log_scroll, 1);
    assert_eq!(
        app.selected.as_deref(),
        Some("learner"),
        "arrows scroll, not select"
    );
    let text = frame(&app);
    assert!(text.contains("log: logs/learner.log (-1) [focus"), "{text}");
    // Scrolled up one line: the last line is hidden, the one before shows.
    assert!(text.contains("step 1200 loss 0.31"), "{text}");
    assert!(!text.contains("slow host transfer"), "{text}");
    handle_key(&mut app, Key::Down);
    let text = frame(&app);
    insta::assert_snapshot!("log_focus", text);
    assert!(text.contains("slow host transfer"), "{text}");
    handle_key(&mut app, Key::Esc);
    assert!(!app.log_focus);
    assert_eq!(handle_key(&mut app, Key::Char('q')), Action::Quit);
}

#[test]
fn many_gpus_get_one_line_each() {
    let mut model = s3_model();
    let template = model.gpus[0].clone();
    model.gpus = (0..8)
        .map(|index| GpuView {
            index,
            ..template.clone()
        })
        .collect();
    let app = TopApp::new(model, false);
    let text = render_to_text(&app, 100, 30);
    for index in 0..8 {
        assert!(text.contains(&format!("GPU{index} █")), "{text}");
    }
    assert!(text.contains("NAME"), "the table still shows:\n{text}");
}

#[test]
fn an_empty_machine_says_so() {
    let model = TopModel {
        title: "all GPU processes on this machine".into(),
        source_note: "simulated: 1x80GiB".into(),
        gpus: vec![GpuView {
            index: 0,
            name: "Simulated GPU".into(),
            total_bytes: 80 * GIB,
            used_bytes: Some(0),
            ..GpuView::default()
        }],
        log_title: "none".into(),
        ..TopModel::default()
    };
    let app = TopApp::new(model, false);
    let text = render_to_text(&app, 90, 20);
    insta::assert_snapshot!("empty_machine", text);
    assert!(text.contains("no process holds GPU memory"), "{text}");
    assert!(text.contains("no events"), "{text}");
}

#[test]
fn colours_do_not_change_the_text() {
    let plain = frame(&TopApp::new(s3_model(), false));
    let coloured = frame(&TopApp::new(s3_model(), true));
    // With colours every holder fills with █ (told apart by colour); the rest is the same.
    let strip = |text: &str| text.replace(['▓', '▒', '#'], "█");
    assert_eq!(strip(&plain), strip(&coloured));
}

#[test]
fn under_run_tui_quitting_asks_because_it_stops_the_job() {
    let mut app = TopApp::new(s3_model(), false);
    app.quit_stops_job = true;
    assert_eq!(handle_key(&mut app, Key::Char('q')), Action::None);
    let text = frame(&app);
    assert!(text.contains("Stop the whole job and quit?"), "{text}");
    assert_eq!(handle_key(&mut app, Key::Char('n')), Action::None);
    handle_key(&mut app, Key::Char('q'));
    assert_eq!(handle_key(&mut app, Key::Char('y')), Action::Quit);
    handle_key(&mut app, Key::Char('?'));
    assert!(frame(&app).contains("stop the job and quit"));
    // Ctrl-C is the plain `run`'s Ctrl-C: no question.
    assert_eq!(handle_key(&mut app, Key::CtrlC), Action::Quit);
}

#[test]
fn any_screen_size_draws_without_panicking() {
    let mut app = TopApp::new(s3_model(), true);
    for overlay in [
        Overlay::None,
        Overlay::Help,
        Overlay::Confirm(Action::Restart("actor".into())),
    ] {
        app.overlay = overlay;
        for log_focus in [false, true] {
            app.log_focus = log_focus;
            app.log_scroll = 7;
            for width in [1, 2, 5, 11, 20, 33, 60, 140] {
                for height in [1, 2, 3, 5, 8, 13, 40] {
                    let text = render_to_text(&app, width, height);
                    assert_eq!(text.lines().count(), height as usize);
                }
            }
        }
    }
}

#[test]
fn colours_are_drawn_only_when_asked_for() {
    use ratatui::style::Color;
    let cell_colours = |color: bool| {
        let app = TopApp::new(s3_model(), color);
        let mut terminal =
            ratatui::Terminal::new(ratatui::backend::TestBackend::new(110, 34)).unwrap();
        terminal
            .draw(|frame| super::render::render(frame, &app))
            .unwrap();
        let buffer = terminal.backend().buffer().clone();
        // The bar's first cell (the learner's fill) and actor[0]'s first cell (cell 24 of
        // 80 GiB in 108 cells: 32).
        (buffer[(1, 2)].fg, buffer[(1 + 32, 2)].fg)
    };
    assert_eq!(cell_colours(true), (Color::Cyan, Color::Green));
    assert_eq!(cell_colours(false), (Color::Reset, Color::Reset));
}

#[test]
fn no_color_and_dumb_terminals_get_no_colours() {
    use super::terminal::color_wanted;
    assert!(color_wanted(None, Some("xterm-256color")));
    assert!(!color_wanted(Some("1"), Some("xterm-256color")));
    assert!(
        color_wanted(Some(""), Some("xterm")),
        "an empty NO_COLOR does not count"
    );
    assert!(!color_wanted(None, Some("dumb")));
    assert!(!color_wanted(None, None));
}

#[test]
fn a_cpu_only_replica_shows_no_gpu_figures() {
    let mut model = s3_model();
    model.rows = vec![row("collector", "collector", None, 0, 0)];
    model.rows[0].gpu_peak_bytes = None;
    let text = frame(&TopApp::new(model, false));
    let line = text.lines().find(|l| l.contains("collector")).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    // ▶ collector - PID running MEM PEAK GPU% ...
    assert_eq!(&fields[5..8], ["-", "-", "-"], "{line}");
}

mod record_tests;
mod source_tests;
