"""The suite in parallel: `python3 -m tests` runs every test class that
`python3 -m unittest discover -s tests -t .` finds, in N worker processes at once (-j N, default 2),
and prints one unittest-style result: a character per test, each failure and error with its traceback,
`Ran N tests in T s`, then OK, FAILED (...) or NO TESTS RAN. Exit status 0 when every test passed,
1 otherwise, 5 when no tests ran.

A test class is the unit of work: its setUpClass (the factory it prepares once) and its tests run in
one worker, as they would in one process; the workers take the next class as they finish one, the
biggest test modules first so that short classes fill the end. A worker that dies (os._exit, a signal)
or runs one class past --timeout seconds is one error naming that class and the test it was in; the
classes after it run in a fresh worker. `discover` runs the same tests in one
process, and runs one file on its own (`-p test_store.py`).

Every temporary folder of the run (the tests' and their child processes') is made inside one folder of
its own, removed at the end: under TMPDIR when it is set, else under /dev/shm when that RAM disk exists
and has 1 GiB free (the tests make and remove thousands of small folders: on a disk each costs a journal
write), else under the system's temporary folder.
"""

from __future__ import annotations

import argparse
import functools
import io
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import unittest
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEPARATOR1, SEPARATOR2 = "=" * 70, "-" * 70
RAM_DISK, ROOM = Path("/dev/shm"), 1 << 30


@functools.lru_cache(maxsize=None)
def units(start: str, top: str, pattern: str) -> tuple[unittest.TestSuite, ...]:
    """Every test class discover finds under start, as one suite each (a module that fails to import is
    one unit of its own), biggest module file first, then in discover's order. The same in every process."""
    found: dict[tuple[str, str], unittest.TestSuite] = {}
    for test in flatten(unittest.defaultTestLoader.discover(start, pattern=pattern, top_level_dir=top)):
        key = (type(test).__module__, type(test).__qualname__)
        found.setdefault(key, unittest.TestSuite()).addTest(test)
    return tuple(found[key] for key in sorted(found, key=lambda key: -module_size(key[0])))


