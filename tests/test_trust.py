"""Certificates you can trust: the guards as data (each refuses, found by name), tampering with a
certificate, signing keys, the sealed half, recall chains, and a certify killed while it writes.

Every check drives the real stations: in-process through factory.main, or in a child process when
a terminal or a SIGKILL is the point. Nothing patches the product.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import unittest
from pathlib import Path

import broker
import factory
from tests import trust_helpers
from tests.fake_sage import FakeSage
from tests.test_readme import readme_block, shows
from tests.support import (FIXTURES, INJECTION, REPO, CertifiedTest, LineTest, at_terminal, chained_line, fingerprint,
                           junit_problems, own_anchor, snapshot)

CERT = "registry/triager.card.json"
HELPER = Path(trust_helpers.__file__).resolve()
TICKETS = ["My card was charged twice for the same coffee, please look into it.",
           "How do I change the phone number on my profile?",
           "The app crashes every time I open the statements tab."]


def hmac_of(key: bytes, cert: dict) -> str:
    """HMAC-SHA256 hex over the canonical JSON of the signed fields of a certificate."""
    body = {k: v for k, v in cert.items() if k not in ("signature", "revoked")}
    return hmac.new(key, factory.canonical(body), hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- tampering with a certificate

def plausible(field: str, value):
    """A different, plausible value for one certificate field (same type where that makes sense)."""
    special = {"tier": lambda: "C3" if value != "C3" else "C0", "agent": lambda: "evalsmith",
               "signer": lambda: "mallory", "format": lambda: "factory-certificate-2",
               "identity": lambda: "svc-root@bank", "owner": lambda: "mallory",
               "grants": lambda: list(value or []) + ["billing:refund"], "denied": lambda: [],
               "envelope_usd": lambda: 1000.0, "sealed_score": lambda: 1.0 if value != 1.0 else 0.99,
               "sealed_record": lambda: "20990101T000000000000Z-abcdef.sealed.json"}
    if field in special:
        return special[field]()
    if field == "signature" and isinstance(value, str):
        return value[:-1] + ("0" if value[-1] != "0" else "1")
    if isinstance(value, str) and value.startswith("sha256:"):
        return "sha256:" + hashlib.sha256(b"something else").hexdigest()
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d\d-\d\dT.*Z", value):
        return "2099" + value[4:]
    if isinstance(value, dict):
        changed = dict(value)
        first = sorted(changed)[0] if changed else "extra"
        changed[first] = plausible(first, changed.get(first, ""))
        return changed
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        return value + ["extra"]
    return f"{value}-x"


def edit_latest_sealed_record(root: Path, **changes) -> Path:
    """Rewrite the newest sealed proof record of triager with some fields replaced (its MAC left as it was)."""
    path = sorted((root / "records" / "triager").glob("*.sealed.json"))[-1]
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}, indent=2))
    return path


# ---------------------------------------------------------------- the guards, one by one

class Guards(LineTest):
    """Each guard of RUN_GUARDS and CERTIFY_GUARDS refuses in a scenario made for it, found by its
    name: the chain stops at exactly that guard, and the station prints exactly its line. A guard
    added to a chain without a scenario here fails the test."""

    def prepare(self):
        self.assertEqual(self.factory("stamp", "triager", "--as", "variant")[0], 0)   # a lineage entry before signing
        self.certified("triager")      # certified at C1, bar 0: every run guard holds

    def forge(self, **changes) -> None:
        """Rewrite the certificate with changes and a valid signature under alice's key."""
        key = (self.tmp / "keys" / "alice.key").read_text().strip().encode()
        cert = {k: v for k, v in {**self.cert(), **changes}.items() if k != "signature"}
        (self.root / CERT).write_text(json.dumps({**cert, "signature": "hmac-sha256:" + hmac_of(key, cert)}))

    def forge_a_parent(self) -> None:
        """Append a lineage entry saying the master triager was stamped from evalsmith (no key is needed)."""
        lineage = self.root / "registry" / "lineage.jsonl"
        with lineage.open("a") as out:
            out.write(chained_line(lineage, {"agent": "triager", "stamped_from": "evalsmith", "at": factory.utc_now()}))

    def refused_by(self, chain: tuple, claim: factory.Claim, name: str, *argv: str) -> None:
        """The chain's results end at guard `name` with a refusal, and the station prints that line alone."""
        results = factory.guard_results(claim, chain, factory.Refusal, factory.refusal_line)
        self.assertEqual(results[-1][0], name, results)
        self.assertTrue(results[-1][1], results)
        self.assertTrue(all(line is None for _, line in results[:-1]), results)
        err = self.refused(results[-1][1], *argv)
        self.assertEqual(err.strip(), f"factory {argv[0]}: {results[-1][1]}")

    def put_back_after_signing_again(self) -> None:
        """triager signed again here, then its certificate from before copied back."""
        original = (self.root / CERT).read_bytes()
        self.sign("triager", "C1")
        (self.root / CERT).write_bytes(original)

    def cut_a_recall(self) -> None:
        """A recall made here (so this machine's anchor holds it), then the recall log emptied."""
        self.factory("recall", "triager", "--reason", "drafts promised refunds")
        (self.root / "registry" / "recalls.jsonl").write_text("")

    def test_each_run_guard_refuses(self):
        scenarios = {
            "certificate": lambda: (self.root / CERT).unlink(),
            "signer": lambda: self.forge(signer="../alice"),
            "signer key": lambda: (self.tmp / "keys").rename(self.tmp / "keys-elsewhere"),
            "signature": lambda: (self.root / CERT).write_text(json.dumps({**self.cert(), "tier": "C3"})),
            "figures": lambda: self.forge(certified_rate=0.9, certified_rate_runs=10 ** 30),
            "agent": lambda: self.forge(agent="evalsmith"),
            "logs": lambda: (self.root / "registry" / "lineage.jsonl").write_text(""),
            "newest certificate": self.put_back_after_signing_again,
            "revocation": lambda: self.forge(revoked={"reason": "pulled by hand", "at": factory.utc_now()}),
            "recall": lambda: self.factory("recall", "triager", "--reason", "drafts promised refunds"),
            "digest": lambda: self.edit_card("triager", max_steps=7),
            "lineage": self.forge_a_parent,
        }
        self.assertEqual(sorted(scenarios), sorted(name for name, _ in factory.RUN_GUARDS))
        for name, make in scenarios.items():
            with self.subTest(guard=name):
                self.setUp()
                make()
                self.refused_by(factory.RUN_GUARDS, factory.ClaimOnDisk("triager", "run", fac=self.fac), name, "run", "triager", "hi")

    def test_a_certificate_figure_out_of_range_is_named_by_the_tower(self):
        """A certified_rate_runs of 10**30 (which the drift watch cannot take), signed or edited in: the tower
        names the problem in one line, the field when the certificate verifies, and crashes nothing."""
        huge = {"certified_rate": 1.0, "certified_rate_runs": 10 ** 30}   # 1.0 * 10**30 rounds above 10**30
        for label, make, named in (
                ("signed", lambda: self.forge(**huge),
                 f"{CERT}: field 'certified_rate_runs' is a number of 31 digits, outside 0..{broker.MAX_FIGURE}"),
                ("edited", lambda: (self.root / CERT).write_text(json.dumps({**self.cert(), **huge})),
                 f"{CERT}: the certificate does not verify with alice's key")):
            with self.subTest(label):
                self.setUp()
                make()
                for argv in (("tower",), ("tower", "--json")):
                    code, out, err = self.factory(*argv)
                    self.assertNotIn("Traceback", err)
                    self.assertEqual(code, 0, err)
                    self.assertIn(named, out + err if argv == ("tower",) else json.dumps(json.loads(out)))

    def test_each_certify_guard_refuses(self):
        def add_a_sealed_case():
            sealed = self.root / "evals" / "triager" / "sealed.jsonl"
            sealed.write_text(sealed.read_text() + '{"id": "x", "input": "x", "expect": {}}\n')
        def under_the_bar():
            self.set_bar("triager", 1.0)
            self.assertEqual(self.factory("prove", "triager", "--sealed")[0], 3)
        scenarios = {  # guard -> (the tier asked for, what makes that guard refuse)
            "logs": ("C1", self.cut_a_recall),
            "tier ceiling": ("C3", lambda: None),
            "sealed proof": ("C1", lambda: shutil.rmtree(self.root / "records")),
            "proof evidence": ("C1", lambda: edit_latest_sealed_record(self.root, score=1.0)),
            "digest": ("C1", lambda: self.edit_card("triager", max_steps=7)),
            "sealed suite": ("C1", add_a_sealed_case),
            "pass bar": ("C1", under_the_bar),
            "recall": ("C1", lambda: self.factory("recall", "triager", "--reason", "drafts promised refunds")),
            "acting evidence": ("C2", lambda: None),   # no decision model here: the sealed proof's rubric never ran
            "production evidence": ("C2", self.prove_scored),
            "lineage": ("C1", self.forge_a_parent),
        }
        self.assertEqual(sorted(scenarios), sorted(name for name, _ in factory.CERTIFY_GUARDS))
        for name, (tier, make) in scenarios.items():
            with self.subTest(guard=name):
                self.setUp()
                make()
                claim = factory.ClaimOnDisk("triager", "certify", tier=tier, fac=self.fac)
                self.refused_by(factory.CERTIFY_GUARDS, claim, name, "certify", "triager", "--tier", tier, "--by", "alice")

    def test_one_wording_per_condition(self):
        """The same condition reads the same in every chain: only the moment and the remedy differ."""
        self.factory("recall", "triager", "--reason", "leaked drafts")
        run = factory.guard_results(factory.ClaimOnDisk("triager", "run", fac=self.fac), factory.RUN_GUARDS, factory.Refusal, factory.refusal_line)[-1]
        certify = factory.guard_results(factory.ClaimOnDisk("triager", "certify", tier="C1", fac=self.fac), factory.CERTIFY_GUARDS,
                                         factory.Refusal, factory.refusal_line)[-1]
        self.assertEqual(run, ("recall", "recalled since certification: leaked drafts. re-prove and re-certify."))
        self.assertEqual(certify, ("recall", "recalled since the sealed proof: leaked drafts. re-prove before certifying."))


