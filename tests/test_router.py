"""The run gate (issue 5): five local detectors, budget burn, and the router's actions inside real runs."""

from __future__ import annotations

import json
import unittest

import factory
from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.fake_sage import FakeSage
from tests.support import LineTest

KEY = "sk-ant-test-router"
SAME_LABEL = ("t", "issues__label", {"label": "billing", "escalate": True})
FINAL = json.dumps({"label": "billing", "escalate": True, "draft": "We have passed this to a specialist."})


def sign(action="a", observation="o", error=None, effect="read", executed=True):
    """A detector input with readable defaults."""
    return factory.Sign(action, observation, error, effect, executed and error is None)


class Detectors(unittest.TestCase):
    """Each detector fires on its pattern and stays quiet on legitimate repeats."""

    def test_same_action_same_observation_three_times(self):
        self.assertTrue(factory.repeated_observation([sign(), sign(), sign()]))
        self.assertFalse(factory.repeated_observation([sign(), sign()]))
        # the same tool with different arguments is a legitimate repeat
        self.assertFalse(factory.repeated_observation([sign("a 1"), sign("a 2"), sign("a 3")]))
        self.assertFalse(factory.repeated_observation([sign(observation=str(i)) for i in range(3)]))

    def test_same_error_class_three_in_a_row_and_a_success_resets(self):
        error = sign(error="TimeoutError")
        self.assertTrue(factory.repeated_error([error, error, error]))
        self.assertFalse(factory.repeated_error([error, error, sign(), error]))
        self.assertFalse(factory.repeated_error([error, sign(error="OSError"), error]))

    def test_two_actions_alternating(self):
        a, b, c = sign("a"), sign("b"), sign("c")
        self.assertTrue(factory.ping_pong([a, b, a, b]))
        self.assertTrue(factory.ping_pong([c, c, c, c, a, b, a, b]))
        self.assertFalse(factory.ping_pong([a, b, a]))
        self.assertFalse(factory.ping_pong([a, b, c, a, b, c]))
        self.assertFalse(factory.ping_pong([a, a, a, a]))

    def test_write_then_failing_check_cycles(self):
        write, check = sign("w", effect="draft"), sign("c", error="CheckFailed")
        self.assertTrue(factory.write_check_cycles([write, check, write, check]))
        self.assertFalse(factory.write_check_cycles([write, check, write, sign("c")]))

    def test_no_successful_execution_for_n_steps(self):
        denied = sign(error="DENIED_UNGRANTED")
        staged = sign(executed=False)
        self.assertTrue(factory.no_progress([denied] * 3 + [staged] * 2))
        self.assertFalse(factory.no_progress([denied] * 4 + [sign()]))
        self.assertFalse(factory.no_progress([denied] * 4))

    def test_budget_burn_and_evidence_line(self):
        self.assertEqual(factory.detect([], 0.86, 1.0), ["budget_burn"])
        self.assertEqual(factory.detect([], 0.5, 1.0), [])
        line = factory.evidence([sign(error="X"), sign()], ["repeat"], 0.41)
        self.assertEqual(line, "tool_calls=2 tool_errors=1 loop_detected=true loop_kind=repeat "
                               "steps_since_progress=0 error_classes=X cost_usd=0.41")


