"""Integrity holes closed: code a digest cannot see is refused at load, lineage must agree with the
card it describes, stamps and harvests killed half-way are finished (never lost or doubled), a failed
write is routed to a human and fails the run, and the Store never blocks on a FIFO or writes through
a hard link.

Each test names the attack it repeats; every one of them passed on the code before its fix."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import unittest
from pathlib import Path

import factory
from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.fake_sage import FakeSage
from tests.support import CLI, INJECTION, REPO, CertifiedTest, LineTest, chained_line


class CodeTheDigestCannotSee(LineTest):
    """A module that reaches for code by another road than an import its source names is refused when
    it is loaded, in one line naming the module, the line and the construct."""

    def append_to_triager(self, source: str) -> int:
        """Append source to agents/triager.py; the line number its first line lands on."""
        path = self.root / "agents" / "triager.py"
        text = path.read_text()
        path.write_text(text + source)
        return text.count("\n") + 1

    def test_the_importlib_attack_is_refused_before_it_can_be_proved(self):
        # the attack: a certified module loads agents/style.py by name, so style.py escapes the digest
        (self.root / "agents" / "style.py").write_text("def polish(result):\n    return result\n")
        line = self.append_to_triager("import importlib as _importlib\n_own_rules = rules\n"
                                      "def rules(ticket):\n"
                                      "    return _importlib.import_module('agents.style').polish(_own_rules(ticket))\n")
        for argv in (("prove", "triager", "--sealed"), ("digest", "triager")):
            with self.subTest(argv=argv):
                err = self.refused_writing_nothing(f"agents/triager.py line {line}: import importlib", *argv)
                self.assertIn("the digest does not cover", err)

    def test_each_construct_on_the_list_is_named_with_its_line(self):
        table = [
            ("import importlib.util", "import importlib"),
            ("from importlib import import_module", "from importlib import"),
            ("import runpy", "import runpy"),
            ("import imp", "import imp"),
            ("import pkgutil", "import pkgutil"),
            ("import zipimport", "import zipimport"),
            ("import marshal", "import marshal"),
            ("import pickle", "import pickle"),
            ("import code", "import code"),
            ("import builtins", "import builtins"),
            ("import ctypes", "import ctypes"),
            ("_m = __import__('agents.style')", "__import__"),
            ("exec('x = 1')", "exec"),
            ("_f = eval", "eval"),
            ("_c = compile('1', 'x', 'eval')", "compile"),
            ("import sys\n_m = sys.modules['agents']", "sys.modules"),
            ("import sys as _s\n_s.path.insert(0, 'agents')", "sys.path"),
            ("from sys import meta_path", "from sys import meta_path"),
            ("_b = __builtins__", "__builtins__"),
            ("_k = ().__class__.__base__.__subclasses__()", "__subclasses__"),
            ("_g = rules.__globals__", "__globals__"),
            ("_source = open('agents/style.py').read()", "'agents/style.py'"),
            ("_source = open(file='agents/style.py').read()", "'agents/style.py'"),   # the keyword form
            ("_b = globals()", "globals"),                    # globals()['__builtins__'] is the real one
            ("_b = vars()", "vars"),
            ("_b = locals()", "locals"),
            ("_g = _b['__builtins__']", "'__builtins__'"),
            ("_f = rules.__getattribute__('__globals__')", "'__globals__'"),
            ("import os\n_m = os.sys.modules", "os.sys.modules"),
            ("from os import sys as _s\n_m = _s.modules", "_s.modules"),
            ("import sys\n_m = getattr(sys, 'modules')", "getattr(sys, 'modules')"),
            ("import types\n_f = types.FunctionType(getattr(rules, '__code__'), {})", "'__code__'"),
            ("import pydoc", "import pydoc"),
            ("import shelve", "import shelve"),
        ]
        original = (self.root / "agents" / "triager.py").read_text()
        for source, construct in table:
            with self.subTest(source=source):
                (self.root / "agents" / "triager.py").write_text(original)
                line = self.append_to_triager(source + "\n") + source.count("\n")
                self.refused(f"agents/triager.py line {line}: {construct}", "digest", "triager")

    def test_ordinary_code_still_loads(self):
        self.append_to_triager("import sys\nimport os.path\nfrom pathlib import Path\n_here = os.path.basename(sys.argv[0])\n"
                               "_name = rules.__name__\n_doc = 'see evals/triager.py.md'\n")
        code, out, err = self.factory("digest", "triager")
        self.assertEqual(code, 0, err)

    def test_a_module_inside_the_root_is_not_imported_by_plain_name(self):
        # `import helpers` finds ROOT/helpers.py whenever the root is on Python's path (it is, when it holds
        # factory.py): code the digest does not cover
        (self.root / "helpers.py").write_text("VALUE = 1\n")
        self.append_to_triager("import helpers\n")
        sys.path.insert(0, str(self.root))
        self.addCleanup(sys.path.remove, str(self.root))
        err = self.refused("agents/triager.py", "digest", "triager")
        self.assertIn("helpers.py, inside the factory root", err)
        self.assertNotIn("helpers", sys.modules)

def plant(path: Path, marker_from_file: str) -> None:
    """Append to the module at path top-level code that writes the file `agent-code-ran.STEM` (STEM the
    module's file name without .py) in the folder holding the factory root (found from the module's own
    __file__) with what it saw of the environment: it shows whether, and when, a station executed that module."""
    path.write_text(path.read_text() + (
        "\nimport json as _json, os as _os\nfrom pathlib import Path as _Path\n"
        f"(_Path(__file__).resolve(){marker_from_file} / 'agent-code-ran.{path.stem}').write_text("
        "_json.dumps({'module': __name__, 'sealed_dir': _os.environ.get('FACTORY_SEALED_DIR')}))\n"))


class StationsThatRunNoAgentCode(LineTest):
    """Agent code is executed only by the stations that must run it (prove, run, replay, approve's
    executor, harvest's evalsmith). The others read, hash and check its source and never execute it, so a
    module planted in the working tree does nothing while you look at it (digest --explain), derive from
    it, copy it, certify it, or read the tower. Prepared once: the triager's module and one of its tool
    modules each write a marker file of their own when executed; that code is proved and certified, and stamped."""

    def prepare(self):
        plant(self.root / "agents" / "triager.py", ".parents[2]")
        plant(self.root / "agents" / "tools" / "issues.py", ".parents[3]")
        self.certified("triager")
        self.assertEqual(self.factory("stamp", "triager", "--as", "copy")[0], 0)

    def setUp(self):
        super().setUp()
        self.markers = [self.tmp / "agent-code-ran.triager", self.tmp / "agent-code-ran.issues"]
        self.remove_markers()

    def remove_markers(self) -> None:
        """No marker left from a station run before."""
        for marker in self.markers:
            marker.unlink(missing_ok=True)

    def assert_no_marker(self, message: str) -> None:
        """Neither planted module ran (each marker named for its module, so a check cannot pass on the wrong one)."""
        for marker in self.markers:
            self.assertFalse(marker.exists(), f"{message}: {marker.read_text()}" if marker.exists() else "")

    def test_no_station_that_only_reads_the_code_executes_it(self):
        self.edit_card("triager", owner="someone-else")   # so restamp has a variant to re-derive
        for argv in (("digest", "triager"), ("digest", "triager", "--explain"), ("stamp", "triager", "--as", "other"),
                     ("restamp", "triager"), ("new", "mine", "--from", "triager"), ("digest", "mine"), ("schema",),
                     ("doctor",), ("tower",), ("tower", "--json"), ("pending",)):
            with self.subTest(argv=argv):
                self.remove_markers()
                code, out, err = self.factory(*argv)
                self.assertEqual(code, 0, err)
                self.assert_no_marker(f"{' '.join(argv)} executed agent code")

    def test_certify_signs_without_executing_the_code_it_signs(self):
        self.sign("triager", "C1")
        self.assert_no_marker("certify executed the agent's code")

    def test_the_stations_that_run_the_agent_do_execute_it(self):
        # each marker works: what must run the agent runs both planted modules (with the user's rights; see the README)
        for argv in (("run", "triager", "hi"), ("prove", "triager")):
            with self.subTest(argv=argv):
                self.remove_markers()
                code, out, err = self.factory(*argv)
                self.assertEqual(code, 0, err)
                for marker in self.markers:
                    self.assertTrue(marker.exists(), f"{argv} did not execute the planted code ({marker.name})")

    def test_agent_code_does_not_find_the_sealed_folder_in_the_environment(self):
        # the README's CI recipe once set FACTORY_SEALED_DIR for `prove --sealed` on pull requests, and the
        # proved module read the sealed half from it (defence in depth only: code can read any file you can)
        sealed = self.tmp / "sealed" / "triager"
        sealed.mkdir(parents=True)
        (self.root / "evals" / "triager" / "sealed.jsonl").rename(sealed / "sealed.jsonl")
        env = {**os.environ, **self.env, "FACTORY_SEALED_DIR": str(self.tmp / "sealed")}
        done = subprocess.run([*CLI, "prove", "triager", "--sealed"], env=env, cwd=str(REPO), capture_output=True,
                              text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("[sealed half of triager]", done.stdout)
        for marker in self.markers:
            self.assertEqual(json.loads(marker.read_text())["sealed_dir"], None,
                             f"agent code saw FACTORY_SEALED_DIR ({marker.name})")


class NearMissesReadNoCode(LineTest):
    """`did you mean` is computed from the tool modules' file names and their literal CONTRACTS keys, read
    as text: a module the card does not name is never executed to suggest a near miss."""

    def test_a_planted_tool_module_does_not_run_to_suggest_a_near_miss(self):
        ran = self.tmp / "zz-ran"
        (self.root / "agents" / "tools" / "zz.py").write_text(
            f"from pathlib import Path\nPath({str(ran)!r}).write_text('ran')\n"
            "CONTRACTS = {'zz:zap': {'name': 'zz:zap'}}\n")
        self.edit_card("triager", tools_denied=["Billing:Refund"])
        self.refused("field 'tools_denied': no contract for 'Billing:Refund' (did you mean 'billing:refund'?)",
                     "digest", "triager")
        self.assertFalse(ran.exists(), "agents/tools/zz.py ran, and no card names it")
        self.edit_card("triager", tools_denied=["zzz:zap"])
        self.refused("no contract for 'zzz:zap' (did you mean 'zz:zap'?)", "digest", "triager")
        self.assertFalse(ran.exists(), "agents/tools/zz.py ran, and no card names it")

    def test_a_family_with_no_literal_contracts_is_suggested_by_its_file_name(self):
        (self.root / "agents" / "tools" / "search.py").write_text(
            "CONTRACTS = {name: {'name': name} for name in ('search:web',)}\n")
        self.edit_card("triager", tools_denied=["serch:web"])
        self.refused("no contract for 'serch:web' (did you mean a tool of agents/tools/search.py?)", "digest", "triager")


KILL_AT = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
target, argv = sys.argv[2], sys.argv[3:]
real = {"write": os.write, "link": os.link, "replace": os.replace}
def killed_at(name):
    if str(name).endswith(target):
        os.kill(os.getpid(), signal.SIGKILL)
def write(fd, data):
    killed_at(os.readlink(f"/proc/self/fd/{fd}"))
    return real["write"](fd, data)
def link(src, dst, **kw):
    killed_at(dst)
    return real["link"](src, dst, **kw)
def replace(src, dst, **kw):
    killed_at(dst)
    return real["replace"](src, dst, **kw)
os.write, os.link, os.replace = write, link, replace
import factory
sys.exit(factory.main(argv))
"""


class Lineage(LineTest):
    """A card's own stamped_from and the lineage log's first entry for it must agree: a master is never
    re-derived, a disagreement is refused naming both, and a stamp is never left half-done."""

    def prepare(self):
        self.certified("triager")

    def forge_lineage(self, agent: str, parent: str) -> None:
        """Append one well-formed lineage entry, as anyone who may write registry/ can."""
        log = self.root / "registry" / "lineage.jsonl"
        with log.open("a") as out:
            out.write(chained_line(log, {"agent": agent, "stamped_from": parent, "at": factory.utc_now()}))

    def test_one_forged_line_cannot_make_restamp_overwrite_a_master(self):
        self.forge_lineage("triager", "evalsmith")
        err = self.refused_writing_nothing("masters/triager.json", "restamp", "evalsmith")
        self.assertIn("the log's first entry for it (line 1) says evalsmith", err)
        self.assertIn("the card says no stamped_from (a master, which is never re-derived)", err)

    def test_a_master_with_a_forged_parent_does_not_run_or_prove(self):
        self.forge_lineage("triager", "evalsmith")
        for argv in (("run", "triager", "hi"), ("prove", "triager"), ("certify", "triager", "--tier", "C1", "--by", "alice")):
            with self.subTest(argv=argv):
                self.refused_writing_nothing("masters/triager.json and registry/lineage.jsonl disagree", *argv)

    def test_a_card_that_names_another_master_than_the_log_is_refused_naming_both(self):
        self.assertEqual(self.factory("stamp", "triager", "--as", "v2")[0], 0)
        self.edit_card("v2", stamped_from="evalsmith")
        for argv in (("restamp", "triager"), ("restamp", "evalsmith"), ("prove", "v2")):
            with self.subTest(argv=argv):
                err = self.refused_writing_nothing("masters/v2.json and registry/lineage.jsonl disagree", *argv)
                self.assertIn("the card says stamped from evalsmith", err)
                self.assertIn("(line 1) says triager", err)

    def test_a_stamp_killed_before_its_lineage_entry_leaves_no_variant(self):
        kill_at(self, "lineage.jsonl", "stamp", "triager", "--as", "v2", "--set", "evals.suite=triager")
        self.assertFalse((self.root / "masters" / "v2.json").exists(), "a variant the lineage log does not know")

    def test_a_stamp_killed_before_its_card_is_finished_by_stamping_again(self):
        kill_at(self, "v2.json", "stamp", "triager", "--as", "v2")
        self.assertFalse((self.root / "masters" / "v2.json").exists())
        self.assertIn('"agent":"v2"', (self.root / "registry" / "lineage.jsonl").read_text())
        code, out, err = self.factory("restamp", "triager")
        self.assertEqual(code, 0, err)
        self.assertIn("skipped 1 variant(s) the lineage log knows but that have no card", out)
        code, out, err = self.factory("stamp", "triager", "--as", "v2")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads((self.root / "masters" / "v2.json").read_text())["stamped_from"], "triager")
        self.assertEqual(self.factory("prove", "v2")[0], 0)
        self.refused_writing_nothing("v2 was stamped from triager before", "stamp", "evalsmith", "--as", "v2")

    def test_a_card_with_no_lineage_entry_is_a_half_done_stamp(self):
        # what a stamp killed between its card and its lineage entry left behind before the writes were ordered
        self.assertEqual(self.factory("stamp", "triager", "--as", "v2")[0], 0)
        (self.root / "registry" / "lineage.jsonl").unlink()
        self.fac.anchor_path.unlink()   # ... and before this machine kept an anchor (it would refuse the cut log)
        finish = "finish it with: python3 factory.py stamp triager --as v2"
        for argv in (("prove", "v2", "--sealed"), ("certify", "v2", "--tier", "C1", "--by", "alice"), ("restamp", "triager")):
            with self.subTest(argv=argv):
                err = self.refused_writing_nothing("masters/v2.json says v2 was stamped from triager, but "
                                                   "registry/lineage.jsonl has no entry for it", *argv)
                self.assertIn(finish, err)
        code, out, err = self.factory("recall", "triager", "--reason", "bad triage")
        self.assertEqual(code, 0, err)
        self.assertIn("['v2']", out, "a recall reaches every card stamped from the agent, lineage or not")
        self.refused_writing_nothing("finish it as it was written, with no --set", "stamp", "triager", "--as", "v2",
                                     "--set", "owner=x")
        code, out, err = self.factory("stamp", "triager", "--as", "v2")
        self.assertEqual(code, 0, err)
        self.assertIn("finished the stamp of v2 from triager", out)
        self.assertEqual(self.factory("prove", "v2")[0], 0)


