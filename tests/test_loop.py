"""One run's inside: the loop against real model servers on 127.0.0.1 (tool use, limits, fallback),
a scripted worker through build_loop in every mode, the run gate's detectors and the router's
actions, and replay (a trace an older factory wrote is refused, naming its format)."""

from __future__ import annotations

import json
import re
import types
import unittest

import broker
import factory
import llm
from tests.fake_llm import Answer, FakeServer, anthropic_error, anthropic_message, openai_completion
from tests.fake_sage import FakeSage
from tests.support import CertifiedTest, LineTest, write_jsonl

KEY = "sk-ant-test-SECRET-0123456789"
LABEL = ("t1", "issues__label", {"label": "billing", "escalate": True})
DRAFT = ("t2", "drafts__write", {"text": "We have passed this to a specialist."})
SAME_LABEL = ("t", "issues__label", {"label": "billing", "escalate": True})
FINAL = json.dumps({"label": "billing", "escalate": True, "draft": "We have passed this to a specialist."})

BIG_TOOL = '''"""A tool family of its own: logs:read returns a million characters."""

CONTRACTS = {"logs:read": {"name": "logs:read", "effect": "read", "description": "Read the customer's app log.",
                           "params": {"type": "object", "properties": {}}, "failure_modes": []}}


def make_tools(root, agent, run_id, write):
    return {"logs:read": lambda args: "HEAD" + "x" * 1_000_000 + "TAIL"}
'''


