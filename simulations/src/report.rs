//! Reports: the comparison table, `report.json`, `windows.csv` and `summary.md`.
//!
//! One [`ModeResult`] per mode (its metrics and its per-window series) goes into a [`Report`],
//! which writes everything except the plots ([`crate::plots`]) into the report directory.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::metrics::{ModeMetrics, Window};
use crate::recommend::{recommend, Candidate};
use crate::scenario::{Mode, Scenario};

/// One mode's results.
#[derive(Debug, Clone)]
pub struct ModeResult {
    /// The mode.
    pub mode: Mode,
    /// Its metrics.
    pub metrics: ModeMetrics,
    /// Its per-window series.
    pub windows: Vec<Window>,
}

/// A whole run: the scenario as run, and every mode's results.
#[derive(Debug, Clone)]
pub struct Report {
    /// The scenario, with command-line overrides applied.
    pub scenario: Scenario,
    /// The command that produced the report.
    pub command: String,
    /// "simulated" or "live".
    pub kind: &'static str,
    /// Requests in the demand trace.
    pub requests: usize,
    /// Results, in the order the modes ran.
    pub modes: Vec<ModeResult>,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    scenario: &'a Scenario,
    seed: u64,
    kind: &'static str,
    command: &'a str,
    requests: usize,
    mode_order: Vec<&'static str>,
    modes: BTreeMap<&'static str, &'a ModeMetrics>,
}

/// Per-node detail (columns of `windows.csv`, lines of `acceptance.svg`) is shown for this many
/// nodes at most; `accept_min` / `accept_max` cover every node.
pub const PER_NODE_DETAIL: usize = 100;

const COLUMNS: [&str; 17] = [
    "mode",
    "admitted",
    "rejected",
    "util",
    "1st s",
    "jain",
    "min/max",
    "overshoot",
    "store calls",
    "calls/s/node",
    "Redis CPU",
    "stranded",
    "idle denials",
    "p50 µs",
    "p99 µs",
    "p999 µs",
    "trace hash",
];

/// The columns the terminal's table leaves out unless asked for every one (`--wide`).
const NARROW_DROPS: [&str; 6] = [
    "admitted",
    "rejected",
    "idle denials",
    "p50 µs",
    "p99 µs",
    "p999 µs",
];

impl Report {
    fn has_recovery(&self) -> bool {
        self.modes.iter().any(|m| m.metrics.recovery_s.is_some())
    }

    fn header(&self) -> Vec<String> {
        let mut h: Vec<String> = COLUMNS.iter().map(|s| s.to_string()).collect();
        if self.has_recovery() {
            h.insert(COLUMNS.len() - 1, "recovery s".into());
        }
        h
    }

    fn rows(&self) -> Vec<Vec<String>> {
        self.modes
            .iter()
            .map(|r| {
                let m = &r.metrics;
                let mut row = vec![
                    r.mode.to_string(),
                    m.admitted.to_string(),
                    m.rejected.to_string(),
                    format!("{:.4}", m.utilization),
                    format!("{:.3}", m.first_second_admission),
                    format!("{:.4}", m.jain_acceptance),
                    format!("{:.3}", m.min_max_acceptance_ratio),
                    m.max_window_overshoot.to_string(),
                    m.store_calls.to_string(),
                    format!("{:.0}", m.store_calls_per_s_per_node_max),
                    format!("{:.4}", m.redis_cpu),
                    m.tokens_stranded.to_string(),
                    m.rejected_while_tokens_idle.to_string(),
                    format!("{:.1}", m.latency_us.p50),
                    format!("{:.1}", m.latency_us.p99),
                    format!("{:.1}", m.latency_us.p999),
                    m.trace_hash.clone(),
                ];
                if self.has_recovery() {
                    let rec = m.recovery_s.map_or("-".into(), |r| format!("{r:.1}"));
                    row.insert(COLUMNS.len() - 1, rec);
                }
                row
            })
            .collect()
    }

