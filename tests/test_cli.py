"""The command line: the README's test command is what CI runs, every station is in the parser and
the module docstring with its docstring as its --help, usage errors exit 2, progress appears only on
a terminal, and doctor answers why every run is routed to a human."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

import factory
from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.fake_sage import FakeSage
from tests.support import REPO, CertifiedTest, LineTest, write_jsonl

KEY = "sk-ant-test-router"


class Parser(unittest.TestCase):
    """The stations as the user meets them."""

    def test_readme_test_command_is_what_ci_runs(self):
        readme = (REPO / "README.md").read_text()
        command = "python3 -m unittest discover -s tests -t ."
        self.assertIn(f"```sh\n{command}\n```", readme)
        self.assertIn(f"\n{command}\n", (REPO / ".ci" / "run").read_text())

    def test_every_station_is_in_the_parser_with_its_docstring_as_help(self):
        names = [func.__name__.removeprefix("cmd_") for func in factory.stations()]
        self.assertEqual(names, ["stamp", "restamp", "prove", "certify", "run", "tower", "harvest", "recall", "doctor",
                                 "pending", "approve", "reject", "replay", "digest", "schema"])
        self.assertEqual(sorted(names), sorted(n.removeprefix("cmd_") for n in dir(factory) if n.startswith("cmd_")))
        parser = factory.build_parser()
        choices = next(a for a in parser._actions if a.dest == "command").choices
        self.assertEqual(list(choices), names)
        for func in factory.stations():
            with self.subTest(station=func.__name__):
                self.assertTrue(func.__doc__)
                self.assertEqual(choices[func.__name__.removeprefix("cmd_")].description, func.__doc__)

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


class Usage(LineTest):
    """Usage errors are argparse's: exit 2."""

    def test_usage_errors_exit_2(self):
        for argv in (("nosuch",), ("prove",), ("run",), ("certify", "triager", "--tier", "C9", "--by", "a"),
                     ("recall", "triager"), ("run", "triager", "a", "b")):
            with self.subTest(argv=argv):
                self.assertEqual(self.factory(*argv)[0], 2)


class Progress(LineTest):

    def test_progress_appears_only_on_a_terminal(self):
        """Twelve cases answered after 0.1 s each pass the one-second mark: with stderr a terminal a
        progress line shows, with stderr a pipe nothing does (the two children run at once)."""
        cases = [{"id": f"p{i}", "input": "How do I order a new card?", "source": "synthetic",
                  "expect": {"label": "account"}} for i in range(12)]
        write_jsonl(self.root / "evals" / "triager" / "cases.jsonl", cases)
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

    OLD_PYTHON = "/root/.pyenv/versions/3.10.13/bin/python3"

    def test_an_older_python_gets_one_line_naming_both_versions(self):
        python = next((p for p in (self.OLD_PYTHON, shutil.which("python3.10")) if p and os.access(p, os.X_OK)), None)
        if python is None:
            self.skipTest("no Python 3.10 on this machine (looked for python3.10 on PATH and in ~/.pyenv)")
        for argv in (["prove", "triager"], ["--help"], []):
            with self.subTest(argv=argv):
                done = subprocess.run([python, str(REPO / "factory.py"), *argv], capture_output=True, text=True,
                                      env={**os.environ, **self.env}, cwd=str(self.tmp), timeout=60)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertEqual(done.stdout, "")
                self.assertEqual(len(done.stderr.splitlines()), 1, done.stderr)
                self.assertIn("needs Python 3.11 or newer, and this is Python 3.10.", done.stderr)
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


if __name__ == "__main__":
    unittest.main()