class Loop(LineTest):
    """Runs of certified agents with a model key set, each against a scripted server. Prepared once:
    triager, and variants of it that differ in one card field (tight: max_steps 3; pinched: a
    $0.0001 envelope; proto: a primary model with no known price), all certified at C1."""

    VARIANTS = {"tight": "max_steps=3", "pinched": "cost_envelope_usd=0.0001",
                "proto": 'model={"primary": "anthropic/claude-prototype-0", "fallback": "claude-haiku-5-5"}'}

    def prepare(self):
        self.certified()
        for name, setting in self.VARIANTS.items():
            self.assertEqual(self.factory("stamp", "triager", "--as", name, "--set", setting)[0], 0)
            self.prove_sealed(name)
            self.sign(name)

    def serve(self, *answers: Answer) -> FakeServer:
        """Start a scripted Anthropic-format server and point the factory's env at it with a key."""
        server = FakeServer(*answers).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=KEY)
        return server

    def run_triager(self, text: str = "I was charged twice for my card", agent: str = "triager") -> tuple[str, list[dict]]:
        """Run a certified agent (the triager unless told) once; (stdout, its trace events)."""
        code, out, err = self.factory("run", agent, text)
        self.assertEqual(code, 0, err)
        return out, self.traces(agent)[-1]

    def test_tool_use_round_trip(self):
        server = self.serve(Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL)))
        out, events = self.run_triager()
        first, second = server.requests[0]["body"], server.requests[1]["body"]
        self.assertEqual(sorted(t["name"] for t in first["tools"]), ["drafts__write", "issues__label"])
        results = [b for b in second["messages"][-1]["content"] if b["type"] == "tool_result"]
        self.assertEqual([r["tool_use_id"] for r in results], ["t1", "t2"])
        self.assertEqual([e["backend"] for e in events if e.get("event") == "model"], ["anthropic", "anthropic"])
        self.assertEqual(events[-1]["status"], "done")
        self.assertIn('"label": "billing"', out)
        self.assertEqual([e["stop_reason"] for e in events if e.get("event") == "model"], ["tool_use", "end"])
        review = self.outbox("triager", "review")   # no gate here (no Sage key): held writes go to a human
        self.assertEqual([r["args"] for r in review], [LABEL[2], DRAFT[2]])
        self.assertFalse((self.root / "outbox" / "triager" / "labels.jsonl").exists())

    def test_tool_arguments_holding_a_lone_surrogate_are_a_denied_call_not_a_crash(self):
        lone = ("t1", "issues__label", {"label": "bill\ud800ing", "escalate": True})   # JSON allows the escape
        server = self.serve(Answer(body=anthropic_message(tool_uses=[lone])), Answer(body=anthropic_message(FINAL)))
        _, events = self.run_triager()
        [call] = [e for e in events if e.get("event") == "tool"]
        self.assertEqual((call["ruling"], call["args"]["label"]), ("DENIED_CONTRACT", "bill\ufffding"))
        self.assertIn("args.label: holds \\ud800, half of a utf-16 surrogate pair, which is not text", call["error"])
        self.assertEqual(call["args_digest"], broker.args_digest(call["args"]))
        self.assertEqual(events[-1]["status"], "done")
        self.assertIn(b'"bill\\ud800ing"', server.requests[1]["raw"])   # the conversation sent back as it came

    def test_lone_surrogates_from_the_model_and_sage_are_read_as_text_and_the_run_ends(self):
        unknown = ("t1", "issues__lab\ud800", {"label": "billing"})   # JSON allows the escape; UTF-8 cannot hold it
        self.serve(Answer(body=anthropic_message(tool_uses=[unknown])),
                   Answer(body=anthropic_message(FINAL.replace("specialist", "special\ud800ist"))))
        with FakeSage(status=500, body='{"detail": "boom \\ud800"}') as sage:
            self.env.update(SAGE_ENDPOINT=sage.url, SAGE_API_KEY="sage-key")
            code, out, err = self.factory("run", "triager", "I was charged twice for my card")
        self.assertEqual(code, 0, err)
        self.assertNotIn("Traceback", err)
        events = self.traces()[-1]
        [call] = [e for e in events if e.get("event") == "tool"]
        self.assertEqual(call["tool"], "issues:lab\ufffd")
        self.assertEqual((events[-1]["status"], events[-1]["output"]["draft"]), ("done", "We have passed this to a special\ufffdist."))
        row = self.index_rows()[-1]
        self.assertEqual((row["status"], row["gate"]), ("done", "failed"))
        self.assertIn("boom \ufffd", json.dumps(row, ensure_ascii=False))
        self.assertEqual(self.factory("replay", row["run_id"])[0], 0)

    def test_a_turn_cut_off_at_the_token_limit_acts_on_nothing(self):
        server = self.serve(Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT], stop="max_tokens")),
                            Answer(body=anthropic_message(tool_uses=[LABEL])), Answer(body=anthropic_message(FINAL)))
        out, events = self.run_triager()
        models = [e for e in events if e.get("event") == "model"]
        self.assertEqual([(m["stop_reason"], m["raw_stop_reason"]) for m in models],
                         [("length", "max_tokens"), ("tool_use", "tool_use"), ("end", "end_turn")])
        tools = [e for e in events if e.get("event") == "tool"]
        self.assertEqual([(t["tool"], t["ruling"]) for t in tools], [("issues:label", "HELD")], "the cut-off draft never ran")
        again = server.requests[1]["body"]["messages"]
        self.assertFalse([b for m in again for b in (m["content"] if isinstance(m["content"], list) else [])
                          if b.get("type") == "tool_use"], "the cut-off turn's calls are not sent back as made")
        self.assertIn("stop reason: length", again[-1]["content"])
        self.assertEqual(events[-1]["status"], "done")
        self.assertEqual([r["tool"] for r in self.outbox("triager", "review")], ["issues:label"])

    def test_a_model_that_keeps_stopping_for_length_is_escalated(self):
        calls = [("c1", "drafts__write", json.dumps(DRAFT[2]))]
        cut = openai_completion(tool_calls=calls)
        cut["choices"][0]["finish_reason"] = "length"
        self.edit_card("tight", model={"primary": "openai/gpt-local", "fallback": "openai/gpt-local"})
        self.prove_sealed("tight")
        self.sign("tight")
        server = FakeServer(*[Answer(body=cut)] * 3).start()
        self.addCleanup(server.close)
        self.env.update(OPENAI_BASE_URL=server.url, OPENAI_API_KEY=KEY)
        out, events = self.run_triager(agent="tight")
        self.assertEqual(len(server.requests), 3)
        self.assertEqual([e["stop_reason"] for e in events if e.get("event") == "model"], ["length"] * 3)
        self.assertEqual([e for e in events if e.get("event") in ("tool", "settled", "commit")], [])
        self.assertEqual((events[-1]["status"], events[-1]["verdict"]), ("escalated", "escalated"))
        self.assertIn("a turn stopped for length; none of its tool calls ran", events[-1]["reason"])
        self.assertFalse((self.root / "outbox").exists())

    def test_a_denied_call_from_the_model_is_answered_and_the_run_goes_on(self):
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
        server = self.serve(*[Answer(body=anthropic_message(tool_uses=[LABEL])) for _ in range(10)])
        out, events = self.run_triager(agent="tight")
        self.assertEqual(len(server.requests), 3)
        self.assertEqual(events[-1]["status"], "escalated")
        self.assertIn("step budget of 3 spent", out)
        self.assertIn("routed to a human", out)
        self.assertEqual(sum(e.get("event") == "model" for e in events), 3)

    def test_an_envelope_that_cannot_fit_one_call_hands_the_run_to_the_rules(self):
        server = self.serve(Answer(body=anthropic_message(FINAL)))
        out, events = self.run_triager(agent="pinched")
        self.assertEqual(server.requests, [])
        self.assertEqual((events[-1]["status"], events[-1]["output"]["label"]), ("done", "billing"))
        [envelope] = [e for e in events if e.get("event") == "envelope"]
        self.assertIn("would pass the $0.0001 cost envelope", envelope["why"])
        self.assertIn("the agent's rules answer this run", envelope["why"])
        self.assertEqual({e["backend"] for e in events if e.get("event") == "model"}, {"offline-over-envelope"})
        self.assertEqual(self.index_rows()[-1]["backends"], ["offline-over-envelope"])

    def test_the_envelope_stops_the_run_before_a_later_call_would_pass_it(self):
        server = self.serve(Answer(body=anthropic_message(tool_uses=[LABEL], usage=(20_000, 2_000))),
                            Answer(body=anthropic_message(FINAL)))
        out, events = self.run_triager()
        self.assertEqual(len(server.requests), 1)
        self.assertEqual(events[-1]["status"], "over-budget")
        self.assertIn("would pass the $0.05 cost envelope at $0.0600", events[-1]["reason"])
        self.assertIn("routed to a human", out)

    def test_a_long_ticket_is_clipped_for_the_model_and_kept_whole(self):
        ticket = "The app crashes when I open statements. Log:\n" + "".join(
            f"2026-11-30T04:12:{n % 60:02}Z ERROR StatementView: NullPointerException at row {n}\n" for n in range(1650))
        self.assertGreater(len(ticket.encode()), 121_000)
        server = self.serve(Answer(body=anthropic_message(tool_uses=[LABEL])), Answer(body=anthropic_message(FINAL)))
        out, events = self.run_triager(ticket)
        self.assertEqual(len(server.requests), 2)
        sent = server.requests[0]["body"]["messages"][0]["content"]
        sent = sent if isinstance(sent, str) else json.dumps(sent)
        self.assertLess(len(sent), 10_000)
        self.assertIn("The app crashes when I open statements.", sent)
        self.assertIn("at row 1649", sent)
        where = re.search(r"full text at (\S+)", sent).group(1)
        self.assertTrue(where.endswith("/input.txt"), where)
        self.assertEqual((self.root / where).read_text(), ticket)
        self.assertEqual((events[-1]["status"], events[-1]["output"]["label"]), ("done", "billing"))

    def test_an_unknown_cost_is_never_within_the_envelope_at_the_gate(self):
        no_usage = {k: v for k, v in anthropic_message(FINAL).items() if k != "usage"}
        for why, body in (("no usage from a priced model", no_usage),
                          ("answered by an unpriced model", anthropic_message(FINAL, model="claude-prototype-0"))):
            with self.subTest(why), FakeSage(yes_p=0.99) as sage:
                self.serve(Answer(body=body))
                self.env.update(SAGE_ENDPOINT=sage.url, SAGE_API_KEY="sage-key")
                out, events = self.run_triager()
                row = self.index_rows()[-1]
                self.assertIsNone(row["cost_usd"])
                self.assertEqual((row["gate"], row["verdict"]), ("flag", "routed-to-human"))
                self.assertIn("-> flag (cost unknown", out)
                self.assertNotIn("envelope", out)
        self.assertIn("-> flag (cost unknown; another model answered)\ncost unknown: no price for claude-prototype-0, not a "
                      "model the card names (another model answered)\n", out, "a price is asked only of the card's models")

    def test_retired_primary_falls_back_and_the_trace_shows_both(self):
        server = self.serve(Answer(404, anthropic_error("not_found_error", "model: claude-sonnet-5-5")),
                            Answer(body=anthropic_message(FINAL, model="claude-haiku-5-5")))
        _, events = self.run_triager()
        model = [e for e in events if e.get("event") == "model"][0]
        self.assertEqual([r["body"]["model"] for r in server.requests], ["claude-sonnet-5-5", "claude-haiku-5-5"])
        self.assertEqual(model["model"], "claude-haiku-5-5")
        self.assertIn("404", json.dumps(model["attempts"]))

    def test_both_models_failing_runs_offline_after_error_and_tower_says_so(self):
        self.serve(Answer(404, anthropic_error("not_found_error", "gone")), Answer(404, anthropic_error("not_found_error", "gone")))
        _, events = self.run_triager()
        backend = [e for e in events if e.get("event") == "model"][0]["backend"]
        self.assertTrue(backend.startswith("offline-after-error: "), backend)
        tower = self.factory("tower")[1]
        self.assertIn("offline-after-error", tower)

    def test_big_tool_result_is_clipped_and_kept_whole_on_disk(self):
        (self.root / "agents" / "tools" / "logs.py").write_text(BIG_TOOL)
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
        where = re.search(r"full text at (\S+)", sent).group(1)
        self.assertEqual(len((self.root / where).read_text()), 1_000_008)

    def test_unknown_price_is_never_within_the_envelope(self):
        self.serve(Answer(body=anthropic_message(FINAL, model="claude-prototype-0")))
        out, events = self.run_triager(agent="proto")
        self.assertIsNone(events[-1]["cost_usd"])
        self.assertIn("?", [line for line in self.factory("tower")[1].splitlines() if line.startswith("proto")][0])

    def test_no_key_appears_in_any_file_the_run_wrote(self):
        self.serve(Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL)))
        out, _ = self.run_triager()
        self.assertNotIn(KEY, out)
        for path in self.root.rglob("*"):
            if path.is_file():
                self.assertNotIn(KEY.encode(), path.read_bytes(), path)

    def test_sageroute_headers_land_in_the_trace_and_the_vendor_key_stays_home(self):
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


