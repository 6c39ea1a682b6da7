"""The tools the line hands its agents: contracts (what the broker rules on) and implementations.

Implementations have real, inspectable effects under the factory root and never check
permission: the broker does that before any of them is called. Effects land in:

    outbox/AGENT/labels.jsonl     issues:label   (draft)
    outbox/AGENT/drafts.jsonl     drafts:write   (draft)
    outbox/AGENT/refunds.jsonl    billing:refund (act — the payments queue a human or C3 agent feeds)
    evals/TARGET/proposed.jsonl   evals:propose  (draft — a human promotes proposals into the suite)

`make_tools` receives the factory's locked JSONL `append` (returning the line's byte offset) so
every effect is one whole line; each tool returns (result text, receipt) where the receipt
{"path", "offset", "effect_id"} lets the line read the effect back before calling a run verified.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Callable

NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")

CONTRACTS = {
    "issues:label": {
        "name": "issues:label", "effect": "draft",
        "description": "Attach a triage label and the escalate flag to the ticket being worked.",
        "params": {"type": "object", "additionalProperties": False, "required": ["label", "escalate"],
                   "properties": {"label": {"type": "string",
                                            "enum": ["billing", "account", "bug", "question", "other"]},
                                  "escalate": {"type": "boolean"}}},
        "failure_modes": ["OSError: the outbox could not be written"],
    },
    "drafts:write": {
        "name": "drafts:write", "effect": "draft",
        "description": "Save a one-sentence reply draft for a human to send.",
        "params": {"type": "object", "additionalProperties": False, "required": ["text"],
                   "properties": {"text": {"type": "string", "maxLength": 600}}},
        "failure_modes": ["OSError: the outbox could not be written"],
    },
    "billing:refund": {
        "name": "billing:refund", "effect": "act",
        "description": "Queue a refund to the customer's account (moves money).",
        "params": {"type": "object", "additionalProperties": False, "required": ["reason"],
                   "properties": {"reason": {"type": "string", "maxLength": 200},
                                  "amount_usd": {"type": "number", "minimum": 0}}},
        "failure_modes": ["OSError: the payments queue could not be written (effect unknown)"],
    },
    "evals:propose": {
        "name": "evals:propose", "effect": "draft",
        "description": "Propose one eval case for an agent's suite; a human decides whether to promote it.",
        "params": {"type": "object", "additionalProperties": False, "required": ["agent", "case"],
                   "properties": {"agent": {"type": "string", "maxLength": 64},
                                  "case": {"type": "object", "required": ["id", "input", "expect", "source"],
                                           "properties": {"id": {"type": "string", "maxLength": 128},
                                                          "expect": {"type": "object"},
                                                          "source": {"type": "string", "maxLength": 200}}}}},
        "failure_modes": ["ValueError: the target agent name is not a valid name",
                          "OSError: proposed.jsonl could not be written"],
    },
}


def make_tools(root: Path, agent: str, run_id: str, append: Callable[[Path, dict], None]) -> dict:
    """Tool name -> callable(args) -> str, each writing its effect under `root` for this run."""
    outbox = root / "outbox" / agent

    def write(path: Path, row: dict) -> dict:
        """Append one effect line tagged with a fresh effect id; its receipt."""
        effect_id = secrets.token_hex(8)
        offset = append(path, {**row, "run_id": run_id, "effect_id": effect_id})
        return {"path": path.relative_to(root).as_posix(), "offset": offset, "effect_id": effect_id}

    def label(args: dict) -> tuple:
        receipt = write(outbox / "labels.jsonl", args)
        return f"labelled {args['label']} (escalate={str(args['escalate']).lower()})", receipt

    def draft(args: dict) -> tuple:
        return "draft saved for a human to send", write(outbox / "drafts.jsonl", {"text": args["text"]})

    def refund(args: dict) -> tuple:
        return "refund queued", write(outbox / "refunds.jsonl", args)

    def propose(args: dict) -> tuple:
        target = args["agent"]
        if not NAME.fullmatch(target):
            raise ValueError(f"{target!r} is not an agent name")
        case = {**args["case"], "source_run": run_id, "proposed_by": agent}
        return f"proposed {case['id']} for {target}", write(root / "evals" / target / "proposed.jsonl", case)

    return {"issues:label": label, "drafts:write": draft, "billing:refund": refund, "evals:propose": propose}
