"""Child-process helpers for the tests under tests/ (run as a script, never imported for side effects).

    python3 tests/trust_helpers.py runs ROOT KEYS AGENT COUNT GO_FILE
        import factory, print "ready", wait until GO_FILE exists, then call factory.main(["run", AGENT,
        TEXT]) COUNT times in-process with FACTORY_ROOT=ROOT; print one JSON line {"codes": {...},
        "errors": [...]}.

    python3 tests/trust_helpers.py write-loop PATH MEGABYTES
        write object A, print "ready", then loop the Store's write_json(PATH, B), (PATH, A), ...
        forever, until the parent kills it. A and B come from big_object(0|1, MEGABYTES).

    python3 tests/trust_helpers.py write-killed-at CALL PATH MEGABYTES
        write object A with the Store's write_json, then object B, and SIGKILL itself as B's write
        calls os.CALL (fchmod, fsync, replace or unlink): one exact step of an atomic write.

    python3 tests/trust_helpers.py killed-at N STATION ARGS...
        run factory.main([STATION, ARGS...]) in-process and SIGKILL itself as it makes its Nth lasting
        change to a file (a write to a regular file, a rename, a link), before the change is made: a
        kill at every point a station's writes can be stopped, one N at a time. When it makes fewer
        than N changes (N 0: never killed), its last stderr line is `changes: COUNT` and it exits with
        the station's own status.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def big_object(which: int, megabytes: float) -> dict:
    """A JSON object of about `megabytes` MB; which=0 and which=1 differ everywhere."""
    filler = ("ab" if which else "yz") * 500
    return {"which": which, "rows": [{"n": i, "v": f"{which}-{i:08d}-{filler}"}
                                     for i in range(int(megabytes * 1024))]}


def runs(root: str, keys: str, agent: str, count: int, go: str) -> int:
    """COUNT in-process runs of AGENT once GO_FILE appears; prints a JSON summary."""
    import factory
    os.environ["FACTORY_ROOT"] = root
    env = {"FACTORY_ROOT": root, "FACTORY_KEYS_DIR": keys, "USER": "tester"}   # no model or Sage keys
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.002)
    codes, errors = Counter(), []
    for i in range(count):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = factory.main(["run", agent, f"ticket {os.getpid()}-{i}: my card payment was declined twice"],
                                    env=env)
            except BaseException as error:  # noqa: BLE001 - report it; the parent asserts
                code = "exception"
                err.write(f"{type(error).__name__}: {error}")
        codes[str(code)] += 1
        if code != 0 and len(errors) < 3:
            errors.append(err.getvalue())
    print(json.dumps({"codes": codes, "errors": errors}), flush=True)
    return 0


def write_loop(path: str, megabytes: float) -> int:
    """Alternate two big objects into one path with the Store's write_json until killed."""
    import factory
    objects = [big_object(0, megabytes), big_object(1, megabytes)]
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    store = factory.Factory.at(str(target.parent), None, {}).store
    store.write_json(target, objects[0])
    print("ready", flush=True)
    which = 1
    while True:
        store.write_json(target, objects[which])
        which ^= 1


def write_killed_at(call: str, path: str, megabytes: float) -> int:
    """write_json(PATH, A), then write_json(PATH, B) killed (SIGKILL, no cleanup) as it calls os.CALL."""
    import signal
    import factory
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    store = factory.Factory.at(str(target.parent), None, {}).store
    store.write_json(target, big_object(0, megabytes))
    new = big_object(1, megabytes)
    setattr(os, call, lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL))
    store.write_json(target, new)
    return 3   # the write never called os.CALL


def killed_at(n: int, argv: list[str]) -> int:
    """factory.main(argv), killed (SIGKILL, no cleanup) just before its Nth lasting change to a file."""
    import signal
    import stat
    import factory
    made = [0]
    def change(real):
        def counted(*args, **kwargs):
            if real is not os.write or stat.S_ISREG(os.fstat(args[0]).st_mode):
                made[0] += 1
                if made[0] == n:
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return counted
    os.write, os.replace, os.link = change(os.write), change(os.replace), change(os.link)
    status = factory.main(argv)
    print(f"changes: {made[0]}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "runs":
        sys.exit(runs(rest[0], rest[1], rest[2], int(rest[3]), rest[4]))
    if command == "write-loop":
        sys.exit(write_loop(rest[0], float(rest[1])))
    if command == "write-killed-at":
        sys.exit(write_killed_at(rest[0], rest[1], float(rest[2])))
    if command == "killed-at":
        sys.exit(killed_at(int(rest[0]), rest[1:]))
    sys.exit(f"unknown command {command}")