# ---------------------------------------------------------------- tampering with a certificate

class Tampering(LineTest):
    """A certificate changed after signing is refused at run, whatever was changed and however.
    Prepared once: triager, other and eu certified by alice, evalsmith by alice, bobs by bob."""

    def prepare(self):
        self.certified()
        for name in ("other", "eu", "bobs"):
            self.assertEqual(self.factory("stamp", "triager", "--as", name)[0], 0)
            self.prove_sealed(name)
            self.sign(name, signer="bob" if name == "bobs" else "alice")
        self.certified("evalsmith")

    def setUp(self):
        super().setUp()
        self.path = self.root / CERT
        self.original = self.path.read_bytes()
        self.fields = json.loads(self.original)

    def test_every_field_changed_is_refused(self):
        self.assertGreaterEqual(len(self.fields), 10, self.fields)
        for key, value in self.fields.items():
            with self.subTest(field=key):
                changed = plausible(key, value)
                self.assertNotEqual(changed, value)
                self.path.write_text(json.dumps({**self.fields, key: changed}, indent=2))
                if key == "signer":
                    expected = "signed by mallory, whose key is not on this machine"
                else:
                    expected = "does not verify with alice's key"
                self.assertIn(CERT, self.refused_writing_nothing(expected, "run", "triager", "hi"))
        self.path.write_bytes(self.original)
        self.runs_ok()

    def test_every_field_removed_is_refused(self):
        for key in self.fields:
            with self.subTest(field=key):
                self.path.write_text(json.dumps({k: v for k, v in self.fields.items() if k != key}, indent=2))
                expected = "does not verify" if key in ("signer", "signature") else "does not verify with alice's key"
                self.assertIn(CERT, self.refused_writing_nothing(expected, "run", "triager", "hi"))
        self.path.write_bytes(self.original)
        self.runs_ok()

    def test_an_added_field_is_refused(self):
        self.path.write_text(json.dumps({**self.fields, "tier_override": "C3"}, indent=2))
        self.refused_writing_nothing("does not verify with alice's key", "run", "triager", "hi")

    def test_hand_edited_tier_c1_to_c3_is_refused(self):
        # the demo of the issue: change one word in the file, leave the signature alone
        text = self.original.decode()
        self.assertIn('"tier": "C1"', text)
        self.path.write_text(text.replace('"tier": "C1"', '"tier": "C3"'))
        err = self.refused_writing_nothing("does not verify with alice's key; it was changed after signing",
                                           "run", "triager", "hi")
        self.assertIn(CERT, err)

    def test_signer_changed_to_another_signer_whose_key_is_here(self):
        self.assertTrue((self.tmp / "keys" / "bob.key").is_file())   # bob signed bobs: his key is on this machine
        self.path.write_text(json.dumps({**self.fields, "signer": "bob"}, indent=2))
        self.refused_writing_nothing("does not verify with bob's key", "run", "triager", "hi")

    def test_signer_changed_to_a_name_that_is_not_a_signer(self):
        for signer in ("../alice", "", "alice/../../bob", 7, None, ["alice"]):
            with self.subTest(signer=signer):
                self.path.write_text(json.dumps({**self.fields, "signer": signer}, indent=2))
                self.assertIn(CERT, self.refused_writing_nothing("does not verify", "run", "triager", "hi"))

    def test_a_certificate_copied_from_another_agent_is_refused(self):
        shutil.copyfile(self.root / "registry" / "other.card.json", self.path)
        self.assertIn("'other'", self.refused_writing_nothing("does not verify here", "run", "triager", "hi"))

    def test_a_certificate_copied_from_evalsmith_is_refused(self):
        shutil.copyfile(self.root / "registry" / "evalsmith.card.json", self.path)
        self.assertIn("'evalsmith'", self.refused_writing_nothing("does not verify here", "run", "triager", "hi"))

    def test_a_certificate_signed_by_a_key_this_machine_lacks(self):
        (self.tmp / "keys").rename(self.tmp / "keys-on-another-machine")
        err = self.refused_writing_nothing("signed by alice, whose key is not on this machine", "run", "triager", "hi")
        self.assertIn(CERT, err)

    def test_a_revoked_mark_added_by_hand_is_honoured(self):
        self.path.write_text(json.dumps({**self.fields, "revoked": {"reason": "pulled by hand", "at": factory.utc_now()}}))
        self.refused_writing_nothing("certificate revoked: pulled by hand", "run", "triager", "hi")

    def test_a_revoked_mark_of_any_shape_refuses_in_one_line(self):
        for mark in (True, "yes", 1, ["pulled"]):
            with self.subTest(revoked=mark):
                self.path.write_text(json.dumps({**self.fields, "revoked": mark}))
                self.refused_writing_nothing("revoked", "run", "triager", "hi")

    def test_removing_the_revoked_mark_does_not_unrevoke(self):
        self.edit_card("triager", owner="new-lead")
        code, out, err = self.factory("restamp", "triager")
        self.assertIn("revoked 3 certificate(s): ['bobs', 'eu', 'other']", out, err)
        path = self.root / "registry" / "eu.card.json"
        marked = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in marked.items() if k != "revoked"}, indent=2))
        self.refused_writing_nothing("certificate revoked: restamped: triager changed", "run", "eu", "hi")

    def test_a_superseded_certificate_put_back_is_refused(self):
        # alice demotes triager from C1 to C0; copying the old C1 file back must not bring C1 back
        self.assertEqual(self.fields["tier"], "C1")
        self.sign("triager", tier="C0")
        self.assertEqual(self.cert()["tier"], "C0")
        self.path.write_bytes(self.original)
        self.refused_writing_nothing(("superseded", "revoked", "does not verify"), "run", "triager", "hi")

    def test_a_superseded_certificate_put_back_with_its_revocation_cut_is_refused(self):
        self.sign("triager", tier="C0")                                   # demoted: the C1 certificate is revoked
        self.path.write_bytes(self.original)                              # ... copied back
        revocations = self.root / "registry" / "revocations.jsonl"
        kept = revocations.read_text().splitlines(keepends=True)
        revocations.write_text("".join(kept[:-1]))                       # ... and its revocation cut
        err = self.refused_writing_nothing(f"registry/revocations.jsonl: has {len(kept) - 1} entries but had {len(kept)} "
                                           f"when this machine last wrote or verified it", "run", "triager", "hi")
        self.assertIn("entries were removed since; restore the log from a copy", err)
        revocations.write_text("".join(kept))
        self.refused_writing_nothing("registry/triager.card.json: superseded: this machine has seen triager's certificate "
                                     "signed at", "run", "triager", "hi")


# ---------------------------------------------------------------- signing keys

