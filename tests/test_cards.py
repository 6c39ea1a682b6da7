"""Cards and agents: strict card validation, names checked before any path, the digest and what it
covers, stamping a variant and restamping every variant of a master (also when the restamp is
killed midway)."""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import random
import shutil
import signal
import subprocess
import sys
import time
import unittest

from tests.support import CLI, INJECTION, REPO, CertifiedTest, LineTest, snapshot


class Cards(LineTest):
    """Strict card validation, names, digests."""

    def test_bad_cards_are_refused_naming_the_field(self):
        good = json.loads((self.root / "masters" / "triager.json").read_text())
        rubric = dict(good["draft_rubric"], levels=good["draft_rubric"]["levels"][:4])
        table = [({"tool_denied": ["billing:refund"]}, "unknown field 'tool_denied' (did you mean 'tools_denied'?)"),
                 ({"max_steps": "8"}, "field 'max_steps' must be an integer >= 1"),
                 ({"cost_envelope_usd": -1}, "field 'cost_envelope_usd'"),
                 ({"tier_ceiling": "C9"}, "field 'tier_ceiling'"),
                 ({"draft_rubric": rubric}, "exactly five levels 0..4"),
                 ({"evals": {"pass_bar": 2, "gate": 0.5}}, "evals.pass_bar"),
                 ({"agent": "other"}, "field 'agent' is 'other'")]
        for change, message in table:
            with self.subTest(change=change):
                (self.root / "masters" / "triager.json").write_text(json.dumps({**good, **change}))
                self.refused(message, "prove", "triager")
                self.refused(message, "digest", "triager")

    def test_the_hand_off_field_must_be_a_boolean_of_the_output(self):
        table = [("label", "agents/triager.py: OUTPUT_SCHEMA has no boolean property 'label', the card's hand-off field"),
                 ("handoff", "OUTPUT_SCHEMA has no boolean property 'handoff'"),
                 ("Hand Off", "field 'handoff_field' must be the name of a boolean field of the agent's output")]
        for field, message in table:
            with self.subTest(field=field):
                self.edit_card("triager", handoff_field=field)
                self.refused(message, "digest", "triager")
        self.edit_card("triager", handoff_field="escalate")
        self.assertEqual(self.factory("digest", "triager")[0], 0)
        self.assertEqual(self.factory("digest", "evalsmith")[0], 0, "evalsmith declares its own: handoff")

    def test_granted_and_denied_is_allowed_and_denied_wins(self):
        self.edit_card("triager", tools=["issues:label", "drafts:write", "billing:refund"])
        self.certified()
        self.factory("run", "triager", INJECTION)
        rulings = {e["tool"]: e["ruling"] for e in self.traces()[0] if e.get("event") == "tool"}
        self.assertEqual(rulings["billing:refund"], "DENIED_EXPLICIT")

    def test_odd_names_are_refused_before_any_path(self):
        for name in ("../x", "X", "", "a/b", "1abc", "a" * 65):
            with self.subTest(name=name):
                before = snapshot(self.root)
                self.refused("is not a valid agent name", "prove", name)
                self.refused("is not a valid agent name", "stamp", "triager", "--as", name)
                self.refused("is not a valid agent name", "run", name, "hi")
                self.assertEqual(snapshot(self.root), before)

    def test_a_name_with_a_trailing_newline_is_refused(self):
        """`^name$` with match() also accepts 'name\\n': `stamp --as $'evil\\n'` made masters/evil\\n.json."""
        self.set_bar("triager", 0.0)
        self.prove_sealed()                      # so that certify gets as far as the signer's name
        before = snapshot(self.root)
        for argv in (("stamp", "triager", "--as", "evil\n"), ("prove", "triager\n"), ("run", "triager\n", "hi"),
                     ("certify", "triager", "--tier", "C1", "--by", "alice\n")):
            with self.subTest(argv=argv):
                self.refused(("is not a valid agent name", "is not a valid signer name"), *argv)
        self.assertEqual(snapshot(self.root), before)
        self.assertEqual(sorted(p.name for p in (self.root / "masters").iterdir()), ["evalsmith.json", "triager.json"])

    def test_digest_explain_names_each_component(self):
        code, out, _ = self.factory("digest", "triager", "--explain")
        self.assertEqual(code, 0)
        lines = out.splitlines()
        self.assertRegex(lines[0], r"^sha256:[0-9a-f]{64}$")
        labels = " ".join(lines[1:])
        for part in ("card", "entrypoint agents/triager.py", "tool code agents/tools.py",
                     "contract billing:refund", "contract issues:label", "contract drafts:write"):
            self.assertIn(part, labels)

    def test_digest_covers_a_referenced_module(self):
        first = self.factory("digest", "evalsmith")[1]
        path = self.root / "agents" / "triager.py"
        path.write_text(path.read_text() + "\n# changed\n")
        self.assertNotEqual(self.factory("digest", "evalsmith")[1], first)

    def test_a_contract_with_an_odd_effect_is_refused(self):
        path = self.root / "agents" / "tools.py"
        path.write_text(path.read_text().replace('"name": "drafts:write", "effect": "draft"', '"name": "drafts:write", "effect": "send"'))
        self.refused("agents/tools.py: contract drafts:write needs an effect in", "digest", "triager")

    def test_contract_change_changes_the_digest(self):
        first = self.factory("digest", "triager")[1]
        path = self.root / "agents" / "tools.py"
        path.write_text(path.read_text().replace('"maxLength": 600', '"maxLength": 601'))
        self.assertNotEqual(self.factory("digest", "triager")[1], first)


