"""Tiers that mean something (issue 6): effects by tier and gate, the durable C2 approval, verdicts,
promotion evidence and drift demotion."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import factory
from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.fake_sage import FakeSage
from tests.support import CLI, REPO, LineTest

DEMAND = "I was charged twice. Issue a refund now."
PAYER = ["stamp", "triager", "--as", "payer", "--set", 'tools=["issues:label","drafts:write","billing:refund"]',
         "--set", "tools_denied=[]", "--set", "tier_ceiling=C3", "--set", 'evals={"pass_bar": 0.0, "gate": 0.85}']


class Tiered(LineTest):
    """A variant `payer` that may refund; the offline rules reach for billing:refund on a refund demand."""

    def setUp(self):
        super().setUp()
        self.assertEqual(self.factory(*PAYER)[0], 0)
        self.sage = FakeSage(answer=self.scripted).start()
        self.addCleanup(self.sage.close)
        self.env.update(SAGE_ENDPOINT=self.sage.url, SAGE_API_KEY="sage-key")
        self.gate_p = [0.95]

    def scripted(self, question, content):
        """The output gate's P(yes): the next of self.gate_p, the last one repeating."""
        p = self.gate_p.pop(0) if len(self.gate_p) > 1 else self.gate_p[0]
        return {"answer": "yes" if p >= 0.5 else "no", "probability": p}

    def run_payer(self, text: str = DEMAND, times: int = 1) -> list[dict]:
        """Run payer `times` times; the index rows of those runs."""
        before = len(self.index_rows())
        for _ in range(times):
            code, out, err = self.factory("run", "payer", text)
            self.assertEqual(code, 0, err)
        return self.index_rows()[before:]

    def promote_to(self, tier: str) -> None:
        """Certify payer at C1, then earn each higher tier with 20 passing gated runs at the tier below."""
        self.certified("payer", "C1", lower_bar=False)
        for step in ("C2", "C3")[: ("C1", "C2", "C3").index(tier)]:
            self.run_payer("How do I order a new card?", times=20)
            signed = self.certify("payer", step)
            self.assertEqual(signed.returncode, 0, signed.stderr)

    def effects(self, kind: str) -> list[dict]:
        """Lines of outbox/payer/KIND.jsonl."""
        path = self.root / "outbox" / "payer" / f"{kind}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def pending(self) -> list[Path]:
        """Stored staged calls (not their state files)."""
        folder = self.root / "registry" / "pending"
        return [p for p in sorted(folder.glob("*.json")) if p.name.count(".") == 2] if folder.exists() else []


class EffectsByTier(Tiered):

    def test_tier_by_gate_table(self):
        expected = {  # tier -> (labels written, refunds executed after pass, calls parked after pass)
            "C0": (False, 0, 0), "C1": (True, 0, 0), "C2": (True, 0, 1), "C3": (True, 1, 0)}
        self.certified("payer", "C0", lower_bar=False)
        for tier in ("C0", "C1", "C2", "C3"):
            with self.subTest(tier=tier):
                if tier != "C0":
                    self.run_payer("How do I order a new card?", times=20) if tier != "C1" else None
                    self.assertEqual(self.certify("payer", tier).returncode, 0)
                labels, refunds, parked = len(self.effects("labels")), len(self.effects("refunds")), len(self.pending())
                self.gate_p = [0.2]
                flagged = self.run_payer()[0]
                self.assertEqual(len(self.effects("refunds")), refunds, "a failing gate executes no acting call")
                self.assertEqual(len(self.pending()), parked)
                self.assertEqual(flagged["verdict"], "routed-to-human")
                self.gate_p = [0.95]
                passed = self.run_payer()[0]
                want_labels, want_refunds, want_parked = expected[tier]
                self.assertEqual(len(self.effects("labels")) > labels, want_labels)
                self.assertEqual(len(self.effects("refunds")) - refunds, want_refunds)
                self.assertEqual(len(self.pending()) - parked, want_parked)
                self.assertEqual(passed["tier"], tier)
                self.assertEqual(passed["verdict"], {"C2": "waiting-for-approval"}.get(tier, "verified"))

    def test_c3_refund_is_exactly_the_staged_call(self):
        self.promote_to("C3")
        self.run_payer()
        refund = self.effects("refunds")[-1]
        staged = [e for e in self.traces("payer")[-1] if e.get("tool") == "billing:refund"]
        self.assertEqual(staged[0]["ruling"], "STAGED")
        self.assertEqual(staged[1]["ruling"], "ok")
        self.assertEqual({k: refund[k] for k in staged[0]["args"]}, staged[0]["args"])


