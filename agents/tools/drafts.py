"""Draft tools: drafts:write saves a one-sentence reply draft for a human to send.

Effect (draft): one line in outbox/AGENT/drafts.jsonl. A tool module exports CONTRACTS (what the
broker rules on) and make_tools; its implementations never check permission.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

CONTRACTS = {
    "drafts:write": {
        "name": "drafts:write", "effect": "draft",
        "description": "Save a one-sentence reply draft for a human to send.",
        "params": {"type": "object", "additionalProperties": False, "required": ["text"],
                   "properties": {"text": {"type": "string", "maxLength": 600}}},
        "failure_modes": ["OSError: the outbox could not be written"],
    },
}


def make_tools(root: Path, agent: str, run_id: str, write: Callable[[Path, dict], dict]) -> dict:
    """Tool name -> callable(args) -> (result text, receipt), each effect written through `write`."""
    drafts = root / "outbox" / agent / "drafts.jsonl"

    def draft(args: dict) -> tuple:
        return "draft saved for a human to send", write(drafts, {"text": args["text"]})

    return {"drafts:write": draft}
