//! Real-`redis-server` test harness shared by every integration test
//! (`mod support;`).
//!
//! # Design
//!
//! Every test that needs Redis starts its **own** `redis-server` process with
//! [`RedisServer::start`] and gets it killed again when the value is dropped.
//! There is deliberately no shared server and nothing ever talks to the
//! default port 6379:
//!
//! * **Isolation.** `cargo test` runs tests in parallel threads. A shared
//!   server would make tests see each other's keys, `FLUSHALL`, `CONFIG SET`,
//!   killed connections and restarts; private servers make every test
//!   independent of ordering and of what else is running.
//! * **Failure tests need a server to themselves.** Restarting Redis (data
//!   loss, broken connections) is part of what the limiter must survive, and
//!   [`RedisServer::restart`] / [`RedisServer::stop`] can only be used on a
//!   server that nobody else is using.
//! * **No dependence on the machine.** A developer's or CI machine may run a
//!   system Redis on 6379 (installing the Debian package may even start one),
//!   possibly with real data, persistence or a password. The harness never
//!   touches it: each server gets a free loopback port (never 6379) or a unix
//!   socket, inside its own [`tempfile::TempDir`].
//! * **No persistence.** Servers run with `--save ''`, `--appendonly no` and a
//!   private `--dir`, so nothing is written to or loaded from disk, and a
//!   restart always comes back empty (any `dump.rdb` a test produced with an
//!   explicit `SAVE` is deleted before restarting).
//! * **Fail, don't skip.** If `redis-server` is missing the test panics with
//!   the install step instead of silently passing. `scripts/test.sh` installs
//!   it on a fresh machine; `REDIS_SERVER_BIN` points at a different binary.
//! * **No leftovers.** `Drop` kills *and waits for* the process (no zombies).
//!   On Linux the process also gets `PR_SET_PDEATHSIG = SIGKILL`, so servers
//!   die even if the test binary itself is killed before `Drop` runs. Because
//!   the kernel ties that signal to the *thread* that forked the child, all
//!   servers are spawned from one helper thread that lives as long as the
//!   test process.
//!
//! A server takes a few milliseconds to start, so one per test is cheap.
//! The harness is modelled on `redis-test`'s `server.rs` from redis-rs.

// Each integration test binary compiles its own copy of this module and uses
// only part of it; without this every binary would warn about the rest.
#![allow(dead_code)]

