//! Queued admission in the event loop (split from supervisor.rs for size): the machine's
//! [`Action::Release`] / [`Action::Enqueue`] go to the [`Queue`], and its admissions set the
//! replica's budget through the hooks (the ledger's limits, before it can start) and then
//! tell the machine ([`Input::Admitted`]).

use super::*;
use crate::admission::{Queue, QueueAction, QueueInput};
use crate::control::{AddRequest, QueueGpu, QueueRow};
use crate::spawn::Output;
use crate::state::Room;
use gpuvisor_core::plan::admit::Ask;
use gpuvisor_core::plan::admit::QueueSetup;
use gpuvisor_core::plan::PlannedReplica;
use gpuvisor_core::size::ByteSize;
use gpuvisor_core::spec::{DeviceKind, Framework, MemoryAsk};

/// Replica `index`'s room at the start of a job with this queue set-up.
pub(super) fn room_of(setup: Option<&QueueSetup>, index: usize) -> Room {
    match setup {
        None => Room::Free,
        Some(setup) if setup.queued.contains(&index) => Room::Queued,
        Some(setup) if setup.seats.get(index).is_some_and(Option::is_some) => Room::Held,
        Some(_) => Room::Free,
    }
}

/// The queue of a job that starts now, with its `queued` events; `None` without a queue.
pub(super) fn start(
    options: &Options,
    replicas: &[ReplicaSpec],
) -> (Option<Queue>, Vec<QueueAction>) {
    let Some(setup) = options.queue.clone() else {
        return (None, Vec::new());
    };
    let labels = replicas.iter().map(|spec| spec.label.clone()).collect();
    let (queue, actions) = Queue::new(setup, labels, options.gpu_indices.clone(), 0);
    (Some(queue), actions)
}

