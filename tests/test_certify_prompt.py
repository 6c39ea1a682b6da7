"""The certify prompt is worth signing: it says which backend the sealed proof ran on and warns when an
offline proof is signed for a card that names a model, or when drafts were never scored; for a variant,
what it changes relative to its master; the evidence it rests on; the certificate it replaces and any
recall since; the sealed attempts since the last certification across code changes; and which answers
sign."""

from __future__ import annotations

import json
import re
import shutil

from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.fake_sage import FakeSage
from tests.support import LineTest
from tests.test_trust import index_row

OFFLINE_WARNING = "WARNING: this proof ran the agent's offline rules, not claude-sonnet-5-5"
RUBRIC_WARNING = "WARNING: the card's draft rubric never ran (draft:unscored (no key)): the cases passed, no draft was " \
                 "scored; certify signs C0 or C1 on it, never C2 or C3"


class Prompt(LineTest):
    """A new agent, faq, whose card names claude-sonnet-5-5 and has a draft rubric; no keys."""

    def prepare(self):
        self.assertEqual(self.factory("new", "faq")[0], 0)

    def signed(self, name: str = "faq", answer: bytes = b"y\n", tier: str = "C1") -> str:
        """certify NAME at a terminal, asserting it signs; the prompt (stderr)."""
        done = self.certify(name, tier=tier, answer=answer)
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stderr

    def assert_counted(self, prompt: str, ever: int, missing: int) -> None:
        """The prompt of faq, never certified, with one record of this version left in records/faq, counts
        `ever` sealed attempts from this machine's count and warns that `missing` records are gone."""
        self.assertIn(f"  sealed attempts ever (never certified): {ever}, across 1 version(s) of the agent in the records "
                      f"left; 1 of this one\n", prompt)
        self.assertIn(f"  WARNING: this machine ran {ever} sealed proof(s) of faq on this sealed suite ever (never certified), "
                      f"but only 1 of their records is in records/faq: {missing} missing (deleted, moved, or made in a copy "
                      f"of this factory)\n", prompt)

    def test_an_offline_proof_of_a_model_card_is_warned_about(self):
        self.prove_sealed("faq")
        prompt = self.signed()
        for line in ("  proved on: offline (the agent's own rules); the card's model: claude-sonnet-5-5 then claude-haiku-5-5",
                     f"  {OFFLINE_WARNING}: with a model key, production runs a model this proof never asked",
                     f"  {RUBRIC_WARNING}", "y or yes signs; anything else declines and nothing is signed.\nsign it? [y/N] "):
            self.assertIn(line, prompt)
        self.assertIn("  evidence: that record, made ", prompt)
        self.assertIn(", authenticated by its evidence MAC under the factory evidence key (", prompt)
        self.assertIn("the sealed half of faq is byte for byte the one it ran", prompt)

    def test_a_card_whose_model_is_its_rules_is_not_warned_about(self):
        card = json.loads((self.root / "masters" / "faq.json").read_text())
        card["model"] = {"primary": "offline"}
        del card["draft_rubric"]
        (self.root / "masters" / "faq.json").write_text(json.dumps(card))
        self.prove_sealed("faq")
        prompt = self.signed()
        self.assertIn("  proved on: offline (the agent's own rules); the card names no model: its rules are the agent", prompt)
        self.assertNotIn("WARNING", prompt)

    def model_answers(self, answered: int, retired: int = 0, model: str = "claude-sonnet-5-5") -> None:
        """Point the card's model at a fake Anthropic server that gives `answered` final answers naming `model`,
        then says the model is retired `retired` times; the bar lowered to 0 (the answers are not all right)."""
        final = json.dumps({"topic": "none", "draft": "A colleague will answer you shortly.", "escalate": True})
        gone = Answer(404, {"type": "error", "error": {"type": "not_found_error", "message": "model retired"}})
        server = FakeServer(*[Answer(body=anthropic_message(final, model=model))] * answered, *[gone] * retired).start()
        self.addCleanup(server.close)
        self.set_bar("faq", 0.0)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="sk-test")

    def test_a_proof_on_the_cards_model_with_scored_drafts_has_no_warning(self):
        self.model_answers(20)
        with FakeSage(expectation=3.0) as sage:
            self.env.update(SAGE_ENDPOINT=sage.url, SAGE_API_KEY="sage-key")
            self.prove_sealed("faq")
        prompt = self.signed()
        self.assertIn("  proved on: anthropic (claude-sonnet-5-5); the card's model: claude-sonnet-5-5 then claude-haiku-5-5", prompt)
        self.assertNotIn("WARNING", prompt)

    def test_a_proof_answered_by_a_model_the_card_does_not_name_is_warned_about(self):
        self.model_answers(20, model="gpt-4o-mini")   # a proxy put another model behind the card's
        self.prove_sealed("faq")
        prompt = self.signed()
        self.assertIn("  proved on: anthropic (gpt-4o-mini); the card's model: claude-sonnet-5-5 then claude-haiku-5-5\n"
                      "  WARNING: cases were answered by gpt-4o-mini, a model the card does not name: this is no proof of "
                      "claude-sonnet-5-5 or claude-haiku-5-5\n", prompt)

    def test_a_proof_partly_answered_by_the_rules_is_warned_about(self):
        self.model_answers(2, retired=4)   # two cases answered; the primary and fallback of the next two retired, then no answer
        self.prove_sealed("faq", "--jobs", "1")
        prompt = self.signed()
        self.assertRegex(prompt, r"\n  proved on: anthropic, offline-after-error: [^\n]+ \(claude-sonnet-5-5\); the card's model: ")
        self.assertRegex(prompt, r"\n  WARNING: part of this proof ran the agent's offline rules \(offline-after-error: "
                                 r"[^\n]+\), not the card's model\n")
        self.assertNotIn(OFFLINE_WARNING, prompt)

    def test_yes_signs_too(self):
        self.prove_sealed("faq")
        self.signed(answer=b"yes\n")
        self.assertTrue((self.root / "registry" / "faq.card.json").exists())

    def test_the_certificate_it_replaces_and_the_recall_since(self):
        self.prove_sealed("faq")
        first = self.signed()
        self.assertIn("  replaces no certificate: this is its first\n  recalled: never\n", first)
        signed_at = self.cert("faq")["signed_at"]
        self.assertEqual(self.factory("recall", "faq", "--reason", "drafts promised refunds")[0], 0)
        self.prove_sealed("faq")
        second = self.signed(tier="C0")
        self.assertIn(f"  replaces registry/faq.card.json: C1 signed by alice at {signed_at}; now: recalled since "
                      f"certification: drafts promised refunds.", second)
        self.assertRegex(second, r"\n  recalled since: \S+ \(faq, by tester\): drafts promised refunds\n")

    def test_a_sealed_suite_that_moved_since_the_certificate_is_shown_with_both_digests(self):
        sealed = self.root / "evals" / "faq" / "sealed.jsonl"
        self.prove_sealed("faq")
        self.assertNotIn("sealed suite changed", self.signed())
        before = self.cert("faq")["suite_digest"]
        first = json.loads(sealed.read_text().splitlines()[0])
        sealed.write_text(sealed.read_text() + json.dumps({**first, "id": "s-added"}) + "\n")
        self.refused("the sealed suite changed since the sealed proof (evals/faq/sealed.jsonl): prove faq --sealed again",
                     "certify", "faq", "--tier", "C1", "--by", "alice")
        self.prove_sealed("faq")
        after = json.loads(sorted((self.root / "records" / "faq").glob("*.sealed.json"))[-1].read_text())["suite_digest"]
        self.assertNotEqual(before, after)
        prompt = self.signed()
        self.assertIn(f"\n  the sealed suite changed since that certificate: it was proved on {before}, this proof ran "
                      f"{after} (the sealed half of faq)\n", prompt)
        self.assertEqual(self.cert("faq")["suite_digest"], after)

    def keywords(self, contact: str) -> None:
        """faq's contact topic answers to these words only (space-separated); the bar lowered to 0."""
        module = self.root / "agents" / "faq.py"
        words = ", ".join(f'"{word}"' for word in contact.split())
        module.write_text(re.sub(r'"contact": \([^)]*\),', f'"contact": ({words},),', module.read_text(), count=1))
        self.set_bar("faq", 0.0)

    def test_a_recertification_shows_what_the_new_version_fixes_and_breaks(self):
        self.keywords("contact email e-mail address")             # s-10 "What is your phone number?" fails
        self.prove_sealed("faq")
        self.assertNotIn("against the proof certified before", self.signed())
        first = self.cert("faq")
        self.keywords("contact e-mail phone")                      # s-10 passes; s-9, s-11, s-12 fail
        self.prove_sealed("faq")
        prompt = self.signed()
        self.assertIn(f"\n  against the proof certified before (records/faq/{first['sealed_record']}, faq's C1 of "
                      f"{first['signed_at']}): on the 20 sealed cases both ran, this version fixes 1 and breaks 3 (McNemar "
                      f"exact p = 0.625); broke: s-9, s-11, s-12\n", prompt)
        second = self.cert("faq")
        self.assertEqual(self.factory("stamp", "faq", "--as", "faq-eu")[0], 0)   # a variant compares with its master
        self.prove_sealed("faq-eu")
        self.assertIn(f"\n  against the proof certified before (records/faq/{second['sealed_record']}, faq's C1 of "
                      f"{second['signed_at']}): on the 20 sealed cases both ran, this version fixes 0 and breaks 0 "
                      f"(McNemar exact p = 1.000)\n", self.signed("faq-eu"))
        record = self.root / "records" / "faq" / second["sealed_record"]
        record.write_text(json.dumps({**json.loads(record.read_text()), "ran": []}))
        self.keywords("contact")
        self.prove_sealed("faq")
        self.assertIn(f"\n  against the proof certified before (records/faq/{second['sealed_record']}, faq's C1 of "
                      f"{second['signed_at']}): no paired comparison, that record does not verify with the factory evidence "
                      f"key: it was changed after it was written\n", self.signed())

    def test_sealed_attempts_count_every_proof_since_the_last_certification(self):
        """After a recall and four sealed proofs with a code tweak between each, the prompt counts four."""
        self.prove_sealed("faq")
        self.signed()
        signed_at = self.cert("faq")["signed_at"]
        self.assertEqual(self.factory("recall", "faq", "--reason", "wrong hours")[0], 0)
        module = self.root / "agents" / "faq.py"
        for tweak in range(4):
            module.write_text(module.read_text() + f"# tweak {tweak}\n")
            self.prove_sealed("faq")
        prompt = self.signed()
        self.assertIn(f"  sealed attempts since the last certification ({signed_at}): 4, across 4 version(s) of the "
                      f"agent; 1 of this one\n", prompt)


    def test_sealed_attempts_are_counted_where_deleting_records_cannot_lower_them(self):
        """Three sealed proofs with a tweak between each, the first two records deleted (records/ is the
        author's and git ignores it): the prompt still counts three, from this machine's anchor in the keys
        folder, and says two records are missing; after a certification it counts from there."""
        module = self.root / "agents" / "faq.py"
        for tweak in range(3):
            module.write_text(module.read_text() + f"# tweak {tweak}\n")
            self.prove_sealed("faq")
        records = sorted((self.root / "records" / "faq").glob("*.sealed.json"))
        for path in records[:2]:
            path.unlink()
        prompt = self.signed()
        self.assert_counted(prompt, ever=3, missing=2)
        signed_at = self.cert("faq")["signed_at"]
        for _ in range(2):
            self.prove_sealed("faq")
        sorted((self.root / "records" / "faq").glob("*.sealed.json"))[-2].unlink()
        prompt = self.signed()
        self.assertIn(f"  sealed attempts since the last certification ({signed_at}): 2, across 1 version(s) of the agent "
                      f"in the records left; 1 of this one\n", prompt)
        self.assertIn("records is in records/faq: 1 missing (deleted, moved, or made in a copy of this factory)\n", prompt)

    def test_sealed_proofs_made_in_a_copy_of_the_tree_count_with_the_original(self):
        """Three sealed proofs in a copy of the tree (same machine, same keys folder), then one here: the prompt
        counts four, from this machine's count per agent and sealed suite; after a certification, proofs in
        the copy count again, and proofs on a sealed half that is not this one's do not."""
        copy = self.tmp / "copy"
        shutil.copytree(self.root, copy, symlinks=True)
        in_copy = {**self.env, "FACTORY_ROOT": str(copy)}
        module = copy / "agents" / "faq.py"
        for tweak in range(3):
            module.write_text(module.read_text() + f"# tweak {tweak}\n")
            self.assertEqual(self.factory("prove", "faq", "--sealed", env=in_copy)[0], 0)
        shutil.copy2(module, self.root / "agents" / "faq.py")
        self.prove_sealed("faq")
        prompt = self.signed()
        self.assert_counted(prompt, ever=4, missing=3)
        signed_at = self.cert("faq")["signed_at"]
        for _ in range(2):
            self.assertEqual(self.factory("prove", "faq", "--sealed", env=in_copy)[0], 0)
        self.prove_sealed("faq")
        self.assertIn(f"  sealed attempts since the last certification ({signed_at}): 3, across 1 version(s) of the agent "
                      f"in the records left; 1 of this one\n", self.signed())
        signed_at = self.cert("faq")["signed_at"]
        self.assertEqual(self.factory("prove", "faq", "--sealed", env=in_copy)[0], 0)   # on the sealed half as it was
        sealed = self.root / "evals" / "faq" / "sealed.jsonl"
        first = json.loads(sealed.read_text().splitlines()[0])
        sealed.write_text(sealed.read_text() + json.dumps({**first, "id": "s-added"}) + "\n")
        self.prove_sealed("faq")
        prompt = self.signed()
        self.assertIn(f"  sealed attempts since the last certification ({signed_at}): 1, across 1 version(s) of the agent; "
                      f"1 of this one\n", prompt)
        self.assertNotIn("WARNING: this machine ran", prompt)