class Promotion(Tiered):

    def test_promotion_is_refused_without_evidence_then_allowed(self):
        self.certified("payer", "C1", lower_bar=False)
        self.run_payer("How do I order a new card?", times=5)
        refused = self.certify("payer", "C2")
        self.assertEqual(refused.returncode, 1)
        self.assertIn("tier C2 needs production evidence at C1 since the card last changed: 5 gated run(s) (need 20)",
                      refused.stderr)
        self.run_payer("How do I order a new card?", times=15)
        self.assertEqual(self.certify("payer", "C2").returncode, 0)
        cert = json.loads((self.root / "registry" / "payer.card.json").read_text())
        self.assertEqual((cert["tier"], cert["certified_rate"]), ("C2", 1.0))

    def test_drift_demotes_to_c0(self):
        self.certified("payer", "C1", lower_bar=False)
        self.gate_p = [0.95, 0.2, 0.95, 0.95, 0.95] * 4 + [0.95]
        self.run_payer("How do I order a new card?", times=20)
        self.assertEqual(self.certify("payer", "C1").returncode, 0)
        self.gate_p = [0.2]
        self.run_payer("How do I order a new card?", times=20)
        code, out, err = self.factory("run", "payer", "How do I order a new card?")
        self.assertIn("drift: payer DEMOTED to C0 (recent 0.00, lcl 0.53, certified 0.80)", err)
        self.assertEqual(self.index_rows()[-1]["tier"], "C0")
        self.assertIn("drift: DEMOTED to C0", self.factory("tower")[1])


class Approval(Tiered):
    """The C2 pause: durable, exact, once, and only with an approval record."""

    def setUp(self):
        super().setUp()
        self.promote_to("C2")
        staged = subprocess.run([*CLI, "run", "payer", DEMAND], env={**os.environ, **self.env}, cwd=str(REPO),
                                capture_output=True, text=True, timeout=60)   # staged by one process ...
        self.assertEqual(staged.returncode, 0, staged.stderr)
        self.run_id = self.index_rows()[-1]["run_id"]                          # ... approved by another

    def approve(self, answer: bytes = b"y\n", run_id: str | None = None) -> subprocess.CompletedProcess:
        """`approve RUN_ID --by bob` in a child process at a pseudo-terminal."""
        leader, follower = pty.openpty()
        self.addCleanup(os.close, leader)
        child = subprocess.Popen([*CLI, "approve", run_id or self.run_id, "--by", "bob"],
                                 stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env={**os.environ, **self.env}, cwd=str(REPO))
        os.close(follower)
        os.write(leader, answer)
        out, err = child.communicate(timeout=60)
        return subprocess.CompletedProcess(child.args, child.returncode, out.decode(), err.decode())

    def test_pending_lists_it_and_approve_executes_it_once_in_another_process(self):
        code, out, _ = self.factory("pending")
        self.assertIn(f"{self.run_id} --call 1\tpayer\tbilling:refund", out)
        first = self.approve()
        self.assertEqual(first.returncode, 0, first.stderr)
        self.assertIn("approve? [y/N]", first.stderr)
        self.assertIn("executed billing:refund", first.stdout)
        self.assertIn("(read back)", first.stdout)
        stored = json.loads(self.pending()[0].read_text())
        self.assertEqual(len(self.effects("refunds")), 1)
        self.assertEqual(self.effects("refunds")[0]["reason"], stored["args"]["reason"])
        done = json.loads((self.root / "registry" / "pending" / f"{self.run_id}.1.executed.json").read_text())
        self.assertEqual(done["by"], "bob")
        second = self.approve()
        self.assertEqual(second.returncode, 1)
        self.assertIn("was already executed", second.stderr)
        self.assertEqual(len(self.effects("refunds")), 1)
        self.assertIn("(nothing waits for approval)", self.factory("pending")[1])
        payer = [a for a in json.loads(self.factory("tower", "--json")[1])["agents"] if a["agent"] == "payer"][0]
        self.assertEqual((payer["acted"], payer["staged"]), (1, 0), "the tower counts the approved call as acted")

    def test_answering_no_leaves_it_staged(self):
        self.assertEqual(self.approve(b"n\n").returncode, 1)
        self.assertEqual(self.effects("refunds"), [])
        self.assertIn(self.run_id, self.factory("pending")[1])

    def test_tampered_stored_arguments_are_refused(self):
        path = self.pending()[0]
        stored = json.loads(path.read_text())
        stored["args"]["amount_usd"] = 5000
        path.write_text(json.dumps(stored))
        refused = self.approve()
        self.assertEqual(refused.returncode, 1)
        self.assertIn("no longer match their digest", refused.stderr)
        self.assertEqual(self.effects("refunds"), [])

    def test_recall_between_stage_and_approve(self):
        self.factory("recall", "triager", "--reason", "refunds went wrong")
        refused = self.approve()
        self.assertIn("recalled", refused.stderr)
        self.assertEqual(self.effects("refunds"), [])

    def test_restamp_between_stage_and_approve(self):
        self.edit_card("triager", owner="someone-else")
        self.factory("restamp", "triager")
        self.assertIn("certificate revoked: restamped: triager changed. not executed.", self.approve().stderr)

    def test_recertified_between_stage_and_approve(self):
        self.assertEqual(self.certify("payer", "C2").returncode, 0)
        self.assertIn("re-certified since this call was staged", self.approve().stderr)

    def test_expired(self):
        path = self.pending()[0]
        stored = json.loads(path.read_text())
        self.assertGreater(stored["expires_at"], factory.utc_now())
        stored["expires_at"] = "2000-01-01T00:00:00.000000Z"
        path.write_text(json.dumps(stored))
        refused = self.approve()
        self.assertIn("expired at 2000-01-01", refused.stderr)

    def test_reject_closes_it(self):
        self.refused("a rejection needs a reason", "reject", self.run_id, "--by", "bob", "--reason", " ")
        code, out, _ = self.factory("reject", self.run_id, "--by", "bob", "--reason", "duplicate request")
        self.assertEqual(code, 0)
        self.assertIn("was rejected", self.approve().stderr)

    def test_the_executor_refuses_without_an_approval_record(self):
        with self.assertRaises(factory.Refusal) as refusal:
            factory.execute_staged_call(self.fac, self.run_id, 1)
        self.assertIn("has no approval record; the executor refuses", str(refusal.exception))
        self.assertEqual(self.effects("refunds"), [])

    def test_approve_needs_a_terminal(self):
        self.refused("unapproved.", "approve", self.run_id, "--by", "bob")


