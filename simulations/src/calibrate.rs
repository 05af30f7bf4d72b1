//! `simulate calibrate`: what each script operation costs a real Redis server.
//!
//! The simulator models Redis as one FIFO server that is busy for a *service time* per script
//! call. That number decides when pure-Redis mode saturates and how much Redis CPU a fleet
//! costs, so it must come from a real server, not from a guess. This command measures it the
//! way an operator would: it runs each operation many times against `--redis` (a server
//! nobody else is using) and reads Redis's own accounting, `INFO commandstats`, where
//! `usec_per_call` of `cmdstat_evalsha` is the server time one script call took (the script and
//! every command it ran, excluding network and client time). `CONFIG RESETSTAT` runs before
//! each operation, so each row is that operation alone. Beside it, the server's whole CPU time
//! per call (`used_cpu_user + used_cpu_sys` of `INFO cpu`, before and after): the command plus
//! reading, parsing and answering it — what a call really costs a Redis core, and what the
//! simulator's service times are.
//!
//! The operations are the ones the limiters send, through the library's own [`RedisStore`]:
//! a pure-mode decision (an anonymous lease of exactly one token), a node's lease on terms with
//! 10 to 10 000 other leasers on record, and a node's release. Beside them, in the same run, a
//! **GCRA baseline** in the style of go-redis/redis_rate (one script: `TIME`, `GET` the
//! theoretical arrival time, `SET` it with an expiry) — the cheapest exact shared limiter there
//! is — so every cost is also a ratio that does not depend on the machine.
//!
//! Times on a shared or virtual machine swing by ±20 % between runs, more than most changes to
//! a script move them. With `--callgrind`, against a server running under Valgrind's callgrind
//! (`scripts/script-instructions.sh` starts one), each row also counts the machine
//! instructions the server executed per call — reading, running and answering it — from
//! callgrind's running totals (`callgrind_control -e <pid>`, before and after the calls).
//! Counts repeat within about 1 % from run to run, so a change of a few percent shows.
//!
//! The closing lines print the simulator's service-time settings as measured: `service_us`
//! for a node's lease (the most expensive of the leaser counts), `service_pure_us` for a pure
//! decision, `service_release_us` for a release and `service_command_us` for one plain
//! command (the baseline's GET and SET, as the lock-based mode sends them).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ratelease::{
    LeaseRequest, LeaseStore, NodeLease, NodeRelease, Quota, RedisStore, ReleaseRequest,
};

/// A GCRA decision as go-redis/redis_rate makes it: the key holds the theoretical arrival time
/// (TAT) in seconds; a request of `cost` is allowed if `TAT + cost × interval − burst ×
/// interval ≤ now`, and then TAT moves on. Written here from the algorithm (it is the
/// baseline, not a product).
const GCRA_LUA: &str = r#"
redis.replicate_commands()
local burst, rate, period, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local interval = period / rate
local t = redis.call('TIME')
local now = (t[1] - 1483228800) + t[2] / 1000000
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local next_tat = tat + interval * cost
local diff = now - (next_tat - interval * burst)
if diff < 0 then return { 0, 0, tostring(-diff), tostring(tat - now) } end
local reset = next_tat - now
if reset > 0 then redis.call('SET', KEYS[1], next_tat, 'EX', math.ceil(reset)) end
return { cost, diff / interval, '-1', tostring(reset) }
"#;

/// One measured operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    /// What was measured.
    pub op: String,
    /// Script calls the server counted.
    pub calls: u64,
    /// Server time per call, µs (`usec / calls` of `cmdstat_evalsha`).
    pub usec_per_call: f64,
    /// The server's CPU time per call, µs (`INFO cpu` before and after, over the calls made),
    /// including network I/O and parsing; NaN where not measured.
    pub cpu_us_per_call: f64,
    /// Calls per second the client achieved (wall clock, all clients together).
    pub calls_per_s: f64,
    /// Machine instructions the server executed per call, counted by callgrind (`--callgrind`);
    /// NaN where not measured.
    pub instructions_per_call: f64,
}

/// `calls=` and `usec=` of `cmdstat_<name>` in an `INFO commandstats` reply.
pub fn parse_command_stat(info: &str, name: &str) -> Option<(u64, u64)> {
    Some((
        command_stat_field(info, name, "calls")?,
        command_stat_field(info, name, "usec")?,
    ))
}

