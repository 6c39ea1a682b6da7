"""Billing tools: billing:refund queues a refund to the customer's account (it moves money).

Effect (act): one line in outbox/AGENT/refunds.jsonl, the payments queue. An acting call is never
run when the worker asks: the broker stages it, and it runs only after a passing gate at tier C3 or
a human's approval at C2. Implementations never check permission.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

CONTRACTS = {
    "billing:refund": {
        "name": "billing:refund", "effect": "act",
        "description": "Queue a refund to the customer's account (moves money).",
        "params": {"type": "object", "additionalProperties": False, "required": ["reason"],
                   "properties": {"reason": {"type": "string", "maxLength": 200},
                                  "amount_usd": {"type": "number", "minimum": 0}}},
        "amounts_usd": ["amount_usd"],
        "failure_modes": ["OSError: the payments queue could not be written (effect unknown)"],
    },
}


def make_tools(root: Path, agent: str, run_id: str, write: Callable[[Path, dict], dict]) -> dict:
    """Tool name -> callable(args) -> (result text, receipt), each effect written through `write`."""
    refunds = root / "outbox" / agent / "refunds.jsonl"

    def refund(args: dict) -> tuple:
        return "refund queued", write(refunds, args)

    return {"billing:refund": refund}
