"""A hostile machine loses nothing and crashes nothing: links planted at every write path, reports
that are links or FIFOs, a root the user may only read, a file-size limit, bytes that are not text
(arguments, cards, tickets, a Latin-1 terminal), terminal controls and echoed secrets from local
servers, characters XML forbids, two harvests at once, bad tickets inside a batch, and the small ones.

Every row of every table here asserts: the exit status, at most one stderr line (naming the path or
argument at fault), no traceback, nothing written outside the root, and nothing lost."""

from __future__ import annotations

import base64
import concurrent.futures
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import unittest
import urllib.parse
from pathlib import Path
from xml.etree import ElementTree

import broker
import factory
from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.fake_sage import Fail, FakeSage
from tests.support import (CLI, INJECTION, REPO, CertifiedTest, LineTest, chained_line, on_a_terminal, snapshot,
                           write_jsonl)
from tests.test_run_approve import CHARGED, Tiered

SAGE_KEY = "Zq9rT2aSECRETvalue77"             # not key-shaped: only the factory's scrubbing can catch it
MODEL_KEY = "Wb4nCLAUDEsecretvalue88"
DRAFT = "We\u2019ll look into the charge today."
FINAL = json.dumps({"label": "billing", "escalate": False, "draft": DRAFT}, ensure_ascii=False)
CONTROLS = "\x1b[2K\r\x07\x9b31m"                # erase the line, return, bell, a C1 CSI


class Hostile(CertifiedTest):
    """The triager certified at C1 with one run in the index, prepared once; every row starts from a
    fresh copy of it. `outside` is a folder beside the root that nothing may write into. The tests are
    grouped by class of fault in the mixins below and run together in HostileMachine, which prepares
    the factory once for all of them."""

    def prepare(self):
        super().prepare()
        self.runs_ok()

    @property
    def outside(self) -> Path:
        return self.tmp / "outside"

    def fresh(self) -> None:
        """Start the next row from a fresh copy of the prepared factory."""
        self.setUp()

    def link_out(self, relative: str) -> None:
        """Move what is at root/RELATIVE (a folder when it ends with /) outside the root and leave a
        symbolic link to it in its place."""
        path, target = self.root / relative.rstrip("/"), self.outside / relative.rstrip("/").replace("/", "_")
        self.outside.mkdir(exist_ok=True)
        if path.exists():
            shutil.move(str(path), str(target))
        elif relative.endswith("/"):
            target.mkdir()
        else:
            target.write_text("")
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)

    def check(self, result: tuple, status: int, named: str | None, before: dict) -> None:
        """The row's assertions on (code, stdout, stderr) and on the outside folder."""
        code, out, err = result
        self.assertNotIn("Traceback", err + out)
        self.assertEqual(code, status, f"stdout={out[-400:]!r} stderr={err[-400:]!r}")
        lines = err.strip().splitlines()
        self.assertLessEqual(len(lines), 1, err)
        if named:
            self.assertEqual(len(lines), 1, err)
            self.assertIn(named, lines[0])
        self.assertEqual(snapshot(self.outside) if self.outside.exists() else {}, before, "something was written outside the root")

    def table(self, rows: list) -> int:
        """Run each (label, prepare, argv, status, named) row from a fresh copy; `{tmp}` in an argument is
        this copy's temporary folder. Returns the row count."""
        for label, prepare, argv, status, named in rows:
            with self.subTest(label):
                self.fresh()
                prepare()
                before = snapshot(self.outside) if self.outside.exists() else {}
                self.check(self.factory(*(a.replace("{tmp}", str(self.tmp)) for a in argv)), status, named, before)
        return len(rows)


class Links:
    """Class 1: a link planted at each path a station writes, or at a report the user names, is refused
    with one line naming it; nothing is written through it."""

    def test_links_at_every_write_path(self):
        report, fifo = "{tmp}/report.xml", "{tmp}/fifo.xml"
        def link_report(name):
            self.outside.mkdir(exist_ok=True)
            (self.outside / name).write_text("the user's own file\n")
            os.symlink(self.outside / name, self.tmp / name)
        run, prove = ("run", "triager", "hi"), ("prove", "triager")
        rows = [
            ("traces/index.jsonl", lambda: self.link_out("traces/index.jsonl"), run, 1, "traces/index.jsonl"),
            ("traces/triager/", lambda: self.link_out("traces/triager/"), run, 1, "traces/triager"),
            ("records/triager/", lambda: self.link_out("records/triager/"), prove, 1, "records/triager"),
            ("registry/recalls.jsonl", lambda: self.link_out("registry/recalls.jsonl"),
             ("recall", "triager", "--reason", "drafts went wrong"), 1, "registry/recalls.jsonl"),
            ("registry/lineage.jsonl", lambda: self.link_out("registry/lineage.jsonl"),
             ("stamp", "triager", "--as", "triager-eu"), 1, "registry/lineage.jsonl"),
            ("prove --junit a link", lambda: link_report("report.xml"), (*prove, "--junit", report), 1, "report.xml"),
            ("prove --junit a fifo", lambda: os.mkfifo(self.tmp / "fifo.xml"), (*prove, "--junit", fifo), 1, "fifo.xml"),
            ("tower --html a link", lambda: link_report("report.xml"), ("tower", "--html", report), 1, "report.xml"),
            ("tower --html a fifo", lambda: os.mkfifo(self.tmp / "fifo.xml"), ("tower", "--html", fifo), 1, "fifo.xml"),
        ]
        self.assertEqual(self.table(rows), 9)

    def test_a_refused_stamp_leaves_no_variant_behind(self):
        self.link_out("registry/lineage.jsonl")
        # stamp reads the lineage log first (a name keeps its first parent), so the link is refused as a read
        self.check(self.factory("stamp", "triager", "--as", "triager-eu"), 1, "registry/lineage.jsonl: points outside",
                   {"registry_lineage.jsonl": b""})
        self.assertFalse((self.root / "masters" / "triager-eu.json").exists(), "a variant the lineage log does not know")

    def test_a_refused_junit_is_refused_before_any_proof_is_written(self):
        before = snapshot(self.root)
        for target in (self.tmp / "no-such-folder" / "prove.xml", self.tmp):
            with self.subTest(target=target.name):
                self.check(self.factory("prove", "triager", "--junit", str(target)), 1, target.name, {})
                self.assertEqual(snapshot(self.root), before, "no proof record without its report")

    def test_an_outbox_linked_out_fails_the_effect_not_the_outside(self):
        self.link_out("outbox/triager/")
        before = snapshot(self.outside)   # the effects of the prepared run, moved out with the folder
        code, out, err = self.factory("run", "triager", "I was charged twice for my card")
        self.check((code, out, err), 1, "1 run(s) ended uncertain-effect", before)
        self.assertIn("verdict uncertain-effect", out)
        settled = [e for e in self.traces()[-1] if e.get("event") == "settled"]
        self.assertTrue(settled and all("StoreError" in (e.get("error") or e.get("ruling") or "") for e in settled), settled)
        self.assertIn("outbox/triager: is a symbolic link", json.dumps(self.traces()[-1]))

    def test_reads_refuse_a_link_out_of_the_root_too(self):
        self.link_out("masters/triager.json")
        self.check(self.factory("digest", "triager"), 1, "points outside the factory root", snapshot(self.outside))


