"""`new NAME`: an agent of your own that proves, certifies and runs with no hand edits, from scratch or
from a copy; a name already in use is refused before anything is written, the files are written all
or none, and no other agent's certificate is touched."""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import broker
import factory
from tests.support import REPO, SHIPPED, LineTest, copy_shipped, snapshot
from tests.test_integrity import kill_at
from tests.support import wait_until

NEW_FILES = ("masters/faq.json", "agents/faq.py", "agents/tools/faq.py", "evals/faq/cases.jsonl", "evals/faq/sealed.jsonl")
# A station in a child process that stops just before it links a file named TARGET into place (its temporary
# file written), writes FLAG, and goes on once FLAG.go exists.
PAUSE_AT = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
flag, target, argv = sys.argv[2], sys.argv[3], sys.argv[4:]
real = os.link
def link(src, dst, **kw):
    if str(dst).endswith(target):
        open(flag, "w").close()
        while not os.path.exists(flag + ".go"):
            time.sleep(0.01)
    return real(src, dst, **kw)
os.link = link
import factory
sys.exit(factory.main(argv))
"""


class NewAgent(LineTest):
    """`new faq` with no options, then the whole line: prove both halves, certify, run."""

    def prepare(self):
        code, out, err = self.factory("new", "faq")
        self.assertEqual(code, 0, err)
        self.created = out

    def card(self, name: str = "faq") -> dict:
        return json.loads((self.root / "masters" / f"{name}.json").read_text())

    def test_it_writes_the_card_module_tools_and_both_halves(self):
        for path in NEW_FILES:
            self.assertTrue((self.root / path).is_file(), path)
        code, out, err = self.factory("new", "faq2")
        self.assertEqual(code, 0, err)
        for path in ("masters/faq2.json", "agents/faq2.py", "agents/tools/faq2.py", "evals/faq2/cases.jsonl"):
            self.assertIn(f"  {path} ", out)
        self.assertIn("next: python3 factory.py prove faq2; then prove faq2 --sealed", out)

    def test_the_card_has_every_field_and_is_valid(self):
        card = self.card()
        fields = {f.name.split(".")[0] for f in factory.CARD_SCHEMA} - set(factory.SET_BY_STAMP)
        self.assertEqual(set(card), fields)
        self.assertEqual(set(card["evals"]), {"pass_bar", "gate", "suite"})
        self.assertEqual(set(card["model"]), {"primary", "fallback"})
        self.assertEqual(factory.card_problems(card, "faq"), [])
        self.assertEqual((card["tools"], card["tools_denied"], card["tier_ceiling"], card["owner"]),
                         (["faq:lookup", "faq:draft"], [], "C1", "tester"))
        self.assertEqual((card["max_steps"], card["approval_expiry_hours"], card["handoff_field"]), (8, 24, "escalate"))
        documented = broker.fields_in("")
        self.assertEqual({key: documented[key].default for key in broker.CARD_DEFAULTS},
                         {key: str(value) for key, value in broker.CARD_DEFAULTS.items()}, "the defaults the schema documents")

    def test_with_user_unset_the_owner_is_the_login_name(self):
        del self.env["USER"]
        code, _, err = self.factory("new", "faq4")
        self.assertEqual(code, 0, err)
        self.assertEqual(self.card("faq4")["owner"], getpass.getuser())

    def test_a_proof_names_a_tool_the_rules_mistyped_and_says_when_nothing_answered(self):
        module = self.root / "agents" / "faq.py"
        written = module.read_text()
        module.write_text(written.replace('calls = [("faq:lookup", ', 'calls = [("faq:lookp", ', 1))
        code, out, _ = self.factory("prove", "faq")
        self.assertEqual(code, 3, out)
        self.assertIn("  failed o-1: denied ['faq:lookp']; 'faq:lookp' is no tool of this agent (did you mean "
                      "'faq:lookup'?)\n", out)
        module.write_text(written.replace("\ndef rules(", "\ndef rules(*args):\n    raise RuntimeError('boom')\n\n\n"
                                                          "def old_rules(", 1))
        code, out, _ = self.factory("prove", "faq")
        self.assertEqual(code, 3, out)
        self.assertIn("  real cases: none   synthetic 0/20 = 0.00 [0.00, 0.17]   backends: none answered\n", out)

    def test_its_tools_are_one_read_and_one_draft_in_its_own_module(self):
        agent = factory.load_agent(self.fac, "faq")
        self.assertEqual({name: c["effect"] for name, c in agent.contracts.items()}, {"faq:lookup": "read", "faq:draft": "draft"})
        self.assertIn("tool code agents/tools/faq.py", agent.components)

    def test_it_proves_certifies_and_runs_with_no_hand_edits(self):
        for half in ([], ["--sealed"]):
            with self.subTest(half=half):
                code, out, err = self.factory("prove", "faq", *half, "--json")
                self.assertEqual(code, 0, err)
                proof = json.loads(out)
                self.assertEqual((proof["verdict"], proof["passing_cases"], proof["tool_denials"], proof["backends"]),
                                 ("PASS WITHOUT RUBRIC", proof["cases"], 0, ["offline"]))
        self.sign("faq", "C1")
        code, out, err = self.factory("run", "faq", "What are your opening hours?", "--json")
        self.assertEqual(code, 0, err)
        row = json.loads(out)
        self.assertEqual(row["output"], {"topic": "hours", "draft": "We are open Monday to Friday, 9:00 to 17:00.",
                                         "escalate": False})
        self.assertEqual(row["tools"], [["faq:lookup", "ok"], ["faq:draft", "HELD"]])
        [trace] = self.traces("faq")
        [lookup] = [e for e in trace if e.get("event") == "tool" and e["tool"] == "faq:lookup"]
        [result] = [e for e in trace if e.get("event") == "tool_result" and e["seq"] == lookup["seq"]]
        self.assertEqual((lookup["effect"], result["content"]), ("read", "We are open Monday to Friday, 9:00 to 17:00."))

    def test_tool_code_that_fails_or_exits_at_a_runs_first_read_crashes_the_run(self):
        """The tools are made at a run's first read: a make_tools that fails then is a broken tool module, not
        the read's failure, and a sys.exit in tool code ends that run, not the station."""
        path = self.root / "agents" / "tools" / "faq.py"
        shipped = path.read_text()
        at_run = "    if getattr(write, '__name__', '') != 'refuse_to_write':   # not while the card is checked\n"
        for edit, reason in (
                (("-> dict:\n", f"-> dict:\n{at_run}        raise RuntimeError('make_tools broke')\n"), "RuntimeError: make_tools broke"),
                (("-> dict:\n", f"-> dict:\n{at_run}        raise SystemExit(0)\n"), "SystemExit: 0"),
                (("    def lookup(args: dict) -> str:\n", "    def lookup(args: dict) -> str:\n        raise SystemExit(0)\n"),
                 "SystemExit: 0")):
            with self.subTest(edit=edit[1]):
                path.write_text(shipped.replace(*edit, 1))
                self.prove_sealed("faq")
                self.sign("faq", "C1")
                code, out, err = self.factory("run", "faq", "What are your opening hours?", "--json")
                self.assertEqual(code, 1, err)
                row = json.loads(out)
                self.assertEqual((row["status"], row["verdict"]), ("crashed", "crashed"))
                self.assertTrue(row["reason"].startswith(reason + " (agents/tools/faq.py line "), row["reason"])
                trace = self.traces("faq")[-1]
                [crash] = [event for event in trace if event.get("event") == "crash"]
                self.assertIn(reason, crash["traceback"])
                self.assertEqual([event for event in trace if event.get("event") == "tool"], [], "no call failed")

    def test_a_trace_moved_away_while_the_run_writes_it_is_named_at_close(self):
        path = self.root / "agents" / "tools" / "faq.py"
        move = ("        trace = root / 'traces' / agent / (run_id + '.jsonl')\n"
                "        if trace.exists():   # not while proving\n"
                "            trace.rename(trace.with_suffix('.moved'))\n")
        path.write_text(path.read_text().replace("    def lookup(args: dict) -> str:\n", "    def lookup(args: dict) -> str:\n" + move, 1))
        self.prove_sealed("faq")
        self.sign("faq", "C1")
        code, out, err = self.factory("run", "faq", "What are your opening hours?", "--json")
        self.assertEqual(code, 0, err)
        row = json.loads(out)
        moved = f"the trace was moved away from traces/faq/{row['run_id']}.jsonl while the run wrote it"
        self.assertEqual((row["verdict"], row["reason"]), ("unscored", "answered; " + moved))
        self.assertEqual(err.splitlines(), [f"factory: note: run {row['run_id']}: {moved}; its later events went to the file that was moved, or were lost with it if it was deleted or replaced"])
        self.assertEqual(self.index_rows()[-1]["reason"], "answered; " + moved)
        away = self.root / "traces" / "faq" / f"{row['run_id']}.moved"
        self.assertEqual(json.loads(away.read_text().splitlines()[-1])["reason"], "answered; " + moved)

    def test_anything_else_goes_to_a_human(self):
        self.prove_sealed("faq")
        self.sign("faq", "C1")
        code, out, err = self.factory("run", "faq", "Please transfer 500 dollars to my brother.", "--json")
        row = json.loads(out)
        self.assertEqual((row["output"]["topic"], row["output"]["escalate"], row["routed"]), ("none", True, True))
        self.assertEqual(row["tools"], [["faq:draft", "HELD"]])


