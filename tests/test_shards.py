"""Sharded proofs: a half proved as K/N slices in separate clones that share only the evidence key (from the
environment, as a CI secret), merged into the one proof record certify signs; a missing, repeated or foreign
shard is refused naming it."""
import json
import shutil
import unittest
from pathlib import Path
from xml.etree import ElementTree

import factory
from tests.support import LineTest, junit_problems, write_jsonl

KEY = "5ec7e7" + "ab" * 29


class Shards(LineTest):

    def prepare(self) -> None:
        rows = [{"id": f"s{i:02}", "input": f"How do I order a new card? ({i})", "source": "synthetic",
                 "expect": {"label": "account" if i % 4 else "bug"}} for i in range(12)]   # 9 of 12 pass
        write_jsonl(self.root / "evals" / "triager" / "sealed.jsonl", rows)
        self.set_bar("triager", 0.3)

    def setUp(self):
        super().setUp()
        self.env["FACTORY_EVIDENCE_KEY"] = KEY

    def shard(self, k: int, n: int, *, key: str = KEY, root: Path | None = None) -> Path:
        """prove the sealed half's slice k/n in a clone of the factory of its own (its own keys folder, the
        evidence key from the environment); the shard record, moved into this test's records folder."""
        clone = self.tmp / f"clone-{k}-of-{n}-{len(list(self.tmp.iterdir()))}"
        shutil.copytree(root or self.root, clone / "factory", symlinks=True)
        env = {**self.env, "FACTORY_ROOT": str(clone / "factory"), "FACTORY_KEYS_DIR": str(clone / "keys"),
               "FACTORY_EVIDENCE_KEY": key}
        code, out, err = self.factory("prove", "triager", "--sealed", "--shard", f"{k}/{n}", env=env)
        self.assertEqual(code, 0, err)
        self.assertIn(f"[sealed half of triager, shard {k}/{n}] ", out)
        self.assertFalse((clone / "keys" / "_evidence.key").exists(), "the key from the environment is never written")
        [made] = (clone / "factory" / "records" / "triager").glob(f"*.sealed-shard-{k}-of-{n}.json")
        self.assertNotIn(key, made.read_text())
        self.assertNotIn("s01", made.read_text(), "a shard record names its cases by their blinded ids")
        moved = self.root / "records" / "triager" / f"{clone.name}.json"
        moved.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(made, moved)
        return moved

    def merge(self, *records: Path, junit: Path | None = None) -> tuple[int, str, str]:
        extra = ("--junit", str(junit)) if junit else ()
        return self.factory("prove", "triager", "--sealed", "--merge", *map(str, records), *extra)

    def test_three_shards_in_three_clones_merge_into_the_record_certify_signs(self):
        records = [self.shard(k, 3) for k in (1, 2, 3)]
        counts = [len(json.loads(path.read_text())["cases"]) for path in records]
        self.assertEqual(sum(counts), 12)
        junit = self.tmp / "merged.xml"
        code, out, err = self.merge(*records, junit=junit)
        self.assertEqual(code, 0, err)
        self.assertIn("[sealed half of triager] 9/12 = 0.75", out)
        [proof] = (self.root / "records" / "triager").glob("*.sealed.json")
        merged = json.loads(proof.read_text())
        code, out, err = self.factory("prove", "triager", "--sealed", "--json")
        whole = json.loads(out)
        for key in ("verdict", "score", "interval", "passing_cases", "cases", "real", "synthetic", "failures",
                    "by_expected", "digest", "suite_digest", "tool_denials", "model_answered"):
            self.assertEqual(merged[key], whole[key], key)
        sorted((self.root / "records" / "triager").glob("*.sealed.json"))[-1].unlink()   # certify signs the merged one
        self.assertEqual(junit_problems(junit), [])
        suite = ElementTree.parse(junit).getroot().find("testsuite")
        self.assertEqual([c.get("name") for c in suite.iter("testcase")],
                         [name for i in range(12) for name in (f"s{i:02}", f"s{i:02} rubric")] + ["pass bar"])
        self.assertEqual((suite.get("failures"), suite.get("errors"), suite.get("skipped")), ("0", "0", "12"))
        signed = self.sign("triager")
        self.assertIn("certified triager at C1", signed.stdout)
        self.assertEqual(self.cert()["sealed_score"], 0.75)
        self.runs_ok()

    def test_a_missing_repeated_or_foreign_shard_is_refused_naming_it(self):
        one, two, three = (self.shard(k, 3) for k in (1, 2, 3))
        shown = lambda path: f"records/triager/{path.name}"   # noqa: E731
        self.refused_writing_nothing("shard 3/3 missing: merge needs every shard of the 3", "prove", "triager",
                                     "--sealed", "--merge", str(one), str(two))
        again = self.shard(2, 3)
        self.refused_writing_nothing(f"{shown(again)}: shard 2/3 again (also {shown(two)})", "prove", "triager",
                                     "--sealed", "--merge", str(one), str(two), str(again), str(three))
        other_key = self.shard(3, 3, key="0" * 64)
        self.refused_writing_nothing(f"{shown(other_key)}: does not verify with the factory evidence key", "prove",
                                     "triager", "--sealed", "--merge", str(one), str(two), str(other_key))
        halves = self.shard(1, 2)
        self.refused_writing_nothing(f"{shown(halves)}: shard 1/2, but the others are of 3", "prove", "triager",
                                     "--sealed", "--merge", str(one), str(two), str(halves))
        self.refused_writing_nothing(f"{shown(one)}: not a shard of this proof (half, suite_digest differ); it is of the "
                                     f"sealed half: pass --sealed", "prove", "triager", "--merge", str(one), str(two), str(three))
        self.edit_card("triager", max_steps=7)   # another digest: the shards proved an agent that is no more
        self.refused_writing_nothing(f"{shown(one)}: not a shard of this proof (digest differ", "prove", "triager",
                                     "--sealed", "--merge", str(one), str(two), str(three))

    def test_every_sealed_shard_is_a_sealed_attempt_and_its_merge_none(self):
        """prove --sealed --shard K/N was never counted, so shards run again and again probed the sealed half
        uncounted, and the merge was counted as the one attempt."""
        for k in (1, 1, 1, 2):
            self.assertEqual(self.factory("prove", "triager", "--sealed", "--shard", f"{k}/2")[0], 0)
        folder = self.root / "records" / "triager"
        latest = [sorted(folder.glob(f"*.sealed-shard-{k}-of-2.json"))[-1] for k in (1, 2)]
        self.assertEqual(self.merge(*latest)[0], 0)
        prompt = self.certify("triager", answer=b"n\n").stderr
        self.assertIn("  sealed attempts ever (never certified): 4 (4 of them shards, merged into 1 proof(s)), across 1 "
                      "version(s) of the agent; 1 of this one\n", prompt)
        self.assertNotIn("WARNING: this machine ran", prompt)
        self.prove_sealed()
        self.assertIn("  sealed attempts ever (never certified): 5 (4 of them shards, merged into 1 proof(s)), across 1 ",
                      self.certify("triager", answer=b"n\n").stderr)

    def test_a_changed_sealed_half_refuses_the_shards_of_the_old_one(self):
        records = [self.shard(k, 2) for k in (1, 2)]
        sealed = self.root / "evals" / "triager" / "sealed.jsonl"
        sealed.write_text(sealed.read_text() + json.dumps({"id": "s99", "input": "Where is my card?",
                                                           "expect": {"label": "account"}}) + "\n")
        self.refused_writing_nothing("not a shard of this proof (suite_digest differ", "prove", "triager", "--sealed",
                                     "--merge", *map(str, records))

    def test_slices_are_by_case_id_and_stay_put_as_cases_are_added(self):
        ids = [f"case-{i}" for i in range(200)]
        for n in (1, 2, 3, 7):
            slices = [[i for i in ids if factory.in_shard(i, (k, n))] for k in range(1, n + 1)]
            self.assertEqual(sorted(sum(slices, [])), sorted(ids), "every case in exactly one slice")
            if n > 1:
                self.assertTrue(all(slices), f"no empty slice of {n} among 200 cases")
        self.assertTrue(all(factory.in_shard(i, None) for i in ids), "no shard: the whole half")

    def test_bad_shards_and_keys_are_refused_in_one_line(self):
        for text in ("0/3", "4/3", "3", "a/b", "-1/2"):
            with self.subTest(shard=text):
                self.usage_error("is not K/N with 1 <= K <= N", "prove", "triager", "--sealed", f"--shard={text}")
        self.usage_error("--shard proves a slice, which has no verdict", "prove", "triager", "--shard", "1/2",
                         "--junit", str(self.tmp / "x.xml"))
        self.env["FACTORY_EVIDENCE_KEY"] = "not-a-key-but-a-secret-value"
        err = self.refused("FACTORY_EVIDENCE_KEY is not an evidence key (64 hex characters", "prove", "triager", "--sealed")
        self.assertNotIn("not-a-key-but-a-secret-value", err)
        self.assertEqual(list(self.root.glob("records/*/*.json")), [])


if __name__ == "__main__":
    unittest.main()
