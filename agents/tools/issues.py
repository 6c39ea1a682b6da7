"""Issue tools: issues:label attaches a triage label and the escalate flag to the ticket being worked.

Effect (draft): one line in outbox/AGENT/labels.jsonl. A tool module exports CONTRACTS (what the
broker rules on) and make_tools; its implementations never check permission, because the broker
rules on every call before any of them runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

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
}


def make_tools(root: Path, agent: str, run_id: str, write: Callable[[Path, dict], dict]) -> dict:
    """Tool name -> callable(args) -> (result text, receipt). `write(path, row)` is the factory's: it
    appends the row as one whole line tagged with the run and a fresh effect id, and returns the
    receipt {"path", "offset", "effect_id"} by which the effect is read back."""
    labels = root / "outbox" / agent / "labels.jsonl"

    def label(args: dict) -> tuple:
        return f"labelled {args['label']} (escalate={str(args['escalate']).lower()})", write(labels, args)

    return {"issues:label": label}
