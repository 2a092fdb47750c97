//! What `explain` reads: a log file, standard input, or a run directory written by
//! `gpuvisor run` (`runs/<job>-<time>/` with `logs/<name>[.<replica>].log`).

use std::path::{Path, PathBuf};

/// One log to explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogSource {
    /// Standard input.
    Stdin,
    /// A file.
    File(PathBuf),
}

impl LogSource {
    /// The name shown in output.
    pub fn display_name(&self) -> String {
        match self {
            LogSource::Stdin => "-".to_string(),
            LogSource::File(path) => path.display().to_string(),
        }
    }
}

/// Why the argument names no log.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Nothing by that name.
    #[error("no log file or run directory `{0}`\n  hint: give a log file, a run directory (runs/<job>-<time>), or - to read standard input")]
    NotFound(String),
    /// A directory without logs.
    #[error("no *.log files in `{0}`\n  hint: a run directory holds its logs in logs/<name>.log; give a log file directly otherwise")]
    NoLogs(String),
    /// The directory cannot be listed.
    #[error("cannot list `{path}`: {reason}")]
    Unreadable {
        /// The directory.
        path: String,
        /// The I/O error.
        reason: String,
    },
}

/// Resolves `FILE | RUN | -`: a run may be named by its directory or by its name under `runs/`.
pub fn resolve(argument: &str) -> Result<Vec<LogSource>, SourceError> {
    if argument == "-" {
        return Ok(vec![LogSource::Stdin]);
    }
    let path = Path::new(argument);
    let under_runs = Path::new("runs").join(argument);
    let path = if path.exists() {
        path.to_path_buf()
    } else if under_runs.is_dir() {
        under_runs
    } else {
        return Err(SourceError::NotFound(argument.to_string()));
    };
    if !path.is_dir() {
        return Ok(vec![LogSource::File(path)]);
    }
    let logs = path.join("logs");
    let directory = if logs.is_dir() { logs } else { path };
    let entries = std::fs::read_dir(&directory).map_err(|error| SourceError::Unreadable {
        path: directory.display().to_string(),
        reason: error.to_string(),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "log"))
        .collect();
    if files.is_empty() {
        return Err(SourceError::NoLogs(directory.display().to_string()));
    }
    files.sort();
    Ok(files.into_iter().map(LogSource::File).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_directory_gives_its_logs_in_order() {
        let run = tempfile::tempdir().unwrap();
        std::fs::create_dir(run.path().join("logs")).unwrap();
        for name in ["learner.log", "actor.1.log", "actor.0.log", "notes.txt"] {
            std::fs::write(run.path().join("logs").join(name), "x\n").unwrap();
        }
        std::fs::write(run.path().join("plan.json"), "{}").unwrap();
        let sources = resolve(run.path().to_str().unwrap()).unwrap();
        let names: Vec<String> = sources
            .iter()
            .map(|source| match source {
                LogSource::File(path) => path.file_name().unwrap().to_string_lossy().into(),
                LogSource::Stdin => "-".into(),
            })
            .collect();
        assert_eq!(names, ["actor.0.log", "actor.1.log", "learner.log"]);
    }

    #[test]
    fn dash_is_stdin_and_missing_paths_fail() {
        assert_eq!(resolve("-").unwrap(), vec![LogSource::Stdin]);
        let error = resolve("/no/such/log").unwrap_err().to_string();
        assert!(error.contains("hint:"), "{error}");
        let empty = tempfile::tempdir().unwrap();
        let error = resolve(empty.path().to_str().unwrap()).unwrap_err();
        assert!(matches!(error, SourceError::NoLogs(_)));
    }
}
