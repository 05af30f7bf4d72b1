//! The simulated Redis: a network, a single-threaded server, and the library's `MemoryStore`.
//!
//! # Model
//!
//! All nodes share one [`StoreModel`]; each node talks to it through its own [`SimStore`]
//! handle (a [`LeaseStore`]), which carries the node id and the node's network RNG. A call
//! goes through these steps, each a callback on the [`Scheduler`]:
//!
//! 1. **Send.** The client samples a round trip: `rtt_min` plus an exponential tail (mean
//!    `rtt_us − rtt_min_us`), plus `extra_ms` while a `latency_spike` is on. Half of it is the
//!    request's way out, half the reply's way back.
//! 2. **Arrive and queue.** Redis runs scripts one at a time: the call starts at
//!    `max(arrival, busy_until)` and occupies the server for the service time of its kind (a
//!    node's lease on terms, an anonymous lease, a release, a plain command; measured on a
//!    real redis-server, see `simulate calibrate`). This is where pure-Redis mode saturates
//!    when the fleet asks more than `1 / service_pure_us` calls a second. The server's busy
//!    time, summed, is the Redis CPU the fleet costs.
//!    During a `store_outage` arriving calls are dropped unanswered.
//! 3. **Execute.** At the end of its service time the call runs on the shared `MemoryStore`,
//!    whose clock ([`TokioClock`]) reads the virtual time exactly: the same bucket arithmetic as
//!    the Lua script, at the instant Redis would run it.
//! 4. **Reply.** After the way back, the reply completes the client's future, unless the client
//!    already gave up: every call also arms a timeout (`timeout_ms`; `lease_timeout_ms` for a
//!    node's lease or release) that fails it with [`StoreError::Timeout`]. Tokens granted to a
//!    call whose reply is never consumed (timed out, or its caller crashed meanwhile) are
//!    counted as stranded: the bucket gave them away and no request used them. Tokens of a
//!    release whose caller gave up on it are counted as returned late: the limiter counts them
//!    as lost (expired), but the store got them back.
//!
//! Calls are counted when the client sends them, per node, including failed ones.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ratelease::{
    LeaseReply, LeaseRequest, LeaseStore, MemoryStore, Quota, ReleaseRequest, StoreError,
    TokioClock,
};

use crate::exec::{ready, REQUEST};
use crate::record::{CallKind, CallRecord};
use crate::rng::{exponential, rng_for, SimRng};
use crate::scenario::{s_to_ns, EventKind, Scenario};
use crate::scheduler::Scheduler;

/// Network and server parameters, with fault windows in ns.
#[derive(Debug, Clone)]
pub struct NetModel {
    rtt_min_ns: f64,
    rtt_tail_ns: f64,
    service_ns: ServiceNs,
    timeout: Duration,
    lease_timeout: Duration,
    outages: Vec<(u64, u64)>,
    spikes: Vec<(u64, u64, u64)>,
}

impl NetModel {
    /// The model a scenario describes.
    pub fn from_scenario(sc: &Scenario) -> Self {
        let mut outages = Vec::new();
        let mut spikes = Vec::new();
        for e in &sc.events {
            let start = s_to_ns(e.at_s);
            let end = start + s_to_ns(e.duration_s.unwrap_or(0.0));
            match e.kind {
                EventKind::StoreOutage => outages.push((start, end)),
                EventKind::LatencySpike => {
                    spikes.push((start, end, (e.extra_ms.unwrap_or(0.0) * 1e6).round() as u64))
                }
                EventKind::NodeCrash
                | EventKind::NodeJoin
                | EventKind::FleetStart
                | EventKind::RollingRestart
                | EventKind::ScaleOut
                | EventKind::ScaleIn => {}
            }
        }
        let rtt_min_ns = sc.rtt_min_us() * 1e3;
        NetModel {
            rtt_min_ns,
            rtt_tail_ns: sc.rtt_us * 1e3 - rtt_min_ns,
            service_ns: ServiceNs {
                lease: (sc.service_us * 1e3).round() as u64,
                pure: (sc.service_pure_us * 1e3).round() as u64,
                release: (sc.service_release_us * 1e3).round() as u64,
                command: (sc.service_command_us * 1e3).round() as u64,
            },
            timeout: Duration::from_secs_f64(sc.timeout_ms / 1e3),
            lease_timeout: Duration::from_secs_f64(sc.lease_timeout_ms() / 1e3),
            outages,
            spikes,
        }
    }

    /// Whether the store is down at `t_ns`.
    pub fn in_outage(&self, t_ns: u64) -> bool {
        self.outages.iter().any(|&(s, e)| (s..e).contains(&t_ns))
    }

