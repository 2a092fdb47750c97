//! Starting replicas in the event loop: several at once when the state machine asks for
//! several (the first start of a job), then each one's track, pipes and `start` event in order.

use super::*;
use std::collections::HashMap;

use crate::spawn::{Output, Started};
use gpuvisor_record::log_file::direct;

impl Run<'_> {
    /// Starts the replicas of every `Spawn` in `actions` at once, when there are several (the
    /// first start of a job): each start waits for its keeper's exec, and those waits overlap.
    /// The rest of each start (its track, its pipes, its `start` event) is done in order by
    /// [`Run::spawned`] as the actions are carried out.
    pub(super) fn start_together(
        &mut self,
        actions: &[Action],
    ) -> HashMap<usize, Result<Started, String>> {
        let indices: Vec<usize> = actions
            .iter()
            .filter_map(|action| match action {
                Action::Spawn(index) => Some(*index),
                _ => None,
            })
            .collect();
        let mut started = HashMap::new();
        if indices.len() < 2 {
            return started;
        }
        let mut ready = Vec::new();
        let mut launches = Vec::new();
        for index in indices {
            match self.prepare(index) {
                Ok(launch) => {
                    ready.push(index);
                    launches.push(launch);
                }
                Err(reason) => {
                    started.insert(index, Err(reason));
                }
            }
        }
        let results = self.spawner.spawn_all(&launches);
        for (index, result) in ready.into_iter().zip(results) {
            started.insert(index, result.map_err(|error| error.to_string()));
        }
        started
    }

    /// Replica `index`'s launch, with what the hooks add before it starts.
    pub(super) fn prepare(&mut self, index: usize) -> Result<Launch, String> {
        let mut launch: Launch = self.specs[index].launch.clone();
        let extra = self
            .hooks
            .before_spawn(index)
            .map_err(|error| format!("cannot prepare its start: {error}"))?;
        launch.env.extend(extra);
        if self.specs[index].direct_logs {
            let (dir, stem) = (self.pump.dir(), &self.specs[index].file_stem);
            launch.output = Output::Files {
                stdout: direct::out_path(dir, stem),
                stderr: direct::err_path(dir, stem),
            };
        }
        Ok(launch)
    }

    /// Records replica `index`'s start (or its failure) and tells the state machine.
    pub(super) fn spawned(
        &mut self,
        index: usize,
        started: Result<Started, String>,
        inputs: &mut Vec<Input>,
    ) {
        match started.and_then(|started| self.track_start(index, started)) {
            Ok(()) => inputs.push(Input::Spawned(index)),
            Err(reason) => inputs.push(Input::SpawnFailed(index, reason)),
        }
    }

    /// Tracks a started replica: its pid, its pipes to the log pump, its `start` event.
    fn track_start(&mut self, index: usize, started: Started) -> Result<(), String> {
        let track = &mut self.tracks[index];
        track.generation += 1;
        track.pid = Some(started.pid);
        track.started = Some(Instant::now());
        track.signalled = None;
        track.pending_exit = None;
        self.exiting.remove(&index);
        self.replica_of_pid.insert(started.pid, index);
        track.closed = None;
        self.footprint.pids.insert(started.pid);
        let ready = match &self.specs[index].readiness {
            Readiness::LogLine(pattern) => Some(pattern.clone()),
            _ => None,
        };
        if let Err(error) = self.pump.register_output(
            index,
            Some(self.specs[index].file_stem.clone()),
            track.generation,
            started.output,
            ready,
        ) {
            eprintln!(
                "gpuvisor: cannot read the output of {}: {error}",
                self.specs[index].label
            );
        }
        if let Readiness::Port(port) = self.specs[index].readiness {
            let flag = Arc::new(AtomicBool::new(true));
            track.port_watch = Some(Arc::clone(&flag));
            watch_port(port, index, track.generation, flag, self.sender.clone());
        }
        let spec = &self.specs[index];
        self.events.write(&Event::Start {
            process: spec.label.clone(),
            replica: Some(spec.replica),
            pid: started.pid,
            life: track.generation,
            argv: (track.generation == 1).then(|| spec.launch.argv.clone()),
        });
        Ok(())
    }
}

/// Polls 127.0.0.1:`port` until something accepts, or `alive` is cleared.
fn watch_port(
    port: u16,
    index: usize,
    generation: u64,
    alive: Arc<AtomicBool>,
    sender: Sender<Msg>,
) {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let _ = std::thread::Builder::new()
        .name("gpuvisor-port".into())
        .spawn(move || {
            while alive.load(Ordering::SeqCst) {
                if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                    let _ = sender.send(Msg::PortOpen(index, generation));
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
}