class HonestEffects(CertifiedTest):
    """A run whose effect could not be written (or read back) ends uncertain-effect: it is routed to a
    human, its output names the path and the cause, and `run` exits 1, as for a crashed run."""

    def run_with_a_passing_gate(self, *argv: str) -> tuple:
        with FakeSage(yes_p=0.95) as gate:
            self.env.update(SAGE_ENDPOINT=gate.url, SAGE_API_KEY="sage-key")
            return self.factory("run", "triager", *argv)

    def link_the_outbox_out(self) -> None:
        """outbox/triager is a link to a folder outside the root: the Store refuses to write through it."""
        (self.tmp / "elsewhere").mkdir()
        (self.root / "outbox").mkdir(exist_ok=True)
        os.symlink(self.tmp / "elsewhere", self.root / "outbox" / "triager")

    def test_a_failed_write_is_routed_to_a_human_and_fails_the_run(self):
        self.link_the_outbox_out()
        code, out, err = self.run_with_a_passing_gate("How do I change my address?")
        self.assertEqual(code, 1, out + err)
        self.assertNotIn("passed: no human needed.", out)
        self.assertIn("routed to a human: issues:label write FAILED (StoreError: outbox/triager: is a symbolic link", out)
        self.assertIn("verdict uncertain-effect", out)
        self.assertEqual(err.splitlines(), ["factory run: 1 run(s) ended uncertain-effect: an effect was not written or "
                                            "not read back; a human reconciles it (each run's output says where)"])
        row = self.index_rows()[-1]
        self.assertEqual((row["verdict"], row["routed"]), ("uncertain-effect", True))
        self.assertTrue(any("outbox/triager" in why for why in row["why"]), row["why"])
        code, out, err = self.run_with_a_passing_gate("--json", "How do I change my address?")
        self.assertEqual(code, 1, err)
        shown = json.loads(out)
        self.assertEqual((shown["verdict"], shown["routed"]), ("uncertain-effect", True))
        self.assertIn("drafts:write write FAILED (StoreError: outbox/triager: is a symbolic link", "; ".join(shown["why"]))

    def test_a_tickets_file_with_an_uncertain_effect_exits_1_and_says_which(self):
        self.link_the_outbox_out()
        tickets = self.tmp / "tickets.jsonl"
        tickets.write_text(json.dumps({"id": "t-1", "input": "How do I change my address?"}) + "\n")
        code, out, err = self.run_with_a_passing_gate("--file", str(tickets))
        self.assertEqual(code, 1, err)
        self.assertIn("verdict=uncertain-effect\t-> routed to a human: issues:label write FAILED", out)
        self.assertIn("1 run(s) ended uncertain-effect", err)


