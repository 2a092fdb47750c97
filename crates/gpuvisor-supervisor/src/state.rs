//! The restart / readiness / shutdown state machine, as plain data: [`Machine::step`] takes the
//! time and one [`Input`] (a child started, became ready, exited; a signal; a control command)
//! and answers with [`Action`]s (spawn replica R, signal replica R, write this event, finish).
//! It never touches a process, so it is tested with fake children (see the tests below).
//!
//! Rules:
//! - A replica starts when every replica of every process in its `after` is ready (or has
//!   exited successfully after being ready).
//! - On exit, the restart policy decides; restarts within `window` are counted and when the
//!   count reaches `max_restarts` the process is crash-looping: it is given up with a
//!   `crash-loop` event. The delay is `backoff * 2^n` (n = restarts in the window), capped at
//!   `backoff_max`, with ±20% jitter.
//! - `restart_dependents`: when a process restarts, the processes after it (transitively) are
//!   stopped and start again once it is ready.
//! - A process that fails for good (no restart left) ends the job (nothing further starts, exit
//!   status 1), except a replica under queued admission (one of a sweep): the job goes on and
//!   exits 1 at its end; a process marked `ends_job` ends the job when it exits for good,
//!   whatever its status.
//! - Queued admission: a [`Room::Queued`] replica starts in [`Phase::Queued`] and waits for
//!   [`Input::Admitted`]; a replica that holds room (or a place in the queue) gives it up with
//!   [`Action::Release`] once it ends for good (restarts keep it), and one run again after
//!   that queues anew ([`Action::Enqueue`]). Stopping or shutting down a queued replica stops
//!   it where it is.
//! - Shutdown stops replicas in reverse dependency order, one level at a time: the configured
//!   signal, then SIGKILL after the grace period; [`Input::Escalate`] kills everything at once.

use std::collections::VecDeque;

use gpuvisor_core::spec::RestartPolicy;

use crate::events::Event;
use gpuvisor_record::event::{BlockedReason, GaveUp};
use gpuvisor_record::RestartReason;

mod types;
pub use types::{Action, AfterStop, Input, Member, Phase, Room};

/// One replica's state.
#[derive(Debug, Clone)]
pub struct Slot {
    /// Its configuration.
    pub member: Member,
    /// Where it is.
    pub phase: Phase,
    /// Restarts so far (all kinds).
    pub restarts: u32,
    /// Times (ms) of policy restarts inside the current window.
    recent: VecDeque<u64>,
    /// Became ready at least once in its current life.
    was_ready: bool,
    /// Level in the dependency graph: 0 for no `after`.
    level: usize,
    /// The admission queue knows it: it holds room or waits for it.
    claim: bool,
}

impl Slot {
    /// A replica that has not started: queued for room, or waiting for its `after`.
    fn new(member: Member, level: usize) -> Slot {
        Slot {
            claim: member.room != Room::Free,
            phase: match member.room {
                Room::Queued => Phase::Queued,
                _ => Phase::Waiting,
            },
            member,
            restarts: 0,
            recent: VecDeque::new(),
            was_ready: false,
            level,
        }
    }
}

/// The state machine of one job.
#[derive(Debug)]
pub struct Machine {
    slots: Vec<Slot>,
    /// Processes named in an `after` that have no replica here (they run on other nodes),
    /// with whether they are ready job-wide ([`Input::Gate`]).
    gates: std::collections::BTreeMap<String, bool>,
    shutting_down: bool,
    failed: bool,
    finished: bool,
    rng: u64,
    /// The last pass over the replicas ([`Machine::advance`]) found nothing to do: until an
    /// input other than [`Input::Tick`] or the next deadline, another pass would find nothing
    /// either, so a tick is answered without visiting the replicas.
    settled: bool,
    /// The first deadline (a backoff ending, a grace period running out) as of the last pass.
    next_due: Option<u64>,
}

impl Machine {
    /// A machine for these replicas (in plan order); `seed` drives the backoff jitter.
    pub fn new(members: Vec<Member>, seed: u64) -> Machine {
        let levels = levels(&members);
        let gates = members
            .iter()
            .flat_map(|member| member.after.iter())
            .filter(|name| !members.iter().any(|other| &other.process == *name))
            .map(|name| (name.clone(), false))
            .collect();
        let slots = members
            .into_iter()
            .zip(levels)
            .map(|(member, level)| Slot::new(member, level))
            .collect();
        Machine {
            slots,
            gates,
            shutting_down: false,
            failed: false,
            finished: false,
            rng: seed | 1,
            settled: false,
            next_due: None,
        }
    }

