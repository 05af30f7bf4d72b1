//! `simulate sweep`: one scenario at several fleet sizes, to see how the cost grows with the
//! fleet.
//!
//! The scenario's fleet-wide numbers (rate, burst, demand) stay as they are; only `nodes`
//! changes (the name gains `-<nodes>`), so each step spreads the same traffic over more
//! processes, each with a smaller share — the regime where leasing has to prove itself. Each
//! size is an ordinary run (its report directory is written beside the sweep's), and the
//! sweep gathers, per mode and size, the numbers that change with the fleet: utilization,
//! first-second admission (a fleet that starts cold), fairness, overshoot, store calls per
//! node per second (mean and the busiest node's peak window) and Redis CPU. It writes them as
//! `sweep.md` (a table), `sweep.json`, and one SVG per metric against fleet size (log scale).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use serde::Serialize;

use crate::metrics::ModeMetrics;
use crate::report::Report;
use crate::scenario::{Mode, Scenario};

/// One mode at one fleet size.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// Fleet size.
    pub nodes: usize,
    /// The mode.
    pub mode: Mode,
    /// Store calls per node per second, over the whole run.
    pub calls_per_node_s: f64,
    /// All of the run's metrics.
    pub metrics: ModeMetrics,
}

/// A sweep's results, in run order.
#[derive(Debug, Clone, Serialize)]
pub struct Sweep {
    /// The scenario's name (without the size suffix).
    pub scenario: String,
    /// The command that produced it.
    pub command: String,
    /// Every mode at every size.
    pub points: Vec<Point>,
}

impl Sweep {
    /// An empty sweep of `scenario`.
    pub fn new(scenario: &str, command: String) -> Self {
        Sweep {
            scenario: scenario.to_owned(),
            command,
            points: Vec::new(),
        }
    }

    /// Adds one size's report.
    pub fn add(&mut self, report: &Report) {
        let sc = &report.scenario;
        for m in &report.modes {
            self.points.push(Point {
                nodes: sc.nodes,
                mode: m.mode,
                calls_per_node_s: m.metrics.store_calls as f64 / sc.duration_s / sc.nodes as f64,
                metrics: m.metrics.clone(),
            });
        }
    }

    /// The Markdown table.
    pub fn table(&self) -> String {
        let mut s = String::from(
            "| nodes | mode | util | first second | jain | overshoot | store calls/s per node \
             (mean) | busiest node, calls/s | Redis CPU (cores) |\n\
             | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for p in &self.points {
            let m = &p.metrics;
            let _ = writeln!(
                s,
                "| {} | {} | {:.4} | {:.3} | {:.4} | {} | {:.2} | {:.0} | {:.3} |",
                p.nodes,
                p.mode,
                m.utilization,
                m.first_second_admission,
                m.jain_acceptance,
                m.max_window_overshoot,
                p.calls_per_node_s,
                m.store_calls_per_s_per_node_max,
                m.redis_cpu
            );
        }
        s
    }

