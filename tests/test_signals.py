"""Signals: SIGINT and SIGTERM sent to a station in a child process, at points the test holds it at (a model
server that has the request and does not answer yet, the index's lock, the certify prompt), give one line
`interrupted` and exit 130 or 143, and close the run in flight as interrupted; a second signal ends the
station at once. A run refused before it started is not counted."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.support import CLI, REPO, CertifiedTest, spawn_at_terminal

CHARGED = "I was charged twice for one order last week."
FINAL = json.dumps({"label": "billing", "escalate": False, "draft": "We are looking into the double charge."})


def wait_for(condition, what: str, seconds: float = 30.0):
    """condition()'s first true value, asked every 10 ms: the point a test holds a child at has been reached
    (not a sleep that hopes it was); AssertionError naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.01)
    raise AssertionError(f"never reached: {what}")


class Signals(CertifiedTest):
    """The certified triager, its model behind a server the test holds."""

    def station(self, *argv: str, script: bool = False) -> subprocess.Popen:
        """A station in a child process started as a user starts it (`script`: python3 factory.py), or as the
        tests' CLI does (importing factory, its bytecode cached)."""
        command = [sys.executable, str(REPO / "factory.py")] if script else CLI
        return subprocess.Popen([*command, *argv], env={**os.environ, **self.env}, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def held_model(self, answers: int = 1) -> FakeServer:
        """The card's model behind a server that takes each request and answers none of them while the test runs."""
        server = FakeServer(*[Answer(body=anthropic_message(FINAL), delay=60)] * answers).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="sk-held-key-1234")
        return server

    def ended(self, child: subprocess.Popen, status: int, line: str) -> None:
        """The child exits with `status` and says exactly `line` on stderr."""
        out, err = child.communicate(timeout=60)
        self.assertEqual((child.returncode, err), (status, line), out)

    def interrupted_rows(self) -> list[dict]:
        """The closed rows of the index, each asserted to close a run as interrupted (its trace's end too)."""
        rows, traces = self.index_rows(), {events[0]["run_id"]: events for events in self.traces()}
        for row in rows:
            self.assertEqual((row["status"], row["verdict"], row["gate"], row["acted"], row["staged"]),
                             ("interrupted", "interrupted", "not-run", 0, 0), row)
            self.assertEqual([e["status"] for e in traces[row["run_id"]] if e.get("event") == "end"], ["interrupted"])
        self.assertEqual(len(self.index_lines()), 2 * len(rows), f"every run started is closed: {self.index_lines()}")
        return rows

    def test_sigint_and_sigterm_while_the_model_answers_close_the_run_as_interrupted(self):
        for signum, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            with self.subTest(signal.Signals(signum).name):
                self.setUp()
                server = self.held_model()
                child = self.station("run", "triager", CHARGED)
                wait_for(lambda: server.requests, "the model has the request")
                child.send_signal(signum)
                self.ended(child, status, "factory run: interrupted\n")
                [row] = self.interrupted_rows()
                self.assertEqual((row["reason"], row["why"]), (f"interrupted by {signal.Signals(signum).name}",
                                                               [f"run interrupted: interrupted by {signal.Signals(signum).name}"]))

    def test_a_signal_while_a_run_is_being_counted_waits_until_it_is(self):
        index = self.root / "traces" / "index.jsonl"
        index.parent.mkdir(parents=True, exist_ok=True)
        with open(index, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)   # the run writes its trace's header, then waits to append its started row
            child = self.station("run", "triager", CHARGED)
            wait_for(lambda: list((self.root / "traces" / "triager").glob("*.jsonl")), "the run's trace is written")
            child.send_signal(signal.SIGTERM)
        self.ended(child, 143, "factory run: interrupted\n")
        self.assertEqual(len(self.interrupted_rows()), 1)

    def test_a_batch_stopped_closes_every_run_in_flight(self):
        server = self.held_model(answers=2)
        tickets = self.tmp / "tickets.jsonl"
        tickets.write_text("".join(json.dumps({"id": f"t{i}", "input": f"{CHARGED} ({i})"}) + "\n" for i in range(5)))
        child = self.station("run", "triager", "--file", str(tickets), "--jobs", "2")
        wait_for(lambda: len(server.requests) == 2, "both runs in flight wait for the model")
        child.send_signal(signal.SIGTERM)
        server.close()   # the model never answers: each run in flight goes on to its next step, and stops there
        self.ended(child, 143, "factory run: interrupted\n")
        self.assertEqual(len(self.interrupted_rows()), 2, "the three tickets not started never ran")

    def test_a_second_signal_ends_the_station_at_once(self):
        server = self.held_model()
        child = self.station("run", "triager", CHARGED)
        wait_for(lambda: server.requests, "the model has the request")
        index = self.root / "traces" / "index.jsonl"
        with open(index, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)   # the interrupted run's closed row waits for the lock
            child.send_signal(signal.SIGINT)
            wait_for(lambda: any(e.get("event") == "end" for e in self.traces()[-1]), "the run's end is written")
            child.send_signal(signal.SIGTERM)
            self.ended(child, 143, "factory: interrupted\n")
        self.assertEqual([row["state"] for row in self.index_lines()], ["started"], "left visibly unfinished")

    def test_sigterm_at_the_certify_prompt_signs_nothing(self):
        self.prove_sealed()
        before = self.cert()
        child, leader = spawn_at_terminal(["certify", "triager", "--tier", "C1", "--by", "bob"], self.env)
        self.addCleanup(os.close, leader)
        os.set_blocking(child.stderr.fileno(), False)
        said = bytearray()
        wait_for(lambda: said.extend(child.stderr.read() or b"") or said.endswith(b"sign it? [y/N] "), "the prompt")
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
        self.assertEqual((child.returncode, (bytes(said) + err).decode().splitlines()[-1]),
                         (143, "sign it? [y/N] factory certify: interrupted"))
        self.assertEqual(self.cert(), before, "nothing was signed")

    def test_a_signal_while_the_script_loads_is_one_line(self):
        planted = self.tmp / "planted"   # a stand-in for argparse on PYTHONPATH holds the script as it imports
        planted.mkdir()
        (planted / "argparse.py").write_text("import os, time\nos.write(1, b'loading\\n')\ntime.sleep(60)\n")
        for signum, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            with self.subTest(signal.Signals(signum).name):
                self.env["PYTHONPATH"] = str(planted)
                child = self.station("--version", script=True)
                self.assertEqual(child.stdout.readline(), "loading\n")
                child.send_signal(signum)
                self.ended(child, status, "factory: interrupted\n")

    def test_the_script_ends_by_os_exit_with_its_output_flushed(self):
        """No interpreter teardown after main() (where Python puts the default handlers back, so a signal killed
        the station silently after its full output): a planted atexit hook never runs."""
        planted = self.tmp / "planted"
        planted.mkdir()
        (planted / "sitecustomize.py").write_text("import atexit, os\natexit.register(os.write, 2, b'teardown ran\\n')\n")
        child = subprocess.run([sys.executable, str(REPO / "factory.py"), "schema"], capture_output=True, text=True,
                               env={**os.environ, **self.env, "PYTHONPATH": str(planted)}, cwd=REPO, timeout=60)
        self.assertEqual((child.returncode, child.stdout, child.stderr), (0, self.factory("schema")[1], ""))

    def test_a_signal_while_the_last_output_is_flushed_is_one_line(self):
        """The station's output (buffered, and under a buffer's size: all of it waits for the flush after main())
        goes to a pipe the test shrank to one page and does not read: the flush holds the child there."""
        for signum, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            with self.subTest(signal.Signals(signum).name):
                reader, writer = os.pipe()
                self.addCleanup(os.close, reader)
                page = fcntl.fcntl(writer, fcntl.F_SETPIPE_SZ, 4096)
                buffered = {name: value for name, value in {**os.environ, **self.env}.items() if name != "PYTHONUNBUFFERED"}
                child = subprocess.Popen([sys.executable, str(REPO / "factory.py"), "schema"], stdout=writer,
                                         stderr=subprocess.PIPE, env=buffered, cwd=REPO, text=True)
                os.close(writer)
                queued = bytearray(4)
                wait_for(lambda: fcntl.ioctl(reader, termios.FIONREAD, queued) == 0
                         and int.from_bytes(queued, sys.byteorder) == page, "the pipe is full: the flush waits")
                child.send_signal(signum)
                self.assertEqual((child.wait(timeout=60), child.stderr.read()), (status, "factory: interrupted\n"))
                child.stderr.close()
                self.assertEqual(len(os.read(reader, 2 * page)), page)

    def test_a_run_refused_before_it_started_is_not_counted(self):
        outside = self.tmp / "outside"
        outside.mkdir()
        (self.root / "traces").mkdir(exist_ok=True)
        (self.root / "traces" / "triager").symlink_to(outside)
        self.refused("traces/triager: is a symbolic link", "run", "triager", CHARGED)
        self.assertEqual((self.index_lines(), list(outside.iterdir())), ([], []))