class OutputParsing(CertifiedTest):
    """The final answer's object is the first one the output contract accepts, whatever text is around it."""

    def test_prose_braces_fences_and_notes_do_not_hide_the_answer(self):
        other = json.dumps({"example": True})
        texts = {"a format line first": f"Output format {{label, escalate, draft}}:\n{FINAL}",
                 "a note after a fence": f"```json\n{FINAL}\n```\nNote: {{escalate}} is true because money moved.",
                 "an object the contract refuses first": f"Example: {other}\nAnswer: {FINAL}"}
        for why, text in texts.items():
            with self.subTest(why):
                server = FakeServer(Answer(body=anthropic_message(text))).start()
                self.addCleanup(server.close)
                self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=KEY)
                code, _, err = self.factory("run", "triager", "I was charged twice for my card")
                self.assertEqual(code, 0, err)
                end = self.traces()[-1][-1]
                self.assertEqual((end["status"], end["output"]), ("done", json.loads(FINAL)), end["reason"])

    def test_no_accepted_object_names_the_first_objects_break(self):
        worker = llm.Scripted([reply('{"label": "urgent", "escalate": false, "draft": "x"} and {"note": 1}')])
        loop = factory.build_loop(self.fac, factory.load_agent(self.fac, "triager"), "prove", [].append, "hi", worker=worker)
        self.assertEqual(factory.run_loop(loop), "escalated")
        self.assertIn("breaks the output contract", loop.reason)
        self.assertIn("urgent", loop.reason)


