"""The worker loop against real model servers on 127.0.0.1 (issue 4): tool use, limits, fallback, replay."""

from __future__ import annotations

import json
import re

from tests.fake_llm import Answer, FakeServer, anthropic_error, anthropic_message, openai_completion
from tests.support import LineTest

KEY = "sk-ant-test-SECRET-0123456789"
LABEL = ("t1", "issues__label", {"label": "billing", "escalate": True})
DRAFT = ("t2", "drafts__write", {"text": "We have passed this to a specialist."})
FINAL = json.dumps({"label": "billing", "escalate": True, "draft": "We have passed this to a specialist."})

BIG_TOOL = '''

CONTRACTS["logs:read"] = {"name": "logs:read", "effect": "read", "description": "Read the customer's app log.",
                          "params": {"type": "object", "properties": {}}, "failure_modes": []}
_shipped_make_tools = make_tools


def make_tools(root, agent, run_id, append):
    tools = _shipped_make_tools(root, agent, run_id, append)
    tools["logs:read"] = lambda args: "HEAD" + "x" * 1_000_000 + "TAIL"
    return tools
'''


class Loop(LineTest):
    """Runs of the certified triager with a model key set, each against a scripted server."""

    def serve(self, *answers: Answer) -> FakeServer:
        """Start a scripted Anthropic-format server and point the factory's env at it with a key."""
        server = FakeServer(*answers).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=KEY)
        return server

    def run_triager(self, text: str = "I was charged twice for my card") -> tuple[str, list[dict]]:
        """Run the certified triager once; (stdout, its trace events)."""
        code, out, err = self.factory("run", "triager", text)
        self.assertEqual(code, 0, err)
        return out, self.traces()[-1]

    def test_tool_use_round_trip(self):
        self.certified()
        server = self.serve(Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL)))
        out, events = self.run_triager()
        first, second = server.requests[0]["body"], server.requests[1]["body"]
        self.assertEqual(sorted(t["name"] for t in first["tools"]), ["drafts__write", "issues__label"])
        results = [b for b in second["messages"][-1]["content"] if b["type"] == "tool_result"]
        self.assertEqual([r["tool_use_id"] for r in results], ["t1", "t2"])
        self.assertEqual([e["backend"] for e in events if e.get("event") == "model"], ["anthropic", "anthropic"])
        self.assertEqual(events[-1]["status"], "done")
        self.assertIn('"label": "billing"', out)
        labels = (self.root / "outbox" / "triager" / "labels.jsonl").read_text()
        self.assertIn('"label":"billing"', labels)

    def test_a_denied_call_from_the_model_is_answered_and_the_run_goes_on(self):
        self.certified()
        refund = ("t0", "billing__refund", {"reason": "customer asked"})
        server = self.serve(Answer(body=anthropic_message(tool_uses=[refund])), Answer(body=anthropic_message(FINAL)))
        _, events = self.run_triager("refund me now")
        tools = [e for e in events if e.get("event") == "tool"]
        self.assertEqual(tools[0]["ruling"], "DENIED_EXPLICIT")
        result = server.requests[1]["body"]["messages"][-1]["content"][0]
        self.assertTrue(result["is_error"])
        self.assertIn("denied:", json.dumps(result["content"]))
        self.assertEqual(events[-1]["status"], "done")

    def test_step_budget_ends_a_model_that_never_stops(self):
        self.edit_card("triager", max_steps=3)
        self.certified()
        server = self.serve(*[Answer(body=anthropic_message(tool_uses=[LABEL])) for _ in range(10)])
        out, events = self.run_triager()
        self.assertEqual(len(server.requests), 3)
        self.assertEqual(events[-1]["status"], "escalated")
        self.assertIn("step budget of 3 spent", out)
        self.assertIn("routed to a human", out)
        self.assertEqual(sum(e.get("event") == "model" for e in events), 3)

    def test_envelope_stops_the_run_before_the_call_that_would_exceed_it(self):
        self.edit_card("triager", cost_envelope_usd=0.0001)
        self.certified()
        server = self.serve(Answer(body=anthropic_message(FINAL)))
        out, events = self.run_triager()
        self.assertEqual(server.requests, [])
        self.assertEqual(events[-1]["status"], "over-budget")
        self.assertIn("routed to a human", out)

    def test_retired_primary_falls_back_and_the_trace_shows_both(self):
        self.certified()
        server = self.serve(Answer(404, anthropic_error("not_found_error", "model: claude-sonnet-5-5")),
                            Answer(body=anthropic_message(FINAL, model="claude-haiku-5-5")))
        _, events = self.run_triager()
        model = [e for e in events if e.get("event") == "model"][0]
        self.assertEqual([r["body"]["model"] for r in server.requests], ["claude-sonnet-5-5", "claude-haiku-5-5"])
        self.assertEqual(model["model"], "claude-haiku-5-5")
        self.assertIn("404", json.dumps(model["attempts"]))

    def test_both_models_failing_runs_offline_after_error_and_tower_says_so(self):
        self.certified()
        self.serve(Answer(404, anthropic_error("not_found_error", "gone")), Answer(404, anthropic_error("not_found_error", "gone")))
        _, events = self.run_triager()
        backend = [e for e in events if e.get("event") == "model"][0]["backend"]
        self.assertTrue(backend.startswith("offline-after-error: "), backend)
        tower = self.factory("tower")[1]
        self.assertIn("offline-after-error", tower)

    def test_big_tool_result_is_clipped_and_kept_whole_on_disk(self):
        with open(self.root / "agents" / "tools.py", "a") as tools:
            tools.write(BIG_TOOL)
        self.edit_card("triager", tools=["issues:label", "drafts:write", "logs:read"])
        self.certified()
        server = self.serve(Answer(body=anthropic_message(tool_uses=[("t9", "logs__read", {})])),
                            Answer(body=anthropic_message(FINAL)))
        _, events = self.run_triager()
        sent = server.requests[1]["body"]["messages"][-1]["content"][0]["content"]
        sent = sent if isinstance(sent, str) else json.dumps(sent)
        self.assertLess(len(sent), 10_000)
        self.assertIn("HEAD", sent)
        self.assertIn("TAIL", sent)
        where = re.search(r"full output at (\S+)", sent).group(1)
        self.assertEqual(len((self.root / where).read_text()), 1_000_008)

    def test_unknown_price_is_never_within_the_envelope(self):
        self.edit_card("triager", model={"primary": "anthropic/claude-prototype-0", "fallback": "claude-haiku-5-5"})
        self.certified()
        self.serve(Answer(body=anthropic_message(FINAL, model="claude-prototype-0")))
        out, events = self.run_triager()
        self.assertIsNone(events[-1]["cost_usd"])
        self.assertIn("?", [line for line in self.factory("tower")[1].splitlines() if line.startswith("triager")][0])

    def test_no_key_appears_in_any_file_the_run_wrote(self):
        self.certified()
        self.serve(Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL)))
        out, _ = self.run_triager()
        self.assertNotIn(KEY, out)
        for path in self.root.rglob("*"):
            if path.is_file():
                self.assertNotIn(KEY.encode(), path.read_bytes(), path)

    def test_sageroute_headers_land_in_the_trace_and_the_vendor_key_stays_home(self):
        self.certified()
        headers = {"x-sageroute-tier": "small", "x-sageroute-action": "continue", "x-sageroute-intervention": "none",
                   "x-sageroute-source": "sage", "x-sageroute-model": "claude-haiku-5-5"}
        server = self.serve(Answer(body=anthropic_message(FINAL, model="claude-haiku-5-5"), headers=headers))
        self.env.update(SAGEROUTE_URL=server.url, SAGEROUTE_TOKEN="route-token-1")
        _, events = self.run_triager()
        request = server.requests[0]
        self.assertEqual(request["path"], "/v1/messages")
        self.assertEqual(request["body"]["model"], "sageroute")
        self.assertNotIn(KEY, json.dumps(request["headers"]))
        self.assertIn("route-token-1", json.dumps(request["headers"]))
        model = [e for e in events if e.get("event") == "model"][0]
        self.assertEqual(model["backend"], "sageroute")
        self.assertEqual(model["headers"]["x-sageroute-tier"], "small")

    def test_openai_compatible_round_trip(self):
        self.edit_card("triager", model={"primary": "openai/gpt-local", "fallback": "openai/gpt-local"})
        self.certified()
        calls = [("c1", "issues__label", json.dumps(LABEL[2])), ("c2", "drafts__write", json.dumps(DRAFT[2]))]
        server = FakeServer(Answer(body=openai_completion(tool_calls=calls)), Answer(body=openai_completion(FINAL))).start()
        self.addCleanup(server.close)
        self.env.update(OPENAI_BASE_URL=server.url, OPENAI_API_KEY=KEY)
        _, events = self.run_triager()
        self.assertEqual(server.requests[0]["path"], "/chat/completions")
        tool_messages = [m for m in server.requests[1]["body"]["messages"] if m["role"] == "tool"]
        self.assertEqual([m["tool_call_id"] for m in tool_messages], ["c1", "c2"])
        self.assertEqual(events[-1]["status"], "done")

    def test_replay_live_asks_the_model_again(self):
        self.certified()
        server = self.serve(*[Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL))] * 2)
        self.run_triager()
        run_id = self.traces()[-1][0]["run_id"]
        code, out, _ = self.factory("replay", run_id, "--live")
        self.assertEqual((code, out.strip()), (0, f"replay {run_id} (triager, live): no differences"))
        self.assertEqual(len(server.requests), 4)
        self.assertEqual(len(self.traces()), 1, "a replay writes no trace")

    def test_replay_matches_and_then_differs_after_a_contract_change(self):
        self.certified()
        self.serve(Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL)))
        self.run_triager()
        run_id = self.traces()[-1][0]["run_id"]
        code, out, _ = self.factory("replay", run_id)
        self.assertEqual((code, out.split(": ", 1)[1].strip()), (0, "no differences"))
        path = self.root / "agents" / "tools.py"
        path.write_text(path.read_text().replace('"maxLength": 600', '"maxLength": 10'))
        code, out, _ = self.factory("replay", run_id)
        self.assertEqual(code, 1)
        self.assertIn("DENIED_CONTRACT", out)
