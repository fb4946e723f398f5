//! Inline SVG charts, rendered with maud like the rest of the report (every
//! label escaped): grouped bar charts with whiskers and heat maps. No
//! scripts, fonts or styles from outside.

use maud::{html, Markup};

/// A bar: the mean, and the whisker range (mean ± stddev, clamped at 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bar {
    pub mean: f64,
    pub lo: f64,
    pub hi: f64,
}

pub const PALETTE: [&str; 8] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

/// A "nice" axis maximum and tick step for values up to `max`.
pub fn nice_axis(max: f64) -> (f64, f64) {
    if !max.is_finite() || max <= 0.0 {
        return (1.0, 0.25);
    }
    let raw_step = max / 5.0;
    let mag = 10f64.powf(raw_step.log10().floor());
    let norm = raw_step / mag;
    let step = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 2.5 {
        2.5
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    } * mag;
    ((max / step).ceil() * step, step)
}

/// Short human number: 1234 -> "1.23k", 0.0123 -> "0.0123".
pub fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.3}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.3}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.3}")
    }
}

/// One decimal, the precision every coordinate needs.
fn f1(v: f64) -> String {
    format!("{v:.1}")
}

/// Grouped bars: `values[group][series]`. Series names go in the legend,
/// group names under the axis.
pub fn grouped_bars(title: &str, unit: &str, groups: &[String], series: &[(String, String)], values: &[Vec<Option<Bar>>]) -> Markup {
    let (left, right, top, bottom) = (64.0, 16.0, 44.0, 58.0);
    let group_gap = 22.0;
    // Groups at least 140 px wide so workload names under them do not collide.
    let bar_w = ((140.0 - group_gap) / series.len().max(1) as f64).clamp(10.0, 22.0);
    let group_w = series.len().max(1) as f64 * bar_w + group_gap;
    let plot_w = (groups.len().max(1) as f64 * group_w).max(300.0);
    let plot_h = 220.0;
    let legend_cols = ((plot_w / 165.0).floor() as usize).max(1);
    let legend_rows = series.len().div_ceil(legend_cols) as f64;
    let width = left + plot_w + right;
    let height = top + legend_rows * 16.0 + plot_h + bottom;
    let plot_top = top + legend_rows * 16.0;
    let max = values.iter().flatten().flatten().map(|b| b.hi.max(b.mean)).fold(0.0f64, f64::max);
    let (ymax, step) = nice_axis(max);
    let y = |v: f64| plot_top + plot_h - (v / ymax).clamp(0.0, 1.05) * plot_h;
    let ticks: Vec<f64> = (0..).map(|i| i as f64 * step).take_while(|t| *t <= ymax + step * 0.01).collect();
    let (w, h) = (format!("{width:.0}"), format!("{height:.0}"));
    html! {
        svg class="chart" xmlns="http://www.w3.org/2000/svg" width=(w) height=(h) viewBox=(format!("0 0 {w} {h}")) role="img" aria-label=(title) {
            text x="8" y="18" class="title" { (title) }
            @for (i, (name, color)) in series.iter().enumerate() {
                @let lx = left + (i % legend_cols) as f64 * 165.0;
                @let ly = 30.0 + (i / legend_cols) as f64 * 16.0;
                rect x=(f1(lx)) y=(f1(ly - 9.0)) width="10" height="10" fill=(color) {}
                text x=(f1(lx + 14.0)) y=(f1(ly)) class="small" { (name) }
            }
            @for t in &ticks {
                line x1=(f1(left)) x2=(f1(left + plot_w)) y1=(f1(y(*t))) y2=(f1(y(*t))) class="grid" {}
                text x=(f1(left - 4.0)) y=(f1(y(*t) + 4.0)) class="small" text-anchor="end" { (short(*t)) }
            }
            text transform=(format!("translate(14,{:.0}) rotate(-90)", plot_top + plot_h / 2.0)) class="small" text-anchor="middle" { (unit) }
            @for (g, name) in groups.iter().enumerate() {
                @let gx = left + g as f64 * group_w + group_gap / 2.0;
                @for (i, (sname, color)) in series.iter().enumerate() {
                    @if let Some(b) = values.get(g).and_then(|v| v.get(i)).copied().flatten() {
                        @let x = gx + i as f64 * bar_w;
                        @let (yt, yb) = (y(b.mean), y(0.0));
                        rect class="bar" x=(f1(x)) y=(f1(yt)) width=(f1(bar_w - 2.0)) height=(f1((yb - yt).max(0.5))) fill=(color) {
                            title { (sname) " " (name) ": " (short(b.mean)) " " (unit) " (spread " (short(b.lo)) ".." (short(b.hi)) ")" }
                        }
                        @if b.hi > b.lo {
                            @let cx = x + (bar_w - 2.0) / 2.0;
                            path class="whisker" d=(format!("M{cx:.1} {:.1}V{:.1}M{:.1} {:.1}h6M{:.1} {:.1}h6", y(b.lo), y(b.hi), cx - 3.0, y(b.lo), cx - 3.0, y(b.hi))) {}
                        }
                    }
                }
                text x=(f1(gx + series.len() as f64 * bar_w / 2.0)) y=(f1(plot_top + plot_h + 16.0)) class="small" text-anchor="middle" { (name) }
            }
            line x1=(f1(left)) x2=(f1(left)) y1=(f1(plot_top)) y2=(f1(plot_top + plot_h)) class="axis" {}
            line x1=(f1(left)) x2=(f1(left + plot_w)) y1=(f1(plot_top + plot_h)) y2=(f1(plot_top + plot_h)) class="axis" {}
        }
    }
}

