//! Analyses that read a table rather than one line: nvidia-smi's process table, pasted into an
//! issue, shows which processes hold memory on which GPU. One line says nothing; the rows
//! together show a job whose ranks each made a context on the first GPU besides their own.
//!
//! A rule names one of these with `analysis = "..."` (listed in `rules::ROW_ANALYSES`); its
//! patterns' capture groups are the row's fields, and the rule fires only if the analysis
//! returns a reading.

use std::collections::BTreeMap;

use super::scan::Row;

/// What a table-reading analysis found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowReading {
    /// The rows' figures spelled out, with what they imply.
    pub text: String,
    /// The lines that show it (evidence).
    pub lines: Vec<u64>,
}

/// Runs table analysis `name` over `rows`.
pub fn read_rows(name: &str, rows: &[&Row]) -> Option<RowReading> {
    match name {
        "ranks-on-first-gpu" => ranks_on_first_gpu(&process_rows(rows)),
        _ => None,
    }
}

/// One row of nvidia-smi's process table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcessRow {
    gpu: u32,
    pid: u64,
    mib: u64,
    line: u64,
}

/// Fields 1-3 of each row: GPU index, process id, MiB used. Rows that do not parse (an "N/A"
/// size never matches the pattern) are left out; a table printed twice counts once.
fn process_rows(rows: &[&Row]) -> Vec<ProcessRow> {
    let mut seen = BTreeMap::new();
    for row in rows {
        let field = |at: usize| row.fields.get(at).and_then(|text| text.parse().ok());
        let (Some(gpu), Some(pid), Some(mib)) = (field(0), field(1), field(2)) else {
            continue;
        };
        seen.entry((gpu as u32, pid)).or_insert(ProcessRow {
            gpu: gpu as u32,
            pid,
            mib,
            line: row.line,
        });
    }
    seen.into_values().collect()
}

/// One job's ranks on the first GPU listed (the lowest index: with CUDA_VISIBLE_DEVICES=5,6,7,8
/// that is GPU 5): two or more processes hold memory there *and* more on another GPU, so each
/// is a rank with a GPU of its own that also made a context (or put tensors) on the first one.
///
/// Not read from the first GPU's rows alone (several alike small processes started together
/// beside a large one): on a one-GPU machine that is a learner with its actors, each with a
/// context on purpose, and a pasted table rarely shows whether other GPUs exist.
fn ranks_on_first_gpu(rows: &[ProcessRow]) -> Option<RowReading> {
    let first = rows.iter().map(|row| row.gpu).min()?;
    let mut on_first: BTreeMap<u64, ProcessRow> = BTreeMap::new();
    let mut elsewhere: BTreeMap<u64, u64> = BTreeMap::new();
    for row in rows {
        if row.gpu == first {
            on_first.insert(row.pid, *row);
        } else {
            let most = elsewhere.entry(row.pid).or_default();
            *most = (*most).max(row.mib);
        }
    }
    let shared: Vec<&ProcessRow> = on_first
        .values()
        .filter(|row| elsewhere.get(&row.pid).is_some_and(|&own| row.mib < own))
        .collect();
    if shared.len() < 2 {
        return None;
    }
    let largest = shared.iter().map(|row| row.mib).max().unwrap_or(0);
    Some(RowReading {
        text: format!(
            "{} processes hold up to {largest} MiB each on GPU {first} and more on a GPU of their own: they are this job's ranks, each with a context on GPU {first} too",
            shared.len()
        ),
        lines: shared.iter().map(|row| row.line).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(table: &[(u32, u64, u64)]) -> Vec<Row> {
        table
            .iter()
            .enumerate()
            .map(|(at, &(gpu, pid, mib))| Row {
                line: at as u64 + 1,
                text: format!("|    {gpu}   N/A  N/A   {pid}   C   python   {mib}MiB |"),
                fields: vec![gpu.to_string(), pid.to_string(), mib.to_string()],
            })
            .collect()
    }

    fn read(table: &[(u32, u64, u64)]) -> Option<RowReading> {
        let rows = rows(table);
        let refs: Vec<&Row> = rows.iter().collect();
        read_rows("ranks-on-first-gpu", &refs)
    }

    #[test]
    fn ranks_with_a_gpu_of_their_own_and_a_context_on_the_first() {
        let reading = read(&[
            (0, 100, 9000),
            (0, 101, 500),
            (0, 102, 500),
            (1, 101, 9100),
            (2, 102, 9050),
        ])
        .expect("a reading");
        assert_eq!(reading.lines, vec![2, 3]);
        assert!(reading
            .text
            .starts_with("2 processes hold up to 500 MiB each on GPU 0"));
    }

    #[test]
    fn the_first_visible_gpu_need_not_be_gpu_0() {
        let reading = read(&[
            (5, 10, 2800),
            (5, 11, 1300),
            (5, 12, 1300),
            (6, 11, 2900),
            (7, 12, 2900),
        ])
        .expect("a reading");
        assert!(reading.text.contains("on GPU 5"));
    }

    #[test]
    fn one_process_per_gpu_is_healthy() {
        assert_eq!(
            read(&[(0, 100, 9000), (1, 101, 9000), (2, 102, 9000)]),
            None
        );
    }

    #[test]
    fn one_process_spanning_every_gpu_is_not_ranks() {
        assert_eq!(
            read(&[(0, 100, 9000), (1, 100, 9000), (2, 100, 9000)]),
            None
        );
    }

    #[test]
    fn a_learner_and_its_actors_on_one_gpu_are_not_ranks() {
        // Alike small processes started together beside a large one, the first GPU only: a
        // one-GPU machine's learner and actors look the same as ranks whose own GPUs were not
        // pasted, so nothing is read from it.
        assert_eq!(
            read(&[
                (0, 62250, 4903),
                (0, 62251, 725),
                (0, 62252, 725),
                (0, 62253, 725),
            ]),
            None
        );
    }

    #[test]
    fn one_shared_process_is_too_few() {
        assert_eq!(read(&[(0, 1, 4903), (0, 2, 725), (1, 2, 9000)]), None);
    }
}
