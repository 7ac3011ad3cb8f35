//! The two SVG charts of a report, drawn with plotters into strings.
//!
//! - speedup: for each workload a group of bars, one per configuration (plain is the line at 1);
//! - acceptance by draft position: for each workload a panel with one line per source of each
//!   configuration, the share of the source's winning rounds that accepted position 1, 2, ...

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::Report;

/// Width of both charts, in pixels.
const WIDTH: u32 = 960;
/// Height of the speedup chart, in pixels.
const SPEEDUP_HEIGHT: u32 = 540;
/// Height of one workload's panel in the acceptance chart, in pixels.
const PANEL_HEIGHT: u32 = 360;
/// Share of its slot that a bar fills; the rest separates it from its neighbour.
const BAR_FILL: f64 = 0.9;
/// Font family of all text (SVG viewers pick the font; no font file is read).
const FONT: &str = "sans-serif";
/// Share of a workload's slot on the x axis that its bars fill.
const GROUP_WIDTH: f64 = 0.8;

/// The speedup chart: grouped bars, one group per workload, one bar per cascade configuration.
pub fn speedup_svg(report: &Report) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, SPEEDUP_HEIGHT)).into_drawing_area();
        draw_speedup(&root, report).map_err(|e| anyhow!("drawing the speedup chart: {e}"))?;
        root.present()
            .map_err(|e| anyhow!("drawing the speedup chart: {e}"))?;
    }
    Ok(svg)
}

fn draw_speedup<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    report: &Report,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let labels: Vec<String> = report
        .workloads
        .first()
        .map(|w| {
            w.configurations
                .iter()
                .filter(|c| !c.cascade.is_empty())
                .map(|c| c.label.clone())
                .collect()
        })
        .unwrap_or_default();
    let n_workloads = report.workloads.len().max(1);
    let highest = report
        .workloads
        .iter()
        .flat_map(|w| &w.configurations)
        .filter_map(|c| c.speedup)
        .fold(1.0_f64, f64::max);
    let mut chart = ChartBuilder::on(root)
        .caption(
            "Speedup over plain decoding (ratio of median tok/s)",
            (FONT, 22),
        )
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..n_workloads as f64, 0.0..highest * 1.25)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .x_labels(0)
        .y_desc("speedup")
        .y_label_formatter(&|y| format!("{y:.1}x"))
        .label_style((FONT, 14))
        .draw()?;
    let bar_width = GROUP_WIDTH / labels.len().max(1) as f64;
    // (left edge, speedup) of every bar, for the value written above it.
    let mut tops = Vec::new();
    for (index, label) in labels.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let bars: Vec<(f64, f64)> = report
            .workloads
            .iter()
            .enumerate()
            .filter_map(|(w, workload)| {
                let speedup = workload
                    .configurations
                    .iter()
                    .find(|c| &c.label == label)?
                    .speedup?;
                Some((
                    w as f64 + (1.0 - GROUP_WIDTH) / 2.0 + index as f64 * bar_width,
                    speedup,
                ))
            })
            .collect();
        tops.extend(bars.iter().copied());
        chart
            .draw_series(bars.into_iter().map(|(left, speedup)| {
                Rectangle::new(
                    [(left, 0.0), (left + bar_width * BAR_FILL, speedup)],
                    color.filled(),
                )
            }))?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    // Plain decoding: the line every bar is measured against.
    chart.draw_series(LineSeries::new(
        [(0.0, 1.0), (n_workloads as f64, 1.0)],
        BLACK.stroke_width(1),
    ))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()?;
    // Values above the bars and workload names under their groups, in the root's pixels.
    let value_style =
        TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    for (left, speedup) in tops {
        let (x, y) = chart.backend_coord(&(left + bar_width * BAR_FILL / 2.0, speedup));
        root.draw(&Text::new(
            format!("{speedup:.2}x"),
            (x, y - 4),
            value_style.clone(),
        ))?;
    }
    let name_style = TextStyle::from((FONT, 16).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (w, workload) in report.workloads.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(w as f64 + 0.5, 0.0));
        root.draw(&Text::new(
            workload.name.clone(),
            (x, y + 8),
            name_style.clone(),
        ))?;
    }
    Ok(())
}

/// The acceptance-by-position chart: one panel per workload, one line per source and
/// configuration.
pub fn acceptance_svg(report: &Report) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let height = PANEL_HEIGHT * report.workloads.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| anyhow!("drawing the acceptance chart: {e}"))?;
        let panels = root.split_evenly((report.workloads.len().max(1), 1));
        for (panel, workload) in panels.iter().zip(&report.workloads) {
            draw_acceptance(panel, workload)
                .map_err(|e| anyhow!("drawing the acceptance chart of {}: {e}", workload.name))?;
        }
        root.present()
            .map_err(|e| anyhow!("drawing the acceptance chart: {e}"))?;
    }
    Ok(svg)
}

