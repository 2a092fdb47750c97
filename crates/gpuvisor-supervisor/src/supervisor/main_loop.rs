//! The body of the event loop (split from supervisor.rs for size).

use super::*;
use std::collections::BTreeMap;

use crate::admission::QueueInput;
use gpuvisor_record::event::{CleanUp, Exit, JobEnd, Removal, SignalSent};

impl Run<'_> {
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Runs until the machine finishes; returns the job's exit status.
    pub(super) fn main_loop(&mut self, receiver: &Receiver<Msg>) -> u8 {
        let mut inputs = vec![Input::Tick];
        let mut last_sample = Instant::now();
        let sampler_interval = self.options.sampler_interval.max(Duration::from_millis(50));
        let mut next_tick = Instant::now();
        let mut batch = Vec::new();
        loop {
            // In arrival order; what handling them pushes is handled after them (a batch at a
            // time: taking inputs one by one from the front moved the rest each time, 1,024
            // times over at the start of 1,024 replicas).
            while !inputs.is_empty() {
                std::mem::swap(&mut batch, &mut inputs);
                for input in batch.drain(..) {
                    if let Some(code) = self.step_machine(input, &mut inputs) {
                        return code;
                    }
                }
            }
            let now = self.now_ms();
            let mut wait =
                Duration::from_millis(200).min(next_tick.saturating_duration_since(Instant::now()));
            if let Some(deadline) = self.machine.next_deadline() {
                wait = wait.min(Duration::from_millis(deadline.saturating_sub(now)));
            }
            match receiver.recv_timeout(wait) {
                Ok(message) => self.handle(message, &mut inputs),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return 1,
            }
            self.flush_exits(&mut inputs);
            if last_sample.elapsed() >= self.options.sample_interval {
                last_sample = Instant::now();
                self.sample_processes();
            }
            if Instant::now() >= next_tick {
                // Fixed cadence; a late tick does not shift the ones after it.
                next_tick += sampler_interval;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + sampler_interval;
                }
                self.sample_gpu();
                self.tick_sampler(&mut inputs);
                self.events.retry_if_due();
            }
            inputs.push(Input::Tick);
        }
    }

    /// Feeds one input to the machine and carries out what it answers; `Some(status)` when
    /// the job is over.
    fn step_machine(&mut self, input: Input, inputs: &mut Vec<Input>) -> Option<u8> {
        let now = self.now_ms();
        let actions = self.machine.step(now, input);
        let mut started = self.start_together(&actions);
        for action in actions {
            let code = match action {
                Action::Spawn(index) if started.contains_key(&index) => {
                    let result = started.remove(&index).unwrap_or(Err(String::new()));
                    self.spawned(index, result, inputs);
                    None
                }
                action => self.act(action, inputs),
            };
            if code.is_some() {
                return code;
            }
        }
        self.admit_what_fits(inputs);
        None
    }

    /// Carries out one action; `Some(status)` when the job is over.
    fn act(&mut self, action: Action, inputs: &mut Vec<Input>) -> Option<u8> {
        match action {
            Action::Spawn(index) => {
                let started = self.prepare(index).and_then(|launch| {
                    self.spawner
                        .spawn(&launch)
                        .map_err(|error| error.to_string())
                });
                self.spawned(index, started, inputs);
            }
            Action::Stop(index) => self.signal(index, self.specs[index].stop_signal),
            Action::Kill(index) => self.signal(index, Signal::SIGKILL),
            // The end is written last, after clean-up, with the status gpuvisor exits with.
            Action::Event { event, .. } if matches!(*event, Event::JobEnd(_)) => {}
            Action::Event { replica, event } => {
                let event = match replica {
                    Some(index) => event.with_replica(self.specs[index].replica),
                    None => *event,
                };
                self.events.write(&event);
            }
            Action::Finish(code) => {
                if self.admission.is_some() {
                    self.makespan_ms = Some(self.now_ms());
                }
                return Some(code);
            }
            Action::Release(index) => self.queue_input(QueueInput::Release(index), inputs),
            Action::Enqueue(index) => self.queue_input(QueueInput::Enqueue(index), inputs),
        }
        None
    }

    fn signal(&mut self, index: usize, signal: Signal) {
        let Some(pid) = self.tracks[index].pid else {
            return;
        };
        self.tracks[index].signalled = Some(signal as i32);
        let result = killpg(Pid::from_raw(pid), signal);
        self.events.write(&Event::Signal(SignalSent {
            process: Some(self.specs[index].label.clone()),
            replica: Some(self.specs[index].replica),
            pid: None,
            signal: signal.as_str().to_string(),
            group: Some(pid),
            reason: None,
            error: result.err().map(|error| error.desc().to_string()),
        }));
    }

    fn handle(&mut self, message: Msg, inputs: &mut Vec<Input>) {
        match message {
            Msg::Reaped(pid, status) => {
                let found = self.replica_of_pid.remove(&pid);
                if let Some(index) = found {
                    let track = &mut self.tracks[index];
                    track.pid = None;
                    if let Some(watch) = track.port_watch.take() {
                        watch.store(false, Ordering::SeqCst);
                    }
                    let generation = track.generation;
                    track.pending_exit = Some((generation, status, Instant::now() + TAIL_WAIT));
                    if self.specs[index].direct_logs {
                        self.pump.exited(index, generation);
                    }
                    self.exiting.insert(index);
                }
            }
            Msg::Log(LogEvent::Ready {
                replica,
                generation,
            }) => {
                if self.tracks[replica].generation == generation
                    && self.tracks[replica].pid.is_some()
                {
                    inputs.push(Input::Ready(replica));
                }
            }
            Msg::Log(LogEvent::Closed {
                replica,
                generation,
                tail,
                ..
            }) => self.tracks[replica].closed = Some((generation, tail)),
            Msg::PortOpen(replica, generation) => {
                if self.tracks[replica].generation == generation
                    && self.tracks[replica].pid.is_some()
                {
                    inputs.push(Input::Ready(replica));
                }
            }
            Msg::Signal(signal) => {
                self.events.write(&Event::SignalReceived {
                    signal: signal.as_str().to_string(),
                });
                // A hang-up after the first signal (the kernel's and the terminal view's for
                // one lost terminal) is no user insisting: it does not escalate.
                if signal == Signal::SIGHUP && self.interrupts > 0 {
                    return;
                }
                self.interrupts += 1;
                self.first_signal.get_or_insert(signal);
                if self.interrupts == 1 {
                    inputs.push(Input::Shutdown(format!("{} received", signal.as_str())));
                } else {
                    inputs.push(Input::Escalate);
                }
            }
            Msg::Control((request, reply)) => {
                let answer = self.control(request, inputs);
                let _ = reply.send(answer);
            }
        }
    }

    fn control(&mut self, request: Request, inputs: &mut Vec<Input>) -> Value {
        let check = |process: &str| -> Result<(), Value> {
            if self.specs.iter().any(|spec| spec.process == process) {
                return Ok(());
            }
            let mut names: Vec<&str> = self
                .specs
                .iter()
                .map(|spec| spec.process.as_str())
                .collect();
            names.dedup();
            Err(control::error_reply(&format!(
                "no process `{process}` in job {}\n  hint: processes are: {}",
                self.options.job,
                names.join(", ")
            )))
        };
        match request {
            Request::Ps => {
                json!({ "ok": true, "job": self.options.job, "replicas": self.ps_rows() })
            }
            Request::Stop { process: None } => {
                self.events.write(&Event::control("stop", None));
                inputs.push(Input::Shutdown("gpuvisor stop".into()));
                json!({ "ok": true })
            }
            Request::Stop {
                process: Some(process),
            } => match check(&process) {
                Ok(()) => {
                    self.events
                        .write(&Event::control("stop", Some(process.clone())));
                    inputs.push(Input::StopProcess(process));
                    json!({ "ok": true })
                }
                Err(error) => error,
            },
            Request::Gate { process, ready } => {
                inputs.push(Input::Gate(process, ready));
                json!({ "ok": true })
            }
            Request::Sample => {
                let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
                json!({ "ok": true, "sample": *latest })
            }
            Request::Queue => self.queue_reply(),
            Request::Dequeue { replica } => self.dequeue(&replica, inputs),
            Request::Enqueue(request) => self.add(request, inputs),
            Request::Budget { replica, bytes } => self.resize(&replica, bytes, inputs),
            Request::Restart { process } => match check(&process) {
                Ok(()) => {
                    self.events
                        .write(&Event::control("restart", Some(process.clone())));
                    inputs.push(Input::RestartProcess(process));
                    json!({ "ok": true })
                }
                Err(error) => error,
            },
        }
    }

    fn ps_rows(&self) -> Vec<PsRow> {
        self.specs
            .iter()
            .zip(&self.tracks)
            .zip(self.machine.slots())
            .enumerate()
            .map(|(index, ((spec, track), slot))| PsRow {
                process: spec.process.clone(),
                replica: spec.replica,
                label: spec.label.clone(),
                state: match self.queue_position(index) {
                    Some(position) => format!("queued #{position}"),
                    None => slot.phase.name().to_string(),
                },
                // The command is the keeper's first child.
                pid: track
                    .pid
                    .map(|keeper| procfs::children(keeper).first().copied().unwrap_or(keeper)),
                group: track.pid,
                restarts: slot.restarts,
                gpu_used_bytes: track.gpu.as_ref().map(|gpu| gpu.used_bytes),
                gpu_peak_bytes: track.gpu.as_ref().map(|gpu| gpu.peak_bytes),
                budget_bytes: spec.budget_bytes,
                uptime_ms: track
                    .pid
                    .and(track.started)
                    .map(|started| started.elapsed().as_millis() as u64),
                last_exit: track.last_cause.clone(),
                node: None,
                queue_position: self.queue_position(index),
            })
            .collect()
    }

    /// Exits whose pipes closed (or waited long enough) are classified and fed to the machine.
    fn flush_exits(&mut self, inputs: &mut Vec<Input>) {
        if self.exiting.is_empty() {
            return;
        }
        let now = Instant::now();
        let exiting: Vec<usize> = self.exiting.iter().copied().collect();
        // The cgroup's OOM kill count, read once for the exits flushed together.
        let mut oom_read: Option<Option<u64>> = None;
        for index in exiting {
            let Some((generation, status, deadline)) = self.tracks[index].pending_exit else {
                self.exiting.remove(&index);
                continue;
            };
            let closed =
                matches!(&self.tracks[index].closed, Some((closed, _)) if *closed == generation);
            if !closed && now < deadline {
                continue;
            }
            let tail = match self.tracks[index].closed.take() {
                Some((closed, tail)) if closed == generation => tail,
                _ => Vec::new(),
            };
            self.tracks[index].pending_exit = None;
            self.exiting.remove(&index);
            // Fresh ledger figures: a short life may have been refused since the last sample.
            // Once for the exits flushed together: a stop of 1,024 replicas read the whole
            // ledger 1,024 times.
            if oom_read.is_none() {
                self.sample_gpu();
            }
            let oom_now = *oom_read.get_or_insert_with(cause::cgroup_oom_kills);
            let oom_kills = match (self.oom_kills, oom_now) {
                (Some(before), Some(after)) => after.saturating_sub(before),
                _ => 0,
            };
            self.oom_kills = oom_now;
            let track = &mut self.tracks[index];
            let evidence = Evidence {
                signalled_by_us: track.signalled,
                oom_kills,
                peak_rss_bytes: track.peak_rss,
                memory_limit_bytes: self.memory_limit,
                ledger_denials: track.gpu.as_ref().map_or(0, |gpu| gpu.denials),
                tail,
            };
            let cause = cause::classify(status, &evidence);
            let ran_ms = track
                .started
                .map(|started| started.elapsed().as_millis() as u64)
                .unwrap_or(0);
            track.run_ms += ran_ms;
            track.last_cause = Some(cause.summary.clone());
            let spec = &self.specs[index];
            let (code, signal, core_dumped) = match status {
                ExitStatus::Code(code) => (Some(code), None, None),
                ExitStatus::Signal { signal, core } => {
                    let name = Signal::try_from(signal).map(|s| s.as_str()).unwrap_or("?");
                    (None, Some(name.to_string()), Some(core))
                }
            };
            self.events.write(&Event::Exit(Exit {
                process: spec.label.clone(),
                replica: Some(spec.replica),
                life: generation,
                run_ms: ran_ms,
                code,
                signal,
                core_dumped,
                cause: cause.kind.to_string(),
                summary: cause.summary.clone(),
                evidence: cause.evidence.clone(),
            }));
            inputs.push(Input::Exited {
                index,
                success: status.success(),
                cause: cause.summary,
            });
        }
    }

    /// The job's footprint for clean-up: every pid of its trees (from the sampler's latest
    /// snapshot; a full process-group scan every 10 s also finds orphans the supervisor
    /// adopted), and the /dev/shm files they map. Maps are read only while /dev/shm holds a
    /// candidate file (ours, `sem.mp-*` or `torch_*`) not yet known to be the job's: a file
    /// that does not exist cannot be mapped, so most ticks read no maps at all.
    fn sample_processes(&mut self) {
        let groups: Vec<i32> = self.tracks.iter().filter_map(|track| track.pid).collect();
        if groups.is_empty() {
            return;
        }
        let mut pids: Vec<i32> = {
            let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
            latest
                .as_ref()
                .map(|snapshot| {
                    snapshot
                        .processes
                        .iter()
                        .map(|process| process.pid)
                        .collect()
                })
                .unwrap_or_default()
        };
        pids.extend(&groups);
        self.scans += 1;
        if self.scans % 10 == 1 {
            // The members the sampler knows are not read again: the others are found below
            // them or in the job's groups.
            let known: std::collections::HashSet<i32> = pids.iter().copied().collect();
            pids.extend(procfs::job_tree_beyond(&groups, &known));
        }
        // Maps are read for every pid while a candidate file is new, else only for pids not
        // read yet (a new process may have inherited a mapping).
        let candidates = self.unattributed_shm_files();
        // A candidate counts as new for 3 s: its creator may map it just after creating it.
        let now = Instant::now();
        let new_candidate = candidates.iter().any(|path| {
            let first_seen = *self.shm_seen.entry(path.clone()).or_insert(now);
            now.duration_since(first_seen) < Duration::from_secs(3)
        });
        if new_candidate && self.scans % 10 != 1 {
            // The whole tree now, not the sampler's view of up to a tick ago: the file's
            // creator may be short-lived.
            pids.extend(procfs::job_tree(&groups));
        }
        for pid in pids {
            self.footprint.pids.insert(pid);
            let fresh = self.maps_read.insert(pid);
            if !candidates.is_empty() && (new_candidate || fresh) {
                for path in procfs::mapped_shm(pid) {
                    self.footprint.mapped.insert(PathBuf::from(path));
                }
            }
        }
    }

    /// The files in the shm directory that clean-up could take (ours, `sem.mp-*` or
    /// `torch_*`) and that no process of the job is known to map yet.
    fn unattributed_shm_files(&self) -> Vec<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let Ok(entries) = std::fs::read_dir(&self.options.shm_dir) else {
            return Vec::new();
        };
        let uid = nix::unistd::getuid().as_raw();
        entries
            .filter_map(Result::ok)
            .filter(|entry| {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                (name.starts_with("sem.mp-") || name.starts_with("torch_"))
                    && !self.footprint.mapped.contains(&entry.path())
                    && entry.metadata().is_ok_and(|meta| meta.uid() == uid)
            })
            .map(|entry| entry.path())
            .collect()
    }

    fn sample_gpu(&mut self) {
        let sample = self.hooks.sample();
        for (track, usage) in self.tracks.iter_mut().zip(sample.usage) {
            if usage.is_some() {
                track.gpu = usage;
            }
        }
        for event in sample.events {
            self.events.write(&event);
            if matches!(event, Event::Violation { .. }) {
                self.shim_events.push(event);
            }
        }
    }

    /// After the last replica: kill and reap stragglers, clean up, record the end with the
    /// job's exit `status`. Returns the status gpuvisor exits with (1 instead of 0 when the
    /// record is incomplete) and what became of the record.
    pub(super) fn finish_job(
        &mut self,
        receiver: &Receiver<Msg>,
        status: u8,
    ) -> (u8, RecordHealth) {
        self.sample_gpu();
        // The final peaks, so `ps` and `top` of the finished run show them (not `?`).
        let peaks: BTreeMap<String, u64> = self
            .specs
            .iter()
            .zip(&self.tracks)
            .filter_map(|(spec, track)| Some((spec.label.clone(), track.gpu.as_ref()?.peak_bytes)))
            .collect();
        if !peaks.is_empty() {
            self.events.write(&Event::GpuPeaks { peak_bytes: peaks });
        }
        let me = std::process::id() as i32;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let stragglers = procfs::children(me);
            if stragglers.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in &stragglers {
                let _ = nix::sys::signal::kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            self.events.write(&Event::CleanUp(CleanUp {
                what: "stray processes".into(),
                path: None,
                error: None,
                killed: Some(stragglers.clone()),
                removed: None,
            }));
            // The reaper reaps them; their exits are not replicas'.
            let _ = receiver.recv_timeout(Duration::from_millis(50));
        }
        for event in self.hooks.finish() {
            self.events.write(&event);
        }
        let uid = nix::unistd::getuid().as_raw();
        let removed = clean_shm(&self.options.shm_dir, uid, &self.footprint);
        if !removed.is_empty() {
            let files: Vec<Removal> = removed
                .iter()
                .map(|removal| Removal {
                    path: removal.path.display().to_string(),
                    why: removal.reason.to_string(),
                    error: removal.error.clone(),
                })
                .collect();
            self.events.write(&Event::CleanUp(CleanUp {
                what: "shared memory".into(),
                path: None,
                error: None,
                killed: None,
                removed: Some(files),
            }));
        }
        // The end says the status gpuvisor exits with: the job's (128 + the signal after a
        // signal), or 1 when events were lost from the record.
        let waiting = self.events.retry();
        let health = self.events.health();
        let incomplete = health.incomplete() || waiting > 0;
        let status = match status {
            0 if incomplete => 1,
            status => status,
        };
        self.events.write(&Event::JobEnd(JobEnd {
            status: i32::from(status),
            record_incomplete: incomplete,
        }));
        let health = self.events.close();
        let status = match status {
            0 if health.incomplete() => 1,
            status => status,
        };
        (status, health)
    }

    pub(super) fn summary_rows(&self) -> Vec<SummaryRow> {
        self.specs
            .iter()
            .zip(&self.tracks)
            .zip(self.machine.slots())
            .enumerate()
            .map(|(index, ((spec, track), slot))| SummaryRow {
                label: spec.label.clone(),
                restarts: slot.restarts,
                cause: match (&track.last_cause, slot.phase) {
                    (_, Phase::Failed) if track.last_cause.is_none() => "not started".into(),
                    (Some(cause), _) => cause.clone(),
                    (None, phase) => phase.name().to_string(),
                },
                gpu_peak_bytes: track.gpu.as_ref().map(|gpu| gpu.peak_bytes),
                budget_bytes: spec.budget_bytes,
                run_ms: track.run_ms,
                seen: Tally::default(),
                wait_ms: self.waited_ms(index),
            })
            .collect()
    }
}