class Overloaded(FakeServer):
    """A model server that answers every request 429 (rate limited, retry after 0.5 s)."""

    def take(self, record: dict) -> Answer:
        super().take(record)
        return Answer(429, anthropic_error("rate_limit_error", "slow down"), headers={"retry-after": "0.5"})


class OneBreakerPerStation(CertifiedTest):
    """Every worker of a station shares one circuit breaker: a backend that keeps answering 429 is
    rested for the whole batch, not rediscovered by each ticket (3 requests a ticket before)."""

    def overloaded(self) -> Overloaded:
        server = Overloaded().start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=KEY)
        return server

    def test_run_file_with_jobs_sends_a_handful_of_requests(self):
        server = self.overloaded()
        inbox = self.root / "evals" / "triager" / "inbox.jsonl"
        code, out, err = self.factory("run", "triager", "--file", str(inbox), "--jobs", "4")
        self.assertEqual(code, 0, err)
        self.assertEqual(len(out.splitlines()), 20)
        self.assertLessEqual(len(server.requests), 12, "20 tickets x 3 attempts with a breaker per worker")
        backends = {b for row in self.index_rows() for b in row["backends"]}
        self.assertTrue(all(b.startswith("offline-after-error: ") for b in backends), backends)
        self.assertIn("rested", " ".join(backends))

    def test_prove_with_jobs_sends_a_handful_of_requests(self):
        server = self.overloaded()
        cases = [{"id": f"c{i}", "input": f"How do I order a new card? ({i})", "expect": {"label": "account"}}
                 for i in range(20)]
        write_jsonl(self.root / "evals" / "triager" / "cases.jsonl", cases)
        code, out, err = self.factory("prove", "triager", "--json", "--jobs", "4")
        self.assertEqual((code, json.loads(out)["passing_cases"]), (0, 20), err)
        self.assertLessEqual(len(server.requests), 12, "20 cases x 3 attempts with a breaker per worker")