fn draw_acceptance<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    workload: &super::report::WorkloadReport,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let positions = workload
        .configurations
        .iter()
        .filter_map(|c| c.max_draft_len)
        .max()
        .unwrap_or(1)
        .max(2);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{}: accepted share of winning rounds, by draft position",
                workload.name
            ),
            (FONT, 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(1.0..positions as f64, 0.0..1.05)?;
    chart
        .configure_mesh()
        .x_desc("draft position")
        .y_desc("accepted / rounds won")
        .x_labels(positions.min(24))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{:.0}%", y * 100.0))
        .label_style((FONT, 13))
        .draw()?;
    let lines = workload.configurations.iter().flat_map(|c| {
        c.sources
            .iter()
            .filter(|s| !s.acceptance_by_position.is_empty())
            .map(move |s| {
                let label = if c.cascade.len() > 1 {
                    format!("{}: {}", c.label, s.stats.name)
                } else {
                    c.label.clone()
                };
                (label, &s.acceptance_by_position)
            })
    });
    for (index, (label, shares)) in lines.enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let points: Vec<(f64, f64)> = shares
            .iter()
            .enumerate()
            .map(|(i, &share)| ((i + 1) as f64, share))
            .collect();
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::{
        ConfigurationReport, SourceReport, VerifyCostReport, WorkloadReport,
    };
    use crate::bench::stats::Summary;
    use crate::cascade::SourceStats;

    fn configuration(label: &str, speedup: f64, shares: Vec<f64>) -> ConfigurationReport {
        let plain = label == "plain";
        ConfigurationReport {
            label: label.into(),
            cascade: if plain { vec![] } else { vec!["lookup".into()] },
            max_draft_len: (!plain).then_some(shares.len()),
            tokens_per_second_by_pass: vec![100.0 * speedup],
            tokens_per_second: Summary {
                median: 100.0 * speedup,
                min: 100.0 * speedup,
                max: 100.0 * speedup,
            },
            speedup: Some(speedup),
            ideal_speedup: Some(speedup * 1.25),
            efficiency: Some(0.8),
            generated_tokens: 64,
            acceptance: 0.5,
            mean_accepted_per_draft_round: 1.0,
            mean_committed_per_round: 2.0,
            draft_share: 0.01,
            verify_share: 0.95,
            rounds: 10,
            draft_rounds: 5,
            drafted: 10,
            accepted: 5,
            drawn_rounds: 0,
            tree_rounds: 0,
            verify_batches: vec![5, 5],
            sources: if plain {
                vec![]
            } else {
                vec![SourceReport {
                    stats: SourceStats::named("lookup"),
                    won_share: 0.5,
                    acceptance_by_position: shares,
                }]
            },
            outputs_match: true,
        }
    }

    fn report() -> Report {
        let workload = |name: &str| WorkloadReport {
            name: name.into(),
            path: format!("{name}.jsonl").into(),
            requests: 2,
            degenerate: Vec::new(),
            degenerate_share: 0.0,
            verify_cost: VerifyCostReport {
                context_tokens: 10,
                points: Vec::new(),
                observed: Vec::new(),
            },
            configurations: vec![
                configuration("plain", 1.0, vec![]),
                configuration("lookup K=4", 1.3, vec![0.9, 0.6, 0.3, 0.1]),
                configuration(
                    "lookup K=8",
                    1.1,
                    vec![0.9, 0.6, 0.3, 0.1, 0.1, 0.0, 0.0, 0.0],
                ),
            ],
        };
        Report {
            model: "m.gguf".into(),
            threads: 2,
            ctx_size: 4096,
            repeat: 1,
            warmup: 0,
            cost_repeat: 1,
            max_tokens_cap: None,
            sampling: "greedy".into(),
            outputs_match: true,
            mismatches: vec![],
            drawn_requests: 0,
            requests: vec![],
            prompt_style: "chat",
            workloads: vec![workload("edit"), workload("extract")],
            mixed: vec![],
        }
    }

    #[test]
    fn speedup_chart_is_an_svg_with_bars_and_names() {
        let svg = speedup_svg(&report()).expect("draws");
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{svg}"
        );
        for needle in [
            "edit",
            "extract",
            "lookup K=4",
            "lookup K=8",
            "1.30x",
            "<rect",
        ] {
            assert!(svg.contains(needle), "`{needle}` missing from the chart");
        }
    }

    #[test]
    fn acceptance_chart_has_a_panel_per_workload_and_a_line_per_source() {
        let svg = acceptance_svg(&report()).expect("draws");
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{svg}"
        );
        assert!(svg.contains("edit: accepted share") && svg.contains("extract: accepted share"));
        assert!(
            svg.matches("<polyline").count() >= 4,
            "two lines per panel expected"
        );
    }

    #[test]
    fn charts_draw_without_cascade_results() {
        let mut report = report();
        for workload in &mut report.workloads {
            workload.configurations.truncate(1);
        }
        assert!(speedup_svg(&report).expect("draws").contains("<svg"));
        assert!(acceptance_svg(&report).expect("draws").contains("<svg"));
    }
}