class PendingLink(Tiered):
    """registry/pending/ linked out of the root: a C2 run whose call would be parked there refuses."""

    def prepare(self):
        super().prepare()
        self.promote_to("C2")

    def test_a_parked_call_is_never_written_through_a_link(self):
        outside = self.tmp / "outside"
        outside.mkdir()
        os.symlink(outside, self.root / "registry" / "pending")
        self.refund_model()   # labels, asks for a refund, and does not hand off: the gate passes, the call parks
        code, out, err = self.factory("run", "payer", CHARGED)
        self.assertNotIn("Traceback", err)
        self.assertEqual((code, len(err.strip().splitlines())), (1, 1), err)
        self.assertIn("registry/pending: is a symbolic link", err)
        self.assertEqual(list(outside.iterdir()), [])
        self.assertEqual(self.effects("refunds"), [])


# ---------------------------------------------------------------- the machine says no

def read_only(root: Path) -> None:
    """Every folder under root 0555 and every file 0444 (what a user who may only read sees)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)


def writable(root: Path) -> None:
    """Undo read_only (so the temporary folder can be removed)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def drop_root_overrides() -> None:
    """preexec_fn: as root, give up CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (prctl PR_CAPBSET_DROP before
    exec), so the child is bound by file permissions like an unprivileged user."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


class MachineSaysNo:
    """Class 2: permission denied, a file-size limit: one line naming the path and the cause, exit 1,
    nothing half-done. Each station runs in a child process bound by file permissions (as root, the
    child gives up the capabilities that let root ignore them)."""

    def child(self, *argv: str, fsize: int | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        """The CLI in a child process, optionally with RLIMIT_FSIZE (Python ignores SIGXFSZ: writes get EFBIG)."""
        command = list(CLI)
        if fsize is not None:
            command[2] = f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize})); " + command[2]
        return subprocess.run([*command, *argv], env={**os.environ, **self.env, **(env or {})}, cwd=str(REPO),
                              capture_output=True, text=True, timeout=60,
                              preexec_fn=drop_root_overrides if os.geteuid() == 0 else None)

    def refused_by_the_machine(self, child: subprocess.CompletedProcess, cause: str, where: str) -> None:
        """One stderr line naming the path and the cause, exit 1, no traceback."""
        self.assertNotIn("Traceback", child.stderr)
        self.assertEqual(child.returncode, 1, child.stdout[-300:] + child.stderr[-500:])
        self.assertEqual(len(child.stderr.strip().splitlines()), 1, child.stderr)
        self.assertIn(cause, child.stderr)
        self.assertIn(where, child.stderr)

    def test_a_root_the_user_may_only_read(self):
        tickets = self.tmp / "tickets.jsonl"
        write_jsonl(tickets, [{"id": f"t{i}", "input": "How do I order a new card?"} for i in range(3)])
        read_only(self.root)
        self.addCleanup(writable, self.root)
        before = snapshot(self.root)
        rows = [(("run", "triager", "hi"), "traces"), (("run", "triager", "--file", str(tickets)), "traces"),
                (("prove", "triager"), "records"), (("recall", "triager", "--reason", "drafts went wrong"), "registry"),
                (("stamp", "triager", "--as", "triager-eu"), "registry/lineage.jsonl")]   # written before the card
        for argv, where in rows:
            with self.subTest(argv=argv):
                self.refused_by_the_machine(self.child(*argv), "permission denied", where)
                self.assertEqual(snapshot(self.root), before)

    def test_an_unreadable_card(self):
        card = self.root / "masters" / "triager.json"
        card.chmod(0)
        self.addCleanup(card.chmod, 0o644)
        self.refused_by_the_machine(self.child("digest", "triager"), "permission denied", "masters/triager.json")

    def test_a_folder_the_user_may_not_enter(self):
        rows = [("masters", ("run", "triager", "hi"), 1),
                ("masters", ("tower",), 1),            # the rest of the tower is shown; it says it is partial
                ("registry", ("run", "triager", "hi"), 1)]
        for folder, argv, status in rows:
            with self.subTest(folder=folder, argv=argv):
                (self.root / folder).chmod(0)
                try:
                    child = self.child(*argv)
                finally:
                    (self.root / folder).chmod(0o755)
                if status == 0:
                    self.assertEqual((child.returncode, child.stderr), (0, ""))
                else:
                    self.refused_by_the_machine(child, "permission denied", folder)

    def test_a_file_size_limit(self):
        index = self.root / "traces" / "index.jsonl"
        before = snapshot(self.root)
        for argv in (("run", "triager", "I was charged twice for my card"), ("prove", "triager")):
            with self.subTest(argv=argv):
                self.refused_by_the_machine(self.child(*argv, fsize=index.stat().st_size + 64), "file too large", "")
                for path in sorted(self.root.rglob("*.jsonl")):   # no torn line anywhere: appends are cut back
                    for line in path.read_text().splitlines():
                        self.assertIsInstance(json.loads(line), dict, path)
                self.assertEqual(sorted(p.name for p in (self.root / "records" / "triager").iterdir()),
                                 sorted(Path(p).name for p in before if p.startswith("records/triager/")),
                                 "no proof record and no temporary file left behind")


# ---------------------------------------------------------------- text in, text out

class Text:
    """Class 3: arguments that are not text are refused (exit 2); lone surrogates in cards and tickets are
    refused naming the file; a Latin-1 terminal never makes a station raise after it acted."""

    def test_arguments_that_are_not_text(self):
        rows = [
            ("the input", lambda: None, ("run", "triager", "refund \udcff please"), 2, "input"),
            ("a recall reason", lambda: None, ("recall", "triager", "--reason", "broken \udcff"), 2, "--reason"),
            ("a --set value", lambda: None, ("stamp", "triager", "--as", "triager-eu", "--set", "owner=\udcff"), 2, "--set"),
            ("a signer", lambda: None, ("certify", "triager", "--tier", "C1", "--by", "al\udcffice"), 2, "--by"),
        ]
        for label, _, argv, status, named in rows:
            with self.subTest(label):
                before = snapshot(self.root)
                self.check(self.factory(*argv), status, named, {})
                self.assertEqual(snapshot(self.root), before)

    def test_argument_bytes_from_a_real_terminal(self):
        child = subprocess.run([*[a.encode() for a in CLI], b"run", b"triager", b"refund \xff please"],
                               env={**os.environ, **self.env, "LC_ALL": "C.UTF-8"}, cwd=str(REPO),
                               capture_output=True, timeout=60)
        self.assertNotIn(b"Traceback", child.stderr)
        self.assertEqual((child.returncode, len(child.stderr.splitlines())), (2, 1), child.stderr)
        self.assertEqual(child.stderr, b"factory run: input holds bytes that are not utf-8 text (refund \\xff please); pass "
                                       b"it as text in the terminal's encoding; see `factory.py run --help`\n")

    def test_a_lone_surrogate_in_a_card(self):
        card = self.root / "masters" / "triager.json"
        card.write_text(card.read_text().replace('"gate_question": "', '"gate_question": "\\udcff', 1))
        self.check(self.factory("digest", "triager"), 1, "masters/triager.json: holds \\udcff", {})

    def locale_env(self, charmap: str, suffixes: tuple) -> dict:
        """LANG/LC_ALL for an en_US locale in `charmap`: the machine's own when `locale -a` lists one
        ending in one of `suffixes`, else one built with localedef into tmp (LOCPATH)."""
        listed = subprocess.run(["locale", "-a"], capture_output=True, text=True).stdout.split() \
            if shutil.which("locale") else []
        for name in listed:
            if name.lower().replace("-", "").endswith(suffixes) and not name.lower().startswith("c."):
                return {"LANG": name, "LC_ALL": name}
        if not shutil.which("localedef"):
            self.skipTest(f"no {charmap} locale here and no localedef to build one")
        name, folder = f"en_US.{charmap}", self.tmp / "loc"
        folder.mkdir(exist_ok=True)
        built = subprocess.run(["localedef", "-i", "en_US", "-f", charmap, str(folder / name)], capture_output=True, text=True)
        if not (folder / name).exists():
            self.skipTest(f"localedef could not build {name}: {built.stderr.strip()[-200:]}")
        return {"LOCPATH": str(folder), "LANG": name, "LC_ALL": name}

    def test_bytes_that_are_not_text_at_a_prompt(self):
        env = self.locale_env("UTF-8", ("utf8",))   # a UTF-8 terminal decodes stdin strictly
        answered = self.certify("triager", answer=b"\xff\xfe y\n", env=env, child=True)   # the locale is the child's
        self.assertNotIn("Traceback", answered.stderr)
        self.assertEqual(answered.returncode, 1)
        self.assertTrue(answered.stderr.strip().endswith('factory certify: unsigned. you answered "\\ufffd\\ufffd y"; '
                                                         'only y or yes signs.'), answered.stderr)

    def test_a_latin1_terminal(self):
        env = self.locale_env("ISO-8859-1", ("iso88591", "latin1"))
        server = FakeServer(*[Answer(body=anthropic_message(FINAL)) for _ in range(8)]).start()
        self.addCleanup(server.close)
        env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=MODEL_KEY)
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "PYTHONUTF8", "LC_CTYPE")}
        tickets = self.tmp / "tickets.jsonl"
        write_jsonl(tickets, [{"id": f"t{i}", "input": "My card was charged twice \u2014 please check"} for i in range(3)])
        probe = subprocess.run([sys.executable, "-c", "import sys; print(sys.stdout.encoding)"],
                               env={**base, **env}, capture_output=True, text=True)
        self.assertEqual(probe.stdout.strip(), "iso8859-1", "the child's terminal is Latin-1")
        for argv in (("run", "triager", "I was charged twice"), ("run", "triager", "--file", str(tickets), "--json")):
            with self.subTest(argv=argv[2]):
                child = subprocess.run([*CLI, *argv], env={**base, **self.env, **env}, cwd=str(REPO),
                                       capture_output=True, timeout=60)
                self.assertNotIn(b"Traceback", child.stderr)
                self.assertEqual(child.returncode, 0, child.stderr.decode("latin-1"))
                self.assertIn(b"We\\u2019ll look into the charge today.", child.stdout)
        self.assertEqual(len(self.index_rows()), 1 + 1 + 3, "every ticket of the batch ran")
        self.assertEqual(self.traces()[-1][-1]["output"]["draft"], DRAFT, "the trace keeps the exact text")


# ---------------------------------------------------------------- what reaches a terminal

class Controls:
    """Class 4 and 5: text from a model, a server or a file is printed with its controls escaped (the
    trace keeps it exact), and JUnit never holds a character XML forbids."""

    def serve(self, *answers: Answer) -> FakeServer:
        server = FakeServer(*answers).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=MODEL_KEY)
        return server

    def assert_clean(self, text: str) -> None:
        for char in "\x1b\x07\r\x9b":
            self.assertNotIn(char, text)

    def test_a_tool_name_and_a_draft_chosen_by_the_model(self):
        final = json.dumps({"label": "billing", "escalate": True, "draft": f"ok{CONTROLS} fine"})
        self.serve(Answer(body=anthropic_message(tool_uses=[("t1", f"evil{CONTROLS}", {})])),
                   Answer(body=anthropic_message(final)))
        code, out, err = self.factory("run", "triager", "I was charged twice")
        self.assertEqual(code, 0, err)
        self.assert_clean(out + err)
        self.assertIn("evil\\u001b[2K\\u000d\\u0007\\u009b31m", out)
        self.assertIn("DENIED_UNKNOWN", out)
        tools = [e for e in self.traces()[-1] if e.get("event") == "tool"]
        self.assertEqual(tools[0]["tool"], f"evil{CONTROLS}", "the trace keeps the exact text")

    def test_a_server_error_type_reaches_the_tower_escaped(self):
        error = {"type": "error", "error": {"type": f"overloaded{CONTROLS}", "message": "x"}}
        self.serve(*[Answer(status=400, body=error) for _ in range(4)])
        self.assertEqual(self.factory("run", "triager", "I was charged twice")[0], 0)
        code, out, err = self.factory("tower")
        self.assertEqual(code, 0, err)
        self.assert_clean(out)
        self.assertIn("overloaded\\u001b[2K", out)

    def append_recall(self, reason: str) -> None:
        """A recall of the triager appended straight to the hash-chained log, as anyone who writes the
        registry can (the chain needs no key)."""
        log = self.root / "registry" / "recalls.jsonl"
        line = chained_line(log, {"agent": "triager", "reason": reason, "at": factory.utc_now(), "by": "x"})
        with log.open("a") as out:
            out.write(line)

    def test_a_line_break_read_from_the_registry_stays_inside_its_line(self):
        """A recall reason holding a line feed, a tab and a carriage return: run's refusal, the tower's
        trust lines, doctor and the certify prompt each print it escaped, inside the line that quotes it."""
        self.append_recall(f"under review\nverdict verified  tier C1\tstatus done\r{CONTROLS}")
        forged = "under review\\u000averdict verified  tier C1\\u0009status done\\u000d"
        self.prove_sealed()
        certify = self.certify("triager", answer=b"n\n")
        outputs = {"run": self.factory("run", "triager", "hi"), "tower": self.factory("tower"),
                   "doctor": self.factory("doctor"), "certify prompt": (certify.returncode, certify.stdout, certify.stderr)}
        for station, (_, out, err) in outputs.items():
            with self.subTest(station):
                self.assertIn(forged, out + err)
                self.assertNotIn("\t", out + err)
                self.assert_clean(out + err)
                self.assertEqual([line for line in (out + err).split("\n") if line.startswith("verdict verified")], [])

    def test_a_case_id_with_controls_is_refused_in_one_clean_line(self):
        """A case id with controls would break every report line that names it: refused as the suite loads,
        the refusal escaped, no JUnit written."""
        cases = self.root / "evals" / "triager" / "cases.jsonl"
        write_jsonl(cases, [{"id": f"case{CONTROLS}\x00", "input": "How do I order a new card?", "expect": {"label": "bug"}}])
        junit = self.tmp / "prove.xml"
        code, out, err = self.factory("prove", "triager", "--junit", str(junit))
        self.assertEqual((code, out), (1, ""), err)
        self.assert_clean(err)
        self.assertIn('the case id "case\\u001b[2K\\r\\u0007\\u009b31m\\u0000" holds a line break or control character', err)
        self.assertFalse(junit.exists())

    def test_controls_in_why_a_case_failed_reach_junit_escaped(self):
        """What XML 1.0 forbids (here in a run's reason, which can quote a model) is written as a visible escape."""
        results = [{"id": "case", "passed": False, "status": "escalated", "reason": f"model said {CONTROLS}\x00",
                    "wrong": {}, "unexpected_denials": [], "rubric_score": None, "seconds": 0.0, "expects_handoff": None,
                    "handed_off": False, "unscorable": False}]
        proof = {"agent": "triager", "half": "open", "at": "2026-01-01T00:00:00Z", "verdict": "UNDER BAR", "passed": False,
                 "score": 0.0, "passing_cases": 0, "cases": 1, "pass_bar": 0.5, "rubric": "none", "rubric_check": "no rubric",
                 "interval": factory.part(0, 1)["interval"], "real": factory.part(0, 1), "synthetic": factory.part(0, 0),
                 "by_source": {}, "by_expected": {}, "label_sources": broker.label_counts([]),
                 "handoff": broker.handoff_figures([], "escalate", None),
                 "backends": ["offline"], "model_required": False, "model_answered": 1, "suite": "triager",
                 "digest": "sha256:" + "0" * 64}
        text = factory.junit_xml(proof, results, 0.1)
        failure = ElementTree.fromstring(text.encode()).find("testsuite/testcase/failure")   # any XML parser accepts it
        self.assertIn("model said \\u001b[2K\r\\u0007\x9b31m\\u0000", failure.get("message"))


# ---------------------------------------------------------------- secrets echoed back

class Secrets:
    """Class 6: a configured secret echoed back by a server is scrubbed from everything written under the
    root and everything printed."""

    def assert_nowhere(self, secret: str, *printed: str) -> None:
        for text in printed:
            self.assertNotIn(secret, text)
        for path, data in snapshot(self.root).items():
            self.assertNotIn(secret.encode(), data, path)

    def gate(self, **script) -> FakeSage:
        sage = FakeSage(**script).start()
        self.addCleanup(sage.close)
        self.env.update(SAGE_ENDPOINT=sage.url, SAGE_API_KEY=SAGE_KEY)
        return sage

    def test_a_gate_that_echoes_the_key(self):
        for label, script in (("200 with a body echoing the authorization header",
                               {"status": 200, "body": f"Authorization: Bearer {SAGE_KEY}"}),
                              ("a yes/no answer equal to the key",
                               {"answer": lambda q, c: {"answer": SAGE_KEY, "probability": 0.9}})):
            with self.subTest(label):
                self.fresh()
                self.gate(**script)
                code, out, err = self.factory("run", "triager", "I was charged twice")
                self.assertEqual(code, 0, err)
                self.assertIn("gate: FAILED", out)
                self.assertIn("[SAGE_API_KEY redacted]", out)
                self.assert_nowhere(SAGE_KEY, out, err, self.factory("tower", "--json")[1])

    def test_a_batch_error_echoing_the_key_into_the_proof(self):
        self.gate(answer=lambda q, c: Fail(f"token {SAGE_KEY} refused") if q["kind"] == "scale" else None)
        junit = self.tmp / "prove.xml"
        code, out, err = self.factory("prove", "triager", "--json", "--junit", str(junit))
        self.assertIn("scoring FAILED", out)
        self.assert_nowhere(SAGE_KEY, out, err, junit.read_text())

    def test_a_worker_header_and_error_body_echoing_the_key(self):
        error = {"type": "error", "error": {"type": "overloaded_error", "message": f"bad key {MODEL_KEY}"}}
        server = FakeServer(Answer(status=200, body=error, headers={"x-request-id": MODEL_KEY}),
                            *[Answer(body=anthropic_message(FINAL), headers={"request-id": f"req-{MODEL_KEY}"})] * 3).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=MODEL_KEY)
        code, out, err = self.factory("run", "triager", "I was charged twice", "--json")
        self.assertEqual(code, 0, err)
        trace = "\n".join(json.dumps(e) for e in self.traces()[-1])
        self.assertIn("[ANTHROPIC_API_KEY redacted]", trace)
        self.assert_nowhere(MODEL_KEY, out, err)

    def test_a_key_echoed_encoded_inside_a_longer_text_is_scrubbed(self):
        """base64 was found only as the key alone encoded: a server echoing its request line `x-api-key: KEY`
        in base64 (the key at another offset of 3 bytes, or followed by more), or the key in upper-case hex,
        wrote what decodes to the key into the trace, the index and stdout."""
        echoes = [base64.b64encode(f"{head}{MODEL_KEY}{tail}".encode()).decode() for head, tail in
                  (("x-api-key: ", ""), ("x-api-key:", "\r\n"), ("", "\r\n"))]
        echoes += [base64.urlsafe_b64encode(f"k={MODEL_KEY}".encode()).decode().rstrip("="), MODEL_KEY.encode().hex().upper()]
        error = {"type": "error", "error": {"type": "overloaded_error", "message": f"you sent {' and '.join(echoes)}"}}
        server = FakeServer(Answer(status=200, body=error, headers={"x-echo": echoes[0], "x-hex": echoes[-1]}),
                            *[Answer(body=anthropic_message(FINAL))] * 3).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=MODEL_KEY)
        code, out, err = self.factory("run", "triager", "I was charged twice", "--json")
        self.assertEqual(code, 0, err)
        self.assertIn("[ANTHROPIC_API_KEY redacted]", "\n".join(json.dumps(e) for e in self.traces()[-1]))
        for echo in echoes:
            self.assertEqual(broker.redact(echo, factory.secret_values({"K_KEY": MODEL_KEY})).count("[K_KEY redacted]"), 1, echo)
            self.assert_nowhere(echo[2:-4], out, err, self.factory("tower", "--json")[1])

    def test_a_key_holding_a_slash_echoed_with_lower_case_hex_or_json_escaped_slashes_is_scrubbed(self):
        """A server echoing a key that holds `/` as %2f (lower-case hex, as RFC 3986 allows) or as JSON's `\\/` (PHP's
        json_encode writes every `/` so) in a body that is not JSON, or in a header, wrote it to the trace."""
        key = "Wb4n/CLAUDE+secret/value88"
        lower = re.sub("%[0-9A-F]{2}", lambda hexed: hexed.group().lower(), urllib.parse.quote(key, safe=""))
        echoes = [lower, json.dumps(key).replace("/", "\\/")[1:-1]]
        server = FakeServer(Answer(status=400, body=f"<p>you sent {echoes[0]} and {echoes[1]}</p>"),   # kept as text
                            *[Answer(body=anthropic_message(FINAL))] * 3).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=key)
        code, out, err = self.factory("run", "triager", "I was charged twice", "--json")
        self.assertEqual(code, 0, err)
        self.assertIn("[ANTHROPIC_API_KEY redacted]", "\n".join(json.dumps(e) for e in self.traces()[-1]))
        for echo in echoes:
            self.assertEqual(factory.redact(echo, factory.secret_values({"K_KEY": key})), "[K_KEY redacted]", echo)
            self.assert_nowhere(echo, out, err, self.factory("tower", "--json")[1])

    def test_a_key_or_endpoint_no_request_can_use_is_refused_at_start_in_one_line(self):
        keys = {"line feed": "sk-abcd\nefgh1234", "carriage return": "sk-abcd\refgh1234", "tab": "sk-abcd\tefgh1234",
                "nul": "sk-abcd\x00efgh1234", "C1 control": "sk-abcd\x9befgh1234", "not latin-1": "sk-abcd\u2019efgh1234",
                "line separator": "sk-abcd\u2028efgh1234", "lone surrogate": "sk-abcd\udcffefgh1234"}
        urls = ("http://[::1", "http://[zz]/v1", f"http://{'ü' * 70}.com", "http://a..b/", "http://x:99999", "http://x:port/",
                "http://x/ü", "ftp://x", "http://", "http:///v1", "http://exa mple", " http://x", "http://x/\n",
                "http://例え.テスト", "http://127.0.0.1\u200b.nip.io", "http://user:hunter2QZ7@[::1", "http://user:hunter2QZ7@x:99999")
        variables = ("ANTHROPIC_API_KEY", "SAGE_API_KEY", "SAGEROUTE_TOKEN", "ANTHROPIC_BASE_URL", "SAGE_ENDPOINT",
                     "HTTPS_PROXY", "https_proxy")   # each class of value meets each variable of its kind in turn
        stations = (("run", "triager", "I was charged twice"), ("prove", "triager"), ("doctor",))
        rows = [(label, variables[i % 3], value) for i, (label, value) in enumerate(keys.items())]
        rows += [(repr(url), variables[3 + i % 4], url) for i, url in enumerate(urls)]
        rows += [("port 0", "HTTPS_PROXY", "http://x:0"), ("port 0", "ANTHROPIC_BASE_URL", "http://127.0.0.1:0/v1"),
                 ("a user and password", "SAGE_ENDPOINT", "http://user:hunter2QZ7@127.0.0.1:9/v1"),   # sent nowhere
                 ("a user", "ANTHROPIC_BASE_URL", "http://me@127.0.0.1:9"),
                 ("one slash, which urllib refuses in a proxy: every run crashed", "https_proxy", "http:/proxy.example:3128"),
                 ("a path in a proxy without its http://, which urllib takes for the port", "HTTPS_PROXY", "proxy.example:3128/")]
        for i, (label, variable, value) in enumerate(rows):
            argv = stations[i % 3]
            with self.subTest(label, variable=variable, station=argv[0]):
                before = snapshot(self.root)
                code, out, err = self.factory(*argv, env={**self.env, variable: value})
                self.assertEqual((code, out), (1, ""), err)
                self.assertRegex(err, rf"^factory {argv[0]}: {variable} [^\n]+\n$")
                self.assertEqual(snapshot(self.root), before, "nothing is written, no run opened")
                if "KEY" in variable or "TOKEN" in variable:
                    self.assertTrue(err.endswith("(its value is not shown)\n"), err)
                    self.assertNotIn("efgh", err)   # nor any escaped form of it: only its name
                self.assertNotIn("hunter2QZ7", err, "a url's password is never shown")
        sage = self.gate()   # white space around a key is not sent; a proxy may be written without http://
        code, out, err = self.factory("run", "triager", "hi", env={**self.env, "https_proxy": "proxy.example:3128",
                                                                    "SAGE_API_KEY": f"  {SAGE_KEY}\n"})
        self.assertEqual((code, sage.requests[-1].headers["authorization"]), (0, f"Bearer {SAGE_KEY}"), err)

    def test_a_setting_of_a_closed_set_outside_it_is_refused_at_start_in_one_line(self):
        rows = (("SAGE_PROTOCOL", "nonsense", "levanto or systemone"), ("SAGE_PROTOCOL", "levanto\u200b", "levanto or systemone"),
                ("SAGE_REASONING", "maybe", "auto, off or on"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "http/protobuf or http/json"))
        tickets = self.tmp / "tickets.jsonl"
        tickets.write_text('{"id": "t1", "input": "I was charged twice"}\n')
        stations = (("run", "triager", "I was charged twice"), ("prove", "triager"), ("run", "triager", "--file", str(tickets)))
        for i, (variable, value, allowed) in enumerate(rows):
            argv = stations[i % len(stations)]
            with self.subTest(variable=variable, value=value, station=argv[0]):
                env = {**self.env, "SAGE_API_KEY": SAGE_KEY, "SAGE_ENDPOINT": "http://127.0.0.1:9",
                       "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", variable: value}
                before = snapshot(self.root)
                code, out, err = self.factory(*argv, env=env)
                self.assertEqual((code, out, err), (1, "", f"factory {argv[0]}: {variable} must be {allowed}, not {value!r}\n"))
                self.assertEqual(snapshot(self.root), before, "nothing is written, no run opened")
        sage = self.gate()   # read as the clients read it: white space around it and its case do not matter
        code, out, err = self.factory("run", "triager", "hi", env={**self.env, "SAGE_PROTOCOL": " Levanto\n", "SAGE_REASONING": "OFF "})
        self.assertEqual((code, sage.requests[-1].body.get("reasoning")), (0, "off"), err)

    def test_an_export_header_no_request_can_carry_fails_the_export_in_one_line_never_showing_it(self):
        self.runs_ok()
        for label, value in (("line feed", "Bearer%20QZ7tok%0Aen"), ("CR LF", "Bearer%20QZ7tok%0D%0AX-Evil:%201"),
                             ("not latin-1", "Bearer%20QZ7tok%E2%82%AC")):
            with self.subTest(label):
                env = {**self.env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                       "OTEL_EXPORTER_OTLP_HEADERS": f"x-ok=1,authorization={value}"}
                code, out, err = self.factory("export", "--all", env=env)
                self.assertEqual((code, err), (1, ""), out)
                self.assertRegex(out, r"\tFAILED \(OTEL_EXPORTER_OTLP_HEADERS: header 'authorization' \(its value not shown\) "
                                      r"holds a (line break|character outside latin-1) \(character \d+ of \d+\), which no http header can carry\)\n$")
                self.assert_nowhere("QZ7tok", out, err)

    def test_a_secret_escaped_into_text_is_scrubbed_from_trace_index_and_output(self):
        token = "ghp_abcd\nefgh1234\u2019/+?"   # a secret the run never sends, so nothing refuses it
        escaped = (json.dumps(token)[1:-1], json.dumps(token, ensure_ascii=False)[1:-1], repr(token)[1:-1],
                   repr(token.encode())[2:-1],   # ... and as a server echoes what it was sent: URL-quoted, base64, hex
                   urllib.parse.quote(token, safe=""), base64.b64encode(token.encode()).decode(), token.encode().hex())
        self.env["GITHUB_TOKEN"] = token
        code, out, err = self.factory("run", "triager", f"my token is {' or '.join(escaped)}, the charge is wrong", "--json")
        self.assertEqual(code, 0, err)
        self.assertEqual(self.traces()[-1][0]["input"].count("[GITHUB_TOKEN redacted]"), len(escaped))
        for text in escaped:
            self.assert_nowhere(text, out, err, self.factory("tower", "--json")[1])