    /// Adds a replica while the job runs (`gpuvisor queue add`); returns its index. It has
    /// no `after` here: it waits only for room ([`Room::Queued`]) or starts at the next step.
    pub fn add(&mut self, member: Member) -> usize {
        self.slots.push(Slot::new(member, 0));
        self.settled = false;
        self.slots.len() - 1
    }

    /// Every replica's state.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Shutting down.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// The first time something is due (a backoff ending, a grace period running out), as of
    /// the last step (only a step changes the replicas).
    pub fn next_deadline(&self) -> Option<u64> {
        self.next_due
    }

    fn first_deadline(&self) -> Option<u64> {
        self.slots
            .iter()
            .filter_map(|slot| match slot.phase {
                Phase::Backoff { until } => Some(until),
                Phase::Stopping {
                    kill_at,
                    killed: false,
                    ..
                } => Some(kill_at),
                _ => None,
            })
            .min()
    }

    /// Feeds one input at time `now` (ms, any fixed origin) and returns what to do.
    pub fn step(&mut self, now: u64, input: Input) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.finished {
            return actions;
        }
        // The event loop ticks on every wake-up: with nothing new and nothing due, a tick is
        // answered at once instead of with passes over every replica.
        if matches!(input, Input::Tick) && self.settled && self.next_due.is_none_or(|due| due > now)
        {
            return actions;
        }
        match input {
            Input::Tick => {}
            Input::Spawned(index) => {
                let ready = self.slots[index].member.ready_when_started;
                if self.slots[index].phase == Phase::Starting {
                    self.slots[index].phase = Phase::Running { ready: false };
                    if ready {
                        self.mark_ready(index, &mut actions);
                    }
                }
            }
            Input::SpawnFailed(index, reason) => {
                self.give_up(index, Event::Failed, &reason, &mut actions);
            }
            Input::Ready(index) => {
                if self.slots[index].phase == (Phase::Running { ready: false }) {
                    self.mark_ready(index, &mut actions);
                }
            }
            Input::Exited {
                index,
                success,
                cause,
            } => self.exited(now, index, success, &cause, &mut actions),
            Input::Shutdown(reason) => {
                if !self.shutting_down {
                    actions.push(job_event(Event::Shutdown { reason }));
                    self.begin_shutdown();
                }
            }
            Input::Escalate => {
                self.begin_shutdown();
                for index in 0..self.slots.len() {
                    if self.slots[index].phase.is_live() {
                        self.kill_now(now, index, &mut actions);
                    }
                }
            }
            Input::StopProcess(name) => {
                for index in self.indices_of(&name) {
                    self.request_stop(now, index, AfterStop::Stay, &mut actions);
                }
            }
            Input::RestartProcess(name) => {
                for index in self.indices_of(&name) {
                    self.restart_one(now, index, RestartReason::Requested, &mut actions);
                }
            }
            Input::RestartReplica(index, reason) => {
                self.restart_one(now, index, RestartReason::Other(reason), &mut actions);
            }
            Input::Gate(name, ready) => {
                if let Some(gate) = self.gates.get_mut(&name) {
                    if *gate != ready {
                        *gate = ready;
                        actions.push(job_event(Event::Gate {
                            process: name,
                            ready,
                        }));
                    }
                }
            }
            Input::Admitted(index) => {
                if self.slots[index].phase == Phase::Queued {
                    self.slots[index].phase = Phase::Waiting;
                }
            }
            Input::Dequeue(index) => {
                if self.slots[index].phase == Phase::Queued {
                    self.slots[index].phase = Phase::Stopped;
                }
            }
            Input::KillReplica(index, reason) => {
                if self.slots[index].phase.is_live() {
                    actions.push(replica_event(
                        index,
                        Event::Stop {
                            process: self.slots[index].member.label.clone(),
                            replica: None,
                            reason,
                        },
                    ));
                    self.kill_now(now, index, &mut actions);
                    if let Phase::Stopping {
                        kill_at, killed, ..
                    } = self.slots[index].phase
                    {
                        self.slots[index].phase = Phase::Stopping {
                            kill_at,
                            killed,
                            then: AfterStop::Stay,
                        };
                    }
                }
            }
        }
        let before = actions.len();
        self.advance(now, &mut actions);
        // One pass that found nothing to do leaves nothing for the next one (its only change
        // without an action, a backoff ending, is followed in the same pass by the start
        // check); a pass that did something may have made more due (a blocked replica blocks
        // the ones after it at the next pass).
        self.settled = actions.len() == before;
        self.next_due = self.first_deadline();
        actions
    }

    fn restart_one(
        &mut self,
        now: u64,
        index: usize,
        reason: RestartReason,
        actions: &mut Vec<Action>,
    ) {
        let slot = &mut self.slots[index];
        slot.restarts += 1;
        actions.push(replica_event(
            index,
            Event::Restart {
                process: slot.member.label.clone(),
                replica: None,
                reason,
                delay_ms: None,
                restarts: Some(slot.restarts),
            },
        ));
        if slot.phase.is_live() {
            self.request_stop(now, index, AfterStop::Restart, actions);
        } else if slot.phase != Phase::Queued {
            self.rewait(index, actions);
        }
    }

    /// Back to waiting for its `after`; a queued-admission replica whose room was given up
    /// queues for room first.
    fn rewait(&mut self, index: usize, actions: &mut Vec<Action>) {
        let slot = &mut self.slots[index];
        if slot.member.room != Room::Free && !slot.claim {
            slot.claim = true;
            slot.phase = Phase::Queued;
            actions.push(Action::Enqueue(index));
        } else {
            slot.phase = Phase::Waiting;
        }
    }

    fn indices_of(&self, process: &str) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&index| self.slots[index].member.process == process)
            .collect()
    }

    fn mark_ready(&mut self, index: usize, actions: &mut Vec<Action>) {
        let slot = &mut self.slots[index];
        slot.phase = Phase::Running { ready: true };
        slot.was_ready = true;
        actions.push(replica_event(
            index,
            Event::Ready {
                process: slot.member.label.clone(),
                replica: None,
            },
        ));
    }

    fn exited(
        &mut self,
        now: u64,
        index: usize,
        success: bool,
        cause: &str,
        actions: &mut Vec<Action>,
    ) {
        let phase = self.slots[index].phase;
        match phase {
            Phase::Stopping { then, .. } => {
                self.slots[index].phase = match then {
                    AfterStop::Stay => Phase::Stopped,
                    AfterStop::Restart if !self.shutting_down => Phase::Waiting,
                    AfterStop::Rewait if !self.shutting_down => Phase::Waiting,
                    _ => Phase::Stopped,
                };
                self.slots[index].was_ready = false;
                return;
            }
            Phase::Starting | Phase::Running { .. } => {}
            _ => return, // a stale report
        }
        let slot = &mut self.slots[index];
        slot.was_ready = slot.was_ready && success;
        if slot.member.ready_when_exited && success {
            slot.was_ready = true;
            slot.phase = Phase::Done { success: true };
            actions.push(replica_event(
                index,
                Event::Ready {
                    process: slot.member.label.clone(),
                    replica: None,
                },
            ));
            return;
        }
        if self.shutting_down {
            slot.phase = Phase::Stopped;
            return;
        }
        let wants_restart = match slot.member.restart.policy {
            RestartPolicy::No => false,
            RestartPolicy::OnFailure => !success,
            RestartPolicy::Always => true,
        };
        if !wants_restart {
            slot.phase = Phase::Done { success };
            if !success {
                self.give_up(index, Event::Failed, cause, actions);
            } else if slot.member.restart.ends_job {
                let label = slot.member.label.clone();
                actions.push(job_event(Event::Shutdown {
                    reason: format!("{label} exited and ends the job"),
                }));
                self.begin_shutdown();
            }
            return;
        }
        let window = slot.member.restart.window_ms;
        while slot
            .recent
            .front()
            .is_some_and(|&at| now.saturating_sub(at) > window)
        {
            slot.recent.pop_front();
        }
        if slot.recent.len() as u32 >= slot.member.restart.max_restarts {
            let reason = format!(
                "{} restarts within {} ms, last exit: {cause}",
                slot.recent.len(),
                window
            );
            self.give_up(index, Event::CrashLoop, &reason, actions);
            return;
        }
        let attempt = slot.recent.len() as u32;
        let base = slot
            .member
            .restart
            .backoff_initial_ms
            .saturating_mul(1u64 << attempt.min(32))
            .min(slot.member.restart.backoff_max_ms);
        let delay = jitter(base, next_random(&mut self.rng))
            .min(slot.member.restart.backoff_max_ms)
            .max(MIN_RESTART_DELAY_MS);
        let slot = &mut self.slots[index];
        slot.recent.push_back(now);
        slot.restarts += 1;
        slot.phase = Phase::Backoff { until: now + delay };
        actions.push(replica_event(
            index,
            Event::Restart {
                process: slot.member.label.clone(),
                replica: None,
                reason: RestartReason::Policy,
                delay_ms: Some(delay),
                restarts: Some(slot.restarts),
            },
        ));
        if slot.member.restart.restart_dependents {
            let process = slot.member.process.clone();
            for dependent in self.dependents(&process) {
                self.restart_with(now, dependent, &process, actions);
            }
        }
    }

    /// Stops `index` because `cause_process` restarts, to start it again once that is ready.
    fn restart_with(
        &mut self,
        now: u64,
        index: usize,
        cause_process: &str,
        actions: &mut Vec<Action>,
    ) {
        let slot = &mut self.slots[index];
        if slot.phase.is_final() {
            return;
        }
        slot.restarts += 1;
        actions.push(replica_event(
            index,
            Event::Restart {
                process: slot.member.label.clone(),
                replica: None,
                reason: RestartReason::Group {
                    after: cause_process.to_string(),
                },
                delay_ms: None,
                restarts: None,
            },
        ));
        if slot.phase.is_live() {
            self.request_stop(now, index, AfterStop::Rewait, actions);
        } else if slot.phase != Phase::Queued {
            self.rewait(index, actions);
        }
    }

    /// Every replica whose process is after `process`, directly or through others.
    fn dependents(&self, process: &str) -> Vec<usize> {
        let mut names = vec![process.to_string()];
        let mut cursor = 0;
        while cursor < names.len() {
            let name = names[cursor].clone();
            for slot in &self.slots {
                if slot.member.after.contains(&name) && !names.contains(&slot.member.process) {
                    names.push(slot.member.process.clone());
                }
            }
            cursor += 1;
        }
        (0..self.slots.len())
            .filter(|&index| names[1..].contains(&self.slots[index].member.process))
            .collect()
    }

    fn give_up(
        &mut self,
        index: usize,
        kind: fn(GaveUp) -> Event,
        reason: &str,
        actions: &mut Vec<Action>,
    ) {
        let slot = &mut self.slots[index];
        slot.phase = Phase::Failed;
        actions.push(replica_event(
            index,
            kind(GaveUp {
                process: slot.member.label.clone(),
                replica: None,
                reason: reason.to_string(),
            }),
        ));
        let label = slot.member.label.clone();
        self.failed = true;
        // A queued replica is one of many (a sweep): its room returns and the rest go on.
        if !self.shutting_down && slot.member.room == Room::Free {
            actions.push(job_event(Event::Shutdown {
                reason: format!("{label} failed"),
            }));
            self.begin_shutdown();
        }
    }

    fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        for slot in &mut self.slots {
            if matches!(
                slot.phase,
                Phase::Queued | Phase::Waiting | Phase::Backoff { .. }
            ) {
                slot.phase = Phase::Stopped;
            }
        }
    }

    fn request_stop(&mut self, now: u64, index: usize, then: AfterStop, actions: &mut Vec<Action>) {
        let slot = &mut self.slots[index];
        match slot.phase {
            Phase::Starting | Phase::Running { .. } => {
                slot.phase = Phase::Stopping {
                    kill_at: now + slot.member.grace_ms,
                    killed: false,
                    then,
                };
                actions.push(Action::Stop(index));
            }
            Phase::Stopping {
                kill_at, killed, ..
            } => {
                slot.phase = Phase::Stopping {
                    kill_at,
                    killed,
                    then,
                };
            }
            Phase::Waiting | Phase::Backoff { .. } => {
                slot.phase = match then {
                    AfterStop::Stay => Phase::Stopped,
                    _ => Phase::Waiting,
                };
            }
            Phase::Queued if then == AfterStop::Stay => slot.phase = Phase::Stopped,
            _ => {}
        }
    }

    fn kill_now(&mut self, now: u64, index: usize, actions: &mut Vec<Action>) {
        let slot = &mut self.slots[index];
        let then = match slot.phase {
            Phase::Stopping { killed: true, .. } => return,
            Phase::Stopping { then, .. } => then,
            _ => AfterStop::Stay,
        };
        slot.phase = Phase::Stopping {
            kill_at: now,
            killed: true,
            then,
        };
        actions.push(Action::Kill(index));
    }

    /// Everything time or other replicas make due: starts, SIGKILLs after grace, the next
    /// shutdown level, the end of the job.
    fn advance(&mut self, now: u64, actions: &mut Vec<Action>) {
        for index in 0..self.slots.len() {
            match self.slots[index].phase {
                Phase::Stopping {
                    kill_at,
                    killed: false,
                    ..
                } if kill_at <= now => self.kill_now(now, index, actions),
                Phase::Backoff { until } if until <= now && !self.shutting_down => {
                    self.slots[index].phase = Phase::Waiting;
                }
                _ => {}
            }
        }
        if self.shutting_down {
            // Stop the deepest level still running; shallower levels wait until it is gone.
            let deepest = self
                .slots
                .iter()
                .filter(|slot| slot.phase.is_live())
                .map(|slot| slot.level)
                .max();
            if let Some(level) = deepest {
                for index in 0..self.slots.len() {
                    let slot = &self.slots[index];
                    if slot.level == level
                        && matches!(slot.phase, Phase::Starting | Phase::Running { .. })
                    {
                        self.request_stop(now, index, AfterStop::Stay, actions);
                    }
                }
            }
        } else {
            for index in 0..self.slots.len() {
                let phase = self.slots[index].phase;
                if !matches!(phase, Phase::Waiting | Phase::Queued) {
                    continue;
                }
                if let Some(blocker) = self.dead_dependency(index) {
                    let slot = &mut self.slots[index];
                    slot.phase = Phase::Failed;
                    self.failed = true;
                    actions.push(replica_event(
                        index,
                        Event::Blocked {
                            process: slot.member.label.clone(),
                            replica: None,
                            reason: BlockedReason::Ended { blocker },
                        },
                    ));
                } else if phase == Phase::Waiting && self.dependencies_ready(index) {
                    self.slots[index].phase = Phase::Starting;
                    self.slots[index].was_ready = false;
                    actions.push(Action::Spawn(index));
                }
            }
        }
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.claim && slot.phase.is_final() {
                slot.claim = false;
                actions.push(Action::Release(index));
            }
        }
        if self.slots.iter().all(|slot| slot.phase.is_final()) {
            self.finished = true;
            let code = u8::from(self.failed);
            actions.push(job_event(Event::job_end(i32::from(code))));
            actions.push(Action::Finish(code));
        }
    }

    /// A replica this one waits for that will never become ready.
    fn dead_dependency(&self, index: usize) -> Option<String> {
        let after = &self.slots[index].member.after;
        self.slots
            .iter()
            .find(|slot| {
                after.contains(&slot.member.process) && slot.phase.is_final() && !slot.was_ready
            })
            .map(|slot| slot.member.label.clone())
    }

    fn dependencies_ready(&self, index: usize) -> bool {
        self.slots[index].member.after.iter().all(|name| {
            if let Some(ready) = self.gates.get(name) {
                return *ready;
            }
            self.slots
                .iter()
                .filter(|slot| &slot.member.process == name)
                .all(|slot| {
                    slot.was_ready
                        && matches!(
                            slot.phase,
                            Phase::Running { ready: true } | Phase::Done { success: true }
                        )
                })
        })
    }
}

