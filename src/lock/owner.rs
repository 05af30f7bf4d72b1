//! [`LockOwner`]: who holds a lock.
//!
//! Redisson names the owner `<client uuid>:<thread id>`. Tokio tasks move between threads, so a
//! thread id says nothing here: the owner is explicit. Its process part is a random 64-bit id
//! drawn once per [`RedisLock`](super::RedisLock) handle (clones and [`named`] locks share it);
//! its task part is chosen by the caller ([`RedisLock::owner`]) or drawn from a per-handle counter
//! ([`RedisLock::new_owner`]). Two owners are the same owner exactly when both parts are equal,
//! and only the same owner re-enters or releases a lock.
//!
//! [`named`]: super::RedisLock::named
//! [`RedisLock::owner`]: super::RedisLock::owner
//! [`RedisLock::new_owner`]: super::RedisLock::new_owner

use std::fmt;

/// The holder of a lock: a process id and a task id. See the [module docs](crate::lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockOwner {
    process: u64,
    task: u64,
}

impl LockOwner {
    pub(crate) fn new(process: u64, task: u64) -> Self {
        LockOwner { process, task }
    }

    /// The random id of the [`RedisLock`](super::RedisLock) handle that made this owner.
    pub fn process_id(&self) -> u64 {
        self.process
    }

    /// The task part.
    pub fn task_id(&self) -> u64 {
        self.task
    }

    /// The hash field the owner is stored under: `<process as 16 hex digits>:<task>`.
    pub(crate) fn field(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for LockOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}:{}", self.process, self.task)
    }
}