class Keys(LineTest):
    """Keys are created on first use, 0600, outside the root, and never copied into it."""

    def prepare(self):
        self.set_bar("triager", 0.0)
        self.prove_sealed()

    def setUp(self):
        super().setUp()
        self.keys = self.tmp / "keys"

    def test_key_created_on_first_use_with_mode_0600_and_certify_says_where(self):
        key = self.keys / "alice.key"
        self.assertFalse(key.exists())
        first = self.sign()
        self.assertTrue(key.is_file(), list(self.keys.iterdir()) if self.keys.exists() else "no keys dir")
        self.assertIn(str(key), first.stderr)
        self.assertEqual(stat.S_IMODE(key.stat().st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(self.keys.stat().st_mode) & 0o077, 0, "the keys folder is open to others")
        secret = key.read_text().strip()
        self.assertRegex(secret, r"^[0-9a-f]{64}$")
        self.assertIn(hmac_of(secret.encode(), self.cert()), self.cert()["signature"])
        again = self.sign()
        self.assertNotIn("created signing key", again.stderr)
        self.assertEqual(key.read_text().strip(), secret)

    def test_the_key_never_lands_under_the_root(self):
        signed = self.sign()
        self.assertIn("created signing key", signed.stderr)
        outputs = [signed.stdout, signed.stderr]
        secret = (self.keys / "alice.key").read_text().strip()
        for argv in (("run", "triager", INJECTION), ("run", "triager", "hello"), ("tower",),
                     ("digest", "triager", "--explain"), ("stamp", "triager", "--as", "copy"),
                     ("recall", "copy", "--reason", "test"), ("restamp", "triager")):
            outputs += self.factory(*argv)[1:]
        forms = {secret.encode(), secret.upper().encode(), bytes.fromhex(secret)}
        files = snapshot(self.root)
        self.assertIn(CERT, files)
        for path, data in files.items():
            for form in forms:
                self.assertNotIn(form, data, f"the signing key is in {path}")
        for text in outputs:
            self.assertNotIn(secret, text)
        self.assertFalse(self.keys.resolve().is_relative_to(self.root.resolve()))

    def test_a_keys_folder_inside_the_root_is_refused(self):
        # whoever writes the tree could read its keys and rewrite this machine's anchor
        for inside in (self.root / "registry" / "keys", self.root):
            with self.subTest(inside=inside):
                self.env["FACTORY_KEYS_DIR"] = str(inside)
                for argv in (("prove", "triager", "--sealed"), ("run", "triager", "hi"), ("tower",)):
                    self.refused_writing_nothing(f"the keys folder {inside} is inside the factory root {self.root}: "
                                                 f"it must live outside the factory root", *argv)
        self.assertFalse((self.root / "registry" / "keys").exists())

    def test_an_empty_key_file_never_signs(self):
        # a certify killed between creating the key file and writing it leaves it empty; anyone
        # can compute an HMAC with an empty key, so such a file must never sign or verify
        (self.keys / "alice.key").touch(mode=0o600)
        signed = self.at_terminal("certify", "triager", "--tier", "C1", "--by", "alice")
        cert_path = self.root / CERT
        if signed.returncode == 0:
            self.assertNotIn(hmac_of(b"", self.cert()), self.cert()["signature"],
                             "certify signed with an empty key: anyone can forge this certificate")
        else:
            self.assertNotIn("Traceback", signed.stderr)
            self.assertFalse(cert_path.exists())

    def test_a_certificate_forged_with_an_empty_key_is_refused(self):
        self.sign()
        (self.keys / "alice.key").write_text("")       # the key file got truncated
        forged = {**self.cert(), "tier": "C2"}
        forged["signature"] = "hmac-sha256:" + hmac_of(b"", forged)
        (self.root / CERT).write_text(json.dumps(forged, indent=2))
        self.refused_writing_nothing(("alice", "key"), "run", "triager", "hi")

    def test_a_key_file_that_is_not_a_key_refuses_in_one_line(self):
        self.sign()
        key = self.keys / "alice.key"
        good = key.read_bytes()
        for label, damage in (("whitespace only", lambda: key.write_text("  \n")),
                              ("half a key", lambda: key.write_bytes(good[:20])),
                              ("binary garbage", lambda: key.write_bytes(b"\xff\xfe\x00\x01" * 8)),
                              ("a directory", lambda: (key.unlink(), key.mkdir()))):
            with self.subTest(label):
                try:
                    damage()
                    self.refused_writing_nothing(("alice", "key"), "run", "triager", "hi")
                finally:
                    if key.is_dir():
                        key.rmdir()
                    key.write_bytes(good)
                    key.chmod(0o600)
        self.runs_ok()


# ---------------------------------------------------------------- the sealed half

def sealed_cases(path: Path) -> list[dict]:
    """The cases of a sealed.jsonl."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def distinctive_slice(text: str) -> str:
    """40 characters from the middle of text, plain characters preferred (they read the same in
    every encoding); the whole text when it is shorter."""
    if len(text) <= 40:
        return text
    middle = len(text) // 2 - 20
    for start in list(range(middle, len(text) - 39)) + list(range(0, middle)):
        window = text[start:start + 40]
        if re.fullmatch(r"[A-Za-z0-9 ,.]{40}", window):
            return window
    return text[middle:middle + 40]


def needles(text: str) -> set[bytes]:
    """The ways a sealed input could show up in a file or an output: raw, JSON-escaped, a slice."""
    forms = {text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1], distinctive_slice(text)}
    return {form.encode() for form in forms if form}


EXPECT_KEYS = {"expect", "wanted", "got", "wrong", "label", "escalate", "input", "draft", "denied"}


def pairings(value, ids: set, where: str = "$") -> list[str]:
    """Places in a JSON value where a sealed case id sits beside what the case expects or got."""
    found = []
    if isinstance(value, dict):
        holds_id = bool(ids & set(value)) or any(isinstance(v, str) and v in ids for v in value.values())
        if holds_id and EXPECT_KEYS & set(value):
            found.append(where)
        for key, item in value.items():
            found += pairings(item, ids, f"{where}.{key}")
    elif isinstance(value, list):
        holds_id = any(isinstance(v, str) and v in ids for v in value)
        if holds_id and any(isinstance(v, (dict, list)) for v in value):
            found.append(where)
        for number, item in enumerate(value):
            found += pairings(item, ids, f"{where}[{number}]")
    return found


def json_values(path: str, data: bytes) -> list:
    """The JSON values in a file (one for .json, one per line for .jsonl; nothing for other files)."""
    text = data.decode("utf-8", "replace")
    if path.endswith(".json"):
        return [json.loads(text)]
    if path.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return []


class Sealed(LineTest):
    """Sealed inputs stay in the sealed file; the sealed file itself is pinned by the proof."""

    def setUp(self):
        super().setUp()
        self.sealed_path = self.root / "evals" / "triager" / "sealed.jsonl"
        self.cases = sealed_cases(self.sealed_path)
        self.ids = {case["id"] for case in self.cases}

    def prepare(self):
        self.set_bar("triager", 0.0)

    def assert_nothing_sealed_in(self, written: dict, outputs: list[str]) -> None:
        """No sealed input (whole, escaped or a 40-char slice) and no id-with-expectation anywhere."""
        for case in self.cases:
            for needle in needles(case["input"]):
                for path, data in written.items():
                    self.assertNotIn(needle, data, f"sealed input of {case['id']} written to {path}")
                for text in outputs:
                    self.assertNotIn(needle.decode(), text, f"sealed input of {case['id']} printed")
        for path, data in written.items():
            for value in json_values(path, data):
                self.assertEqual(pairings(value, self.ids), [], f"{path} pairs a sealed case id with its expectation")
        named = re.compile(rf"\b(?:{'|'.join(map(re.escape, sorted(self.ids)))})\b")   # any one id, as a word
        for text in outputs + [d.decode("utf-8", "replace") for d in written.values()]:
            for line in text.splitlines():
                if named.search(line):
                    self.assertFalse(EXPECT_KEYS & set(re.findall(r"[a-z_]+", line)),
                                     f"a line names a sealed case with what it expects: {line!r}")

    def test_sealed_inputs_never_leave_the_sealed_file(self):
        before = snapshot(self.root)
        outputs = []
        junit = self.tmp / "sealed-junit.xml"
        for argv in (("prove", "triager", "--sealed"), ("prove", "triager", "--sealed", "--json", "--junit", str(junit))):
            code, out, err = self.factory(*argv)
            self.assertEqual(code, 0, out + err)
            outputs += [out, err]
        outputs.append(junit.read_text())
        self.assertEqual(junit_problems(junit), [])
        # a variant that may not label fails every sealed case: its record must still hold ids only
        self.assertEqual(self.factory("stamp", "triager", "--as", "broken", "--set", 'tools_denied=["issues:label"]',
                                      "--set", "evals.pass_bar=0")[0], 0)
        code, out, err = self.factory("prove", "broken", "--sealed")
        self.assertEqual(code, 0, out + err)
        outputs += [out, err]
        signed = self.sign()
        outputs += [signed.stdout, signed.stderr]
        tickets = self.tmp / "tickets.jsonl"
        tickets.write_text("".join(json.dumps({"id": f"r-{n}", "input": t}) + "\n" for n, t in enumerate(TICKETS)))
        for argv in (("run", "triager", "--file", str(tickets)), ("run", "triager", INJECTION, "--json"),
                     ("tower",), ("tower", "--json")):
            code, out, err = self.factory(*argv)
            self.assertEqual(code, 0, err)
            outputs += [out, err]
        written = self.written_since(before)
        for folder in ("records/", "registry/", "traces/", "outbox/"):
            self.assertTrue(any(p.startswith(folder) for p in written), f"nothing written under {folder}: {sorted(written)}")
        self.assert_nothing_sealed_in(written, outputs)
        records = {}
        for path, data in written.items():
            if path.endswith(".sealed.json"):
                records.setdefault(path.split("/")[1], json.loads(data))
        self.assertEqual(sorted(records), ["broken", "triager"])
        self.assertEqual(sorted(records["broken"]["failures"]), sorted(self.ids))
        for record in records.values():
            for failure in record["failures"]:
                self.assertIsInstance(failure, str)
                self.assertIn(failure, self.ids)

    def check_sealed_dir(self, how: str) -> None:
        """Move the sealed file out of the root; prove and certify find it through --sealed-dir or the env."""
        outside = self.tmp / "sealed-store"
        (outside / "triager").mkdir(parents=True)
        shutil.move(self.sealed_path, outside / "triager" / "sealed.jsonl")
        decoy = {"id": "decoy-1", "input": "a decoy ticket left in the root", "expect": {"label": "question"}}
        self.sealed_path.write_text(json.dumps(decoy) + "\n")      # must not be the suite that is proved
        extra = ["--sealed-dir", str(outside)] if how == "flag" else []
        if how == "env":
            self.env["FACTORY_SEALED_DIR"] = str(outside)
        before = snapshot(self.root)
        code, out, err = self.factory("prove", "triager", "--sealed", *extra)
        self.assertEqual(code, 0, out + err)
        self.assertIn(f"/{len(self.cases)} = ", out)
        signed = self.sign("triager", "C1", "alice", *extra)
        self.assertEqual(self.cert()["suite_digest"],
                         factory.sha256((outside / "triager" / "sealed.jsonl").read_bytes()))
        self.runs_ok()
        self.assert_nothing_sealed_in(self.written_since(before), [out, err, signed.stdout, signed.stderr])
        self.env.pop("FACTORY_SEALED_DIR", None)
        self.refused("the sealed suite changed since the sealed proof", "certify", "triager", "--tier", "C1", "--by", "alice")

    def test_sealed_dir_flag_works_for_prove_and_certify(self):
        self.check_sealed_dir("flag")

    def test_sealed_dir_env_works_for_prove_and_certify(self):
        self.check_sealed_dir("env")

    def test_a_changed_sealed_file_blocks_certify(self):
        self.prove_sealed()
        original = self.sealed_path.read_bytes()
        lines = original.decode().splitlines(keepends=True)
        edited, retyped = json.loads(lines[0]), json.loads(lines[0])
        edited["expect"]["label"] = "other" if edited["expect"].get("label") != "other" else "bug"
        retyped["input"] = f"{retyped['input']}?"
        changes = {
            "append a case": original + b'{"id": "t-999", "input": "one more", "expect": {"label": "bug"}}\n',
            "edit an expectation": (json.dumps(edited) + "\n" + "".join(lines[1:])).encode(),
            "edit an input": (json.dumps(retyped) + "\n" + "".join(lines[1:])).encode(),
            "remove a case": "".join(lines[1:]).encode(),
            "reorder the cases": "".join(lines[1:] + lines[:1]).encode(),
        }
        for label, data in changes.items():
            with self.subTest(label):
                self.assertNotEqual(data, original)
                self.sealed_path.write_bytes(data)
                self.refused_writing_nothing("the sealed suite changed since the sealed proof (evals/triager/sealed.jsonl)",
                                             "certify", "triager", "--tier", "C1", "--by", "alice")
        self.sealed_path.write_bytes(original)
        self.sign()

    def test_every_sealed_proof_is_kept_and_certify_shows_the_attempts(self):
        for _ in range(3):
            self.prove_sealed()
        records = sorted((self.root / "records" / "triager").glob("*.sealed.json"))
        self.assertEqual(len(records), 3)
        self.assertEqual(len({json.loads(p.read_text())["at"] for p in records}), 3)
        signed = self.sign()
        self.assertIn("sealed attempts ever (never certified): 3, across 1 version(s) of the agent; 3 of this one",
                      signed.stderr)
        signed_at = self.cert()["signed_at"]
        self.edit_card("triager", max_steps=5)
        self.prove_sealed()
        self.assertEqual(len(list((self.root / "records" / "triager").glob("*.sealed.json"))), 4)
        self.assertIn(f"sealed attempts since the last certification ({signed_at}): 1, across 1 version(s) of the "
                      f"agent; 1 of this one", self.sign().stderr)


# ---------------------------------------------------------------- recall chains

class GrandVariant(LineTest):
    """Prepared once: triager and its grand-variant b proved and certified; a (b's master) only stamped."""

    def prepare(self):
        self.set_bar("triager", 0.0)
        self.assertEqual(self.factory("stamp", "triager", "--as", "a")[0], 0)
        self.assertEqual(self.factory("stamp", "a", "--as", "b")[0], 0)
        for name in ("triager", "b"):
            self.prove_sealed(name)
            self.sign(name)


class Recall(GrandVariant):
    """A recall reaches every variant, survives card edits, and needs a fresh sealed proof."""

    def test_recall_reaches_a_variant_of_a_variant_until_a_fresh_proof(self):
        self.runs_ok("b")
        code, out, err = self.factory("recall", "triager", "--reason", "drafts promised refunds")
        self.assertEqual(code, 0, err)
        self.assertIn("['a', 'b']", out)
        self.refused_writing_nothing("recalled since certification (its master triager was recalled: drafts promised refunds). "
                                     "re-prove and re-certify.", "run", "b", "hi")
        card_path = self.root / "masters" / "b.json"
        original = card_path.read_bytes()
        card = json.loads(original)
        for dropped in (("stamped_from",), ("stamped_from", "master_digest", "overrides")):
            with self.subTest(dropped=dropped):
                card_path.write_text(json.dumps({k: v for k, v in card.items() if k not in dropped}, indent=2))
                self.refused_writing_nothing(("recalled", "changed"), "run", "b", "hi")
        card_path.write_bytes(original)
        self.refused_writing_nothing("recalled since the sealed proof (its master triager was recalled: drafts promised refunds). "
                                     "re-prove before certifying.", "certify", "b", "--tier", "C1", "--by", "alice")
        at_terminal = self.at_terminal("certify", "b", "--tier", "C1", "--by", "alice")
        self.assertEqual(at_terminal.returncode, 1, at_terminal.stderr)
        self.assertIn("recalled since the sealed proof (its master triager was recalled: drafts promised refunds)", at_terminal.stderr)
        self.prove_sealed("b")
        self.sign("b")
        self.runs_ok("b")

    def test_recall_reaches_down_not_up(self):
        code, out, err = self.factory("recall", "a", "--reason", "a bad override")
        self.assertEqual(code, 0, err)
        self.refused("recalled since certification (its master a was recalled: a bad override)", "run", "b", "hi")
        self.runs_ok("triager")

    def test_a_blank_reason_is_a_usage_error_and_records_nothing(self):
        for reason in ("", " ", "\t\n  "):
            with self.subTest(reason=reason):
                self.usage_error("argument --reason: needs a reason", "recall", "triager", "--reason", reason)
        self.assertEqual(self.factory("recall", "triager")[0], 2)
        self.assertFalse((self.root / "registry" / "recalls.jsonl").exists())

    def test_a_reason_with_a_newline_keeps_the_refusal_on_one_line(self):
        code, _, err = self.factory("recall", "triager", "--reason", "leaked drafts\nsee ticket 12")
        self.assertNotIn("Traceback", err)
        if code == 0:
            self.refused("recalled", "run", "b", "hi")


# ---------------------------------------------------------------- evidence under the factory evidence key

def index_row(agent: str, digest: str, tier: str, gate: str = "pass", **changes) -> dict:
    """An index row as a closed run writes it (without a MAC: nobody but the line has the key)."""
    row = {"run_id": factory.new_run_id(), "agent": agent, "at": factory.utc_now(), "digest": digest, "tier": tier,
           "status": "done", "reason": "answered", "verdict": "verified", "gate": gate, "p": 0.97, "backends": ["offline"],
           "cost_usd": 0.0, "steps": 2, "denied": [], "acted": 0, "staged": 0, "routed": False, "why": []}
    return {**row, **changes}


class PrunedIndex(LineTest):
    """The index is tamper-evident like the logs: rows of failed runs deleted, rows moved, or the newest rows
    cut off are named (the first gap, or the anchored head gone) by the tower, doctor and certify's count of
    production evidence, which a pruned index once lifted from 50% to 100% silently."""

    def prepare(self):
        self.certified("triager")      # C1, bar 0; triager's tier_ceiling is C2
        self.prove_scored()            # C2 asks for production evidence of a proof whose rubric ran
        for yes_p in (0.95, 0.2, 0.95, 0.2):   # two runs pass the gate, two are flagged
            with FakeSage(yes_p=yes_p) as gate:
                env = {**self.env, "SAGE_ENDPOINT": gate.url, "SAGE_API_KEY": "sage-key"}
                self.assertEqual(self.factory("run", "triager", "I was charged twice", env=env)[0], 0)

    def pass_rate(self) -> tuple:
        code, out, err = self.factory("tower", "--json")
        triager = next(a for a in json.loads(out)["agents"] if a["agent"] == "triager")
        return code, triager["passed"], triager["scored"], err

    def keep(self, keep) -> None:
        index = self.root / "traces" / "index.jsonl"
        index.write_text("".join(line for line in index.read_text().splitlines(keepends=True) if keep(json.loads(line))))

    def assert_named(self, line: str) -> None:
        code, passed, scored, err = self.pass_rate()
        self.assertEqual((code, err), (1, f"factory tower: {line}\n"))
        self.assertIn(f"\nindex: {line}\n", self.factory("doctor")[1])
        self.refused(f"tier C2 needs production evidence, which the index cannot give until it is whole: {line}",
                     "certify", "triager", "--tier", "C2", "--by", "alice")

    def test_the_whole_index_is_counted_as_it_was_written(self):
        self.assertEqual(self.pass_rate()[:3], (0, 2, 4))
        self.assertIn("\nindex: 8 line(s), 0 break(s) in its hash chain\nindex: whole, holding every row this machine anchored\n",
                      self.factory("doctor")[1])

    def test_the_rows_of_failed_runs_deleted_are_named_at_the_first_gap(self):
        flagged = {row["run_id"] for row in self.index_rows() if row["gate"] == "flag"}
        self.keep(lambda row: row["run_id"] not in flagged)   # 100% over what is left; and the gap named
        self.assert_named("traces/index.jsonl line 3: the hash chain is broken here: a row before it was removed, "
                          "edited or moved; restore the index from a copy")

    def test_rows_moved_are_named(self):
        index = self.root / "traces" / "index.jsonl"
        lines = index.read_text().splitlines(keepends=True)
        index.write_text("".join(lines[:3] + lines[5:7] + lines[3:5] + lines[7:]))
        self.assert_named("traces/index.jsonl line 4: the hash chain is broken here (and 2 more break(s) after it): a row "
                          "before it was removed, edited or moved; restore the index from a copy")

    def test_the_newest_rows_cut_off_are_named_by_this_machines_anchor(self):
        self.runs_ok()   # this machine anchors what it writes
        index = self.root / "traces" / "index.jsonl"
        anchored = len(index.read_bytes())
        index.write_text("".join(index.read_text().splitlines(keepends=True)[:-6]))   # the chain is whole: a prefix
        self.assert_named(f"traces/index.jsonl: no longer holds the rows this machine wrote or verified up to byte "
                          f"{anchored} ({self.fac.anchor_path}): rows were removed or rewritten since; restore it from a "
                          f"copy that holds them")

    def test_runs_after_the_newest_rows_were_cut_do_not_move_the_anchor_past_the_cut(self):
        self.runs_ok()
        index = self.root / "traces" / "index.jsonl"
        anchored = len(index.read_bytes())
        index.write_text("".join(index.read_text().splitlines(keepends=True)[:-6]))
        for _ in range(4):   # until the index is longer than it was: its head no longer extends the one anchored
            self.runs_ok()
        self.assertGreater(len(index.read_bytes()), anchored)
        self.assert_named(f"traces/index.jsonl: no longer holds the rows this machine wrote or verified up to byte "
                          f"{anchored} ({self.fac.anchor_path}): rows were removed or rewritten since; restore it from a "
                          f"copy that holds them")


class Evidence(LineTest):
    """What certify relies on carries a MAC under the factory evidence key: an edited sealed proof is
    refused by name, forged index rows are not counted, and the prompt shows the evidence it used."""

    def prepare(self):
        self.certified("triager")      # C1, bar 0; triager's tier_ceiling is C2

    def test_a_sealed_record_edited_from_under_bar_to_perfect_is_refused(self):
        self.set_bar("triager", 0.98)   # 200/200 would show it (0.981), the rules' score does not
        code, out, _ = self.factory("prove", "triager", "--sealed")
        self.assertEqual(code, 3, out)
        self.assertIn("UNDER BAR", out)
        record = json.loads(edit_latest_sealed_record(self.root).read_text())
        self.assertEqual(record["verdict"], "UNDER BAR")
        path = edit_latest_sealed_record(self.root, score=1.0, passing_cases=record["cases"], verdict="PASS", passed=True,
                                         failures=[], real={**record["real"], "score": 1.0, "passing_cases": record["real"]["cases"]})
        err = self.refused_writing_nothing("the sealed proof does not verify with the factory evidence key",
                                           "certify", "triager", "--tier", "C1", "--by", "alice")
        self.assertIn(path.relative_to(self.root).as_posix(), err)
        signed = self.certify("triager")
        self.assertEqual(signed.returncode, 1, "certify signed an edited proof at the terminal")
        self.assertNotIn("sign it?", signed.stderr)

    def test_a_record_without_a_mac_or_with_a_malformed_one_is_refused_in_one_line(self):
        for label, mac in (("no mac", None), ("not hex", "hmac-sha256:" + "é" * 64), ("cut", "hmac-sha256:00"),
                           ("not a string", 5)):
            with self.subTest(label):
                path = sorted((self.root / "records" / "triager").glob("*.sealed.json"))[-1]
                record = {k: v for k, v in json.loads(path.read_text()).items() if k != "mac"}
                path.write_text(json.dumps(record if mac is None else {**record, "mac": mac}))
                expected = "carries no evidence MAC" if mac is None else ("does not verify", "wrong type")
                self.refused_writing_nothing(expected, "certify", "triager", "--tier", "C1", "--by", "alice")
                self.setUp()

    def test_twenty_appended_pass_rows_do_not_earn_c2(self):
        digest = self.cert()["digest"]
        self.prove_scored()   # C2 needs the sealed proof's drafts scored
        index = self.root / "traces" / "index.jsonl"
        self.runs_ok()                                   # one real row with a real MAC, to copy from
        real = json.loads(index.read_text().splitlines()[-1])
        fakes = [index_row("triager", digest, "C1") for _ in range(19)] + [index_row("triager", digest, "C1", mac=real.get("mac", "hmac-sha256:" + "0" * 64))]
        self.append_index(*fakes)   # each chained to the line before it, as anyone who writes the tree can
        err = self.refused_writing_nothing("tier C2 needs production evidence at C1 since the agent (its digest) last changed: "
                                           "0 gated run(s) (need 20), gate pass rate - (need ", "certify", "triager", "--tier",
                                           "C2", "--by", "alice")
        self.assertIn("20 row(s) of traces/index.jsonl not counted: their evidence MAC does not verify (line 3, 4, 5, 6, 7, ...)", err)
        signed = self.certify("triager", "C2")
        self.assertEqual(signed.returncode, 1, "twenty forged rows earned C2")
        self.assertEqual(self.cert()["tier"], "C1")

    def test_one_genuine_row_copied_nineteen_times_breaks_the_chain_and_earns_nothing(self):
        with FakeSage(yes_p=0.95) as gate:
            self.env.update(SAGE_ENDPOINT=gate.url, SAGE_API_KEY="sage-key")
            self.runs_ok()                               # one genuine gated run, its row sealed
        index = self.root / "traces" / "index.jsonl"
        genuine = index.read_text().splitlines()[-1]
        self.assertEqual(json.loads(genuine)["gate"], "pass")
        with index.open("a") as out:
            out.writelines(genuine + "\n" for _ in range(19))
        self.prove_scored()
        self.refused_writing_nothing("tier C2 needs production evidence, which the index cannot give until it is whole: "
                                     "traces/index.jsonl line 3: the hash chain is broken here", "certify", "triager",
                                     "--tier", "C2", "--by", "alice")
        self.assertEqual(self.certify("triager", "C2").returncode, 1, "one run copied 19 times earned C2")

    def test_the_prompt_shows_the_evidence_it_used(self):
        digest = self.cert()["digest"]
        self.runs_ok()
        self.append_index(*[index_row("triager", digest, "C1") for _ in range(3)])
        signed = self.sign()
        record = sorted((self.root / "records" / "triager").glob("*.sealed.json"))[-1].relative_to(self.root).as_posix()
        self.assertIn(f"sealed proof {record}: ", signed.stderr)
        self.assertIn("authenticated by its evidence MAC", signed.stderr)
        self.assertIn("production evidence since the agent (its digest) last changed: 0 authenticated gated run(s) at any tier, gate pass rate -; "
                      "3 row(s) of traces/index.jsonl not counted", signed.stderr)

    def test_rows_and_records_written_by_the_line_verify(self):
        self.runs_ok()
        key = (self.tmp / "keys" / "_evidence.key").read_text().strip().encode()
        row = self.index_rows()[-1]
        record = json.loads(sorted((self.root / "records" / "triager").glob("*.sealed.json"))[-1].read_text())
        body = {k: v for k, v in record.items() if k != "mac"}
        self.assertEqual(record["mac"], "hmac-sha256:" + hmac.new(key, factory.canonical(body), hashlib.sha256).hexdigest())
        line = (self.root / "traces" / "index.jsonl").read_bytes().splitlines()[-1]   # a row: over its line as written
        self.assertEqual(row["mac"], "hmac-sha256:" + hmac.new(key, line[:line.rindex(b',"mac":')] + b"}", hashlib.sha256).hexdigest())
        self.assertEqual(stat.S_IMODE((self.tmp / "keys" / "_evidence.key").stat().st_mode), 0o600)


# ---------------------------------------------------------------- the hash-chained logs

class Chains(GrandVariant):
    """Recalls, revocations, lineage and approvals are hash-chained; certificates record their heads."""

    def log(self, name: str) -> Path:
        """registry/NAME.jsonl."""
        return self.root / "registry" / f"{name}.jsonl"

    def test_certificates_record_every_log_head(self):
        heads = self.cert("b")["chains"]
        self.assertEqual(sorted(heads), ["approvals", "lineage", "recalls", "reviews", "revocations"])
        self.assertEqual(heads["lineage"], {"count": 2, "hash": factory.sha256(self.log("lineage").read_bytes().splitlines()[-1])})
        self.assertEqual(heads["recalls"], {"count": 0, "hash": factory.GENESIS})

    def test_a_certificate_signed_before_a_log_existed_holds_it_empty_then(self):
        """Its signed heads name no `reviews` log: that log held nothing at signing, so the certificate still
        runs while the log holds entries since, and is refused once an entry it did record is gone."""
        key = (self.tmp / "keys" / "alice.key").read_text().strip().encode()
        cert = self.cert("b")
        chains = {name: head for name, head in cert["chains"].items() if name != "reviews"}
        body = {k: v for k, v in {**cert, "chains": chains}.items() if k not in factory.UNSIGNED_FIELDS}
        signature = "hmac-sha256:" + hmac.new(key, factory.canonical(body), hashlib.sha256).hexdigest()
        (self.root / "registry" / "b.card.json").write_text(json.dumps({**body, "signature": signature}))
        self.assertEqual(self.factory("run", "b", "hi")[0], 0)
        self.log("lineage").write_text("")
        self.refused("registry/lineage.jsonl: has 0 entries but had 2 when registry/b.card.json was signed", "run", "b", "hi")

    def test_a_recall_deleted_after_a_later_signature_is_detected(self):
        self.factory("recall", "triager", "--reason", "drafts promised refunds")
        self.refused("recalled since certification", "run", "b", "hi")
        self.certified("evalsmith")                      # any later signature anchors the recall
        self.log("recalls").write_text("")
        err = self.refused_writing_nothing("registry/recalls.jsonl: has 0 entries but had 1 when registry/evalsmith.card.json "
                                           "was signed: entries were removed since", "run", "b", "hi")
        self.assertIn("restore the log from a copy", err)
        self.refused("registry/recalls.jsonl: has 0 entries but had 1", "run", "evalsmith", "hi")

    def test_a_recall_cut_with_the_certificate_that_anchored_it_is_still_refused(self):
        self.factory("recall", "triager", "--reason", "drafts promised refunds")
        self.certified("evalsmith")                      # signed over the recall
        self.log("recalls").write_text("")
        (self.root / "registry" / "evalsmith.card.json").unlink()
        err = self.refused_writing_nothing("registry/recalls.jsonl: has 0 entries but had 1 when this machine last wrote or "
                                           "verified it",
                                           "run", "b", "hi")
        self.assertIn(f"({self.tmp / 'keys'}/_anchor-", err)
        self.refused_writing_nothing("registry/recalls.jsonl: has 0 entries but had 1", "recall", "a", "--reason", "again")
        self.refused_writing_nothing("registry/recalls.jsonl: has 0 entries but had 1", "certify", "b", "--tier", "C1",
                                     "--by", "alice")

    def append_decision(self, entry: dict) -> None:
        """One entry appended to registry/approvals.jsonl by hand (the chain needs no key)."""
        with self.log("approvals").open("a") as out:
            out.write(chained_line(self.log("approvals"), entry))

    def test_an_entry_no_one_signed_is_never_anchored(self):
        """An unsigned decision anyone appended, seen by every reader: the anchor does not take it in, so
        the log restored from a copy made before it is the log again, and nothing is refused."""
        copy = self.log("approvals").read_bytes() if self.log("approvals").exists() else b""
        self.append_decision({"kind": "rejected", "run_id": "20261201T000000000000Z-abcdef", "call": 1, "agent": "b",
                              "by": "mallory", "at": factory.utc_now(), "signature": "x"})
        for argv in (("tower",), ("pending",), ("run", "b", "hi"), ("doctor",)):
            self.factory(*argv)
        self.log("approvals").write_bytes(copy)
        self.runs_ok("b")
        self.assertEqual(self.factory("tower")[0], 0)
        self.assertEqual(self.factory("pending")[0], 0)

    def test_an_entry_whose_signature_verifies_is_anchored_and_the_refusal_says_what_works(self):
        """A decision alice signed (her key is here), appended elsewhere and seen here by pending: cutting it
        is refused, naming the log and this machine's anchor, and the log restored from a copy that holds
        it is accepted again. The refusal's advice is that restore, not a re-certification."""
        body = {"kind": "rejected", "run_id": "20261201T000000000000Z-abcdef", "call": 1, "agent": "b", "by": "alice",
                "at": factory.utc_now(), "reason": "a duplicate"}
        self.append_decision(factory.Signer("alice").signed(self.fac, body, factory.DECISION_UNSIGNED))
        self.assertEqual(self.factory("pending")[0], 0)
        kept = self.log("approvals").read_bytes()
        self.log("approvals").write_text("")
        err = self.refused_writing_nothing("registry/approvals.jsonl: has 0 entries but had 1 when this machine last "
                                           "wrote or verified it", "run", "b", "hi")
        self.assertIn("restore the log from a copy that holds them", err)
        self.assertNotIn("re-certify", err)
        self.log("approvals").write_bytes(kept)
        self.runs_ok("b")

    def test_the_anchor_is_kept_in_the_keys_folder_and_never_moves_back(self):
        self.factory("recall", "a", "--reason", "one")
        anchors = [self.fac.anchor_path]
        self.assertEqual(anchors[0].parent, self.tmp / "keys")
        anchor = json.loads(anchors[0].read_text())
        self.assertEqual((anchor["format"], anchor["root"]), ("factory-anchor-1", str(self.root)))
        self.assertEqual(anchor["logs"]["recalls"], {"count": 1, "hash": factory.sha256(self.log("recalls").read_bytes().rstrip(b"\n"))})
        self.assertEqual(stat.S_IMODE(anchors[0].stat().st_mode), 0o600)
        factory.raise_anchor(self.fac, logs={"recalls": {"count": 0, "hash": factory.GENESIS}})
        self.assertEqual(json.loads(anchors[0].read_text())["logs"]["recalls"]["count"], 1, "the anchor moved back")

    def test_a_keys_folder_that_cannot_be_written_says_the_registry_is_not_anchored(self):
        (self.tmp / "not-a-folder").write_text("")
        self.env["FACTORY_KEYS_DIR"] = str(self.tmp / "not-a-folder" / "keys")
        code, out, err = self.factory("recall", "a", "--reason", "one")
        self.assertEqual(code, 0, err)
        self.assertIn("cannot be written: this machine's anchor of the registry is not kept up to date, so a registry put "
                      "back to an older state may go unnoticed here", err)

    def test_an_edited_entry_breaks_the_chain_for_every_reader(self):
        self.factory("recall", "a", "--reason", "a bad override")
        self.factory("recall", "triager", "--reason", "drafts promised refunds")
        log = self.log("recalls")
        log.write_text(log.read_text().replace("a bad override", "a fine override"))
        for argv in (("run", "b", "hi"), ("certify", "b", "--tier", "C1", "--by", "alice"), ("recall", "a", "--reason", "x")):
            with self.subTest(argv=argv):
                self.refused_writing_nothing("registry/recalls.jsonl line 2: the hash chain is broken here", *argv)

    def test_a_reparenting_line_is_ignored_and_says_so(self):
        lineage = self.log("lineage")
        with lineage.open("a") as out:
            out.write(chained_line(lineage, {"agent": "b", "stamped_from": "evalsmith", "at": factory.utc_now()}))
        self.assertIn("['a', 'b']", self.factory("recall", "triager", "--reason", "drafts promised refunds")[1])
        code, out, err = self.factory("run", "b", "hi")
        self.assertEqual(code, 1, out)
        self.assertNotIn("Traceback", err)
        self.assertIn("factory: note: registry/lineage.jsonl line 3 re-parents b to evalsmith; ignored: a variant's parent "
                      "is fixed by its first lineage entry (a)", err)
        self.assertIn("factory run: recalled since certification (its master triager was recalled: drafts promised refunds)", err)

    def test_a_name_keeps_its_first_parent(self):
        (self.root / "masters" / "b.json").unlink()
        self.refused_writing_nothing("b was stamped from a before (registry/lineage.jsonl); a name keeps its first parent",
                                     "stamp", "evalsmith", "--as", "b")

    def test_an_entry_without_prev_is_refused_by_name(self):
        with self.log("recalls").open("a") as out:
            out.write(json.dumps({"agent": "evalsmith", "reason": "by hand", "at": factory.utc_now()}) + "\n")
        self.refused_writing_nothing("registry/recalls.jsonl line 1: not a hash-chained entry (no 'prev')", "run", "b", "hi")

    def test_appends_keep_the_chain_whole(self):
        for reason in ("one", "two", "three"):
            self.factory("recall", "a", "--reason", reason)
        self.edit_card("triager", owner="new-lead")
        self.assertEqual(self.factory("restamp", "triager")[0], 0)
        for name in ("recalls", "revocations", "lineage"):
            lines, prev = self.log(name).read_bytes().splitlines(), factory.GENESIS
            self.assertTrue(lines, name)
            for line in lines:
                self.assertEqual(json.loads(line)["prev"], prev, name)
                prev = factory.sha256(line)


# ---------------------------------------------------------------- key files and malformed signatures

class KeyFiles(CertifiedTest):
    """A key file or keys folder open to other users is refused with the chmod that fixes it; a signature
    that is not well-formed does not verify, in one line."""

    def test_a_key_file_others_can_read_is_refused_with_the_chmod(self):
        key = self.tmp / "keys" / "alice.key"
        for mode in (0o644, 0o640, 0o606):
            with self.subTest(mode=oct(mode)):
                key.chmod(mode)
                err = self.refused_writing_nothing("other users may read or write the key file", "run", "triager", "hi")
                self.assertIn(f"fix it with: chmod 600 {key}", err)
        key.chmod(0o600)
        self.runs_ok()

    def test_an_open_key_in_an_open_folder_names_both_fixes(self):
        keys, key = self.tmp / "keys", self.tmp / "keys" / "alice.key"
        keys.chmod(0o777)
        key.chmod(0o666)
        err = self.refused_writing_nothing("other users may read or write its folder and the key file", "run", "triager", "hi")
        self.assertIn(f"alice.key: other users may read or write its folder and the key file; refusing to use it. "
                      f"fix it with: chmod 700 {keys} && chmod 600 {key}", err)
        err = self.refused_writing_nothing("other users may read or write its folder", "certify", "triager", "--tier", "C1",
                                           "--by", "alice")
        self.assertIn(f"fix it with: chmod 700 {keys}", err)   # the evidence key in it is refused first
        keys.chmod(0o700)
        key.chmod(0o600)
        self.runs_ok()

    def test_no_key_is_written_into_a_folder_others_may_read(self):
        """A keys folder made 0755 by hand got the evidence key written into it, then refused: the key was
        already where other users could read it."""
        keys = self.tmp / "fresh-keys"
        keys.mkdir(mode=0o755)
        keys.chmod(0o755)
        code, out, err = self.factory("prove", "triager", env={**self.env, "FACTORY_KEYS_DIR": str(keys)})
        self.assertEqual((code, list(keys.iterdir())), (1, []), err)
        self.assertIn(f"other users may read or write its folder; refusing to use it. fix it with: chmod 700 {keys}", err)

    def test_an_open_evidence_key_is_refused(self):
        evidence = self.tmp / "keys" / "_evidence.key"
        evidence.chmod(0o644)
        self.refused_writing_nothing(f"fix it with: chmod 600 {evidence}", "certify", "triager", "--tier", "C1", "--by", "alice")

    def test_a_signature_that_is_not_well_formed_does_not_verify(self):
        path, cert = self.root / CERT, self.cert()
        for label, signature in (("non-ascii hex", "hmac-sha256:" + "é" * 64), ("not hex", "hmac-sha256:" + "zz" * 32),
                                 ("short", "hmac-sha256:abcd"), ("armour of garbage", "-----BEGIN SSH SIGNATURE-----\n!!\n"
                                                                "-----END SSH SIGNATURE-----\n"), ("a number", 7)):
            with self.subTest(label):
                path.write_text(json.dumps({**cert, "signature": signature}))
                self.refused_writing_nothing("the certificate does not verify (no valid signer or signature)", "run", "triager", "hi")


# ---------------------------------------------------------------- certificates signed with OpenSSH

def ssh_key(folder: Path, name: str) -> tuple[Path, str]:
    """A new ed25519 key pair under folder (no passphrase); (private key path, 'TYPE BASE64' of its public key)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return key, " ".join(key.with_suffix(".pub").read_text().split()[:2])


@unittest.skipUnless(shutil.which("ssh-keygen"), "ssh-keygen (OpenSSH) is not installed")
class SshCertificates(LineTest):
    """certify --ssh-key signs with `ssh-keygen -Y sign`; every verifier checks with `ssh-keygen -Y verify`
    against the keys folder's allowed_signers. Prepared once: alice's ssh key allowed, triager certified with it."""

    def prepare(self):
        key, public = ssh_key(self.tmp / "ssh", "alice")
        (self.tmp / "keys").mkdir(mode=0o700, exist_ok=True)
        (self.tmp / "keys" / "allowed_signers").write_text(f"alice {public}\n")
        self.set_bar("triager", 0.0)
        self.prove_sealed()
        self.sign("triager", "C1", "alice", "--ssh-key", str(key))

    def test_an_ssh_signed_certificate_verifies_with_public_keys_only(self):
        self.assertTrue(self.cert()["signature"].startswith("-----BEGIN SSH SIGNATURE-----\n"))
        self.assertFalse((self.tmp / "keys" / "alice.key").exists(), "no hmac key was made or needed")
        self.runs_ok()

    def test_an_edited_ssh_certificate_does_not_verify(self):
        path = self.root / CERT
        path.write_text(path.read_text().replace('"tier": "C1"', '"tier": "C2"'))
        self.refused_writing_nothing(f"does not verify with alice's ssh key in {self.tmp / 'keys' / 'allowed_signers'}",
                                     "run", "triager", "hi")

    def test_a_signer_not_in_allowed_signers_does_not_verify(self):
        _, bobs = ssh_key(self.tmp / "ssh", "bob")
        allowed = self.tmp / "keys" / "allowed_signers"
        alices = allowed.read_text()
        allowed.write_text(f"bob {bobs}\n")                                   # alice is no longer an allowed signer
        self.refused_writing_nothing("does not verify with alice's ssh key", "run", "triager", "hi")
        allowed.write_text(alices + f"bob {bobs}\n")
        self.runs_ok()
        (self.root / CERT).write_text(json.dumps({**self.cert(), "signer": "bob"}))   # alice's signature passed off as bob's
        self.refused_writing_nothing("does not verify with bob's ssh key", "run", "triager", "hi")

    def test_certify_with_a_key_that_is_not_allowed_signs_nothing(self):
        """It is refused before the prompt: answering y to a signature that could never verify was for nothing."""
        mallory, public = ssh_key(self.tmp / "ssh", "mallory")
        before = self.cert()
        signed = self.at_terminal("certify", "triager", "--tier", "C1", "--by", "alice", "--ssh-key", str(mallory))
        self.assertEqual(signed.returncode, 1, signed.stderr)
        self.assertEqual(signed.stderr, f"factory certify: --ssh-key {mallory}: its public key is not listed for alice in "
                                        f"the trusted allowed signers ({self.tmp / 'keys' / 'allowed_signers'}), so nothing "
                                        f"it signs verifies; add `alice {public}` to it\n")
        self.assertEqual(self.cert(), before)
        mallory.with_suffix(".pub").unlink()   # the public key derived from the private one (ssh-keygen -y)
        signed = self.at_terminal("certify", "triager", "--tier", "C1", "--by", "alice", "--ssh-key", str(mallory))
        self.assertIn(f"add `alice {public}` to it", signed.stderr)

    def test_without_allowed_signers_it_cannot_be_verified_here(self):
        (self.tmp / "keys" / "allowed_signers").unlink()
        self.refused_writing_nothing(f"signed with alice's ssh key, but there is no {self.tmp / 'keys' / 'allowed_signers'} "
                                     "to check it against; it cannot be verified here", "run", "triager", "hi")
        self.refused_writing_nothing("certify with --ssh-key: there is no", "certify", "triager", "--tier", "C1", "--by", "alice",
                                     "--ssh-key", str(self.tmp / "ssh" / "alice"))

    def test_without_ssh_keygen_one_line_says_so_and_hmac_keeps_working(self):
        self.assertEqual(self.factory("stamp", "triager", "--as", "copy")[0], 0)
        self.certified("copy")                                               # an hmac certificate
        self.env["PATH"] = str(self.tmp / "no-programs-here")
        self.refused_writing_nothing("ssh-keygen is not installed here (OpenSSH)", "run", "triager", "hi")
        self.refused_writing_nothing("ssh-keygen is not installed here (OpenSSH)", "certify", "copy", "--tier", "C1",
                                     "--by", "alice", "--ssh-key", str(self.tmp / "ssh" / "alice"))
        self.runs_ok("copy")

    def test_a_decision_signed_with_ssh_verifies_as_its_signer(self):
        signer = factory.Signer("alice", self.tmp / "ssh" / "alice")
        body = {"kind": "intent", "run_id": "r", "call": 1, "by": "alice", "at": factory.utc_now()}
        signed = signer.signed(self.fac, body, factory.DECISION_UNSIGNED)
        self.assertIsNone(factory.signature_problem(self.fac, "alice", {**signed, "prev": "x"}, factory.DECISION_UNSIGNED))
        self.assertIsNotNone(factory.signature_problem(self.fac, "alice", {**signed, "call": 2}, factory.DECISION_UNSIGNED))

    def test_the_readme_recipe_verifies_it_with_plain_ssh_keygen(self):
        """The README's recipe ("What a certificate's signature covers"), run with bash as written, makes the
        signed bytes and the signature from the certificate alone, and plain `ssh-keygen -Y verify` against
        an allowed-signers file written as the README says accepts them; one byte changed, it does not."""
        if shutil.which("bash") is None:
            self.skipTest("bash is not on this machine: the README's recipe cannot be run here")
        recipe = readme_block("# verify a certificate with plain ssh-keygen")
        verify = recipe.strip().splitlines()[-1]
        # the prose says what the recipe does: the fields left out, the namespace, the signer's field
        prose = " ".join((REPO / "README.md").read_text().split("\n### What a certificate's signature covers\n")[1]
                         .split("```sh")[0].split())
        unsigned = re.search(r"the object without its `(\w+)` and `(\w+)` fields", prose).groups()
        self.assertIn(f"not in {unsigned!r}".replace("'", '"'), recipe)
        namespace = re.search(r"`ssh-keygen -Y sign -n ([\w-]+)`", prose).group(1)
        self.assertIn(f"The namespace is `{namespace}`", prose)
        self.assertIn(f" -n {namespace} ", verify)
        self.assertIn("Its `signer` field names who signed it", prose)
        self.assertIn('cert["signer"]', recipe)
        self.assertTrue(verify.startswith("ssh-keygen -Y verify "), verify)
        work = self.tmp / "verifier"
        work.mkdir()
        public = " ".join((self.tmp / "ssh" / "alice.pub").read_text().split()[:2])
        (work / "allowed_signers").write_text(f"alice {public}\n")   # `SIGNER KEYTYPE BASE64`, as the README says
        env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "CERT": str(self.root / CERT),
               "SIGNERS": str(work / "allowed_signers")}

        def run(script: str) -> subprocess.CompletedProcess:
            return subprocess.run(["bash", "-e", "-c", script], cwd=work, env=env, capture_output=True, text=True)
        done = run(recipe)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn('Good "agent-factory" signature for alice', done.stdout + done.stderr)
        signed = (work / "signed.bin").read_bytes()
        for at in (0, len(signed) // 2, len(signed) - 1):
            with self.subTest(changed_byte=at):
                (work / "signed.bin").write_bytes(signed[:at] + bytes([signed[at] ^ 1]) + signed[at + 1:])
                self.assertNotEqual(run(verify).returncode, 0, "one byte changed still verifies")
        revoked = {**self.cert(), "revoked": {"reason": "superseded", "at": factory.utc_now()}}   # added after signing
        (self.root / CERT).write_text(json.dumps(revoked, indent=2, ensure_ascii=False))
        self.assertEqual(run(recipe).returncode, 0, "the signature does not cover `revoked`")
        (self.root / CERT).write_text((self.root / CERT).read_text().replace('"tier": "C1"', '"tier": "C3"'))
        self.assertNotEqual(run(recipe).returncode, 0, "an edited certificate still verifies")


@unittest.skipUnless(shutil.which("ssh-keygen"), "ssh-keygen (OpenSSH) is not installed")
class SshForgery(CertifiedTest):
    """Someone who may write the registry but not the keys folder makes their own ssh key, names it
    alice's, and re-signs alice's hmac certificate at C2 with it: the trusted allowed-signers file is the
    keys folder's (or FACTORY_ALLOWED_SIGNERS outside the root), and it names each signer exactly."""

    def forge_with_ssh(self, tier: str = "C2") -> Path:
        """mallory's key, listed as alice's in registry/allowed_signers; the certificate re-signed with it."""
        key, public = ssh_key(self.tmp / "mallory-ssh", "mallory")
        (self.root / "registry" / "allowed_signers").write_text(f"alice {public}\n")
        cert = {k: v for k, v in {**self.cert(), "tier": tier}.items() if k != "signature"}
        signed = subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", "agent-factory"],
                                input=factory.canonical(cert), capture_output=True, check=True)
        (self.root / CERT).write_text(json.dumps({**cert, "signature": signed.stdout.decode()}, indent=2))
        return self.tmp / "mallory-ssh" / "mallory.pub"

    def test_a_signer_added_in_the_registry_is_not_trusted(self):
        self.forge_with_ssh()
        err = self.refused_writing_nothing("signed with alice's ssh key, but there is no", "run", "triager", "hi")
        self.assertIn(f"{self.tmp / 'keys' / 'allowed_signers'} to check it against", err)
        self.assertIn("registry/allowed_signers is not read: anyone who writes the registry could add a signer", err)

    def test_allowed_signers_inside_the_root_is_refused(self):
        self.forge_with_ssh()
        self.env["FACTORY_ALLOWED_SIGNERS"] = str(self.root / "registry" / "allowed_signers")
        self.refused_writing_nothing("registry/allowed_signers is inside the factory root, where anyone who writes the "
                                     "registry could add a signer", "run", "triager", "hi")

    def test_a_signer_is_named_exactly_never_by_a_pattern(self):
        mallory = self.forge_with_ssh()
        public = " ".join(mallory.read_text().split()[:2])
        trusted = self.tmp / "keys" / "allowed_signers"
        for principals in ("*", "al*", "bob,a?ice", "*,!bob"):
            with self.subTest(principals):
                trusted.write_text(f"{principals} {public}\n")
                self.refused_writing_nothing("does not verify with alice's ssh key", "run", "triager", "hi")
        trusted.write_text(f"bob,alice {public}\n")      # the keys folder's owner lists it by name: trusted
        self.runs_ok()

    def test_a_pattern_line_does_not_add_a_key_to_a_signer_listed_by_name(self):
        # `ssh-keygen -Y verify -I alice` accepts the key of every line whose principals match alice,
        # patterns included: with alice listed by name, a `*` line (a team's CI key) would sign as alice
        mallory = self.forge_with_ssh()
        _, alices = ssh_key(self.tmp / "ssh", "alice")
        public = " ".join(mallory.read_text().split()[:2])
        trusted = self.tmp / "keys" / "allowed_signers"
        for pattern in ("*", "al*", "a?ice", "bob,*", '"*"'):
            with self.subTest(pattern):
                trusted.write_text(f"alice {alices}\n{pattern} {public}\n")
                self.refused_writing_nothing("does not verify with alice's ssh key", "run", "triager", "hi")
        signed = self.at_terminal("certify", "triager", "--tier", "C1", "--by", "alice", "--ssh-key",
                                  str(mallory.with_suffix("")))
        self.assertEqual(signed.returncode, 1, signed.stdout)
        self.assertIn("its public key is not listed for alice in the trusted allowed signers", signed.stderr,
                      "refused before the prompt: the pattern line lists no key for alice")
        trusted.write_text(f"alice {alices}\n# a comment\n\nalice,bob namespaces=\"agent-factory\" {public} mallory\n")
        self.runs_ok()                                     # a second key listed for alice by name: trusted

    def test_allowed_signers_in_a_folder_others_may_write_is_refused(self):
        self.forge_with_ssh()
        shared = self.tmp / "shared"
        shared.mkdir()
        shared.chmod(0o777)                               # anyone may replace a file in it
        trusted = shared / "allowed_signers"
        trusted.write_text("bob ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GTWj\n")
        trusted.chmod(0o600)
        self.env["FACTORY_ALLOWED_SIGNERS"] = str(trusted)
        self.refused_writing_nothing(f"other users may replace {trusted} (its folder {shared} is writable by others "
                                     f"and not sticky); fix it with: chmod go-w {shared}", "run", "triager", "hi")
        shared.chmod(0o1777)                              # sticky, as /tmp: only the file's owner may replace it
        self.refused_writing_nothing("does not verify with alice's ssh key", "run", "triager", "hi")

    @unittest.skipUnless(os.geteuid() == 0, "giving a file to another user needs root")
    def test_allowed_signers_owned_by_another_user_is_refused(self):
        self.forge_with_ssh()
        trusted = self.tmp / "trusted-signers"
        trusted.write_text("bob ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GTWj\n")
        trusted.chmod(0o644)
        os.chown(trusted, 65534, -1)                      # nobody
        self.env["FACTORY_ALLOWED_SIGNERS"] = str(trusted)
        self.refused_writing_nothing(f"{trusted} is owned by another user (uid 65534), who may change it; "
                                     f"use a file of your own", "run", "triager", "hi")

    def test_allowed_signers_others_may_write_is_refused(self):
        self.forge_with_ssh()
        trusted = self.tmp / "trusted-signers"
        trusted.write_text("bob ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GTWj\n")
        trusted.chmod(0o666)
        self.env["FACTORY_ALLOWED_SIGNERS"] = str(trusted)
        self.refused_writing_nothing(f"other users may write {trusted}; fix it with: chmod go-w {trusted}",
                                     "run", "triager", "hi")


# ---------------------------------------------------------------- the README's main job, with no keys at all

class MainJob(LineTest):
    """prove --sealed, certify at a terminal, run the inbox, tower: on a fresh machine with no keys folder."""

    def test_the_main_job_runs_end_to_end_with_no_keys(self):
        self.assertFalse((self.tmp / "keys").exists())
        code, out, err = self.factory("prove", "triager", "--sealed")
        self.assertEqual(code, 0, out + err)
        self.assertIn("created the factory evidence key at", err)
        signed = self.at_terminal("certify", "triager", "--tier", "C1", "--by", "alice", child=True)
        self.assertEqual(signed.returncode, 0, signed.stderr)
        code, out, err = self.factory("run", "triager", "--file", str(self.root / "evals" / "triager" / "inbox.jsonl"))
        self.assertEqual(code, 0, err)
        self.assertEqual(len(out.splitlines()), 20)
        code, out, err = self.factory("tower")
        self.assertEqual(code, 0, err)
        self.assertIn("triager", out)
        # the README's page one: this is its main job, and the tower ends with the lines it shows
        section = (REPO / "README.md").read_text().split("\n## Two commands on a fresh machine\n")[1].split("\n## ")[0]
        command, shown = (re.search(rf"^```{kind}\n(.*?)^```$", section, re.S | re.M).group(1) for kind in ("sh", "text"))
        self.assertEqual([shlex.split(part.replace('"$(whoami)"', "alice")) for part in command.strip().split(" && ")],
                         [["python3", "factory.py", "prove", "triager", "--sealed"],
                          ["python3", "factory.py", "certify", "triager", "--tier", "C1", "--by", "alice"],
                          ["python3", "factory.py", "run", "triager", "--file", "evals/triager/inbox.jsonl"],
                          ["python3", "factory.py", "tower"]])
        self.assertIsNone(shows(["…", *shown.splitlines()], out.splitlines()), out)


# ---------------------------------------------------------------- a certify killed while it writes

class CopiedFixtures(LineTest):
    """A certified factory the test process copies in (support.FIXTURES) is the one it made, with this
    machine's anchor moved to the new root: a step after the copy sees what it would have seen."""

    def test_a_copied_certified_factory_keeps_its_anchor_at_its_new_root(self):
        self.certified()                                  # made here, or copied from an earlier class
        first = self.cert()
        self.setUp()
        self.certified()                                  # copied: the same step from the same folder
        made = [folder for key, (folder, made_in, anchor) in FIXTURES.made.items()
                if key[1] == ("certified", "triager", "C1", True) and fingerprint(folder, made_in, anchor) == fingerprint(self.tmp)]
        self.assertEqual(len(made), 1, "the folder holds exactly what the step made")
        self.assertEqual(self.cert(), first)
        anchors = sorted((self.tmp / "keys").glob("_anchor-*.json"))
        self.assertEqual(anchors, [own_anchor(self.tmp)], "one anchor, this root's")
        self.assertEqual(json.loads(anchors[0].read_text())["root"], str(self.root))
        self.runs_ok()
        self.sign("triager", tier="C0")
        (self.root / "registry" / "triager.card.json").write_text(json.dumps(first, indent=2))
        self.refused_writing_nothing(("superseded", "revoked"), "run", "triager", "hi")


def killed_certify(test: LineTest, n: int, tier: str) -> int:
    """certify triager at TIER by alice at a pseudo-terminal, answering y, SIGKILLed before its Nth change to
    a file (tests/trust_helpers.py killed-at); the child's exit status (negative: killed, 0: it finished)."""
    argv = ["killed-at", str(n), "certify", "triager", "--tier", tier, "--by", "alice"]
    return at_terminal(argv, test.env, command=[sys.executable, str(HELPER)]).returncode


class KilledCertify(LineTest):
    """A first certify, its signer's key made on first use, killed at each of its writes in turn (the key,
    the certificate, the anchor, ...), leaves every file whole and the key whole or absent; after each kill,
    certify signs and the agent runs. Each kill lands at its write by construction, however fast the disk."""

    def prepare(self):
        self.set_bar("triager", 0.0)
        self.prove_sealed()

    def test_a_killed_certify_leaves_every_json_whole(self):
        key = self.tmp / "keys" / "alice.key"
        for n in range(1, 16):
            self.setUp()
            self.assertFalse(key.exists(), "each kill also catches the key's creation")
            finished = killed_certify(self, n, "C1") == 0
            self.assert_json_whole(("registry",), f"certify killed at its change {n}")
            if key.exists():
                self.assertRegex(key.read_text(), r"^[0-9a-f]{64}\n?$", f"certify killed at its change {n}: a torn key file")
            self.sign()
            self.runs_ok()
            if finished:
                break
        self.assertTrue(finished, "certify made more than 15 changes")
        self.assertGreaterEqual(n, 4, "the key, the certificate and the anchor: each write a kill lands before")


class KilledRecertify(LineTest):
    """A certify that replaces a certificate, killed at each of its writes in turn (the copy kept in
    history, the new certificate, the anchor, the revocation of the old one), leaves the agent runnable
    under the old certificate or the new one, never refused for a certificate that does not exist."""

    def prepare(self):
        self.certified("triager")      # at C1; each kill is of a certify to C0

    def test_a_kill_at_any_write_leaves_the_old_certificate_or_the_new_one(self):
        tiers = []
        for n in range(1, 16):
            self.setUp()
            finished = killed_certify(self, n, "C0") == 0
            code, out, err = self.factory("run", "triager", "hi")
            self.assertEqual(code, 0, f"certify killed at its change {n}: {err}")
            tiers.append(self.index_rows()[-1]["tier"])
            if finished:
                break
        self.assertEqual((tiers[0], tiers[-1]), ("C1", "C0"), tiers)
        self.assertGreaterEqual(len(tiers), 4, "certify changes the history, the certificate, the anchor and the log")


if __name__ == "__main__":
    unittest.main()