def reply(text: str = "", calls: tuple = (), stop: str | None = None) -> llm.Reply:
    """A scripted model reply: final text, or tool calls given as (id, name, args); its stop reason is
    `stop`, else the one a complete turn of that kind has."""
    return llm.Reply(text, tuple(llm.ToolCall(*call) for call in calls), {}, 0.0, "scripted", "scripted", 0.0,
                     stop_reason=stop or ("tool_use" if calls else "end"))


class ScriptedLoop(CertifiedTest):
    """build_loop in each mode, driven by llm.Scripted: the scripted twin of a worker."""

    def agent(self) -> factory.Agent:
        return factory.load_agent(self.fac, "triager")

    def test_a_scripted_worker_drives_a_proving_loop(self):
        worker = llm.Scripted([reply(calls=[("c1", "issues:label", {"label": "bug", "escalate": False})]),
                               reply(json.dumps({"label": "bug", "escalate": False, "draft": "We are on it."}))])
        events: list = []
        loop = factory.build_loop(self.fac, self.agent(), "prove", events.append, "The app crashes", worker=worker)
        self.assertEqual(factory.run_loop(loop), "done")
        self.assertEqual(loop.output["label"], "bug")
        self.assertEqual([e["event"] for e in events], ["model", "tool", "tool_result", "model"])
        self.assertEqual(events[1]["ruling"], "RECORDED", "proving records, never executes")
        self.assertEqual(len(worker.sent), 2)
        messages, tools = worker.sent[1]
        self.assertEqual(messages[-1]["role"], "tool")
        self.assertEqual(sorted(t["name"] for t in tools), ["drafts:write", "issues:label"], "only granted, not denied")
        self.assertFalse((self.root / "outbox").exists())

    def test_a_held_call_changed_after_the_gate_saw_it_is_not_committed(self):
        agent, run_id = self.agent(), factory.new_run_id()
        _, cert = factory.certified_agent(self.fac, "triager")
        trace = factory.Trace.start(self.fac, {"run_id": run_id, "agent": "triager", "at": factory.utc_now(),
                                               "digest": agent.digest, "tier": "C1", "input": "hi"})
        worker = llm.Scripted([reply(calls=[("c1", "drafts:write", {"text": "We are on it."})]),
                               reply(json.dumps({"label": "bug", "escalate": False, "draft": "We are on it."}))])
        loop = factory.build_loop(self.fac, agent, "run", trace.record, "The app crashes", tier="C1", run_id=run_id,
                                  worker=worker)
        self.assertEqual(factory.run_loop(loop), "done")
        with FakeSage(yes_p=0.95) as fake:
            self.env.update(SAGE_ENDPOINT=fake.url, SAGE_API_KEY="sage-key")
            gate = factory.gate_output(factory.Clients(self.env), agent, loop.task, loop.output, loop.broker.held, [], "C1")
        self.assertEqual(gate["result"], "pass")
        loop.broker.held[0].args["text"] = "We will refund you 40 dollars by Friday."
        settled = factory.settle_held(self.fac, agent, cert, trace, loop.broker, "C1", gate, False)
        self.assertEqual(settled.rows, [["drafts:write", "review", None]])
        self.assertEqual(self.outbox("triager", "drafts"), [])
        self.assertEqual(self.outbox("triager", "review")[0]["why"], "the gate did not see these arguments")

    def test_running_past_the_script_is_the_callers_stop(self):
        ran_out = lambda: factory.Diverged("the script ended")  # noqa: E731
        loop = factory.build_loop(self.fac, self.agent(), "replay", [].append, "hi", worker=llm.Scripted([], ran_out))
        self.assertEqual((factory.run_loop(loop), loop.reason), ("diverged", "the script ended"))
        loop = factory.build_loop(self.fac, self.agent(), "replay", [].append, "hi", worker=llm.Scripted([reply("no json")]))
        self.assertEqual((factory.run_loop(loop), loop.reason), ("escalated", "the answer holds no json object"))

    def test_each_mode_is_assembled_as_its_table_says(self):
        agent, run_id = self.agent(), factory.new_run_id()
        for mode, how in factory.MODES.items():
            with self.subTest(mode=mode):
                loop = factory.build_loop(self.fac, agent, mode, [].append, "hi", tier="C1", run_id=run_id,
                                          tools={"issues:label": lambda args: "given"})
                self.assertEqual(loop.broker.mode, how.broker)
                self.assertEqual(loop.broker.policy.tier, "C1")
                self.assertEqual(loop.router is not None, how.watched)
                self.assertEqual(loop.spill is not None, how.spills)
                self.assertEqual(loop.worker is not None, how.asks)
                own = set(loop.broker.tools) == set(agent.card["tools"])   # the implementations of its granted tools
                self.assertEqual(own, how.own_tools)
                if not how.own_tools:
                    self.assertEqual(list(loop.broker.tools), ["issues:label"])
        self.assertFalse((self.root / "outbox").exists(), "assembling a loop writes nothing")