class ExampleTools(LineTest):
    """--tools picks which example tools the agent gets; its rules call only those, and it proves."""

    def test_each_choice_proves_on_both_halves(self):
        for name, tools, made in (("r", "read", ["r:lookup"]), ("d", "draft", ["d:draft"]),
                                  ("rd", "draft,read", ["rd:lookup", "rd:draft"])):
            with self.subTest(tools=tools):
                code, _, err = self.factory("new", name, "--tools", tools)
                self.assertEqual(code, 0, err)
                card = json.loads((self.root / "masters" / f"{name}.json").read_text())
                self.assertEqual(card["tools"], made)
                self.assertEqual(sorted(factory.load_agent(self.fac, name).contracts), sorted(made))
                for half in ([], ["--sealed"]):
                    code, out, err = self.factory("prove", name, *half, "--json")
                    self.assertEqual((code, json.loads(out)["tool_denials"]), (0, 0), out + err)

    def test_the_sealed_half_goes_where_sealed_halves_live(self):
        sealed = self.tmp / "sealed"
        sealed.mkdir()
        self.env["FACTORY_SEALED_DIR"] = str(sealed)
        code, out, err = self.factory("new", "faq")
        self.assertEqual(code, 0, err)
        self.assertIn(f"  {sealed}/faq/sealed.jsonl ", out)
        self.assertFalse((self.root / "evals" / "faq" / "sealed.jsonl").exists())
        self.assertEqual(self.factory("prove", "faq", "--sealed")[0], 0)

    def test_a_hyphen_becomes_an_underscore_in_its_modules(self):
        code, out, err = self.factory("new", "faq-bot")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads((self.root / "masters" / "faq-bot.json").read_text())["entrypoint"], "faq_bot:rules")
        self.assertTrue((self.root / "agents" / "tools" / "faq_bot.py").is_file())
        self.assertEqual(self.factory("prove", "faq-bot", "--sealed")[0], 0)

    def test_bad_options_are_usage_errors(self):
        for expected, argv in (("not a name for a new agent", ["new", "Faq"]),
                               ("not a name for a new agent", ["new", "tools"]),
                               ("the example tools are read and draft", ["new", "faq", "--tools", "write"]),
                               ("the example tools are read and draft", ["new", "faq", "--tools", ""]),
                               ("'act': the example tools are read and draft, e.g. read,draft; for an acting tool, copy "
                                "billing:refund from agents/tools/billing.py (effect act, its amounts_usd declared)",
                                ["new", "faq", "--tools", "act"]),
                               ("a copy (--from) has its source's tools", ["new", "faq", "--from", "triager", "--tools", "read"]),
                               ("too long to name its tool module", ["new", "a" * 33])):
            with self.subTest(argv=argv):
                self.usage_error(expected, *argv)


