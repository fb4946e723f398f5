//! Summary statistics over repeated runs, and the comparison the report makes
//! before it names a winner: the ratio of means with a bootstrap 95%
//! confidence interval, a win only when the whole interval lies beyond a 5%
//! practical threshold.

use serde::{Deserialize, Serialize};

/// Mean and spread of one metric over the repetitions of a case.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation (n - 1 in the denominator); 0 when n < 2.
    pub stddev: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// `None` when there are no finite values.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        let n = v.len();
        let mean = v.iter().sum::<f64>() / n as f64;
        let stddev = if n < 2 {
            0.0
        } else {
            (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64).sqrt()
        };
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Summary { n, mean, stddev, min, max })
    }

    /// Coefficient of variation (stddev / mean), 0 for a zero mean.
    pub fn rel_spread(&self) -> f64 {
        if self.mean == 0.0 { 0.0 } else { self.stddev / self.mean.abs() }
    }
}

/// Smallest advantage the report calls a win: differences under 5% are not
/// worth choosing a protocol for, however repeatable they are.
pub const PRACTICAL: f64 = 0.05;
/// Bootstrap resamples per interval.
const RESAMPLES: usize = 4000;

/// The tail at which a 95% percentile-bootstrap interval from `n` samples
/// is read. Plain percentiles (2.5% and 97.5%) cover far less than 95% for
/// the handful of repeats a lab run has: a resample's spread is the
/// sample's own, which is too small by (n-1)/n, and it has normal tails
/// where Student's t has heavy ones. Hesterberg's expanded percentile
/// interval ("What teachers should know about the bootstrap", The American
/// Statistician 69(4), 2015) reads the tail alpha'/2 = Phi(-sqrt(n/(n-1)) *
/// t(0.975, n-1)) instead: 0.1% for n = 5, 0.9% for n = 10, and the
/// extremes of the resamples for n = 3.
fn expanded_tail(n: usize) -> f64 {
    use statrs::distribution::{ContinuousCDF, Normal, StudentsT};
    let df = n.max(2) as f64 - 1.0;
    let t = StudentsT::new(0.0, 1.0, df).map(|d| d.inverse_cdf(0.975)).unwrap_or(1.96);
    Normal::standard().cdf(-((df + 1.0) / df).sqrt() * t)
}

/// The ratio of two means with its 95% confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatioCi {
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
}

impl RatioCi {
    /// The same comparison seen from the other side (b over a).
    pub fn inverse(self) -> RatioCi {
        RatioCi { ratio: 1.0 / self.ratio, lo: 1.0 / self.hi, hi: 1.0 / self.lo }
    }
    /// The whole interval lies beyond the practical threshold, either way.
    pub fn apart(self) -> bool {
        self.lo > 1.0 + PRACTICAL || self.hi < 1.0 / (1.0 + PRACTICAL)
    }
}

/// mean(a) / mean(b) with a 95% percentile-bootstrap interval: both sides
/// are resampled with replacement, independently, and percentiles of the
/// resampled ratios bound it, read at [`expanded_tail`] of the smaller side. A bootstrap needs no
/// normality (CPU and latency samples are skewed) and gives an interval of
/// the ratio directly, which is what the report states; the generator is
/// seeded from the samples, so the same results always render the same
/// interval. `None` with fewer than two finite samples on a side (the
/// spread is unknown) or a non-positive mean.
pub fn ratio_of_means(a: &[f64], b: &[f64]) -> Option<RatioCi> {
    use rand::{Rng, SeedableRng};
    let a: Vec<f64> = a.iter().copied().filter(|x| x.is_finite()).collect();
    let b: Vec<f64> = b.iter().copied().filter(|x| x.is_finite()).collect();
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (ma, mb) = (mean(&a), mean(&b));
    if ma <= 0.0 || mb <= 0.0 {
        return None;
    }
    let seed = a.iter().chain(&b).fold(0xB10C_F1E1_u64, |h, x| (h ^ x.to_bits()).wrapping_mul(0x0100_0000_01B3));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut resample = |v: &[f64]| (0..v.len()).map(|_| v[rng.gen_range(0..v.len())]).sum::<f64>() / v.len() as f64;
    let mut ratios: Vec<f64> = (0..RESAMPLES)
        .filter_map(|_| {
            let (x, y) = (resample(&a), resample(&b));
            (y > 0.0).then(|| x / y)
        })
        .collect();
    ratios.sort_by(|x, y| x.total_cmp(y));
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    let tail = expanded_tail(a.len().min(b.len()));
    Some(RatioCi { ratio: ma / mb, lo: at(tail), hi: at(1.0 - tail) })
}

