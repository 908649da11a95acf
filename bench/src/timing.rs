//! Summaries of timing samples, shared by the benchmark programs.

/// Median and 10th/90th percentiles of timing samples.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

impl Stats {
    /// The summary of `samples` (NaN for each figure when there are none).
    pub fn of(samples: &[f64]) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let index = (q * (sorted.len().saturating_sub(1)) as f64).round() as usize;
            sorted.get(index).copied().unwrap_or(f64::NAN)
        };
        Self {
            median: at(0.5),
            p10: at(0.1),
            p90: at(0.9),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_sample() {
        let samples: Vec<f64> = (1..=11).rev().map(f64::from).collect();
        let stats = Stats::of(&samples);
        assert_eq!((stats.p10, stats.median, stats.p90), (2.0, 6.0, 10.0));
        assert!(Stats::of(&[]).median.is_nan());
    }
}