def kill_at(test: LineTest, target: str, *argv: str) -> None:
    """Run a station in a child process that is SIGKILLed at its first write to a file named TARGET."""
    child = subprocess.run([sys.executable, "-c", KILL_AT, str(REPO), target, *argv], capture_output=True, text=True,
                           env={**os.environ, **test.env}, timeout=120)
    test.assertEqual(child.returncode, -signal.SIGKILL, child.stderr)


class HalfDoneHarvests(LineTest):
    """A harvest killed between a proposal and its harvested.jsonl line does not propose that run again;
    a run killed mid-way (started, never closed) is harvested too, once, from its trace header, and a run
    still going is left for a later harvest."""

    def prepare(self):
        for name in ("triager", "evalsmith"):
            self.certified(name)

    def setUp(self):
        super().setUp()
        sage = FakeSage(yes_p=0.95).start()   # evalsmith's gate passes: its proposals are committed
        self.addCleanup(sage.close)
        self.env.update(SAGE_ENDPOINT=sage.url, SAGE_API_KEY="sage-key")

    def proposed(self) -> list[dict]:
        path = self.root / "evals" / "triager" / "proposed.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def test_a_harvest_killed_after_its_proposal_does_not_propose_the_run_again(self):
        self.runs_ok("triager", INJECTION)   # flagged: a tool was denied
        kill_at(self, "harvested.jsonl", "harvest", "triager")
        self.assertEqual(len(self.proposed()), 1)
        code, out, err = self.factory("harvest", "triager")
        self.assertEqual(code, 0, err)
        self.assertIn("proposed 0 case(s)", out)
        self.assertIn("1 already proposed by a harvest that stopped half-way (now recorded as harvested)", out)
        self.assertEqual(len(self.proposed()), 1, "the run was proposed twice")
        self.assertIn("harvested 0 flagged run(s)", self.factory("harvest", "triager")[1])

    def test_a_run_killed_mid_way_is_harvested_once_from_its_trace_header(self):
        text = "I was charged twice for my card, please look"
        del self.env["SAGE_API_KEY"]          # the run's drafts go to the review queue: killed there
        kill_at(self, "review.jsonl", "run", "triager", text)
        self.assertIn("gate", [event.get("event") for event in self.traces()[0]],
                      "a review row was written before its run's gate event reached the trace")
        self.env["SAGE_API_KEY"] = "sage-key"
        started = [row for row in self.index_lines() if row.get("state") == "started"]
        self.assertEqual((len(started), self.index_rows()), (1, []), "the run is unfinished")
        code, out, err = self.factory("harvest", "triager")
        self.assertEqual(code, 0, err)
        self.assertIn("harvested 1 flagged run(s) of triager; proposed 1 case(s)", out)
        self.assertEqual([(case["input"], case["source_run"]) for case in self.proposed()], [(text, started[0]["run_id"])])
        self.assertIn("harvested 0 flagged run(s)", self.factory("harvest", "triager")[1])
        self.assertEqual(len(self.proposed()), 1)

    def test_a_run_still_going_is_left_for_a_later_harvest(self):
        del self.env["SAGE_API_KEY"]
        kill_at(self, "review.jsonl", "run", "triager", "I was charged twice for my card, please look")
        self.env["SAGE_API_KEY"] = "sage-key"
        run_id = [row for row in self.index_lines() if row.get("state") == "started"][0]["run_id"]
        with (self.root / "traces" / "triager" / f"{run_id}.jsonl").open("a") as trace:
            fcntl.flock(trace, fcntl.LOCK_EX)   # as the run's own process holds it while the run goes on
            code, out, err = self.factory("harvest", "triager")
        self.assertEqual(code, 0, err)
        self.assertIn("harvested 0 flagged run(s)", out)
        self.assertIn("1 unfinished run(s) still being written, left for a later harvest", out)
        self.assertIn("proposed 1 case(s)", self.factory("harvest", "triager")[1])