use std::fs::{self, File};
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Environment variable naming the `redis-server` binary to use (a path or a
/// name looked up on `PATH`). Defaults to `redis-server`.
pub const REDIS_SERVER_BIN_ENV: &str = "REDIS_SERVER_BIN";

/// How long to wait for a freshly spawned server to answer `PING`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times to try a new port when the chosen one turns out to be taken.
const PORT_ATTEMPTS: usize = 5;
/// How many times `restart` retries the (fixed) old address if it is taken.
const RESTART_ATTEMPTS: usize = 5;
/// Connect timeout for connections handed out by the harness.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Read/write timeout for connections handed out by the harness, so a wedged
/// server fails the test instead of hanging it.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest unix socket path the kernel accepts (`sun_path` is 108 bytes on
/// Linux, 104 on the BSDs; keep to the smaller, including the NUL).
const MAX_UNIX_SOCKET_PATH: usize = 103;

const NOT_FOUND: &str = "redis-server not found: run scripts/test.sh (it installs it) or \
                         `apt-get install redis-server`, or set REDIS_SERVER_BIN";

/// Where a server listens. Fixed for the lifetime of a [`RedisServer`], so
/// restarts come back on the same address.
#[derive(Clone, Debug)]
enum Addr {
    Tcp(u16),
    Unix(PathBuf),
    /// TLS only (`--port 0 --tls-port`), with the certificate files in the
    /// server's directory.
    Tls(u16),
}

/// A private `redis-server` process, killed when dropped.
pub struct RedisServer {
    /// `None` after [`RedisServer::stop`].
    child: Option<Child>,
    addr: Addr,
    /// Extra command line arguments, kept for restarts.
    extra_args: Vec<String>,
    /// The PEM root certificate the harness's own clients trust (TLS only).
    tls_ca: Option<Vec<u8>>,
    /// The PEM certificate and key the harness's own clients present (mutual TLS only).
    tls_client: Option<(Vec<u8>, Vec<u8>)>,
    /// The server's `--dir`; holds the log file and, for the unix variant,
    /// the socket. Declared last so it is removed after the process is gone.
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server on a free loopback TCP port.
    pub fn start() -> RedisServer {
        RedisServer::start_with_args(&[])
    }

    /// Starts a server on a free loopback TCP port with extra `redis-server`
    /// arguments appended after the harness's own (so they win), e.g.
    /// `&["--maxmemory", "1mb"]`. They are reused by [`RedisServer::restart`].
    pub fn start_with_args(extra: &[&str]) -> RedisServer {
        RedisServer::new(Addr::Tcp(0), extra).start_on_free_port(Addr::Tcp)
    }

    /// Starts a server that accepts only TLS (`--port 0 --tls-port <free>`,
    /// `--tls-auth-clients no`) with the given PEM server certificate, key and
    /// CA certificate; [`RedisServer::url`] is `rediss://127.0.0.1:PORT/`, and
    /// the harness's own clients trust `ca_pem`.
    #[cfg(feature = "tls")]
    pub fn start_tls(cert_pem: &str, key_pem: &str, ca_pem: &str) -> RedisServer {
        RedisServer::start_tls_with_args(cert_pem, key_pem, ca_pem, &[])
    }

    /// [`RedisServer::start_tls`] with extra `redis-server` arguments, as in
    /// [`RedisServer::start_with_args`].
    #[cfg(feature = "tls")]
    pub fn start_tls_with_args(
        cert_pem: &str,
        key_pem: &str,
        ca_pem: &str,
        extra: &[&str],
    ) -> RedisServer {
        let mut server = RedisServer::new(Addr::Tls(0), extra);
        for (file, pem) in [
            ("server.crt", cert_pem),
            ("server.key", key_pem),
            ("ca.crt", ca_pem),
        ] {
            fs::write(server.dir.path().join(file), pem).expect("cannot write a TLS file");
        }
        server.tls_ca = Some(ca_pem.as_bytes().to_vec());
        server.start_on_free_port(Addr::Tls)
    }

    /// Spawns on a free port (`addr` of it), retrying when it turns out taken.
    fn start_on_free_port(self, addr: fn(u16) -> Addr) -> RedisServer {
        let mut server = self;
        let mut failures = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            server.addr = addr(free_port());
            match server.spawn_and_wait() {
                Ok(()) => return server,
                // Someone else took the port between our probe and the
                // server's bind: try another one.
                Err(failure) if failure.address_in_use => failures.push(failure.message),
                Err(failure) => panic!("{}", failure.message),
            }
        }
        panic!(
            "redis-server could not find a free port in {PORT_ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        );
    }

    /// Starts a server that listens only on a unix socket (`--port 0`), in
    /// its temporary directory; [`RedisServer::url`] is `redis+unix:///…`.
    pub fn start_unix() -> RedisServer {
        let mut server = RedisServer::new(Addr::Unix(PathBuf::new()), &[]);
        let socket = server.dir.path().join("redis.sock");
        assert!(
            socket.as_os_str().len() <= MAX_UNIX_SOCKET_PATH,
            "unix socket path {} is too long for the kernel; set TMPDIR to a shorter directory",
            socket.display()
        );
        server.addr = Addr::Unix(socket);
        if let Err(failure) = server.spawn_and_wait() {
            panic!("{}", failure.message);
        }
        server
    }

    fn new(addr: Addr, extra: &[&str]) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("ratelease-redis-")
            .tempdir()
            .expect("cannot create a temporary directory for redis-server");
        RedisServer {
            child: None,
            addr,
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            tls_ca: None,
            tls_client: None,
            dir,
        }
    }

    /// The connection URL: `redis://127.0.0.1:PORT/` or
    /// `redis+unix:///path/to/redis.sock`.
    pub fn url(&self) -> String {
        match &self.addr {
            Addr::Tcp(port) => format!("redis://127.0.0.1:{port}/"),
            Addr::Unix(path) => format!("redis+unix://{}", path.display()),
            Addr::Tls(port) => format!("rediss://127.0.0.1:{port}/"),
        }
    }

    /// A store on this server, on the server's clock, with a response timeout of 5 s (a slow
    /// CI machine is no failure).
    pub async fn store(&self) -> ratelease::RedisStore {
        ratelease::RedisStore::builder(self.url())
            .response_timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap()
    }

    /// A lazily connected store on this server's address; on a server that is not running
    /// ([`reserve`](RedisServer::reserve)d, or stopped) every connect is refused (after one
    /// retry). Hold the server while the store is used.
    pub async fn lazy_store(&self) -> ratelease::RedisStore {
        ratelease::RedisStore::builder(self.url())
            .lazy_connect()
            .connect()
            .await
            .unwrap()
    }

    /// How many times `command` (lower case, as `INFO commandstats` names it: `pexpire`) ran
    /// since the server started or its statistics were reset (`CONFIG RESETSTAT`).
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    }

    /// The TCP port, or `None` for the unix socket variant.
    pub fn port(&self) -> Option<u16> {
        match self.addr {
            Addr::Tcp(port) | Addr::Tls(port) => Some(port),
            Addr::Unix(_) => None,
        }
    }

    /// The CA certificate file the server was started with (`--tls-ca-cert-file`), or `None`
    /// if it does not speak TLS.
    pub fn tls_ca_file(&self) -> Option<PathBuf> {
        match self.addr {
            Addr::Tls(_) => Some(self.dir.path().join("ca.crt")),
            Addr::Tcp(_) | Addr::Unix(_) => None,
        }
    }

    /// The server's working directory (`--dir`), which also holds its log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client for this server.
    pub fn client(&self) -> redis::Client {
        #[cfg(feature = "tls")]
        if let Some(ca) = &self.tls_ca {
            let certs = redis::TlsCertificates {
                client_tls: self
                    .tls_client
                    .as_ref()
                    .map(|(cert, key)| redis::ClientTlsConfig {
                        client_cert: cert.clone(),
                        client_key: key.clone(),
                    }),
                root_cert: Some(ca.clone()),
            };
            return redis::Client::build_with_tls(self.url(), certs)
                .unwrap_or_else(|e| panic!("invalid redis url {}: {e}", self.url()));
        }
        redis::Client::open(self.url())
            .unwrap_or_else(|e| panic!("invalid redis url {}: {e}", self.url()))
    }

    /// A new synchronous connection (5 s connect timeout, 30 s read/write
    /// timeouts so a wedged server fails the test instead of hanging it).
    pub fn connection(&self) -> redis::Connection {
        let con = self
            .client()
            .get_connection_with_timeout(CONNECT_TIMEOUT)
            .unwrap_or_else(|e| {
                panic!(
                    "cannot connect to {}: {e}\n{}",
                    self.url(),
                    self.diagnostics()
                )
            });
        con.set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| con.set_write_timeout(Some(IO_TIMEOUT)))
            .expect("cannot set redis connection timeouts");
        con
    }

    /// Runs one command on a new connection and converts the reply, e.g.
    /// `server.cmd::<String>(&["PING"])` or
    /// `server.cmd::<Option<String>>(&["GET", "k"])`. Panics with the command
    /// and the server log on any error.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let (name, rest) = args
            .split_first()
            .expect("RedisServer::cmd needs at least a command name");
        let mut command = redis::cmd(name);
        for arg in rest {
            command.arg(*arg);
        }
        let mut con = self.connection();
        command.query(&mut con).unwrap_or_else(|e| {
            panic!(
                "redis command {args:?} on {} failed: {e}\n{}",
                self.url(),
                self.diagnostics()
            )
        })
    }

    /// The process id of the running server. Panics if it is stopped.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("redis-server is stopped; call restart() first")
    }

    /// The contents of the server's log file (all runs, including restarts).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Kills the server (SIGKILL) and waits for it. The address and
    /// directory are kept, so [`RedisServer::restart`] can bring it back.
    /// Does nothing if it is already stopped.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `kill` fails only if the process was already reaped, which
            // cannot happen while we own the `Child`; `wait` reaps it.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server (if running) and starts a fresh one on the same
    /// address and directory with the same arguments, then waits for `PING`.
    /// The new server is empty: nothing is persisted, and any `dump.rdb` a
    /// test created with `SAVE` is deleted first. Existing connections break.
    pub fn restart(&mut self) {
        self.stop();
        for leftover in ["dump.rdb", "appendonlydir"] {
            let path = self.dir.path().join(leftover);
            let _ = fs::remove_file(&path);
            let _ = fs::remove_dir_all(&path);
        }
        let mut failures = Vec::new();
        for attempt in 0..RESTART_ATTEMPTS {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(failure) if failure.address_in_use => {
                    failures.push(failure.message);
                    thread::sleep(Duration::from_millis(100 << attempt));
                }
                Err(failure) => panic!("{}", failure.message),
            }
        }
        panic!(
            "redis-server could not be restarted on {} ({RESTART_ATTEMPTS} attempts):\n{}",
            self.url(),
            failures.join("\n")
        );
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// redis-server prints configuration errors to stderr, before the log
    /// file is opened, so stdout/stderr go to a file of their own.
    fn output_path(&self) -> PathBuf {
        self.dir.path().join("redis.out")
    }

    /// The log and the captured stdout/stderr, for panic messages.
    fn diagnostics(&self) -> String {
        let output = fs::read_to_string(self.output_path()).unwrap_or_default();
        format!(
            "--- redis-server log ({}) ---\n{}--- redis-server stdout/stderr ---\n{}",
            self.log_path().display(),
            self.log(),
            output
        )
    }

    fn command(&self) -> Command {
        let bin = redis_server_bin();
        let mut cmd = Command::new(&bin);
        cmd.arg("--save")
            .arg("")
            .args(["--appendonly", "no"])
            .args(["--dbfilename", "dump.rdb"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(["--daemonize", "no"]);
        match &self.addr {
            Addr::Tcp(port) => {
                cmd.args(["--bind", "127.0.0.1"])
                    .args(["--port", &port.to_string()]);
            }
            Addr::Unix(path) => {
                cmd.args(["--port", "0"])
                    .arg("--unixsocket")
                    .arg(path)
                    .args(["--unixsocketperm", "700"]);
            }
            Addr::Tls(port) => {
                let dir = self.dir.path();
                cmd.args(["--bind", "127.0.0.1", "--port", "0"])
                    .args(["--tls-port", &port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(dir.join("server.crt"))
                    .arg("--tls-key-file")
                    .arg(dir.join("server.key"))
                    .arg("--tls-ca-cert-file")
                    .arg(dir.join("ca.crt"))
                    .args(["--tls-auth-clients", "no"]);
            }
        }
        cmd.args(&self.extra_args);
        cmd
    }

    /// Spawns the process on `self.addr` and waits until it answers `PING`.
    /// On failure the process is gone and `self.child` is `None`.
    fn spawn_and_wait(&mut self) -> Result<(), StartFailure> {
        debug_assert!(self.child.is_none());
        if let Addr::Unix(path) = &self.addr {
            let _ = fs::remove_file(path);
        }
        let log_start = fs::metadata(self.log_path()).map_or(0, |m| m.len());
        let output = File::options()
            .create(true)
            .append(true)
            .open(self.output_path())
            .expect("cannot create redis-server output file");
        let mut cmd = self.command();
        cmd.stdin(Stdio::null())
            .stdout(output.try_clone().expect("cannot clone output file"))
            .stderr(output);
        let child = spawn(cmd).unwrap_or_else(|e| {
            let bin = redis_server_bin();
            if e.kind() == io::ErrorKind::NotFound {
                panic!("{NOT_FOUND} (tried {bin:?})");
            }
            panic!("cannot start redis-server {bin:?}: {e}");
        });
        let pid = child.id();
        self.child = Some(child);

        let reason = match self.wait_until_ready(pid) {
            Ok(()) => return Ok(()),
            Err(NotReady::Exited(status)) => format!("exited with {status}"),
            Err(NotReady::Unwaitable(e)) => format!("could not be polled: {e}"),
            Err(NotReady::TimedOut(last_error)) => {
                format!("did not answer PING within {STARTUP_TIMEOUT:?} (last error: {last_error})")
            }
        };
        self.stop();
        let log = self.log();
        let this_run = log.get(log_start as usize..).unwrap_or(&log);
        let address_in_use = this_run.contains("Address already in use");
        Err(StartFailure {
            address_in_use,
            message: format!(
                "redis-server (pid {pid}) on {} {reason}\n{}",
                self.url(),
                self.diagnostics()
            ),
        })
    }

    /// Polls until our process answers `PING`, it exits, or time runs out.
    fn wait_until_ready(&mut self, pid: u32) -> Result<(), NotReady> {
        let client = self.client();
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut last_error: String;
        loop {
            let child = self.child.as_mut().expect("server was just spawned");
            match child.try_wait() {
                Ok(Some(status)) => return Err(NotReady::Exited(status)),
                Ok(None) => {}
                Err(e) => return Err(NotReady::Unwaitable(e)),
            }
            match ping_and_get_pid(&client) {
                // Only our own process counts: if the port was taken, the
                // PING may be answered by another server while ours is
                // about to exit with "Address already in use".
                Ok(answering) if answering == pid => return Ok(()),
                Ok(answering) => last_error = format!("PING answered by other pid {answering}"),
                Err(e) => last_error = e.to_string(),
            }
            if Instant::now() >= deadline {
                return Err(NotReady::TimedOut(last_error));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

struct StartFailure {
    address_in_use: bool,
    message: String,
}

enum NotReady {
    Exited(ExitStatus),
    Unwaitable(io::Error),
    TimedOut(String),
}

/// Sends `PING`, then returns the `process_id` from `INFO server`.
fn ping_and_get_pid(client: &redis::Client) -> redis::RedisResult<u32> {
    let mut con = client.get_connection_with_timeout(Duration::from_millis(500))?;
    con.set_read_timeout(Some(Duration::from_secs(1)))?;
    let pong: String = redis::cmd("PING").query(&mut con)?;
    if pong != "PONG" {
        return Err(redis::RedisError::from(io::Error::other(format!(
            "unexpected PING reply {pong:?}"
        ))));
    }
    let info: String = redis::cmd("INFO").arg("server").query(&mut con)?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .ok_or_else(|| redis::RedisError::from(io::Error::other("INFO server has no process_id")))
}

fn redis_server_bin() -> String {
    std::env::var(REDIS_SERVER_BIN_ENV)
        .ok()
        .filter(|bin| !bin.is_empty())
        .unwrap_or_else(|| "redis-server".to_string())
}

/// The highest port a cluster node may listen on: its cluster bus listens
/// 10 000 higher, and redis-server exits ("Redis port number too high") above
/// this. Linux gives a `SO_REUSEADDR` listener (as std's are) a port from the
/// lower half of its ephemeral range (32 768–60 999) while there is one free,
/// so this rarely matters there; other systems' ranges (macOS: 49 152–65 535)
/// would make most cluster nodes fail to start.
const MAX_PORT: u16 = 65_535 - 10_000;

/// A loopback port that was free a moment ago (never 6379, never above
/// [`MAX_PORT`]). Another process may grab it before redis-server binds it;
/// callers retry on that.
fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("cannot bind a loopback port")
            .port();
        if port != 6379 && port <= MAX_PORT {
            return port;
        }
    }
}

/// Spawns `cmd` so that the child is SIGKILLed when the test process dies.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits,
/// and test threads (or `spawn_blocking` threads) may exit while the server
/// is still in use, so the fork happens on one helper thread that lives as
/// long as the process.
#[cfg(target_os = "linux")]
fn spawn(mut cmd: Command) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc::{self, Sender};
    use std::sync::OnceLock;

    extern "C" {
        fn prctl(option: std::ffi::c_int, ...) -> std::ffi::c_int;
    }
    const PR_SET_PDEATHSIG: std::ffi::c_int = 1;
    const SIGKILL: std::ffi::c_ulong = 9;

    type Request = (Command, Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Sender<Request>> = OnceLock::new();

    // SAFETY: the hook only makes one async-signal-safe syscall between
    // fork and exec, and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if prctl(PR_SET_PDEATHSIG, SIGKILL) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("redis-server-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("cannot start the redis-server spawner thread");
        tx
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .send((cmd, reply_tx))
        .expect("redis-server spawner thread is gone");
    reply_rx
        .recv()
        .expect("redis-server spawner thread is gone")
}

#[cfg(not(target_os = "linux"))]
fn spawn(mut cmd: Command) -> io::Result<Child> {
    cmd.spawn()
}

/// Environment variable naming the `redis-cli` binary (a path or a name on
/// `PATH`) used to create clusters. Defaults to `redis-cli`.
pub const REDIS_CLI_BIN_ENV: &str = "REDIS_CLI_BIN";

/// How long a freshly created cluster may take to reach `cluster_state:ok`.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(20);

/// A private Redis Cluster: `n` primaries without replicas, each a
/// [`RedisServer`] started with `--cluster-enabled yes` and a cluster config
/// file in its own temporary directory, joined by `redis-cli --cluster
/// create`. Every process is killed when the value is dropped.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `n` (≥ 3, redis-cli's minimum) primaries, assigns the 16 384
    /// slots evenly and waits until every node reports `cluster_state:ok` and
    /// knows all the others.
    pub fn start(n: usize) -> RedisCluster {
        RedisCluster::start_with(n, RedisServer::start_with_args)
    }

    /// [`RedisCluster::start`] over TLS only: every node is a
    /// [`RedisServer::start_tls`] server with this certificate, key and CA
    /// (`--port 0`, clients need no certificate), the cluster bus is TLS too
    /// (`--tls-cluster yes`, which also makes the nodes announce their TLS
    /// port in `CLUSTER SLOTS` and MOVED/ASK replies), and so is replication
    /// (`--tls-replication yes`, for replicas a test may add). The URLs are
    /// `rediss://`; the harness's own clients and `redis-cli` trust `ca_pem`.
    #[cfg(feature = "tls")]
    pub fn start_tls(n: usize, cert_pem: &str, key_pem: &str, ca_pem: &str) -> RedisCluster {
        RedisCluster::start_with(n, |cluster_args| {
            let args = [
                cluster_args,
                &["--tls-cluster", "yes", "--tls-replication", "yes"],
            ];
            RedisServer::start_tls_with_args(cert_pem, key_pem, ca_pem, &args.concat())
        })
    }

    /// Starts `n` nodes with `start_node(cluster arguments)`, joins them with
    /// `redis-cli --cluster create` (over TLS if the nodes speak it) and waits
    /// until the cluster is ok.
    fn start_with(n: usize, start_node: impl Fn(&[&str]) -> RedisServer) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                start_node(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let cli = std::env::var(REDIS_CLI_BIN_ENV)
            .ok()
            .filter(|bin| !bin.is_empty())
            .unwrap_or_else(|| "redis-cli".to_string());
        let mut create = Command::new(&cli);
        if let Some(ca) = nodes[0].tls_ca_file() {
            // The nodes do not ask for client certificates (`--tls-auth-clients no`), so
            // `--cert`/`--key` are not needed.
            create.arg("--tls").arg("--cacert").arg(ca);
        }
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port().unwrap()));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = create.output().unwrap_or_else(|e| {
            panic!("cannot run {cli:?} (install redis-tools, or set {REDIS_CLI_BIN_ENV}): {e}")
        });
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok`, knows every node
    /// and agrees on who owns every slot.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let ok = self.nodes.iter().all(|node| {
                let info: String = node.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
                    && info.contains("cluster_slots_ok:16384")
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes, in start order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node URLs, for `RedisStore::cluster_builder`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The cluster node id of node `i`.
    pub fn node_id(&self, i: usize) -> String {
        self.nodes[i].cmd(&["CLUSTER", "MYID"])
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &str) -> u16 {
        self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key])
    }

    /// The index of the node that owns `slot`, by node 0's view.
    pub fn owner(&self, slot: u16) -> usize {
        let ranges: Vec<redis::Value> = self.nodes[0].cmd(&["CLUSTER", "SLOTS"]);
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                panic!("unexpected CLUSTER SLOTS entry {range:?}")
            };
            let (lo, hi): (u16, u16) = (
                redis::from_redis_value(parts[0].clone()).unwrap(),
                redis::from_redis_value(parts[1].clone()).unwrap(),
            );
            if (lo..=hi).contains(&slot) {
                let redis::Value::Array(primary) = &parts[2] else {
                    panic!("unexpected CLUSTER SLOTS node {:?}", parts[2])
                };
                let port: u16 = redis::from_redis_value(primary[1].clone()).unwrap();
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port() == Some(port))
                    .expect("slot owned by an unknown node");
            }
        }
        panic!("slot {slot} is not assigned")
    }

    /// Moves `slot` (and its keys) to node `to`, the way `redis-cli --cluster
    /// reshard` does: SETSLOT IMPORTING on the target, MIGRATING on the source,
    /// MIGRATE the keys one by one (pausing `pause` after each, so clients see
    /// the slot half-moved and get ASK / TRYAGAIN), then SETSLOT NODE on every
    /// primary. Returns the number of keys moved.
    pub fn migrate_slot(&self, slot: u16, to: usize, pause: Duration) -> usize {
        let from = self.owner(slot);
        assert_ne!(from, to, "slot {slot} already lives on node {to}");
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let (src_id, dst_id) = (self.node_id(from), self.node_id(to));
        let slot_s = slot.to_string();
        let _: () = dst.cmd(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &src_id]);
        let _: () = src.cmd(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &dst_id]);
        thread::sleep(pause);
        let dst_port = dst.port().unwrap().to_string();
        let mut moved = 0;
        loop {
            let keys: Vec<String> = src.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_s, "1"]);
            let Some(key) = keys.first() else { break };
            let _: redis::Value = src.cmd(&["MIGRATE", "127.0.0.1", &dst_port, key, "0", "5000"]);
            moved += 1;
            thread::sleep(pause);
        }
        for node in [dst, src] {
            let _: () = node.cmd(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id]);
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if i != from && i != to {
                let _: () = node.cmd(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id]);
            }
        }
        moved
    }
}