    /// Extra round-trip time at `t_ns`.
    pub fn extra_ns(&self, t_ns: u64) -> u64 {
        self.spikes
            .iter()
            .filter(|&&(s, e, _)| (s..e).contains(&t_ns))
            .map(|&(_, _, x)| x)
            .sum()
    }

    /// The client response timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The client timeout of a node's lease or release call.
    pub fn lease_timeout(&self) -> Duration {
        self.lease_timeout
    }

    /// The client timeout of a lease (`node`: a node's, on terms) or release call.
    pub fn timeout_of(&self, node: bool) -> Duration {
        if node {
            self.lease_timeout
        } else {
            self.timeout
        }
    }

    fn sample_rtt_ns(&self, rng: &mut SimRng) -> u64 {
        let tail = if self.rtt_tail_ns > 0.0 {
            exponential(rng, self.rtt_tail_ns)
        } else {
            0.0
        };
        (self.rtt_min_ns + tail).round() as u64
    }
}

/// Server time of each kind of call, ns.
#[derive(Debug, Clone, Copy)]
struct ServiceNs {
    lease: u64,
    pure: u64,
    release: u64,
    command: u64,
}

/// A plain Redis command of the lock-based mode: runs on the server at its execution instant
/// (virtual ns) and answers two integers.
pub type Command = Box<dyn FnOnce(u64) -> [u64; 2] + Send>;

/// What a call asks the store to do (the library's request, passed through unchanged).
enum Op {
    Lease(LeaseRequest),
    Release(ReleaseRequest),
    Command(Command),
}

#[derive(Debug, Default)]
struct ModelState {
    busy_until_ns: u64,
    /// Server time spent on calls, ns.
    busy_ns: u64,
    calls: Vec<CallRecord>,
    stranded: u64,
    returned_late: u64,
    timeouts: u64,
    /// Per request index: when the script ran for it (`u64::MAX`: never).
    executed_at: Vec<u64>,
}

/// The shared store of a simulated fleet.
pub struct StoreModel {
    sched: Arc<Scheduler>,
    memory: MemoryStore,
    net: NetModel,
    state: Mutex<ModelState>,
}

impl std::fmt::Debug for StoreModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreModel")
            .field("net", &self.net)
            .field("memory", &self.memory)
            .finish_non_exhaustive()
    }
}

impl StoreModel {
    /// A store on `sched`'s virtual time. Call inside the simulation's runtime.
    pub fn new(sched: Arc<Scheduler>, net: NetModel) -> Arc<Self> {
        Arc::new(StoreModel {
            sched,
            memory: MemoryStore::with_clock(TokioClock::new()),
            net,
            state: Mutex::new(ModelState::default()),
        })
    }

    /// The handle node `node` uses, with its own network RNG `("net", node)` under `seed`.
    pub fn handle(self: &Arc<Self>, node: u32, seed: u64) -> SimStore {
        SimStore {
            model: self.clone(),
            node,
            rng: Arc::new(Mutex::new(rng_for(seed, "net", u64::from(node)))),
        }
    }

    fn state(&self) -> MutexGuard<'_, ModelState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Store calls so far, in issue order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.state().calls.clone()
    }

    /// Server time spent on calls so far, ns: the Redis CPU the run cost.
    pub fn busy_ns(&self) -> u64 {
        self.state().busy_ns
    }

    /// Tokens granted to calls whose reply was never consumed.
    pub fn stranded(&self) -> u64 {
        self.state().stranded
    }

    /// Tokens given back by releases that ran after their caller gave up on them (the
    /// limiter counts them as expired; the bucket has them back). The tokens the release
    /// carried: the store gives back fewer if it counts fewer for the node.
    pub fn returned_late(&self) -> u64 {
        self.state().returned_late
    }

    /// Calls that timed out.
    pub fn timeouts(&self) -> u64 {
        self.state().timeouts
    }

    /// When the script ran for request `index` (pure-Redis mode), if it did.
    pub fn executed_at(&self, index: usize) -> Option<u64> {
        self.state()
            .executed_at
            .get(index)
            .copied()
            .filter(|&t| t != u64::MAX)
    }

    /// Step 2: the call reaches the server.
    fn arrive(self: Arc<Self>, call: Call) {
        let now = self.sched.now_ns();
        if self.net.in_outage(now) {
            return; // unanswered; the client's timeout fires
        }
        let s = &self.net.service_ns;
        let service = match &call.op {
            Op::Lease(req) if req.node.is_some() => s.lease,
            Op::Lease(_) => s.pure,
            Op::Release(_) => s.release,
            Op::Command(_) => s.command,
        };
        let done = {
            let mut st = self.state();
            let start = now.max(st.busy_until_ns);
            st.busy_until_ns = start + service;
            st.busy_ns += service;
            st.busy_until_ns
        };
        let sched = self.sched.clone();
        sched.at(done, move || self.execute(call));
    }

    /// Step 3: the script runs.
    fn execute(self: Arc<Self>, call: Call) {
        let now = self.sched.now_ns();
        let Call {
            name,
            quota,
            op,
            back_ns,
            slot,
            request,
        } = call;
        let mut returned = 0;
        let (reply, is_lease) = match op {
            Op::Lease(req) => (ready(self.memory.lease(&name, &quota, &req)), true),
            Op::Release(req) => {
                returned = req.tokens;
                (ready(self.memory.release(&name, &quota, &req)), false)
            }
            Op::Command(f) => {
                let [a, b] = f(now);
                let reply = LeaseReply {
                    granted: a,
                    remaining: b,
                    ..LeaseReply::empty(quota, ratelease::QuotaSource::Caller)
                };
                (Ok(reply), false)
            }
        };
        let granted = match &reply {
            Ok(r) if is_lease => r.granted,
            _ => 0,
        };
        if let Some(tag) = request {
            let mut st = self.state();
            if st.executed_at.len() <= tag {
                st.executed_at.resize(tag + 1, u64::MAX);
            }
            st.executed_at[tag] = now;
        }
        let sched = self.sched.clone();
        sched.at(now + back_ns, move || {
            // Step 4: the reply arrives, or finds nobody waiting.
            let ran = reply.is_ok();
            if !slot.complete(reply) {
                let mut st = self.state();
                st.stranded += granted;
                // A release given up on: the limiter counted its tokens as expired. (One
                // whose client was dropped, in a crash, was counted nowhere.)
                if ran && slot.timed_out.load(Ordering::Relaxed) {
                    st.returned_late += returned;
                }
            }
        });
    }
}

