"""The suite in parallel: `python3 -m tests` runs every test class that
`python3 -m unittest discover -s tests -t .` finds, in N worker processes at once (-j N, default 2),
and prints one unittest-style result: a character per test, each failure and error with its traceback,
`Ran N tests in T s`, then OK, FAILED (...) or NO TESTS RAN. Exit status 0 when every test passed,
1 otherwise, 5 when no tests ran, 130 when interrupted (Ctrl-C, SIGTERM).

The runner finds the test modules by their file names and imports none itself: a worker imports each
module and names its classes, so --timeout covers a module that hangs as it is imported, and one that
ends its process ends only that worker. A test class is the unit of work: its setUpClass (the factory it
prepares once) and its tests run in one worker, as they would in one process; the workers take the next
unit as they finish one. Every module is imported first (the biggest file first); then the classes go out
heaviest first, so that short classes fill the end and no long one starts last. A class's weight is a
guess made from its code, not a measured time: the characters of source of the class and of each of its
bases defined in the suite's own package (its mixins, the fixtures it prepares with), that is, how much
test code one unit runs; equal weights keep discover's order. A worker
that dies (os._exit, a signal) or runs past --timeout seconds while importing a module or running a
class is one error naming that module or class, and the test it was in; what is left goes on in a fresh
worker. The run ends when every module and every class it named has its result, and never before.
`discover` runs the same tests in one process, and runs one file on its own (`-p test_store.py`).

The workers are not daemons, so a test may start processes of its own (multiprocessing), and each
leads a process group of its own: a worker is killed together with every process its tests started
that is still in its group, when it runs past --timeout, when it dies, at the end of the run, and when
the run is interrupted or fails itself. A package's load_tests is called, as discover calls it, but does
not stop the runner from also walking the package's folder.

factory.py's bytecode is written to its __pycache__ first (see cache_bytecode), and the code the product
compiles of broker.py, llm.py and sage.py is kept in the run's own folder (XDG_CACHE_HOME), not in yours.

Every temporary folder of the run (the tests' and their child processes') is made inside one folder of
its own, removed at the end: under TMPDIR when it is set, else under /dev/shm when that RAM disk exists
and has 1 GiB free (the tests make and remove thousands of small folders: on a disk each costs a journal
write), else under the system's temporary folder.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib
import inspect
import io
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
SEPARATOR1, SEPARATOR2 = "=" * 70, "-" * 70
RAM_DISK, ROOM = Path("/dev/shm"), 1 << 30
COUNTS = ("run", "skipped", "expected", "unexpected", "failures", "errors")
# A unit of work: (module, None) imports the module and names its classes; (module, "module.Class") runs one.
Unit = tuple[str, str | None]


def test_modules(start: Path, top: Path, pattern: str) -> list[str]:
    """The dotted names of the modules discover imports under start (importing none of them): each file
    matching pattern whose name is a module's, each package (a folder with __init__.py, start itself
    included unless it is top) and what is inside it; the biggest file first, else in discover's order."""
    found = ([start] if start != top and (start / "__init__.py").is_file() else []) + walk(start, pattern)
    found.sort(key=lambda path: -(path / "__init__.py" if path.is_dir() else path).stat().st_size)
    return [os.path.relpath(path, top).removesuffix(".py").replace(os.sep, ".") for path in found]


def walk(folder: Path, pattern: str) -> list[Path]:
    """The test files and packages in folder and, depth first, in its packages, in discover's order."""
    found: list[Path] = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and unittest.loader.VALID_MODULE_NAME.match(path.name) and fnmatch.fnmatch(path.name, pattern):
            found.append(path)
        elif path.is_dir() and (path / "__init__.py").is_file():
            found += [path, *walk(path, pattern)]
    return found