/// The `<field>=` count of `cmdstat_<name>` in an `INFO commandstats` reply.
pub fn command_stat_field(info: &str, name: &str, field: &str) -> Option<u64> {
    let want = format!("cmdstat_{name}");
    let prefix = format!("{field}=");
    info.lines().find_map(|line| {
        let (key, fields) = line.trim().split_once(':')?;
        if key != want {
            return None;
        }
        fields
            .split(',')
            .find_map(|f| f.strip_prefix(prefix.as_str()))
            .and_then(|v| v.parse::<u64>().ok())
    })
}

/// What `calibrate` measures.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Script calls per operation.
    pub calls: u64,
    /// Concurrent clients sending them.
    pub clients: usize,
    /// Leasers on record for the node-lease rows.
    pub leasers: Vec<u64>,
    /// Also count the server's instructions per call: the server runs under Valgrind's
    /// callgrind on this machine, and `callgrind_control` reads its totals.
    pub callgrind: bool,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            calls: 20_000,
            clients: 8,
            leasers: vec![10, 1_000, 10_000],
            callgrind: false,
        }
    }
}

/// Measures every operation of `plan` against the Redis at `url`.
pub async fn measure(url: &str, plan: &Plan) -> Result<Vec<Cost>> {
    let client = redis::Client::open(url).context("bad Redis URL")?;
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("cannot connect to {url}"))?;
    let store = RedisStore::builder(url)
        .prefix("ratelease:calibrate:")
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("cannot connect to {url}"))?;
    // A quota no run can exhaust: every call does the full work of a grant.
    let big = Quota::per_second(1_000_000_000)?.with_burst(1_000_000_000)?;
    let mut costs = Vec::new();

    let gcra = redis::Script::new(GCRA_LUA);
    let shared = admin.clone();
    let baseline = run_op(
        &mut admin,
        "gcra baseline (redis_rate style)",
        &["evalsha"],
        plan,
        |i| {
            let mut conn = shared.clone();
            let gcra = gcra.clone();
            async move {
                let key = format!("ratelease:calibrate:gcra:{}", i % 16);
                let _: redis::Value = gcra
                    .key(key)
                    .arg(1_000_000u64)
                    .arg(1_000_000u64)
                    .arg(1)
                    .arg(1)
                    .invoke_async(&mut conn)
                    .await?;
                Ok(())
            }
        },
    )
    .await?;
    costs.push(baseline);
    // One plain command a call (GET and SET in turn), as the lock-based mode sends them.
    let plain = run_op(
        &mut admin,
        "plain command (GET or SET)",
        &["get", "set"],
        plan,
        |i| {
            let mut conn = shared.clone();
            async move {
                let key = format!("ratelease:calibrate:plain:{}", i % 16);
                if i % 2 == 0 {
                    let _: Option<String> =
                        redis::cmd("GET").arg(key).query_async(&mut conn).await?;
                } else {
                    let _: () = redis::cmd("SET")
                        .arg(key)
                        .arg(i)
                        .arg("PX")
                        .arg(60_000)
                        .query_async(&mut conn)
                        .await?;
                }
                Ok(())
            }
        },
    )
    .await?;
    costs.push(plain);

    costs.push(
        run_op(
            &mut admin,
            "pure decision (exact 1)",
            &["evalsha"],
            plan,
            |i| {
                let store = store.clone();
                async move {
                    let name = format!("pure{}", i % 16);
                    store.lease(&name, &big, &LeaseRequest::exact(1)).await?;
                    Ok(())
                }
            },
        )
        .await?,
    );

    // Leases on terms, with every leaser on record first (not measured): plain ones at each
    // fleet size, then ones that also ask for a rate (a rate lease; every leaser holds one, so
    // the bucket is stored with the rates held and each call ends one rate and grants the next).
    let terms = |rate_mtps: u64| {
        move |id: u64| NodeLease {
            id,
            held: if rate_mtps > 0 { 10 } else { 0 },
            demand_mtps: 1_000_000,
            horizon: Duration::from_millis(100),
            ttl: Duration::from_secs(600),
            rate_mtps,
            release_seq: 0,
        }
    };
    let leasers = plan.leasers.first().copied().unwrap_or(10).max(1);
    let cases = plan
        .leasers
        .iter()
        .map(|&n| {
            (
                n,
                0,
                format!("lease{n}"),
                format!("node lease on terms, {n} leasers"),
            )
        })
        .chain([(
            leasers,
            1_000_000,
            format!("rate{leasers}"),
            format!("node lease asking a rate, {leasers} leasers"),
        )]);
    for (count, rate_mtps, name, label) in cases {
        let terms = terms(rate_mtps);
        for id in 0..count {
            store
                .lease(&name, &big, &LeaseRequest::new(10, 1).by(terms(id)))
                .await?;
        }
        costs.push(
            run_op(&mut admin, &label, &["evalsha"], plan, |i| {
                let store = store.clone();
                let name = name.clone();
                async move {
                    let req = LeaseRequest::new(10, 1).by(terms(i % count));
                    store.lease(&name, &big, &req).await?;
                    Ok(())
                }
            })
            .await?,
        );
    }

    // The same lease as the first row's in the script's text protocol (every number a decimal
    // argument, the reply integers, as another language's client sends it), on the same
    // bucket: what packing a node's call saves.
    let text = redis::Script::new(ratelease::TOKEN_BUCKET_LUA);
    // (The first row's bucket; the release row below uses it too.)
    let name = format!("lease{leasers}");
    let bucket = store.key(&name);
    let keys = [
        bucket.clone(),
        format!("{bucket}:leasers"),
        format!("{bucket}:expiry"),
        store.config_key(&name),
    ];
    let label = format!("node lease in the text protocol, {leasers} leasers");
    costs.push(
        run_op(&mut admin, &label, &["evalsha"], plan, |i| {
            let (mut conn, text, keys) = (shared.clone(), text.clone(), keys.clone());
            let n = terms(0)(i % leasers);
            async move {
                let _: Vec<u64> = text
                    .key(&keys[..])
                    .arg("lease")
                    .arg(big.rate())
                    .arg(big.period_us())
                    .arg(big.burst())
                    .arg(10)
                    .arg(1)
                    .arg("")
                    .arg(format!("{:016x}", n.id))
                    .arg(n.held)
                    .arg(n.demand_mtps)
                    .arg(n.horizon.as_micros() as u64)
                    .arg(n.ttl.as_micros() as u64)
                    .invoke_async(&mut conn)
                    .await?;
                Ok(())
            }
        })
        .await?,
    );

    // An anonymous decision (exact 1) on a bucket with leasers: the store sends every key
    // once a one-key call found leasers there (before, each one-key call was answered "send
    // every key" and sent again: two script calls a decision). Beside rate leases it also
    // counts what it asks for in the leasers' bookkeeping, one more write.
    for (bucket, label) in [
        (
            format!("lease{leasers}"),
            format!("anonymous decision beside {leasers} leasers"),
        ),
        (
            format!("rate{leasers}"),
            format!("anonymous decision beside {leasers} rate leases"),
        ),
    ] {
        costs.push(
            run_op(&mut admin, &label, &["evalsha"], plan, |_| {
                let store = store.clone();
                let bucket = bucket.clone();
                async move {
                    store.lease(&bucket, &big, &LeaseRequest::exact(1)).await?;
                    Ok(())
                }
            })
            .await?,
        );
    }

    costs.push(
        run_op(&mut admin, "node release", &["evalsha"], plan, |i| {
            let store = store.clone();
            let name = name.clone();
            async move {
                let req = ReleaseRequest::new(1).by(NodeRelease {
                    id: i % leasers,
                    seq: 1_000_000 + i,
                    leaving: false,
                });
                store.release(&name, &big, &req).await?;
                Ok(())
            }
        })
        .await?,
    );
    Ok(costs)
}