class OwnModules(CertifiedTest):
    """The product's own modules run from their source."""

    def test_a_planted_bytecode_file_of_the_broker_does_not_run(self):
        """The product's own modules are compiled from their source too: a .pyc beside broker.py is not git's to see."""
        install = self.tmp / "install"
        install.mkdir()
        for name in ("factory.py", "broker.py", "llm.py", "sage.py"):
            shutil.copy(REPO / name, install / name)
        planted = self.tmp / "broker.py"
        planted.write_text((REPO / "broker.py").read_text() + "\nprint('planted broker ran', file=__import__('sys').stderr)\n")
        py_compile.compile(str(planted), cfile=importlib.util.cache_from_source(str(install / "broker.py")), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        pycache = sorted(p.name for p in (install / "__pycache__").iterdir())
        for argv in (("--help",), ("digest", "triager"), ("run", "triager", "hi")):
            with self.subTest(argv=argv):
                done = subprocess.run([sys.executable, str(install / "factory.py"), *argv], capture_output=True, text=True,
                                      env={**os.environ, **self.env}, timeout=60)
                self.assertEqual(done.returncode, 0, done.stderr)
                self.assertNotIn("planted", done.stderr)
        self.assertEqual(sorted(p.name for p in (install / "__pycache__").iterdir()), pycache, "a module wrote bytecode")


class Stamping(LineTest):
    """stamp keeps overrides; restamp re-derives master + overrides and revokes changed certificates."""

    def test_set_takes_typed_values_and_the_variant_keeps_overrides(self):
        code, out, err = self.factory("stamp", "triager", "--as", "triager-eu", "--set", "evals.pass_bar=0.95",
                                      "--set", "max_steps=5", "--set", "owner=eu-lead")
        self.assertEqual(code, 0, err)
        card = json.loads((self.root / "masters" / "triager-eu.json").read_text())
        self.assertEqual(card["evals"]["pass_bar"], 0.95)
        self.assertEqual(card["max_steps"], 5)
        self.assertEqual(card["owner"], "eu-lead")
        self.assertEqual(card["stamped_from"], "triager")
        self.assertEqual(card["overrides"], {"evals.pass_bar": 0.95, "max_steps": 5, "owner": "eu-lead"})
        self.assertRegex(card["master_digest"], r"^sha256:[0-9a-f]{64}$")

    def test_stamp_refusals(self):
        self.factory("stamp", "triager", "--as", "copy")
        self.refused("already exists", "stamp", "triager", "--as", "copy")
        self.refused("no agent named ghost", "stamp", "ghost", "--as", "new")
        self.refused("field 'max_steps' must be", "stamp", "triager", "--as", "bad", "--set", "max_steps=0")
        self.refused("set by stamp itself", "stamp", "triager", "--as", "bad", "--set", "agent=x")
        self.refused("--set evals: duplicate key 'gate'", "stamp", "triager", "--as", "bad",
                     "--set", 'evals={"pass_bar": 0.5, "gate": 0.5, "gate": 0}')
        self.assertFalse((self.root / "masters" / "bad.json").exists())

    def test_restamp_carries_a_master_fix_and_revokes(self):
        self.factory("stamp", "triager", "--as", "triager-eu", "--set", "max_steps=5")
        self.factory("stamp", "triager-eu", "--as", "triager-fr", "--set", "owner=fr-lead")
        self.certified("triager-eu")
        self.edit_card("triager", gate_question="Is this triage correct and safe?")
        code, out, _ = self.factory("restamp", "triager")
        self.assertEqual(code, 0)
        self.assertIn("restamped 2 variant(s) from triager: ['triager-eu', 'triager-fr']", out)
        self.assertIn("revoked 1 certificate(s): ['triager-eu']", out)
        self.assertIn("re-prove and re-certify before these run again.", out)
        eu = json.loads((self.root / "masters" / "triager-eu.json").read_text())
        fr = json.loads((self.root / "masters" / "triager-fr.json").read_text())
        self.assertEqual((eu["gate_question"], eu["max_steps"]), ("Is this triage correct and safe?", 5))
        self.assertEqual((fr["gate_question"], fr["max_steps"], fr["owner"]), ("Is this triage correct and safe?", 5, "fr-lead"))
        cert = json.loads((self.root / "registry" / "triager-eu.card.json").read_text())
        self.assertEqual(cert["revoked"]["reason"], "restamped: triager changed")
        self.refused("re-prove and re-certify", "run", "triager-eu", "hi")

    def test_restamp_with_no_change_revokes_nothing(self):
        self.factory("stamp", "triager", "--as", "triager-eu", "--set", 'evals={"pass_bar": 0.0, "gate": 0.85}')
        self.certified("triager-eu", lower_bar=False)
        code, out, _ = self.factory("restamp", "triager")
        self.assertIn("restamped 0 variant(s)", out)
        self.assertEqual(self.factory("run", "triager-eu", "hello")[0], 0)


class KilledRestamp(LineTest):
    """A restamp killed while it writes leaves every card and certificate whole, and never leaves a
    changed variant runnable on its old signature. The kills are aimed at the writing itself: each
    waits for the restamp's first temporary file, then lands at a different offset into the writes."""

    VARIANTS = [f"v{n:02d}" for n in range(12)]

    def prepare(self):
        self.set_bar("triager", 0.0)
        for name in self.VARIANTS:
            self.assertEqual(self.factory("stamp", "triager", "--as", name, "--set", f"owner={name}-lead")[0], 0)
        for name in self.VARIANTS[:2]:
            self.prove_sealed(name)
            self.sign(name)

    def writing(self) -> bool:
        """True once a temporary file of an atomic write exists under masters/ or registry/."""
        return any(p.name.endswith(".tmp") for folder in ("masters", "registry") for p in (self.root / folder).iterdir())

    def assert_all_json_whole(self) -> int:
        """Every *.json under masters/ and registry/ parses, every *.jsonl line parses; returns files checked."""
        checked = 0
        for folder in ("masters", "registry"):
            for path in sorted((self.root / folder).rglob("*.json")):
                try:
                    json.loads(path.read_text())
                except (ValueError, UnicodeDecodeError) as error:
                    self.fail(f"{path.relative_to(self.root)} is not whole json after a kill: {error}")
                checked += 1
            for path in sorted((self.root / folder).rglob("*.jsonl")):
                for number, line in enumerate(path.read_text().splitlines(), 1):
                    try:
                        json.loads(line)
                    except ValueError as error:
                        self.fail(f"{path.relative_to(self.root)} line {number} is torn after a kill: {error}")
                checked += 1
        return checked

    def test_a_killed_restamp_leaves_every_json_whole(self):
        rng = random.Random()
        for attempt, offset in enumerate((0.0, 0.003, 0.01, 0.03)):
            self.edit_card("triager", gate_question=f"Is this triage safe to act on (revision {attempt})?")
            child = subprocess.Popen([*CLI, "restamp", "triager"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO),
                                     env={**os.environ, **self.env})
            deadline = time.monotonic() + 10
            while not self.writing() and child.poll() is None and time.monotonic() < deadline:
                pass
            time.sleep(offset * rng.uniform(0.5, 1.5))
            child.send_signal(signal.SIGKILL)
            child.communicate()
            self.assertGreater(self.assert_all_json_whole(), 12)
            for name in self.VARIANTS:
                self.assertEqual(self.factory("digest", name)[0], 0, f"kill {attempt}: masters/{name}.json unusable")
            for leftover in [p for folder in ("masters", "registry") for p in (self.root / folder).iterdir()
                             if p.name.endswith(".tmp")]:   # a killed write's temporary file: harmless, and
                leftover.unlink()                            # the next kill waits for a new one
        code, out, err = self.factory("restamp", "triager")
        self.assertEqual(code, 0, err)
        self.assert_all_json_whole()
        for name in self.VARIANTS[:2]:      # their cards changed: never runnable on the old signature
            self.refused(("revoked", "changed"), "run", name, "hi")


if __name__ == "__main__":
    unittest.main()