def weight(suite: unittest.TestSuite) -> int:
    """The scheduling weight of one class's suite (see the module's docstring): the characters of source of its
    class and of the classes it inherits from that are defined in the test module's own top-level package;
    0 for unittest's stand-in tests and classes whose source cannot be read."""
    cases = flatten(suite)
    if not cases:
        return 0
    package = type(cases[0]).__module__.split(".")[0]
    total = 0
    for klass in type(cases[0]).__mro__:
        if klass.__module__.split(".")[0] == package and not klass.__module__.startswith("unittest"):
            with contextlib.suppress(OSError, TypeError):   # defined in no file we can read (exec'd, a C type)
                total += len(inspect.getsource(klass))
    return total


def tests_of(name: str, pattern: str) -> dict[str, unittest.TestSuite]:
    """Import one module and load its tests as discover does: one suite per class, keyed module.Class, in
    discover's order. A module that cannot be imported (or raises SkipTest) gives unittest's own stand-in
    test, the one discover reports, so that the report reads as discover's."""
    try:
        module = importlib.import_module(name)
    except unittest.SkipTest as skip:
        suite = unittest.loader._make_skipped_test(name, skip, unittest.TestSuite)
    except BaseException:   # discover's bare except: a module that calls sys.exit as it is imported failed too
        suite = unittest.loader._make_failed_import_test(name, unittest.TestSuite)[0]
    else:
        suite = unittest.defaultTestLoader.loadTestsFromModule(module, pattern=pattern)
    classes: dict[str, unittest.TestSuite] = {}
    for test in flatten(suite):
        classes.setdefault(f"{type(test).__module__}.{type(test).__qualname__}", unittest.TestSuite()).addTest(test)
    return classes