class Replay(CertifiedTest):
    """replay feeds a run's recorded replies to today's code and says what differs."""

    def serve(self, *answers: Answer) -> FakeServer:
        server = FakeServer(*answers).start()
        self.addCleanup(server.close)
        self.env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY=KEY)
        return server

    def run_once(self) -> str:
        """One run of the triager; its run id."""
        self.assertEqual(self.factory("run", "triager", "I was charged twice for my card")[0], 0)
        return self.traces()[-1][0]["run_id"]

    def test_replay_live_asks_the_model_again(self):
        server = self.serve(*[Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL))] * 2)
        run_id = self.run_once()
        code, out, _ = self.factory("replay", run_id, "--live")
        self.assertEqual((code, out.strip()), (0, f"replay {run_id} (triager, live): no differences"))
        self.assertEqual(len(server.requests), 4)
        self.assertEqual(len(self.traces()), 1, "a replay writes no trace")

    def test_replay_takes_the_run_as_run_printed_it(self):
        self.serve(Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL)))
        code, out, err = self.factory("run", "triager", "I was charged twice for my card")
        self.assertEqual(code, 0, err)
        printed = re.search(r"trace (triager/\S+)$", out.strip()).group(1)
        code, out, err = self.factory("replay", printed)
        self.assertEqual((code, out.split(": ", 1)[1].strip()), (0, "no differences"), err)
        self.refused(f"run {printed.split('/')[1]} is not evalsmith's: its trace is traces/{printed}.jsonl",
                     "replay", printed.replace("triager/", "evalsmith/"))
        self.usage_error("is not a run id, RUN_ID or AGENT/RUN_ID", "replay", "triager/latest")
        self.usage_error("is not a run id", "replay", "../" + printed)

    def test_replay_matches_and_then_differs_after_a_contract_change(self):
        self.serve(Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL)))
        run_id = self.run_once()
        code, out, _ = self.factory("replay", run_id)
        self.assertEqual((code, out.split(": ", 1)[1].strip()), (0, "no differences"))
        path = self.root / "agents" / "tools" / "drafts.py"
        path.write_text(path.read_text().replace('"maxLength": 600', '"maxLength": 10'))
        code, out, _ = self.factory("replay", run_id)
        self.assertEqual(code, 1)
        self.assertIn("DENIED_CONTRACT", out)

    def test_replay_of_a_run_made_under_another_digest_says_so(self):
        """A run the agent made before its card or code changed was replayed on today's without a word."""
        self.serve(Answer(body=anthropic_message(tool_uses=[LABEL, DRAFT])), Answer(body=anthropic_message(FINAL)))
        run_id, made = self.run_once(), self.cert()["digest"]
        self.edit_card("triager", max_steps=7)
        now = factory.load_agent(self.fac, "triager").digest
        code, out, err = self.factory("replay", run_id)
        self.assertEqual((code, out.splitlines()), (0, [
            f"run {run_id} was made under digest {made}; triager is now {now}: this replay feeds its recorded replies "
            f"to today's card and code, not the ones that made it", f"replay {run_id} (triager, recorded replies): no differences"]),
            err)

    def test_a_trace_an_older_factory_wrote_is_refused_naming_its_format(self):
        run_id = self.run_once()
        path = next((self.root / "traces" / "triager").glob(f"{run_id}.jsonl"))
        path.write_text(path.read_text().replace(f'"format":"{factory.TRACE_FORMAT}"', '"format":"factory-trace-2"', 1))
        self.refused(f"traces/triager/{run_id}.jsonl: a factory-trace-2 trace, not {factory.TRACE_FORMAT}: written by an "
                     f"older factory", "replay", run_id)

    def test_a_trace_that_is_not_ours_or_not_finished_is_refused(self):
        run_id = self.run_once()
        path = next((self.root / "traces" / "triager").glob(f"{run_id}.jsonl"))
        lines = path.read_text().splitlines()
        path.write_text("\n".join(lines[:-1]) + "\n")
        self.refused(f"traces/triager/{run_id}.jsonl: not a finished {factory.TRACE_FORMAT} trace", "replay", run_id)
        path.write_text("\n".join([lines[0].replace(factory.TRACE_FORMAT, "another-trace-1")] + lines[1:]) + "\n")
        self.refused("(no header line)", "replay", run_id)
        self.usage_error("is not a run id", "replay", "../x")
        self.refused("no trace for run", "replay", "20990101T000000000000Z-abcdef")


