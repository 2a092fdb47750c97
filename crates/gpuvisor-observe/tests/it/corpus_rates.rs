//! Rates of `explain` on real logs: tests/corpus/manifest.toml lists logs copied from public
//! issue threads and forums (tests/corpus/logs/), each with its source, its failure class and
//! the rule whose fix resolved the thread. This test runs explain over every log and reports,
//! per class and separately for the tuning part and the held-out part (every 4th log, never
//! used to tune a rule):
//!
//! - detected: explain named some failure;
//! - right fix: the first finding (the likeliest cause) is the expected rule (or `rule/variant`);
//! - false alarms: a healthy log that raised anything.
//!
//! `cargo test -p gpuvisor-observe --test it corpus_rates -- --nocapture` prints the table
//! (docs/explain.md, "Rates on real logs"); misses are listed for the tuning part only
//! (GPUVISOR_CORPUS_SHOW_HELD_OUT=1 lists the held-out ones too, for after tuning).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use gpuvisor_observe::explain::{Finding, KnowledgeBase};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Manifest {
    log: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    file: String,
    source: String,
    class: String,
    #[serde(default)]
    expect: Vec<String>,
    fix: String,
    held_out: bool,
    /// The unseen batch the log came in with (docs/explain.md, "Rates on real logs"), scored
    /// on arrival before any rule changed for it; absent for logs from before batches were kept.
    #[serde(default)]
    batch: Option<u32>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    logs: u32,
    detected: u32,
    right: u32,
    false_alarms: u32,
    /// Failures nothing fired on whose closest rule (the "closest:" line) is the expected one.
    undetected_closest_right: u32,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.logs += other.logs;
        self.detected += other.detected;
        self.right += other.right;
        self.false_alarms += other.false_alarms;
        self.undetected_closest_right += other.undetected_closest_right;
    }
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn manifest() -> Manifest {
    let text = fs::read_to_string(corpus_dir().join("manifest.toml")).expect("read manifest");
    toml::from_str(&text).expect("parse manifest")
}

fn label(finding: &Finding) -> String {
    match &finding.variant {
        Some(variant) => format!("{}/{variant}", finding.rule),
        None => finding.rule.clone(),
    }
}

fn is_right(finding: &Finding, expect: &[String]) -> bool {
    let full = label(finding);
    expect.iter().any(|e| *e == full || *e == finding.rule)
}

const HEALTHY: &str = "healthy";

/// Per-(part, class) tallies, per-(batch, part) tallies of failure logs, and the miss lines.
struct Run {
    tallies: BTreeMap<(bool, String), Tally>,
    batches: BTreeMap<(u32, bool), Tally>,
    misses: Vec<String>,
}

