//! Summary statistics over repeated runs and the significance test used before
//! the report names a winner (Welch's unequal-variance t-test).

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

    /// Do the intervals mean ± stddev of the two summaries overlap?
    pub fn overlaps(&self, other: &Summary) -> bool {
        let (a_lo, a_hi) = (self.mean - self.stddev, self.mean + self.stddev);
        let (b_lo, b_hi) = (other.mean - other.stddev, other.mean + other.stddev);
        a_lo <= b_hi && b_lo <= a_hi
    }
}

/// Two-sided p-value of Welch's t-test that the two means differ.
/// `None` when either side has fewer than two samples (the spread is unknown,
/// so no test is possible).
pub fn welch_p(a: &Summary, b: &Summary) -> Option<f64> {
    if a.n < 2 || b.n < 2 {
        return None;
    }
    let (va, vb) = (a.stddev * a.stddev / a.n as f64, b.stddev * b.stddev / b.n as f64);
    let se2 = va + vb;
    if se2 == 0.0 {
        // Both perfectly repeatable: any difference is real, none is not.
        return Some(if a.mean == b.mean { 1.0 } else { 0.0 });
    }
    let t = (a.mean - b.mean) / se2.sqrt();
    let df = se2 * se2 / (va * va / (a.n as f64 - 1.0) + vb * vb / (b.n as f64 - 1.0));
    Some(student_t_two_sided_p(t, df))
}

/// Verdict on "is `a` better than `b`" for one metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// The difference is statistically significant (p < ALPHA) and the
    /// mean ± stddev intervals do not overlap.
    Significant { p: f64 },
    /// The difference is inside the noise.
    WithinNoise { p: f64 },
    /// Fewer than two samples on a side: the spread is unknown.
    Untestable,
}

pub const ALPHA: f64 = 0.05;

/// Both conditions must hold before a winner is named: a Welch p-value below
/// ALPHA and no overlap of mean ± stddev (the second guards against the t-test
/// being too eager with n = 2 or 3).
pub fn verdict(a: &Summary, b: &Summary) -> Verdict {
    match welch_p(a, b) {
        None => Verdict::Untestable,
        Some(p) if p < ALPHA && !a.overlaps(b) => Verdict::Significant { p },
        Some(p) => Verdict::WithinNoise { p },
    }
}

/// P(|T| >= |t|) for Student's t with `df` degrees of freedom.
pub fn student_t_two_sided_p(t: f64, df: f64) -> f64 {
    if !t.is_finite() {
        return 0.0;
    }
    let x = df / (df + t * t);
    reg_inc_beta(df / 2.0, 0.5, x).clamp(0.0, 1.0)
}

/// ln Γ(x) for x > 0 (Lanczos approximation, g = 7, n = 9).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection formula.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularized incomplete beta I_x(a, b), by its continued fraction.
pub fn reg_inc_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    // The continued fraction converges fast for x < (a+1)/(a+b+2); use the
    // symmetry I_x(a,b) = 1 - I_{1-x}(b,a) otherwise.
    if x < (a + 1.0) / (a + b + 2.0) {
        ln_front.exp() * beta_cf(a, b, x) / a
    } else {
        1.0 - ln_front.exp() * beta_cf(b, a, 1.0 - x) / b
    }
}

/// Modified Lentz evaluation of the incomplete-beta continued fraction.
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..300 {
        let m = m as f64;
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-12 {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
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

    #[test]
    fn t_distribution_matches_tables() {
        // Two-sided critical values: t(0.975; df) from standard tables.
        assert!(close(student_t_two_sided_p(12.706, 1.0), 0.05, 1e-4));
        assert!(close(student_t_two_sided_p(4.303, 2.0), 0.05, 1e-4));
        assert!(close(student_t_two_sided_p(2.776, 4.0), 0.05, 1e-4));
        assert!(close(student_t_two_sided_p(2.228, 10.0), 0.05, 1e-4));
        assert!(close(student_t_two_sided_p(9.925, 2.0), 0.01, 1e-4));
        assert!(close(student_t_two_sided_p(0.0, 5.0), 1.0, 1e-12));
        // Large df approaches the normal distribution: 1.96 -> 0.05.
        assert!(close(student_t_two_sided_p(1.96, 1e6), 0.05, 1e-4));
    }

    #[test]
    fn welch_on_recorded_iops_samples() {
        // IOPS of two protocols over three runs each, clearly apart.
        let a = Summary::of(&[41_200.0, 40_800.0, 41_500.0]).unwrap();
        let b = Summary::of(&[35_100.0, 34_900.0, 35_600.0]).unwrap();
        let p = welch_p(&a, &b).unwrap();
        assert!(p < 0.001, "p = {p}");
        assert!(matches!(verdict(&a, &b), Verdict::Significant { .. }));
        // Overlapping noisy samples: no winner.
        let c = Summary::of(&[40_000.0, 44_000.0, 37_000.0]).unwrap();
        let d = Summary::of(&[41_000.0, 39_000.0, 42_500.0]).unwrap();
        assert!(matches!(verdict(&c, &d), Verdict::WithinNoise { .. }));
        // Single runs cannot be tested.
        let e = Summary::of(&[1.0]).unwrap();
        assert_eq!(verdict(&e, &a), Verdict::Untestable);
        // Reference value computed by hand: t = -3 / sqrt(1/3 + 1/3), df = 4.
        let f = Summary::of(&[1.0, 2.0, 3.0]).unwrap();
        let g = Summary::of(&[4.0, 5.0, 6.0]).unwrap();
        let p = welch_p(&f, &g).unwrap();
        assert!(close(p, student_t_two_sided_p(3.0 / (2.0f64 / 3.0).sqrt(), 4.0), 1e-12));
        assert!(close(p, 0.0213, 5e-4), "p = {p}");
    }

    #[test]
    fn zero_variance_sides() {
        let a = Summary::of(&[5.0, 5.0]).unwrap();
        let b = Summary::of(&[6.0, 6.0]).unwrap();
        assert_eq!(welch_p(&a, &b), Some(0.0));
        assert_eq!(welch_p(&a, &a), Some(1.0));
    }

    proptest! {
        #[test]
        fn p_value_is_a_probability_and_symmetric(
            xs in proptest::collection::vec(0.0f64..1e6, 2..6),
            ys in proptest::collection::vec(0.0f64..1e6, 2..6),
        ) {
            let (a, b) = (Summary::of(&xs).unwrap(), Summary::of(&ys).unwrap());
            let p = welch_p(&a, &b).unwrap();
            prop_assert!((0.0..=1.0).contains(&p));
            prop_assert!(close(p, welch_p(&b, &a).unwrap(), 1e-9));
            prop_assert!(a.min <= a.mean && a.mean <= a.max);
        }
    }
}
