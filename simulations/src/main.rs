//! `simulate`: compare ratelease's limiter modes on a simulated (or live) fleet.
//!
//! ```text
//! simulate [OPTIONS] <SCENARIO.toml>                     virtual time, in-memory store
//! simulate live --redis URL [OPTIONS] <SCENARIO.toml>    real time, real Redis
//! simulate calibrate --redis URL                         Redis CPU per script operation
//! simulate sweep --nodes 10,100,1000 [OPTIONS] <SCENARIO.toml>   the cost against fleet size
//! ```
//!
//! Prints the seed, a progress bar (on a terminal), and the comparison table; writes the
//! report directory (`--out`, default `target/sim/<scenario>/`, `…-live/` for live runs; under
//! `$CARGO_TARGET_DIR` instead of `target` when that is set).
//! See the library docs (`simulations/src/lib.rs`) for how the simulation works.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use simulations::live::DEFAULT_LIVE_DURATION_S;
use simulations::{calibrate, live, plots, sim, sweep, Mode, Scenario};

/// Fleet simulator for ratelease: fairness, accuracy and store load of each limiter mode
/// under uneven traffic.
#[derive(Debug, Parser)]
#[command(name = "simulate", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The scenario file (TOML), e.g. simulations/scenarios/skewed.toml.
    scenario: Option<PathBuf>,
    #[command(flatten)]
    opts: RunOpts,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the scenario in real time against a real Redis (short runs: default at most 5 s).
    Live(LiveArgs),
    /// Measure what each script operation costs a real Redis (µs of server time per call,
    /// from INFO commandstats), beside a redis_rate-style GCRA baseline in the same run.
    Calibrate(CalibrateArgs),
    /// Run the scenario at several fleet sizes (same fleet-wide rate and demand) and write a
    /// table and plots of how utilization, first-second admission, store calls per node and
    /// Redis CPU change with the size of the fleet.
    Sweep(SweepArgs),
}

#[derive(Debug, Args)]
struct SweepArgs {
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<usize>,
    /// The scenario file (TOML).
    scenario: PathBuf,
    #[command(flatten)]
    opts: RunOpts,
}

fn sweep(args: SweepArgs) -> Result<()> {
    let opts = args.opts;
    let base = Scenario::load(&args.scenario)?.with_overrides(
        opts.seed,
        opts.duration_s,
        opts.modes.clone(),
    )?;
    let out = opts
        .out
        .unwrap_or_else(|| default_out(&format!("{}-sweep", base.name)));
    let mut result = sweep::Sweep::new(&base.name, command_line());
    let started = Instant::now();
    for sc in sweep::sizes(&base, &args.nodes)? {
        let sc = sc.resolved();
        let bar = progress_bar(&sc, opts.quiet);
        let per_mode = sc.duration_ns() / 1_000_000;
        let modes = sc.modes.clone();
        let progress = |i: usize, ns: u64| {
            bar.set_message(format!("{} {}", sc.nodes, modes[i].as_str()));
            bar.set_position(i as u64 * per_mode + ns / 1_000_000);
        };
        let report = sim::run_all(&sc, command_line(), &progress)?;
        bar.finish_and_clear();
        let dir = out.join(&sc.name);
        report.write(&dir)?;
        plots::write_all(&report, &dir)?;
        result.add(&report);
        println!(
            "{} nodes: {} requests, {:.1} s wall so far",
            sc.nodes,
            report.requests,
            started.elapsed().as_secs_f64()
        );
    }
    result.write(&out)?;
    print!("{}", result.table());
    println!("sweep in {}", out.display());
    Ok(())
}

#[derive(Debug, Args)]
struct CalibrateArgs {
    /// Redis URL, e.g. redis://127.0.0.1:6380/. Use a Redis nobody else is using: its
    /// statistics are reset (CONFIG RESETSTAT) before each operation.
    #[arg(long)]
    redis: String,
    /// Script calls per operation.
    #[arg(long, default_value_t = 20_000)]
    calls: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Leasers on record for the node-lease rows, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,1000,10000")]
    leasers: Vec<u64>,
    /// Also count the server's machine instructions per call: the server runs under Valgrind's
    /// callgrind on this machine (scripts/script-instructions.sh starts one and runs this).
    #[arg(long)]
    callgrind: bool,
}

