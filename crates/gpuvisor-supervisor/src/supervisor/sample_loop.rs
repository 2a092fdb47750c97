//! The sampler's tick in the event loop: sample, check the policies, act, record, publish.

use super::*;
use crate::sampler::TickInput;
use crate::watch::Remedy;

/// What the sampler is given each tick, kept between ticks so that a tick refills them.
#[derive(Debug, Default)]
pub(super) struct TickInputs {
    groups: Vec<Option<i32>>,
    ledger: Vec<Option<GpuUsage>>,
    last_output: Vec<u64>,
}

impl Run<'_> {
    /// One sampler tick.
    pub(super) fn tick_sampler(&mut self, inputs: &mut Vec<Input>) {
        let now_unix_ms = crate::clock::now_unix_ms();
        let now = Instant::now();
        // The tick's inputs go into buffers kept between ticks (no allocation per tick).
        let mut groups = std::mem::take(&mut self.tick_inputs.groups);
        groups.clear();
        groups.extend(self.tracks.iter().map(|track| track.pid));
        let mut ledger = std::mem::take(&mut self.tick_inputs.ledger);
        ledger.resize(self.tracks.len(), None);
        for (usage, track) in ledger.iter_mut().zip(&self.tracks) {
            match (usage, &track.gpu) {
                (Some(usage), Some(gpu)) => usage.clone_from(gpu),
                (usage, gpu) => *usage = gpu.clone(),
            }
        }
        // Quiet since the later of its last output and the start of its current life.
        let mut last_output = std::mem::take(&mut self.tick_inputs.last_output);
        last_output.clear();
        last_output.extend(
            self.tracks
                .iter()
                .zip(self.last_output.iter())
                .map(|(track, last)| {
                    let started = track
                        .started
                        .map(|started| {
                            now_unix_ms.saturating_sub(
                                now.saturating_duration_since(started).as_millis() as u64,
                            )
                        })
                        .unwrap_or(0);
                    last.load(Ordering::Relaxed).max(started)
                }),
        );
        let mut snapshot = self.sampler.tick(TickInput {
            groups: &groups,
            ledger: &ledger,
            last_output_unix_ms: &last_output,
            now_unix_ms,
        });
        self.tick_inputs = TickInputs {
            groups,
            ledger,
            last_output,
        };
        for ((row, slot), track) in snapshot
            .replicas
            .iter_mut()
            .zip(self.machine.slots())
            .zip(&mut self.tracks)
        {
            // Into the row's own buffer (the sampler reuses rows): no allocation per tick.
            row.state.push_str(slot.phase.name());
            row.restarts = slot.restarts;
            // The peak of the tree's resident memory, for exit classification (OOM killer).
            if row.process_count > 0 {
                track.peak_rss = Some(track.peak_rss.unwrap_or(0).max(row.rss_bytes));
            }
        }
        let shim_events = std::mem::take(&mut self.shim_events);
        let mut source = crate::stall_source::ProcStallSource {
            run_dir: &self.run_path,
            file_stems: self
                .specs
                .iter()
                .map(|spec| spec.file_stem.as_str())
                .collect(),
            py_spy: self.py_spy.is_some(),
        };
        let findings = self
            .watch
            .check_with(&mut snapshot, &shim_events, &mut source);
        for finding in findings {
            let mut event = finding.event;
            if let Some(index) = finding.stall_of {
                let files = self.dump_stacks(index, &snapshot);
                if let (Event::Stall(stall), false) = (&mut event, files.is_empty()) {
                    stall.stacks = Some(files);
                }
            }
            self.events.write(&event);
            match finding.remedy {
                Some(Remedy::KillReplica(index, reason)) => {
                    inputs.push(Input::KillReplica(index, reason))
                }
                Some(Remedy::RestartReplica(index, reason)) => {
                    inputs.push(Input::RestartReplica(index, reason))
                }
                Some(Remedy::KillPid(pid)) => {
                    let result = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
                    self.events
                        .write(&Event::Signal(gpuvisor_record::event::SignalSent {
                            process: None,
                            replica: None,
                            pid: Some(pid),
                            signal: "SIGKILL".into(),
                            group: None,
                            reason: Some("gpu-use".into()),
                            error: result.err().map(|error| error.desc().to_string()),
                        }));
                }
                None => {}
            }
        }
        for event in self.sampler.check_physical(&mut snapshot) {
            self.events.write(&event);
        }
        snapshot.counters = crate::sample::Counters {
            denials: snapshot.replicas.iter().map(|row| row.denials).sum(),
            violations: self.watch.violations,
            restarts: snapshot
                .replicas
                .iter()
                .map(|row| u64::from(row.restarts))
                .sum(),
            stalls: self.watch.stalls,
            policy_actions: self.watch.actions,
        };
        if let Some(samples) = &mut self.samples {
            if let Err(error) = samples.append(&snapshot) {
                eprintln!("gpuvisor: cannot record samples, stopping that: {error}");
                self.samples = None;
            }
        }
        let previous = self
            .latest
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .replace(snapshot);
        // Readers clone what they serve, so the previous one is ours again: its tables are
        // refilled by the next tick.
        if let Some(previous) = previous {
            self.sampler.recycle(previous);
        }
    }

    /// Starts py-spy dumps of replica `index`'s Python processes (when py-spy is installed);
    /// returns the files they write, relative to the run directory.
    fn dump_stacks(&self, index: usize, snapshot: &crate::sample::Snapshot) -> Vec<String> {
        let Some(py_spy) = &self.py_spy else {
            return Vec::new();
        };
        let pids: Vec<i32> = snapshot
            .processes
            .iter()
            .filter(|process| process.replica == Some(index))
            .map(|process| process.pid)
            .collect();
        crate::stacks::dump_python_stacks(
            py_spy,
            &self.run_path,
            &self.specs[index].file_stem,
            &pids,
            snapshot.time_unix_ms,
        )
    }
}
