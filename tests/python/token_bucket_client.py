"""Pure-mode client of lua/token_bucket.lua in Python, for tests/cross_language.rs.

Takes one token at a time from the bucket at KEY (anonymous calls: no node record) through the
same script the Rust crate ships, for DURATION seconds, and prints one JSON line:
{"admitted": n, "calls": m, "sha": the script's SHA1}.

It builds the script from the files, as any other client would: lua/helpers.lua followed by
lua/token_bucket.lua (the helpers' header says so), read from LUA_DIR. The Rust test checks
that the SHA1 is that of the crate's TOKEN_BUCKET_LUA.

    python token_bucket_client.py URL LUA_DIR KEY RATE PERIOD_US BURST DURATION_S
"""

import json
import os
import sys
import time

import redis


def main() -> None:
    url, lua_dir, key, rate, period_us, burst, duration = sys.argv[1:8]
    client = redis.Redis.from_url(url, socket_timeout=5)
    source = ""
    for name in ("helpers.lua", "token_bucket.lua"):
        with open(os.path.join(lua_dir, name), encoding="utf-8") as f:
            source += f.read()
    # EVALSHA, loading the script on NOSCRIPT: what the Rust store does.
    script = client.register_script(source)
    keys = [key, key + ":leasers", key + ":expiry"]
    admitted = calls = 0
    deadline = time.monotonic() + float(duration)
    while time.monotonic() < deadline:
        # op, rate, period_us, burst, want, min, now ("" = server clock), node ("" = anonymous)
        granted, _remaining, _retry_us, _reset_us, _share = script(
            keys=keys, args=["lease", rate, period_us, burst, 1, 1, "", ""]
        )
        calls += 1
        admitted += granted
        time.sleep(0.0005)
    print(json.dumps({"admitted": admitted, "calls": calls, "sha": script.sha}))


if __name__ == "__main__":
    main()