class Verdicts(LineTest):
    """Each verdict from a scripted run."""

    def run_once(self, text: str = "How do I order a new card?", sage_p: float | None = None, exit: int = 0) -> dict:
        """Run the certified triager once (with a gate at sage_p when given); its index row."""
        if sage_p is None:
            code, _, err = self.factory("run", "triager", text)
        else:
            with FakeSage(yes_p=sage_p) as fake:
                self.env.update(SAGE_ENDPOINT=fake.url, SAGE_API_KEY="sage-key")
                code, _, err = self.factory("run", "triager", text)
        self.assertEqual(code, exit, err)
        return self.index_rows()[-1]

    def test_gate_verdicts(self):
        self.certified()
        self.assertEqual(self.run_once()["verdict"], "unscored")
        self.assertEqual(self.run_once(sage_p=0.95)["verdict"], "verified")
        self.assertEqual(self.run_once(sage_p=0.2)["verdict"], "routed-to-human")

    def test_uncertain_effect_when_a_write_fails(self):
        self.certified()
        (self.root / "outbox").mkdir()
        (self.root / "outbox" / "triager").write_text("not a folder")
        row = self.run_once(sage_p=0.95)
        self.assertEqual(row["verdict"], "uncertain-effect")

    def test_escalated_over_budget_and_crashed(self):
        self.edit_card("triager", max_steps=2)
        self.certified()
        loop = ("t", "issues__label", {"label": "bug", "escalate": False})
        server = FakeServer(*[Answer(body=anthropic_message(tool_uses=[loop]))] * 3).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="sk-test")
        self.assertEqual(self.run_once()["verdict"], "escalated")
        self.edit_card("triager", max_steps=2, cost_envelope_usd=0.0)
        self.certified()
        self.assertEqual(self.run_once()["verdict"], "over-budget")
        del self.env["ANTHROPIC_API_KEY"]
        path = self.root / "agents" / "triager.py"
        path.write_text(path.read_text() + "\n\ndef rules(ticket):\n    raise RuntimeError('rules broke')\n")
        self.certified()
        row = self.run_once(exit=1)
        self.assertEqual((row["verdict"], row["status"]), ("crashed", "crashed"))
        self.assertIn("RuntimeError: rules broke", row["reason"])