/// A call in flight.
struct Call {
    name: String,
    quota: Quota,
    op: Op,
    back_ns: u64,
    slot: Arc<Slot>,
    request: Option<usize>,
}

/// One node's connection to the [`StoreModel`]. Clones share the node's RNG.
#[derive(Clone)]
pub struct SimStore {
    model: Arc<StoreModel>,
    node: u32,
    rng: Arc<Mutex<SimRng>>,
}

impl std::fmt::Debug for SimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStore")
            .field("node", &self.node)
            .finish()
    }
}

impl SimStore {
    /// The node this handle belongs to.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Step 1: send the call, then wait for the reply or the timeout.
    async fn call(&self, name: &str, quota: &Quota, op: Op) -> Result<LeaseReply, StoreError> {
        let m = &self.model;
        let t0 = m.sched.now_ns();
        let rtt = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            m.net.sample_rtt_ns(&mut rng)
        } + m.net.extra_ns(t0);
        let out = rtt / 2;
        m.state().calls.push(CallRecord {
            t_ns: t0,
            node: self.node,
            kind: match op {
                Op::Lease(_) => CallKind::Lease,
                Op::Release(_) => CallKind::Release,
                Op::Command(_) => CallKind::Command,
            },
        });
        let slot = Arc::new(Slot::default());
        let timeout = m.net.timeout_of(match &op {
            Op::Lease(r) => r.node.is_some(),
            Op::Release(r) => r.node.is_some(),
            Op::Command(_) => false,
        });
        let deadline = t0 + u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let timed_out = slot.clone();
        let model = m.clone();
        m.sched.at_unless(deadline, slot.done.clone(), move || {
            if timed_out.complete(Err(StoreError::Timeout(timeout))) {
                timed_out.timed_out.store(true, Ordering::Relaxed);
                model.state().timeouts += 1;
            }
        });
        let call = Call {
            name: name.to_owned(),
            quota: *quota,
            op,
            back_ns: rtt - out,
            slot: slot.clone(),
            request: REQUEST.try_with(|r| *r).ok(),
        };
        let model = m.clone();
        m.sched.at(t0 + out, move || model.arrive(call));
        Wait(slot).await
    }
}

impl SimStore {
    /// Sends one plain command (lock-based mode): `f` runs on the simulated server when the
    /// call is served, and its two integers come back as `granted` and `remaining`. It costs a
    /// round trip and a service time like any call, and is counted as one.
    ///
    /// # Errors
    /// [`StoreError::Timeout`] if no reply comes within the timeout.
    pub async fn command(&self, f: Command) -> Result<[u64; 2], StoreError> {
        // The quota is not used by commands; any valid one will do.
        let quota = Quota::per_second(1).expect("valid quota");
        let r = self.call("", &quota, Op::Command(f)).await?;
        Ok([r.granted, r.remaining])
    }
}

impl SimStore {
    /// Waits `ns` of virtual time on the scheduler (sub-millisecond, unlike tokio's timer).
    pub async fn sleep_ns(&self, ns: u64) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sched = &self.model.sched;
        sched.at(sched.now_ns() + ns, move || {
            let _ = tx.send(());
        });
        let _ = rx.await;
    }
}

