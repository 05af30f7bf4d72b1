//! Tests for the real-`redis-server` harness in `tests/support`.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::RedisServer;

/// Whether a process with this pid exists (a zombie counts as existing, so
/// this also catches a process that was killed but never waited for).
fn process_exists(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        Command::new("kill")
            .args(["-0", &pid.to_string()])
            .status()
            .map(|status| status.success())
            .unwrap_or(false)
    }
}

fn assert_process_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while process_exists(pid) {
        assert!(
            Instant::now() < deadline,
            "redis-server pid {pid} still exists 5 s after being dropped/stopped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn config_get(server: &RedisServer, name: &str) -> String {
    let reply: Vec<String> = server.cmd(&["CONFIG", "GET", name]);
    assert_eq!(reply.len(), 2, "CONFIG GET {name} returned {reply:?}");
    assert_eq!(reply[0], name);
    reply[1].clone()
}

#[test]
fn starts_answers_ping_and_uses_the_harness_config() {
    let server = RedisServer::start();
    assert_eq!(server.cmd::<String>(&["PING"]), "PONG");

    let port = server.port().expect("TCP server has a port");
    assert_ne!(port, 6379, "the harness must never use the default port");
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
    assert!(process_exists(server.pid()));

    assert_eq!(config_get(&server, "save"), "", "persistence must be off");
    assert_eq!(config_get(&server, "appendonly"), "no");
    assert_eq!(config_get(&server, "bind"), "127.0.0.1");
    assert_eq!(config_get(&server, "port"), port.to_string());
    assert_eq!(
        Path::new(&config_get(&server, "dir"))
            .canonicalize()
            .unwrap(),
        server.dir().canonicalize().unwrap()
    );

    // The sync connection and client helpers work too.
    let mut con = server.connection();
    let () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
    let mut con2 = server.client().get_connection().unwrap();
    let v: String = redis::cmd("GET").arg("k").query(&mut con2).unwrap();
    assert_eq!(v, "v");

    assert!(
        server.log().contains("Ready to accept connections"),
        "log: {}",
        server.log()
    );
}

#[test]
fn two_servers_run_at_once_on_distinct_ports() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.pid(), b.pid());

    let () = a.cmd(&["SET", "only-in-a", "1"]);
    assert_eq!(
        a.cmd::<Option<String>>(&["GET", "only-in-a"]),
        Some("1".into())
    );
    assert_eq!(b.cmd::<Option<String>>(&["GET", "only-in-a"]), None);
}

#[test]
fn unix_socket_server_answers_and_restarts() {
    let mut server = RedisServer::start_unix();
    assert_eq!(server.port(), None);
    let socket = server.dir().join("redis.sock");
    assert_eq!(
        server.url(),
        format!("redis+unix://{}", socket.display()),
        "url must be redis+unix:///absolute/path"
    );
    assert!(server.url().starts_with("redis+unix:///"));
    assert_eq!(server.cmd::<String>(&["PING"]), "PONG");
    assert_eq!(config_get(&server, "port"), "0", "must not listen on TCP");

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "socket mode {mode:o}");
    }

    let () = server.cmd(&["SET", "k", "v"]);
    let url = server.url();
    server.restart();
    assert_eq!(server.url(), url);
    assert_eq!(server.cmd::<Option<String>>(&["GET", "k"]), None);
}

#[test]
fn restart_keeps_the_port_and_loses_the_data() {
    let mut server = RedisServer::start();
    let port = server.port();
    let pid = server.pid();

    let mut old = server.connection();
    let () = redis::cmd("SET").arg("k").arg("v").query(&mut old).unwrap();
    // Even an explicit snapshot must not survive the restart.
    let () = server.cmd(&["SAVE"]);
    assert!(server.dir().join("dump.rdb").exists());

    server.restart();

    assert_eq!(server.port(), port, "restart must reuse the address");
    assert_ne!(server.pid(), pid, "restart must start a new process");
    assert_process_gone(pid);
    assert!(
        redis::cmd("PING").query::<String>(&mut old).is_err(),
        "a connection to the killed server must fail"
    );

    let mut new = server.connection();
    let v: Option<String> = redis::cmd("GET").arg("k").query(&mut new).unwrap();
    assert_eq!(v, None, "data must be gone after a restart");
    assert_eq!(server.cmd::<u64>(&["DBSIZE"]), 0);
    let () = redis::cmd("SET")
        .arg("k2")
        .arg("v2")
        .query(&mut new)
        .unwrap();
    assert_eq!(server.cmd::<String>(&["GET", "k2"]), "v2");
}

#[test]
fn stop_kills_and_restart_brings_it_back() {
    let mut server = RedisServer::start();
    let port = server.port();
    let pid = server.pid();
    server.stop();
    assert_process_gone(pid);
    server.stop(); // idempotent

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), pid);
    assert_eq!(server.cmd::<String>(&["PING"]), "PONG");
}

#[test]
fn extra_args_are_applied_and_kept_across_restart() {
    let mut server = RedisServer::start_with_args(&["--maxmemory", "1mb", "--databases", "3"]);
    assert_eq!(config_get(&server, "maxmemory"), "1048576");
    assert_eq!(config_get(&server, "databases"), "3");
    server.restart();
    assert_eq!(config_get(&server, "maxmemory"), "1048576");
    assert_eq!(config_get(&server, "databases"), "3");
}

#[test]
fn dropping_the_server_kills_the_process() {
    let server = RedisServer::start();
    let pid = server.pid();
    let dir = server.dir().to_path_buf();
    assert!(process_exists(pid));
    drop(server);
    assert_process_gone(pid);
    assert!(!dir.exists(), "the temporary directory must be removed");
}

#[test]
fn a_panicking_test_still_kills_its_server() {
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let server = RedisServer::start();
        tx.send(server.pid()).unwrap();
        panic!("test failure while the server is running");
    });
    assert!(result.is_err());
    assert_process_gone(rx.recv().unwrap());
}

/// Environment variable that makes `missing_binary_child` do its work; it is
/// set only when `missing_binary_fails_with_the_install_step` re-runs this
/// test binary.
const CHILD_ENV: &str = "RATELEASE_HARNESS_MISSING_BINARY_CHILD";

/// Helper for the test below; passes trivially in a normal run.
#[test]
fn missing_binary_child() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let _server = RedisServer::start();
    }
}

#[test]
fn missing_binary_fails_with_the_install_step() {
    // The variable must not leak into the other tests running in parallel,
    // so the failing start happens in a fresh copy of this test binary.
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["missing_binary_child", "--exact", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(
            support::REDIS_SERVER_BIN_ENV,
            "/nonexistent/ratelease/redis-server",
        )
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "must fail, not skip:\n{text}");
    assert!(
        text.contains("1 failed"),
        "the child test must fail:\n{text}"
    );
    assert!(
        text.contains(
            "redis-server not found: run scripts/test.sh (it installs it) or \
             `apt-get install redis-server`, or set REDIS_SERVER_BIN"
        ),
        "panic must name the install step:\n{text}"
    );
}