class ReplayedOutput(unittest.TestCase):
    """replay compared the recorded output with today's by Python's `!=`: `false` recorded and `0` today (or
    1 and true) was no difference. They are compared as JSON (broker.same_json): 1 and 1.0 are one number."""

    def test_a_boolean_become_a_number_is_a_difference(self):
        def differences(then, now):
            return broker.replay_differences([], [], {"status": "done", "output": then},
                                             types.SimpleNamespace(output=now, reason=""), "done")
        self.assertEqual(differences({"vip": False, "n": [True]}, {"vip": 0, "n": [1]}),
                         ['output: recorded {"vip": false, "n": [true]} / today {"vip": 0, "n": [1]}'])
        self.assertEqual(differences({"vip": True, "n": 2}, {"n": 2.0, "vip": True}), [])


class SameCallByValue(unittest.TestCase):
    """Two calls' arguments were compared by args_digest, a digest of their JSON text: 7002.0 and 7002 differed. A
    trace recorded before the broker handed an integer param's 7002.0 to its tool as 7002 replayed with a false
    difference (exit 1), and pending/approve missed an executed call whose arguments equal by value (40.0 and 40).
    Replay, executed twins and the run gate's repeat detectors compare by value (broker.by_value), as settle's
    duplicates do; the recorded digests stay what they were."""

    def event(self, args, ruling="ok"):
        return {"event": "tool", "seq": 1, "tool": "net:open", "args": args, "args_digest": broker.args_digest(args), "ruling": ruling}

    def test_a_trace_recorded_with_7002_0_replays_without_a_difference(self):
        loop = types.SimpleNamespace(output={"ok": True}, reason="")
        end = {"status": "done", "output": {"ok": True}}
        then, today = self.event({"port": 7002.0, "host": "a"}), self.event({"host": "a", "port": 7002})
        self.assertNotEqual(then["args_digest"], today["args_digest"])
        self.assertEqual(broker.replay_differences([then], [today], end, loop, "done"), [])
        other = self.event({"host": "a", "port": 7003})
        self.assertEqual(broker.replay_differences([then], [other], end, loop, "done"),
                         [f"tool call 1: recorded ('net:open', '{then['args_digest']}', 'ok') / today "
                          f"('net:open', '{other['args_digest']}', 'ok')"])

    def parked(self, run, args):
        return {"run_id": run, "call": 1, "agent": "payer", "tool": "billing:refund", "args": args,
                "args_digest": broker.args_digest(args)}

    def test_an_executed_call_with_40_0_is_a_twin_of_40(self):
        first, second = self.parked("r1", {"order": "A1", "amount_usd": 40.0}), self.parked("r2", {"amount_usd": 40, "order": "A1"})
        decided = {("r1", 1): [{"kind": "intent", "agent": "payer", "tool": "billing:refund", "args_digest": first["args_digest"],
                                "by": "bob", "at": "t0"},
                               {"kind": "result", "ok": True, "read_back": True, "at": "t1"}]}
        twin = {"run_id": "r1", "call": 1, "at": "t1", "by": "bob"}
        self.assertEqual(broker.executed_twins(broker.executed_calls(decided, [first, second]), second), [twin])
        self.assertEqual(broker.executed_twins(broker.executed_calls(decided, [first, second]), first), [])
        other = self.parked("r3", {"order": "A1", "amount_usd": 41})
        self.assertEqual(broker.executed_twins(broker.executed_calls(decided, [first, other]), other), [])
        # a parked file edited since its approval is not believed: the signed digest stands for the call
        edited = {**first, "args": {"order": "A1", "amount_usd": 41}}
        self.assertEqual(broker.executed_twins(broker.executed_calls(decided, [edited]), other), [])
        self.assertEqual(broker.executed_twins(broker.executed_calls(decided, [edited]), {**first, "run_id": "r4"}),
                         [twin])

    def test_the_run_gate_sees_40_0_and_40_as_one_action(self):
        def outcome(args):
            return broker.Outcome(1, "billing:lookup", args, "ok", True, None, "read", 0.0, result="same")
        one, other, third = broker.signs_of([outcome({"n": 40.0}), outcome({"n": 40}), outcome({"n": 41})])
        self.assertEqual(one.action, other.action)
        self.assertNotEqual(one.action, third.action)