fn calibrate(args: &CalibrateArgs) -> Result<()> {
    let plan = calibrate::Plan {
        calls: args.calls.max(1),
        clients: args.clients.max(1),
        leasers: args.leasers.clone(),
        callgrind: args.callgrind,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let costs = rt.block_on(calibrate::measure(&args.redis, &plan))?;
    println!("{}", command_line());
    print!("{}", calibrate::table(&costs));
    Ok(())
}

#[derive(Debug, Args)]
struct LiveArgs {
    /// Redis URL, e.g. redis://127.0.0.1:6380/. Use a Redis nobody else is using: store calls
    /// are counted from its INFO commandstats.
    #[arg(long)]
    redis: String,
    /// The scenario file (TOML).
    scenario: PathBuf,
    #[command(flatten)]
    opts: RunOpts,
}

#[derive(Debug, Args)]
struct RunOpts {
    /// Seed of every random choice (overrides the scenario's).
    #[arg(long)]
    seed: Option<u64>,
    /// Report directory (default: target/sim/NAME/, NAME being the scenario's name; in
    /// $CARGO_TARGET_DIR if set).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Modes to run, comma-separated (default: the scenario's `modes`, else every mode but
    /// lock-based): pure-redis, hybrid, hybrid-rate, hybrid-fixed, static-share, lock-based
    /// (simulated runs only).
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<Mode>>,
    /// Simulated seconds (overrides the scenario's; events past the end are dropped).
    #[arg(long)]
    duration_s: Option<f64>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Every column in the printed table (admitted, rejected, idle denials, decision
    /// latency too; `summary.md` always has them).
    #[arg(long)]
    wide: bool,
}

/// The report directory when `--out` is not given: `sim/<dir>` in cargo's target directory
/// (`$CARGO_TARGET_DIR` if set, as `cargo run` would build there, else `./target`).
fn default_out(dir: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|t| !t.is_empty())
        .map_or_else(|| PathBuf::from("target"), PathBuf::from);
    target.join("sim").join(dir)
}

/// The command line as typed, runnable from the workspace root.
fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| {
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect();
    format!("cargo run --release -p simulations -- {}", args.join(" "))
}

fn progress_bar(sc: &Scenario, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let per_mode = sc.duration_ns() / 1_000_000;
    let bar = ProgressBar::new(per_mode * sc.modes.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>14} [{bar:40}] {percent:>3}% {elapsed_precise}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

fn run(path: &Path, opts: RunOpts, live_url: Option<&str>) -> Result<()> {
    let scenario = Scenario::load(path)?;
    let duration = match (opts.duration_s, live_url) {
        (Some(d), _) => Some(d),
        (None, Some(_)) => Some(scenario.duration_s.min(DEFAULT_LIVE_DURATION_S)),
        (None, None) => None,
    };
    let sc = scenario
        .with_overrides(opts.seed, duration, opts.modes)?
        .resolved();
    let kind = if live_url.is_some() {
        "live"
    } else {
        "simulated"
    };
    println!(
        "scenario {} ({kind}): seed {}, {} s, {} nodes, rate {}/s, burst {}, modes {}",
        sc.name,
        sc.seed,
        sc.duration_s,
        sc.nodes,
        sc.rate,
        sc.burst(),
        sc.modes
            .iter()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    let bar = progress_bar(&sc, opts.quiet);
    let per_mode = sc.duration_ns() / 1_000_000;
    let modes = sc.modes.clone();
    let progress = |i: usize, ns: u64| {
        bar.set_message(modes[i].as_str());
        bar.set_position(i as u64 * per_mode + ns / 1_000_000);
    };
    let started = Instant::now();
    let report = match live_url {
        None => sim::run_all(&sc, command_line(), &progress)?,
        Some(url) => live::run_all(&sc, url, command_line(), &progress)?,
    };
    bar.finish_and_clear();
    let out = opts.out.unwrap_or_else(|| match live_url {
        None => default_out(&sc.name),
        Some(_) => default_out(&format!("{}-live", sc.name)),
    });
    report.write(&out)?;
    plots::write_all(&report, &out)?;
    print!("{}", report.table(opts.wide));
    for note in report.notes() {
        println!("{note}");
    }
    println!("{LEGEND}");
    println!(
        "{} requests, {:.1} s wall; report in {}",
        report.requests,
        started.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

/// The columns of the table a run prints, in a few words (`summary.md` and
/// `simulations/src/metrics.rs` define them).
const LEGEND: &str = "\
util = admitted / min(demand, burst + rate x duration); 1st s = the same over the first second
jain = Jain's index of per-node acceptance (1: every node alike); min/max = worst node's over best's
overshoot = worst window's excess over burst + rate x window; store calls = the run's calls to the store
calls/s/node = busiest node's busiest second
Redis CPU = cores of Redis time; stranded = tokens lost with crashed nodes, expired leases or given-up calls
trace hash = a hash of every decision in order: equal hashes, identical runs
(--wide adds admitted, rejected, idle denials: denials while another node held unused tokens,
and p50/p99/p999 decision latency, µs; summary.md has every column)";

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Live(args)) => run(&args.scenario, args.opts, Some(&args.redis)),
        Some(Command::Calibrate(args)) => calibrate(&args),
        Some(Command::Sweep(args)) => sweep(args),
        None => {
            let Some(path) = cli.scenario else {
                use clap::CommandFactory;
                Cli::command().print_help()?;
                std::process::exit(2);
            };
            run(&path, cli.opts, None)
        }
    }
}
