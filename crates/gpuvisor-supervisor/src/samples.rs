//! Writing the samples record, `samples/` in the run directory: the three tiers (`full`,
//! `10s`, `1m`), each a current file and one rotated file, so a week-long run stays bounded.
//! The record's format and reading it back are gpuvisor-record's (`gpuvisor_record::samples`,
//! which documents the tiers and the line).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use gpuvisor_record::samples::{
    encode, finish, merge, rotated_file, tier_file, HEADER_FILE, TIERS,
};
pub use gpuvisor_record::samples::{read_samples, GpuPoint, Header, Record, ReplicaPoint};

use crate::sample::Snapshot;

struct Tier {
    name: &'static str,
    /// Record span, ms (0: every tick).
    span_ms: u64,
    /// How long one file covers before it rotates, ms.
    file_ms: u64,
    file: Option<File>,
    file_started_ms: u64,
    bucket: Option<Record>,
}

/// Appends snapshots to the three tiers.
pub struct SampleWriter {
    dir: PathBuf,
    tiers: Vec<Tier>,
    header_written: bool,
    /// The record of the latest tick, refilled by the next (no allocation per tick).
    latest: Record,
}

impl std::fmt::Debug for SampleWriter {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "SampleWriter({})", self.dir.display())
    }
}

const MINUTE_MS: u64 = 60_000;

impl SampleWriter {
    /// Creates `dir`.
    pub fn create(dir: &Path) -> io::Result<SampleWriter> {
        Self::with_spans(
            dir,
            [5 * MINUTE_MS, 12 * 60 * MINUTE_MS, 7 * 24 * 60 * MINUTE_MS],
        )
    }

    /// Like [`SampleWriter::create`] with how long each tier's file covers (tests).
    pub fn with_spans(dir: &Path, file_ms: [u64; 3]) -> io::Result<SampleWriter> {
        fs::create_dir_all(dir)?;
        let tier = |name, span_ms, file_ms| Tier {
            name,
            span_ms,
            file_ms,
            file: None,
            file_started_ms: 0,
            bucket: None,
        };
        Ok(SampleWriter {
            dir: dir.to_path_buf(),
            tiers: TIERS
                .iter()
                .zip(file_ms)
                .map(|(&(name, span_ms), file_ms)| tier(name, span_ms, file_ms))
                .collect(),
            header_written: false,
            latest: Record::default(),
        })
    }

    /// Appends one tick.
    pub fn append(&mut self, snapshot: &Snapshot) -> io::Result<()> {
        if !self.header_written {
            let header = Header {
                job: snapshot.job.clone(),
                interval_ms: snapshot.interval_ms,
                gpus: snapshot.gpus.iter().map(|gpu| gpu.uuid.clone()).collect(),
                replicas: snapshot.replicas.iter().map(|r| r.label.clone()).collect(),
            };
            let text = serde_json::to_string_pretty(&header).map_err(io::Error::other)?;
            fs::write(self.dir.join(HEADER_FILE), text + "\n")?;
            self.header_written = true;
        }
        let mut record = std::mem::take(&mut self.latest);
        fill_record(&mut record, snapshot);
        let written = self.append_record(&record);
        self.latest = record;
        written
    }

    fn append_record(&mut self, record: &Record) -> io::Result<()> {
        let now = record.time_unix_ms;
        for index in 0..self.tiers.len() {
            let tier = &mut self.tiers[index];
            if tier.span_ms == 0 {
                self.write(index, record)?;
                continue;
            }
            let bucket_of = |ms: u64| ms / tier.span_ms;
            let done = match &mut tier.bucket {
                Some(bucket) if bucket_of(bucket.time_unix_ms) == bucket_of(now) => {
                    merge(bucket, record);
                    None
                }
                slot => {
                    let mut start = record.clone();
                    start.time_unix_ms = now - now % tier.span_ms;
                    slot.replace(start).map(finish)
                }
            };
            if let Some(done) = done {
                self.write(index, &done)?;
            }
        }
        Ok(())
    }

    fn write(&mut self, index: usize, record: &Record) -> io::Result<()> {
        let dir = self.dir.clone();
        let tier = &mut self.tiers[index];
        let current = dir.join(tier_file(tier.name));
        if tier.file.is_some() && record.time_unix_ms >= tier.file_started_ms + tier.file_ms {
            tier.file = None;
            fs::rename(&current, dir.join(rotated_file(tier.name)))?;
        }
        if tier.file.is_none() {
            tier.file = Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&current)?,
            );
            tier.file_started_ms = record.time_unix_ms;
        }
        let mut line = encode(record);
        line.push('\n');
        tier.file
            .as_mut()
            .map_or(Ok(()), |file| file.write_all(line.as_bytes()))
    }
}

/// Fills `record` with `snapshot`'s figures, in the record's own buffers.
fn fill_record(record: &mut Record, snapshot: &Snapshot) {
    record.time_unix_ms = snapshot.time_unix_ms;
    record.ticks = 1;
    record.gpus.clear();
    record.gpus.extend(snapshot.gpus.iter().map(|gpu| GpuPoint {
        used_bytes: gpu.used_bytes,
        utilization_percent: gpu.utilization_percent.map(|p| p as f32),
    }));
    record.replicas.clear();
    record
        .replicas
        .extend(snapshot.replicas.iter().map(|replica| ReplicaPoint {
            rss_bytes: replica.rss_bytes,
            cpu_percent: replica.cpu_percent,
            gpu_bytes: replica.gpu_bytes,
            ledger_bytes: replica.ledger_used_bytes,
            processes: replica.process_count,
            untracked_bytes: replica.untracked_bytes,
        }));
}

#[cfg(test)]
mod tests;