# ---------------------------------------------------------------- the run gate

def sign(action="a", observation="o", error=None, effect="read", executed=True):
    """A detector input with readable defaults."""
    return broker.Sign(action, observation, error, effect, executed and error is None)


class Detectors(unittest.TestCase):
    """Each detector fires on its pattern and stays quiet on legitimate repeats."""

    def test_same_action_same_observation_three_times(self):
        self.assertTrue(broker.repeated_observation([sign(), sign(), sign()]))
        self.assertFalse(broker.repeated_observation([sign(), sign()]))
        # the same tool with different arguments is a legitimate repeat
        self.assertFalse(broker.repeated_observation([sign("a 1"), sign("a 2"), sign("a 3")]))
        self.assertFalse(broker.repeated_observation([sign(observation=str(i)) for i in range(3)]))

    def test_same_error_class_three_in_a_row_and_a_success_resets(self):
        error = sign(error="TimeoutError")
        self.assertTrue(broker.repeated_error([error, error, error]))
        self.assertFalse(broker.repeated_error([error, error, sign(), error]))
        self.assertFalse(broker.repeated_error([error, sign(error="OSError"), error]))

    def test_two_actions_alternating(self):
        a, b, c = sign("a"), sign("b"), sign("c")
        self.assertTrue(broker.ping_pong([a, b, a, b]))
        self.assertTrue(broker.ping_pong([c, c, c, c, a, b, a, b]))
        self.assertFalse(broker.ping_pong([a, b, a]))
        self.assertFalse(broker.ping_pong([a, b, c, a, b, c]))
        self.assertFalse(broker.ping_pong([a, a, a, a]))

    def test_write_then_failing_check_cycles(self):
        write, check = sign("w", effect="draft"), sign("c", error="CheckFailed")
        self.assertTrue(broker.write_check_cycles([write, check, write, check]))
        self.assertFalse(broker.write_check_cycles([write, check, write, sign("c")]))

    def test_no_successful_execution_for_n_steps(self):
        denied = sign(error="DENIED_UNGRANTED")
        staged = sign(executed=False)
        self.assertTrue(broker.no_progress([denied] * 3 + [staged] * 2))
        self.assertFalse(broker.no_progress([denied] * 4 + [sign()]))
        self.assertFalse(broker.no_progress([denied] * 4))

    def test_budget_burn_and_evidence_line(self):
        self.assertEqual(broker.detect([], 0.86, 1.0), ["budget_burn"])
        self.assertEqual(broker.detect([], 0.5, 1.0), [])
        line = broker.evidence([sign(error="X"), sign()], ["repeat"], 0.41)
        self.assertEqual(line, "tool_calls=2 tool_errors=1 loop_detected=true loop_kind=repeat "
                               "steps_since_progress=0 error_classes=X cost_usd=0.41")


class LongRuns(LineTest):
    """The triager certified with max_steps 12, so the run gate, not the step budget, stops a loop."""

    def prepare(self):
        self.edit_card("triager", max_steps=12)
        self.certified()


class Routed(LongRuns):
    """Scripted worker runs where a detector fires, and each router action takes effect."""

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


class EachDetectorInARun(LongRuns):
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
        calls = [("drafts__write", {"text": f"draft number {i}"}) for i in range(4)]
        self.assertEqual(self.scripted_run(calls), [])


if __name__ == "__main__":
    unittest.main()