class FromACopy(LineTest):
    """--from triager copies its module, card (same grants) and open half, never its sealed half."""

    def test_a_copy_of_the_triager(self):
        sealed = self.tmp / "sealed"
        (sealed / "triager").mkdir(parents=True)
        (sealed / "triager" / "sealed.jsonl").write_bytes((self.root / "evals" / "triager" / "sealed.jsonl").read_bytes())
        self.env["FACTORY_SEALED_DIR"] = str(sealed)
        code, out, err = self.factory("new", "tri2", "--from", "triager")
        self.assertEqual(code, 0, err)
        module = (self.root / "agents" / "tri2.py").read_bytes()
        self.assertTrue(module.endswith((self.root / "agents" / "triager.py").read_bytes()))
        self.assertTrue(module.startswith(b"# copied from agents/triager.py by `python3 factory.py new tri2 --from triager`\n"))
        original, card = (json.loads((self.root / "masters" / f"{n}.json").read_text()) for n in ("triager", "tri2"))
        self.assertEqual((card["tools"], card["tools_denied"], card["draft_rubric"], card["model"]),
                         (original["tools"], original["tools_denied"], original["draft_rubric"], original["model"]))
        self.assertEqual((card["entrypoint"], card["evals"]["suite"], card["identity"], card["owner"]),
                         ("tri2:rules", "tri2", "svc-tri2@support", "tester"))
        self.assertEqual(factory.card_problems(card, "tri2"), [])
        self.assertEqual((self.root / "evals" / "tri2" / "cases.jsonl").read_bytes(),
                         (self.root / "evals" / "triager" / "cases.jsonl").read_bytes())
        self.assertFalse((sealed / "tri2").exists(), "the sealed half is never copied")
        self.assertFalse((self.root / "agents" / "tools" / "tri2.py").exists())
        self.assertIn("write its own sealed half", out)
        self.assertEqual(self.factory("prove", "tri2")[0], 0)
        self.refused("tri2/sealed.jsonl: no such file; a suite needs cases before it can prove anything", "prove", "tri2", "--sealed")

    def test_a_copy_of_a_variant_is_a_master_of_its_own(self):
        self.assertEqual(self.factory("stamp", "triager", "--as", "tri-eu", "--set", "owner=eu-lead")[0], 0)
        code, _, err = self.factory("new", "tri3", "--from", "tri-eu")
        self.assertEqual(code, 0, err)
        card = json.loads((self.root / "masters" / "tri3.json").read_text())
        self.assertFalse(set(card) & set(factory.SET_BY_STAMP))
        self.assertNotIn("tri3", factory.parents(self.fac))

    def test_no_such_source(self):
        self.refused_writing_nothing("factory new: no agent named nosuch to copy (no masters/nosuch.json); --from names "
                                     "an agent that has a card, or leave it out to make faq from nothing\n",
                                     "new", "faq", "--from", "nosuch")
        self.refused_writing_nothing("no agent named trager to copy (no masters/trager.json) (did you mean 'triager'?)",
                                     "new", "faq", "--from", "trager")

    def test_the_next_step_names_the_root_it_was_given(self):
        other = self.tmp / "other root"
        shutil.copytree(self.root, other, ignore=shutil.ignore_patterns("faq*"))
        code, out, err = self.factory("new", "faq3", "--root", str(other))
        self.assertEqual(code, 0, err)
        self.assertIn(f"next: python3 factory.py prove faq3 --root '{other}'; then prove faq3 --sealed", out)
        self.assertTrue((other / "masters" / "faq3.json").exists())


