//! Checks on `after` across the whole job: every name exists and the start order has no cycle.

use super::process::ParsedProcess;
use super::reader::{suggest, Source};
use super::Diagnostic;

/// Refuses an `after` entry naming no process, or a cycle of `after` entries (naming it).
pub(super) fn check_after(
    source: Source<'_>,
    processes: &[ParsedProcess],
) -> Result<(), Diagnostic> {
    let names: Vec<&str> = processes
        .iter()
        .map(|process| process.spec.name.as_str())
        .collect();
    for process in processes {
        for (name, range) in process.spec.after.iter().zip(&process.after_ranges) {
            if names.contains(&name.as_str()) {
                continue;
            }
            let error = source.error(
                range.clone(),
                format!(
                    "`after` in [process.{}] names \"{name}\", which is not a process of this job",
                    process.spec.name
                ),
            );
            return Err(match suggest(name, names.iter().copied()) {
                Some(near) => error.with_hint(format!("did you mean \"{near}\"?")),
                None => error.with_hint(format!("processes of this job: {}", names.join(", "))),
            });
        }
    }
    if let Some(cycle) = find_cycle(processes, &names) {
        let (first, second) = (cycle[0], cycle[1]);
        let process = &processes[first];
        let at = process
            .spec
            .after
            .iter()
            .position(|name| name == names[second])
            .unwrap_or(0);
        let path: Vec<&str> = cycle.iter().map(|&index| names[index]).collect();
        return Err(source
            .error(
                process.after_ranges[at].clone(),
                format!("`after` in [process.{}] forms a cycle: {}", process.spec.name, path.join(" -> ")),
            )
            .with_hint("a process starts only after the ones it names, so none of these could ever start; remove one of these `after` entries"));
    }
    Ok(())
}

/// The first cycle found walking processes in file order, as indices with the first repeated at
/// the end (`[a, b, a]`).
fn find_cycle(processes: &[ParsedProcess], names: &[&str]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Unvisited,
        OnPath,
        Done,
    }
    let edges: Vec<Vec<usize>> = processes
        .iter()
        .map(|process| {
            process
                .spec
                .after
                .iter()
                .filter_map(|name| names.iter().position(|known| known == name))
                .collect()
        })
        .collect();
    let mut state = vec![State::Unvisited; processes.len()];
    for root in 0..processes.len() {
        if state[root] != State::Unvisited {
            continue;
        }
        // Iterative depth-first walk; `path` holds (node, next edge to try).
        let mut path: Vec<(usize, usize)> = vec![(root, 0)];
        state[root] = State::OnPath;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            if let Some(&target) = edges[node].get(*next) {
                *next += 1;
                match state[target] {
                    State::OnPath => {
                        let start = path
                            .iter()
                            .position(|(on_path, _)| *on_path == target)
                            .unwrap_or(0);
                        let mut cycle: Vec<usize> =
                            path[start..].iter().map(|(on_path, _)| *on_path).collect();
                        cycle.push(target);
                        return Some(cycle);
                    }
                    State::Unvisited => {
                        state[target] = State::OnPath;
                        path.push((target, 0));
                    }
                    State::Done => {}
                }
            } else {
                state[node] = State::Done;
                path.pop();
            }
        }
    }
    None
}
