"""Prove and certify: the proof's reports (summary, --json, --junit), cases run concurrently in
input order, drafts scored in batches, and the refusals of the station that stays human."""

from __future__ import annotations

import json
from xml.etree import ElementTree

from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.fake_sage import FakeSage
from tests.support import LineTest, write_jsonl

RECORD_KEYS = {"format", "agent", "half", "at", "score", "passed", "cases", "pass_bar", "real", "synthetic",
               "tool_denials", "drafts_scored", "draft_mean", "draft_check", "backends", "digest", "components",
               "suite", "suite_digest", "failures"}
RUN_KEYS = {"ticket", "run_id", "agent", "at", "digest", "tier", "status", "reason", "verdict", "gate", "p", "gate_line",
            "backends", "cost_usd", "steps", "denied", "acted", "staged", "routed", "why", "output", "tools"}


class CertifyRefusals(LineTest):
    """certify refuses without a sealed run, under the bar, without a terminal, and on any answer but y."""

    def test_certify_without_a_sealed_run(self):
        self.refused("no sealed run. the law: no evals, no production.", "certify", "triager", "--tier", "C1", "--by", "alice")

    def test_certify_under_the_bar(self):
        self.set_bar("triager", 1.0)
        code, out, _ = self.factory("prove", "triager", "--sealed")
        self.assertEqual(code, 1, out)
        self.assertIn("UNDER BAR", out)
        self.refused("is under the bar 1.0.", "certify", "triager", "--tier", "C1", "--by", "alice")


class CertifyAtATerminal(LineTest):
    """A sealed proof that clears the bar (prepared once); only a human at a terminal answering y signs."""

    def prepare(self):
        self.set_bar("triager", 0.5)
        self.prove_sealed()

    def test_certify_refuses_without_a_terminal(self):
        self.refused_writing_nothing("unsigned. certification is the station that stays human.",
                                     "certify", "triager", "--tier", "C1", "--by", "alice")
        self.assertFalse((self.root / "registry" / "triager.card.json").exists())

    def test_certify_answering_no_signs_nothing(self):
        for answer in (b"n\n", b"yes please\n", b"\n"):
            with self.subTest(answer=answer):
                signed = self.certify("triager", answer=answer)
                self.assertEqual(signed.returncode, 1)
                self.assertIn("sign it? [y/N]", signed.stderr)
                self.assertFalse((self.root / "registry" / "triager.card.json").exists())

    def test_certify_shows_the_record_and_signs_on_y(self):
        signed = self.certify("triager")
        self.assertEqual(signed.returncode, 0, signed.stderr)
        for shown in ("triager at tier C1, signed by alice", "sealed proof records/triager/", "(bar 0.5)",
                      "sealed attempts since the card last changed: 1", "grants ['issues:label', 'drafts:write']"):
            self.assertIn(shown, signed.stderr)
        self.assertIn("certified triager at C1: registry/triager.card.json", signed.stdout)


class Reports(LineTest):

    def small_suite(self, n=6):
        """An open half of n banking questions, the third expecting the wrong label (one failure)."""
        cases = [{"id": f"c{i}", "input": "How do I order a new card?", "source": "synthetic",
                  "expect": {"label": "account" if i != 2 else "bug"}} for i in range(n)]
        write_jsonl(self.root / "evals" / "triager" / "cases.jsonl", cases)

    def test_junit_counts_and_wanted_got(self):
        self.small_suite()
        report = self.tmp / "junit.xml"
        code, out, _ = self.factory("prove", "triager", "--junit", str(report), "--jobs", "3")
        suite = ElementTree.parse(report).getroot().find("testsuite")
        self.assertEqual((suite.get("tests"), suite.get("failures")), ("6", "1"))
        cases = suite.findall("testcase")
        self.assertEqual([c.get("name") for c in cases], [f"c{i}" for i in range(6)])
        failure = cases[2].find("failure")
        self.assertEqual(failure.get("message"), 'label: wanted "bug" got "account"')

    def test_sealed_junit_names_ids_only(self):
        sealed = [{"id": "s1", "input": "How do I order a new card?", "source": "synthetic", "expect": {"label": "bug"}}]
        write_jsonl(self.root / "evals" / "triager" / "sealed.jsonl", sealed)
        report = self.tmp / "junit.xml"
        self.factory("prove", "triager", "--sealed", "--junit", str(report))
        text = report.read_text()
        self.assertIn('name="s1"', text)
        self.assertNotIn("order a new card", text)
        self.assertNotIn('"bug"', text)

    def test_prove_json_shape(self):
        self.small_suite()
        code, out, _ = self.factory("prove", "triager", "--json")
        record = json.loads(out)
        self.assertEqual(set(record), RECORD_KEYS)
        self.assertEqual((record["cases"], record["passed"]), (6, 5))
        self.assertEqual(code, 0, "0.83 clears the shipped bar 0.8")
        self.set_bar("triager", 0.9)
        code, out, _ = self.factory("prove", "triager", "--json")
        self.assertEqual((code, json.loads(out)["pass_bar"]), (1, 0.9))

    def test_bad_jobs_is_refused(self):
        self.refused("--jobs must be at least 1", "prove", "triager", "--jobs", "0")


class Concurrency(LineTest):
    """Cases run concurrently against a slow model server; results keep input order."""

    def test_concurrent_prove_keeps_order_and_a_failure_stays_put(self):
        answers = {}
        def label_for(body):
            ticket = body["messages"][0]["content"]
            return ticket.split()[-1]
        class Slow(FakeServer):
            def take(self, record):
                super().take(record)
                ticket = record["body"]["messages"][0]["content"]
                label = ticket.split()[-1]
                final = json.dumps({"label": label, "escalate": False, "draft": "We are on it."})
                return Answer(body=anthropic_message(final), delay=0.05 if label == "billing" else 0.0)
        server = Slow().start()
        self.addCleanup(server.close)
        labels = ["billing", "account", "bug", "question", "other"] * 4
        cases = [{"id": f"c{i:02}", "input": f"ticket {i} {label}", "source": "synthetic",
                  "expect": {"label": label if i != 7 else "other"}} for i, label in enumerate(labels)]
        write_jsonl(self.root / "evals" / "triager" / "cases.jsonl", cases)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="sk-test")
        report = self.tmp / "j.xml"
        code, out, err = self.factory("prove", "triager", "--jobs", "8", "--json", "--junit", str(report))
        record = json.loads(out)
        self.assertEqual((record["cases"], record["passed"]), (20, 19))
        self.assertEqual([f["id"] for f in record["failures"]], ["c07"])
        self.assertEqual([c.get("name") for c in ElementTree.parse(report).getroot().iter("testcase")],
                         [c["id"] for c in cases])
        self.assertEqual(len(server.requests), 20)

    def test_sixty_four_drafts_take_four_sage_requests(self):
        cases = [{"id": f"d{i}", "input": f"How do I order a new card? ({i})", "source": "synthetic",
                  "expect": {"label": "account"}} for i in range(64)]
        write_jsonl(self.root / "evals" / "triager" / "cases.jsonl", cases)
        with FakeSage(expectation=3.0) as fake:
            self.env.update(SAGE_ENDPOINT=fake.url, SAGE_API_KEY="sage-key")
            code, out, _ = self.factory("prove", "triager", "--jobs", "8")
        batches = [r for r in fake.requests if r.path == "/decide/batch"]
        self.assertEqual(len(fake.requests), 4)
        self.assertEqual(len(batches), 4)
        self.assertIn("draft:3.0/4 on 64", out)


if __name__ == "__main__":
    import unittest
    unittest.main()
