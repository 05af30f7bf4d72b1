//! One fuzz driver for every Lua script this crate ships (`mod fuzz;` from a test).
//!
//! A script is described by a [`Script`]: its source, the keys one instance of it owns, a
//! proptest strategy of plausible argument vectors, and two checks — is a successful reply well
//! formed, and is the state left under the instance's keys valid. [`run`] then throws at least
//! as many cases as asked at a real redis-server:
//!
//! - arguments from the script's strategy (which mixes plausible values with [`junk`]: zero,
//!   negative, huge, fractional, NaN/inf spellings, empty, non-numeric), sometimes cut short or
//!   given an extra one;
//! - usually the instance's keys (with or without its optional trailing keys), sometimes too
//!   few or too many;
//! - four instances, so consecutive calls build up and act on real state.
//!
//! Every reply must be a well-formed value or a clean `RATELEASE …` error reply — never a Lua
//! runtime error, never another Redis error — and after every call the instance's state must
//! pass the script's validator. A case costs two round trips: the EVALSHA, and one pipeline of
//! reads for the validator.
//!
//! To add a script: write its `Script` (keys, argument strategy, reply check, state check) and
//! call [`run`] with it from a test.
// Each test binary that includes this driver uses part of it.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};

use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;
use proptest::test_runner::{Config, TestRunner};

/// A script under fuzz.
pub struct Script {
    /// Name, for messages.
    pub name: &'static str,
    /// Lua source.
    pub source: &'static str,
    /// The keys instance `i` (0..4) owns, in the order the script expects them.
    pub keys: fn(u8) -> Vec<String>,
    /// How many of those keys, counted from the end, a call may leave out (a script with an
    /// optional key runs both protocols).
    pub optional_keys: usize,
    /// Full argument vectors; the driver cuts them short or extends them now and then.
    pub args: BoxedStrategy<Vec<String>>,
    /// Turns an argument vector into the call's arguments, for a script that takes binary
    /// ones (a packed call); `None`: sent as they are.
    pub encode: Option<Encode>,
    /// Checks a successful reply to a call with `keys` and `args`.
    pub reply: ReplyCheck,
    /// Checks the state under `keys` (one instance's keys) after a call: first the commands
    /// that read it (sent as one MULTI/EXEC pipeline), then the check of their replies.
    pub state: StateCheck,
}

/// Makes a call's (binary) arguments of an argument vector.
pub type Encode = fn(&[String]) -> Vec<Vec<u8>>;

/// Checks a successful reply to a call with `keys` and `args`.
pub type ReplyCheck =
    fn(keys: &[String], args: &[String], reply: &redis::Value) -> Result<(), String>;

/// Reads an instance's state in one pipeline and judges the replies.
pub struct StateCheck {
    /// Adds the reads of the state under `keys` to a pipeline.
    pub read: fn(keys: &[String], pipe: &mut redis::Pipeline),
    /// Judges their replies, in order.
    pub check: fn(keys: &[String], replies: &[redis::Value]) -> Result<(), String>,
}

/// How many calls were served and rejected.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Calls that returned a value.
    pub served: u32,
    /// Calls that returned a `RATELEASE …` error.
    pub rejected: u32,
}

/// Arguments a script must refuse or survive: zero, negative, huge, fractional, NaN and
/// infinity spellings, empty, hex, padded, and words.
pub fn junk() -> BoxedStrategy<String> {
    prop_oneof![
        (0u64..50).prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        Just("nan".to_string()),
        Just("-nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("1e308".to_string()),
        Just("4503599627370497".to_string()),
        Just("9007199254740993".to_string()),
        Just(String::new()),
        Just("0x10".to_string()),
        Just("-0".to_string()),
        Just("-0.0".to_string()),
        Just("0.5".to_string()),
        Just(" 7 ".to_string()),
        "[a-z#]{1,6}",
    ]
    .boxed()
}

/// Runs `cases` calls of `script` against the server behind `con`.
pub fn run(script: &Script, con: &mut redis::Connection, cases: u32) -> Outcome {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script.source)
        .query(con)
        .unwrap();
    let con = RefCell::new(con);
    let (served, rejected) = (Cell::new(0u32), Cell::new(0u32));
    let keys = script.keys;
    let strategy = (
        0u8..4,
        script.args.clone(),
        // How many keys: mostly the right number, with or without the optional ones.
        prop_oneof![12 => Just(None), 1 => (0usize..6).prop_map(Some)],
        0..=script.optional_keys,
        // Arguments cut short at, or extended by one junk value.
        prop_oneof![12 => Just(None), 2 => (0usize..16).prop_map(Some)],
        junk(),
    );
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &strategy,
            |(instance, mut args, key_count, left_out, cut, extra)| {
                let owned = keys(instance);
                let mut call_keys = owned.clone();
                call_keys.truncate(owned.len() - left_out);
                if let Some(n) = key_count {
                    call_keys.resize_with(n, || format!("{}:extra", owned[0]));
                }
                match cut {
                    Some(n) if n < args.len() => args.truncate(n),
                    Some(_) => args.push(extra),
                    None => {}
                }
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&sha).arg(call_keys.len()).arg(&call_keys);
                match script.encode {
                    Some(encode) => cmd.arg(encode(&args)),
                    None => cmd.arg(&args),
                };
                // MULTI/EXEC, so a key cannot expire between two of the reads.
                let mut pipe = redis::pipe();
                pipe.atomic();
                (script.state.read)(&owned, &mut pipe);
                let con = &mut **con.borrow_mut();
                match cmd.query::<redis::Value>(con) {
                    Ok(reply) => {
                        if let Err(why) = (script.reply)(&call_keys, &args, &reply) {
                            return Err(TestCaseError::fail(format!(
                                "{}: bad reply {reply:?} to {call_keys:?} {args:?}: {why}",
                                script.name
                            )));
                        }
                        served.set(served.get() + 1);
                    }
                    Err(e) => {
                        prop_assert_eq!(
                            e.code(),
                            Some("RATELEASE"),
                            "{}: {:?} for {:?} {:?}",
                            script.name,
                            e,
                            call_keys,
                            args
                        );
                        rejected.set(rejected.get() + 1);
                    }
                }
                let replies: Vec<redis::Value> = pipe.query(con).unwrap();
                if let Err(why) = (script.state.check)(&owned, &replies) {
                    return Err(TestCaseError::fail(format!(
                        "{}: invalid state after {call_keys:?} {args:?}: {why}; read {replies:?}",
                        script.name
                    )));
                }
                Ok(())
            },
        )
        .unwrap();
    Outcome {
        served: served.get(),
        rejected: rejected.get(),
    }
}

/// `x` as an integer in `lo..=hi` (the strict form other clients parse).
pub fn int_in(x: &str, lo: i64, hi: i64) -> bool {
    x.parse::<i64>().is_ok_and(|x| (lo..=hi).contains(&x))
}

/// A reply value as a string, if it is one (bulk or simple).
pub fn string(v: &redis::Value) -> Option<String> {
    redis::from_redis_value::<Option<String>>(v.clone())
        .ok()
        .flatten()
}