class Routed(LineTest):
    """Scripted worker runs where a detector fires, and each router action takes effect."""

    def setUp(self):
        super().setUp()
        self.edit_card("triager", max_steps=12)
        self.certified()

    def looping_model(self, *tail: Answer) -> FakeServer:
        """A model that calls the same tool with the same arguments 6 times, then answers `tail`."""
        answers = [Answer(body=anthropic_message(tool_uses=[SAME_LABEL])) for _ in range(6)]
        server = FakeServer(*answers, *(tail or [Answer(body=anthropic_message(FINAL))] * 6)).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=KEY)
        return server

    def gate_events(self) -> list[dict]:
        """run_gate events of the newest trace."""
        return [e for e in self.traces()[-1] if e.get("event") == "run_gate"]

    def run_with_router(self, choice: str | None, need_p: float = 0.9):
        """Run once with a Sage that says intervention is needed with need_p and picks `choice`."""
        def answer(question, content):
            if question["kind"] == "yesno" and "intervention" in question.get("instructions", ""):
                return {"answer": "yes" if need_p >= 0.6 else "no", "probability": need_p}
            if question["kind"] == "choice":
                return {"chosen": choice, "probability": 0.8,
                        "probabilities": [{"option": o["option"], "probability": 0.1} for o in question["options"]]}
            return None
        with FakeSage(yes_p=0.2, answer=answer) as fake:
            self.env.update(SAGE_ENDPOINT=fake.url, SAGE_API_KEY="sage-key")
            code, out, err = self.factory("run", "triager", "I was charged twice")
        self.assertEqual(code, 0, err)
        return out, fake

    def test_without_sage_a_second_firing_escalates(self):
        server = self.looping_model()
        out, _ = self.factory("run", "triager", "I was charged twice")[1:]
        events = self.gate_events()
        self.assertEqual([(e["action"], e["source"]) for e in events], [("continue", "local"), ("escalate_human", "local")])
        self.assertEqual(self.traces()[-1][-1]["status"], "escalated")
        self.assertLess(len(server.requests), 12, "stopped by the run gate, not by the step budget")

    def test_escalate_human(self):
        self.looping_model()
        out, fake = self.run_with_router("escalate_human")
        event = self.gate_events()[0]
        self.assertEqual((event["action"], event["source"], event["intervention"]), ("escalate_human", "sage", True))
        self.assertIn("loop_kind=repeat", event["evidence"])
        self.assertEqual(self.traces()[-1][-1]["status"], "escalated")
        asked = [q["instructions"] for q in fake.questions()]
        self.assertIn("Does this run need intervention?", asked)

    def test_continue_when_sage_says_no_intervention(self):
        self.looping_model()
        self.run_with_router("escalate_human", need_p=0.3)
        events = self.gate_events()
        self.assertTrue(events)
        self.assertTrue(all(e["action"] == "continue" and e["intervention"] is False for e in events))
        self.assertEqual(self.traces()[-1][-1]["status"], "done")

    def test_switch_model_moves_to_the_fallback(self):
        server = self.looping_model()
        self.run_with_router("switch_model")
        models = [r["body"]["model"] for r in server.requests]
        switch = models.index("claude-haiku-5-5")
        self.assertEqual(set(models[:switch]), {"claude-sonnet-5-5"})
        self.assertEqual(self.gate_events()[0]["tier"], "primary")

    def test_restart_clean_drops_the_models_own_text(self):
        chatty = anthropic_message("thinking out loud", tool_uses=[SAME_LABEL])
        server = FakeServer(*[Answer(body=chatty) for _ in range(3)], *[Answer(body=anthropic_message(FINAL))] * 4).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=KEY)
        self.run_with_router("restart_clean")
        after = server.requests[3]["body"]["messages"]
        texts = [b.get("text") for m in after if m["role"] == "assistant" for b in m["content"] if b["type"] == "text"]
        self.assertEqual(texts, [])
        self.assertEqual(self.gate_events()[0]["action"], "restart_clean")
        uses = [b for m in after if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
        self.assertEqual(len(uses), 3, "tool calls are kept")

    def test_a_second_restart_is_capped(self):
        self.looping_model(*[Answer(body=anthropic_message(tool_uses=[SAME_LABEL]))] * 6)
        self.run_with_router("restart_clean")
        self.assertEqual([e["action"] for e in self.gate_events()][:2], ["restart_clean", "escalate_human"])


if __name__ == "__main__":
    unittest.main()


class EachDetectorInARun(LineTest):
    """Each detector fires in a scripted worker run (no Sage: local decisions), from tool calls alone."""

    def scripted_run(self, calls: list[tuple[str, dict]]) -> list[dict]:
        """Run the certified triager against a model making `calls` one per turn; the run_gate events."""
        answers = [Answer(body=anthropic_message(tool_uses=[(f"t{i}", name, args)])) for i, (name, args) in enumerate(calls)]
        server = FakeServer(*answers, Answer(body=anthropic_message(FINAL))).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=KEY)
        self.assertEqual(self.factory("run", "triager", "I was charged twice")[0], 0)
        return [e for e in self.traces()[-1] if e.get("event") == "run_gate"]

    def test_each_detector(self):
        self.edit_card("triager", max_steps=12)
        self.certified()
        label = lambda name: ("issues__label", {"label": name, "escalate": True})  # noqa: E731
        draft = lambda text: ("drafts__write", {"text": text})  # noqa: E731
        refund = lambda why: ("billing__refund", {"reason": why})  # noqa: E731
        scenarios = {
            "repeat": [label("billing")] * 3,
            "error_streak": [draft("x" * 700)] * 3,
            "ping_pong": [label("billing"), label("bug"), label("billing"), label("bug")],
            "write_check_cycle": [draft("one"), refund("a"), draft("two"), refund("b")],
            "no_progress": [refund("a"), ("nope__tool", {}), draft("y" * 700), refund("b"), ("nope__tool", {"x": 1})],
        }
        for detector, calls in scenarios.items():
            with self.subTest(detector=detector):
                events = self.scripted_run(calls)
                self.assertTrue(events, f"{detector} never fired")
                self.assertIn(detector, events[0]["detectors"])
                self.assertEqual(events[0]["step"], len(calls), "fires on the call that completes the pattern")
                self.assertEqual((events[0]["action"], events[0]["source"]), ("continue", "local"))

    def test_legitimate_repeats_are_not_flagged(self):
        self.edit_card("triager", max_steps=12)
        self.certified()
        calls = [("drafts__write", {"text": f"draft number {i}"}) for i in range(4)]
        self.assertEqual(self.scripted_run(calls), [])


class Doctor(LineTest):
    """doctor answers 'why is every run routed to a human?' and never prints a key."""

    def test_without_keys_it_says_the_gate_cannot_score(self):
        code, out, _ = self.factory("doctor")
        self.assertEqual(code, 0)
        self.assertIn("keys present: none", out)
        self.assertIn("triager: worker offline", out)
        self.assertIn("every run is 'unscored' and routed to a human", out)

    def test_live_check_against_a_levanto_server(self):
        from tests.fake_sage import Reply
        for replies, expected in (([], "gate: live check ready"),
                                  ([Reply(403, {"detail": "blocked"})], "NOT READY (HTTP 403 — check the User-Agent")):
            with self.subTest(expected=expected), FakeSage(replies=replies) as fake:
                self.env.update(SAGE_ENDPOINT=fake.url, SAGE_API_KEY="lv_live_SECRETSECRET", ANTHROPIC_API_KEY=KEY)
                code, out, _ = self.factory("doctor")
                self.assertIn(expected, out)
                self.assertIn("keys present: ANTHROPIC_API_KEY, SAGE_API_KEY", out)
                self.assertIn("triager: worker anthropic", out)
                self.assertNotIn("SECRETSECRET", out)
                self.assertNotIn(KEY, out)
                self.assertEqual(fake.requests[-1].path, "/ready")
