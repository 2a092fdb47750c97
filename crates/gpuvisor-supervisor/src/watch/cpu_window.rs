//! One replica's CPU use averaged over the last [`CPU_WINDOW_MS`], for the stall classifier.
//!
//! Each tick's reading is the rate since the previous tick. The window keeps the cumulative
//! CPU (percent·ms) only where the rate changed: a replica whose rate holds (a sleeping one
//! reads 0% tick after tick) costs a comparison per tick, not a new entry, and the total at
//! any time in between is the last point plus the rate times the time since.

use std::collections::VecDeque;

/// How far back CPU use is averaged for stall classification.
pub(super) const CPU_WINDOW_MS: u64 = 10_000;

/// The readings of one replica, as a piecewise-constant rate.
#[derive(Debug, Clone, Default)]
pub(super) struct CpuWindow {
    /// (time ms, cumulative percent·ms then): the rate changed at each, the first one at or
    /// before the window's start.
    points: VecDeque<(u64, f64)>,
    /// The rate since the last point, and the time of the latest reading at that rate.
    rate: f32,
    latest_ms: u64,
}

impl CpuWindow {
    /// Takes the reading at `now`: `percent` since the previous reading (`interval_ms`
    /// before the first one).
    pub(super) fn record(&mut self, now: u64, percent: f32, interval_ms: u64) {
        let Some(&(last_ms, last_total)) = self.points.back() else {
            self.points
                .push_back((now.saturating_sub(interval_ms), 0.0));
            self.rate = percent;
            self.latest_ms = now;
            return;
        };
        if percent != self.rate {
            // The old rate held until the previous reading; the new one covers the time since.
            let until = self.latest_ms;
            let total = last_total + f64::from(self.rate) * until.saturating_sub(last_ms) as f64;
            if until > last_ms {
                self.points.push_back((until, total));
            } else if let Some(back) = self.points.back_mut() {
                back.1 = total;
            }
            self.rate = percent;
        }
        self.latest_ms = now;
        let start = now.saturating_sub(CPU_WINDOW_MS);
        while self.points.len() > 1 && self.points[1].0 <= start {
            self.points.pop_front();
        }
    }

    /// The cumulative CPU at `at` (not before the first point).
    fn total_at(&self, at: u64) -> f64 {
        let mut before = self.points.front().copied().unwrap_or((at, 0.0));
        let mut rate = None;
        for (position, &point) in self.points.iter().enumerate() {
            if point.0 > at {
                // Between two points the rate is the slope of the segment.
                let span = point.0.saturating_sub(before.0).max(1) as f64;
                rate = Some((point.1 - before.1) / span);
                break;
            }
            before = point;
            if position + 1 == self.points.len() {
                rate = Some(f64::from(self.rate));
            }
        }
        before.1 + rate.unwrap_or(0.0) * at.saturating_sub(before.0) as f64
    }

    /// The average percent over the window ending at the latest reading (over what there is
    /// when less was recorded); `None` before the first reading.
    pub(super) fn average(&self) -> Option<f32> {
        let &(first_ms, _) = self.points.front()?;
        let end = self.latest_ms;
        let start = end.saturating_sub(CPU_WINDOW_MS).max(first_ms);
        if end <= start {
            return Some(self.rate);
        }
        let used = self.total_at(end) - self.total_at(start);
        Some((used / (end - start) as f64) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `readings` (percent per tick) every `step` ms from `start`.
    fn fed(start: u64, step: u64, readings: &[f32]) -> CpuWindow {
        let mut window = CpuWindow::default();
        for (tick, &percent) in readings.iter().enumerate() {
            window.record(start + tick as u64 * step, percent, step);
        }
        window
    }

    /// Readings of each `(percent, ticks)` run in turn.
    fn runs(parts: &[(f32, usize)]) -> Vec<f32> {
        parts
            .iter()
            .flat_map(|&(percent, ticks)| std::iter::repeat_n(percent, ticks))
            .collect()
    }

    fn assert_near(average: Option<f32>, expected: f32, within: f32) {
        let average = average.unwrap();
        assert!(
            (average - expected).abs() < within,
            "{average} vs {expected}"
        );
    }

    #[test]
    fn a_first_reading_is_its_own_average() {
        assert_eq!(fed(5_000, 100, &[40.0]).average(), Some(40.0));
        assert_eq!(CpuWindow::default().average(), None);
    }

    #[test]
    fn a_steady_rate_keeps_one_point() {
        let window = fed(0, 100, &[25.0; 500]);
        assert_eq!(window.points.len(), 1);
        assert_eq!(window.average(), Some(25.0));
    }

    #[test]
    fn the_average_covers_the_last_ten_seconds_only() {
        // 20 s busy at 100%, then 5 s idle: the last 10 s were half busy.
        assert_near(
            fed(0, 100, &runs(&[(100.0, 200), (0.0, 50)])).average(),
            50.0,
            1.5,
        );
        // Another 5 s idle: the busy time has left the window.
        let readings = runs(&[(100.0, 200), (0.0, 101)]);
        assert_eq!(fed(0, 100, &readings).average(), Some(0.0));
    }

    #[test]
    fn changes_are_weighed_by_how_long_they_held() {
        // 1 s at 90%, 3 s at 10%: (900 + 3000) / 4000 ms = 30%, with the first reading
        // covering the interval before it.
        let readings = runs(&[(90.0, 10), (10.0, 30)]);
        assert_near(fed(1_000, 100, &readings).average(), 30.0, 0.01);
    }

    #[test]
    fn old_points_are_dropped() {
        let readings: Vec<f32> = (0..1_000).map(|tick| (tick % 2) as f32).collect();
        let window = fed(0, 100, &readings);
        assert!(window.points.len() <= 102, "{}", window.points.len());
        assert_near(window.average(), 0.5, 0.02);
    }
}
