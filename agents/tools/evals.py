"""Eval tools: evals:propose proposes one eval case for an agent's suite (what harvest's evalsmith calls).

Effect (draft): one line in evals/TARGET/proposed.jsonl; a human decides whether to promote it into
the suite. Implementations never check permission.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")   # an agent name, matched whole

CONTRACTS = {
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


def make_tools(root: Path, agent: str, run_id: str, write: Callable[[Path, dict], dict]) -> dict:
    """Tool name -> callable(args) -> (result text, receipt), each effect written through `write`."""

    def propose(args: dict) -> tuple:
        target = args["agent"]
        if not NAME.fullmatch(target):
            raise ValueError(f"{target!r} is not an agent name")
        case = {**args["case"], "proposed_by": agent}   # the line adds run_id, and for harvest the source_run
        return f"proposed {case['id']} for {target}", write(root / "evals" / target / "proposed.jsonl", case)

    return {"evals:propose": propose}