/// Resets the server's statistics, runs `plan.calls` calls of `op` (call `i` made by
/// `call(i)`) from `plan.clients` concurrent tasks, and reads back the time of `commands`
/// (`cmdstat_<name>`, summed) and the server's CPU time.
async fn run_op<F, Fut>(
    admin: &mut redis::aio::MultiplexedConnection,
    label: &str,
    commands: &[&str],
    plan: &Plan,
    call: F,
) -> Result<Cost>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    // Warm up (script cache, key creation), then measure from clean statistics.
    for i in 0..100 {
        call(i).await?;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(admin)
        .await
        .context("CONFIG RESETSTAT failed (is this a Redis you may administer?)")?;
    let cpu_before = server_cpu_s(admin).await?;
    let instructions_before = match plan.callgrind {
        true => Some(server_instructions(admin).await?),
        false => None,
    };
    let started = Instant::now();
    let clients = plan.clients.max(1) as u64;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mine: Vec<Fut> = (0..plan.calls)
            .filter(|i| i % clients == c)
            .map(&call)
            .collect();
        tasks.push(tokio::spawn(async move {
            for f in mine {
                f.await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let wall = started.elapsed();
    let cpu = server_cpu_s(admin).await? - cpu_before;
    let instructions = match instructions_before {
        Some(before) => (server_instructions(admin).await? - before) as f64,
        None => f64::NAN,
    };
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .context("INFO commandstats failed")?;
    let (calls, usec) = commands
        .iter()
        .filter_map(|c| parse_command_stat(&info, c))
        .fold((0, 0), |(c, u), (calls, usec)| (c + calls, u + usec));
    if calls < plan.calls {
        bail!(
            "{label}: the server counted {calls} calls of {commands:?}, expected {}",
            plan.calls
        );
    }
    let cost = Cost {
        op: label.to_owned(),
        calls,
        usec_per_call: usec as f64 / calls as f64,
        cpu_us_per_call: cpu * 1e6 / plan.calls as f64,
        calls_per_s: plan.calls as f64 / wall.as_secs_f64(),
        instructions_per_call: instructions / plan.calls as f64,
    };
    Ok(cost)
}

/// The server's CPU time so far, s (`used_cpu_user + used_cpu_sys` of `INFO cpu`).
async fn server_cpu_s(admin: &mut redis::aio::MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(admin)
        .await
        .context("INFO cpu failed")?;
    parse_server_cpu_s(&info).context("no used_cpu_user / used_cpu_sys in INFO cpu")
}

/// Instructions the server has executed so far under callgrind: its process id from `INFO
/// server`, then the totals of `callgrind_control -e <pid>` (every thread's, summed).
async fn server_instructions(admin: &mut redis::aio::MultiplexedConnection) -> Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(admin)
        .await
        .context("INFO server failed")?;
    let pid = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .context("no process_id in INFO server")?
        .to_owned();
    // Blocking, between the calls of an operation: nothing else runs meanwhile.
    let out = std::process::Command::new("callgrind_control")
        .arg("-e")
        .arg(&pid)
        .output()
        .context("cannot run callgrind_control (is Valgrind installed?)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_callgrind_totals(&text).with_context(|| {
        format!(
            "no instruction totals from `callgrind_control -e {pid}`: is the server running \
             under callgrind on this machine? It said: {text}"
        )
    })
}

/// The instructions (Ir) of every thread in `callgrind_control -e` output, summed: the lines
/// after `Totals:` read `Th <n>  <count>`, the count with thousands separators.
pub fn parse_callgrind_totals(text: &str) -> Option<u64> {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("Totals:"));
    lines.next()?;
    let mut sum = None;
    for line in lines {
        let Some(rest) = line.trim().strip_prefix("Th ") else {
            continue;
        };
        let count = rest.split_whitespace().nth(1)?.replace(',', "");
        *sum.get_or_insert(0) += count.parse::<u64>().ok()?;
    }
    sum
}

/// `used_cpu_user + used_cpu_sys` of an `INFO cpu` reply, s.
pub fn parse_server_cpu_s(info: &str) -> Option<f64> {
    let field = |name: &str| {
        info.lines().find_map(|l| {
            l.trim()
                .strip_prefix(name)
                .and_then(|v| v.strip_prefix(':'))
                .and_then(|v| v.parse::<f64>().ok())
        })
    };
    Some(field("used_cpu_user")? + field("used_cpu_sys")?)
}

/// The measurements as a Markdown table (with each cost as a multiple of the GCRA baseline,
/// the first row) and the simulator settings they imply.
pub fn table(costs: &[Cost]) -> String {
    let base = costs.first().map_or(1.0, |c| c.usec_per_call.max(1e-9));
    let base_instructions = costs.first().map_or(f64::NAN, |c| c.instructions_per_call);
    let counted = costs.iter().any(|c| c.instructions_per_call.is_finite());
    let mut s = String::from(
        "| operation | calls | Redis µs per call (commandstats) | × GCRA baseline | \
         Redis CPU µs per call (INFO cpu) | calls/s (wall) |",
    );
    s.push_str(match counted {
        true => {
            " instructions per call (callgrind) | × GCRA baseline |\n\
                 | --- | --- | --- | --- | --- | --- | --- | --- |\n"
        }
        false => "\n| --- | --- | --- | --- | --- | --- |\n",
    });
    let or_dash = |x: f64, digits: usize| {
        if x.is_finite() {
            format!("{x:.digits$}")
        } else {
            "-".into()
        }
    };
    for c in costs {
        let _ = write!(
            s,
            "| {} | {} | {:.2} | {:.2}× | {} | {} |",
            c.op,
            c.calls,
            c.usec_per_call,
            c.usec_per_call / base,
            or_dash(c.cpu_us_per_call, 2),
            or_dash(c.calls_per_s, 0),
        );
        if counted {
            let _ = write!(
                s,
                " {} | {}× |",
                or_dash(c.instructions_per_call, 0),
                or_dash(c.instructions_per_call / base_instructions, 2),
            );
        }
        s.push('\n');
    }
    // Under callgrind the times are Valgrind's, not the server's: no settings from them.
    if counted {
        return s;
    }
    // The simulator's service times are the whole CPU per call.
    let find = |prefix: &str| {
        costs
            .iter()
            .filter(|c| c.op.starts_with(prefix))
            .map(|c| {
                if c.cpu_us_per_call.is_finite() {
                    c.cpu_us_per_call
                } else {
                    c.usec_per_call
                }
            })
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    };
    if let (Some(lease), Some(pure), Some(release), Some(command)) = (
        find("node lease"),
        find("pure decision"),
        find("node release"),
        find("plain command"),
    ) {
        let _ = writeln!(
            s,
            "\nsimulator settings (scenario keys): service_us = {lease:.1}  \
             service_pure_us = {pure:.1}  service_release_us = {release:.1}  \
             service_command_us = {command:.1}"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_calls_and_usec_of_one_command() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=1\r\n\
            cmdstat_evalsha_ro:calls=1000,usec=1,usec_per_call=0.00,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(parse_command_stat(info, "evalsha"), Some((120, 900)));
        assert_eq!(parse_command_stat(info, "evalsha_ro"), Some((1000, 1)));
        assert_eq!(parse_command_stat(info, "get"), None);
    }

    #[test]
    fn the_table_is_relative_to_the_baseline() {
        let cost = |op: &str, us: f64| Cost {
            op: op.into(),
            calls: 10,
            usec_per_call: us,
            cpu_us_per_call: us * 2.0,
            calls_per_s: 1.0,
            instructions_per_call: f64::NAN,
        };
        let t = table(&[
            cost("gcra", 2.0),
            cost("pure decision", 3.0),
            cost("node lease on terms, 10 leasers", 5.0),
            cost("node lease on terms, 1000 leasers", 6.0),
            cost("node release", 4.0),
            cost("plain command (GET or SET)", 0.5),
        ]);
        assert!(
            t.contains("| pure decision | 10 | 3.00 | 1.50× | 6.00 | 1 |"),
            "{t}"
        );
        assert!(t.contains("service_us = 12.0"), "{t}");
        assert!(t.contains("service_pure_us = 6.0"), "{t}");
        assert!(t.contains("service_command_us = 1.0"), "{t}");
        // No instruction columns unless they were counted.
        assert!(!t.contains("callgrind"), "{t}");
    }

    #[test]
    fn counted_instructions_are_relative_to_the_baseline_too() {
        let cost = |op: &str, us: f64, instructions: f64| Cost {
            op: op.into(),
            calls: 10,
            usec_per_call: us,
            cpu_us_per_call: us * 2.0,
            calls_per_s: 1.0,
            instructions_per_call: instructions,
        };
        let t = table(&[
            cost("gcra", 2.0, 72_000.0),
            cost("pure decision", 3.0, 108_000.0),
            cost("node lease on terms, 10 leasers", 5.0, f64::NAN),
        ]);
        assert!(
            t.contains("instructions per call (callgrind) | × GCRA baseline |"),
            "{t}"
        );
        assert!(
            t.contains("| pure decision | 10 | 3.00 | 1.50× | 6.00 | 1 | 108000 | 1.50× |"),
            "{t}"
        );
        assert!(t.contains("| 10.00 | 1 | - | -× |"), "{t}");
        // Times under Valgrind are not the server's: no service times from them.
        assert!(!t.contains("service_us"), "{t}");
        // Every row has as many cells as the header.
        let cells = |l: &str| l.matches('|').count();
        let head = cells(t.lines().next().unwrap());
        assert!(t.lines().take(5).all(|l| cells(l) == head), "{t}");
    }

    #[test]
    fn reads_callgrind_totals_of_every_thread() {
        let out = "PID 25954: redis-server --port 6398\n\n  Totals:        Ir \n   \
                   Th 1  24,707,748 \n   Th 2         518 \n   Th 5       4,901 \n";
        assert_eq!(parse_callgrind_totals(out), Some(24_707_748 + 518 + 4_901));
        // A process not under callgrind prints no totals.
        assert_eq!(
            parse_callgrind_totals("Error: Callgrind task with PID 1 not detected.\n"),
            None
        );
        assert_eq!(
            parse_callgrind_totals("  Totals:   Ir\n   Th 1  many\n"),
            None
        );
    }

    #[test]
    fn reads_the_server_cpu() {
        let info = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\n\
            used_cpu_sys_children:9.0\r\n";
        assert_eq!(parse_server_cpu_s(info), Some(3.75));
        assert_eq!(parse_server_cpu_s("used_cpu_sys:1\r\n"), None);
    }
}
