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
import random
import re
import select
import shutil
import signal
import stat
import time
import unittest
from pathlib import Path

import factory
from tests.support import INJECTION, LineTest, junit_problems, snapshot, spawn_at_terminal

CERT = "registry/triager.card.json"
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


# ---------------------------------------------------------------- the guards, one by one

class Guards(LineTest):
    """Each guard of RUN_GUARDS and CERTIFY_GUARDS refuses in a scenario made for it, found by its
    name: the chain stops at exactly that guard, and the station prints exactly its line. A guard
    added to a chain without a scenario here fails the test."""

    def prepare(self):
        self.certified("triager")      # certified at C1, bar 0: every run guard holds

    def forge(self, **changes) -> None:
        """Rewrite the certificate with changes and a valid signature under alice's key."""
        key = (self.tmp / "keys" / "alice.key").read_text().strip().encode()
        cert = {k: v for k, v in {**self.cert(), **changes}.items() if k != "signature"}
        (self.root / CERT).write_text(json.dumps({**cert, "signature": "hmac-sha256:" + hmac_of(key, cert)}))

    def refused_by(self, chain: tuple, claim: factory.Claim, name: str, *argv: str) -> None:
        """The chain's results end at guard `name` with a refusal, and the station prints that line alone."""
        results = factory.check_guards(claim, chain)
        self.assertEqual(results[-1][0], name, results)
        self.assertTrue(results[-1][1], results)
        self.assertTrue(all(line is None for _, line in results[:-1]), results)
        err = self.refused(results[-1][1], *argv)
        self.assertEqual(err.strip(), f"factory {argv[0]}: {results[-1][1]}")

    def test_each_run_guard_refuses(self):
        scenarios = {
            "certificate": lambda: (self.root / CERT).unlink(),
            "signer": lambda: self.forge(signer="../alice"),
            "signer key": lambda: (self.tmp / "keys").rename(self.tmp / "keys-elsewhere"),
            "signature": lambda: (self.root / CERT).write_text(json.dumps({**self.cert(), "tier": "C3"})),
            "agent": lambda: self.forge(agent="evalsmith"),
            "revocation": lambda: self.forge(revoked={"reason": "pulled by hand", "at": factory.utc_now()}),
            "recall": lambda: self.factory("recall", "triager", "--reason", "drafts promised refunds"),
            "digest": lambda: self.edit_card("triager", max_steps=7),
        }
        self.assertEqual(sorted(scenarios), sorted(name for name, _ in factory.RUN_GUARDS))
        for name, make in scenarios.items():
            with self.subTest(guard=name):
                self.setUp()
                make()
                self.refused_by(factory.RUN_GUARDS, factory.Claim(self.fac, "triager", "run"), name, "run", "triager", "hi")

    def test_each_certify_guard_refuses(self):
        def add_a_sealed_case():
            sealed = self.root / "evals" / "triager" / "sealed.jsonl"
            sealed.write_text(sealed.read_text() + '{"id": "x", "input": "x", "expect": {}}\n')
        def under_the_bar():
            self.set_bar("triager", 1.0)
            self.assertEqual(self.factory("prove", "triager", "--sealed")[0], 1)
        scenarios = {  # guard -> (the tier asked for, what makes that guard refuse)
            "tier ceiling": ("C3", lambda: None),
            "sealed proof": ("C1", lambda: shutil.rmtree(self.root / "records")),
            "digest": ("C1", lambda: self.edit_card("triager", max_steps=7)),
            "sealed suite": ("C1", add_a_sealed_case),
            "pass bar": ("C1", under_the_bar),
            "recall": ("C1", lambda: self.factory("recall", "triager", "--reason", "drafts promised refunds")),
            "production evidence": ("C2", lambda: None),
        }
        self.assertEqual(sorted(scenarios), sorted(name for name, _ in factory.CERTIFY_GUARDS))
        for name, (tier, make) in scenarios.items():
            with self.subTest(guard=name):
                self.setUp()
                make()
                claim = factory.Claim(self.fac, "triager", "certify", tier=tier)
                self.refused_by(factory.CERTIFY_GUARDS, claim, name, "certify", "triager", "--tier", tier, "--by", "alice")

    def test_one_wording_per_condition(self):
        """The same condition reads the same in every chain: only the moment and the remedy differ."""
        self.factory("recall", "triager", "--reason", "leaked drafts")
        run = factory.check_guards(factory.Claim(self.fac, "triager", "run"), factory.RUN_GUARDS)[-1]
        certify = factory.check_guards(factory.Claim(self.fac, "triager", "certify", tier="C1"), factory.CERTIFY_GUARDS)[-1]
        self.assertEqual(run, ("recall", "recalled since certification: leaked drafts. re-prove and re-certify."))
        self.assertEqual(certify, ("recall", "recalled since the sealed run: leaked drafts. re-prove before certifying."))


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
        self.assertFalse(self.keys.exists())
        first = self.sign()
        key = self.keys / "alice.key"
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

    def test_an_empty_key_file_never_signs(self):
        # a certify killed between creating the key file and writing it leaves it empty; anyone
        # can compute an HMAC with an empty key, so such a file must never sign or verify
        self.keys.mkdir(mode=0o700)
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
        for text in outputs + [d.decode("utf-8", "replace") for d in written.values()]:
            for line in text.splitlines():
                if any(re.search(rf"\b{re.escape(i)}\b", line) for i in self.ids):
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
        self.refused("the sealed suite changed since the sealed run", "certify", "triager", "--tier", "C1", "--by", "alice")

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
                self.refused_writing_nothing("the sealed suite changed since the sealed run (evals/triager/sealed.jsonl)",
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
        self.assertIn("sealed attempts since the card last changed: 3", signed.stderr)
        self.edit_card("triager", max_steps=5)
        self.prove_sealed()
        self.assertEqual(len(list((self.root / "records" / "triager").glob("*.sealed.json"))), 4)
        self.assertIn("sealed attempts since the card last changed: 1", self.sign().stderr)


# ---------------------------------------------------------------- recall chains

class Recall(LineTest):
    """A recall reaches every variant, survives card edits, and needs a fresh sealed proof."""

    def prepare(self):
        """triager and its grand-variant b proved and certified; a (b's master) only stamped."""
        self.set_bar("triager", 0.0)
        self.assertEqual(self.factory("stamp", "triager", "--as", "a")[0], 0)
        self.assertEqual(self.factory("stamp", "a", "--as", "b")[0], 0)
        for name in ("triager", "b"):
            self.prove_sealed(name)
            self.sign(name)

    def test_recall_reaches_a_variant_of_a_variant_until_a_fresh_proof(self):
        self.runs_ok("b")
        code, out, err = self.factory("recall", "triager", "--reason", "drafts promised refunds")
        self.assertEqual(code, 0, err)
        self.assertIn("['a', 'b']", out)
        self.refused_writing_nothing("recalled since certification: drafts promised refunds", "run", "b", "hi")
        card_path = self.root / "masters" / "b.json"
        original = card_path.read_bytes()
        card = json.loads(original)
        for dropped in (("stamped_from",), ("stamped_from", "master_digest", "overrides")):
            with self.subTest(dropped=dropped):
                card_path.write_text(json.dumps({k: v for k, v in card.items() if k not in dropped}, indent=2))
                self.refused_writing_nothing(("recalled", "changed"), "run", "b", "hi")
        card_path.write_bytes(original)
        self.refused_writing_nothing("recalled since the sealed run: drafts promised refunds. re-prove before certifying.", "certify", "b", "--tier", "C1", "--by", "alice")
        at_terminal = self.at_terminal("certify", "b", "--tier", "C1", "--by", "alice")
        self.assertEqual(at_terminal.returncode, 1, at_terminal.stderr)
        self.assertIn("recalled since the sealed run: drafts promised refunds", at_terminal.stderr)
        self.prove_sealed("b")
        self.sign("b")
        self.runs_ok("b")

    def test_recall_reaches_down_not_up(self):
        code, out, err = self.factory("recall", "a", "--reason", "a bad override")
        self.assertEqual(code, 0, err)
        self.refused("recalled since certification: a bad override", "run", "b", "hi")
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


# ---------------------------------------------------------------- a certify killed while it writes

class KilledCertify(LineTest):
    """A certify killed while it writes (the key, the archived certificate, the revocation, the new
    certificate) leaves every file whole. Each kill is aimed: it waits for the prompt, answers y,
    and lands a few milliseconds into the writes; every other kill also catches the key's creation."""

    def prepare(self):
        self.set_bar("triager", 0.0)
        self.prove_sealed()

    def kill_after_answering(self, delay: float) -> None:
        """Start certify at a terminal, wait for `sign it?`, answer y, SIGKILL it `delay` seconds later."""
        child, leader = spawn_at_terminal(["certify", "triager", "--tier", "C1", "--by", "alice"], self.env)
        try:
            seen, deadline = b"", time.monotonic() + 30
            while b"sign it?" not in seen and time.monotonic() < deadline:
                ready, _, _ = select.select([child.stderr], [], [], 0.5)
                seen += os.read(child.stderr.fileno(), 4096) if ready else b""
            self.assertIn(b"sign it?", seen)
            os.write(leader, b"y\n")
            time.sleep(delay)
            child.send_signal(signal.SIGKILL)
            child.communicate()
        finally:
            os.close(leader)

    def assert_registry_whole(self) -> None:
        """Every *.json under registry/ parses and every *.jsonl line parses (a killed write's temporary
        file is never read, so it may be partial)."""
        for path in sorted(p for p in (self.root / "registry").rglob("*") if p.suffix in (".json", ".jsonl")):
            lines = [path.read_text()] if path.suffix == ".json" else path.read_text().splitlines()
            for line in lines:
                try:
                    json.loads(line)
                except ValueError as error:
                    self.fail(f"{path.relative_to(self.root)} is torn after a kill: {error}")

    def test_a_killed_certify_leaves_every_json_whole(self):
        rng = random.Random()
        for attempt in range(6):
            if attempt % 2 == 0:
                shutil.rmtree(self.tmp / "keys", ignore_errors=True)     # also kill key creation
            self.kill_after_answering(rng.uniform(0.0, 0.004))
            self.assert_registry_whole()
            key = self.tmp / "keys" / "alice.key"
            if key.exists():
                self.assertRegex(key.read_text(), r"^[0-9a-f]{64}\n?$", f"kill {attempt}: a torn key file")
        self.sign()
        self.runs_ok()


if __name__ == "__main__":
    unittest.main()