class Harvests(LineTest):
    """Class 8: two harvests at once propose each flagged run once, each proposal naming the flagged run;
    a proposal that cannot be written fails the harvest and leaves the run flagged."""

    def prepare(self):
        for name in ("triager", "evalsmith"):
            self.certified(name)
        for _ in range(2):
            self.runs_ok("triager", INJECTION)   # two flagged runs: a tool was denied

    def test_two_harvests_at_once(self):
        sage = FakeSage(yes_p=0.95, delay=0.3).start()   # a slow gate keeps each harvest's runs open a while
        self.addCleanup(sage.close)
        env = {**os.environ, **self.env, "SAGE_ENDPOINT": sage.url, "SAGE_API_KEY": SAGE_KEY}
        children = [subprocess.Popen([*CLI, "harvest", "triager"], env=env, cwd=str(REPO), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for child in children:
            out, err = child.communicate(timeout=120)
            self.assertEqual(child.returncode, 0, err)
        proposed = [json.loads(line) for line in (self.root / "evals" / "triager" / "proposed.jsonl").read_text().splitlines()]
        flagged = sorted(row["run_id"] for row in self.index_rows() if row["agent"] == "triager")
        self.assertEqual(sorted(case["source_run"] for case in proposed), flagged, "each flagged run proposed once, by its id")

    def test_a_proposal_written_through_a_link_fails_the_harvest(self):
        sage = FakeSage(yes_p=0.95).start()   # evalsmith's gate passes: its proposals are committed
        self.addCleanup(sage.close)
        self.env.update(SAGE_ENDPOINT=sage.url, SAGE_API_KEY=SAGE_KEY)
        outside = self.root / "stray.jsonl"   # inside the root, so harvest may read through it (never write)
        outside.write_text("")
        os.symlink(outside, self.root / "evals" / "triager" / "proposed.jsonl")
        code, out, err = self.factory("harvest", "triager")
        self.assertNotIn("Traceback", err)
        self.assertEqual((code, len(err.strip().splitlines())), (1, 1), err)
        self.assertIn("could not be written", err)
        self.assertEqual(outside.read_text(), "")
        self.assertFalse((self.root / "records" / "triager" / "harvested.jsonl").exists(), "the runs stay flagged")


# ---------------------------------------------------------------- a batch with bad tickets in it

class Batch:
    """Class 9: each bad ticket is refused on its own line and every other ticket runs."""

    def test_bad_tickets_among_good_ones(self):
        tickets = self.tmp / "tickets.jsonl"
        lines = [json.dumps({"id": "good-1", "input": "How do I order a new card?"}),
                 json.dumps({"id": "huge", "input": "a" * (2_200_000)}),
                 '{"id": "torn", "inp',
                 '{"id": "odd", "input": "refund \\udcff"}',
                 json.dumps({"id": "case", "input": "hi", "expect": {"label": "bug"}}),
                 json.dumps({"id": "no-input"}),
                 json.dumps({"id": "good-2", "input": "The app crashes every time I open it."})]
        tickets.write_text("\n".join(lines) + "\n")
        for mode in ((), ("--json",)):
            with self.subTest(mode=mode):
                self.fresh()
                code, out, err = self.factory("run", "triager", "--file", str(tickets), *mode)
                self.check((code, out, err), 1, "5 of 7 ticket(s) refused", {})
                shown = out.splitlines()
                self.assertEqual(len(shown), 7, out)
                rows = [json.loads(line) for line in shown] if mode else None
                verdicts = [r["verdict"] for r in rows] if mode else [line.split("verdict=")[1].split("\t")[0] for line in shown]
                self.assertEqual(verdicts[1:6], [None if mode else "-"] * 5, "a ticket not run has no verdict")
                self.assertNotIn(verdicts[1], (verdicts[0], verdicts[6]))
                self.assertEqual(len(self.index_rows()), 1 + 2, "the good tickets ran")
                text = out if not mode else "\n".join(r["why"][0] for r in rows[1:6])
                for why in ("line 2: longer than 1 mib", "line 4: holds \\udcff",
                            # the line of the file, and the place in it by character: never a second "line"
                            "tickets.jsonl line 3: not valid json (Invalid control character at the end of the line)",
                            "line 5: an eval case with `expect`", "line 6: missing field 'input'"):
                    self.assertIn(why, text)


# ---------------------------------------------------------------- the small ones

class Small:
    """Class 10: an empty --root, names that would print over two lines, ticket shapes blamed on the right
    field, replay of a malformed trace, and an agent that does not exist."""

    def test_small_ones(self):
        tickets = str(self.tmp / "tickets.jsonl")
        trace = lambda: next((self.root / "traces" / "triager").glob("*.jsonl"))  # noqa: E731
        def edit_trace(fn):
            path = trace()
            events = [json.loads(line) for line in path.read_text().splitlines()]
            path.write_text("".join(json.dumps(e) + "\n" for e in fn(events)))
        def model_text_a_number(events):
            return [{**e, "text": 5} if e.get("event") == "model" else e for e in events]
        run_id = lambda: trace().stem  # noqa: E731
        rows = [
            ("--root empty", lambda: None, ("tower", "--root", ""), 2, "--root: is empty"),
            ("--sealed-dir empty", lambda: None, ("prove", "triager", "--sealed-dir", " "), 2, "--sealed-dir: is empty"),
            ("a name with a line break", lambda: None, ("run", "triager\n", "hi"), 2, "triager\\n"),
            ("run nosuch", lambda: None, ("run", "nosuch", "hello"), 1, "no agent named nosuch"),
            ("a ticket without input", lambda: write_jsonl(Path(tickets), [{"id": "a"}]),
             ("run", "triager", "--file", tickets), 1, "1 of 1 ticket(s) refused"),
            ("a replayed trace with a tier C9", lambda: edit_trace(lambda ev: [{**ev[0], "tier": "C9"}] + ev[1:]),
             ("replay", "RUN"), 1, "field 'tier' must be one of C0 C1 C2 C3"),
            ("a replayed trace whose model text is a number", lambda: edit_trace(model_text_a_number),
             ("replay", "RUN"), 1, "field 'text' has the wrong type (int)"),
        ]
        for label, prepare, argv, status, named in rows:
            with self.subTest(label):
                self.fresh()
                prepare()
                argv = tuple(run_id() if a == "RUN" else a for a in argv)
                before = snapshot(self.root)
                self.check(self.factory(*argv), status, named, {})
                self.assertEqual(snapshot(self.root), before, "a refusal writes nothing")
        self.assertEqual(len(rows), 7)

    def test_ticket_refusals_blame_the_right_field(self):
        tickets = self.tmp / "tickets.jsonl"
        for row, why in (({"id": "a"}, "missing field 'input'"), ({"input": "hi"}, "missing field 'id'"),
                         ({"id": "a", "input": "hi", "prio": 1}, "unknown field(s) prio"),
                         ({"id": "a\tb", "input": "hi"}, "field 'id' must be printable text"),
                         ({"id": "a", "input": "  "}, "field 'input' must be visible text"),
                         ({"id": "a", "input": "hi", "expect": {}}, "an eval case with `expect` is not a ticket")):
            with self.subTest(why=why):
                write_jsonl(tickets, [row])
                code, out, _ = self.factory("run", "triager", "--file", str(tickets))
                self.assertEqual(code, 1)
                self.assertIn(f"line 1: {why}", out)
                if "expect" not in row:
                    self.assertNotIn("expect", out)


class PlantedBesideTheScript(LineTest):
    """Files named after standard-library modules planted beside factory.py (where Python would look
    first for a script's imports) never run, in any station started as `python3 factory.py ...`."""

    PLANTED = ("__future__", "textwrap", "ast", "json")
    READING = (("--help",), ("--version",), ("schema",), ("digest", "triager", "--explain"), ("doctor",), ("tower",),
               ("pending",), ("harvest", "triager"), ("new", "faq"), ("stamp", "triager", "--as", "triager-eu"),
               ("approve", "20261130T041500123456Z-1a2b3c", "--by", "alice"),
               ("reject", "20261130T041500123456Z-1a2b3c", "--by", "alice", "--reason", "no"))

    def prepare(self):
        self.set_bar("triager", 0.0)

    def station(self, *argv: str) -> subprocess.CompletedProcess:
        """One station in a child process, started as a user starts it, from the root."""
        return subprocess.run([sys.executable, "factory.py", *argv], capture_output=True, text=True,
                              cwd=str(self.root), env=self.child_env, timeout=120)

    def test_a_planted_module_never_runs(self):
        for name in ("factory.py", "broker.py", "llm.py", "sage.py"):
            shutil.copy2(REPO / name, self.root / name)
        marker = self.tmp / "planted-ran"
        for name in self.PLANTED:
            (self.root / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + ' ')\n")
        scrubbed = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "FACTORY_SEALED_DIR")}
        self.child_env = {**scrubbed, **self.env}
        del self.child_env["FACTORY_ROOT"]     # the root is the folder of factory.py, the planted files' folder
        # the control: a child started from the root with the same environment does import a planted module
        control = subprocess.run([sys.executable, "-c", "import textwrap"], capture_output=True, text=True,
                                 cwd=str(self.root), env=self.child_env, timeout=60)
        self.assertEqual((control.returncode, marker.read_text() if marker.exists() else None), (0, "textwrap "),
                         control.stderr)
        marker.unlink()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            read = dict(zip(self.READING, pool.map(lambda argv: self.station(*argv), self.READING)))
        statuses = {" ".join(argv): done.returncode for argv, done in read.items()}
        self.assertEqual(statuses, {**{" ".join(argv): 0 for argv in self.READING},
                                    "harvest triager": 1, "approve 20261130T041500123456Z-1a2b3c --by alice": 1,
                                    "reject 20261130T041500123456Z-1a2b3c --by alice --reason no": 1},
                         {" ".join(argv): done.stderr[-300:] for argv, done in read.items()})
        self.assertEqual(self.station("prove", "triager", "--sealed").returncode, 0)
        certify = [sys.executable, "factory.py", "certify", "triager", "--tier", "C1", "--by", "alice"]
        self.assertEqual(on_a_terminal(certify, self.root, self.child_env)[0], 0)
        self.assertEqual(self.station("run", "triager", "How do I order a new card?").returncode, 0)
        self.assertEqual(self.station("replay", f"triager/{self.index_rows()[-1]['run_id']}").returncode, 0)
        self.assertEqual(self.station("restamp", "triager").returncode, 0)
        self.assertEqual(self.station("recall", "triager", "--reason", "planted").returncode, 0)
        self.assertFalse(marker.exists(), f"planted modules ran: {marker.read_text() if marker.exists() else ''}")


class HostileMachine(Links, MachineSaysNo, Text, Controls, Secrets, Batch, Small, Hostile):
    """Every class of fault above, against one prepared factory."""


if __name__ == "__main__":
    unittest.main()