/// The largest number of tokens admitted in any window of `window_us` (windows anchored at
/// every admission), from `(time µs, tokens)` admissions in time order.
pub fn max_in_window(admissions: &[(u64, u64)], window_us: u64) -> u64 {
    let (mut best, mut sum, mut start) = (0, 0, 0);
    for &(t, n) in admissions {
        sum += n;
        while admissions[start].0 + window_us <= t {
            sum -= admissions[start].1;
            start += 1;
        }
        best = best.max(sum);
    }
    best
}

/// A token bucket's stored state, decoded from the packed string `lua/token_bucket.lua` keeps
/// at the bucket's key (a format byte 1, then nine little-endian doubles; while leasers hold
/// rates, format 2 with a tenth, the rate they hold).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    /// Level, in 1/scale token units.
    pub v: f64,
    /// Units per token.
    pub s: f64,
    /// Time of the level, µs.
    pub t: f64,
    /// Tokens leased out and not yet spent or returned.
    pub o: f64,
    /// Total demand of live leasers, millitokens per second.
    pub d: f64,
    /// The quota the bucket was written under: rate, period (µs), burst.
    pub r: f64,
    pub p: f64,
    pub b: f64,
    /// Latest lease expiry on record, µs (0: no leaser records).
    pub x: f64,
    /// Rate held by leasers (rate leases), millitokens per second (0 in format 1).
    pub reserved: f64,
}

