//! SVG plots of the per-window series (plotters, SVG backend only: no font or system
//! dependencies; text is laid out with plotters' built-in estimate and rendered by the viewer).
//!
//! - `admitted.svg`: fleet admissions per window, one line per mode, against the bound
//!   `burst + rate × W` and the sustained rate `rate × W`.
//! - `acceptance.svg`: one panel per mode, one line per node (the first 100): the share of the node's requests
//!   admitted in each window.
//! - `store_calls.svg`: store calls per second in each window, one line per mode, log scale
//!   (modes without store calls are left out).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::report::{ModeResult, Report, PER_NODE_DETAIL};
use crate::scenario::Mode;

const SIZE: (u32, u32) = (1000, 520);

pub(crate) fn mode_color(mode: Mode) -> RGBColor {
    match mode {
        Mode::PureRedis => RGBColor(31, 119, 180),
        Mode::Hybrid => RGBColor(214, 39, 40),
        Mode::HybridRate => RGBColor(140, 86, 75),
        Mode::HybridFixed => RGBColor(255, 127, 14),
        Mode::StaticShare => RGBColor(44, 160, 44),
        Mode::LockBased => RGBColor(148, 103, 189),
    }
}

/// Window centres (s) for a mode's series.
fn centres(report: &Report, m: &ModeResult) -> Vec<f64> {
    let half = report.scenario.window_ms as f64 / 2e3;
    m.windows.iter().map(|w| w.start_s + half).collect()
}

/// Draws a chart's legend (one line per mode) and writes the file.
fn legend_and_present<'a, CT>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
) -> Result<()>
where
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting failed: {e}")
}

/// Writes the three plots into `dir`.
///
/// # Errors
/// If a file cannot be written.
pub fn write_all(report: &Report, dir: &Path) -> Result<()> {
    admitted(report, &dir.join("admitted.svg"))?;
    acceptance(report, &dir.join("acceptance.svg"))?;
    store_calls(report, &dir.join("store_calls.svg"))?;
    Ok(())
}

fn admitted(report: &Report, path: &Path) -> Result<()> {
    let sc = &report.scenario;
    let w = sc.window_ns();
    let bound = sc.allowed_in(w);
    let sustained = sc.rate as f64 * w as f64 / 1e9;
    let ymax = report
        .modes
        .iter()
        .flat_map(|m| m.windows.iter().map(|w| w.admitted as f64))
        .fold(bound, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: fleet admitted per {} ms window", sc.name, sc.window_ms),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..sc.duration_s, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("admitted per window")
        .draw()
        .map_err(err)?;
    for (label, y, color) in [
        ("burst + rate × W", bound, BLACK),
        ("rate × W", sustained, RGBColor(128, 128, 128)),
    ] {
        chart
            .draw_series(LineSeries::new(
                [(0.0, y), (sc.duration_s, y)],
                color.stroke_width(1),
            ))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    for m in &report.modes {
        let color = mode_color(m.mode);
        let xs = centres(report, m);
        chart
            .draw_series(LineSeries::new(
                xs.into_iter()
                    .zip(m.windows.iter().map(|w| w.admitted as f64)),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(m.mode.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    legend_and_present(&mut chart, &root)
}

fn acceptance(report: &Report, path: &Path) -> Result<()> {
    let sc = &report.scenario;
    let height = 60 + 220 * report.modes.len() as u32;
    let root = SVGBackend::new(path, (SIZE.0, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            &format!(
                "{}: per-node acceptance (admitted / requests) per {} ms window, one line per node",
                sc.name, sc.window_ms
            ),
            ("sans-serif", 18),
        )
        .map_err(err)?;
    let panels = root.split_evenly((report.modes.len(), 1));
    for (panel, m) in panels.iter().zip(&report.modes) {
        let mut chart = ChartBuilder::on(panel)
            .caption(m.mode.as_str(), ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..sc.duration_s, 0f64..1.05f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("acceptance")
            .draw()
            .map_err(err)?;
        let xs = centres(report, m);
        for node in 0..sc.nodes.min(PER_NODE_DETAIL) {
            let color = Palette99::pick(node).to_rgba();
            // Windows without demand on the node break its line.
            let mut segment: Vec<(f64, f64)> = Vec::new();
            let mut segments = Vec::new();
            for (x, w) in xs.iter().zip(&m.windows) {
                match w.node_acceptance[node] {
                    Some(a) => segment.push((*x, a)),
                    None => segments.push(std::mem::take(&mut segment)),
                }
            }
            segments.push(segment);
            for s in segments.into_iter().filter(|s| !s.is_empty()) {
                chart
                    .draw_series(LineSeries::new(s, color.stroke_width(1)))
                    .map_err(err)?;
            }
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

fn store_calls(report: &Report, path: &Path) -> Result<()> {
    let sc = &report.scenario;
    let per_s = 1e3 / sc.window_ms as f64;
    let with_calls: Vec<&ModeResult> = report
        .modes
        .iter()
        .filter(|m| m.windows.iter().any(|w| w.store_calls > 0))
        .collect();
    let ymax = with_calls
        .iter()
        .flat_map(|m| m.windows.iter().map(|w| w.store_calls as f64 * per_s))
        .fold(10.0, f64::max)
        * 2.0;
    let floor = 0.5;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: store calls per second, per {} ms window (log scale)",
                sc.name, sc.window_ms
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..sc.duration_s, (floor..ymax).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("store calls / s")
        .draw()
        .map_err(err)?;
    for m in with_calls {
        let color = mode_color(m.mode);
        let xs = centres(report, m);
        chart
            .draw_series(LineSeries::new(
                xs.into_iter().zip(
                    m.windows
                        .iter()
                        .map(|w| (w.store_calls as f64 * per_s).max(floor)),
                ),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(m.mode.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    legend_and_present(&mut chart, &root)
}