/// The mean of `v` with a 95% percentile-bootstrap interval (resampled
/// with replacement, read at [`expanded_tail`], seeded from the values so a
/// re-render gives the same interval). `None` with fewer than two finite values.
pub fn mean_ci(v: &[f64]) -> Option<(f64, f64)> {
    use rand::{Rng, SeedableRng};
    let v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return None;
    }
    let seed = v.iter().fold(0x5EED_u64, |h, x| (h ^ x.to_bits()).wrapping_mul(0x0100_0000_01B3));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..RESAMPLES)
        .map(|_| (0..v.len()).map(|_| v[rng.gen_range(0..v.len())]).sum::<f64>() / v.len() as f64)
        .collect();
    means.sort_by(|x, y| x.total_cmp(y));
    let at = |q: f64| means[((means.len() - 1) as f64 * q).round() as usize];
    let tail = expanded_tail(v.len());
    Some((at(tail), at(1.0 - tail)))
}

/// Verdict on "is `a` better than `b`" for one metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// The advantage of `a` (as a factor >= 1 in the metric's good
    /// direction) has its whole 95% interval beyond 1 + PRACTICAL.
    Clear(RatioCi),
    /// The interval reaches below the practical threshold.
    WithinNoise(RatioCi),
    /// Fewer than two samples on a side: the spread is unknown.
    Untestable,
}

/// How much better `a` is than `b`: a factor in the metric's good direction
/// (a/b when higher is better, b/a when lower is), with its interval.
pub fn advantage(higher_is_better: bool, a: &[f64], b: &[f64]) -> Verdict {
    let ci = if higher_is_better { ratio_of_means(a, b) } else { ratio_of_means(b, a) };
    match ci {
        None => Verdict::Untestable,
        Some(ci) if ci.lo > 1.0 + PRACTICAL => Verdict::Clear(ci),
        Some(ci) => Verdict::WithinNoise(ci),
    }
}