impl BucketState {
    /// The state in `raw`, or `None` if it is not a packed bucket.
    pub fn decode(raw: &[u8]) -> Option<Self> {
        let (format, rest) = raw.split_first()?;
        match (format, rest.len()) {
            (1, 72) | (2, 80) => {}
            _ => return None,
        }
        let f: Vec<f64> = rest
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Some(BucketState {
            v: f[0],
            s: f[1],
            t: f[2],
            o: f[3],
            d: f[4],
            r: f[5],
            p: f[6],
            b: f[7],
            x: f[8],
            reserved: f.get(9).copied().unwrap_or(0.0),
        })
    }

    /// The state stored at `key` on `server`, or `None` if there is none (or it is not a
    /// packed bucket).
    pub fn read(server: &RedisServer, key: &str) -> Option<Self> {
        let raw: Option<Vec<u8>> = server.cmd(&["GET", key]);
        raw.as_deref().and_then(Self::decode)
    }
}

/// A leaser record of `lua/token_bucket.lua` (a format byte 1, then six little-endian doubles:
/// outstanding, demand, credit, credit time, expiry, release sequence; format 2 adds a
/// seventh, the rate it holds), or `None`. The rate is 0 in format 1.
pub fn decode_leaser_record(raw: &[u8]) -> Option<[f64; 7]> {
    let (format, rest) = raw.split_first()?;
    match (format, rest.len()) {
        (1, 48) | (2, 56) => {}
        _ => return None,
    }
    let mut f = [0.0; 7];
    for (x, c) in f.iter_mut().zip(rest.chunks_exact(8)) {
        *x = f64::from_le_bytes(c.try_into().unwrap());
    }
    Some(f)
}