def flatten(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    """The test cases of a nested suite, in order."""
    return [case for item in suite for case in (flatten(item) if isinstance(item, unittest.TestSuite) else [item])]


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


def run_class(suite: unittest.TestSuite, connection: Connection) -> dict:
    """Run one class's suite in this process: its marks (a character per test, as unittest prints them),
    counts, and each failure and error as unittest prints it."""
    marks = io.StringIO()
    result = Announcing(marks, connection)
    suite.run(result)
    report = lambda flavour, test, text: f"{SEPARATOR1}\n{flavour}: {result.getDescription(test)}\n{SEPARATOR2}\n{text}"  # noqa: E731
    return {"marks": marks.getvalue(), "run": result.testsRun, "skipped": len(result.skipped),
            "expected": len(result.expectedFailures), "unexpected": len(result.unexpectedSuccesses),
            "failures": [report("FAIL", test, text) for test, text in result.failures],
            "errors": [report("ERROR", test, text) for test, text in result.errors]}


def work(connection: Connection, top: str, pattern: str) -> None:
    """A worker process, leader of a process group of its own: for each unit received on connection, send
    ("classes", [(class name, weight), ...]) for (module, None), having imported the module, and for (module, class)
    ("done", its report) after the announcements of its tests; stop at None, or when the parent is gone
    (its end of the pipe closed: end-of-file, or a broken pipe at the next send)."""
    with contextlib.suppress(OSError):   # the parent does it too; whichever comes first
        os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the parent's own handler is not the tests'
    if top not in sys.path:
        sys.path.insert(0, top)
    loaded: dict[str, dict[str, unittest.TestSuite]] = {}
    with contextlib.suppress(EOFError, OSError):   # the parent is gone: stop once the test in hand has ended
        while (unit := connection.recv()) is not None:
            module, name = unit
            if module not in loaded:
                loaded[module] = tests_of(module, pattern)
            connection.send(("classes", [(key, weight(suite)) for key, suite in loaded[module].items()]) if name is None
                            else ("done", run_class(loaded[module][name], connection)))


@dataclass
class Worker:
    """One worker process, the parent's end of its pipe, and the unit it runs: unit (None when idle),
    since (time.monotonic() seconds when the unit was handed over) and test (the id of the last test
    it announced, None before the first)."""
    process: multiprocessing.process.BaseProcess
    connection: Connection
    unit: Unit | None = None
    since: float = 0.0
    test: str | None = None


def hire(top: str, pattern: str) -> Worker:
    """Start a fresh worker process: not a daemon (a daemon may not start processes, and a test may), so
    the caller must fire it; the leader of a process group of its own, which fire kills. A forked worker
    would inherit the parent's end of its own pipe and of every earlier worker's: each is closed in every
    process forked after it, so that the parent's end is held by the parent alone and a worker reads
    end-of-file once the parent is gone (killed: nothing fires the workers)."""
    mine, theirs = multiprocessing.Pipe()
    held = weakref.ref(mine)   # not closed in the parent by this: each process forked from it closes its copy
    os.register_at_fork(after_in_child=lambda: held() and held().close())
    process = multiprocessing.Process(target=work, args=(theirs, top, pattern), daemon=False)
    process.start()
    theirs.close()   # so that the parent's end reads EOF when the worker dies
    with contextlib.suppress(OSError):   # the worker does it too; whichever comes first
        os.setpgid(process.pid, process.pid)
    return Worker(process, mine)


def fire(crew: list[Worker]) -> None:
    """Kill workers, each with every process still in its process group (what its tests started), then
    wait for them; a worker already fired is left as it is."""
    crew = [worker for worker in crew if not worker.connection.closed]
    for worker in crew:
        with contextlib.suppress(ProcessLookupError):   # a group with no process left in it
            os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.kill()   # should it not have made its group yet
    for worker in crew:
        worker.process.join()
        worker.connection.close()


def heard(worker: Worker) -> tuple[str, object] | None:
    """What a busy worker has sent so far: ("classes", [(name, weight), ...]) or ("done", report) once its unit is done,
    else None. Raises EOFError or OSError when the worker has died."""
    while worker.connection.poll():
        kind, value = worker.connection.recv()
        if kind != "start":
            return kind, value
        worker.test = value
    if not worker.process.is_alive():
        raise EOFError("the worker ended")
    return None


def lost(worker: Worker, why: str) -> dict:
    """The report of a unit whose worker died or was killed: one error naming the module it was importing,
    or the class and the test it was in."""
    module, name = worker.unit
    if name is None:
        where = "while importing the module; its tests did not run"
    else:
        where = f"{f'during {worker.test}' if worker.test else 'before its first test started'}; " \
                "the class's remaining tests did not run"
    text = f"{SEPARATOR1}\nERROR: {name or module}\n{SEPARATOR2}\n{why} {where}\n"
    return {"marks": "E", "run": 0, "skipped": 0, "expected": 0, "unexpected": 0, "failures": [], "errors": [text]}


def outcome(worker: Worker, limit: float) -> tuple[str, object] | None:
    """A busy worker's answer for its unit when it has one: what it sent, or ("done", the error) of a worker
    that died or ran past limit seconds (the worker is then fired); None while it is still within time."""
    try:
        answer = heard(worker)
    except (EOFError, OSError):
        fire([worker])
        code = worker.process.exitcode
        return "done", lost(worker, f"its worker process died ({f'signal {-code}' if code < 0 else f'exit status {code}'})")
    if answer is None and time.monotonic() - worker.since > limit:
        fire([worker])
        return "done", lost(worker, f"no result within {limit:g} s: its worker process was killed")
    return answer


def hand_out(todo: list[Unit], crew: list[Worker], jobs: int, hired: Callable[[], Worker]) -> None:
    """Hand the next units of todo to the idle workers of crew, hiring workers up to `jobs` for the rest
    (a worker joins crew as it starts, so that it is fired whatever happens next)."""
    idle = [worker for worker in crew if worker.unit is None]
    while todo and (idle or len(crew) < jobs):
        if not idle:
            crew.append(hired())
            idle.append(crew[-1])
        worker = idle.pop(0)
        worker.unit, worker.since, worker.test = todo.pop(0), time.monotonic(), None
        worker.connection.send(worker.unit)


@dataclass
class Tally:
    """The run's combined result so far: the counts (COUNTS) and each failure's and error's report."""
    counts: dict = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    reports: list = field(default_factory=list)

    def add(self, done: dict) -> None:
        """Count one class's report, writing its marks at once."""
        sys.stderr.write(done["marks"])
        sys.stderr.flush()
        self.reports += done["failures"] + done["errors"]
        for key in self.counts:
            self.counts[key] += len(done[key]) if isinstance(done[key], list) else done[key]

    def close(self, took: float) -> int:
        """Write the reports and unittest's closing lines; the exit status (see summary)."""
        text, status = summary(self.counts, took)
        reports = "".join(f"\n{block}" for block in self.reports)
        sys.stderr.write("\n" + reports + ("\n" if reports else "") + text + "\n")
        return status


def run(start: str, top: str, pattern: str, jobs: int, limit: float) -> int:
    """Run every test module's classes in `jobs` worker processes, each unit in turn handed to an idle
    worker (the modules' imports first, then the classes heaviest first: `weight`), printing marks as classes
    finish and the result at the end. A unit whose worker dies or runs
    past limit seconds is one error naming it; the units not yet run go on in fresh workers. Every
    worker is fired before this returns or raises. Returns the exit status: 0 passed, 1 failed, 5 no tests ran."""
    began, modules = time.perf_counter(), test_modules(Path(start), Path(top), pattern)
    todo, tally, weights = [(name, None) for name in modules], Tally(), {}
    crew: list[Worker] = []
    try:
        while todo or any(worker.unit for worker in crew):
            hand_out(todo, crew, jobs, lambda: hire(top, pattern))
            busy = [worker for worker in crew if worker.unit]
            wait([handle for worker in busy for handle in (worker.connection, worker.process.sentinel)], timeout=1.0)
            for worker in crew:
                answer = worker.unit and outcome(worker, limit)
                if not answer:
                    continue
                kind, value = answer
                if kind == "classes":   # imports first, then the heaviest class; a stable sort keeps discover's order
                    weights.update(value)
                    todo = sorted(todo + [(worker.unit[0], name) for name, _ in value],
                                  key=lambda unit: (unit[1] is not None, -weights.get(unit[1], 0)))
                else:
                    tally.add(value)
                worker.unit = None
            crew[:] = [worker for worker in crew if not worker.connection.closed]   # hand_out hires in their place
    finally:
        fire(crew)
    return tally.close(time.perf_counter() - began)


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


def cache_bytecode(top: Path) -> None:
    """Write factory.py's bytecode to its __pycache__ (git ignores it), as Python does at a first import unless
    PYTHONDONTWRITEBYTECODE is set: the tests' child processes import factory (support.CLI, the helpers) and
    each would compile its ~430 KB again. A start as a script, `python3 factory.py`, never reads it."""
    import py_compile
    if (top / "factory.py").is_file():
        with contextlib.suppress(OSError, py_compile.PyCompileError):   # a folder we may not write: children compile
            py_compile.compile(str(top / "factory.py"), doraise=True)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the suite; 0 when it passed, 1 when not, 5 when no tests ran,
    130 when interrupted (Ctrl-C or SIGTERM)."""
    parser = argparse.ArgumentParser(prog="python3 -m tests", description=__doc__.split("\n\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("-s", "--start-directory", default=str(HERE), help="where discovery starts (default tests/)")
    parser.add_argument("-t", "--top-level-directory", default=str(HERE.parent),
                        help="the import root (default the repo)")
    parser.add_argument("-p", "--pattern", default="test*.py", help="test files to run (default test*.py)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds one test class, or the import of one test module, may take before its worker "
                             "is killed (default 300)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if not args.timeout > 0:
        parser.error("--timeout must be more than 0 seconds")
    top = str(Path(args.top_level_directory).resolve())
    cache_bytecode(Path(top))
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # stopped as by Ctrl-C: the workers are fired
    parent = scratch_parent()
    with tempfile.TemporaryDirectory(prefix="factory-tests-", dir=parent, ignore_cleanup_errors=True) as scratch:
        os.environ["TMPDIR"] = tempfile.tempdir = scratch   # the workers, forked or spawned, and their children
        os.environ["XDG_CACHE_HOME"] = os.path.join(scratch, "cache")   # factory.code_cache's
        try:
            return run(str(Path(args.start_directory).resolve()), top, args.pattern, args.jobs, args.timeout)
        except KeyboardInterrupt:
            sys.stderr.write("\ninterrupted\n")
            return 130


if __name__ == "__main__":
    sys.exit(main())
