"""The suite in parallel: `python3 -m tests` runs every test class that
`python3 -m unittest discover -s tests -t .` finds, in N worker processes at once (-j N, default 2),
and prints one unittest-style result: a character per test, each failure and error with its traceback,
`Ran N tests in T s`, then OK or FAILED (...). Exit status 0 when every test passed, 1 otherwise.

A test class is the unit of work: its setUpClass (the factory it prepares once) and its tests run in
one worker, as they would in one process; the workers take the next class as they finish one, the
biggest test modules first so that short classes fill the end. `discover` runs the same tests in one
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
import os
import shutil
import sys
import tempfile
import time
import unittest
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
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


def run_unit(start: str, top: str, pattern: str, index: int) -> dict:
    """Run one unit in this process: its marks (a character per test, as unittest prints them), counts,
    and each failure and error as unittest prints it."""
    marks = io.StringIO()
    result = unittest.TextTestResult(marks, descriptions=True, verbosity=1)
    units(start, top, pattern)[index].run(result)
    report = lambda flavour, test, text: f"{SEPARATOR1}\n{flavour}: {result.getDescription(test)}\n{SEPARATOR2}\n{text}"  # noqa: E731
    return {"marks": marks.getvalue(), "run": result.testsRun, "skipped": len(result.skipped),
            "expected": len(result.expectedFailures), "unexpected": len(result.unexpectedSuccesses),
            "failures": [report("FAIL", test, text) for test, text in result.failures],
            "errors": [report("ERROR", test, text) for test, text in result.errors]}


def summary(totals: dict, took: float) -> tuple[str, bool]:
    """unittest's closing lines for the combined totals, and whether the run was successful."""
    ok = not (totals["failures"] or totals["errors"] or totals["unexpected"])
    notes = [f"{label}={totals[key]}" for key, label in (("failures", "failures"), ("errors", "errors"),
             ("skipped", "skipped"), ("expected", "expected failures"), ("unexpected", "unexpected successes"))
             if totals[key]]
    verdict = ("OK" if ok else "FAILED") + (f" ({', '.join(notes)})" if notes else "")
    return f"{SEPARATOR2}\nRan {totals['run']} test{'s' * (totals['run'] != 1)} in {took:.3f}s\n\n{verdict}", ok


def run(start: str, top: str, pattern: str, jobs: int) -> bool:
    """Run every unit in `jobs` worker processes, printing marks as units finish and the result at the end."""
    began = time.perf_counter()
    count = len(units(start, top, pattern))
    totals = {"run": 0, "skipped": 0, "expected": 0, "unexpected": 0, "failures": 0, "errors": 0}
    reports: list[str] = []
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, count))) as pool:
        futures = [pool.submit(run_unit, start, top, pattern, index) for index in range(count)]
        for future in as_completed(futures):
            try:
                done = future.result()
            except BrokenProcessPool as error:   # a worker died (killed, or a test ended the process)
                done = {"marks": "E", "run": 0, "failures": [], "errors": [f"{SEPARATOR1}\nERROR: a worker process "
                        f"died: {error}\n{SEPARATOR2}\n"], "skipped": 0, "expected": 0, "unexpected": 0}
            sys.stderr.write(done["marks"])
            sys.stderr.flush()
            reports += done["failures"] + done["errors"]
            for key in totals:
                totals[key] += len(done[key]) if isinstance(done[key], list) else done[key]
    text, ok = summary(totals, time.perf_counter() - began)
    sys.stderr.write("\n" + "".join(f"\n{block}" for block in reports) + ("\n" if reports else "") + text + "\n")
    return ok


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
    """Parse the command line and run the suite; 0 when it passed, 1 when not."""
    parser = argparse.ArgumentParser(prog="python3 -m tests", description=__doc__.split("\n\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("-s", "--start-directory", default=str(HERE), help="where discovery starts (default tests/)")
    parser.add_argument("-t", "--top-level-directory", default=str(HERE.parent),
                        help="the import root (default the repo)")
    parser.add_argument("-p", "--pattern", default="test*.py", help="test files to run (default test*.py)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    top = str(Path(args.top_level_directory).resolve())
    if top not in sys.path:
        sys.path.insert(0, top)
    parent = scratch_parent()
    with tempfile.TemporaryDirectory(prefix="factory-tests-", dir=parent, ignore_cleanup_errors=True) as scratch:
        os.environ["TMPDIR"] = tempfile.tempdir = scratch   # the workers, forked or spawned, and their children
        return 0 if run(str(Path(args.start_directory).resolve()), top, args.pattern, args.jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