impl Run<'_> {
    /// Feeds the queue one input and carries out what it decides.
    pub(super) fn queue_input(&mut self, input: QueueInput, inputs: &mut Vec<Input>) {
        if let QueueInput::Release(index) = input {
            self.size_from_peak(index);
        }
        let now = self.now_ms();
        let Some(queue) = &mut self.admission else {
            return;
        };
        let actions = queue.step(now, input);
        let idle = queue.waiting().next().is_none();
        if let (QueueInput::Release(_), Some(host), true) =
            (input, &mut self.options.host_booking, idle)
        {
            // Room returned to the books goes back to the machine (with replicas waiting,
            // the admission that follows books what it takes, under one lock).
            let committed = queue.books().committed_bytes.clone();
            let _ = host.transact(|_| committed);
        }
        self.act_on_queue(actions, inputs);
    }

    /// Admits, in order, the queued replicas that fit now (not while shutting down).
    pub(super) fn admit_what_fits(&mut self, inputs: &mut Vec<Input>) {
        let waiting = self
            .admission
            .as_ref()
            .is_some_and(|queue| queue.waiting().next().is_some());
        if !waiting || self.machine.shutting_down() {
            return;
        }
        let now = self.now_ms();
        let (Some(host), Some(queue)) = (&mut self.options.host_booking, &mut self.admission)
        else {
            self.queue_input(QueueInput::Admit, inputs);
            return;
        };
        // Machine-wide booking: admit only into room no other run booked, and book what is
        // admitted, under the record's lock (looked at twice a second at most while waiting).
        if !host.due(Duration::from_millis(500), &queue.books().committed_bytes) {
            return;
        }
        let mut actions = Vec::new();
        let booked = host.transact(|room| {
            queue.limit_room(room);
            actions = queue.step(now, QueueInput::Admit);
            queue.books().committed_bytes.clone()
        });
        // Once per spell of failures; it tries again in half a second.
        if let (Err(error), 1) = (booked, host.failures()) {
            self.events.write(&Event::BookingFailed { error });
        }
        self.act_on_queue(actions, inputs);
    }

    /// Carries out the queue's actions: events, and admissions (the budget first).
    pub(super) fn act_on_queue(&mut self, actions: Vec<QueueAction>, inputs: &mut Vec<Input>) {
        for action in actions {
            match action {
                QueueAction::Event { index, event } => {
                    self.events
                        .write(&event.with_replica(self.specs[index].replica));
                }
                QueueAction::Admit { index, seat } => match self.hooks.admit(index, &seat) {
                    Ok(env) => {
                        if let Some(env) = env {
                            self.specs[index].launch.env = env;
                        }
                        self.specs[index].budget_bytes = seat.budget_bytes;
                        inputs.push(Input::Admitted(index));
                    }
                    Err(error) => inputs.push(Input::SpawnFailed(
                        index,
                        format!("cannot set its budget on admission: {error}"),
                    )),
                },
            }
        }
    }

    /// `{"cmd":"queue"}`: who waits, in order, and the GPUs' books.
    pub(super) fn queue_reply(&self) -> Value {
        let Some(queue) = &self.admission else {
            return no_queue(&self.options.job);
        };
        let now = self.now_ms();
        let rows: Vec<QueueRow> = queue
            .waiting()
            .enumerate()
            .map(|(at, index)| QueueRow {
                position: at + 1,
                label: self.specs[index].label.clone(),
                gpus: queue.ask(index).map_or(0, |ask| ask.gpus),
                budget_bytes: self.specs[index].budget_bytes,
                waited_ms: queue.waited_ms(index, now),
            })
            .collect();
        let books = queue.books();
        let gpus: Vec<QueueGpu> = (0..books.usable_bytes.len())
            .map(|i| QueueGpu {
                index: self.options.gpu_indices.get(i).copied().unwrap_or(i as u32),
                usable_bytes: books.usable_bytes[i],
                committed_bytes: books.committed_bytes[i],
            })
            .collect();
        json!({ "ok": true, "job": self.options.job, "queue": rows, "gpus": gpus })
    }

    /// `{"cmd":"dequeue"}`: takes a queued replica out of the queue (it stays stopped).
    pub(super) fn dequeue(&mut self, label: &str, inputs: &mut Vec<Input>) -> Value {
        let Some(queue) = &self.admission else {
            return no_queue(&self.options.job);
        };
        let waiting: Vec<String> = queue
            .waiting()
            .map(|index| self.specs[index].label.clone())
            .collect();
        let Some(index) = self.specs.iter().position(|spec| spec.label == label) else {
            return control::error_reply(&format!(
                "no replica `{label}` in job {}\n  hint: {}",
                self.options.job,
                queued_hint(&waiting)
            ));
        };
        if queue.position(index).is_none() {
            let state = self.machine.slots()[index].phase.name();
            return control::error_reply(&format!(
                "{label} is not queued (it is {state})\n  hint: {}; `gpuvisor stop RUN PROCESS` stops replicas that run",
                queued_hint(&waiting)
            ));
        }
        self.events.write(&Event::Control {
            cmd: Value::from("dequeue"),
            process: Some(label.to_string()),
            replica: Some(self.specs[index].replica),
            argv: None,
        });
        inputs.push(Input::Dequeue(index));
        json!({ "ok": true })
    }

    /// `{"cmd":"enqueue"}` (`gpuvisor queue add`): appends a replica to the job; a GPU one
    /// joins the back of the queue. A request that could never be admitted is refused with
    /// the arithmetic.
    pub(super) fn add(&mut self, request: AddRequest, inputs: &mut Vec<Input>) -> Value {
        let Some(queue) = &self.admission else {
            return no_queue(&self.options.job);
        };
        let framework = match Framework::ALL
            .iter()
            .find(|f| f.as_str() == request.framework)
        {
            Some(framework) => *framework,
            None => {
                let names: Vec<&str> = Framework::ALL.iter().map(|f| f.as_str()).collect();
                return control::error_reply(&format!(
                    "unknown framework `{}`\n  hint: one of {}",
                    request.framework,
                    names.join(", ")
                ));
            }
        };
        let planned = self
            .specs
            .iter()
            .any(|spec| spec.process == request.name && !self.added.contains(&spec.process));
        if planned || request.name.is_empty() {
            return control::error_reply(&format!(
                "`{}` is a process of the job file; added replicas need a name of their own\n  hint: --name NAME (default: added)",
                request.name
            ));
        }
        let ask = match (request.cpu, request.memory_bytes) {
            (true, _) => None,
            (false, Some(bytes)) => Some(Ask {
                memory: MemoryAsk::Bytes(bytes),
                gpus: request.gpus.max(1) as usize,
            }),
            (false, None) => {
                return control::error_reply(
                    "a GPU replica needs a budget\n  hint: --mem SIZE (e.g. --mem 20GiB), or --cpu for a CPU-only one",
                )
            }
        };
        let seat = ask.map(|ask| queue.fits_empty(ask));
        if let (Some(ask), Some(None)) = (ask, &seat) {
            return control::error_reply(&self.never_fits(ask));
        }
        let replica = self
            .specs
            .iter()
            .filter(|spec| spec.process == request.name)
            .count() as u32;
        let label = gpuvisor_record::label::numbered(&request.name, replica);
        let (argv, cwd) = (request.argv, request.cwd);
        let seat = seat.flatten();
        let planned = PlannedReplica {
            process: request.name.clone(),
            replica,
            // Open-ended (more may be added): labels always carry the number, `added[0]`.
            replicas: u32::MAX,
            framework,
            device: if request.cpu {
                DeviceKind::Cpu
            } else {
                DeviceKind::Gpu
            },
            preallocate: true,
            children_cpu_only: false,
            gpus: Vec::new(),
            budget_bytes: seat.as_ref().map_or(0, |seat| seat.budget_bytes),
            footprint_bytes: seat.as_ref().map_or(0, |seat| seat.footprint_bytes),
            argv: argv.clone(),
            cwd: cwd.clone(),
            user_env: Default::default(),
            after: Vec::new(),
            node: None,
            nccl_env: Default::default(),
            rank: None,
        };
        let env = match self.hooks.add(&planned) {
            Ok(env) => env,
            Err(error) => {
                return control::error_reply(&format!(
                "cannot add {label}: {error}\n  hint: wait for the run to end and start a new one"
            ))
            }
        };
        let index = self.specs.len();
        self.specs.push(ReplicaSpec {
            process: request.name.clone(),
            replica,
            label: label.clone(),
            file_stem: format!("{}.{replica}", request.name),
            launch: Launch {
                argv,
                env,
                cwd,
                output: Output::Pipes,
            },
            after: Vec::new(),
            restart: RestartSpec::default(),
            stop_signal: Signal::SIGINT,
            grace_ms: gpuvisor_core::spec::StopSpec::default().grace_ms,
            readiness: Readiness::Started,
            budget_bytes: planned.budget_bytes,
            direct_logs: false,
        });
        self.tracks.push(Track::default());
        if !self.added.contains(&request.name) {
            self.added.push(request.name.clone());
        }
        let room = if ask.is_some() {
            Room::Queued
        } else {
            Room::Free
        };
        let member = member_of(&self.specs[index], room);
        self.machine.add(member);
        self.events.write(&Event::Control {
            cmd: Value::from("enqueue"),
            process: Some(label.clone()),
            replica: Some(replica),
            argv: Some(self.specs[index].launch.argv.clone()),
        });
        let now = self.now_ms();
        let actions = match &mut self.admission {
            Some(queue) => queue.add(now, index, ask, label.clone()),
            None => Vec::new(),
        };
        self.act_on_queue(actions, inputs);
        inputs.push(Input::Tick);
        json!({ "ok": true, "label": label, "position": self.queue_position(index) })
    }

    /// Why `ask` can never be admitted: each GPU's usable memory against its footprint.
    fn never_fits(&self, ask: Ask) -> String {
        let Some(queue) = &self.admission else {
            return String::new();
        };
        let MemoryAsk::Bytes(bytes) = ask.memory else {
            return "it does not fit".into();
        };
        let overhead = queue.overhead_bytes();
        let footprint = bytes + overhead;
        let usable = &queue.books().usable_bytes;
        let mut message = format!(
            "it can never be admitted: it asks {} + {} context on {} GPU{}, and the job's GPUs are",
            ByteSize(bytes),
            ByteSize(overhead),
            ask.gpus,
            if ask.gpus == 1 { "" } else { "s" }
        );
        for (i, usable) in usable.iter().enumerate() {
            let index = self.options.gpu_indices.get(i).copied().unwrap_or(i as u32);
            let verdict = match footprint.checked_sub(*usable) {
                Some(short) if short > 0 => format!("short by {}", ByteSize(short)),
                _ => "fits".to_string(),
            };
            message.push_str(&format!(
                "\n  GPU {index}: usable {} (empty): {verdict}",
                ByteSize(*usable)
            ));
        }
        let most = usable
            .iter()
            .max()
            .copied()
            .unwrap_or(0)
            .saturating_sub(overhead);
        let hint = if ask.gpus > usable.len() {
            format!(
                "the job has {} GPU{}: ask for fewer with --gpus",
                usable.len(),
                if usable.len() == 1 { "" } else { "s" }
            )
        } else {
            format!("--mem {} at most", ByteSize(most))
        };
        format!("{message}\n  hint: {hint}")
    }

    /// Its 1-based place in the queue, if it waits.
    pub(super) fn queue_position(&self, index: usize) -> Option<usize> {
        self.admission.as_ref()?.position(index)
    }

    /// How long it waited for room, with a queue.
    pub(super) fn waited_ms(&self, index: usize) -> Option<u64> {
        let now = self.now_ms();
        Some(self.admission.as_ref()?.waited_ms(index, now))
    }
}

/// The reply to a queue request in a job without a queue.
fn no_queue(job: &str) -> Value {
    control::error_reply(&format!(
        "job {job} has no queue: every replica was placed at the start\n  hint: set admission = \"queue\" in the job file's [job] to queue replicas that do not fit"
    ))
}

/// What the queue holds, for hints.
fn queued_hint(waiting: &[String]) -> String {
    match waiting {
        [] => "nothing is queued now".to_string(),
        labels => format!("queued now: {}", labels.join(", ")),
    }
}