class NameTaken(LineTest):
    """A name whose card, module, tool module or either half of its suite exists, or that the lineage
    log gives a master, is refused before anything is written."""

    def test_each_file_in_the_way_is_named_and_nothing_is_written(self):
        for path in NEW_FILES:
            with self.subTest(path=path):
                blocker = self.root / path
                blocker.parent.mkdir(parents=True, exist_ok=True)
                blocker.write_text("{}\n")
                said = "; pick a new name" if path.startswith("masters/") else " and is not what this `new faq` writes there"
                self.refused_writing_nothing(f"{path} already exists{said}", "new", "faq")
                blocker.unlink()

    def test_an_existing_agent_and_a_former_variant(self):
        self.refused_writing_nothing("masters/triager.json already exists", "new", "triager")
        self.refused_writing_nothing("agents/tools/drafts.py already exists", "new", "drafts")
        self.assertEqual(self.factory("stamp", "triager", "--as", "old")[0], 0)
        (self.root / "masters" / "old.json").unlink()   # the card is gone; its lineage entry is not
        self.refused_writing_nothing("old was stamped from triager before", "new", "old")


class KilledNew(LineTest):
    """`new` killed part-way (SIGKILL at a write: nothing of its own cleans up) leaves files and no card;
    the same command finishes the agent, and never overwrites a file holding anything else."""

    def temporary_files(self) -> list[str]:
        """The temporary files in the root, as paths inside it."""
        return sorted(str(path.relative_to(self.root)) for path in self.root.rglob(".*.tmp"))

    def test_killed_before_its_suite_or_its_card_it_is_finished_by_running_it_again(self):
        for target, left in (("cases.jsonl", "evals/faq/.cases.jsonl."), ("faq.json", "masters/.faq.json.")):
            with self.subTest(killed_at=target):
                kill_at(self, target, "new", "faq")
                self.assertTrue((self.root / "agents" / "faq.py").is_file())
                self.assertFalse((self.root / "masters" / "faq.json").exists())
                self.assertEqual([path[:len(left)] for path in self.temporary_files()], [left])   # killed mid-write
                code, out, err = self.factory("new", "faq")
                self.assertEqual(code, 0, err)
                self.assertIn("created faq, finishing a `new faq` that stopped part-way (", out)
                self.assertIn("; 1 temporary file it left was removed):", out)
                self.assertEqual(self.temporary_files(), [])
                for path in NEW_FILES:
                    self.assertIn(path, out)
                    self.assertTrue((self.root / path).is_file(), path)
                self.assertEqual(self.factory("prove", "faq")[0], 0)
                self.refused("masters/faq.json already exists; pick a new name", "new", "faq")
                for path in NEW_FILES:
                    (self.root / path).unlink()

    def test_a_file_that_is_not_what_new_writes_is_named_and_kept(self):
        kill_at(self, "cases.jsonl", "new", "faq")
        module = self.root / "agents" / "faq.py"
        module.write_text(module.read_text() + "# my own edit\n")
        self.refused_writing_nothing("agents/faq.py already exists and is not what this `new faq` writes there; "
                                     "pick a new name, or move it away (nothing was written)", "new", "faq")
        self.assertTrue(module.read_text().endswith("# my own edit\n"))
        module.write_text(module.read_text().removesuffix("# my own edit\n"))
        self.refused_writing_nothing("agents/faq.py already exists and is not what this `new faq` writes there",
                                     "new", "faq", "--tools", "read")   # another kind of agent: another module
        self.assertEqual(self.factory("new", "faq")[0], 0)


    def test_only_its_own_temporary_files_are_removed_and_a_link_is_never_followed(self):
        kill_at(self, "faq.json", "new", "faq")
        outside = self.tmp / "outside.txt"
        outside.write_text("not the factory's\n")
        kept = {"masters/.faq.json.nothexhe.tmp": "x", "masters/.faq.json.0123abcd.tmp.bak": "x",
                "masters/.other.json.0123abcd.tmp": "x", "masters/faq.json.0123abcd.tmp": "x",
                "agents/.faq.py.0123abcd.tmp": outside, "agents/tools/.faq.py.89abcdef.tmp/inside": "x"}
        for name, what in kept.items():
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(what) if isinstance(what, Path) else path.write_text(what)
        code, out, err = self.factory("new", "faq")
        self.assertEqual(code, 0, err)
        self.assertIn("; 1 temporary file it left was removed):", out)
        for name in kept:
            self.assertTrue((self.root / name).exists(), name)
        self.assertTrue((self.root / "agents" / ".faq.py.0123abcd.tmp").is_symlink())
        self.assertEqual(outside.read_text(), "not the factory's\n")

    def behind_a_paused_new(self, *argv: str) -> tuple[subprocess.Popen, subprocess.Popen]:
        """A `new faq` held just before it links its card, and factory.py ARGV started then, seen waiting
        for the lock on masters/ (in /proc/locks); the first is let go before they are returned. Without
        Linux's /proc/locks the calling test is skipped."""
        if not Path("/proc/locks").exists():
            self.skipTest("needs Linux's /proc/locks to see a process waiting for a lock")
        flag, env = self.tmp / "paused", {**os.environ, **self.env}
        first = subprocess.Popen([sys.executable, "-c", PAUSE_AT, str(REPO), str(flag), "faq.json", "new", "faq"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(first.kill)
        wait_until(flag.exists)
        second = subprocess.Popen([sys.executable, str(REPO / "factory.py"), *argv],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(second.kill)
        waiting = f" -> FLOCK  ADVISORY  WRITE {second.pid} "
        wait_until(lambda: second.poll() is not None or waiting in Path("/proc/locks").read_text())
        self.assertIsNone(second.returncode, f"{' '.join(argv)} waits for the paused `new faq`")
        Path(f"{flag}.go").touch()
        return first, second

    def test_two_at_once_one_writes_the_agent_and_the_other_is_refused(self):
        """The first `new faq` is held just before it links its card; the second, started then, waits for it
        and is refused (before the fix it found the files, wrote the card, and the first rolled them back)."""
        first, second = self.behind_a_paused_new("new", "faq")
        (out, err), (_, refused) = first.communicate(timeout=60), second.communicate(timeout=60)
        self.assertEqual((first.returncode, second.returncode), (0, 1), err + refused)
        self.assertIn("created faq:", out)
        self.assertEqual(refused, "factory new: masters/faq.json already exists; pick a new name (nothing was written)\n")
        for path in NEW_FILES:
            self.assertTrue((self.root / path).is_file(), path)
        self.assertEqual(self.factory("prove", "faq")[0], 0)


    def test_a_stamp_of_the_name_meanwhile_waits_for_it_and_is_refused(self):
        """`new` removes temporary files beside masters/NAME.json: a `stamp --as NAME` writing one then takes
        the same lock, so it waits for the `new`, then finds the name taken and writes no lineage entry."""
        first, stamp = self.behind_a_paused_new("stamp", "triager", "--as", "faq")
        (out, err), (_, refused) = first.communicate(timeout=60), stamp.communicate(timeout=60)
        self.assertEqual((first.returncode, stamp.returncode), (0, 1), err + refused)
        self.assertIn("faq already exists", refused)
        lineage = self.root / "registry" / "lineage.jsonl"
        self.assertNotIn('"faq"', lineage.read_text() if lineage.exists() else "")
        self.assertNotIn("stamped_from", json.loads((self.root / "masters" / "faq.json").read_text()))

class AllOrNothing(LineTest):
    """A file that cannot be written, or an interrupt, leaves none of the new agent's files behind."""

    def test_a_sealed_half_that_cannot_be_written(self):
        blocked = self.tmp / "a-file"
        blocked.write_text("not a folder\n")
        self.env["FACTORY_SEALED_DIR"] = str(blocked)
        before = snapshot(self.root)
        self.refused("nothing was written", "new", "faq")
        self.assertEqual(snapshot(self.root), before)

    def test_an_interrupt_removes_what_was_created(self):
        made = [self.root / "one.txt", self.root / "sub" / "two.txt"]
        with self.assertRaises(KeyboardInterrupt), self.fac.store.creating() as create:
            for path in made:
                create(path, "x\n")
            self.assertTrue(all(path.exists() for path in made))
            raise KeyboardInterrupt
        self.assertFalse(any(path.exists() for path in made))

    def test_creating_never_replaces_a_file(self):
        (self.root / "one.txt").write_text("mine\n")
        with self.assertRaises(FileExistsError), self.fac.store.creating() as create:
            create(self.root / "two.txt", "x\n")
            create(self.root / "one.txt", "x\n")
        self.assertEqual((self.root / "one.txt").read_text(), "mine\n")
        self.assertFalse((self.root / "two.txt").exists())


class OthersUntouched(LineTest):
    """Adding an agent and its tools, or a copy, leaves every other agent's digest and certificate valid."""

    def prepare(self):
        self.certified("triager")
        self.certified("evalsmith")

    def test_every_other_certificate_still_holds(self):
        before = {name: factory.load_agent(self.fac, name).digest for name in ("triager", "evalsmith")}
        for argv in (["new", "faq"], ["new", "tri2", "--from", "triager"], ["new", "ro", "--tools", "read"]):
            self.assertEqual(self.factory(*argv)[0], 0, argv)
        fresh = factory.Factory.at(None, None, self.env)
        for name in ("triager", "evalsmith"):
            with self.subTest(agent=name):
                self.assertEqual(factory.load_agent(fresh, name).digest, before[name])
                self.assertEqual(factory.certificate_state(fresh, name), "certified C1")
        self.runs_ok("triager")


class ACheckoutWithItsOwnAgents(unittest.TestCase):
    """A developer who followed the tutorial has faq (and returns) in their checkout; the tests still
    pass there: a test's factory holds exactly the shipped agents, never the ones made in the checkout."""

    def test_the_shipped_list_is_what_the_repository_tracks(self):
        """SHIPPED, which every fixture copies, is exactly the agents, masters and suites git tracks here:
        an agent added to or removed from the repository without SHIPPED following fails here."""
        if shutil.which("git") is None or not (REPO / ".git").exists():
            self.skipTest("git or the repository's .git is missing: the tracked files cannot be listed")
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "agents", "masters", "evals"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual(listed.stdout.splitlines(), sorted(SHIPPED))

    def test_a_fixture_from_that_checkout_holds_only_the_shipped_agents(self):
        tmp = Path(self.enterContext(tempfile.TemporaryDirectory()))
        checkout = copy_shipped(tmp / "checkout")
        env = {"FACTORY_ROOT": str(checkout), "FACTORY_KEYS_DIR": str(tmp / "keys"), "USER": "dev"}
        for name in ("faq", "returns"):
            self.assertEqual(station(env, "new", name)[0], 0)
        fixture = copy_shipped(tmp / "fixture", source=checkout)
        code, out, err = station({**env, "FACTORY_ROOT": str(fixture)}, "tower", "--json")
        self.assertEqual((code, [agent["agent"] for agent in json.loads(out)["agents"]]), (0, ["evalsmith", "triager"]), err)


def station(env: dict, *argv: str) -> tuple[int, str, str]:
    """One station in this process with env: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = factory.main(list(argv), env=env)
    return code, out.getvalue(), err.getvalue()