/// Runs explain over every corpus log.
fn run() -> Run {
    let kb = KnowledgeBase::builtin();
    let show_held_out = std::env::var_os("GPUVISOR_CORPUS_SHOW_HELD_OUT").is_some();
    let mut tallies: BTreeMap<(bool, String), Tally> = BTreeMap::new();
    let mut batches: BTreeMap<(u32, bool), Tally> = BTreeMap::new();
    let mut misses = Vec::new();
    for entry in manifest().log {
        assert!(
            entry.source.starts_with("https://"),
            "{}: no source URL",
            entry.file
        );
        assert!(!entry.fix.is_empty(), "{}: no fix", entry.file);
        let path = corpus_dir().join("logs").join(&entry.file);
        let file = fs::File::open(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let report = kb.explain_reader(&entry.file, file).expect("read log");
        let found: Vec<String> = report.findings.iter().map(label).collect();
        let mut one = Tally {
            logs: 1,
            ..Tally::default()
        };
        if entry.class == HEALTHY {
            assert!(
                entry.expect.is_empty(),
                "{}: healthy with expect",
                entry.file
            );
            if !report.findings.is_empty() {
                one.false_alarms = 1;
            }
        } else {
            assert!(!entry.expect.is_empty(), "{}: no expect", entry.file);
            one.detected = u32::from(!report.findings.is_empty());
            one.right = u32::from(
                report
                    .findings
                    .first()
                    .is_some_and(|f| is_right(f, &entry.expect)),
            );
        }
        if entry.class != HEALTHY && one.detected == 0 {
            one.undetected_closest_right = u32::from(report.closest.as_ref().is_some_and(|near| {
                entry
                    .expect
                    .iter()
                    .any(|e| e.split('/').next() == Some(&near.rule))
            }));
        }
        let bad = one.false_alarms == 1 || (entry.class != HEALTHY && one.right == 0);
        // A false alarm is listed even on a held-out log: 0 false alarms is a hard floor, and
        // what fired (not the log's text) is what a fix needs.
        if bad && (!entry.held_out || show_held_out || one.false_alarms == 1) {
            let closest = report
                .closest
                .as_ref()
                .map_or(String::new(), |near| format!(", closest {}", near.rule));
            misses.push(format!(
                "{}{} [{}]: expected {:?}, found {:?}{closest}",
                if entry.held_out { "(held out) " } else { "" },
                entry.file,
                entry.class,
                entry.expect,
                found
            ));
        }
        if let (Some(batch), false) = (entry.batch, entry.class == HEALTHY) {
            batches.entry((batch, entry.held_out)).or_default().add(one);
        }
        tallies
            .entry((entry.held_out, entry.class.clone()))
            .or_default()
            .add(one);
    }
    Run {
        tallies,
        batches,
        misses,
    }
}

/// One line per unseen batch: its rate under today's rules, tuning and held-out positions apart.
fn batch_lines(batches: &BTreeMap<(u32, bool), Tally>) -> String {
    let mut out = String::new();
    let numbers: std::collections::BTreeSet<u32> = batches.keys().map(|(b, _)| *b).collect();
    for batch in numbers {
        let tune = batches.get(&(batch, false)).copied().unwrap_or_default();
        let held = batches.get(&(batch, true)).copied().unwrap_or_default();
        let mut all = tune;
        all.add(held);
        writeln!(
            out,
            "batch {batch}: {} failure logs, {} detected ({}), {} right fix ({}); tuning positions {}/{} and {}/{}, held-out positions {}/{} and {}/{}",
            all.logs,
            all.detected,
            pct(all.detected, all.logs),
            all.right,
            pct(all.right, all.logs),
            tune.detected,
            tune.logs,
            tune.right,
            tune.logs,
            held.detected,
            held.logs,
            held.right,
            held.logs,
        )
        .unwrap();
    }
    out
}

/// Each unseen batch's first score: measured when it arrived, before any rule changed for it
/// (docs/explain.md, "Rates on real logs"). Batches 1-3 came before the manifest kept batch
/// numbers. (batch, failure logs, detected, right fix.)
const FIRST_SCORES: [(u32, u32, u32, u32); 42] = [
    (1, 72, 49, 43),
    (2, 17, 7, 7),
    (3, 15, 12, 12),
    (4, 50, 33, 33),
    (5, 12, 11, 11),
    (6, 33, 25, 25),
    (7, 46, 30, 24),
    (8, 46, 22, 17),
    (9, 47, 45, 43),
    (10, 35, 35, 34),
    (11, 41, 30, 30),
    (12, 46, 41, 41),
    (13, 48, 44, 42),
    (14, 46, 39, 39),
    (15, 41, 33, 33),
    (16, 39, 30, 29),
    (17, 40, 37, 37),
    (18, 32, 27, 26),
    (19, 35, 28, 28),
    (20, 34, 26, 26),
    (21, 22, 21, 20),
    (22, 35, 30, 29),
    (23, 35, 17, 15),
    (24, 35, 26, 26),
    (25, 34, 27, 26),
    (26, 35, 26, 23),
    (27, 35, 25, 23),
    (28, 35, 30, 29),
    (29, 17, 17, 17),
    (30, 16, 14, 12),
    (31, 3, 1, 1),
    (32, 2, 2, 2),
    (33, 19, 17, 17),
    (34, 12, 5, 5),
    (35, 19, 11, 11),
    (36, 17, 14, 11),
    (37, 4, 2, 2),
    (38, 18, 17, 17),
    (39, 17, 12, 12),
    (40, 18, 8, 7),
    (42, 11, 7, 7),
    (43, 9, 7, 7),
];

/// The first scores, one line per batch and their sum: the honest figure for unseen logs.
/// A batch the manifest numbers must hold as many failure logs as its recorded first score.
fn first_score_lines(batches: &BTreeMap<(u32, bool), Tally>) -> String {
    let mut out = String::new();
    let (mut logs, mut detected, mut right) = (0, 0, 0);
    for (batch, n, d, r) in FIRST_SCORES {
        let in_manifest: u32 = [false, true]
            .iter()
            .filter_map(|held| batches.get(&(batch, *held)))
            .map(|t| t.logs)
            .sum();
        assert!(
            in_manifest == 0 || in_manifest == n,
            "batch {batch}: the manifest has {in_manifest} failure logs, its first score counted {n}"
        );
        writeln!(
            out,
            "batch {batch} first score: {d}/{n} detected ({}), {r}/{n} right fix ({})",
            pct(d, n),
            pct(r, n)
        )
        .unwrap();
        logs += n;
        detected += d;
        right += r;
    }
    writeln!(
        out,
        "all unseen batches, first scores: {detected}/{logs} detected ({}), {right}/{logs} right fix ({})",
        pct(detected, logs),
        pct(right, logs)
    )
    .unwrap();
    out
}

fn pct(n: u32, d: u32) -> String {
    if d == 0 {
        "-".into()
    } else {
        format!("{:.0}%", 100.0 * f64::from(n) / f64::from(d))
    }
}

fn table(tallies: &BTreeMap<(bool, String), Tally>) -> (String, Tally, Tally, Tally, Tally) {
    let classes: Vec<&String> = {
        let mut c: Vec<&String> = tallies.keys().map(|(_, c)| c).collect();
        c.sort();
        c.dedup();
        c
    };
    let mut out = String::new();
    out.push_str(
        "| class | tuning: logs | detected | right fix | held out: logs | detected | right fix |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|\n");
    let (mut tune, mut held, mut tune_h, mut held_h) = Default::default();
    for class in classes {
        let t = tallies
            .get(&(false, class.clone()))
            .copied()
            .unwrap_or_default();
        let h = tallies
            .get(&(true, class.clone()))
            .copied()
            .unwrap_or_default();
        let cell = |x: Tally| {
            if class == HEALTHY {
                (
                    format!("{}", x.logs),
                    format!("{} false alarms", x.false_alarms),
                    String::new(),
                )
            } else {
                (
                    format!("{}", x.logs),
                    format!("{} ({})", x.detected, pct(x.detected, x.logs)),
                    format!("{} ({})", x.right, pct(x.right, x.logs)),
                )
            }
        };
        let (a, b, c) = cell(t);
        let (d, e, f) = cell(h);
        writeln!(out, "| {class} | {a} | {b} | {c} | {d} | {e} | {f} |").unwrap();
        if class == HEALTHY {
            Tally::add(&mut tune_h, t);
            Tally::add(&mut held_h, h);
        } else {
            Tally::add(&mut tune, t);
            Tally::add(&mut held, h);
        }
    }
    let total = |x: Tally| {
        (
            format!("{}", x.logs),
            format!("{} ({})", x.detected, pct(x.detected, x.logs)),
            format!("{} ({})", x.right, pct(x.right, x.logs)),
        )
    };
    let (a, b, c) = total(tune);
    let (d, e, f) = total(held);
    writeln!(
        out,
        "| **all failures** | {a} | {b} | {c} | {d} | {e} | {f} |"
    )
    .unwrap();
    (out, tune, held, tune_h, held_h)
}

#[test]
fn rates_on_real_logs() {
    let Run {
        tallies,
        batches,
        misses,
    } = run();
    let (text, tune, held, tune_h, held_h) = table(&tallies);
    println!("{text}");
    print!("{}", batch_lines(&batches));
    print!("{}", first_score_lines(&batches));
    for (part, tally) in [("tuning", tune), ("held out", held)] {
        println!(
            "{part}: {} undetected, {} of them name the right class as the closest",
            tally.logs - tally.detected,
            tally.undetected_closest_right
        );
    }
    if !misses.is_empty() {
        println!("misses:\n  {}", misses.join("\n  "));
    }
    // Floors as measured (docs/explain.md, "Rates on real logs"): a change that makes explain
    // worse on real logs fails here; raise them as rules improve.
    let floor = |what: &str, got: u32, of: u32, min: f64| {
        let rate = f64::from(got) / f64::from(of.max(1));
        assert!(
            rate >= min,
            "{what}: {got}/{of} = {:.0}% is below the floor {:.0}%",
            rate * 100.0,
            min * 100.0
        );
    };
    // After batches 7 and 8 were tuned on (their tuning positions only): 264/264 and 263/264
    // tuning, 75/84 and 74/84 held out. With batch 9 added untuned: 296/298 and 294/298 tuning,
    // 87/97 and 85/97 held out. With batch 10 added untuned: 325/326 and 322/326 tuning, 94/104
    // and 92/104 held out. With batch 11 added untuned: 346/356 and 343/356 tuning, 103/115 and
    // 101/115 held out. After tuning on batch 11's tuning positions: 352/356 and 349/356
    // tuning, 104/115 and 102/115 held out. With batch 12 added untuned: 383/390 and 380/390
    // tuning, 114/127 and 112/127 held out. With batch 14 added untuned: 451/461 and 451/461
    // tuning, 136/150 and 134/150 held out. With batch 15 added untuned: 480/493 and 480/493
    // tuning, 145/159 and 143/159 held out. After tuning on batch 15's tuning positions:
    // 486/493 and 486/493 tuning, 147/159 and 145/159 held out. After the c10d / TensorFlow
    // source-message rules: 489/493 and 489/493, 148/159 and 146/159. With batch 16 added
    // untuned: 509/522 and 508/522 tuning, 158/169 and 156/169 held out. After tuning on batch
    // 16's tuning positions: 515/522 and 514/522 tuning, 159/169 and 157/169 held out. With
    // batch 17 added untuned: 542/552 and 541/552 tuning, 169/179 and 167/179 held out. After
    // tuning on batch 17's tuning positions: 544/552 and 543/552, held out unchanged. With batch
    // 18 added untuned: 565/576 and 563/576 tuning, 175/187 and 173/187 held out. After tuning
    // on batch 18's tuning positions: 566/576 and 565/576, held out unchanged. With batch 19
    // added untuned: 587/602 and 586/602 tuning, 182/196 and 180/196 held out. After tuning on
    // batch 19's tuning positions: 589/602 and 588/602, held out unchanged. With batch 21
    // added untuned: 604/618 and 602/618 tuning, 188/202 and 186/202 held out. With batch 22
    // added untuned: 627/644 and 625/644 tuning, 195/211 and 192/211 held out. After tuning on
    // batches 21 and 22's tuning positions: 633/644 and 631/644, 197/211 and 194/211. With batch
    // 20 added untuned: 655/671 and 653/671 tuning, 201/218 and 198/218 held out. After tuning
    // on batch 20's tuning positions and library messages: 661/671 and 658/671, 202/218 and
    // 199/218. With batch 24 added untuned: 681/696 and 678/696, 208/228 and 205/228. After
    // tuning on batch 24's tuning positions: 686/696 and 683/696, 210/228 and 207/228. With
    // batches 23 and 25 added untuned: 718/747 and 713/747, 222/246 and 218/246. After tuning on
    // their tuning positions and the source sweep: 731/747 and 727/747, 224/246 and 220/246.
    // With batch 27 added untuned: 751/776 and 746/776, 229/252 and 224/252. With batches 26
    // and 28 added untuned: 793/828 and 786/828, 243/270 and 236/270 (floors lowered until their
    // tuning misses are read). After tuning on their tuning positions and moving the second
    // source sweep into the table with its patterns: 806/828 and 800/828, 246/270 and 239/270.
    // With the nvidia-smi table rule: 810/828 and 804/828, held out unchanged. With batches 29
    // and 30 added untuned: 835/855 and 827/855, 252/276 and 245/276. After tuning on batch
    // 30's tuning positions: 837/855 and 830/855, 252/276 and 246/276. With batches 31 and 32
    // (5 failure logs) added untuned: 840/859 and 833/859, 252/277 and 246/277.
    // After batch 31's tuning miss, and ranks-on-first-gpu no longer reading the first GPU's
    // rows alone: 839/859 and 832/859, held out unchanged. With batches 35 and 36 added
    // untuned: 857/887 and 848/887, 259/285 and 252/285. After tuning on their tuning positions
    // (the drivers', containers', loaders' and zsh's own wording): 863/887 and 854/887, 260/285
    // and 253/285. With batches 33 and 34 added untuned: 880/911 and 871/911, 265/292 and
    // 258/292. After tuning on their tuning positions (NCCL's older socket WARNs, SIGBUS in
    // NCCL's shared memory): 886/911 and 877/911, held out unchanged. With batches 37 to 40
    // added untuned: 918/957 and 909/957, 272/303 and 265/303 (floors lowered until their
    // tuning misses are read). After cuSolver's internal error became a library mismatch and
    // batches 37 to 40's other tuning misses were read: 932/957 and 923/957, 276/303 and 269/303.
    // With the fourth source sweep's patterns: tuning unchanged, 277/303 and 270/303.
    floor("tuning: detected", tune.detected, tune.logs, 0.97);
    floor("tuning: right fix", tune.right, tune.logs, 0.96);
    floor("held out: detected", held.detected, held.logs, 0.90);
    floor("held out: right fix", held.right, held.logs, 0.88);
    assert_eq!(
        tune_h.false_alarms + held_h.false_alarms,
        0,
        "healthy logs raised findings"
    );
}

#[test]
fn every_corpus_log_is_in_the_manifest() {
    let listed: Vec<String> = manifest().log.into_iter().map(|e| e.file).collect();
    for entry in fs::read_dir(corpus_dir().join("logs")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            listed.contains(&name),
            "tests/corpus/logs/{name} is not in the manifest"
        );
    }
}

/// The lines users paste (product brief, "S6: lines users paste"), each alone: explain names the
/// rule whose fix applies.
#[test]
fn product_brief_lines_are_recognised() {
    let lines = [
        (
            "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Custom call 'xla.gpu.custom_call' failed: gpuGetLastError(): out of memory",
            "jax-outside-pool-oom",
        ),
        ("RuntimeError: RESOURCE_EXHAUSTED: Out of memory", "jax-oom"),
        ("RuntimeError: Failed to allocate memory", "jax-oom"),
        ("torch.OutOfMemoryError: CUDA out of memory", "torch-oom"),
        (
            "resource_tracker: There appear to be 4 leaked semaphore objects to clean up at shutdown",
            "leaked-semaphores",
        ),
        (
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "cuda-illegal-address",
        ),
    ];
    for (line, rule) in lines {
        let report = KnowledgeBase::builtin().explain_text("s6", line);
        let first = report.findings.first().map(|f| f.rule.as_str());
        assert_eq!(first, Some(rule), "{line}");
    }
}