    /// Writes `sweep.md`, `sweep.json` and the plots into `dir`.
    ///
    /// # Errors
    /// If a file cannot be written.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let md = format!(
            "# Sweep of {} over fleet size\n\n```sh\n{}\n```\n\n{}\n\
             ![utilization](utilization.svg)\n![first second](first_second.svg)\n\
             ![store calls per node](calls_per_node.svg)\n![Redis CPU](redis_cpu.svg)\n",
            self.scenario,
            self.command,
            self.table()
        );
        std::fs::write(dir.join("sweep.md"), md)?;
        std::fs::write(
            dir.join("sweep.json"),
            serde_json::to_string_pretty(self)? + "\n",
        )?;
        let plots: [PlotSpec; 4] = [
            (
                "utilization.svg",
                "utilization",
                |p| p.metrics.utilization,
                false,
            ),
            (
                "first_second.svg",
                "first-second admission",
                |p| p.metrics.first_second_admission,
                false,
            ),
            (
                "calls_per_node.svg",
                "store calls per node per second (mean)",
                |p| p.calls_per_node_s,
                true,
            ),
            (
                "redis_cpu.svg",
                "Redis CPU (cores)",
                |p| p.metrics.redis_cpu,
                true,
            ),
        ];
        for (file, label, value, log_y) in plots {
            self.plot(&dir.join(file), label, value, log_y)?;
        }
        Ok(())
    }

    fn plot(&self, path: &Path, label: &str, value: fn(&Point) -> f64, log_y: bool) -> Result<()> {
        let err = |e: &dyn std::fmt::Display| anyhow!("plotting failed: {e}");
        let xmin = self.points.iter().map(|p| p.nodes).min().unwrap_or(1) as f64;
        let xmax = self.points.iter().map(|p| p.nodes).max().unwrap_or(10) as f64;
        let (xmin, xmax) = (xmin / 1.5, (xmax * 1.5).max(xmin * 2.0));
        let ymax = self.points.iter().map(value).fold(0.0, f64::max);
        let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let caption = format!("{}: {label} against fleet size", self.scenario);
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        let modes: Vec<Mode> = {
            let mut m: Vec<Mode> = self.points.iter().map(|p| p.mode).collect();
            m.dedup();
            m.sort();
            m.dedup();
            m
        };
        let series = |mode: Mode, floor: f64| -> Vec<(f64, f64)> {
            self.points
                .iter()
                .filter(|p| p.mode == mode)
                .map(|p| (p.nodes as f64, value(p).max(floor)))
                .collect()
        };
        if log_y {
            let floor = self
                .points
                .iter()
                .map(value)
                .filter(|v| *v > 0.0)
                .fold(f64::INFINITY, f64::min)
                .min(ymax)
                .max(1e-6)
                / 2.0;
            let mut chart = builder
                .build_cartesian_2d(
                    (xmin..xmax).log_scale(),
                    (floor..ymax.max(floor) * 2.0).log_scale(),
                )
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("nodes (log scale)")
                .y_desc(format!("{label} (log scale)"))
                .draw()
                .map_err(|e| err(&e))?;
            for mode in modes {
                draw(&mut chart, mode, series(mode, floor)).map_err(|e| err(&e))?;
            }
            finish(&mut chart, &root).map_err(|e| err(&e))
        } else {
            let mut chart = builder
                .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..(ymax * 1.1).max(1.05))
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("nodes (log scale)")
                .y_desc(label)
                .draw()
                .map_err(|e| err(&e))?;
            for mode in modes {
                draw(&mut chart, mode, series(mode, 0.0)).map_err(|e| err(&e))?;
            }
            finish(&mut chart, &root).map_err(|e| err(&e))
        }
    }
}

/// A plot of the sweep: file, label, the value plotted, log scale on y.
type PlotSpec = (&'static str, &'static str, fn(&Point) -> f64, bool);

type Chart<'a, X, Y> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>;

fn color(mode: Mode) -> RGBColor {
    crate::plots::mode_color(mode)
}

fn draw<'a, X, Y>(
    chart: &mut Chart<'a, X, Y>,
    mode: Mode,
    points: Vec<(f64, f64)>,
) -> Result<(), Box<dyn std::error::Error + 'a>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let c = color(mode);
    chart
        .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))?
        .label(mode.as_str())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
    chart.draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled())))?;
    Ok(())
}

fn finish<'a, X, Y>(
    chart: &mut Chart<'a, X, Y>,
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
) -> Result<(), Box<dyn std::error::Error + 'a>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The scenario at each of `sizes`.
///
/// # Errors
/// If a size makes the scenario invalid.
pub fn sizes(sc: &Scenario, sizes: &[usize]) -> Result<Vec<Scenario>> {
    sizes.iter().map(|&n| sc.clone().with_nodes(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fleet of `nodes` whose node 50 crashes at 1 s.
    fn crashing(nodes: usize) -> Result<Scenario> {
        Scenario::parse(&format!(
            r#"
            name = "s"
            description = "100 nodes, one crashing."
            duration_s = 2
            rate = 1000
            nodes = {nodes}
            [demand]
            pattern = "zipf"
            total_rps = 2000
            [[events]]
            at_s = 1
            kind = "node_crash"
            node = 50
            "#
        ))
    }

    #[test]
    fn sizes_keep_the_fleet_wide_numbers() {
        assert!(crashing(10).is_err(), "node 50 of 10");
        let sc = crashing(100).unwrap();
        let v = sizes(&sc, &[10, 1000]).unwrap();
        assert_eq!(v[0].name, "s-10");
        assert_eq!(v[0].nodes, 10);
        assert_eq!(
            v[0].description,
            "Run at 10 nodes; as written, for 100: 100 nodes, one crashing."
        );
        assert_eq!(sizes(&sc, &[100]).unwrap()[0].description, sc.description);
        assert!(v[0].events.is_empty(), "node 50 is not in a fleet of 10");
        assert_eq!(v[1].events.len(), 1);
        assert_eq!((v[1].rate, v[1].demand.total_rps), (1000, 2000.0));
    }
}
