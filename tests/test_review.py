"""The review station: what waits for a human in outbox/AGENT/review.jsonl (input, output, held calls, why,
age), and the human's decision on one held draft (accepted, edited with the text sent, discarded),
signed and hash-chained in registry/reviews.jsonl, once per draft whatever races it; the counts in the
tower and at the certify prompt."""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import time
import unittest
from pathlib import Path
from xml.etree import ElementTree

import factory
from tests.support import CertifiedTest, spawn_at_terminal, wait_until

CHARGED = "I was charged twice for one order last week."


class Review(CertifiedTest):
    """The triager certified at C1, two runs with no decision model: each routed to a human (unscored),
    its label and its draft held in the review queue."""

    def prepare(self):
        super().prepare()
        for text in (CHARGED, "How do I order a new card?"):
            self.runs_ok(text=text)

    def setUp(self):
        super().setUp()
        self.runs = [row["run_id"] for row in self.index_rows()][-2:]
        self.held = [(row["run_id"], row["seq"]) for row in self.outbox("triager", "review")]
        self.give_key("bob")

    def review(self, *argv: str) -> tuple:
        """`review triager ARGV...` in this process: (exit status, stdout, stderr)."""
        return self.factory("review", "triager", *argv)

    def decide(self, run: int, seq: int, *decision: str, by: str = "bob", reason: str = "looked at it") -> tuple:
        """The decision on held draft `seq` of the RUN-th run."""
        return self.review(self.runs[run], "--seq", str(seq), *decision, "--by", by, "--reason", reason)

    def entries(self) -> list[dict]:
        """The entries of registry/reviews.jsonl."""
        path = self.root / "registry" / "reviews.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def test_it_lists_each_waiting_draft_with_its_run_input_output_why_and_age(self):
        code, out, err = self.review()
        self.assertEqual((code, err), (0, ""))
        traces = {trace[0]["run_id"]: trace for trace in self.traces()}
        lines = out.splitlines()
        for run_id in self.runs:
            header = lines.index(next(line for line in lines if line.startswith(run_id)))
            self.assertRegex(lines[header], rf"^{run_id}  queued [0-9]+\.[0-9]h ago  routed: unscored \(no SAGE_API_KEY\)")
            self.assertEqual(lines[header + 1], f"  input: {traces[run_id][0]['input']}")
            self.assertEqual(lines[header + 2], f"  output: {json.dumps(traces[run_id][-1]['output'])}")
            held = [row for row in self.outbox("triager", "review") if row["run_id"] == run_id]
            self.assertEqual(lines[header + 3: header + 3 + len(held)],
                             [f"  --seq {row['seq']}  {row['tool']} {json.dumps(row['args'])}" for row in held])
        self.assertEqual(lines[-1], f"2 run(s) wait in outbox/triager/review.jsonl: {len(self.held)} waiting, 0 accepted, "
                                    f"0 edited, 0 discarded")
        code, out, _ = self.review("--json")
        doc = json.loads(out)
        self.assertEqual((code, doc["format"], doc["agent"], doc["problems"]), (0, "factory-review-1", "triager", []))
        self.assertEqual([run["run_id"] for run in doc["runs"]], self.runs)
        self.assertEqual([(item["run_id"], item["seq"]) for run in doc["runs"] for item in run["items"]], self.held)
        self.assertEqual(doc["runs"][0]["input"], CHARGED)
        self.assertEqual(doc["runs"][0]["output"], traces[self.runs[0]][-1]["output"])
        self.assertEqual(doc["counts"], {"waiting": len(self.held), "accepted": 0, "edited": 0, "discarded": 0})

    def test_each_decision_is_signed_chained_and_counted_in_the_tower_and_at_certify(self):
        first, second = (seq for run_id, seq in self.held if run_id == self.runs[0])
        accepted = self.review(self.runs[0], "--seq", str(first), "--accept", "--by", "bob")   # a reason is not needed
        self.assertEqual(accepted[:2], (0, f"recorded: accepted issues:label of run {self.runs[0]} (--seq {first}) by bob\n"))
        sent = "We are sorry about the double charge.\nA refund is on its way."
        self.assertEqual(self.decide(0, second, "--edit", sent)[0], 0)
        other = next(seq for run_id, seq in self.held if run_id == self.runs[1])
        self.assertEqual(self.decide(1, other, "--discard", reason="not for us")[0], 0)
        key = (self.tmp / "keys" / "bob.key").read_bytes().strip()
        previous = factory.GENESIS
        for entry, line in zip(self.entries(), (self.root / "registry" / "reviews.jsonl").read_bytes().splitlines()):
            body = {k: v for k, v in entry.items() if k not in ("signature", "prev")}
            self.assertEqual(entry["signature"], "hmac-sha256:" + hmac.new(key, factory.canonical(body), hashlib.sha256).hexdigest())
            self.assertEqual(entry["prev"], previous)
            previous = factory.sha256(line)
        self.assertEqual([(e["decision"], e["run_id"], e["seq"], e["by"]) for e in self.entries()],
                         [("accepted", self.runs[0], first, "bob"), ("edited", self.runs[0], second, "bob"),
                          ("discarded", self.runs[1], other, "bob")])
        self.assertEqual(self.entries()[1]["sent"], sent, "the text actually sent is kept exactly")
        counts = {"waiting": len(self.held) - 3, "accepted": 1, "edited": 1, "discarded": 1}
        self.assertEqual(json.loads(self.review("--json")[1])["counts"], counts)
        self.assertNotIn(f"  --seq {first}  ", self.review()[1].split(self.runs[1])[0], "a decided draft no longer waits")
        triager = [a for a in json.loads(self.factory("tower", "--json")[1])["agents"] if a["agent"] == "triager"][0]
        self.assertEqual(triager["reviews"], counts)
        self.assertIn(f"reviews: {counts['waiting']} waiting, 1 accepted, 1 edited, 1 discarded\n", self.factory("tower")[1])
        self.assertEqual(self.factory("tower", "--html", str(self.tmp / "tower.html"))[0], 0)
        page = ElementTree.parse(self.tmp / "tower.html").find(".//section[@data-agent='triager']/p[@class='reviews']")
        self.assertEqual(page.text, f"reviews: {counts['waiting']} waiting, 1 accepted, 1 edited, 1 discarded")
        prompt = self.certify("triager", "C1", answer=b"n\n")
        self.assertIn(f"; its held calls {counts['waiting']} waiting, 1 accepted, 1 edited, 1 discarded\n", prompt.stderr)

    def test_a_second_decision_without_seq_names_the_first(self):
        """On a run whose held drafts were all decided, a decision without --seq said `no held draft of run ... waits`,
        where the README promises a second decision is refused naming the first."""
        first, second = (seq for run_id, seq in self.held if run_id == self.runs[0])
        self.decide(0, first, "--accept")
        self.assertEqual(self.review(self.runs[0], "--accept", "--by", "bob")[0], 0, "the one still waiting is taken")
        at = self.entries()[0]["at"]
        self.refused(f"run {self.runs[0]} --seq {first} was already accepted by bob at {at} (looked at it).", "review",
                     "triager", self.runs[0], "--discard", "--by", "bob", "--reason", "thought better of it")

    def test_refusals_and_usage_errors(self):
        first = self.held[0][1]
        self.decide(0, first, "--accept", reason="fine")
        self.refused(f"run {self.runs[0]} --seq {first} was already accepted by bob at ", "review", "triager", self.runs[0],
                     "--seq", str(first), "--discard", "--by", "bob", "--reason", "again")
        self.refused(f"no held call --seq 99 of run {self.runs[0]} waits in outbox/triager/review.jsonl",
                     "review", "triager", self.runs[0], "--seq", "99", "--accept", "--by", "bob", "--reason", "x")
        self.assertEqual(self.decide(0, first, "--accept")[0], 1)
        both = [seq for run_id, seq in self.held if run_id == self.runs[1]]
        self.refused(f"run {self.runs[1]} has 2 held calls waiting (--seq {both[0]}, {both[1]}): name one",
                     "review", "triager", self.runs[1], "--accept", "--by", "bob", "--reason", "x")
        self.refused("no signing key for mallory on this machine", "review", "triager", self.runs[1], "--seq",
                     str(both[0]), "--accept", "--by", "mallory", "--reason", "x")
        for argv in ((self.runs[1],), ("--accept",), (self.runs[1], "--accept", "--discard", "--by", "bob", "--reason", "x"),
                     (self.runs[1], "--accept", "--reason", "x"), (self.runs[1], "--discard", "--by", "bob"),
                     (self.runs[1], "--edit", "sent this", "--by", "bob")):
            with self.subTest(argv=argv):
                self.usage_error("list with review AGENT, or decide with review AGENT RUN_ID [--seq N] and one of --accept, "
                                 "--edit TEXT or --discard (these two with --reason TEXT), and --by NAME",
                                 "review", "triager", *argv)
        for blank in ("", " \n", "\u200b", "\u200b\u2060 \ufeff", "\u3164", "\u2800\u0301"):   # one rule for what a human writes: broker.is_blank
            with self.subTest(blank=blank):
                self.usage_error("argument --edit: needs the text you sent, not blank", "review", "triager", self.runs[1],
                                 "--seq", str(both[0]), "--edit", blank, "--by", "bob", "--reason", "x")
                self.usage_error("argument --reason: needs a reason, not blank", "review", "triager", self.runs[1],
                                 "--seq", str(both[0]), "--discard", "--by", "bob", "--reason", blank)
        self.assertEqual(len(self.entries()), 1)

    def test_two_deciders_racing_on_one_draft_decide_it_once(self):
        """Both reach the log's lock before either writes (this process holds it until both wait on it):
        the first to append decides, the other is refused naming that decision; nothing is lost."""
        log = self.root / "registry" / "reviews.jsonl"
        log.touch()
        run_id, seq = self.held[0]
        argv = ["review", "triager", run_id, "--seq", str(seq), "--by", "bob", "--reason", "raced"]
        with log.open("a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            children = [spawn_at_terminal([*argv, decision], self.env) for decision in ("--accept", "--discard")]
            wait_until(lambda: waiting_on(log) == 2)
        results = []
        for child, leader in children:
            out, err = child.communicate(timeout=60)
            os.close(leader)
            results.append((child.returncode, out.decode(), err.decode()))
        self.assertEqual(sorted(code for code, _, _ in results), [0, 1], results)
        [winner] = self.entries()
        loser = next(err for code, _, err in results if code == 1)
        self.assertEqual(loser.strip(), f"factory review: run {run_id} --seq {seq} was already {winner['decision']} by bob at "
                                        f"{winner['at']} (raced).")
        self.assertEqual([(row["run_id"], row["seq"]) for row in self.outbox("triager", "review")], self.held)


def waiting_on(path: Path) -> int:
    """How many processes wait for a lock on the file at path (Linux's /proc/locks marks a waiter `->`)."""
    inode = f":{os.stat(path).st_ino} "
    return sum(" -> " in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


if __name__ == "__main__":
    unittest.main()
