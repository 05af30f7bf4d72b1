//! Another language on the same bucket: a Python process (redis-py, `tests/python/`) runs
//! `lua/token_bucket.lua` on one limiter's key while a Rust `HybridLimiter` leases from it on
//! the same redis-server, and together they stay within one budget.
//!
//! The Python client builds the script as a client in another language would, from the files:
//! `lua/helpers.lua` followed by `lua/token_bucket.lua`; the test checks that it ran the same
//! script as the crate (`TOKEN_BUCKET_LUA`, by SHA1).
//!
//! Python's dependencies go into a venv under the cargo target dir (`CARGO_TARGET_TMPDIR`),
//! created once and reused while `tests/python/requirements.txt` is unchanged.
//! `scripts/test.sh` installs `python3` and `python3-venv` when missing. Without Python or
//! without network for pip the test fails with the reason; it never skips.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ratelease::{AdaptiveLease, HybridLimiter, Quota, RedisStore, TOKEN_BUCKET_LUA};
use support::RedisServer;

const REQUIREMENTS: &str = include_str!("python/requirements.txt");

/// Runs `cmd`, panicking with `what`, the hint and its output if it fails.
fn run(cmd: &mut Command, what: &str, hint: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}\n{hint}"));
    assert!(
        out.status.success(),
        "{what} failed ({}).\n{hint}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The venv's python, with `requirements.txt` installed.
///
/// The tests of this file run on parallel threads of one process; the first to get here
/// builds the venv while the others wait on `VENV`, so two never build it into one directory
/// at once (on a fresh target dir they did: `File exists`, then `ensurepip` failed).
fn python() -> PathBuf {
    static VENV: Mutex<()> = Mutex::new(());
    // A test that panicked while building leaves the lock poisoned; the next one rebuilds.
    let _building = VENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-venv");
    let python = venv.join("bin").join("python");
    let stamp = venv.join("ratelease-requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(REQUIREMENTS) && python.exists() {
        return python;
    }
    let _ = std::fs::remove_dir_all(&venv);
    run(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        "creating a Python venv",
        "Install python3 and python3-venv (scripts/test.sh does it with apt-get).",
    );
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/requirements.txt");
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&requirements),
        "pip install -r tests/python/requirements.txt",
        "pip needs network access to PyPI (or a configured mirror) once; the venv is cached.",
    );
    std::fs::write(&stamp, REQUIREMENTS).unwrap();
    python
}

/// What a Python pure-mode client and a Rust `HybridLimiter` leasing under `policy` admitted
/// from one key in about 1.5 s, both asking as fast as they can, checked against the budget.
struct Shared {
    python: u64,
    python_calls: u64,
    rust: u64,
}

async fn share_one_bucket(policy: AdaptiveLease) -> Shared {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let server = RedisServer::start();
    let (rate, burst) = (200u64, 20u64);
    let quota = Quota::per_second(rate).unwrap().with_burst(burst).unwrap();
    let store = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let key = store.key("polyglot");
    let hybrid = HybridLimiter::builder("polyglot", quota, store)
        .policy(policy)
        .build()
        .unwrap();

    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let rust_admitted = Arc::new(AtomicU64::new(0));
    let rust = {
        let (hybrid, stop, admitted) = (hybrid.clone(), stop.clone(), rust_admitted.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if hybrid.try_acquire(1).unwrap().is_allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_micros(300)).await;
            }
        })
    };
    let lua_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/token_bucket_client.py");
    let out = tokio::process::Command::new(&python)
        .arg(&client)
        .arg(server.url())
        .arg(&lua_dir)
        .arg(&key)
        .args([
            rate.to_string(),
            quota.period_us().to_string(),
            burst.to_string(),
            "1.5".to_string(),
        ])
        .output()
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    rust.await.unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let field = |name: &str| -> u64 {
        let tail =
            &stdout[stdout.find(&format!("\"{name}\": ")).expect(&stdout) + name.len() + 4..];
        tail[..tail.find([',', '}']).unwrap()]
            .trim()
            .parse()
            .unwrap()
    };
    let (py_admitted, py_calls) = (field("admitted"), field("calls"));
    let sha = redis::Script::new(TOKEN_BUCKET_LUA).get_hash().to_owned();
    assert!(
        stdout.contains(&format!("\"sha\": \"{sha}\"")),
        "python ran another script than TOKEN_BUCKET_LUA ({sha}): {stdout}"
    );
    let rust_admitted = rust_admitted.load(Ordering::Relaxed);
    let total = py_admitted + rust_admitted;
    let budget = burst as f64 + rate as f64 * elapsed;
    eprintln!(
        "python {py_admitted} of {py_calls} calls, rust {rust_admitted}, \
         total {total} of budget {budget:.0} in {elapsed:.2} s"
    );
    assert!(
        total as f64 <= budget,
        "admitted {total} > budget {budget:.0}"
    );
    assert!(py_calls > py_admitted, "python was never denied");
    Shared {
        python: py_admitted,
        python_calls: py_calls,
        rust: rust_admitted,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_rust_share_one_bucket() {
    let s = share_one_bucket(AdaptiveLease::new()).await;
    // Both sides really competed for the bucket.
    assert!(
        s.python >= 10 && s.rust >= 10,
        "python {} of {} calls, rust {}",
        s.python,
        s.python_calls,
        s.rust
    );
}

/// A rate lease is carved out of the refill by a share among the leasers; the store counts
/// what anonymous calls ask for in that share, so a pure-mode client beside a rate-leasing
/// node still gets a part of the budget (without it: 2 of 2 184 requests, the node 347).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_beside_a_rate_leasing_node_keeps_a_part_of_the_budget() {
    let s = share_one_bucket(AdaptiveLease::new().rate_leases(true)).await;
    let total = (s.python + s.rust) as f64;
    assert!(
        s.python as f64 >= total / 5.0 && s.rust >= 10,
        "python {} of {} calls, rust {}",
        s.python,
        s.python_calls,
        s.rust
    );
}

/// With token leases the node's share counts the Python client's demand too, and the client
/// reaches the reserve only against the credit of its own share: neither side takes the
/// other's part (before: Python 301, Rust 46 — the client took the whole level, reserve
/// included, while the node reached it only against credit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_beside_a_token_leasing_node_is_served_no_better_than_the_node() {
    let s = share_one_bucket(AdaptiveLease::new().rate_leases(false)).await;
    let total = (s.python + s.rust) as f64;
    assert!(
        s.python as f64 >= total / 5.0 && s.rust as f64 >= total / 3.0,
        "python {} of {} calls, rust {}",
        s.python,
        s.python_calls,
        s.rust
    );
}