impl RedisServer {
    /// A server on a free loopback TCP port that is **not started yet**: its
    /// [`url`](RedisServer::url) is known, and [`RedisServer::restart`] starts
    /// it. For a client that must start before Redis does. The port is free
    /// when chosen; `restart` retries if something took it meanwhile.
    pub fn reserve(extra: &[&str]) -> RedisServer {
        RedisServer::new(Addr::Tcp(free_port()), extra)
    }

    /// [`RedisServer::start_tls`] that also requires client certificates
    /// signed by `ca_pem` (`--tls-auth-clients yes`, mutual TLS); the
    /// harness's own clients present `client_cert_pem` / `client_key_pem`.
    #[cfg(feature = "tls")]
    pub fn start_mutual_tls(
        cert_pem: &str,
        key_pem: &str,
        ca_pem: &str,
        client_cert_pem: &str,
        client_key_pem: &str,
    ) -> RedisServer {
        let mut server = RedisServer::new(Addr::Tls(0), &["--tls-auth-clients", "yes"]);
        for (file, pem) in [
            ("server.crt", cert_pem),
            ("server.key", key_pem),
            ("ca.crt", ca_pem),
        ] {
            fs::write(server.dir.path().join(file), pem).expect("cannot write a TLS file");
        }
        server.tls_ca = Some(ca_pem.as_bytes().to_vec());
        server.tls_client = Some((
            client_cert_pem.as_bytes().to_vec(),
            client_key_pem.as_bytes().to_vec(),
        ));
        server.start_on_free_port(Addr::Tls)
    }
}