    /// The comparison table as aligned plain text: the columns a comparison turns on, or
    /// every column if `wide`.
    pub fn table(&self, wide: bool) -> String {
        // Narrow: the columns a comparison turns on, so the table fits a terminal (121
        // characters with the trace hash, where every column took 180).
        let keep = |i: usize, name: &str| wide || !NARROW_DROPS.contains(&name) || i == 0;
        let pick = |cells: Vec<String>, names: &[String]| -> Vec<String> {
            cells
                .into_iter()
                .zip(names)
                .enumerate()
                .filter(|(i, (_, n))| keep(*i, n))
                .map(|(_, (c, _))| c)
                .collect()
        };
        let names = self.header();
        let header = pick(names.clone(), &names);
        let rows: Vec<Vec<String>> = self.rows().into_iter().map(|r| pick(r, &names)).collect();
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                rows.iter()
                    .map(|r| r[i].chars().count())
                    .chain([header[i].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| -> String {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                let pad = widths[i] - c.chars().count();
                if i == 0 {
                    let _ = write!(s, "{c}{}", " ".repeat(pad));
                } else {
                    let _ = write!(s, "  {}{c}", " ".repeat(pad));
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(&header);
        let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for r in &rows {
            out.push_str(&line(r));
        }
        out
    }

    /// The comparison table in Markdown.
    pub fn markdown_table(&self) -> String {
        let header = self.header();
        let mut out = format!("| {} |\n", header.join(" | "));
        let align: Vec<&str> = (0..header.len())
            .map(|i| if i == 0 { "---" } else { "---:" })
            .collect();
        let _ = writeln!(out, "| {} |", align.join(" | "));
        for r in self.rows() {
            let mut r = r;
            let last = r.len() - 1;
            r[last] = format!("`{}`", r[last]);
            let _ = writeln!(out, "| {} |", r.join(" | "));
        }
        out
    }

    /// The acceptance by demand rank, every mode side by side: acceptance, and store calls
    /// per node per second in brackets (see `metrics::by_demand_rank`).
    pub fn rank_table(&self) -> String {
        let Some(first) = self.modes.first() else {
            return String::new();
        };
        let mut out = String::from(
            "\n### Acceptance by demand rank\n\nRank 1 is the node with the most requests; \
             each cell is the group's acceptance, then its store calls per node per second.\n\n",
        );
        let names: Vec<&str> = self.modes.iter().map(|m| m.mode.as_str()).collect();
        let _ = writeln!(
            out,
            "| ranks | requests/s per node | {} |",
            names.join(" | ")
        );
        let _ = writeln!(out, "| --- | ---: |{}", " ---: |".repeat(names.len()));
        for (i, g) in first.metrics.by_demand_rank.iter().enumerate() {
            let ranks = if g.first == g.last {
                g.first.to_string()
            } else {
                format!("{}–{}", g.first, g.last)
            };
            let cells: Vec<String> = self
                .modes
                .iter()
                .map(|m| match m.metrics.by_demand_rank.get(i) {
                    Some(g) => format!("{:.3} ({:.1})", g.acceptance, g.calls_per_s),
                    None => String::new(),
                })
                .collect();
            let _ = writeln!(
                out,
                "| {ranks} | {:.1} | {} |",
                g.demand_per_s,
                cells.join(" | ")
            );
        }
        out
    }

    /// `report.json`.
    pub fn json(&self) -> Result<String> {
        let report = JsonReport {
            scenario: &self.scenario,
            seed: self.scenario.seed,
            kind: self.kind,
            command: &self.command,
            requests: self.requests,
            mode_order: self.modes.iter().map(|m| m.mode.as_str()).collect(),
            modes: self
                .modes
                .iter()
                .map(|m| (m.mode.as_str(), &m.metrics))
                .collect(),
        };
        Ok(serde_json::to_string_pretty(&report)? + "\n")
    }

    /// `windows.csv`: one row per window per mode (per-node columns for the first
    /// [`PER_NODE_DETAIL`] nodes).
    pub fn csv(&self) -> String {
        let sc = &self.scenario;
        let w = sc.window_ns();
        let mut out = String::from(
            "mode,window,start_s,admitted,limit,sustained,demand,store_calls,accept_min,accept_max",
        );
        for i in 0..sc.nodes.min(PER_NODE_DETAIL) {
            let _ = write!(out, ",accept_node_{i}");
        }
        out.push('\n');
        let limit = sc.allowed_in(w);
        let sustained = sc.rate as f64 * w as f64 / 1e9;
        let fmt = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.4}"));
        for m in &self.modes {
            for (i, win) in m.windows.iter().enumerate() {
                let present: Vec<f64> = win.node_acceptance.iter().flatten().copied().collect();
                let min = present.iter().copied().reduce(f64::min);
                let max = present.iter().copied().reduce(f64::max);
                let _ = write!(
                    out,
                    "{},{i},{:.3},{},{limit},{sustained},{},{},{},{}",
                    m.mode,
                    win.start_s,
                    win.admitted,
                    win.demand,
                    win.store_calls,
                    fmt(min),
                    fmt(max)
                );
                for a in win.node_acceptance.iter().take(PER_NODE_DETAIL) {
                    let _ = write!(out, ",{}", fmt(*a));
                }
                out.push('\n');
            }
        }
        out
    }

    /// Notes on the hybrid modes, a line each: how much came from rate leases (where any
    /// did), and each group's acceptance where the scenario mixes pure-mode nodes in
    /// (`pure_share`).
    pub fn notes(&self) -> Vec<String> {
        let rates = self.modes.iter().filter_map(|m| {
            let dripped = m.metrics.tokens_from_rates;
            (dripped > 0).then(|| {
                format!(
                    "{}: {dripped} tokens came from rate leases ({:.0} % of those admitted)",
                    m.mode.as_str(),
                    100.0 * dripped as f64 / m.metrics.admitted.max(1) as f64
                )
            })
        });
        let mixed = self.modes.iter().filter_map(|m| {
            m.metrics.mixed.map(|g| {
                format!(
                    "{}: pure-mode nodes accept {:.3} of their requests, leasing nodes {:.3}",
                    m.mode.as_str(),
                    g.pure,
                    g.leasing
                )
            })
        });
        let candidates: Vec<Candidate<'_>> = self
            .modes
            .iter()
            .map(|m| Candidate {
                mode: m.mode.as_str(),
                in_code: m.mode.in_code(),
                utilization: m.metrics.utilization,
                jain: m.metrics.jain_acceptance,
                overshoot: m.metrics.max_window_overshoot,
                store_calls: m.metrics.store_calls,
                redis_cpu: m.metrics.redis_cpu,
            })
            .collect();
        rates.chain(mixed).chain(recommend(&candidates)).collect()
    }

    /// `summary.md`.
    pub fn summary(&self) -> Result<String> {
        let sc = &self.scenario;
        let mut out = format!("# Simulation `{}` ({})\n\n", sc.name, self.kind);
        if !sc.description.is_empty() {
            let _ = writeln!(out, "{}\n", sc.description);
        }
        let _ = writeln!(out, "Command:\n\n```sh\n{}\n```\n", self.command);
        let _ = writeln!(
            out,
            "Seed **{}** · {} requests · {} s · rate {}/s · burst {} · {} nodes · window {} ms · \
             demand `{}` at {} req/s\n",
            sc.seed,
            self.requests,
            sc.duration_s,
            sc.rate,
            sc.burst(),
            sc.nodes,
            sc.window_ms,
            sc.demand.pattern.as_str(),
            sc.demand.total_rps,
        );
        let _ = writeln!(
            out,
            "Modes: `pure-redis` = one script call per request; `hybrid` = `HybridLimiter` with \
             the library's default lease policy; `hybrid-rate` = the same with rate leases on \
             (`AdaptiveLease::new().rate_leases(true)`); `hybrid-fixed` = \
             `FixedLease::new({})`; `static-share` = a private bucket of rate/{n} and burst/{n} \
             per node.\n",
            sc.batch(),
            n = sc.nodes,
        );
        if sc.try_acquire {
            out.push_str(
                "Hybrid nodes ask with the synchronous `try_acquire` (`try_acquire = true`), \
                 not `acquire_now`: a miss is never decided in the store.\n\n",
            );
        }
        if !sc.prefetch {
            out.push_str(
                "Hybrid nodes lease on first demand (`prefetch = false`: \
                 `HybridBuilder::prefetch(false)`), not when they are built.\n\n",
            );
        }
        if let Some(policy) = &sc.on_store_failure {
            let _ = writeln!(
                out,
                "Every mode that has a failure policy runs `{policy}` (`on_store_failure`).\n"
            );
        }
        if !sc.lease.is_default() {
            let _ = writeln!(
                out,
                "`hybrid` and `hybrid-rate` lease with the scenario's `[lease]` settings (see \
                 *Scenario as run* below).\n"
            );
        }
        if sc.pure_share > 0.0 {
            let _ = writeln!(
                out,
                "In the hybrid modes {} of the {} nodes decide in pure mode (`pure_share = {}`), \
                 on the same bucket as the leasing nodes.\n",
                (0..sc.nodes).filter(|&i| sc.runs_pure(i)).count(),
                sc.nodes,
                sc.pure_share,
            );
        }
        out.push_str("## Results\n\n");
        out.push_str(&self.markdown_table());
        for note in self.notes() {
            let _ = write!(out, "\n{note}\n");
        }
        out.push_str(
            "\nutil = admitted / min(demand, burst + rate × duration); jain = Jain's index of \
             per-node acceptance; overshoot = worst sliding window's excess over \
             burst + rate × W; calls/s/node = busiest node's peak window; idle denials = \
             denials while another node held unused tokens. Definitions: `simulations/src/metrics.rs`.\n",
        );
        out.push_str(&self.rank_table());
        out.push_str(
            "\n## Plots\n\n\
             ![admitted per window](admitted.svg)\n\n\
             ![per-node acceptance](acceptance.svg)\n\n\
             ![store calls per window](store_calls.svg)\n",
        );
        let _ = writeln!(
            out,
            "\n## Scenario as run\n\n```toml\n{}```",
            toml::to_string(sc).context("cannot render the scenario as TOML")?
        );
        Ok(out)
    }

    /// Writes `report.json`, `windows.csv` and `summary.md` into `dir` (created if needed).
    ///
    /// # Errors
    /// On I/O errors.
    pub fn write(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let put = |name: &str, text: String| {
            let path = dir.join(name);
            fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
        };
        put("report.json", self.json()?)?;
        put("windows.csv", self.csv())?;
        put("summary.md", self.summary()?)?;
        Ok(())
    }
}
