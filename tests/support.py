"""Shared test fixtures: a factory root in a temporary folder, in-process and pty-driven stations.

Each test gets its own copy of agents/, masters/ and evals/ from the repo, a keys folder inside the
temporary root (FACTORY_KEYS_DIR), and an environment with no model or Sage keys unless the test
adds them. Nothing here patches the product's functions.
"""

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
import unittest
from pathlib import Path

import factory

REPO = Path(__file__).resolve().parent.parent
# the CLI in a child process; importing factory (rather than running the file) reuses its compiled bytecode
CLI = [sys.executable, "-c", "import sys, factory; sys.exit(factory.main())"]
SHIPPED = ("agents", "masters", "evals")


def make_root(tmp: Path) -> Path:
    """A fresh factory root under tmp holding copies of the shipped agents, masters and evals."""
    root = tmp / "factory"
    for folder in SHIPPED:
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", "proposed.jsonl"))
    return root


class LineTest(unittest.TestCase):
    """Base class: self.root is a fresh factory, self.env its environment (no keys)."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = Path(tmp.name)
        self.root = make_root(self.tmp)
        self.env = {"FACTORY_ROOT": str(self.root), "FACTORY_KEYS_DIR": str(self.tmp / "keys"), "USER": "tester"}
        self.fac = factory.Factory.at(None, None, self.env)

    def factory(self, *argv: str) -> tuple[int, str, str]:
        """Run one station in-process: (exit status, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = factory.main(list(argv), env=self.env)
            except SystemExit as usage:  # argparse's own usage errors exit 2
                code = usage.code
        return code, out.getvalue(), err.getvalue()

    def refused(self, expected: str, *argv: str) -> str:
        """Assert the station refuses with exit 1 and one stderr line containing `expected`."""
        code, out, err = self.factory(*argv)
        self.assertEqual(code, 1, f"{argv} should be refused; stdout={out!r} stderr={err!r}")
        self.assertEqual(len(err.strip().splitlines()), 1, f"one line expected: {err!r}")
        self.assertIn(expected, err)
        self.assertNotIn("Traceback", err)
        return err

    def edit_card(self, name: str, **fields) -> None:
        """Rewrite masters/NAME.json with some fields replaced."""
        path = self.root / "masters" / f"{name}.json"
        card = json.loads(path.read_text())
        card.update(fields)
        path.write_text(json.dumps(card, indent=2))

    def set_bar(self, name: str, pass_bar: float, gate: float = 0.85) -> None:
        """Set a card's pass bar and gate threshold (tests decide what clears the bar)."""
        self.edit_card(name, evals={"pass_bar": pass_bar, "gate": gate})

    def certify(self, name: str, tier: str = "C1", answer: bytes = b"y\n", signer: str = "alice",
                env: dict | None = None) -> subprocess.CompletedProcess:
        """Run certify in a child process whose stdin is a pseudo-terminal, typing `answer`."""
        leader, follower = pty.openpty()
        self.addCleanup(os.close, leader)
        child = subprocess.Popen([*CLI, "certify", name, "--tier", tier,
                                  "--by", signer], stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env={**os.environ, **self.env, **(env or {})}, cwd=str(REPO))
        os.close(follower)
        os.write(leader, answer)
        out, err = child.communicate(timeout=60)
        return subprocess.CompletedProcess(child.args, child.returncode, out.decode(), err.decode())

    def certified(self, name: str = "triager", tier: str = "C1", lower_bar: bool = True) -> None:
        """Prove the sealed half and certify at a terminal. The bar is lowered to 0 unless told not to:
        these tests are about the line's mechanics; the shipped suites' scores are tested on their own."""
        if lower_bar:
            self.set_bar(name, 0.0)
        code, out, err = self.factory("prove", name, "--sealed")
        self.assertEqual(code, 0, out + err)
        signed = self.certify(name, tier)
        self.assertEqual(signed.returncode, 0, signed.stdout + signed.stderr)

    def traces(self, agent: str = "triager") -> list[list[dict]]:
        """Every trace of an agent, each a list of events (header first), in run order."""
        folder = self.root / "traces" / agent
        return [[json.loads(line) for line in path.read_text().splitlines()] for path in sorted(folder.glob("*.jsonl"))]

    def index_rows(self) -> list[dict]:
        """Rows of traces/index.jsonl."""
        path = self.root / "traces" / "index.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def snapshot(root: Path) -> dict:
    """path -> bytes of every file under root (to prove a refusal changed nothing)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}