/// A Redis Sentinel (`redis-server <config> --sentinel`, as a user runs it)
/// on a free loopback port, watching one master, with its config file and
/// log in its own temporary directory. Killed when dropped.
pub struct RedisSentinel {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl RedisSentinel {
    /// Starts a sentinel that monitors `master` as `name` with `quorum`,
    /// judging it down after `down_after` without a reply. Sentinels
    /// monitoring the same master find each other through it (hello messages
    /// every 2 s); see [`RedisSentinel::wait_until_aware`].
    pub fn start(name: &str, master: &RedisServer, quorum: u32, down_after: Duration) -> Self {
        let master_port = master.port().expect("a sentinel watches a TCP master");
        let mut dir = tempfile::Builder::new()
            .prefix("ratelease-sentinel-")
            .tempdir()
            .expect("cannot create a temporary directory for a sentinel");
        let mut failures = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port();
            let config = format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\nlogfile \"{log}\"\ndir \"{dir}\"\n\
                 sentinel resolve-hostnames no\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {name} {down}\n\
                 sentinel failover-timeout {name} 10000\n\
                 sentinel parallel-syncs {name} 1\n",
                log = dir.path().join("sentinel.log").display(),
                dir = dir.path().display(),
                down = down_after.as_millis(),
            );
            let config_path = dir.path().join("sentinel.conf");
            fs::write(&config_path, config).expect("cannot write sentinel.conf");
            let output = File::create(dir.path().join("sentinel.out"))
                .expect("cannot create the sentinel output file");
            let mut cmd = Command::new(redis_server_bin());
            cmd.arg(&config_path)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(output.try_clone().expect("cannot clone output file"))
                .stderr(output);
            let child = spawn(cmd).unwrap_or_else(|e| panic!("cannot start a sentinel: {e}"));
            let mut sentinel = RedisSentinel {
                child: Some(child),
                port,
                dir,
            };
            let deadline = Instant::now() + STARTUP_TIMEOUT;
            loop {
                let exited = sentinel
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten());
                if let Some(status) = exited {
                    let log = sentinel.log();
                    if !log.contains("Address already in use") {
                        panic!("sentinel exited with {status}\n{log}");
                    }
                    failures.push(log);
                    break;
                }
                let pong = redis::Client::open(sentinel.url())
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
                if pong.is_ok() {
                    return sentinel;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel on port {port} did not answer PING within {STARTUP_TIMEOUT:?}\n{}",
                    sentinel.log()
                );
                thread::sleep(Duration::from_millis(10));
            }
            dir = std::mem::replace(
                &mut sentinel.dir,
                tempfile::tempdir().expect("cannot create a temporary directory"),
            );
        }
        panic!(
            "no free port for a sentinel in {PORT_ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        );
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The sentinel's log.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }

    /// Runs one command, e.g. `&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"]`.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let client = redis::Client::open(self.url())?;
        let mut con = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
        con.set_read_timeout(Some(IO_TIMEOUT))?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command.query(&mut con)
    }

    /// Waits until this sentinel knows `sentinels` other sentinels and
    /// `replicas` replicas of `name` (they are discovered through hello
    /// messages, every 2 s), so that a failover can be agreed on.
    pub fn wait_until_aware(&self, name: &str, sentinels: usize, replicas: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let known = |what: &str| {
                self.cmd::<Vec<redis::Value>>(&["SENTINEL", what, name])
                    .map_or(0, |v| v.len())
            };
            let (s, r) = (known("SENTINELS"), known("REPLICAS"));
            if s >= sentinels && r >= replicas {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sentinel {} knows {s} sentinels and {r} replicas of {name} after 20 s\n{}",
                self.url(),
                self.log()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What anyhow's `{:#}` and eyre's reports print: the error, then each source, joined by ": ".
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.join(": ")
}

/// Our sockets connected to `port` (Linux: the process's descriptors, `/proc/self/fd`): each
/// one's keepalive idle time (`None` if keepalive is off) and `TCP_USER_TIMEOUT`.
#[cfg(target_os = "linux")]
pub fn sockets_to(port: u16) -> Vec<(Option<Duration>, Option<Duration>)> {
    use std::os::fd::{BorrowedFd, RawFd};

    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // SAFETY: the descriptor is one of this process's open sockets, held by a store that
        // outlives this call (nothing here closes it or keeps the borrow).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let socket = socket2::SockRef::from(&fd);
        let peer = socket.peer_addr().ok().and_then(|a| a.as_socket());
        if peer.is_some_and(|p| p.port() == port) {
            // Read as one: another test of this process may close the descriptor (and reuse
            // its number) meanwhile; such a socket is skipped, not a failure of this test.
            let options = (|| {
                let keepalive = match socket.keepalive()? {
                    true => Some(socket.tcp_keepalive_time()?),
                    false => None,
                };
                Ok::<_, std::io::Error>((keepalive, socket.tcp_user_timeout()?))
            })();
            if let Ok(options) = options {
                found.push(options);
            }
        }
    }
    found
}
