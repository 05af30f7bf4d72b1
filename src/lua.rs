//! The text of the Lua scripts in `lua/`, put together once.
//!
//! Every script but `lua/lock.lua` starts with `lua/helpers.lua` (the constants and integer
//! helpers they share); every one of those but the token bucket (which reads its arguments its
//! own way) then takes `lua/arguments.lua` (readers of text arguments), and the fixed window,
//! sliding window and leaky bucket then `lua/prelude.lua` (the arguments they share) before
//! their own file. [`lua_script!`] writes that concatenation for every public `*_LUA`
//! constant, so each constant is the complete text, ready for `EVAL` or `SCRIPT LOAD`.

/// The complete text of a script: `lua/helpers.lua`, then each named file of `lua/`, in order,
/// with nothing in between (what a client in another language concatenates too).
macro_rules! lua_script {
    ($($file:literal),+ $(,)?) => {
        concat!(
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/helpers.lua")),
            $(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))),+
        )
    };
}

#[cfg(test)]
mod tests {
    use crate::{
        CONCURRENCY_LUA, FIXED_WINDOW_LUA, LEAKY_BUCKET_LUA, SLIDING_WINDOW_LUA, TOKEN_BUCKET_LUA,
    };

    const HELPERS: &str = include_str!("../lua/helpers.lua");
    const ARGUMENTS: &str = include_str!("../lua/arguments.lua");
    const PRELUDE: &str = include_str!("../lua/prelude.lua");

    /// Each helper is defined once in a complete script: in `lua/helpers.lua`, at its head (a
    /// second `local` of the same name would shadow it silently); the argument readers of
    /// `lua/arguments.lua` likewise, next, in every script that takes them, and in no other.
    #[test]
    fn every_script_starts_with_the_helpers_and_defines_them_once() {
        // Each script, whether it takes the argument readers, and whether the prelude.
        let scripts = [
            ("token_bucket", TOKEN_BUCKET_LUA, false, false),
            ("concurrency", CONCURRENCY_LUA, true, false),
            ("fixed_window", FIXED_WINDOW_LUA, true, true),
            ("sliding_window", SLIDING_WINDOW_LUA, true, true),
            ("leaky_bucket", LEAKY_BUCKET_LUA, true, true),
        ];
        // `local MAX = …`, `local mfloor, mceil = …` and `local function bad(name)` define
        // `MAX`, `mfloor` and `mceil`, and `bad`.
        let defines = |line: &str| -> Vec<String> {
            let Some(rest) = line.strip_prefix("local ") else {
                return Vec::new();
            };
            if let Some(f) = rest.strip_prefix("function ") {
                return f
                    .split('(')
                    .next()
                    .into_iter()
                    .map(str::to_string)
                    .collect();
            }
            let names = rest.split('=').next().unwrap_or_default();
            names.split(',').map(|n| n.trim().to_string()).collect()
        };
        let helpers: Vec<String> = HELPERS.lines().flat_map(defines).collect();
        assert_eq!(helpers.len(), 15, "{helpers:?}");
        let readers: Vec<String> = ARGUMENTS.lines().flat_map(defines).collect();
        assert_eq!(readers, ["int_arg", "now_arg"]);
        for (name, script, arguments, prelude) in scripts {
            assert!(script.starts_with(HELPERS), "{name}");
            let rest = &script[HELPERS.len()..];
            assert_eq!(rest.starts_with(ARGUMENTS), arguments, "{name}");
            let rest = if arguments {
                &rest[ARGUMENTS.len()..]
            } else {
                rest
            };
            assert_eq!(rest.starts_with(PRELUDE), prelude, "{name}");
            let count = |def: &String| script.lines().filter(|l| defines(l).contains(def)).count();
            for def in &helpers {
                assert_eq!(count(def), 1, "{name}: {def}");
            }
            for def in &readers {
                assert_eq!(count(def), usize::from(arguments), "{name}: {def}");
            }
        }
    }
}
