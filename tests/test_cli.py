"""The command line: the README's test command is what CI runs, every station is in the parser and
the module docstring with its docstring as its --help, usage errors exit 2, progress appears only on
a terminal, and doctor answers why every run is routed to a human."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pty
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

import factory
from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.fake_sage import FakeSage
from tests.support import INJECTION, REPO, CertifiedTest, LineTest, typed_at_a_terminal, write_jsonl
from tests.support import wait_until

KEY = "sk-ant-test-router"


class Parser(unittest.TestCase):
    """The stations as the user meets them."""

    def test_readme_test_command_is_what_ci_runs(self):
        readme = (REPO / "README.md").read_text()
        command = "python3 -m tests"
        self.assertIn(f"```sh\n{command}\n```", readme)
        self.assertIn(f"\n{command}\n", (REPO / ".ci" / "run").read_text())
        self.assertIn("`python3 -m unittest discover -s tests -t .`", readme, "the one-process command is named too")

    def test_every_station_is_in_the_parser_with_its_docstring_as_help(self):
        names = [func.__name__.removeprefix("cmd_") for func in factory.stations()]
        self.assertEqual(names, ["new", "stamp", "restamp", "prove", "certify", "run", "tower", "harvest", "recall", "doctor",
                                 "pending", "approve", "reject", "review", "replay", "export", "digest", "schema"])
        self.assertEqual(sorted(names), sorted(n.removeprefix("cmd_") for n in dir(factory) if n.startswith("cmd_")))
        parser = factory.build_parser()
        choices = next(a for a in parser._actions if a.dest == "command").choices
        self.assertEqual(list(choices), names)
        for func in factory.stations():
            with self.subTest(station=func.__name__):
                self.assertTrue(func.__doc__)
                self.assertEqual(choices[func.__name__.removeprefix("cmd_")].description.split(), func.__doc__.split())

    def test_only_the_station_named_is_built_whole(self):
        """main reads which station argv names with no station built whole, then builds that one alone: the
        top-level help reads as the whole tree's does, a --root value is never taken for a station, and
        what the partial tree parses is what the whole one does."""
        whole = factory.build_parser()
        self.assertEqual(factory.build_parser(built=()).format_help(), whole.format_help())
        self.assertEqual(factory.chosen_station(["--root", "run", "tower", "--json"]), "tower")
        self.assertEqual(factory.chosen_station(["run", "--help"]), "run")
        with self.assertRaises(factory.Usage) as typo:
            factory.chosen_station(["rnu", "triager"])
        self.assertIn("invalid choice: 'rnu' (did you mean 'run'?)", str(typo.exception))
        partial = factory.build_parser(built=("run",))
        names = [func.__name__.removeprefix("cmd_") for func in factory.stations()]
        self.assertEqual(list(next(a for a in partial._actions if a.dest == "command").choices), names)
        for argv in (["run", "triager", "--file", "t.jsonl", "--jobs", "2"], ["--root", "/r", "run", "triager", "--json", "hi"]):
            with self.subTest(argv=argv):
                self.assertEqual(vars(factory.parse(partial, argv)), vars(factory.parse(whole, argv)))

    def test_the_module_docstring_names_every_station_and_cites_nothing(self):
        doc = " ".join(factory.__doc__.split())
        for func in factory.stations():
            self.assertIn(func.__name__.removeprefix("cmd_"), doc)
        self.assertNotIn("§", doc)
        self.assertNotIn("SPEC", doc)

    def test_help_cites_no_document_outside_the_repo(self):
        for argv in (["--help"], *[[f.__name__.removeprefix("cmd_"), "--help"] for f in factory.stations()]):
            with self.subTest(argv=argv):
                out = io.StringIO()
                with contextlib.redirect_stdout(out), self.assertRaises(SystemExit) as done:
                    factory.main(argv, env={})
                self.assertEqual(done.exception.code, 0)
                self.assertIn("usage: factory.py", out.getvalue())
                for citation in ("§", "SPEC", "issue ", ".md"):
                    self.assertNotIn(citation, out.getvalue())


def help_of(*argv: str, columns: int = 80) -> str:
    """What `factory.py ARGV --help` prints on a terminal `columns` wide."""
    out, before = io.StringIO(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)   # argparse and the wrapping read the width from here first
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            factory.main([*argv, "--help"], env={})
    finally:
        os.environ.pop("COLUMNS") if before is None else os.environ.update(COLUMNS=before)
    return out.getvalue()


def example_argv(line: str) -> list[str]:
    """The arguments of an example command line `python3 factory.py ...` (a trailing # comment dropped)."""
    words = shlex.split(line, comments=True)
    assert words[:2] == ["python3", "factory.py"], line
    return words[2:]


FIXTURE_TESTS = '''
import unittest

class Passes(unittest.TestCase):
    def test_one(self):
        self.assertTrue(True)

    def test_two(self):
        """Two passes."""

    @unittest.skip("not here")
    def test_skipped(self):
        pass

class Fails(unittest.TestCase):
    def test_fails(self):
        """A failing check."""
        self.assertEqual(1, 2)

    def test_errs(self):
        raise RuntimeError("boom in a test")

    def test_a_subtest_fails(self):
        for n in range(3):
            with self.subTest(n=n):
                self.assertNotEqual(n, 1)

class SetUpFails(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise OSError("no fixture")

    def test_never_runs(self):
        pass
'''

# A test that writes its process id to $SEEN/{name}, then waits until $SEEN/go exists, at most {wait} seconds.
WAITS_FOR_GO = """import os, time, unittest
from pathlib import Path

class Waits(unittest.TestCase):
    def test_it(self):
        Path(os.environ["SEEN"], "{name}.tmp").write_text(str(os.getpid()))
        Path(os.environ["SEEN"], "{name}.tmp").rename(Path(os.environ["SEEN"], "{name}"))
        deadline = time.monotonic() + {wait}
        while not Path(os.environ["SEEN"], "go").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
"""
PASSES = "import unittest\n\nclass Passes(unittest.TestCase):\n    def test_it(self):\n        pass\n"
# A test that starts a process of its own (as multiprocessing starts one), writes "WORKER_PID CHILD_PID" to
# $SEEN/pids, and sleeps; and a test that waits for that file, then passes.
HOLDS_A_CHILD = """import multiprocessing, os, time, unittest
from pathlib import Path

class Hangs(unittest.TestCase):
    def test_sleeps(self):
        child = multiprocessing.Process(target=time.sleep, args=(3600,))
        child.start()
        Path(os.environ["SEEN"], "pids.tmp").write_text(f"{os.getpid()} {child.pid}")
        Path(os.environ["SEEN"], "pids.tmp").rename(Path(os.environ["SEEN"], "pids"))
        time.sleep(3600)

class Quick(unittest.TestCase):
    def test_after_the_child_started(self):
        while not Path(os.environ["SEEN"], "pids").exists():
            time.sleep(0.01)
"""


def kill_left(seen: Path) -> None:
    """Kill the processes whose ids a fixture test wrote in seen/pids that are still running (a test that
    failed must not leave a worker and its child sleeping for an hour)."""
    for pid in map(int, (seen / "pids").read_text().split() if (seen / "pids").exists() else ()):
        if not ended(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def ended(pid: int) -> bool:
    """Whether process pid has ended: it is gone, or a zombie that only waits to be reaped. Read from
    Linux's /proc: without it the calling test is skipped (unittest.SkipTest), never passed unchecked."""
    if not Path("/proc/self/stat").exists():
        raise unittest.SkipTest("needs Linux's /proc to see whether a process has ended")
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


class SuiteRunner(unittest.TestCase):
    """`python3 -m tests` reports what `python3 -m unittest discover` reports, and fails when it fails."""

    def folder_of(self, files: dict) -> Path:
        """A temporary folder holding files (name: text), removed after the test."""
        folder = Path(self.enterContext(tempfile.TemporaryDirectory()))
        for name, text in files.items():
            (folder / name).write_text(text)
        return folder

    def run_both(self, files: dict, env: dict | None = None) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
        """The parallel runner and discover on a folder of test files: (runner, discover)."""
        folder = self.folder_of(files)
        where = ["-s", str(folder), "-t", str(folder)]
        ran = [subprocess.run([sys.executable, *argv, *where], capture_output=True, text=True, cwd=str(REPO), timeout=120,
                              env={**os.environ, **(env or {})})
               for argv in (["-m", "tests", "-j", "2"], ["-m", "unittest", "discover"])]
        return ran[0], ran[1]

    def runner(self, folder: Path, *flags: str) -> list[str]:
        """The command line of the parallel runner on a folder of test files, with flags."""
        return [sys.executable, "-m", "tests", *flags, "-s", str(folder), "-t", str(folder)]

    def run_runner(self, files: dict, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
        """The parallel runner alone on a folder of test files, with flags."""
        return subprocess.run(self.runner(self.folder_of(files), *flags), capture_output=True, text=True,
                              cwd=str(REPO), timeout=60, env={**os.environ, **(env or {})})

    def seen(self) -> Path:
        """A temporary folder where a fixture test writes the process ids it saw ($SEEN)."""
        return Path(self.enterContext(tempfile.TemporaryDirectory()))

    def assert_ended(self, seen: Path) -> None:
        """The worker and the child its test started, whose ids are in seen/pids, have both ended."""
        for pid in map(int, (seen / "pids").read_text().split()):
            wait_until(lambda: ended(pid), 10)

    def test_a_worker_that_dies_is_one_error_naming_its_class_and_test_and_the_rest_still_run(self):
        dies = "import os, unittest\n\nclass Dies(unittest.TestCase):\n    def test_a_passes(self):\n        pass\n\n" \
               "    def test_b_ends_the_process(self):\n        os._exit(3)\n\n    def test_c_never_runs(self):\n        pass\n"
        later = "".join(f"class Later{n}(unittest.TestCase):\n    def test_it(self):\n        pass\n\n" for n in range(3))
        ran = self.run_runner({"test_dies.py": dies, "test_later.py": "import unittest\n\n" + later}, "-j", "1")
        self.assertEqual(ran.returncode, 1, ran.stderr)
        self.assertIn("ERROR: test_dies.Dies\n" + "-" * 70 + "\nits worker process died (exit status 3) during "
                      "test_dies.Dies.test_b_ends_the_process; the class's remaining tests did not run\n", ran.stderr)
        self.assertRegex(ran.stderr, r"\nRan 3 tests in [0-9.]+s\n\nFAILED \(errors=1\)\n$")   # Later0-2, in a fresh worker
        self.assertNotIn("Later", ran.stderr)

    def test_no_tests_found_exits_5_saying_no_tests_ran(self):
        ran = self.run_runner({"test_empty.py": "import unittest\n"})
        self.assertEqual(ran.returncode, 5, ran.stderr)
        self.assertRegex(ran.stderr, r"\nRan 0 tests in [0-9.]+s\n\nNO TESTS RAN\n$")

    def test_a_class_past_the_timeout_has_its_worker_and_its_children_killed_and_is_one_error_naming_it(self):
        seen = self.seen()
        ran = self.run_runner({"test_hangs.py": HOLDS_A_CHILD}, "-j", "1", "--timeout", "1", env={"SEEN": str(seen)})
        self.assertEqual(ran.returncode, 1, ran.stderr)   # waiting out the sleep would time out
        self.assertIn("ERROR: test_hangs.Hangs\n" + "-" * 70 + "\nno result within 1 s: its worker process was killed "
                      "during test_hangs.Hangs.test_sleeps", ran.stderr)
        self.assertRegex(ran.stderr, r"\nRan 1 test in [0-9.]+s\n\nFAILED \(errors=1\)\n$")
        self.assert_ended(seen)

    def test_a_module_that_ends_the_process_or_hangs_as_it_is_imported_is_one_error_naming_it(self):
        files = {"test_exits.py": "import os\nos._exit(0)\n", "test_stuck.py": "import time\ntime.sleep(3600)\n",
                 "test_passes.py": PASSES}
        ran = self.run_runner(files, "--timeout", "1")
        self.assertEqual(ran.returncode, 1, ran.stderr)
        for module, why in (("test_exits", "its worker process died (exit status 0)"),
                            ("test_stuck", "no result within 1 s: its worker process was killed")):
            self.assertIn(f"ERROR: {module}\n" + "-" * 70 + f"\n{why} while importing the module; its tests did not "
                          "run\n", ran.stderr)
        self.assertRegex(ran.stderr, r"\nRan 1 test in [0-9.]+s\n\nFAILED \(errors=2\)\n$")

    def test_a_test_may_start_a_process_of_its_own(self):
        spawns = "import multiprocessing, unittest\n\nclass Spawns(unittest.TestCase):\n    def test_it(self):\n" \
                 "        child = multiprocessing.Process(target=print)\n        child.start()\n        child.join()\n" \
                 "        self.assertEqual(child.exitcode, 0)\n"
        runner, discover = self.run_both({"test_spawns.py": spawns})
        self.assertEqual((runner.returncode, discover.returncode), (0, 0), runner.stderr)
        self.assertTrue(runner.stderr.endswith("\nOK\n"), runner.stderr)

    def test_interrupted_its_workers_and_their_children_are_killed_and_it_exits_130(self):
        seen = self.seen()
        # started as a terminal starts a foreground job, Ctrl-C not ignored: a shell's background job (a CI step
        # started with &) ignores SIGINT, and its children inherit that
        runner = subprocess.Popen(self.runner(self.folder_of({"test_hangs.py": HOLDS_A_CHILD.split("class Quick")[0]})),
                                  cwd=str(REPO), env={**os.environ, "SEEN": str(seen)}, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.addCleanup(runner.kill)
        self.addCleanup(kill_left, seen)
        wait_until((seen / "pids").exists)
        os.killpg(runner.pid, signal.SIGINT)   # as Ctrl-C at a terminal signals its foreground process group
        self.assertEqual(runner.wait(timeout=30), 130)
        self.assertTrue(runner.stderr.read().endswith("\ninterrupted\n"))
        self.assert_ended(seen)

    def test_killed_with_sigkill_its_workers_end_once_their_tests_have_ended(self):
        """Nothing fires the workers of a runner killed outright: each must see its pipe's end-of-file."""
        seen = self.seen()
        files = {"test_busy.py": WAITS_FOR_GO.format(name="busy", wait=60), "test_idle.py": WAITS_FOR_GO.format(name="idle", wait=0)}
        runner = subprocess.Popen(self.runner(self.folder_of(files), "-j", "2"), cwd=str(REPO),
                                  env={**os.environ, "SEEN": str(seen)}, stderr=subprocess.DEVNULL)
        self.addCleanup(runner.kill)
        wait_until(lambda: (seen / "busy").exists() and (seen / "idle").exists())
        workers = {name: int((seen / name).read_text()) for name in ("busy", "idle")}
        for pid in workers.values():
            self.addCleanup(lambda pid=pid: ended(pid) or os.kill(pid, signal.SIGKILL))
        runner.kill()
        runner.wait(timeout=30)
        wait_until(lambda: ended(workers["idle"]), 10)   # waiting for its next unit: end-of-file at once
        self.assertFalse(ended(workers["busy"]), "its test has not ended yet")
        (seen / "go").touch()
        wait_until(lambda: ended(workers["busy"]), 10)

    def test_when_it_fails_itself_its_workers_and_their_children_are_killed(self):
        seen = self.seen()
        runner = subprocess.Popen(self.runner(self.folder_of({"test_hangs.py": HOLDS_A_CHILD})), cwd=str(REPO),
                                  env={**os.environ, "SEEN": str(seen)}, stderr=subprocess.PIPE)
        self.addCleanup(kill_left, seen)
        self.addCleanup(runner.kill)
        runner.stderr.close()   # its first mark, once Quick passes, cannot be written: BrokenPipeError
        self.assertNotEqual(runner.wait(timeout=30), 0)
        self.assert_ended(seen)

    def test_the_run_keeps_its_temporary_folders_in_one_folder_it_removes(self):
        seen = Path(self.enterContext(tempfile.TemporaryDirectory()))
        where = "import os, tempfile, unittest\n\nclass Where(unittest.TestCase):\n    def test_it(self):\n" \
                "        open(os.path.join(os.environ['SEEN'], str(os.getpid())), 'w').write(tempfile.mkdtemp())\n"
        runner, _ = self.run_both({"test_where.py": where}, {"TMPDIR": str(seen), "SEEN": str(seen)})
        self.assertEqual(runner.returncode, 0, runner.stderr)
        made = [Path(path.read_text()) for path in seen.iterdir() if path.is_file()]
        inside = [path for path in made if path.parent.parent == seen and path.parent.name.startswith("factory-tests-")]
        self.assertEqual(len(inside), 1, made)   # discover's folder is TMPDIR's own; the runner's, one inside it
        self.assertFalse(inside[0].parent.exists(), "the run's folder is removed at its end")

    def test_failures_errors_skips_and_a_broken_module_are_reported_as_discover_reports_them(self):
        runner, discover = self.run_both({"test_fixture.py": FIXTURE_TESTS, "test_broken.py": "import no_such_module\n"})
        self.assertEqual((runner.returncode, discover.returncode), (1, 1))
        for ran in (runner, discover):
            self.assertIn("FAILED (failures=2, errors=3, skipped=1)", ran.stderr)
            self.assertRegex(ran.stderr, r"\nRan 7 tests in [0-9.]+s\n")
        for block in ("FAIL: test_fails (test_fixture.Fails.test_fails)\nA failing check.\n", "AssertionError: 1 != 2",
                      "FAIL: test_a_subtest_fails (test_fixture.Fails.test_a_subtest_fails) (n=1)",
                      "ERROR: test_errs (test_fixture.Fails.test_errs)", "RuntimeError: boom in a test",
                      "ERROR: setUpClass (test_fixture.SetUpFails)", "OSError: no fixture",
                      "ERROR: test_broken (unittest.loader._FailedTest.test_broken)", "No module named 'no_such_module'"):
            self.assertIn(block, discover.stderr)
            self.assertIn(block, runner.stderr)

    def test_a_passing_suite_exits_0(self):
        runner, discover = self.run_both({"test_fixture.py": FIXTURE_TESTS.split("class Fails")[0]})
        self.assertEqual((runner.returncode, discover.returncode), (0, 0), runner.stderr)
        for ran in (runner, discover):
            self.assertTrue(ran.stderr.endswith("\nOK (skipped=1)\n"), ran.stderr)
            self.assertRegex(ran.stderr, r"\nRan 3 tests in [0-9.]+s\n")


class Help(unittest.TestCase):
    """--help teaches: every station and every flag explained, examples that parse, exit statuses and
    the environment each station reads; the top level lists each station on one line and says where
    to start; --version."""

    def test_every_station_and_every_flag_has_help(self):
        parser = factory.build_parser()
        subparsers = next(a for a in parser._actions if a.dest == "command")
        for name, sub in subparsers.choices.items():
            for action in sub._actions:
                with self.subTest(station=name, argument=action.option_strings or action.dest):
                    self.assertTrue(action.help and action.help != argparse.SUPPRESS and len(action.help) > 10)
        for action in parser._actions:
            with self.subTest(argument=action.option_strings or action.dest):
                self.assertTrue(action.help or action is subparsers)

    def test_each_station_shows_examples_exit_statuses_and_environment(self):
        for func in factory.stations():
            name = func.__name__.removeprefix("cmd_")
            with self.subTest(station=name):
                text = help_of(name)
                examples = text.split("\nexamples:\n")[1].split("\n\n")[0].splitlines()
                self.assertTrue(examples)
                self.assertTrue(any(example_argv(line)[0] == name for line in examples), examples)
                for line in examples:
                    self.assertIsInstance(factory.parse(factory.build_parser(), example_argv(line)), argparse.Namespace)
                statuses = text.split("\nexit status:\n")[1].split("\n\n")[0]
                self.assertEqual([line.split()[0] for line in statuses.splitlines()],
                                 ["0", "1", "2", *(["3"] if name == "prove" else []), "130", *(["141"] if name == "run" else []), "143"])
                environment = text.split("\nenvironment:\n")[1].splitlines()
                self.assertEqual(environment[0].split()[0], "FACTORY_ROOT")
                for line in (line for line in environment if not line.startswith("   ")):   # not a long name's
                    self.assertIn(line.split()[0], factory.ENVIRONMENT)                       # description, below it

    def test_the_environment_documented_is_the_environment_read(self):
        """Every variable the product reads is documented (in ENVIRONMENT, shown by --help, and in the
        README's table), and every one documented is read somewhere."""
        source = "".join((REPO / name).read_text() for name in ("factory.py", "llm.py", "sage.py", "broker.py"))
        read = set(re.findall(r'\benv(?:\.get\(|\[)"([A-Z][A-Z0-9_]*)"', source))
        read |= set(re.findall(r'_need\(env, "([A-Z][A-Z0-9_]*)"\)', source))
        self.assertGreater(len(read), 15)
        self.assertLessEqual(read, set(factory.ENVIRONMENT))
        readme = (REPO / "README.md").read_text().split("## Environment")[1].split("\n## ")[0]
        for name in factory.ENVIRONMENT:
            with self.subTest(variable=name):
                self.assertTrue(f'"{name}"' in source or name.endswith("_PROXY") and '_PROXY"' in source)
                self.assertIn(f"`{name}`", readme)
                self.assertTrue(any(name in factory.station_epilog(f) for f in factory.stations()))

    def test_the_top_level_lists_each_station_on_one_line_and_says_where_to_start(self):
        text = help_of()
        for func in factory.stations():
            name, summary = func.__name__.removeprefix("cmd_"), func.__doc__.splitlines()[0]
            with self.subTest(station=name):
                self.assertRegex(text, rf"\n    {name} +{re.escape(summary)}\n")
        start = text.split("\nstart here")[1].split("\n\n")[0].splitlines()[1:]
        self.assertGreaterEqual(len(start), 4)
        for line in start:
            with self.subTest(example=line):
                argv = example_argv(re.split(r"\s{2,}", line.strip())[0])   # the command, then what it does
                if argv != ["STATION", "--help"]:
                    self.assertIsInstance(factory.parse(factory.build_parser(), argv), argparse.Namespace)
        self.assertIn("exit status: 0 done, 1 refused, 2 usage error, 3 a proof that ran and did not\npass,", text)

    def test_the_top_level_exit_statuses_are_the_readmes(self):
        """The top level said `1 refused or a failed verdict (prove under the bar)` after failed proofs exited 3,
        and named neither 141 nor 143."""
        said = " ".join(help_of().split("\nexit status: ")[1].split(". Results")[0].split())
        readme = (REPO / "README.md").read_text().split("\n## Exit statuses\n")[1].split("\n## ")[0]
        listed = re.findall(r"(?:^- |\) and )`(\d+)` ", readme, re.M)
        self.assertEqual(listed, ["0", "1", "2", "3", "130", "143", "141"])
        self.assertEqual(sorted(re.findall(r"(?:^|, )(\d+) ", said), key=int), sorted(listed, key=int), said)

    def test_help_fits_an_80_column_terminal(self):
        for argv in ([], *[[f.__name__.removeprefix("cmd_")] for f in factory.stations()]):
            with self.subTest(argv=argv):
                for line in help_of(*argv).splitlines():
                    self.assertLessEqual(len(line), 80, line)

    def test_version(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit) as done:
            factory.main(["--version"], env={})
        self.assertEqual(done.exception.code, 0)
        python = ".".join(map(str, sys.version_info[:3]))
        self.assertEqual(out.getvalue(), f"factory.py {factory.VERSION} (Python {python}; writes "
                                         f"{factory.TRACE_FORMAT}, {factory.RECORD_FORMAT}, {factory.CERT_FORMAT})\n")
        self.assertEqual((factory.TRACE_FORMAT[:14], factory.RECORD_FORMAT[:14]), ("factory-trace-", "factory-proof-"))
        import sage
        self.assertIn(f"/{factory.VERSION} ", sage.USER_AGENT, "the User-Agent names the same version")


class Usage(LineTest):
    """A command line that can never work is a usage error, whichever station it reaches: exit 2, one
    line naming the station and its --help, nothing written."""

    def test_usage_errors_exit_2_on_one_line(self):
        rows = (  # argv, what the line says
            (("nosuch",), "invalid choice: 'nosuch'"),
            (("prov", "triager"), "invalid choice: 'prov' (did you mean 'prove'?) (choose from new, stamp, "),
            (("Tower",), "invalid choice: 'Tower' (did you mean 'tower'?)"),
            (("prove",), "the following arguments are required: AGENT"),
            (("run",), "the following arguments are required: AGENT"),
            (("run", "triager"), "one input: TEXT or --file TICKETS.jsonl"),
            (("run", "triager", "hi", "--file", "t.jsonl"), "one input: TEXT or --file TICKETS.jsonl"),
            (("run", "triager", "a", "b"), "unrecognized arguments: b"),
            (("prove", "triager", "--jobs", "0"), "argument --jobs: must be at least 1, not 0"),
            (("run", "triager", "hi", "--jobs", "many"), "argument --jobs: 'many' is not a whole number"),
            (("approve", "20261130T041500123456Z-1a2b3c", "--call", "0", "--by", "bob"), "argument --call: must be at least 1"),
            (("certify", "triager", "--tier", "C9", "--by", "a"), "argument --tier: invalid choice: 'C9'"),
            (("recall", "triager"), "the following arguments are required: --reason"),
            (("recall", "triager", "--reason", " \t\n"), "argument --reason: needs a reason, not blank"),
            (("reject", "20261130T041500123456Z-1a2b3c", "--by", "bob", "--reason", ""), "argument --reason: needs a reason"),
            (("stamp", "triager", "--as", "copy", "--set", "max_steps"), "--set 'max_steps': expected PATH=JSON"),
            (("stamp", "triager", "--as", "copy", "--set", "agent=x"), "--set agent: set by stamp itself"),
            (("tower", "--nosuch"), "unrecognized arguments: --nosuch"),
        )
        for argv, expected in rows:
            with self.subTest(argv=argv):
                self.usage_error(expected, *argv)

    def test_a_malformed_name_is_a_usage_error_and_an_unknown_one_a_refusal(self):
        """Everywhere a name is given on the command line, as `new` always did: malformed, it can never
        work (exit 2); well formed but unknown to this factory, it is refused (exit 1)."""
        run_id = "20261130T041500123456Z-1a2b3c"
        rows = (  # malformed argv, what the line says, the same with a well-formed name nobody has, its refusal
            (("prove", "No Such"), "argument AGENT: 'No Such' is not a valid agent name", ("prove", "nosuch"), "no agent named"),
            (("digest", "../triager"), "argument AGENT: '../triager'", ("digest", "nosuch"), "no agent named"),
            (("recall", "X", "--reason", "r"), "argument AGENT: 'X'", ("recall", "nosuch", "--reason", "r"), "no agent named"),
            (("harvest", "a/b"), "argument AGENT: 'a/b'", ("harvest", "nosuch"), "no agent named"),
            (("restamp", "T"), "argument MASTER: 'T'", ("restamp", "nosuch"), "no agent named"),
            (("stamp", "T", "--as", "copy"), "argument MASTER: 'T'", ("stamp", "nosuch", "--as", "copy"), "no agent named"),
            (("stamp", "triager", "--as", "Copy"), "argument --as: 'Copy'", ("stamp", "triager", "--as", "evalsmith"),
             "evalsmith already exists"),
            (("new", "faq", "--from", "Tri"), "argument --from: 'Tri'", ("new", "faq", "--from", "nosuch"), "no agent named"),
            (("certify", "triager", "--tier", "C1", "--by", "al ice"), "argument --by: 'al ice' is not a valid signer name",
             ("certify", "nosuch", "--tier", "C1", "--by", "alice"), "no agent named"),
            (("approve", run_id, "--by", "1bob"), "argument --by: '1bob' is not a valid signer name",
             ("approve", run_id, "--by", "alice"), "no staged call 1 for run"),
            (("approve", "today", "--by", "alice"), "argument RUN_ID: 'today' is not a run id",
             ("reject", run_id, "--by", "alice", "--reason", "r"), "no staged call 1 for run"),
            (("tower", "--root", ""), "argument --root: is empty (an unset variable?)", ("tower", "--root", "/nonexistent"),
             "is not a folder"),
        )
        for malformed, says, unknown, refused in rows:
            with self.subTest(argv=malformed):
                self.usage_error(says, *malformed)
                self.refused(refused, *unknown)

    def test_no_arguments_show_the_help_on_stderr(self):
        code, out, err = self.factory()
        self.assertEqual((code, out), (2, ""))
        self.assertIn("usage: factory.py", err)
        self.assertIn("prove", err)

    def test_an_agent_that_does_not_exist_is_named_as_such(self):
        for argv in (("run", "nosuch", "hello"), ("run", "nosuch", "--file", "t.jsonl"), ("harvest", "nosuch"),
                     ("prove", "nosuch"), ("certify", "nosuch", "--tier", "C1", "--by", "bob")):
            with self.subTest(argv=argv):
                self.refused_writing_nothing("no agent named nosuch (no masters/nosuch.json); a new agent is made "
                                             "with: new nosuch\n", *argv)
        self.refused("no agent named trager (no masters/trager.json) (did you mean 'triager'?); a new agent is made "
                     "with: new trager", "prove", "trager")


class Progress(LineTest):

    def test_progress_appears_only_on_a_terminal(self):
        """Twelve cases answered after 0.1 s each pass the one-second mark: with stderr a terminal a
        progress line shows, with stderr a pipe nothing does (the two children run at once)."""
        cases = [{"id": f"p{i}", "input": "How do I order a new card?", "source": "synthetic",
                  "expect": {"label": "account"}} for i in range(12)]
        write_jsonl(self.root / "evals" / "triager" / "cases.jsonl", cases)
        self.set_bar("triager", 0.6)   # no case expects a hand-off: the card's hand-off bar is left out
        self.give_key("_evidence")   # the factory evidence key exists already: the line that creates it is not progress
        final = json.dumps({"label": "account", "escalate": False, "draft": "We are on it."})
        server = FakeServer(*[Answer(body=anthropic_message(final), delay=0.1) for _ in range(24)]).start()
        self.addCleanup(server.close)
        env = {**os.environ, **self.env, "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-test"}
        command = [sys.executable, str(REPO / "factory.py"), "prove", "triager", "--jobs", "1"]
        leader, follower = pty.openpty()
        self.addCleanup(os.close, leader)
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower,
                                 env=env, cwd=str(REPO))
        quiet = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=env, cwd=str(REPO))
        os.close(follower)
        chunks = []
        reader = threading.Thread(target=lambda: chunks.append(_drain(leader)), daemon=True)
        reader.start()
        child.communicate(timeout=120)
        _, quiet_err = quiet.communicate(timeout=120)
        reader.join(timeout=5)
        self.assertEqual((child.returncode, quiet.returncode), (0, 0))
        self.assertRegex(b"".join(chunks).decode(errors="replace"), r"prove triager: \d+/12 .*left")
        self.assertEqual(quiet_err, b"")
        self.assertEqual(len(server.requests), 24)


class Interpreter(LineTest):
    """factory.py starts wherever the user's Python does: below 3.11 one line says what is needed, and
    its own modules are found whatever the path settings and the current folder."""

    OLD_PYTHONS = {"3.10": "/root/.pyenv/versions/3.10.13/bin/python3", "3.9": "/root/.pyenv/versions/3.9.18/bin/python3",
                   "3.8": "/root/.pyenv/versions/3.8.18/bin/python3"}

    def test_an_older_python_gets_one_line_naming_both_versions(self):
        """The README says which Pythons get the line: 3.8, 3.9 and 3.10 (an older one cannot parse the file)."""
        self.assertIn("Python 3.8, 3.9 and 3.10 get one line saying which Python is needed and which one ran",
                      " ".join((REPO / "README.md").read_text().split()))
        found = {version: next((p for p in (path, shutil.which(f"python{version}")) if p and os.access(p, os.X_OK)), None)
                 for version, path in self.OLD_PYTHONS.items()}
        if not any(found.values()):
            self.skipTest("no Python 3.8, 3.9 or 3.10 on this machine (looked on PATH and in ~/.pyenv)")
        for version, python in ((v, p) for v, p in found.items() if p):
            for argv in (["prove", "triager"], ["--help"], []) if version == "3.10" else (["--help"],):
                with self.subTest(version=version, argv=argv):
                    done = subprocess.run([python, str(REPO / "factory.py"), *argv], capture_output=True, text=True,
                                          env={**os.environ, **self.env}, cwd=str(self.tmp), timeout=60)
                    self.assertEqual(done.returncode, 2, done.stderr)
                    self.assertEqual(done.stdout, "")
                    self.assertEqual(len(done.stderr.splitlines()), 1, done.stderr)
                    self.assertIn(f"needs Python 3.11 or newer, and this is Python {version}.", done.stderr)
                    self.assertIn(python, done.stderr)

    def test_its_own_modules_are_found_whatever_the_path_settings_and_folder(self):
        """Run from a folder holding decoy broker/llm/sage modules that are also first on PYTHONPATH:
        with -P, with PYTHONSAFEPATH=1 and with neither, the digest printed is the one computed here."""
        elsewhere = Path(tempfile.mkdtemp(prefix="elsewhere-", dir=self.tmp))
        for name in ("broker", "llm", "sage"):
            (elsewhere / f"{name}.py").write_text(f"raise ImportError('the decoy {name} was imported')\n")
        expected = factory.load_agent(self.fac, "triager").digest
        env = {**os.environ, **self.env, "PYTHONPATH": str(elsewhere)}
        for flags, extra in ((["-P"], {}), ([], {"PYTHONSAFEPATH": "1"}), ([], {})):
            with self.subTest(flags=flags, env=extra):
                command = [sys.executable, *flags, str(REPO / "factory.py"), "digest", "triager"]
                done = subprocess.run(command, capture_output=True, text=True, env={**env, **extra},
                                      cwd=str(elsewhere), timeout=60)
                self.assertEqual((done.returncode, done.stderr), (0, ""))
                self.assertEqual(done.stdout.strip(), expected)


class ColdStart(unittest.TestCase):
    """What a start does not pay for: the network clients load without the HTTP stack, which only a
    station that asks a model or Sage imports (when it first sends)."""

    def test_the_network_clients_load_without_the_http_stack(self):
        code = ("import sys; before = set(sys.modules); import factory; factory.llm.Worker, factory.sage.Sage; "
                "print(sorted({'http.client', 'urllib.request', 'urllib.error', 'email.utils', 'ssl'} & (set(sys.modules) - before)))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=60)
        self.assertEqual((done.returncode, done.stdout.strip()), (0, "[]"), done.stderr)

    def test_help_leaves_the_network_clients_unrun(self):
        """llm.py and sage.py stay lazy through loading factory.py and building --help: an annotation
        naming one of their classes would run the whole module (~15 ms) on every start."""
        code = ("import contextlib, io, sys, types, factory\n"
                "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
                "    factory.main(['--help'])\n"
                "print([name for name in ('llm', 'sage') if type(sys.modules[name]) is types.ModuleType])")  # run: lazy no more
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=60)
        self.assertEqual((done.returncode, done.stdout.strip()), (0, "[]"), done.stderr)


def _drain(fd: int) -> bytes:
    """Everything readable from a pty leader until the other side closes."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk


class Doctor(LineTest):
    """doctor answers 'why is every run routed to a human?' and never prints a key."""

    def test_without_keys_it_says_the_gate_cannot_score(self):
        code, out, _ = self.factory("doctor")
        self.assertEqual(code, 0)
        self.assertIn("keys present: none", out)
        self.assertIn("triager: worker offline", out)
        self.assertIn("every run is 'unscored' and routed to a human", out)

    def test_live_check_against_a_levanto_server(self):
        from tests.fake_sage import Reply
        for replies, expected in (([], "gate: live check ready"),
                                  ([Reply(403, {"detail": "blocked"})], "NOT READY (HTTP 403 — check the User-Agent")):
            with self.subTest(expected=expected), FakeSage(replies=replies) as fake:
                self.env.update(SAGE_ENDPOINT=fake.url, SAGE_API_KEY="lv_live_SECRETSECRET", ANTHROPIC_API_KEY=KEY)
                code, out, _ = self.factory("doctor")
                self.assertIn(expected, out)
                self.assertIn("keys present: ANTHROPIC_API_KEY, SAGE_API_KEY", out)
                self.assertIn("triager: worker anthropic", out)
                self.assertNotIn("SECRETSECRET", out)
                self.assertNotIn(KEY, out)
                self.assertEqual(fake.requests[-1].path, "/ready")


class SystemOneWithoutAModel(CertifiedTest):
    """System One needs the decision model's name: without SAGE_MODEL, doctor and the gate line say so,
    and nothing is sent."""

    def test_doctor_and_the_gate_line_say_sage_model_is_unset(self):
        with FakeSage() as fake:
            self.env.update(SAGE_PROTOCOL="systemone", SAGE_ENDPOINT=fake.url)
            code, out, _ = self.factory("doctor")
            self.assertEqual(code, 0)
            self.assertIn(f"gate: systemone at {fake.url}  model unset", out)
            self.assertIn("gate: not usable: SAGE_MODEL is unset: System One needs the decision model's name", out)
            self.assertNotIn("without a key", out)
            code, out, err = self.factory("run", "triager", "How do I order a new card?")
            self.assertEqual(code, 0, err)
            self.assertIn("gate: FAILED (SAGE_MODEL is unset: System One needs the decision model's name)", out)
            self.assertEqual(fake.requests, [])
            self.env["SAGE_MODEL"] = "decider"
            self.assertIn("gate: live check ready", self.factory("doctor")[1])



class LookedUp(dict):
    """An environment that remembers each variable a station looks up (get, [] or in); a lower-case proxy
    variable is counted as its upper-case name, as --help lists it."""

    def __init__(self, values: dict):
        super().__init__(values)
        self.read = set()

    def note(self, name):
        self.read.add(name.upper() if name.lower().endswith("_proxy") else name)

    def get(self, name, default=None):
        self.note(name)
        return super().get(name, default)

    def __getitem__(self, name):
        self.note(name)
        return super().__getitem__(name)

    def __contains__(self, name):
        self.note(name)
        return super().__contains__(name)


class EachStationsEnvironment(CertifiedTest):
    """Each station's --help lists the variables THAT station reads: every variable it looks up in a run of
    it (its environment records each lookup), over the paths these runs take, is in its list. prove and
    pending read the keys folder and did not list FACTORY_KEYS_DIR; every station now checks that the keys
    folder lies outside the root, and lists it."""

    RUNS = (("schema",), ("digest", "triager"), ("new", "faq"), ("prove", "triager"), ("prove", "triager", "--sealed"),
            ("certify", "triager", "--tier", "C1", "--by", "alice"), ("stamp", "triager", "--as", "tri2"),
            ("restamp", "triager"), ("run", "triager", INJECTION), ("run", "tri2", "How do I order a new card?"),
            ("tower",), ("pending",), ("harvest", "triager"), ("doctor",), ("recall", "tri2", "--reason", "a test"))

    def test_each_station_reads_only_what_its_help_lists(self):
        read = {}
        with FakeSage(yes_p=0.9) as gate:
            self.env.update(SAGE_ENDPOINT=gate.url, SAGE_API_KEY="sage-key", PATH=os.environ["PATH"])
            for argv in self.RUNS:
                env = LookedUp(self.env)
                with typed_at_a_terminal(b"y\n"):
                    code, out, err = self.factory(*argv, env=env)
                self.assertIn(code, (0, 1), f"{argv}: {err}")
                read.setdefault(argv[0], set()).update(env.read)
        for func in factory.stations():
            name = func.__name__.removeprefix("cmd_")
            with self.subTest(station=name):
                listed = set(func.station_help["env"])
                self.assertLessEqual(read.get(name, set()), listed, f"{name} reads what its --help does not list")
        self.assertLessEqual({"FACTORY_KEYS_DIR", "SAGE_API_KEY"}, read["prove"])   # the lookups are seen
        self.assertIn("FACTORY_KEYS_DIR", read["pending"])
        self.assertIn("USER", read["new"] & read["recall"])


class ClosedStdout(unittest.TestCase):
    """A station other than run whose stdout is gone says so in one line on stderr and exits 1; a
    reader that stopped (head) and a stdout that was never open (`>&-`) alike."""

    LINE = ("factory: stdout was closed before everything was written to it "
            "(its reader stopped, e.g. head, or it was never open)\n")

    def test_a_reader_that_stopped(self):
        reader, writer = os.pipe()
        os.close(reader)
        try:
            child = subprocess.run([sys.executable, str(REPO / "factory.py"), "schema"], stdout=writer,
                                   stderr=subprocess.PIPE, text=True, timeout=60, cwd=str(REPO))
        finally:
            os.close(writer)
        self.assertEqual((child.returncode, child.stderr), (1, self.LINE))

    def test_help_to_a_reader_that_stopped_is_no_error(self):
        """`factory.py --help | head -1` exited 1 with the line above, or 0, as the pipe's timing fell."""
        for argv in (["--help"], ["run", "--help"]):
            reader, writer = os.pipe()
            os.close(reader)
            try:
                child = subprocess.run([sys.executable, str(REPO / "factory.py"), *argv], stdout=writer,
                                       stderr=subprocess.PIPE, text=True, timeout=60, cwd=str(REPO))
            finally:
                os.close(writer)
            self.assertEqual((child.returncode, child.stderr), (0, ""), argv)

    def test_a_stdout_never_open(self):
        child = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} factory.py schema >&-"],
                               capture_output=True, text=True, timeout=60, cwd=str(REPO))
        self.assertEqual((child.returncode, child.stderr), (1, self.LINE))


if __name__ == "__main__":
    unittest.main()