/// An advantage said as a quantity that exists: "2.2x more IOPS (1.9-2.6x)",
/// "55% less CPU per op (41-63%)", "3% more MiB/s (-2% to 8%)". `ci` is a
/// factor in the good direction; reductions are told as the share saved,
/// which can never pass 100%.
pub fn describe_advantage(higher_is_better: bool, noun: &str, ci: RatioCi) -> String {
    let more = if higher_is_better { "more" } else { "less" };
    if ci.ratio >= 1.5 {
        return format!("{:.1}x {more} {noun} ({:.1}-{:.1}x)", ci.ratio, ci.lo, ci.hi);
    }
    // Percent: gain for higher-is-better, saving for lower-is-better.
    let pct = |f: f64| if higher_is_better { (f - 1.0) * 100.0 } else { (1.0 - 1.0 / f) * 100.0 };
    // Rounded first, so that a bound of -0.3% reads "0%", not "-0%".
    let (p, lo, hi) = (pct(ci.ratio).round() + 0.0, pct(ci.lo).round() + 0.0, pct(ci.hi).round() + 0.0);
    if lo < 0.0 {
        format!("{p:.0}% {more} {noun} ({lo:.0}% to {hi:.0}%)")
    } else {
        format!("{p:.0}% {more} {noun} ({lo:.0}-{hi:.0}%)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn expanded_tails_widen_small_samples_only() {
        // Phi(-sqrt(5/4) * 2.776) and Phi(-sqrt(10/9) * 2.262).
        assert!(close(expanded_tail(5), 0.00096, 0.00005), "{}", expanded_tail(5));
        assert!(close(expanded_tail(10), 0.0086, 0.0003), "{}", expanded_tail(10));
        assert!(expanded_tail(3) < 1e-6);
        assert!(close(expanded_tail(1000), 0.025, 0.0005));
    }

    /// What the expansion is for: over many lab-sized runs (5 repeats a
    /// side, 10% noise, equal means) the interval holds the true ratio about
    /// 95% of the time; the plain 2.5% percentiles hold it far less often.
    #[test]
    fn ratio_intervals_cover_the_truth_at_five_repeats() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut normal = |m: f64, sd: f64| {
            let (u, v): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen_range(0.0..1.0));
            m + sd * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        };
        let trials = 400;
        let mut held = 0;
        for _ in 0..trials {
            let a: Vec<f64> = (0..5).map(|_| normal(100.0, 10.0)).collect();
            let b: Vec<f64> = (0..5).map(|_| normal(100.0, 10.0)).collect();
            let ci = ratio_of_means(&a, &b).unwrap();
            held += (ci.lo <= 1.0 && 1.0 <= ci.hi) as u32;
        }
        let coverage = held as f64 / trials as f64;
        assert!(coverage >= 0.92, "coverage {coverage}");
    }

    #[test]
    fn summary_of_known_values() {
        let s = Summary::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!(s.n, 8);
        assert!(close(s.mean, 5.0, 1e-12));
        // Sample stddev of this classic set: sqrt(32/7).
        assert!(close(s.stddev, (32.0f64 / 7.0).sqrt(), 1e-12));
        assert_eq!((s.min, s.max), (2.0, 9.0));
        let one = Summary::of(&[3.5]).unwrap();
        assert_eq!((one.n, one.stddev, one.min, one.max), (1, 0.0, 3.5, 3.5));
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::NAN]).is_none());
    }

    // Recorded in a --quick lab run: total CPU µs per 4 KiB read over five
    // repeats, blockwire NVMe/TCP against tgt.
    const NVME_CPU: [f64; 5] = [12.1, 11.6, 12.9, 12.4, 11.8];
    const TGT_CPU: [f64; 5] = [86.0, 110.0, 93.5, 101.2, 97.3];

    #[test]
    fn an_8x_cpu_difference_over_5_repeats_is_a_clear_win() {
        let v = advantage(false, &NVME_CPU, &TGT_CPU);
        let Verdict::Clear(ci) = v else { panic!("expected a clear win, got {v:?}") };
        assert!(ci.ratio > 7.0 && ci.ratio < 9.0, "{ci:?}");
        assert!(ci.lo <= ci.ratio && ci.ratio <= ci.hi && ci.lo > 6.0, "{ci:?}");
        // Seen from tgt's side it is a clear loss, never a win.
        assert!(matches!(advantage(false, &TGT_CPU, &NVME_CPU), Verdict::WithinNoise(_)));
        let text = describe_advantage(false, "CPU per op", ci);
        assert!(text.starts_with("8.0x less CPU per op ("), "{text}");
    }

    #[test]
    fn two_draws_from_one_distribution_tie() {
        // Ten IOPS samples of one target at one setting, split in two.
        let all = [41_200.0, 39_800.0, 43_100.0, 40_500.0, 38_900.0, 42_300.0, 40_100.0, 41_900.0, 39_300.0, 42_800.0];
        let (a, b) = all.split_at(5);
        for (x, y) in [(a, b), (b, a)] {
            let v = advantage(true, x, y);
            let ci = match v {
                Verdict::WithinNoise(ci) => ci,
                other => panic!("expected a tie, got {other:?}"),
            };
            assert!(ci.lo < 1.0 && ci.hi > 1.0, "the interval holds 1: {ci:?}");
        }
    }

    #[test]
    fn a_3_percent_difference_is_a_tie_however_steady() {
        let a = [103.0, 103.1, 102.9, 103.0, 103.05];
        let b = [100.0, 100.1, 99.9, 100.0, 100.05];
        let v = advantage(true, &a, &b);
        let Verdict::WithinNoise(ci) = v else { panic!("3% must not be a win: {v:?}") };
        // Statistically apart, practically not.
        assert!(ci.lo > 1.0 && ci.hi < 1.05, "{ci:?}");
        assert_eq!(describe_advantage(true, "IOPS", ci), format!("3% more IOPS ({:.0}-{:.0}%)", (ci.lo - 1.0) * 100.0, (ci.hi - 1.0) * 100.0));
    }

    #[test]
    fn the_interval_of_a_mean_holds_it_and_narrows_with_agreement() {
        let wide = [80.0, 120.0, 95.0, 105.0, 100.0];
        let narrow = [99.0, 101.0, 100.0, 100.5, 99.5];
        let (wl, wh) = mean_ci(&wide).unwrap();
        let (nl, nh) = mean_ci(&narrow).unwrap();
        assert!(wl < 100.0 && 100.0 < wh && nl < 100.0 && 100.0 < nh);
        assert!(nh - nl < (wh - wl) / 5.0, "[{nl}, {nh}] vs [{wl}, {wh}]");
        // Within the range of the data, and the same every time.
        assert!(wl >= 80.0 && wh <= 120.0);
        assert_eq!(mean_ci(&wide), mean_ci(&wide));
        assert!(mean_ci(&[1.0]).is_none());
        assert_eq!(mean_ci(&[5.0, 5.0, 5.0]), Some((5.0, 5.0)));
    }

    #[test]
    fn single_runs_cannot_be_tested() {
        assert_eq!(advantage(true, &[1.0], &[2.0, 3.0]), Verdict::Untestable);
        assert!(ratio_of_means(&[1.0, 2.0], &[0.0, 0.0]).is_none());
    }

    #[test]
    fn reductions_never_pass_100_percent() {
        // 1.4x less is a 29% saving; 6.33x less is said as a factor, not "533% lower".
        let ci = RatioCi { ratio: 1.4, lo: 1.2, hi: 1.6 };
        assert_eq!(describe_advantage(false, "CPU per op", ci), "29% less CPU per op (17-38%)");
        let ci = RatioCi { ratio: 6.33, lo: 5.1, hi: 7.9 };
        assert_eq!(describe_advantage(false, "CPU per op", ci), "6.3x less CPU per op (5.1-7.9x)");
        let ci = RatioCi { ratio: 1.02, lo: 0.97, hi: 1.08 };
        assert_eq!(describe_advantage(true, "MiB/s", ci), "2% more MiB/s (-3% to 8%)");
        let ci = RatioCi { ratio: 1.1, lo: 0.997, hi: 1.2 };
        assert_eq!(describe_advantage(true, "IOPS", ci), "10% more IOPS (0-20%)");
    }

    proptest! {
        #[test]
        fn the_interval_is_ordered_and_deterministic(
            xs in proptest::collection::vec(1.0f64..1e6, 2..7),
            ys in proptest::collection::vec(1.0f64..1e6, 2..7),
        ) {
            let ci = ratio_of_means(&xs, &ys).unwrap();
            prop_assert!(0.0 < ci.lo && ci.lo <= ci.hi, "{:?}", ci);
            let back = ratio_of_means(&ys, &xs).unwrap();
            prop_assert!(close(back.ratio, 1.0 / ci.ratio, 1e-9 * back.ratio));
            // The same samples always give the same interval.
            prop_assert_eq!(ratio_of_means(&xs, &ys).unwrap(), ci);
        }
    }
}