impl LeaseStore for SimStore {
    async fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        self.call(name, quota, Op::Lease(*req)).await
    }

    async fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ReleaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        self.call(name, quota, Op::Release(*req)).await
    }
}

/// Where a reply (or the timeout) meets the waiting client.
#[derive(Default)]
struct Slot {
    /// Set once: completed, or abandoned by a dropped client. Also cancels the timeout.
    done: Arc<AtomicBool>,
    /// Completed by its timeout (the client gave up), not by the reply or a dropped client.
    timed_out: AtomicBool,
    inner: Mutex<SlotInner>,
}

#[derive(Default)]
struct SlotInner {
    result: Option<Result<LeaseReply, StoreError>>,
    waker: Option<Waker>,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Delivers `result` unless the slot is already done; returns whether it was delivered.
    fn complete(&self, result: Result<LeaseReply, StoreError>) -> bool {
        if self.done.swap(true, Ordering::Relaxed) {
            return false;
        }
        let waker = {
            let mut inner = self.lock();
            inner.result = Some(result);
            inner.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        true
    }
}

/// The client's side of a [`Slot`].
struct Wait(Arc<Slot>);

impl Future for Wait {
    type Output = Result<LeaseReply, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = self.0.lock();
        match inner.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                inner.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Wait {
    /// A client that stops waiting (its task was aborted) abandons the slot: a reply that
    /// arrives later is stranded.
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelease::{NodeLease, NodeRelease};

    /// Runs the scheduler's next callbacks, moving tokio's paused clock to them; false if
    /// none is left.
    async fn step(sched: &Scheduler) -> bool {
        let Some(t) = sched.next_at() else {
            return false;
        };
        tokio::time::advance(Duration::from_nanos(t.saturating_sub(sched.now_ns()))).await;
        while let Some(callback) = sched.pop_due(t) {
            callback();
        }
        true
    }

    /// Runs `call` (spawned) and the scheduler until it has its answer, and returns it.
    async fn drive<T: Send + 'static>(
        sched: &Scheduler,
        call: impl Future<Output = T> + Send + 'static,
    ) -> T {
        let task = tokio::spawn(call);
        loop {
            tokio::task::yield_now().await;
            if task.is_finished() {
                return task.await.unwrap();
            }
            assert!(step(sched).await, "nothing left to run, and no answer");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_given_up_on_is_returned_late_and_a_lease_given_up_on_strands_its_grant() {
        // Round trips gain 400 ms from 1 s on: past the 150 ms lease timeout.
        let sc = Scenario::parse(
            r#"
            name = "late"
            duration_s = 3
            rate = 100
            burst = 100
            nodes = 1
            [demand]
            pattern = "uniform"
            total_rps = 10
            [[events]]
            at_s = 1
            kind = "latency_spike"
            duration_s = 1
            extra_ms = 400
            "#,
        )
        .unwrap();
        let sched = Scheduler::new();
        let model = StoreModel::new(sched.clone(), NetModel::from_scenario(&sc));
        let store = model.handle(0, 1);
        let quota = Quota::per_second(100).unwrap();
        let node = NodeLease {
            id: 7,
            held: 0,
            demand_mtps: 10_000,
            horizon: Duration::from_millis(250),
            ttl: Duration::from_secs(10),
            rate_mtps: 0,
            release_seq: 0,
        };
        let (s, q) = (store.clone(), quota);
        let first = drive(&sched, async move {
            s.lease("n", &q, &LeaseRequest::new(20, 1).by(node)).await
        });
        // Before the spike: answered.
        assert_eq!(first.await.unwrap().granted, 20);
        // In the spike: the node gives up on a release of 20 and on a lease of 30; the store
        // runs both after that.
        tokio::time::advance(Duration::from_secs(1)).await;
        let back = ReleaseRequest::new(20).by(NodeRelease {
            id: 7,
            seq: 1,
            leaving: false,
        });
        let s = store.clone();
        let released = drive(&sched, async move { s.release("n", &q, &back).await }).await;
        assert!(matches!(released, Err(StoreError::Timeout(_))));
        let s = store.clone();
        let more = LeaseRequest::new(30, 1).by(node);
        let leased = drive(&sched, async move { s.lease("n", &q, &more).await }).await;
        assert!(matches!(leased, Err(StoreError::Timeout(_))));
        // Let both replies come back to nobody.
        while step(&sched).await {}
        assert_eq!(
            model.returned_late(),
            20,
            "the release ran: its tokens are back"
        );
        assert_eq!(
            model.stranded(),
            30,
            "the lease ran: its grant reached nobody"
        );
        assert_eq!(model.timeouts(), 2);
    }
}
