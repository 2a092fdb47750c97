//! `gpuvisor submit JOB [-- SBATCH ARGS]`: writes the batch script that runs the job under
//! Slurm (`gpuvisor run`, which starts one agent per node through srun) into the job's run
//! directory and submits it with sbatch.

use std::path::Path;
use std::process::{Command, ExitCode};

use gpuvisor_core::spec::read_job_file;
use gpuvisor_supervisor::rundir::{RunDir, DEFAULT_RUNS};

use crate::cli::SubmitArgs;
use crate::failure::Failure;

/// Quotes `text` for /bin/sh.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The batch script.
pub fn batch_script(
    job_name: &str,
    gpuvisor: &Path,
    job: &Path,
    run_dir: &Path,
    simulate: Option<&str>,
    quiet: bool,
    srun_args: &[String],
) -> String {
    let mut run = vec![
        shell_quote(&gpuvisor.display().to_string()),
        "run".to_string(),
        shell_quote(&job.display().to_string()),
        "--run-dir".to_string(),
        shell_quote(&run_dir.display().to_string()),
    ];
    if let Some(simulate) = simulate {
        run.push("--simulate".to_string());
        run.push(shell_quote(simulate));
    }
    if quiet {
        run.push("--quiet".to_string());
    }
    for arg in srun_args {
        run.push(shell_quote(&format!("--srun-arg={arg}")));
    }
    format!(
        "#!/bin/sh\n\
         # Written by `gpuvisor submit`: gpuvisor starts one agent per node of the allocation\n\
         # through srun, checks that every node reaches the coordinators, then runs the job.\n\
         #SBATCH --job-name={job_name}\n\
         #SBATCH --output={output}\n\
         #SBATCH --ntasks-per-node=1\n\
         exec {run}\n",
        output = run_dir.join("slurm-%j.out").display(),
        run = run.join(" ")
    )
}

/// Submits the job.
pub fn submit(args: SubmitArgs) -> Result<ExitCode, Failure> {
    let job = read_job_file(&args.job).map_err(Failure::bad_input)?;
    let job_path = std::fs::canonicalize(&args.job)?;
    let run_dir = match &args.run_dir {
        Some(dir) => dir.clone(),
        None => RunDir::default_path(Path::new(DEFAULT_RUNS), &job.name),
    };
    let run_dir = std::path::absolute(&run_dir)?;
    let gpuvisor = std::env::current_exe()?;
    let script = batch_script(
        &job.name,
        &gpuvisor,
        &job_path,
        &run_dir,
        args.inventory.simulate.as_deref(),
        args.quiet,
        &args.srun_args,
    );
    let script_path = run_dir.join("job.sbatch");
    let mut sbatch = Command::new("sbatch");
    sbatch
        .arg("--parsable")
        .args(&args.sbatch)
        .arg(&script_path);
    if args.dry_run {
        print!("{script}");
        println!(
            "# submit with: sbatch --parsable {}{}",
            args.sbatch
                .iter()
                .map(|arg| format!("{} ", shell_quote(arg)))
                .collect::<String>(),
            script_path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let record = gpuvisor_record::RunDir::at(&run_dir);
    if record.events_path().exists() || record.pid_path().exists() {
        return Err(Failure::bad_input(format!(
            "the run directory {} already holds a run",
            run_dir.display()
        ))
        .with_hint(
            "give a new directory with --run-dir, or leave it out to get ./runs/<job>-<time>/",
        ));
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&run_dir)
            .map_err(|error| {
                Failure::unavailable(format!("cannot create the run directory {}: {error}", run_dir.display())).with_hint("choose a writable place with --run-dir DIR (on a file system every node shares)")
            })?;
    }
    std::fs::write(&script_path, &script)?;
    // Nothing submitted: nothing left behind either (the directory only if it is empty).
    let undo = || {
        let _ = std::fs::remove_file(&script_path);
        let _ = std::fs::remove_dir(&run_dir);
    };
    let output = sbatch.output().map_err(|error| {
        undo();
        Failure::unavailable(format!("cannot run sbatch: {error}")).with_hint(
            "submit from a machine with Slurm's client tools, or use --dry-run to get the script",
        )
    })?;
    if !output.status.success() {
        undo();
        return Err(Failure::bad_input(format!(
            "sbatch refused the job ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
        .with_hint("check the sbatch options after `--`"));
    }
    let job_id = String::from_utf8_lossy(&output.stdout)
        .trim()
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    println!("{job_id}");
    eprintln!(
        "gpuvisor: submitted job {} as Slurm job {job_id}; record in {}\n  follow it: gpuvisor ps {} (once it runs), tail -f {}",
        job.name,
        run_dir.display(),
        run_dir.display(),
        run_dir.join(format!("slurm-{job_id}.out")).display()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_script_runs_gpuvisor_with_quoted_paths() {
        let script = batch_script(
            "rl",
            Path::new("/opt/gpu visor/gpuvisor"),
            Path::new("/home/a/it's.toml"),
            Path::new("/home/a/runs/rl-1"),
            Some("2x80GiB"),
            false,
            &["--mpi=none".to_string()],
        );
        assert!(script.starts_with("#!/bin/sh\n"), "{script}");
        assert!(script.contains("#SBATCH --job-name=rl\n"), "{script}");
        assert!(script.contains("#SBATCH --output=/home/a/runs/rl-1/slurm-%j.out\n"));
        assert!(script.ends_with(
            "exec '/opt/gpu visor/gpuvisor' run '/home/a/it'\\''s.toml' --run-dir '/home/a/runs/rl-1' --simulate '2x80GiB' '--srun-arg=--mpi=none'\n"
        ), "{script}");
    }
}