def flatten(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    """The test cases of a nested suite, in order."""
    return [case for item in suite for case in (flatten(item) if isinstance(item, unittest.TestSuite) else [item])]


def module_size(name: str) -> int:
    """Bytes of a test module's source (0 when it has no file: a module that failed to import)."""
    path = getattr(sys.modules.get(name), "__file__", None)
    return os.path.getsize(path) if path else 0


def summary(totals: dict, took: float) -> tuple[str, int]:
    """unittest's closing lines for the combined totals, and the exit status: 0 passed, 1 failed,
    5 no tests ran (as Python 3.12's unittest)."""
    ok = not (totals["failures"] or totals["errors"] or totals["unexpected"])
    notes = [f"{label}={totals[key]}" for key, label in (("failures", "failures"), ("errors", "errors"),
             ("skipped", "skipped"), ("expected", "expected failures"), ("unexpected", "unexpected successes"))
             if totals[key]]
    none = ok and not totals["run"]
    verdict = "NO TESTS RAN" if none else ("OK" if ok else "FAILED") + (f" ({', '.join(notes)})" if notes else "")
    text = f"{SEPARATOR2}\nRan {totals['run']} test{'s' * (totals['run'] != 1)} in {took:.3f}s\n\n{verdict}"
    return text, 5 if none else 0 if ok else 1


class Announcing(unittest.TextTestResult):
    """unittest's text result (a mark per test on stream) that also sends ("start", test id) on a
    multiprocessing connection as each test starts, so that the parent knows which test a worker was in
    if the worker dies or hangs."""

    def __init__(self, stream: io.StringIO, connection: Connection):
        super().__init__(stream, descriptions=True, verbosity=1)
        self.connection = connection

    def startTest(self, test: unittest.TestCase) -> None:
        self.connection.send(("start", test.id()))
        super().startTest(test)


def run_unit(start: str, top: str, pattern: str, index: int, connection: Connection) -> dict:
    """Run one unit in this process: its marks (a character per test, as unittest prints them), counts,
    and each failure and error as unittest prints it."""
    marks = io.StringIO()
    result = Announcing(marks, connection)
    units(start, top, pattern)[index].run(result)
    report = lambda flavour, test, text: f"{SEPARATOR1}\n{flavour}: {result.getDescription(test)}\n{SEPARATOR2}\n{text}"  # noqa: E731
    return {"marks": marks.getvalue(), "run": result.testsRun, "skipped": len(result.skipped),
            "expected": len(result.expectedFailures), "unexpected": len(result.unexpectedSuccesses),
            "failures": [report("FAIL", test, text) for test, text in result.failures],
            "errors": [report("ERROR", test, text) for test, text in result.errors]}


def work(connection: Connection, start: str, top: str, pattern: str) -> None:
    """A worker process: run each unit index received on connection, sending ("done", its report) after
    the announcements of its tests; stop at None."""
    while (index := connection.recv()) is not None:
        connection.send(("done", run_unit(start, top, pattern, index, connection)))


@dataclass
class Worker:
    """One worker process, the parent's end of its pipe, and the unit it runs: index (None when idle),
    since (time.monotonic() seconds when the unit was handed over) and test (the id of the last test
    it announced, None before the first)."""
    process: multiprocessing.process.BaseProcess
    connection: Connection
    index: int | None = None
    since: float = 0.0
    test: str | None = None


def hire(start: str, top: str, pattern: str) -> Worker:
    """Start a fresh worker process."""
    mine, theirs = multiprocessing.Pipe()
    process = multiprocessing.Process(target=work, args=(theirs, start, top, pattern), daemon=True)
    process.start()
    theirs.close()   # so that the parent's end reads EOF when the worker dies
    return Worker(process, mine)


def heard(worker: Worker) -> dict | None:
    """Read what a worker has sent so far: its unit's report once the unit is done, else None.
    Raises EOFError or OSError when the worker has died."""
    while worker.connection.poll():
        kind, value = worker.connection.recv()
        if kind == "done":
            return value
        worker.test = value
    if not worker.process.is_alive():
        raise EOFError("the worker ended")
    return None


def lost(name: str, worker: Worker, why: str) -> dict:
    """The report of a unit whose worker died or was killed: one error naming the class, and the test
    it was in."""
    where = f"during {worker.test}" if worker.test else "before its first test started"
    text = f"{SEPARATOR1}\nERROR: {name}\n{SEPARATOR2}\n{why} {where}; the class's remaining tests did not run\n"
    return {"marks": "E", "run": 0, "skipped": 0, "expected": 0, "unexpected": 0, "failures": [], "errors": [text]}


def fire(worker: Worker) -> int | None:
    """Kill a worker and wait for it; its exit code (negative: the signal that ended it)."""
    worker.process.kill()
    worker.process.join()
    worker.connection.close()
    return worker.process.exitcode


def unit_name(suite: unittest.TestSuite) -> str:
    """module.Class of a unit's tests."""
    test = flatten(suite)[0]
    return f"{type(test).__module__}.{type(test).__qualname__}"


def outcome(worker: Worker, name: str, limit: float) -> dict | None:
    """A busy worker's report for its unit when it has one: what it sent, or the error of a worker that
    died or ran past limit seconds (the worker is then ended); None while it is still within time."""
    try:
        done = heard(worker)
    except (EOFError, OSError):
        code = fire(worker)
        return lost(name, worker, f"its worker process died ({f'signal {-code}' if code < 0 else f'exit status {code}'})")
    if done is None and time.monotonic() - worker.since > limit:
        fire(worker)
        return lost(name, worker, f"no result within {limit:g} s: its worker process was killed")
    return done


def run(start: str, top: str, pattern: str, jobs: int, limit: float) -> int:
    """Run every unit in `jobs` worker processes, each class in turn handed to an idle worker, printing
    marks as units finish and the result at the end. A class whose worker dies or runs past limit seconds
    is one error naming it; the classes not yet run go on in a fresh worker. Returns the exit status:
    0 passed, 1 failed, 5 no tests ran."""
    began, found = time.perf_counter(), units(start, top, pattern)
    todo = list(range(len(found)))
    totals = {"run": 0, "skipped": 0, "expected": 0, "unexpected": 0, "failures": 0, "errors": 0}
    reports: list[str] = []
    crew = [hire(start, top, pattern) for _ in range(min(jobs, len(found)))]
    try:
        while todo or any(worker.index is not None for worker in crew):
            for worker in crew:
                if worker.index is None and todo:
                    worker.index, worker.since, worker.test = todo.pop(0), time.monotonic(), None
                    worker.connection.send(worker.index)
            busy = [worker for worker in crew if worker.index is not None]
            wait([handle for worker in busy for handle in (worker.connection, worker.process.sentinel)], timeout=1.0)
            for slot, worker in enumerate(crew):
                done = worker.index is not None and outcome(worker, unit_name(found[worker.index]), limit)
                if not done:
                    continue
                worker.index = None
                if worker.connection.closed:
                    crew[slot] = hire(start, top, pattern)
                sys.stderr.write(done["marks"])
                sys.stderr.flush()
                reports += done["failures"] + done["errors"]
                for key in totals:
                    totals[key] += len(done[key]) if isinstance(done[key], list) else done[key]
    finally:
        for worker in crew:
            fire(worker)
    text, status = summary(totals, time.perf_counter() - began)
    sys.stderr.write("\n" + "".join(f"\n{block}" for block in reports) + ("\n" if reports else "") + text + "\n")
    return status


def scratch_parent() -> str | None:
    """Where the run's own temporary folder goes: TMPDIR when set, else the RAM disk when it has ROOM free,
    else None (the system's temporary folder)."""
    if os.environ.get("TMPDIR"):
        return os.environ["TMPDIR"]
    try:
        roomy = RAM_DISK.is_dir() and os.access(RAM_DISK, os.W_OK) and shutil.disk_usage(RAM_DISK).free >= ROOM
    except OSError:
        return None
    return str(RAM_DISK) if roomy else None


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the suite; 0 when it passed, 1 when not, 5 when no tests ran,
    130 when interrupted."""
    parser = argparse.ArgumentParser(prog="python3 -m tests", description=__doc__.split("\n\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("-s", "--start-directory", default=str(HERE), help="where discovery starts (default tests/)")
    parser.add_argument("-t", "--top-level-directory", default=str(HERE.parent),
                        help="the import root (default the repo)")
    parser.add_argument("-p", "--pattern", default="test*.py", help="test files to run (default test*.py)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds one test class may take before its worker is killed (default 300)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if not args.timeout > 0:
        parser.error("--timeout must be more than 0 seconds")
    top = str(Path(args.top_level_directory).resolve())
    if top not in sys.path:
        sys.path.insert(0, top)
    parent = scratch_parent()
    with tempfile.TemporaryDirectory(prefix="factory-tests-", dir=parent, ignore_cleanup_errors=True) as scratch:
        os.environ["TMPDIR"] = tempfile.tempdir = scratch   # the workers, forked or spawned, and their children
        try:
            return run(str(Path(args.start_directory).resolve()), top, args.pattern, args.jobs, args.timeout)
        except KeyboardInterrupt:
            sys.stderr.write("\ninterrupted\n")
            return 130


if __name__ == "__main__":
    sys.exit(main())
