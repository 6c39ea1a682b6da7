"""The broker: the decision order written once in broker.rule_on, a denial handed back as the
result, and broker.settle's tier x gate table for staged acting calls."""

from __future__ import annotations

import unittest

import broker


class Rulings(unittest.TestCase):
    """The decision order: unknown, denied, ungranted, contract, dry, staged, execute."""

    CONTRACTS = {"a:read": {"effect": "read", "params": {"type": "object", "required": ["q"],
                                                         "properties": {"q": {"type": "string", "maxLength": 5}}}},
                 "a:draft": {"effect": "draft", "params": {"type": "object"}},
                 "a:act": {"effect": "act", "params": {"type": "object"}}}

    def rule(self, tool, args, tools=("a:read", "a:draft", "a:act"), denied=(), mode="run", tier="C1"):
        policy = broker.Policy("x", frozenset(tools), frozenset(denied), tier)
        return broker.rule_on(policy, self.CONTRACTS, tool, args, mode).name

    def test_order(self):
        table = [
            ("nope:tool", {}, {}, "DENIED_UNKNOWN"),
            ("a:read", {"q": "hi"}, {"denied": ("a:read",)}, "DENIED_EXPLICIT"),
            ("a:read", {"q": "hi"}, {"tools": ()}, "DENIED_UNGRANTED"),
            ("a:read", {"q": "too long"}, {}, "DENIED_CONTRACT"),
            ("a:read", {}, {}, "DENIED_CONTRACT"),
            ("a:read", {"q": "hi"}, {"mode": "dry"}, "RECORDED"),
            ("a:act", {}, {"mode": "dry"}, "RECORDED"),
            ("a:act", {}, {}, "STAGED"),
            ("a:draft", {}, {"tier": "C0"}, "RECORDED"),
            ("a:draft", {}, {}, "EXECUTE"),
            ("a:read", {"q": "hi"}, {}, "EXECUTE"),
            # denied wins over granted, even when the arguments are also bad
            ("a:read", {"q": "too long"}, {"denied": ("a:read",)}, "DENIED_EXPLICIT"),
        ]
        for tool, args, options, want in table:
            with self.subTest(tool=tool, args=args, options=options):
                self.assertIn(want, broker.RULINGS)
                self.assertEqual(self.rule(tool, args, **options), want)

    def test_unknown_mode_or_effect_is_refused(self):
        policy = broker.Policy("x", frozenset(), frozenset())
        with self.assertRaisesRegex(ValueError, "broker mode"):
            broker.Broker(policy, self.CONTRACTS, {}, "live", [].append)
        with self.assertRaisesRegex(ValueError, "effect outside"):
            broker.Broker(policy, {"a:b": {"effect": "send", "params": {}}}, {}, "run", [].append)

    def test_contract_denial_names_the_field(self):
        policy = broker.Policy("x", frozenset({"a:read"}), frozenset())
        ruling = broker.rule_on(policy, self.CONTRACTS, "a:read", {"q": 3}, "run")
        self.assertIn("args.q: expected string", ruling.why)

    def test_denial_is_handed_back_and_a_failing_tool_does_not_crash(self):
        events = []
        def explode(args):
            raise OSError("disk full")
        desk = broker.Broker(broker.Policy("x", frozenset({"a:read"}), frozenset()), self.CONTRACTS,
                             {"a:read": explode}, "run", events.append)
        denied = desk.carry_out("a:act", {})
        failed = desk.carry_out("a:read", {"q": "hi"})
        self.assertTrue(denied.result.startswith("denied: "))
        self.assertEqual((failed.ruling, failed.ok), ("OSError", False))
        self.assertEqual([e["seq"] for e in events], [1, 2])
        self.assertEqual(set(events[0]), {"event", "seq", "tool", "args", "args_digest", "ruling", "ok", "error", "effect", "ms", "receipt"})


class Settle(unittest.TestCase):
    """broker.settle decides what becomes of staged acting calls once the gate has answered; pure."""

    def staged(self, n: int = 2) -> list:
        """n acting calls staged by a run-mode broker."""
        contracts = {"a:act": {"effect": "act", "params": {"type": "object"}}}
        desk = broker.Broker(broker.Policy("x", frozenset(contracts), frozenset(), "C3"), contracts, {}, "run", [].append)
        for i in range(n):
            desk.carry_out("a:act", {"i": i})
        return list(desk.staged)

    def test_the_tier_by_gate_table(self):
        calls = self.staged()
        table = [("C3", True, "execute", "the gate passed at C3"),
                 ("C2", True, "park", "waiting for approval"),
                 ("C1", True, "keep", "tier C1 does not act"),
                 ("C0", True, "keep", "tier C0 does not act")]
        table += [(tier, False, "keep", "the gate did not pass") for tier in ("C0", "C1", "C2", "C3")]
        for tier, passed, settlement, why in table:
            with self.subTest(tier=tier, passed=passed):
                settled = broker.settle(calls, tier, passed)
                self.assertEqual(settled, [(call, settlement, why) for call in calls])
                self.assertIn(settlement, broker.SETTLEMENTS)

    def test_settle_decides_only(self):
        calls = self.staged()
        before = [(c.seq, c.ruling, c.args) for c in calls]
        broker.settle(calls, "C3", True)
        self.assertEqual([(c.seq, c.ruling, c.args) for c in calls], before)
        self.assertEqual(broker.settle([], "C3", True), [])


if __name__ == "__main__":
    unittest.main()