class VariantChanges(LineTest):
    """A variant's prompt names each way it differs from its master: added grants, removed denials, a raised
    tier ceiling, a lowered pass bar, and any other field."""

    def test_each_change_is_named_for_what_it_does(self):
        sets = ['tools=["issues:label","drafts:write","billing:refund"]', "tools_denied=[]", "tier_ceiling=C3",
                "evals.pass_bar=0", "owner=eu-lead", "max_steps=12"]
        code, _, err = self.factory("stamp", "triager", "--as", "tri-x", *[f"--set={s}" for s in sets])
        self.assertEqual(code, 0, err)
        self.prove_sealed("tri-x")
        done = self.certify("tri-x")
        self.assertEqual(done.returncode, 0, done.stderr)
        changes = done.stderr.split("  variant of triager; what it changes relative to triager:\n")[1].split("\n  sealed proof")[0]
        self.assertEqual(changes.splitlines(), [
            "    added grant billing:refund", "    removed denial billing:refund", "    lowered evals.pass_bar 0.6 -> 0",
            "    raised max_steps 6 -> 12", "    raised tier ceiling C2 -> C3", '    changed owner: "support-lead" -> "eu-lead"'])

    def test_a_master_shows_no_variant_line(self):
        self.set_bar("triager", 0.0)
        self.prove_sealed("triager")
        done = self.certify("triager")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("variant of", done.stderr)