/// Colour for t in 0..1 on a perceptual ramp (dark blue -> green -> yellow).
pub fn ramp(t: f64) -> String {
    let stops = [(68.0, 1.0, 84.0), (59.0, 82.0, 139.0), (33.0, 145.0, 140.0), (94.0, 201.0, 98.0), (253.0, 231.0, 37.0)];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
    let pos = t * (stops.len() - 1) as f64;
    let i = (pos.floor() as usize).min(stops.len() - 2);
    let f = pos - i as f64;
    let (a, b) = (stops[i], stops[i + 1]);
    let c = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    format!("#{:02x}{:02x}{:02x}", c(a.0, b.0), c(a.1, b.1), c(a.2, b.2))
}

/// Heat map: rows = `row_labels` (numjobs), columns = `col_labels` (iodepth),
/// `values[row][col]`. `higher_is_better` picks the ramp direction so bright
/// always means good.
pub fn heatmap(
    title: &str,
    row_title: &str,
    col_title: &str,
    row_labels: &[String],
    col_labels: &[String],
    values: &[Vec<Option<f64>>],
    higher_is_better: bool,
) -> Markup {
    let (left, top, cell_w, cell_h) = (70.0, 40.0, 62.0, 30.0);
    let width = left + col_labels.len() as f64 * cell_w + 12.0;
    let height = top + row_labels.len() as f64 * cell_h + 40.0;
    let all: Vec<f64> = values.iter().flatten().flatten().copied().filter(|v| v.is_finite()).collect();
    let (lo, hi) = all.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let (w, h) = (format!("{width:.0}"), format!("{height:.0}"));
    html! {
        svg class="chart heatmap" xmlns="http://www.w3.org/2000/svg" width=(w) height=(h) viewBox=(format!("0 0 {w} {h}")) role="img" aria-label=(title) {
            text x="8" y="18" class="title" { (title) }
            text x="8" y=(f1(top - 6.0)) class="small" { (row_title) " ↓ / " (col_title) " →" }
            @for (c, label) in col_labels.iter().enumerate() {
                text x=(f1(left + c as f64 * cell_w + cell_w / 2.0)) y=(f1(top + row_labels.len() as f64 * cell_h + 16.0)) class="small" text-anchor="middle" { (label) }
            }
            @for (r, label) in row_labels.iter().enumerate() {
                @let ry = top + r as f64 * cell_h;
                text x=(f1(left - 6.0)) y=(f1(ry + cell_h / 2.0 + 4.0)) class="small" text-anchor="end" { (label) }
                @for c in 0..col_labels.len() {
                    @let cx = left + c as f64 * cell_w;
                    @let (tx, ty) = (f1(cx + cell_w / 2.0), f1(ry + cell_h / 2.0 + 4.0));
                    @match values.get(r).and_then(|row| row.get(c)).copied().flatten() {
                        Some(v) => {
                            @let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
                            @let t = if higher_is_better { t } else { 1.0 - t };
                            rect class="cell" x=(f1(cx)) y=(f1(ry)) width=(f1(cell_w - 1.0)) height=(f1(cell_h - 1.0)) fill=(ramp(t)) {
                                title { (row_title) "=" (label) " " (col_title) "=" (col_labels[c]) ": " (short(v)) }
                            }
                            text x=(tx) y=(ty) class="small" text-anchor="middle" fill=(if t > 0.6 { "#000" } else { "#fff" }) { (short(v)) }
                        },
                        None => {
                            rect class="cell empty" x=(f1(cx)) y=(f1(ry)) width=(f1(cell_w - 1.0)) height=(f1(cell_h - 1.0)) fill="#eee" {}
                            text x=(tx) y=(ty) class="small" text-anchor="middle" { "–" }
                        },
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_is_nice_and_covers_the_data() {
        for (max, want_max, want_step) in [(9.3, 10.0, 2.0), (47_000.0, 50_000.0, 10_000.0), (0.7, 0.8, 0.2), (120.0, 125.0, 25.0)] {
            let (m, st) = nice_axis(max);
            assert!((m - want_max).abs() < 1e-9 && (st - want_step).abs() < 1e-9, "{max} -> {m} {st}");
            assert!(m >= max);
        }
        assert_eq!(nice_axis(0.0), (1.0, 0.25));
        assert_eq!(nice_axis(f64::NAN), (1.0, 0.25));
    }

    #[test]
    fn bars_chart_has_one_rect_per_value_and_escapes() {
        let groups = vec!["a<b".to_string(), "c".to_string()];
        let series = vec![("x&y".to_string(), PALETTE[0].to_string()), ("z".to_string(), PALETTE[1].to_string())];
        let v = vec![
            vec![Some(Bar { mean: 5.0, lo: 4.0, hi: 6.0 }), None],
            vec![Some(Bar { mean: 3.0, lo: 3.0, hi: 3.0 }), Some(Bar { mean: 1.0, lo: 0.5, hi: 1.5 })],
        ];
        let svg = grouped_bars("T", "IOPS", &groups, &series, &v).into_string();
        assert_eq!(svg.matches(r#"class="bar""#).count(), 3);
        assert_eq!(svg.matches(r#"class="whisker""#).count(), 2);
        assert!(svg.contains("a&lt;b") && svg.contains("x&amp;y"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }

    #[test]
    fn heatmap_cells_and_ramp() {
        let rows = vec!["1".to_string(), "4".to_string()];
        let cols = vec!["1".to_string(), "16".to_string()];
        let v = vec![vec![Some(1.0), Some(2.0)], vec![None, Some(4.0)]];
        let svg = heatmap("H", "jobs", "qd", &rows, &cols, &v, true).into_string();
        assert_eq!(svg.matches(r#"class="cell""#).count(), 3);
        // Every SVG element is closed: in HTML, an unclosed <rect> would swallow its siblings.
        assert_eq!(svg.matches("<rect").count(), svg.matches("</rect>").count());
        assert_eq!(svg.matches("cell empty").count(), 1);
        assert_eq!(ramp(0.0), "#440154");
        assert_eq!(ramp(1.0), "#fde725");
        assert_eq!(ramp(f64::NAN), ramp(0.0));
    }
}
