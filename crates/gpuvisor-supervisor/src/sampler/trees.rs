//! The replicas' process trees as the sampler knows them: each replica's members (its
//! keeper's descendants, the keeper left out) and every member's /proc/PID/stat from the
//! tree's last discovery.
//!
//! A tree is rediscovered (children lists from the keeper down, each member's stat) when its
//! group changed, and then every [`DISCOVER_EVERY`] only if something in it may have changed:
//! a member ran or went away since (its CPU time moved, see [`Tree::stir`]), or a member has
//! more than one thread (/proc/PID/schedstat counts the main thread only, so another thread's
//! fork would go unseen). A process is only ever born from a running one, so a tree none of
//! whose members ran has the same members; such a quiet tree is still rediscovered once every
//! [`QUIET_DISCOVER_EVERY`] discoveries (its members' resident memory can shrink without them
//! running), spread over the discoveries by replica index. With 1,024 sleeping replicas the
//! children lists and stats were two-thirds of the sampler's /proc reads.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::PidMap;
use crate::procfs::{self, ProcSample, StatReader};

/// How often replica trees that may have changed are rediscovered.
pub const DISCOVER_EVERY: Duration = Duration::from_secs(2);
/// A quiet tree is rediscovered at one discovery in this many (every 10 s).
pub const QUIET_DISCOVER_EVERY: u64 = 5;

/// One replica's tree at its last discovery.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    /// The replica's process group (its keeper's pid) while it runs.
    pub group: Option<i32>,
    /// Its members: the keeper's descendants.
    pub pids: Vec<i32>,
    /// A member ran or went away since the last discovery.
    stirred: bool,
    /// A member had more than one thread at the last discovery.
    threaded: bool,
}

impl Tree {
    /// A tree known to hold `pids` below keeper `group` (tests set one up by hand).
    #[cfg(test)]
    pub fn known(group: i32, pids: Vec<i32>) -> Tree {
        Tree {
            group: Some(group),
            pids,
            ..Tree::default()
        }
    }

    /// A member ran or went away: rediscover the tree when next due.
    pub fn stir(&mut self) {
        self.stirred = true;
    }
}

/// Every replica's tree, and the files read to find them, kept open.
#[derive(Debug)]
pub struct Trees {
    /// Index = replica index.
    pub trees: Vec<Tree>,
    /// /proc/PID/stat of every member, from its tree's last discovery.
    pub info: PidMap<ProcSample>,
    /// /proc/PID/stat and the main thread's children list of members and keepers.
    stat_files: StatReader,
    children_files: StatReader,
    /// When trees were last due for rediscovery, and how many times they were.
    discovered: Option<Instant>,
    discoveries: u64,
    /// Trees read so far (their children lists and stats).
    pub trees_read: u64,
}

impl Trees {
    /// No trees known yet for `count` replicas.
    pub fn new(count: usize) -> Trees {
        Trees {
            trees: vec![Tree::default(); count],
            info: PidMap::default(),
            stat_files: StatReader::new(),
            children_files: StatReader::for_file("children"),
            discovered: None,
            discoveries: 0,
            trees_read: 0,
        }
    }

    /// Marks the trees as just discovered (tests set up a tree by hand).
    #[cfg(test)]
    pub fn set_discovered(&mut self, now: Instant) {
        self.discovered = Some(now);
    }

    /// Rediscovers the trees that need it (see the module's doc). Returns every member's pid
    /// when any tree was read (files and figures of other pids can go), else `None`.
    pub fn discover(&mut self, groups: &[Option<i32>], now: Instant) -> Option<HashSet<i32>> {
        let due = self
            .discovered
            .is_none_or(|last| now.duration_since(last) >= DISCOVER_EVERY);
        if due {
            self.discovered = Some(now);
            self.discoveries += 1;
        }
        let mut any = false;
        for (index, group) in groups.iter().enumerate().take(self.trees.len()) {
            let tree = &self.trees[index];
            // A new life, or one whose command had not started at the last look.
            let changed = tree.group != *group || (group.is_some() && tree.pids.is_empty());
            let quiet_turn = (self.discoveries + index as u64) % QUIET_DISCOVER_EVERY == 0;
            let may_have_changed = tree.stirred || tree.threaded || quiet_turn;
            if !(changed || due && may_have_changed) {
                continue;
            }
            any = true;
            let tree = match group {
                Some(group) => {
                    self.trees_read += 1;
                    self.read_tree(*group)
                }
                None => Tree::default(),
            };
            self.trees[index] = tree;
        }
        if !(due || any) {
            return None;
        }
        let live: HashSet<i32> = self
            .trees
            .iter()
            .flat_map(|tree| tree.pids.iter().copied())
            .collect();
        let keepers: HashSet<i32> = groups.iter().flatten().copied().collect();
        self.info.retain(|pid, _| live.contains(pid));
        self.stat_files
            .retain(|pid| live.contains(&pid) || keepers.contains(&pid));
        self.children_files
            .retain(|pid| live.contains(&pid) || keepers.contains(&pid));
        Some(live)
    }

    /// The tree below keeper `group` now: its descendants, each one's stat recorded.
    fn read_tree(&mut self, group: i32) -> Tree {
        let mut tree = Tree {
            group: Some(group),
            ..Tree::default()
        };
        let mut stack = self.keeper_children(group);
        while let Some(pid) = stack.pop() {
            if tree.pids.contains(&pid) {
                continue;
            }
            let Some(stat) = self.stat_files.read(pid) else {
                continue;
            };
            tree.pids.push(pid);
            tree.threaded |= stat.threads != 1;
            self.info.insert(pid, stat);
            stack.extend(self.children_of(pid));
        }
        tree
    }

    /// Direct children of a keeper: its kept-open children list, without reading its stat
    /// first (a keeper is ours and has one thread; that read was an eighth of the sampler's
    /// system calls with 1,024 replicas).
    fn keeper_children(&mut self, keeper: i32) -> Vec<i32> {
        match self.children_files.read_with(keeper, procfs::parse_pids) {
            Some(children) => children,
            None => procfs::children(keeper),
        }
    }

    /// Direct children of `pid`: its kept-open children list when it has one thread, else
    /// every thread's.
    fn children_of(&mut self, pid: i32) -> Vec<i32> {
        let threads = match self.info.get(&pid) {
            Some(stat) => stat.threads,
            None => self.stat_files.read(pid).map_or(0, |stat| stat.threads),
        };
        if threads == 1 {
            if let Some(children) = self.children_files.read_with(pid, procfs::parse_pids) {
                return children;
            }
        }
        procfs::children(pid)
    }

    /// The replica whose group leader or known member is `pid`.
    pub fn replica_of(&self, pid: i32) -> Option<usize> {
        self.trees
            .iter()
            .position(|tree| tree.group == Some(pid) || tree.pids.contains(&pid))
    }

    /// Tracks `pid` (found some other way) as a member of replica `index`'s tree from now on.
    pub fn adopt(&mut self, index: usize, pid: i32, stat: ProcSample) {
        self.trees[index].pids.push(pid);
        self.trees[index].threaded |= stat.threads != 1;
        self.info.insert(pid, stat);
    }
}