class JudgedEvidence(LineTest):
    """The triager, its ceiling raised to C3, certified at C1 (bar 0) with its rubric scored: production rows of
    its digest at C1 and C2 sealed into the index as the line seals them."""

    def prepare(self):
        self.edit_card("triager", tier_ceiling="C3")
        self.certified("triager")
        self.prove_scored()

    def test_c3_shows_and_records_the_c2_runs_it_judged(self):
        """C3's refusal counted the C2 runs, while its prompt and the certificate's certified_rate (the drift watch's
        baseline) counted every tier's, C1's among them."""
        digest = self.cert()["digest"]
        self.runs_ok()   # a run of the line begins the index (offline: not gated, so not counted)
        self.append_index(*[index_row("triager", digest, "C1") for _ in range(42)], sealed=True)
        self.append_index(*[index_row("triager", digest, "C2", "pass" if n % 4 else "flag") for n in range(20)], sealed=True)
        signed = self.sign("triager", "C3").stderr
        self.assertIn("  production evidence since the agent (its digest) last changed: 20 authenticated gated run(s) at C2 "
                      "(what C3 is judged on), gate pass rate 15/20 = 0.75 [0.53, 0.89]; ", signed)
        self.assertEqual((self.cert()["certified_rate"], self.cert()["certified_rate_runs"]), (0.75, 20))
        prompt = self.certify("triager", "C1", answer=b"n\n").stderr
        self.assertIn(" last changed: 62 authenticated gated run(s) at any tier, gate pass rate 57/62 = ", prompt)
