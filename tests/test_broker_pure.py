"""The deciding code has no I/O: broker.py is loaded in a fresh process in which opening a file (open,
io.open, io.open_code, os.open, pathlib), listing a folder, a socket, the environment and printing all
raise, and every guard chain (run, certify, approve, execute, reject, deciding, standing) is run there on
evidence held in memory: a claim each chain lets through, and each guard's own refusal, word for word.
The module docstring lists the chains exactly as the tuples are. Each closed set (gate results, call states,
rulings, verdicts, decisions, ...) is defined once, in broker.py, and written out nowhere else."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = "20260101T000000000000Z-abcdef"
CALL = f"refunds:act from run {RUN} (call 1)"
GOOD = "hmac-sha256:" + "a" * 64
SSH = "-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n"
BAD_MAC = "does not verify with the factory evidence key: it was changed after it was written"
COMPONENTS = {"agent.py": "sha256:c1", "contract refunds:act": "sha256:k1"}
CERT = {"agent": "triager", "signer": "alice", "signature": GOOD, "tier": "C2", "digest": "sha256:d1",
        "components": COMPONENTS, "sealed_at": "2026-01-01T00:00:00Z", "signed_at": "2026-01-02T00:00:00Z",
        "chains": {"recalls": {"count": 0, "hash": "sha256:" + "0" * 64}}, "sealed_score": 1.0, "envelope_usd": 0.5,
        "certified_rate": None, "certified_rate_runs": 0}
CARD = {"tier_ceiling": "C3", "evals": {"pass_bar": 0.5}}
PROOF = {"digest": "sha256:d1", "components": COMPONENTS, "at": "2026-01-03T00:00:00Z", "suite": "triager",
         "suite_digest": "sha256:s1", "passing_cases": 50, "cases": 50, "pass_bar": 0.5, "rubric": "scored",
         "half": "sealed", "rubric_check": "scored 50", "mac": "ok"}
ARGS = {"amount_usd": 5}
ENTRY = {"run_id": RUN, "call": 1, "agent": "triager", "tool": "refunds:act", "args": ARGS, "certificate": GOOD,
         "digest": "sha256:d1", "staged_at": "2026-01-04T00:00:00Z", "expires_at": "2099-01-01T00:00:00Z",
         "input_digest": "d:ticket", "output_digest": "d:drafted", "mac": "ok"}   # args_digest: set in the child
PARKED = {"event": "settled", "decision": "park", "call": 1, "run_id": RUN, "tool": "refunds:act", "certificate": GOOD,
          "digest": "sha256:d1", "mac": "ok"}
EVIDENCE = {   # what every claim holds unless a scenario changes it: each guard of every chain holds on it
    "cert": CERT, "missing": None, "trusted_signers": None, "ssh_keygen": None, "hmac_key": ["/keys/alice.key", True],
    "chains": {"recalls": []}, "anchor_problem": None, "anchors": [], "seen": None, "revocation": None, "recalls": [],
    "card": CARD, "code": {"agent.py": "sha256:c1"}, "agent": {"digest": "sha256:d1", "components": COMPONENTS},
    "lineage": None, "proofs": [["records/triager/1.sealed.json", PROOF]], "suite_digest": "sha256:s1",
    "unpriced": None, "index_problem": None, "production": [20, 20, [], 0], "record": ["pending", None, []],
    "read_back": [None, "its trace records no write begun through the store"], "staging": ["closed", 1],
    "recorded": {"header": {"run_id": RUN, "input": "ticket"}, "events": [PARKED], "later": [], "end": {"output": "drafted"}},
}
INTENT = {"kind": "intent", "by": "bob", "at": "2026-01-05T00:00:00Z", "signature": GOOD, "run_id": RUN, "call": 1,
          "agent": "triager", "tool": "refunds:act", "certificate": GOOD}
LATER = "2026-06-01T00:00:00Z"
RECALL = [{"agent": "triager", "reason": "leaked drafts", "at": LATER}]
ANCHOR = "registry/recalls.jsonl: has 2 entries but this machine last wrote or verified 3"

# chain -> [(label, the claim's kind and fields, evidence changed (a dict merged into a dict), the guard that
# refuses or None when the chain lets the claim through, its line)]
SCENARIOS = {
    "run": [
        ("holds", {}, {}, None, None),
        ("no certificate", {}, {"cert": None}, "certificate",
         "uncertified. no evals, no production. to certify it: prove triager --sealed, then certify triager --tier C1 "
         "--by YOUR_NAME at a terminal"),
        ("no agent", {}, {"cert": None, "missing": "no agent named triager (no masters/triager.json)"}, "certificate",
         "no agent named triager (no masters/triager.json)"),
        ("bad signer", {}, {"cert": {"signer": "../alice"}}, "signer",
         "<certificate>: the certificate does not verify (no valid signer or signature). re-certify."),
        ("bad signature form", {}, {"cert": {"signature": "hmac-sha256:xyz"}}, "signer",
         "<certificate>: the certificate does not verify (no valid signer or signature). re-certify."),
        ("no hmac key", {}, {"hmac_key": ["/keys/alice.key", False]}, "signer key",
         "<certificate>: signed by alice, whose key is not on this machine (/keys/alice.key); it cannot be verified here."),
        ("untrusted signers", {}, {"cert": {"signature": SSH}, "trusted_signers": "there is no /keys/allowed_signers"},
         "signer key", "<certificate>: signed with alice's ssh key, but there is no /keys/allowed_signers; it cannot be "
                       "verified here."),
        ("no ssh-keygen", {}, {"cert": {"signature": SSH}, "ssh_keygen": "ssh-keygen is not installed here"}, "signer key",
         "<certificate>: signed with alice's ssh key; ssh-keygen is not installed here."),
        ("changed", {}, {"cert": {"tier": "C3", "tampered": True}}, "signature",
         "<certificate>: the certificate does not verify with alice's key; it was changed after signing, or signed by "
         "someone else. re-certify."),
        ("huge figure", {}, {"cert": {"certified_rate_runs": 10 ** 30}}, "figures",
         "<certificate>: field 'certified_rate_runs' is a number of 31 digits, outside 0..9007199254740991. re-certify."),
        ("text figure", {}, {"cert": {"sealed_score": "1"}}, "figures",
         "<certificate>: field 'sealed_score' is not a number. re-certify."),
        ("fractional count", {}, {"cert": {"certified_rate_runs": 2.5}}, "figures",
         "<certificate>: field 'certified_rate_runs' is not a whole number. re-certify."),
        ("negative figure", {}, {"cert": {"envelope_usd": -1}}, "figures",
         "<certificate>: field 'envelope_usd' is -1, outside 0..9007199254740991. re-certify."),
        ("another agent's", {}, {"cert": {"agent": "evalsmith"}}, "agent",
         "<certificate>: the certificate is for 'evalsmith', not triager; it does not verify here."),
        ("log cut", {}, {"cert": {"chains": {"recalls": {"count": 1, "hash": "sha256:" + "1" * 64}}}}, "logs",
         "registry/recalls.jsonl: has 0 entries but had 1 when <certificate> was signed: entries were removed since; "
         "restore the log from a copy. re-prove and re-certify."),
        ("log cut under another certificate", {}, {"anchors": [["registry/eu.card.json", {"recalls": {"count": 2}}]]},
         "logs", "registry/recalls.jsonl: has 0 entries but had 2 when registry/eu.card.json was signed: entries were "
                 "removed since; restore the log from a copy. re-prove and re-certify."),
        ("below the anchor", {}, {"anchor_problem": ANCHOR}, "logs", ANCHOR + "."),
        ("put back", {}, {"seen": {"signature": "hmac-sha256:" + "b" * 64, "signed_at": "2026-02-01T00:00:00Z"}},
         "newest certificate", "<certificate>: superseded: this machine has seen triager's certificate signed at "
                               "2026-02-01T00:00:00Z (<anchor>), and this one was signed before it; an older certificate "
                               "was put back. re-prove and re-certify."),
        ("revoked", {}, {"revocation": "pulled by hand"}, "revocation",
         "certificate revoked: pulled by hand. re-prove and re-certify."),
        ("recalled", {}, {"recalls": RECALL}, "recall", "recalled since certification: leaked drafts. re-prove and re-certify."),
        ("master recalled", {}, {"recalls": [{**RECALL[0], "agent": "base"}]}, "recall",
         "recalled since certification (its master base was recalled: leaked drafts). re-prove and re-certify."),
        ("recalled before", {}, {"recalls": [{**RECALL[0], "at": "2025-01-01T00:00:00Z"}]}, None, None),
        ("code changed", {}, {"code": {"agent.py": "sha256:c2"}}, "digest",
         "the ABOM changed since certification (agent.py). re-prove and re-certify."),
        ("contract changed", {}, {"agent": {"digest": "sha256:d2", "components": {**COMPONENTS, "contract refunds:act": "sha256:k2"}}},
         "digest", "the ABOM changed since certification (contract refunds:act). re-prove and re-certify."),
        ("lineage", {}, {"lineage": "masters/triager.json says stamped_from evalsmith; the lineage log says none"},
         "lineage", "masters/triager.json says stamped_from evalsmith; the lineage log says none"),
    ],
    "certify": [
        ("holds", {"tier": "C1"}, {}, None, None),
        ("holds at C2", {"tier": "C2"}, {}, None, None),
        ("below the anchor", {"tier": "C1"}, {"anchor_problem": ANCHOR}, "logs", ANCHOR + "."),
        ("lineage", {"tier": "C1"}, {"lineage": "the lineage log names another master"}, "lineage",
         "the lineage log names another master"),
        ("over the ceiling", {"tier": "C3"}, {"card": {"tier_ceiling": "C2"}}, "tier ceiling",
         "tier C3 is above the card's tier_ceiling C2."),
        ("no proof", {"tier": "C1"}, {"proofs": []}, "sealed proof",
         "no sealed proof. the law: no evals, no production. run: prove triager --sealed"),
        ("code changed", {"tier": "C1"}, {"code": {"agent.py": "sha256:c2"}}, "digest",
         "the ABOM changed since the sealed proof (agent.py). re-prove before certifying."),
        ("suite changed", {"tier": "C1"}, {"suite_digest": "sha256:s2"}, "sealed suite",
         "the sealed suite changed since the sealed proof (<sealed suite>): prove triager --sealed again before certifying."),
        ("under the bar", {"tier": "C1"}, {"proof": {"passing_cases": 10}}, "pass bar",
         "the sealed proof is UNDER BAR (10/50 = 0.20 [0.11, 0.34]): the score's 95% lower bound is under the bar 0.5. "
         "improve the agent or add sealed cases and re-prove."),
        ("rubric unscored", {"tier": "C1"}, {"proof": {"rubric": "failed"}}, "pass bar",
         "the sealed proof is RUBRIC UNSCORED (50/50 = 1.00 [0.92, 1.00]): the card's draft rubric scored nothing "
         "(scored 50); a rubric that could not be scored is not passed. check the decision model (doctor) and re-prove."),
        ("proof changed", {"tier": "C1"}, {"proof": {"mac": "bad"}}, "proof evidence",
         f"<proof>: the sealed proof {BAD_MAC}. re-prove before certifying."),
        ("rubric never ran", {"tier": "C2"}, {"proof": {"rubric": "no key", "rubric_check": "no key"}}, "acting evidence",
         "tier C2 needs the sealed proof's draft scored by the card's draft rubric, which never ran (no key): set up a "
         "decision model (doctor) and prove triager --sealed again"),
        ("rubric never ran at C1", {"tier": "C1"}, {"proof": {"rubric": "no key"}}, None, None),
        ("unpriced", {"tier": "C2"}, {"unpriced": "no price for m1"}, "acting evidence",
         "tier C2 runs must clear the gate, and one whose cost is unknown never does: no price for m1"),
        ("recalled", {"tier": "C1"}, {"recalls": RECALL}, "recall",
         "recalled since the sealed proof: leaked drafts. re-prove before certifying."),
        ("few runs", {"tier": "C2"}, {"production": [5, 5, [3], 1]}, "production evidence",
         "tier C2 needs production evidence at C1 since the agent (its digest) last changed: 5 gated run(s) (need 20), "
         "gate pass rate 5/5 = 1.00 [0.56, 1.00] (need its 95% lower bound at 0.5 or above); 1 row(s) of <index> not "
         "counted: their evidence MAC does not verify (line 3)."),
        ("index cut", {"tier": "C3"}, {"index_problem": "traces/index.jsonl: rows removed"}, "production evidence",
         "tier C3 needs production evidence, which the index cannot give until it is whole: traces/index.jsonl: rows removed"),
    ],
    "approve": [
        ("holds", {}, {}, None, None),
        ("parked file changed", {}, {"entry": {"mac": "bad"}}, "parked call",
         f"<parked call>: the parked call {BAD_MAC}; not executed."),
        ("executed", {}, {"record": ["executed", {"by": "bob", "at": "T1"}, [INTENT]]}, "open call",
         f"{CALL} was already executed at T1 (approved by bob)."),
        ("expired", {}, {"record": ["expired", None, []]}, "open call",
         f"{CALL} expired at 2099-01-01T00:00:00Z without approval; run the ticket again."),
        ("rejected", {}, {"record": ["rejected", {"by": "bob", "at": "T1", "reason": "dup\nlicate"}, []]}, "open call",
         f"{CALL} was rejected by bob at T1 (dup\\nlicate); it will not be executed."),
        ("uncertain", {}, {"record": ["uncertain-effect", INTENT, [INTENT]], "read_back": [False, "the effect was NOT found"]},
         "open call", f"{CALL} was approved by bob and its effect is uncertain (no result recorded: its approver stopped "
                      f"while its tool ran; read back: the effect was NOT found): it will not be executed again; check it "
                      f"by hand, then close it with `reject` and a reason."),
        ("retryable", {}, {"record": ["uncertain-effect", INTENT, [INTENT, {"kind": "result", "ok": False, "written": False}]]},
         None, None),
        ("below the anchor", {}, {"anchor_problem": ANCHOR}, "logs", ANCHOR + "; not executed."),
        ("recalled", {}, {"recalls": RECALL}, "recall", "recalled since this call was staged: leaked drafts. not executed."),
        ("demoted", {}, {"cert": {"tier": "C1"}}, "acting certificate",
         "<certificate> is at C1: a parked call runs only under a certificate at C2 or above; not executed."),
        ("another digest", {}, {"cert": {"digest": "sha256:d9"}}, "acting certificate",
         f"<certificate> is for another digest than the one {CALL} was staged under; not executed."),
        ("re-certified", {}, {"entry": {"certificate": "hmac-sha256:" + "c" * 64}}, "same certificate",
         "triager was re-certified since this call was staged; run the ticket again under the new certificate."),
        ("code changed", {}, {"code": {"agent.py": "sha256:c2"}}, "digest",
         "the ABOM changed since this call was staged (agent.py). not executed."),
        ("arguments changed", {}, {"entry": {"args": {"amount_usd": 5000}}}, "arguments",
         "the stored arguments of refunds:act no longer match their digest: changed after staging; not executed."),
        ("another run's trace", {}, {"recorded": {"header": {"run_id": "other"}}}, "staged event",
         f"<trace>: is the trace of run other, not {RUN}; not executed."),
        ("never parked", {}, {"recorded": {"events": []}}, "staged event", "<trace>: no call 1 was parked by that run; not executed."),
        ("parking event changed", {}, {"recorded": {"events": [{**PARKED, "mac": "bad"}]}}, "staged event",
         f"<trace>: the event that parked call 1 {BAD_MAC}; not executed."),
        ("parked another tool", {}, {"recorded": {"events": [{**PARKED, "tool": "refunds:other"}]}}, "staged event",
         f"the parked {CALL} is not what the run staged (tool differ from <trace>): changed after staging; not executed."),
        ("unsealed ticket", {}, {"entry": {"input_digest": None}}, "shown",
         f"{CALL} was staged by an older factory that did not seal the ticket and output it would show; run the ticket "
         f"again (reject closes this one); not executed."),
        ("ticket changed", {}, {"recorded": {"header": {"input": "refund everything"}}}, "shown",
         "<trace>: the ticket in it is not what call 1 was staged with (the parked call seals their digests): the trace "
         "was changed after the run; not executed."),
        ("never closed", {}, {"staging": ["started", 0]}, "staging run",
         f"run {RUN} never closed (<index> holds its started row and no closed row that verifies: it was stopped after "
         f"it parked call 1); {CALL} cannot be approved, reject closes it; not executed."),
        ("not staged", {}, {"staging": ["none", 0]}, "staging run",
         f"run {RUN} has no closed row in <index> that verifies and parked call 1: no run of this line staged {CALL}; "
         f"not executed."),
        ("carried out", {}, {"recorded": {"later": [{"event": "effect_started", "call": 1}]}}, "carried out",
         f"<trace> records {CALL} as carried out already (effect_started), whatever <approvals> says; it will not be "
         f"executed again (see `pending`)."),
        ("a winner since the log was read", {}, {"winner": ["executing", {"by": "bob", "at": "T1"}, [INTENT]],   # attempts' record
                                                 "recorded": {"later": [{"event": "effect_started", "call": 1}]}}, "carried out",
         f"{CALL} is being executed now: approved by bob at T1; see `pending` once it is done."),
    ],
    "execute": [
        ("holds", {"approval": {}}, {}, None, None),
        ("no approval", {}, {}, "approval", f"{CALL} has no approval record; the executor refuses."),
        ("no approver", {"approval": {"by": "../bob"}}, {}, "approval signature",
         f"the approval of {CALL} names no approver; the executor refuses."),
        ("not an intent", {"approval": {"kind": "result"}}, {}, "approval signature",
         f"the approval of {CALL} names no approver; the executor refuses."),
        ("forged approval", {"approval": {"tampered": True}}, {}, "approval signature",
         f"the approval of {CALL} by bob does not verify with bob's key; the executor refuses."),
        ("other arguments", {"approval": {"args_digest": "sha256:" + "0" * 64}}, {}, "approved arguments",
         f"the approval of run {RUN} (call 1) was for other arguments; not executed."),
    ],
    "reject": [
        ("holds", {}, {}, None, None),
        ("rejected", {}, {"record": ["rejected", {"by": "bob", "at": "T1"}, []]}, "open call",
         f"{CALL} was already rejected by bob at T1."),
        ("executing", {}, {"record": ["executing", {"by": "bob", "at": "T1"}, [INTENT]]}, "open call",
         f"{CALL} is being executed now: approved by bob at T1; it cannot be rejected while its effect is written (see "
         f"`pending` once it is done)."),
    ],
    "deciding": [
        ("holds", {}, {}, None, None),
        ("carried out", {}, {"recorded": {"later": [{"event": "approved_call", "call": 1}]}}, "carried out",
         f"<trace> records {CALL} as carried out already (approved_call), whatever <approvals> says; it will not be "
         f"executed again (see `pending`)."),
        ("an approval the log knows", {}, {"record": ["pending", None, [INTENT]],
                                           "recorded": {"later": [{"event": "approved_call", "call": 1}]}}, None, None),
    ],
    "standing": [
        ("holds", {}, {}, None, None),
        ("uncertified", {}, {"cert": None}, "certificate",
         "uncertified. no evals, no production. to certify it: prove triager --sealed, then certify triager --tier C1 "
         "--by YOUR_NAME at a terminal"),
        ("revoked", {}, {"revocation": "pulled"}, "revocation", "certificate revoked: pulled. not executed."),
        ("recalled", {}, {"recalls": RECALL}, "recall", "recalled since this call was staged: leaked drafts. not executed."),
        ("superseded", {}, {"entry": {"certificate": "x"}}, "same certificate",
         "triager was re-certified since this call was staged; run the ticket again under the new certificate."),
        ("never closed", {}, {"staging": ["started", 0]}, "staging run",
         f"run {RUN} never closed (<index> holds its started row and no closed row that verifies: it was stopped after "
         f"it parked call 1); {CALL} cannot be approved, reject closes it; not executed."),
    ],
}
KINDS = {"run": "run", "certify": "certify"}   # every other chain decides on a parked call (kind approve)
CHAINED = {"run": "RUN_GUARDS", "certify": "CERTIFY_GUARDS", "approve": "APPROVE_GUARDS", "execute": "EXECUTE_GUARDS",
           "reject": "REJECT_GUARDS", "deciding": "DECIDING_GUARDS", "standing": "STANDING_GUARDS"}


def merged(base, change):
    """base with change merged in, dict into dict all the way down (anything else replaces)."""
    if isinstance(base, dict) and isinstance(change, dict):
        return {**base, **{key: merged(base.get(key), value) for key, value in change.items()}}
    return change


def run_chains(broker) -> dict:
    """chain -> [(label, its results, the evidence asked for in order, the anchor raises)] for every scenario."""
    from types import SimpleNamespace

    class Memory(broker.Claim):
        """A broker.Claim holding its evidence in memory, noting each piece a guard asks for."""
        def __getattr__(self, name):   # only for what the Claim itself does not hold: the evidence
            held = self.__dict__.get("held")
            if held is None or name not in held:
                raise AttributeError(name)
            self.__dict__["asked"].append(name)
            if isinstance(held[name], LookupError):   # a file the caller could not read
                raise held[name]
            return held[name]

    digest = broker.args_digest(ARGS)
    done = {}
    for chain, scenarios in SCENARIOS.items():
        done[chain] = []
        for label, fields, change, _, _ in scenarios:
            evidence = merged({**EVIDENCE, "entry": {**ENTRY, "args_digest": digest}, "proof": PROOF}, change)
            entry = evidence.pop("entry")
            if "args" in change.get("entry", {}):
                entry["args_digest"] = digest
            evidence["recorded"]["events"] = [{"args_digest": digest, **event} for event in evidence["recorded"]["events"]]
            proof = evidence.pop("proof")
            evidence["proofs"] = [[path, proof] for path, _ in evidence["proofs"]]
            approval = fields.get("approval")
            claim = Memory(entry["agent"], KINDS.get(chain, "approve"), tier=fields.get("tier"), entry=entry,
                           approval=None if approval is None else SimpleNamespace(entry={**INTENT, "args_digest": digest, **approval}))
            runs, passes, lines, unsealed = evidence["production"]
            raised, tiers = [], []
            evidence.update(
                attempts=(evidence["recorded"]["later"], broker.CallRecord(*evidence.pop("winner", evidence["record"]))),
                agent=SimpleNamespace(**evidence["agent"], card=evidence["card"]), recorded=SimpleNamespace(**evidence["recorded"]),
                chains={name: broker.Chain(f"registry/{name}.jsonl") for name in evidence["chains"]},
                record=broker.CallRecord(*evidence["record"]), read_back=tuple(evidence["read_back"]),
                staging=tuple(evidence["staging"]), hmac_key=tuple(evidence["hmac_key"]),
                production=lambda tier: tiers.append(tier) or broker.Production(runs, passes, tuple(lines), unsealed),
                signature_problem=lambda signer, obj, unsigned=("signature", "revoked"):
                    f"does not verify with {signer}'s key" if obj.get("tampered") else None,
                mac_problem=lambda obj: None if obj.get("mac") == "ok" else BAD_MAC,
                recorded_digest=lambda value: f"d:{value}", shown=lambda place: f"<{place}>",
                one_line=lambda text: text.replace("\n", "\\n"), raise_anchor=lambda **heads: raised.append(heads))
            claim.__dict__.update(held=evidence, asked=[])
            results = broker.guard_results(claim, getattr(broker, CHAINED[chain]))
            done[chain].append((label, results, claim.asked, raised, tiers))
            if chain == "run":   # what the tower says of the certificate, asked again of the same evidence
                claim.__dict__.update(held={**evidence, "raise_anchor": lambda **heads: None}, asked=[])
                trust = broker.certificate_trust(claim, label == "holds")[0]
                done.setdefault("trust", []).append((label, trust["summary"], trust["runs_at"]))
    claim.__dict__.update(held={**claim.held, "cert": LookupError("registry/triager.card.json: not valid json")}, asked=[])
    trust, problems = broker.certificate_trust(claim, False, (LookupError,), lambda error: error.args[0])
    done["trust"].append(("unreadable", trust["summary"], problems))
    return done


class NoIO(Exception):
    """What the child raises at any I/O the broker attempts."""


def child() -> None:
    """In this fresh process: every stdlib module broker.py imports is imported first, then file, folder,
    socket, environment and print access made to raise, then broker.py executed from bytes read before and
    every chain run; the results go to stdout as JSON once the traps are lifted."""
    import builtins
    import importlib
    import io
    import pathlib
    import socket
    import types
    source = (ROOT / "broker.py").read_bytes()
    for node in ast.walk(ast.parse(source)):   # its imports, also those inside functions (hashlib, hmac)
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            importlib.import_module(node.module)
    stdout, environ = sys.stdout, os.environ

    def trap(*args, **kwargs):
        raise NoIO(f"the broker did I/O: {args[:1]!r}")

    class Sealed(dict):
        def __getitem__(self, key):
            trap(key)
        get = __contains__ = __iter__ = keys = items = __getitem__

    traps = [(builtins, "open"), (builtins, "print"), (builtins, "input"), (io, "open"), (io, "open_code"), (os, "open"),
             (os, "listdir"), (os, "scandir"), (os, "stat"), (os, "getenv"), (os, "system"), (os, "popen"),
             (socket, "socket"), (socket, "create_connection"), (socket, "getaddrinfo")] + \
        [(pathlib.Path, name) for name in ("open", "read_text", "read_bytes", "write_text", "write_bytes", "exists",
                                           "stat", "iterdir", "glob", "mkdir", "touch", "unlink")]
    kept = [(owner, name, getattr(owner, name)) for owner, name in traps]
    for owner, name in traps:
        setattr(owner, name, trap)
    os.environ, sys.stdout, sys.stderr = Sealed(), types.SimpleNamespace(write=trap, flush=trap), types.SimpleNamespace(write=trap, flush=trap)
    live = []
    for probe in (lambda: open(__file__), lambda: io.open(__file__), lambda: os.open(__file__, os.O_RDONLY),
                  lambda: pathlib.Path(__file__).read_bytes(), lambda: socket.create_connection(("127.0.0.1", 9)),
                  lambda: os.environ["PATH"], lambda: print("out")):
        try:
            probe()
            live.append(False)
        except NoIO:
            live.append(True)
    try:
        broker = types.ModuleType("broker")
        sys.modules["broker"] = broker
        exec(compile(source, str(ROOT / "broker.py"), "exec"), broker.__dict__)
        done, failed = run_chains(broker), None
    except BaseException as error:   # noqa: BLE001   reported to the test, which fails on it
        done, failed = None, f"{type(error).__name__}: {error}"
    finally:
        for owner, name, value in kept:
            setattr(owner, name, value)
        os.environ, sys.stdout, sys.stderr = environ, stdout, sys.__stderr__
    print(json.dumps({"done": done, "failed": failed, "traps": live}))


class Pure(unittest.TestCase):
    """broker.py run with every kind of I/O made to raise, its chains on in-memory evidence."""

    maxDiff = None

    @classmethod
    def setUpClass(cls):
        made = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); "
                               "import test_broker_pure; test_broker_pure.child()"],
                              capture_output=True, text=True, timeout=120, env={"PATH": os.defpath})
        cls.made = made
        cls.report = json.loads(made.stdout) if made.returncode == 0 and made.stdout.strip() else {}

    def test_the_child_ran_every_chain_without_io(self):
        self.assertEqual(self.made.returncode, 0, self.made.stderr)
        self.assertEqual(self.report["traps"], [True] * 7)   # each kind of I/O raised in the child
        self.assertIsNone(self.report["failed"])
        self.assertEqual(set(self.report["done"]), {*SCENARIOS, "trust"})

    def test_each_chain_lets_its_claim_through_and_each_guard_refuses_in_its_own_words(self):
        import broker
        for chain, scenarios in SCENARIOS.items():
            names = [name for name, _ in getattr(broker, CHAINED[chain])]
            for (label, _, _, guard, line), (_, results, _, _, _) in zip(scenarios, self.report["done"][chain]):
                with self.subTest(chain=chain, scenario=label):
                    if guard is None:
                        self.assertEqual(results, [[name, None] for name in names])
                    else:
                        stop = names.index(guard)
                        self.assertEqual(results, [[name, None] for name in names[:stop]] + [[guard, line]])

    def test_every_guard_of_every_chain_refuses_in_some_scenario(self):
        import broker
        refused = {getattr(broker, CHAINED[chain]) and dict(getattr(broker, CHAINED[chain]))[guard]
                   for chain, scenarios in SCENARIOS.items() for _, _, _, guard, _ in scenarios if guard}
        for name in [name for name in vars(broker) if name.endswith("_GUARDS")]:
            for guard, check in getattr(broker, name):
                with self.subTest(chain=name, guard=guard):
                    self.assertIn(check, refused)
        self.assertEqual(set(CHAINED.values()), {name for name in vars(broker) if name.endswith("_GUARDS")} -
                         {"CERTIFICATE_GUARDS", "OPEN_GUARDS"})   # each a part of approve's, run as it

    def test_a_chain_stops_reading_at_its_first_refusal(self):
        run = {label: asked for label, _, asked, _, _ in self.report["done"]["run"]}
        self.assertEqual(run["no certificate"], ["cert", "missing"])
        self.assertEqual(set(run["another agent's"]), {"cert", "hmac_key", "signature_problem", "shown"})
        self.assertEqual(set(run["holds"]), {"cert", "hmac_key", "signature_problem", "shown", "chains", "anchors",
                                             "anchor_problem", "raise_anchor", "seen", "revocation", "recalls", "code",
                                             "agent", "lineage"})   # neither ssh's checks for an hmac signature, nor `missing`
        approve = {label: asked for label, _, asked, _, _ in self.report["done"]["approve"]}
        self.assertNotIn("read_back", approve["executed"])        # read back only for an uncertain effect
        self.assertIn("read_back", approve["uncertain"])
        self.assertNotIn("cert", approve["parked file changed"])
        certify = {label: asked for label, _, asked, _, _ in self.report["done"]["certify"]}
        self.assertNotIn("unpriced", certify["rubric never ran at C1"])   # prices matter only to an acting tier

    def test_what_a_guard_found_to_hold_is_handed_back_to_be_kept(self):
        run = {label: raised for label, _, _, raised, _ in self.report["done"]["run"]}
        self.assertEqual(run["holds"], [{"logs": {"recalls": {"count": 0, "hash": "sha256:" + "0" * 64}}},
                                        {"certificates": {"triager": CERT}}])
        self.assertEqual(run["log cut"], [])
        certify = {label: tiers for label, _, _, _, tiers in self.report["done"]["certify"]}
        self.assertEqual(certify["few runs"], ["C1"])   # production is counted at the tier below the one asked

    def test_what_the_tower_says_of_a_certificate(self):
        trust = {label: (summary, runs_at) for label, summary, runs_at in self.report["done"]["trust"]}
        signed = "C2 signed by alice at 2026-01-02T00:00:00Z"
        self.assertEqual(trust["holds"], (f"{signed}; runs at C0 (demoted)", "C0"))
        self.assertEqual(trust["recalled before"], (f"{signed}; may run", "C2"))
        self.assertEqual(trust["no certificate"], ("uncertified", None))
        self.assertEqual(trust["no hmac key"], ("certificate cannot be checked here (its signer's key, ssh-keygen or the "
                                                "trusted signers file is missing)", None))
        self.assertEqual(trust["changed"], ("certificate does not verify", None))
        self.assertEqual(trust["revoked"], (f"{signed}; may not run (revoked)", None))
        self.assertEqual(trust["code changed"], (f"{signed}; may not run (stale)", None))
        self.assertEqual(trust["lineage"], (f"{signed}; may not run (lineage)", None))
        self.assertEqual(trust["unreadable"], ("not checked (certificate: unreadable)",   # a file that did not read
                                               ["registry/triager.card.json: not valid json"]))

    def test_the_docstring_lists_each_chain_as_it_is(self):
        import broker
        for name in [name for name in vars(broker) if name.endswith("_GUARDS") and name != "OPEN_GUARDS"]:
            listed = re.search(rf"^    [a-z]+ \({name}\):.*\n((?:        .+\n)+)", broker.__doc__, re.M)
            with self.subTest(chain=name):
                self.assertIsNotNone(listed, f"the broker's docstring does not list {name}")
                said = []
                for line in listed.group(1).splitlines():
                    if line.strip().endswith("_GUARDS"):
                        said += [guard for guard, _ in getattr(broker, line.strip())]
                    elif line[8] != " ":
                        said.append(line[8:].split("  ")[0])
                self.assertEqual(said, [guard for guard, _ in getattr(broker, name)])

# ---------------------------------------------------------------- each closed set defined once

MODULES = ("factory.py", "broker.py", "llm.py", "sage.py")
# written out knowingly: llm.py imports nothing of the product's (the run statuses an exported span calls errors)
WRITTEN_OUT = {("llm.py", frozenset({"crashed", "over-budget", "escalated"}))}


def closed_sets() -> dict[str, set]:
    """Each closed set broker.py defines -> its members, read from the definition itself."""
    import broker
    return {"GATE_RESULTS": set(broker.GATE_RESULTS), "CALL_STATES": {*broker.CALL_STATES, *broker.STUCK},
            "RULINGS": set(broker.RULINGS), "VERDICTS": {verdict.name for verdict in broker.VERDICTS},
            "DECISIONS": set(broker.DECISIONS), "PROOF_VERDICTS": set(broker.PROOF_VERDICTS),
            "RUBRIC_STATES": set(broker.RUBRIC_STATES), "REVIEW_DECISIONS": set(broker.REVIEW_DECISIONS),
            "LABEL_SOURCES": set(broker.LABEL_SOURCES), "TIERS": set(broker.TIERS)}


def written_out(module: str, tree: ast.Module, sets: dict[str, set]) -> list[str]:
    """'module:line: SET members' for each tuple, list or set of two or more of a closed set's members written
    as literals in a module's tree, but the set's own definition (`NAME = (...)` at the top level)."""
    found = []
    defining = {id(node.value): target.id for node in tree.body if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name)}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)) or \
                not all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            continue
        members = {e.value for e in node.elts}
        for name, closed in sets.items():
            if len(members) > 1 and members <= closed and defining.get(id(node)) != name \
                    and (module, frozenset(members)) not in WRITTEN_OUT:
                found.append(f"{module}:{node.lineno}: {name} {sorted(members)}")
    return found


class ClosedSets(unittest.TestCase):
    """A closed set is defined once, with its meanings, and every subset of it is derived from that definition."""

    @classmethod
    def setUpClass(cls):
        cls.trees = {module: ast.parse((ROOT / module).read_text()) for module in MODULES}

    def test_no_module_writes_a_closed_set_out_again(self):
        sets = closed_sets()
        found = [line for module, tree in self.trees.items() for line in written_out(module, tree, sets)]
        self.assertEqual(found, [])

    def test_a_set_written_out_again_is_found(self):
        sets = closed_sets()
        planted = 'GATE_RESULTS = 1\nTIERS = ("C0", "C1", "C2", "C3")\ndef f(row):\n    return row["gate"] in ("flag", "unsure")\n'
        self.assertEqual(written_out("factory.py", ast.parse(planted), sets), ["factory.py:4: GATE_RESULTS ['flag', 'unsure']"])

    def test_each_set_and_what_is_derived_from_it_is_defined_once_in_the_broker(self):
        derived = ("GATED", "FLAGGED", "UNREACHED", "STATUS_VERDICTS", "OUTCOMES", "PASSING", "CLOSING", "FINAL",
                   "ACTING", "RUBRIC_ORDER", "DENIALS")
        for name in (*closed_sets(), *derived):
            defined = [module for module, tree in self.trees.items() for node in tree.body
                       if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets)]
            with self.subTest(name=name):
                self.assertEqual(defined, ["broker.py"])


if __name__ == "__main__":
    unittest.main()