class FilesTheStoreWillNotTouch(CertifiedTest):
    """A FIFO where the Store reads (a key file) is refused at once, never waited on; a file with another
    hard link is never appended to or rewritten (the other name may be outside the root)."""

    def station(self, *argv: str) -> subprocess.CompletedProcess:
        """A station in a child process, bounded: a station that blocks on a FIFO fails the test, never hangs it."""
        return subprocess.run([*CLI, *argv], capture_output=True, text=True, env={**os.environ, **self.env},
                              cwd=str(REPO), timeout=30)

    def test_a_fifo_at_a_key_path_is_refused_not_waited_on(self):
        for key, argv in (("_evidence.key", ("prove", "triager")), ("alice.key", ("run", "triager", "hi"))):
            with self.subTest(key=key):
                self.setUp()
                keys = self.tmp / "keys"
                (keys / key).unlink()
                os.mkfifo(keys / key, 0o600)
                try:
                    done = self.station(*argv)
                except subprocess.TimeoutExpired:
                    self.fail(f"{argv[0]} waited on the FIFO at {key}")
                self.assertEqual(done.returncode, 1, done.stdout[-300:] + done.stderr)
                self.assertEqual(len(done.stderr.splitlines()), 1, done.stderr)
                self.assertIn(f"{keys / key}: not a regular file", done.stderr)

    def test_a_hard_link_is_never_written_through(self):
        rows = [("traces/index.jsonl", ("run", "triager", "hi")),
                ("registry/recalls.jsonl", ("recall", "triager", "--reason", "bad triage")),
                ("masters/v2.json", ("restamp", "triager"))]
        for relative, argv in rows:
            with self.subTest(path=relative):
                self.setUp()
                target, outside = self.root / relative, self.tmp / "outside"
                if relative == "masters/v2.json":   # restamp rewrites v2's card when its master changed
                    self.assertEqual(self.factory("stamp", "triager", "--as", "v2")[0], 0)
                    self.edit_card("triager", owner="a new lead")
                    target.rename(outside)
                else:
                    outside.write_bytes(target.read_bytes() if target.exists() else b"")
                    target.unlink(missing_ok=True)
                before = outside.read_bytes()
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(outside, target)
                err = self.refused(f"{target.relative_to(self.root)}: has 2 hard links", *argv)
                self.assertIn("never writes through one", err)
                self.assertEqual(outside.read_bytes(), before, "written through the hard link")


    def test_the_index_handle_a_station_keeps_is_let_go_once_the_file_has_another_name(self):
        """run --file keeps the index's handle from row to row: a hard link made to the index, or traces/ moved
        out of the root and a link left in its place, while ticket 2's model answers, and its closed row is
        refused as a fresh open refuses it, never written through (the server holds the answer until then)."""
        final = json.dumps({"label": "account", "escalate": False, "draft": "We are on it."})
        tickets = self.tmp / "tickets.jsonl"
        tickets.write_text("".join(json.dumps({"id": f"t{i}", "input": "How do I order a new card?"}) + "\n" for i in (1, 2)))
        for how in ("hard link", "folder link"):
            with self.subTest(how):
                self.setUp()
                reached, go = threading.Event(), threading.Event()
                class Held(FakeServer):
                    def take(self, record):
                        if len(self.requests) == 1:   # ticket 2's call
                            reached.set()
                            go.wait(60)
                        return super().take(record)
                server = Held(*[Answer(body=anthropic_message(final)) for _ in range(2)]).start()
                self.addCleanup(server.close)
                env = {**os.environ, **self.env, "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-test"}
                child = subprocess.Popen([*CLI, "run", "triager", "--file", str(tickets), "--jobs", "1"], env=env, cwd=str(REPO),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                self.addCleanup(lambda: child.poll() is None and child.kill())
                self.assertTrue(reached.wait(60), "ticket 2 never asked its model")
                index = self.root / "traces" / "index.jsonl"
                if how == "hard link":
                    other = self.tmp / "other.jsonl"
                    os.link(index, other)
                else:
                    (self.root / "traces").rename(self.tmp / "elsewhere")
                    (self.root / "traces").symlink_to(self.tmp / "elsewhere")
                    other = self.tmp / "elsewhere" / "index.jsonl"
                before = other.read_bytes()
                go.set()
                out, err = child.communicate(timeout=120)
                self.assertEqual(other.read_bytes(), before, f"a row was written through the {how}: {err}")
                self.assertEqual(child.returncode, 1, err)
                self.assertIn("has 2 hard links" if how == "hard link" else "traces: is a symbolic link", err.splitlines()[-1])


if __name__ == "__main__":
    unittest.main()
