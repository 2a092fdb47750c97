//! When the pump looks at direct logs: inotify says which replicas' files changed, the
//! descriptor stays out of the epoll set for [`LOOK_EVERY`] after each event so that a chatty
//! child's writes gather into one look, a file that keeps growing is polled without its watch
//! (a watch costs the child an event on every write), and every replica is looked at once per
//! [`LOOK_ALL_EVERY`] in case an event was lost. What a look does is [`DirectReplica::look`].

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use super::direct::{DirectReplica, LOOK_EVERY};

/// The epoll token of the inotify descriptor.
pub(super) const INOTIFY_TOKEN: u64 = u64::MAX;
/// Direct logs are looked at this often even without an inotify event (a lost or
/// overflowed event, or no inotify at all).
const LOOK_ALL_EVERY: Duration = Duration::from_secs(1);

/// The replicas with direct logs and when each is looked at next.
pub(super) struct DirectLogs {
    /// By replica index.
    replicas: Vec<Option<DirectReplica>>,
    /// Created at the first replica; `None` without inotify (then every
    /// [`LOOK_ALL_EVERY`]).
    inotify: Option<Inotify>,
    watches: HashMap<WatchDescriptor, usize>,
    /// Replicas whose files changed since the last look.
    dirty: Vec<usize>,
    /// Replicas whose files grew at their last look: looked at every [`LOOK_EVERY`] without
    /// watches until a look finds them quiet.
    polled: BTreeSet<usize>,
    /// The inotify descriptor is in the epoll set (one shot).
    armed: bool,
    look_due: Option<Instant>,
    last_look_all: Instant,
}

impl DirectLogs {
    pub(super) fn new() -> DirectLogs {
        DirectLogs {
            replicas: Vec::new(),
            inotify: None,
            watches: HashMap::new(),
            dirty: Vec::new(),
            polled: BTreeSet::new(),
            armed: true,
            look_due: None,
            last_look_all: Instant::now(),
        }
    }

    /// Whether a look is due soon (the pump then waits 1 ms at most).
    pub(super) fn look_pending(&self) -> bool {
        self.look_due.is_some()
    }

    /// Replica `replica`'s current life, if it has direct logs.
    pub(super) fn get_mut(&mut self, replica: usize) -> Option<&mut DirectReplica> {
        self.replicas.get_mut(replica).and_then(Option::as_mut)
    }

    /// Starts watching `log`, replica `replica`'s new life (replacing a life whose exit was
    /// not seen: its files are the same). It is looked at soon: it may have written before
    /// its files were watched.
    pub(super) fn add(&mut self, replica: usize, log: DirectReplica, epoll: &Epoll) {
        if self.replicas.len() <= replica {
            self.replicas.resize_with(replica + 1, || None);
        }
        self.unwatch(replica);
        self.polled.remove(&replica);
        if self.inotify.is_none() {
            match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
                Ok(inotify) if epoll.add(&inotify, one_shot()).is_ok() => {
                    self.inotify = Some(inotify);
                    self.armed = true;
                }
                Ok(_) => {}
                Err(error) => eprintln!(
                    "gpuvisor: inotify is not available ({error}): direct logs are dated once a second"
                ),
            }
        }
        self.replicas[replica] = Some(log);
        self.watch(replica);
        self.dirty.push(replica);
        self.look_due
            .get_or_insert_with(|| Instant::now() + LOOK_EVERY);
    }

    /// Takes replica `replica`'s life out (it ended); `None` if it has none.
    pub(super) fn remove(&mut self, replica: usize) -> Option<DirectReplica> {
        self.unwatch(replica);
        self.polled.remove(&replica);
        self.replicas.get_mut(replica)?.take()
    }

    /// Reads what inotify queued: which replicas' files changed. The descriptor stays out of
    /// the epoll set until they have been looked at.
    pub(super) fn take_events(&mut self) {
        self.armed = false;
        let Some(inotify) = &self.inotify else { return };
        loop {
            match inotify.read_events() {
                Ok(events) if !events.is_empty() => {
                    for event in events {
                        if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                            self.last_look_all = Instant::now() - LOOK_ALL_EVERY;
                        } else if let Some(&replica) = self.watches.get(&event.wd) {
                            self.dirty.push(replica);
                        }
                    }
                }
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break, // EAGAIN: all read
            }
        }
        self.look_due
            .get_or_insert_with(|| Instant::now() + LOOK_EVERY);
    }

    /// The replicas to look at now, if a look is due: the changed and the polled ones; all
    /// of them every [`LOOK_ALL_EVERY`] and when `ending`. Tell [`DirectLogs::looked`] what
    /// each look found, then [`DirectLogs::rearm`].
    pub(super) fn due(&mut self, ending: bool) -> Vec<usize> {
        let now = Instant::now();
        if ending || now.duration_since(self.last_look_all) >= LOOK_ALL_EVERY {
            self.last_look_all = now;
            self.dirty = (0..self.replicas.len())
                .filter(|&replica| self.replicas[replica].is_some())
                .collect();
            self.look_due = Some(now);
        }
        if self.look_due.is_none_or(|due| now < due) {
            return Vec::new();
        }
        self.look_due = None;
        let mut due = std::mem::take(&mut self.dirty);
        due.extend(self.polled.iter().copied());
        due.sort_unstable();
        due.dedup();
        due
    }

    /// What the look at `replica` found: a file that grew is polled without its watch; once
    /// it is quiet the watch goes back on, with one more look for what came in between.
    pub(super) fn looked(&mut self, replica: usize, grew: bool) {
        let polled = self.polled.contains(&replica);
        if grew && !polled && self.inotify.is_some() {
            self.unwatch(replica);
            self.polled.insert(replica);
        } else if !grew && polled {
            self.polled.remove(&replica);
            self.watch(replica);
            self.dirty.push(replica);
        }
    }

    /// After the looks: the next one is due in [`LOOK_EVERY`] while any replica is polled or
    /// changed; the inotify descriptor goes back into the epoll set.
    pub(super) fn rearm(&mut self, epoll: &Epoll) {
        if !self.polled.is_empty() || !self.dirty.is_empty() {
            self.look_due = Some(Instant::now() + LOOK_EVERY);
        }
        if !self.armed {
            if let Some(inotify) = &self.inotify {
                self.armed = epoll.modify(inotify, &mut one_shot()).is_ok();
            }
        }
    }

    fn watch(&mut self, replica: usize) {
        let (Some(inotify), Some(Some(log))) = (&self.inotify, self.replicas.get(replica)) else {
            return;
        };
        for path in log.paths() {
            match inotify.add_watch(path, AddWatchFlags::IN_MODIFY) {
                Ok(wd) => {
                    self.watches.insert(wd, replica);
                }
                Err(error) => eprintln!(
                    "gpuvisor: cannot watch {} ({error}): it is dated once a second",
                    path.display()
                ),
            }
        }
    }

    fn unwatch(&mut self, replica: usize) {
        let Some(inotify) = &self.inotify else { return };
        let gone: Vec<WatchDescriptor> = self
            .watches
            .iter()
            .filter(|(_, &owner)| owner == replica)
            .map(|(&wd, _)| wd)
            .collect();
        for wd in gone {
            let _ = inotify.rm_watch(wd);
            self.watches.remove(&wd);
        }
    }
}

fn one_shot() -> EpollEvent {
    EpollEvent::new(
        EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT,
        INOTIFY_TOKEN,
    )
}