fn replica_event(index: usize, event: Event) -> Action {
    Action::Event {
        replica: Some(index),
        event: Box::new(event),
    }
}

fn job_event(event: Event) -> Action {
    Action::Event {
        replica: None,
        event: Box::new(event),
    }
}

/// Depth of each member in the `after` graph (the parser guarantees it has no cycle).
fn levels(members: &[Member]) -> Vec<usize> {
    fn level_of(process: &str, members: &[Member], depth: usize) -> usize {
        let Some(member) = members.iter().find(|member| member.process == process) else {
            return 0;
        };
        if depth > members.len() {
            return 0; // a cycle slipped through: do not recurse forever
        }
        member
            .after
            .iter()
            .map(|name| 1 + level_of(name, members, depth + 1))
            .max()
            .unwrap_or(0)
    }
    members
        .iter()
        .map(|member| level_of(&member.process, members, 0))
        .collect()
}

/// xorshift64: jitter needs no quality, only no dependency.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// `base` scaled by a factor in [0.8, 1.2).
/// The shortest wait before a restart, whatever `backoff` says: `backoff = "0ms"` with
/// `restart = "always"` restarted a quick exit 200 times a second (and wrote 91 KB/s of
/// events). The supervisor says so once at start for a process whose `backoff` is shorter.
pub const MIN_RESTART_DELAY_MS: u64 = 100;

fn jitter(base: u64, random: u64) -> u64 {
    let factor = 0.8 + (random % 4000) as f64 / 10_000.0;
    (base as f64 * factor) as u64
}

#[cfg(test)]
mod tests;
