"""llm.py against scripted servers on 127.0.0.1: wire formats, retries, fallback, redirects, prices."""
import json
import time
import unittest
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import llm
from tests.fake_llm import Answer, FakeServer, anthropic_error, anthropic_message, openai_completion

ANTHROPIC_KEY = "sk-ant-test-SECRET-0123456789"
MOONSHOT_KEY = "sk-moon-test-SECRET-987654321"
TOOLS = [{"name": "issues:label", "description": "Label an issue",
          "params": {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}},
         {"name": "drafts:write", "description": "Write a draft",
          "params": {"type": "object", "properties": {"text": {"type": "string"}}}}]
TASK = [{"role": "system", "content": "You triage tickets."}, {"role": "user", "content": "refund please"}]


def rules(task_input):
    """Offline rules: label, then draft, then the output."""
    return [("issues:label", {"label": "billing"}), ("drafts:write", {"text": task_input})], {"label": "billing"}


class ServerTest(unittest.TestCase):
    """Starts scripted servers and builds Workers that never sleep for real."""

    def setUp(self):
        self.waits = []

    def server(self, *answers):
        """A started FakeServer, closed at cleanup."""
        fake = FakeServer(*answers).start()
        self.addCleanup(fake.close)
        return fake

    def worker(self, env, primary="claude-sonnet-5-5", fallback=None, **kw):
        """A Worker whose sleep only records the wait."""
        model = {"primary": primary, "fallback": fallback}
        return llm.Worker(model, env, sleep=self.waits.append, **kw)

    def anthropic_env(self, fake, **extra):
        return {"ANTHROPIC_API_KEY": ANTHROPIC_KEY, "ANTHROPIC_BASE_URL": fake.url, **extra}


class AnthropicWireTest(ServerTest):
    def test_a_reply_that_names_no_model_names_none(self):
        fake = self.server(Answer(body={**anthropic_message("hi"), "model": None}))
        reply = self.worker(self.anthropic_env(fake)).complete(TASK, TOOLS)
        self.assertEqual((reply.backend, reply.model), ("anthropic", ""))   # never the model asked for

    def test_tool_use_round_trip(self):
        fake = self.server(
            Answer(body=anthropic_message("Labelling.", [("toolu_1", "issues__label", {"label": "billing"}),
                                                         ("toolu_2", "drafts__write", {"text": "hi"})]),
                   headers={"request-id": "req_1", "anthropic-organization-id": "org"}),
            Answer(body=anthropic_message('{"label": "billing"}', model="claude-sonnet-4-5-20250929")))
        worker = self.worker(self.anthropic_env(fake))
        first = worker.complete(TASK, TOOLS)
        self.assertEqual([(c.id, c.name, c.args) for c in first.tool_calls],
                         [("toolu_1", "issues:label", {"label": "billing"}),
                          ("toolu_2", "drafts:write", {"text": "hi"})])
        self.assertEqual((first.text, first.backend, first.headers),
                         ("Labelling.", "anthropic", {"request-id": "req_1"}))
        self.assertEqual(first.usage, {"input_tokens": 100, "output_tokens": 20})
        self.assertAlmostEqual(first.cost_usd, (100 * 2.0 + 20 * 10.0) / 1e6)
        messages = TASK + [
            {"role": "assistant", "content": "Labelling.", "tool_calls": [
                {"id": "toolu_1", "name": "issues:label", "args": {"label": "billing"}},
                {"id": "toolu_2", "name": "drafts:write", "args": {"text": "hi"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "name": "issues:label", "content": "ok", "is_error": False},
            {"role": "tool", "tool_call_id": "toolu_2", "name": "drafts:write", "content": "denied: no",
             "is_error": True}]
        second = worker.complete(messages, TOOLS)
        self.assertEqual((second.text, second.tool_calls, second.model),
                         ('{"label": "billing"}', (), "claude-sonnet-4-5-20250929"))
        self.assertAlmostEqual(second.cost_usd, (100 * 3.0 + 20 * 15.0) / 1e6)
        sent = fake.requests[1]
        self.assertEqual(sent["path"], "/v1/messages")
        self.assertEqual(sent["headers"]["x-api-key"], ANTHROPIC_KEY)
        self.assertEqual(sent["headers"]["anthropic-version"], "2023-06-01")
        body = sent["body"]
        self.assertEqual(body["system"], "You triage tickets.")
        self.assertEqual([t["name"] for t in body["tools"]], ["issues__label", "drafts__write"])
        self.assertEqual(body["tools"][0]["input_schema"]["required"], ["label"])
        self.assertNotIn("temperature", body)
        self.assertEqual([m["role"] for m in body["messages"]], ["user", "assistant", "user"])
        self.assertEqual([b["name"] for b in body["messages"][1]["content"] if b["type"] == "tool_use"],
                         ["issues__label", "drafts__write"])
        self.assertEqual(body["messages"][2]["content"], [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok", "is_error": False},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "denied: no", "is_error": True}])

    def test_unknown_blocks_are_skipped(self):
        data = anthropic_message("done")
        data["content"].insert(0, {"type": "thinking", "thinking": "hmm"})
        fake = self.server(Answer(body=data))
        reply = self.worker(self.anthropic_env(fake)).complete(TASK, TOOLS)
        self.assertEqual((reply.text, reply.stop_reason, reply.raw_stop_reason), ("done", "end", "end_turn"))


class OpenAIWireTest(ServerTest):
    def test_tool_call_round_trip_on_moonshot(self):
        fake = self.server(
            Answer(body=openai_completion(None, [("call_1", "issues__label", '{"label": "billing"}')]),
                   headers={"x-request-id": "r-9"}),
            Answer(body=openai_completion("all done")))
        env = {"MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fake.url + "/v1"}
        worker = self.worker(env, primary="kimi-k2.6")
        first = worker.complete(TASK, TOOLS)
        self.assertEqual(first.tool_calls, (llm.ToolCall("call_1", "issues:label", {"label": "billing"}),))
        self.assertEqual((first.text, first.backend, first.headers), ("", "moonshot", {"x-request-id": "r-9"}))
        self.assertAlmostEqual(first.cost_usd, (100 * 0.95 + 20 * 4.0) / 1e6)
        messages = TASK + [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "name": "issues:label",
                                                                 "args": {"label": "billing"}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "issues:label", "content": "boom", "is_error": True}]
        self.assertEqual(worker.complete(messages, TOOLS).text, "all done")
        sent = fake.requests[1]
        self.assertEqual(sent["path"], "/v1/chat/completions")
        self.assertEqual(sent["headers"]["authorization"], f"Bearer {MOONSHOT_KEY}")
        body = sent["body"]
        self.assertEqual(body["tools"][0], {"type": "function", "function": {
            "name": "issues__label", "description": "Label an issue", "parameters": TOOLS[0]["params"]}})
        self.assertEqual(body["messages"][0], {"role": "system", "content": "You triage tickets."})
        call = body["messages"][2]["tool_calls"][0]
        self.assertEqual((call["function"]["name"], json.loads(call["function"]["arguments"])),
                         ("issues__label", {"label": "billing"}))
        self.assertEqual(body["messages"][3], {"role": "tool", "tool_call_id": "call_1", "content": "error: boom"})
        self.assertNotIn("thinking", body)

    def test_kimi_k25_disables_thinking_and_bad_arguments_reach_the_broker(self):
        fake = self.server(Answer(body=openai_completion(None, [("c1", "issues__label", "{not json")])))
        env = {"MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fake.url}
        reply = self.worker(env, primary="kimi-k2.5").complete(TASK, TOOLS)
        self.assertEqual(reply.tool_calls[0].args, {"_unparsed_arguments": "{not json"})
        self.assertEqual(fake.requests[0]["body"]["thinking"], {"type": "disabled"})

    def test_arguments_nested_deeper_than_the_parser_goes_reach_the_broker_unparsed(self):
        deep = '{"label": ' + "[" * 3000 + "]" * 3000 + "}"
        fake = self.server(Answer(body=openai_completion(None, [("c1", "issues__label", deep)])))
        env = {"MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fake.url}
        reply = self.worker(env, primary="kimi-k2.6").complete(TASK, TOOLS)
        self.assertEqual(reply.tool_calls[0].args, {"_unparsed_arguments": deep})

    def test_arguments_holding_nan_infinity_or_a_key_twice_reach_the_broker_unparsed(self):
        for raw in ('{"label": NaN}', '{"label": -Infinity}', '{"label": 1e999}', '{"label": "a", "label": "b"}'):
            with self.subTest(raw=raw):
                fake = self.server(Answer(body=openai_completion(None, [("c1", "issues__label", raw)])))
                env = {"MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fake.url}
                reply = self.worker(env, primary="kimi-k2.6").complete(TASK, TOOLS)
                self.assertEqual(reply.tool_calls[0].args, {"_unparsed_arguments": raw})

    def test_a_reply_holding_nan_infinity_or_a_key_twice_is_malformed(self):
        body = json.dumps(anthropic_message("", [("toolu_1", "issues__label", {"label": "billing"})]))
        cases = {'{"label": NaN}': "NaN", '{"label": Infinity}': "Infinity", '{"label": 1e999}': "1e999",
                 '{"label": "billing", "label": "spam"}': "duplicate key 'label'"}
        for value, named in cases.items():
            with self.subTest(value=value):
                fake = self.server(Answer(body=body.replace('{"label": "billing"}', value)))
                with self.assertRaises(llm.LLMMalformed) as caught:
                    self.worker(self.anthropic_env(fake)).complete(TASK, TOOLS)
                self.assertIn(named, str(caught.exception))

    def test_an_error_body_nested_deeper_than_the_parser_goes_is_still_the_status(self):
        fake = self.server(Answer(400, '{"error": ' + "[" * 3000 + "]" * 3000 + "}"))
        with self.assertRaises(llm.LLMStatus) as caught:
            self.worker(self.anthropic_env(fake)).complete(TASK, [])
        self.assertEqual(caught.exception.status, 400)

    def test_a_conversation_holding_a_lone_surrogate_is_sent_with_it_escaped(self):
        fake = self.server(Answer(body=anthropic_message("ok")))
        lone = [TASK[0], {"role": "user", "content": "refund \ud800 please"}]   # as a model's tool arguments may hold
        self.assertEqual(self.worker(self.anthropic_env(fake)).complete(lone, []).text, "ok")
        self.assertIn(b"refund \\ud800 please", fake.requests[0]["raw"])
        self.assertEqual(fake.requests[0]["body"]["messages"][0]["content"], "refund \ud800 please")

    def test_a_lone_surrogate_in_a_reply_is_read_as_text_but_kept_in_tool_arguments(self):
        lone = "\ud800"
        anthropic = anthropic_message("x" + lone, [("tu" + lone, "issues__lab" + lone, {"label": lone})],
                                      model="claude" + lone, stop="tool_use" + lone)
        openai = openai_completion("x" + lone, [("c" + lone, "issues__lab" + lone, json.dumps({"label": lone}))],
                                   model="kimi" + lone)
        openai["choices"][0]["finish_reason"] += lone
        for wire, body in (("anthropic", anthropic), ("openai", openai)):
            with self.subTest(wire):
                fake = self.server(Answer(body=json.dumps(body)))   # ASCII JSON: the surrogates go as \ud800
                env = {**self.anthropic_env(fake), "MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fake.url}
                reply = self.worker(env, primary="claude-sonnet-5-5" if wire == "anthropic" else "kimi-k2.6").complete(TASK, TOOLS)
                call = reply.tool_calls[0]
                self.assertEqual((reply.text, call.name, call.args), ("x\ufffd", "issues:lab\ufffd", {"label": lone}))
                self.assertTrue(all(s.endswith("\ufffd") for s in (call.id, reply.model, reply.raw_stop_reason)))

    def test_a_lone_surrogate_in_an_error_message_is_read_as_text(self):
        lone = "\ud800"
        bodies = [(529, anthropic_error("overloaded" + lone, "busy " + lone)),
                  (200, {"error": {"type": "x" + lone, "message": "late " + lone, "code": 502}})]
        for status, body in bodies:
            with self.subTest(status):
                fake = self.server(*[Answer(status, json.dumps(body))] * (llm.MAX_RETRIES + 1))
                env = {"OPENAI_API_KEY": MOONSHOT_KEY, "OPENAI_BASE_URL": fake.url, **self.anthropic_env(fake)}
                with self.assertRaises(llm.LLMStatus) as caught:
                    self.worker(env, primary="claude-sonnet-5-5" if status == 529 else "openai/gpt-5").complete(TASK, [])
                self.assertIn("\ufffd", str(caught.exception))
                str(caught.exception).encode("utf-8")   # raises UnicodeEncodeError on a lone surrogate

    def test_a_model_field_or_content_that_is_not_a_string_is_a_malformed_reply(self):
        bodies = [("anthropic", {**anthropic_message("ok"), "model": value}) for value in ({"a": 1}, 7, ["m"])]
        bodies += [("openai", {**openai_completion("ok"), "model": {"a": 1}})]
        content = openai_completion("ok")
        content["choices"][0]["message"]["content"] = 5
        bodies += [("openai", content)]
        for wire, body in bodies:
            with self.subTest(wire=wire, model=body["model"]):
                fake = self.server(Answer(body=body))
                env = {**self.anthropic_env(fake), "MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fake.url}
                with self.assertRaises(llm.LLMMalformed):
                    self.worker(env, primary="claude-sonnet-5-5" if wire == "anthropic" else "kimi-k2.6").complete(TASK, [])

    def test_ollama_needs_no_key_and_costs_nothing(self):
        fake = self.server(Answer(body=openai_completion("hi", model="llama3.2")))
        env = {"OPENAI_BASE_URL": fake.url + "/v1", "ANTHROPIC_API_KEY": ANTHROPIC_KEY}
        reply = self.worker(env, primary="ollama/llama3.2").complete(TASK, [])
        self.assertEqual((reply.backend, reply.model, reply.cost_usd), ("ollama", "llama3.2", 0.0))
        self.assertEqual(fake.requests[0]["body"]["model"], "llama3.2")
        self.assertNotIn(ANTHROPIC_KEY, json.dumps(fake.requests[0]["headers"]))

    def test_token_limit_field_per_server(self):
        fake = self.server(*[Answer(body=openai_completion("ok"))] * 5)
        cases = [("o3-mini", {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": fake.url}, "max_completion_tokens"),
                 ("openai/o1", {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": fake.url}, "max_completion_tokens"),
                 ("qwen2.5-coder", {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": fake.url}, "max_tokens"),
                 ("kimi-k2.6", {"MOONSHOT_API_KEY": "k", "MOONSHOT_BASE_URL": fake.url}, "max_tokens"),
                 ("ollama/llama3.2", {"OPENAI_BASE_URL": fake.url}, "max_tokens")]
        for n, (model, env, field) in enumerate(cases):
            with self.subTest(model=model):
                self.worker(env, primary=model, max_tokens=321).complete(TASK, [])
                body = fake.requests[n]["body"]
                self.assertEqual(body.get(field), 321)
                self.assertEqual({"max_tokens", "max_completion_tokens"} & set(body), {field})

    def test_openai_platform_gets_max_completion_tokens(self):
        env = {"OPENAI_API_KEY": "k", "OPENROUTER_API_KEY": "k"}
        self.assertEqual(llm.route_for("gpt-4.1", env).token_field, "max_completion_tokens")
        self.assertEqual(llm.route_for("gpt-4.1", {**env, "OPENAI_BASE_URL": "http://localhost:1234/v1"}).token_field,
                         "max_tokens")
        self.assertEqual(llm.route_for("openrouter/openai/o3", env).token_field, "max_tokens")
        self.assertEqual(llm.route_for("claude-haiku-5-5", {"ANTHROPIC_API_KEY": "k"}).token_field, "max_tokens")

    def test_error_inside_a_200_body_is_an_error(self):
        fake = self.server(Answer(body={"error": {"code": 502, "message": "upstream died"}}))
        env = {"OPENROUTER_API_KEY": "sk-or-v1-abcdef123456", "OPENROUTER_BASE_URL": fake.url}
        with self.assertRaises(llm.LLMStatus) as caught:
            self.worker(env, primary="openrouter/moonshotai/kimi-k2.6").complete(TASK, [])
        self.assertEqual(caught.exception.status, 502)
        self.assertEqual(fake.requests[0]["body"]["model"], "moonshotai/kimi-k2.6")


class StopReasonTest(ServerTest):
    """Every reply says why the model stopped, as sent and normalised; only end and tool_use act."""

    def anthropic_stop(self, raw, tool_uses=()):
        fake = self.server(Answer(body=anthropic_message("partial", tool_uses, stop=raw)))
        return self.worker(self.anthropic_env(fake)).complete(TASK, TOOLS)

    def openai_stop(self, raw, tool_calls=()):
        data = openai_completion("partial", tool_calls)
        data["choices"][0]["finish_reason"] = raw
        fake = self.server(Answer(body=data))
        env = {"MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fake.url}
        return self.worker(env, primary="kimi-k2.6").complete(TASK, TOOLS)

    def test_anthropic_stop_reasons(self):
        table = {"end_turn": "end", "stop_sequence": "end", "tool_use": "tool_use", "max_tokens": "length",
                 "model_context_window_exceeded": "length", "pause_turn": "other", "something_new": "other"}
        for raw, normal in table.items():
            with self.subTest(raw=raw):
                reply = self.anthropic_stop(raw, [("toolu_1", "issues__label", {"label": "bil"})])
                self.assertEqual((reply.raw_stop_reason, reply.stop_reason), (raw, normal))
                self.assertEqual(reply.acts, normal in ("end", "tool_use"))

    def test_openai_finish_reasons(self):
        table = {"stop": "end", "tool_calls": "tool_use", "function_call": "tool_use", "length": "length",
                 "weird": "other", None: "other"}
        for raw, normal in table.items():
            with self.subTest(raw=raw):
                reply = self.openai_stop(raw, [("c1", "issues__label", '{"label": "bil')])
                self.assertEqual((reply.raw_stop_reason, reply.stop_reason), (raw or "", normal))
                self.assertEqual(reply.acts, normal in ("end", "tool_use"))

    def test_offline_rules_end_or_use_tools(self):
        worker = self.worker({}, rules=rules, task_input="t")
        turns = [worker.complete(TASK + [{"role": "assistant", "content": ""}] * k, TOOLS) for k in range(3)]
        self.assertEqual([(r.stop_reason, r.acts) for r in turns], [("tool_use", True)] * 2 + [("end", True)])

    def test_declines_move_to_the_fallback(self):
        refused = openai_completion(None)
        refused["choices"][0]["message"]["refusal"] = "I can't help with that request."
        filtered = openai_completion("")
        filtered["choices"][0]["finish_reason"] = "content_filter"
        cases = [(refused, "model declined: refusal: I can't help with that request."),
                 (filtered, "model declined: content_filter")]
        for data, error in cases:
            with self.subTest(error=error):
                primary = self.server(Answer(body=data))
                fallback = self.server(Answer(body=anthropic_message('{"label": "billing"}')))
                env = self.anthropic_env(fallback, MOONSHOT_API_KEY=MOONSHOT_KEY, MOONSHOT_BASE_URL=primary.url)
                reply = self.worker(env, primary="kimi-k2.6", fallback="claude-haiku-5-5").complete(TASK, [])
                self.assertEqual((reply.text, reply.backend), ('{"label": "billing"}', "anthropic"))
                self.assertEqual(reply.attempts[0]["error"], error)

    def test_openai_refusal_without_fallback_goes_to_the_rules(self):
        data = openai_completion(None)
        data["choices"][0]["message"]["refusal"] = "No."
        fake = self.server(Answer(body=data))
        env = {"MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fake.url}
        reply = self.worker(env, primary="kimi-k2.6", rules=rules, task_input="t").complete(TASK, TOOLS)
        self.assertEqual(reply.backend, "offline-after-error: model declined: refusal")


class ToolCallIdTest(ServerTest):
    """OpenAI-style servers that send no tool-call id (some llama.cpp, LM Studio) get a stable one."""

    def ask(self, data, **kw):
        fake = self.server(Answer(body=data))
        env = {"OPENAI_API_KEY": "local", "OPENAI_BASE_URL": fake.url + "/v1"}
        return self.worker(env, primary="qwen2.5-coder", **kw).complete(TASK, TOOLS)

    def idless(self):
        data = openai_completion(None, [("x", "issues__label", '{"label": "billing"}'),
                                        ("x", "issues__label", '{"label": "billing"}'),
                                        ("x", "drafts__write", '{"text": "hi"}')])
        for call in data["choices"][0]["message"]["tool_calls"]:
            del call["id"]
        return data

    def test_missing_ids_are_made_up_stable_and_distinct(self):
        first, again = self.ask(self.idless()), self.ask(self.idless())
        ids = [c.id for c in first.tool_calls]
        self.assertEqual(len(set(ids)), 3)
        self.assertTrue(all(ids), ids)
        self.assertEqual(ids, [c.id for c in again.tool_calls])
        self.assertEqual([c.name for c in first.tool_calls], ["issues:label", "issues:label", "drafts:write"])
        self.assertEqual(first.backend, "openai")

    def test_made_up_ids_differ_between_replies(self):
        other = self.idless()
        other["id"] = "chatcmpl-2"
        self.assertNotEqual(self.ask(self.idless()).tool_calls[0].id, self.ask(other).tool_calls[0].id)

    def test_custom_tool_call_is_a_clear_malformed_error(self):
        data = openai_completion(None)
        data["choices"][0]["message"]["tool_calls"] = [
            {"id": "c1", "type": "custom", "custom": {"name": "issues__label", "input": "billing"}}]
        with self.assertRaises(llm.LLMMalformed) as caught:
            self.ask(data)
        self.assertIn("'custom'", str(caught.exception))
        reply = self.ask(data, rules=rules, task_input="t")
        self.assertEqual(reply.backend, "offline-after-error: malformed response")
        self.assertIn("tool call 0 has type 'custom'", reply.attempts[0]["error"])

    def test_legacy_function_call_is_a_tool_call(self):
        data = openai_completion(None)
        data["choices"][0]["message"]["function_call"] = {"name": "issues__label", "arguments": '{"label": "x"}'}
        data["choices"][0]["finish_reason"] = "function_call"
        reply = self.ask(data)
        self.assertEqual([(c.name, c.args) for c in reply.tool_calls], [("issues:label", {"label": "x"})])
        self.assertTrue(reply.tool_calls[0].id)
        self.assertEqual(reply.stop_reason, "tool_use")


class JsonObjectsTest(unittest.TestCase):
    """json_objects finds every JSON object in model text, in order, so the caller can take the
    first one its output contract accepts."""
    REAL = {"label": "billing", "escalate": False, "draft": "We will look at the charge."}

    def test_stray_brace_before_the_object(self):
        text = "Output format {label, escalate, draft}:\n" + json.dumps(self.REAL)
        self.assertEqual(llm.json_objects(text), [self.REAL])

    def test_fenced_object_then_a_note_with_braces(self):
        text = f"```json\n{json.dumps(self.REAL, indent=2)}\n```\nNote: fields use {{name}} and {{a: b}}."
        self.assertEqual(llm.json_objects(text), [self.REAL])

    def test_objects_in_order_without_their_inner_objects(self):
        text = 'First {"example": {"inner": 1}} then {"label": "x", "note": "a } and a {"} end'
        self.assertEqual(llm.json_objects(text), [{"example": {"inner": 1}}, {"label": "x", "note": "a } and a {"}])

    def test_nothing_usable(self):
        for text in ("", "no braces", "[1, 2]", "{unquoted: 1}", '{"p": NaN}', '{"p": -Infinity}',
                     '{"p": 1e999}', '{"a": ' + "[" * 10_000, "{" * 5_000):
            with self.subTest(text=text[:20]):
                self.assertEqual(llm.json_objects(text), [])


class RetryTest(ServerTest):
    def test_429_honours_retry_after_then_succeeds(self):
        fake = self.server(Answer(429, anthropic_error("rate_limit_error", "slow down"), {"retry-after": "0.01"}),
                           Answer(body=anthropic_message("ok")))
        reply = self.worker(self.anthropic_env(fake)).complete(TASK, [])
        self.assertEqual((reply.text, len(self.waits), len(fake.requests)), ("ok", 1, 2))
        self.assertTrue(0.01 <= self.waits[0] <= 0.0125, self.waits)
        self.assertEqual(reply.attempts[0]["retry_in_s"], round(self.waits[0], 3))
        self.assertIn("HTTP 429 rate_limit_error", reply.attempts[0]["error"])

    def test_retry_after_ms_wins(self):
        fake = self.server(Answer(429, anthropic_error("rate_limit_error", "x"),
                                  {"retry-after-ms": "20", "retry-after": "1"}),
                           Answer(body=anthropic_message("ok")))
        self.worker(self.anthropic_env(fake)).complete(TASK, [])
        self.assertTrue(0.02 <= self.waits[0] <= 0.025, self.waits)

    def test_529_backs_off_then_succeeds(self):
        fake = self.server(Answer(529, anthropic_error("overloaded_error", "busy")),
                           Answer(body=anthropic_message("ok")))
        reply = self.worker(self.anthropic_env(fake)).complete(TASK, [])
        self.assertEqual(reply.text, "ok")
        self.assertEqual(len(self.waits), 1)
        self.assertTrue(0.375 <= self.waits[0] <= 0.5, self.waits)

    def test_exhausted_retries_move_to_fallback(self):
        primary = self.server(*[Answer(500, anthropic_error("api_error", "oops"))] * 3)
        fallback = self.server(Answer(body=openai_completion("from kimi")))
        env = self.anthropic_env(primary, MOONSHOT_API_KEY=MOONSHOT_KEY, MOONSHOT_BASE_URL=fallback.url)
        reply = self.worker(env, fallback="kimi-k2.6").complete(TASK, [])
        self.assertEqual((reply.text, reply.backend, len(primary.requests)), ("from kimi", "moonshot", 3))
        self.assertEqual(len(self.waits), 2)
        self.assertTrue(0.75 <= self.waits[1] <= 1.0, self.waits)
        self.assertEqual([a["retry_in_s"] is None for a in reply.attempts], [False, False, True])

    def test_long_retry_after_fails_over_instead_of_sleeping(self):
        primary = self.server(Answer(429, anthropic_error("rate_limit_error", "x"), {"retry-after": "120"}))
        reply = self.worker(self.anthropic_env(primary), rules=rules, task_input="t").complete(TASK, TOOLS)
        self.assertEqual((self.waits, reply.backend), ([], "offline-after-error: HTTP 429 rate_limit_error"))

    def test_client_errors_are_not_retried(self):
        for status, etype in ((400, "invalid_request_error"), (401, "authentication_error"),
                              (403, "permission_error"), (404, "not_found_error")):
            with self.subTest(status=status):
                fake = self.server(Answer(status, anthropic_error(etype, "no")))
                with self.assertRaises(llm.LLMStatus) as caught:
                    self.worker(self.anthropic_env(fake)).complete(TASK, [])
                self.assertEqual((caught.exception.status, len(fake.requests), self.waits), (status, 1, []))

    def test_spend_limit_429_is_not_retried(self):
        for code in ("enforced_spend_limit_reached", "contract_spend_limit_reached"):
            with self.subTest(code=code):
                body = {"type": "error", "error": {"type": "rate_limit_error", "message": "cap",
                                                   "details": {"error_code": code}}}
                fake = self.server(Answer(429, body, {"retry-after": "0.01"}))
                with self.assertRaises(llm.LLMStatus):
                    self.worker(self.anthropic_env(fake)).complete(TASK, [])
                self.assertEqual(len(fake.requests), 1)

    def test_refused_connection_is_retried_then_gives_up(self):
        dead = FakeServer()
        dead.close()
        worker = self.worker({"ANTHROPIC_API_KEY": ANTHROPIC_KEY, "ANTHROPIC_BASE_URL": dead.url})
        with self.assertRaises(llm.ConnectionFailed):
            worker.complete(TASK, [])
        self.assertEqual(len(self.waits), 2)


class BreakerTest(ServerTest):
    """Sustained 429/5xx: jittered waits, and a per-backend breaker shared by a batch's Workers."""
    LIMITED = Answer(429, anthropic_error("rate_limit_error", "slow down"), {"retry-after": "2"})

    def setUp(self):
        super().setUp()
        self.now = [1000.0]

    def breaker(self, **kw):
        """A Breaker on a clock the test moves by hand."""
        return llm.Breaker(clock=lambda: self.now[0], **kw)

    def ticket(self, env, breaker):
        """One offline-capable run: ask until the rules (or a model) give the final text."""
        worker = self.worker(env, fallback="claude-haiku-5-5", rules=rules, task_input="t", breaker=breaker)
        replies, history = [], list(TASK)
        while not replies or replies[-1].tool_calls:
            replies.append(worker.complete(history, TOOLS))
            history.append({"role": "assistant", "content": ""})
        return replies

    def test_retry_after_waits_are_jittered(self):
        fake = self.server(*[self.LIMITED, Answer(body=anthropic_message("ok"))] * 6)
        for _ in range(6):
            self.worker(self.anthropic_env(fake)).complete(TASK, [])
        self.assertTrue(all(2.0 <= w <= 2.5 for w in self.waits), self.waits)
        self.assertGreater(len(set(self.waits)), 1, self.waits)

    def test_twenty_tickets_four_at_a_time_against_a_server_that_always_says_429(self):
        fake = self.server(*[self.LIMITED] * 200)
        shared = self.breaker()
        with ThreadPoolExecutor(max_workers=4) as pool:
            runs = list(pool.map(lambda _: self.ticket(self.anthropic_env(fake), shared), range(20)))
        # Without the breaker: 20 tickets x 2 models x 3 attempts = 120 requests.
        self.assertLessEqual(len(fake.requests), 8)
        self.assertGreaterEqual(len(fake.requests), 3)
        firsts = [run[0] for run in runs]
        self.assertTrue(all(r.backend.startswith("offline-after-error: ") for r in firsts))
        skipped = [r for r in firsts if all(a["error"].startswith("skipped: anthropic is rested")
                                           for a in r.attempts)]
        self.assertGreaterEqual(len(skipped), 16)
        self.assertEqual([a["model"] for a in skipped[-1].attempts], ["claude-sonnet-5-5", "claude-haiku-5-5"])
        self.assertEqual(skipped[-1].backend,
                         "offline-after-error: anthropic rested after HTTP 429 rate_limit_error")

    def test_rest_lasts_the_retry_after_then_one_probe_closes_it(self):
        fake = self.server(*[self.LIMITED] * 3, Answer(body=anthropic_message("back")),
                           Answer(body=anthropic_message("again")))
        shared, env = self.breaker(), self.anthropic_env(fake)
        self.worker(env, rules=rules, breaker=shared).complete(TASK, [])
        self.assertEqual(len(fake.requests), 3)
        self.now[0] += 1.9
        rested = self.worker(env, rules=rules, breaker=shared).complete(TASK, [])
        self.assertEqual((len(fake.requests), rested.backend),
                         (3, "offline-after-error: anthropic rested after HTTP 429 rate_limit_error"))
        self.assertIn("0.1 s more after 3 answers of HTTP 429 rate_limit_error", rested.attempts[0]["error"])
        self.now[0] += 0.2
        self.assertEqual(self.worker(env, breaker=shared).complete(TASK, []).text, "back")
        self.assertEqual(self.worker(env, breaker=shared).complete(TASK, []).text, "again")
        self.assertEqual(len(fake.requests), 5)

    def test_a_failed_probe_rests_the_backend_again(self):
        fake = self.server(*[self.LIMITED] * 5)
        shared, env = self.breaker(), self.anthropic_env(fake)
        self.worker(env, rules=rules, breaker=shared).complete(TASK, [])
        self.now[0] += 3
        probe = self.worker(env, rules=rules, breaker=shared).complete(TASK, [])
        self.assertEqual(len(fake.requests), 4)
        self.assertEqual(probe.attempts[-1]["error"].split(":")[0], "skipped")
        self.worker(env, rules=rules, breaker=shared).complete(TASK, [])
        self.assertEqual(len(fake.requests), 4)

    def test_without_retry_after_the_rest_is_the_default(self):
        fake = self.server(*[Answer(529, anthropic_error("overloaded_error", "busy"))] * 4)
        shared, env = self.breaker(), self.anthropic_env(fake)
        self.worker(env, rules=rules, breaker=shared).complete(TASK, [])
        self.now[0] += llm.DEFAULT_REST_S - 1
        self.worker(env, rules=rules, breaker=shared).complete(TASK, [])
        self.assertEqual(len(fake.requests), 3)
        self.now[0] += 2
        self.worker(env, rules=rules, breaker=shared).complete(TASK, [])
        self.assertEqual(len(fake.requests), 4)

    def test_other_errors_never_rest_a_backend(self):
        fake = self.server(*[Answer(404, anthropic_error("not_found_error", "model"))] * 5)
        shared, env = self.breaker(), self.anthropic_env(fake)
        for _ in range(5):
            self.worker(env, rules=rules, breaker=shared).complete(TASK, [])
        self.assertEqual(len(fake.requests), 5)

    def test_one_worker_rests_the_backend_for_its_own_fallback(self):
        fake = self.server(*[self.LIMITED] * 6)
        reply = self.worker(self.anthropic_env(fake), fallback="claude-haiku-5-5", rules=rules).complete(TASK, [])
        self.assertEqual(len(fake.requests), 3)
        self.assertTrue(reply.attempts[-1]["error"].startswith("skipped: anthropic is rested"))

    def test_a_rested_backend_does_not_stop_another(self):
        limited = self.server(*[self.LIMITED] * 3)
        kimi = self.server(Answer(body=openai_completion("kimi")), Answer(body=openai_completion("kimi")))
        shared = self.breaker()
        env = self.anthropic_env(limited, MOONSHOT_API_KEY=MOONSHOT_KEY, MOONSHOT_BASE_URL=kimi.url)
        first = self.worker(env, fallback="kimi-k2.6", breaker=shared).complete(TASK, [])
        second = self.worker(env, fallback="kimi-k2.6", breaker=shared).complete(TASK, [])
        self.assertEqual((first.text, second.text, len(limited.requests)), ("kimi", "kimi", 3))
        self.assertTrue(second.attempts[0]["error"].startswith("skipped: anthropic is rested"))


class FallbackTest(ServerTest):
    def test_retired_model_404_moves_to_fallback(self):
        fake = self.server(Answer(404, anthropic_error("not_found_error", "model: claude-sonnet-4-5")),
                           Answer(body=anthropic_message("one", model="claude-haiku-5-5")))
        worker = self.worker(self.anthropic_env(fake), primary="claude-sonnet-4-5", fallback="claude-haiku-5-5")
        reply = worker.complete(TASK, [])
        self.assertEqual((reply.text, reply.backend, reply.model), ("one", "anthropic", "claude-haiku-5-5"))
        self.assertEqual([r["body"]["model"] for r in fake.requests], ["claude-sonnet-4-5", "claude-haiku-5-5"])
        self.assertEqual(reply.attempts[0]["model"], "claude-sonnet-4-5")
        self.assertIn("HTTP 404 not_found_error", reply.attempts[0]["error"])
        self.assertEqual(self.waits, [])

    def test_fallback_on_another_backend_is_kept_for_the_rest_of_the_run(self):
        primary = self.server(Answer(404, anthropic_error("not_found_error", "model: claude-sonnet-4-5")))
        fallback = self.server(Answer(body=openai_completion("one")), Answer(body=openai_completion("two")))
        env = self.anthropic_env(primary, MOONSHOT_API_KEY=MOONSHOT_KEY, MOONSHOT_BASE_URL=fallback.url)
        worker = self.worker(env, primary="claude-sonnet-4-5", fallback="kimi-k2.6")
        first, second = worker.complete(TASK, []), worker.complete(TASK, [])
        self.assertEqual((first.text, second.text, len(primary.requests)), ("one", "two", 1))
        self.assertEqual(len(first.attempts), 1)
        self.assertEqual(first.attempts[0]["backend"], "anthropic")
        self.assertEqual(second.attempts, ())
        self.assertEqual(worker.planned_backend(), "moonshot")

    def test_timeout_goes_offline_after_error(self):
        fake = self.server(Answer(body=anthropic_message("late"), delay=2.0))
        worker = self.worker(self.anthropic_env(fake), rules=rules, task_input="t", timeout=0.1)
        start = time.monotonic()
        reply = worker.complete(TASK, TOOLS)
        self.assertLess(time.monotonic() - start, 0.5)
        self.assertEqual(reply.backend, "offline-after-error: timeout after 0.1s")
        self.assertEqual(reply.tool_calls, (llm.ToolCall("offline-0", "issues:label", {"label": "billing"}),))
        self.assertEqual((len(fake.requests), self.waits), (1, []))
        self.assertEqual(reply.attempts, ({"model": "claude-sonnet-5-5", "backend": "anthropic",
                                           "error": "timeout after 0.1s", "retry_in_s": None},))
        later = worker.complete(TASK + [{"role": "assistant", "content": "x"}], TOOLS)
        self.assertEqual((later.backend, len(fake.requests)), ("offline-after-error: timeout after 0.1s", 1))

    def test_dripping_reply_ends_at_the_deadline(self):
        # every byte comes well inside the per-read timeout, so only the whole call's deadline ends it
        fake = self.server(Answer(body=anthropic_message("slow"), drip=0.05))
        worker = self.worker(self.anthropic_env(fake), rules=rules, task_input="t", timeout=5.0, deadline=0.4)
        start = time.monotonic()
        reply = worker.complete(TASK, TOOLS)
        self.assertLess(time.monotonic() - start, 1.5)
        self.assertEqual(reply.backend, "offline-after-error: timeout after 0.4s")
        self.assertEqual((len(fake.requests), self.waits), (1, []))

    def test_dripping_error_body_keeps_its_status_and_ends_at_the_deadline(self):
        fake = self.server(Answer(404, anthropic_error("not_found_error", "gone"), drip=0.05))
        worker = self.worker(self.anthropic_env(fake), rules=rules, timeout=5.0, deadline=0.4)
        start = time.monotonic()
        reply = worker.complete(TASK, [])
        self.assertLess(time.monotonic() - start, 1.5)
        self.assertTrue(reply.attempts[0]["error"].startswith("HTTP 404 error: {"), reply.attempts[0])
        self.assertEqual(len(fake.requests), 1)

    def test_reply_past_the_cap_is_refused_without_retry(self):
        big = b'{"content": "' + b"x" * llm.MAX_REPLY_BYTES + b'"}'
        for unsized in (False, True):
            with self.subTest(unsized=unsized):
                fake = self.server(Answer(body=big, unsized=unsized), Answer(body=big, unsized=unsized))
                reply = self.worker(self.anthropic_env(fake), rules=rules).complete(TASK, [])
                self.assertEqual(reply.backend, "offline-after-error: reply too large")
                self.assertEqual(reply.attempts[0]["error"], "reply too large: over 16 MiB")
                self.assertEqual((len(fake.requests), self.waits), (1, []))

    def test_body_shorter_than_its_length_is_a_cut_connection(self):
        short = Answer(body=anthropic_message("cut"), headers={"content-length": "99999"}, unsized=True)
        fake = self.server(short, short, short)
        reply = self.worker(self.anthropic_env(fake), rules=rules).complete(TASK, [])
        self.assertEqual(reply.backend, "offline-after-error: connection failed")
        self.assertEqual(reply.attempts[0]["error"], "connection failed: IncompleteRead")
        self.assertEqual(len(fake.requests), 3)   # retried twice, as any cut connection

    def test_unsized_reply_under_the_cap_is_read(self):
        fake = self.server(Answer(body=anthropic_message("whole"), unsized=True))
        self.assertEqual(self.worker(self.anthropic_env(fake)).complete(TASK, []).text, "whole")

    def test_malformed_body(self):
        deep = '{"content": ' + "[" * 3000 + "]" * 3000 + "}"   # deeper than the JSON parser goes
        for body in ("not json at all", {"no": "content"}, [1, 2], deep):
            with self.subTest(body=str(body)[:20]):
                fake = self.server(Answer(body=body), Answer(body=body))
                with self.assertRaises(llm.LLMMalformed):
                    self.worker(self.anthropic_env(fake)).complete(TASK, [])
                reply = self.worker(self.anthropic_env(fake), rules=rules).complete(TASK, [])
                self.assertEqual(reply.backend, "offline-after-error: malformed response")

    def test_refusal_falls_back(self):
        primary = self.server(Answer(body=anthropic_message("no", stop="refusal")))
        fallback = self.server(Answer(body=openai_completion("yes")))
        env = self.anthropic_env(primary, MOONSHOT_API_KEY=MOONSHOT_KEY, MOONSHOT_BASE_URL=fallback.url)
        reply = self.worker(env, fallback="kimi-k2.6").complete(TASK, [])
        self.assertEqual((reply.text, reply.attempts[0]["error"]), ("yes", "model declined: refusal"))

    def test_missing_primary_key_uses_fallback_and_says_so(self):
        fallback = self.server(Answer(body=openai_completion("kimi here")))
        env = {"MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fallback.url}
        worker = self.worker(env, fallback="kimi-k2.6")
        self.assertEqual(worker.planned_backend(), "moonshot")
        reply = worker.complete(TASK, [])
        self.assertEqual(reply.backend, "moonshot")
        self.assertEqual(reply.attempts[0]["error"], "unavailable: no ANTHROPIC_API_KEY")


class KeylessTest(ServerTest):
    def test_no_key_runs_offline_with_zero_requests(self):
        fake = self.server(Answer(body=anthropic_message("should not be asked")))
        worker = self.worker({"ANTHROPIC_BASE_URL": fake.url}, fallback="kimi-k2.6", rules=rules, task_input="t")
        self.assertEqual(worker.planned_backend(), "offline")
        replies = [worker.complete(TASK + [{"role": "assistant", "content": ""}] * k, TOOLS) for k in range(3)]
        self.assertEqual(fake.requests, [])
        self.assertEqual({(r.backend, r.attempts, r.cost_usd, r.model) for r in replies},
                         {("offline", (), 0.0, "offline")})
        self.assertEqual([c.id for r in replies for c in r.tool_calls], ["offline-0", "offline-1"])
        self.assertEqual(json.loads(replies[2].text), {"label": "billing"})
        self.assertEqual(replies[0].usage, {"input_tokens": 0, "output_tokens": 0})
        # no HTTP opener either: from Python 3.12 building one loads the CA certificates, tens of ms a run
        self.assertNotIn("_opener", vars(worker))

    def test_rules_run_once_per_worker_with_the_same_replies(self):
        seen = []

        def counted(task_input):
            seen.append(task_input)
            return rules(task_input)

        history = [TASK + [{"role": "assistant", "content": ""}] * k for k in range(4)]
        worker = self.worker({}, rules=counted, task_input="t")
        cached = [worker.complete(messages, TOOLS) for messages in history]
        self.assertEqual(seen, ["t"])
        fresh = [self.worker({}, rules=rules, task_input="t").complete(messages, TOOLS) for messages in history]
        self.assertEqual([replace(r, latency_ms=0) for r in cached], [replace(r, latency_ms=0) for r in fresh])

    def test_no_key_and_no_rules_is_a_typed_error(self):
        with self.assertRaises(llm.LLMNoKey) as caught:
            self.worker({}).complete(TASK, [])
        self.assertEqual(str(caught.exception), "unavailable: no ANTHROPIC_API_KEY")

    def test_offline_primary_is_offline(self):
        worker = self.worker({"ANTHROPIC_API_KEY": ANTHROPIC_KEY}, primary="offline", fallback="claude-haiku-5-5",
                             rules=rules, task_input="t")
        self.assertEqual(worker.complete(TASK, TOOLS).backend, "offline")


class UseRulesTest(ServerTest):
    """The factory can say 'answer with the agent's rules for the rest of this run', and the trace
    shows why: the backend label is never plain 'offline'."""

    def test_rules_for_the_rest_of_the_run_with_a_reason(self):
        fake = self.server(Answer(body=anthropic_message("", [("toolu_1", "issues__label", {"label": "billing"})])))
        worker = self.worker(self.anthropic_env(fake), rules=rules, task_input="t")
        first = worker.complete(TASK, TOOLS)
        self.assertEqual(first.backend, "anthropic")
        worker.use_rules(llm.OVER_ENVELOPE)
        history = TASK + [{"role": "assistant", "content": ""}]
        later = [worker.complete(history + [{"role": "assistant", "content": ""}] * k, TOOLS) for k in range(2)]
        self.assertEqual([r.backend for r in later], ["offline-over-envelope"] * 2)
        self.assertEqual([c.name for c in later[0].tool_calls], ["drafts:write"])
        self.assertEqual(json.loads(later[1].text), {"label": "billing"})
        self.assertEqual(len(fake.requests), 1)
        self.assertEqual((worker.tier(), worker.planned_backend()), ("offline", "offline-over-envelope"))
        self.assertEqual(worker.estimate_next_cost(history, TOOLS), 0.0)
        self.assertFalse(worker.switch_model())

    def test_reason_is_a_short_tag_and_rules_are_needed(self):
        with self.assertRaises(ValueError):
            self.worker({}, rules=rules).use_rules("Over the envelope!")
        with self.assertRaises(ValueError):
            self.worker({"ANTHROPIC_API_KEY": ANTHROPIC_KEY}).use_rules(llm.OVER_ENVELOPE)


class SafetyTest(ServerTest):
    def test_redirect_is_refused_and_target_gets_nothing(self):
        target = self.server(Answer(body=anthropic_message("stolen")))
        for status in (301, 302, 307, 308):
            with self.subTest(status=status):
                origin = self.server(Answer(status, "", {"location": target.url + "/v1/messages"}))
                with self.assertRaises(llm.RefusedRedirect) as caught:
                    self.worker(self.anthropic_env(origin)).complete(TASK, [])
                self.assertEqual(len(origin.requests), 1)
                self.assertNotIn(ANTHROPIC_KEY, str(caught.exception))
        self.assertEqual(target.requests, [])

    def test_errors_carry_no_key_material(self):
        echo = f"Incorrect API key provided: {ANTHROPIC_KEY}. Another: sk-proj-abcdefghijkl"
        fake = self.server(Answer(401, {"error": {"type": "authentication_error", "message": echo}}))
        with self.assertRaises(llm.LLMStatus) as caught:
            self.worker(self.anthropic_env(fake)).complete(TASK, [])
        text = str(caught.exception)
        self.assertNotIn(ANTHROPIC_KEY, text)
        self.assertNotIn("sk-proj-abcdefghijkl", text)
        self.assertNotIn("\n", text)
        self.assertIn("HTTP 401 authentication_error", text)
        self.assertNotIn(ANTHROPIC_KEY, repr(llm.route_for("claude-x", self.anthropic_env(fake))))

    def test_html_error_body_is_parsed_defensively(self):
        fake = self.server(Answer(413, "<html>\n<b>Request Entity Too Large</b></html>"))
        with self.assertRaises(llm.LLMStatus) as caught:
            self.worker(self.anthropic_env(fake)).complete(TASK, [])
        self.assertEqual((caught.exception.status, caught.exception.retryable), (413, False))


class SageRouteTest(ServerTest):
    HEADERS = {"x-sageroute-tier": "strong", "x-sageroute-action": "switch_model",
               "x-sageroute-intervention": "0.796", "x-sageroute-source": "sage",
               "x-sageroute-model": "claude-sonnet-5-5", "request-id": "req_p"}

    def test_proxy_gets_its_token_not_the_vendor_key(self):
        proxy = self.server(Answer(body=anthropic_message("routed", model="sageroute"), headers=self.HEADERS))
        vendor = self.server()
        env = self.anthropic_env(vendor, SAGEROUTE_URL=proxy.url + "/", SAGEROUTE_TOKEN="sr-token-42")
        worker = self.worker(env, fallback="kimi-k2.6")
        self.assertEqual((worker.planned_backend(), worker.backend_for("kimi-k2.6")), ("sageroute", "sageroute"))
        reply = worker.complete(TASK, TOOLS)
        self.assertEqual((reply.backend, reply.text), ("sageroute", "routed"))
        self.assertAlmostEqual(reply.cost_usd, (100 * 2.0 + 20 * 10.0) / 1e6, msg="priced by the model its header names")
        self.assertTrue(reply.price.startswith("claude-sonnet-5-5: https://"), reply.price)
        self.assertEqual(reply.headers, {k.lower(): v for k, v in self.HEADERS.items()})
        sent = proxy.requests[0]
        self.assertEqual((sent["path"], sent["body"]["model"]), ("/v1/messages", "sageroute"))
        self.assertEqual(sent["headers"]["authorization"], "Bearer sr-token-42")
        self.assertNotIn("x-api-key", sent["headers"])
        self.assertNotIn(ANTHROPIC_KEY.encode(), sent["raw"])
        self.assertNotIn(ANTHROPIC_KEY, json.dumps(sent["headers"]))
        self.assertEqual(vendor.requests, [])

    def test_proxy_url_with_v1_and_priced_upstream_model(self):
        proxy = self.server(Answer(body=anthropic_message("ok", model="claude-haiku-4-5-20251001")))
        reply = self.worker({"SAGEROUTE_URL": proxy.url + "/v1"}).complete(TASK, [])
        self.assertEqual(proxy.requests[0]["path"], "/v1/messages")
        self.assertNotIn("authorization", proxy.requests[0]["headers"])
        self.assertAlmostEqual(reply.cost_usd, (100 * 1.0 + 20 * 5.0) / 1e6)

    def test_proxy_error_headers_are_recorded(self):
        proxy = self.server(Answer(400, anthropic_error("invalid_request_error", "no"), self.HEADERS))
        reply = self.worker({"SAGEROUTE_URL": proxy.url}, rules=rules).complete(TASK, [])
        self.assertEqual(reply.attempts[0]["headers"]["x-sageroute-tier"], "strong")


class ReplyCostTest(ServerTest):
    """A call is priced by the model that answered, from the usage it reported; otherwise unknown."""

    def test_a_price_declared_for_one_providers_id_never_prices_another_providers_reply(self):
        """A bare reply ('claude-opus-4-1') that came over the Anthropic route took the price a card declared for an
        OpenAI gateway's id of it ($1/$5 for $15/$75); over that gateway's route it is that id's price."""
        usage = {"input_tokens": 10**6, "output_tokens": 10**6}
        declared = llm.declared_prices({"openai/claude-opus-4-1": {"input": 1, "output": 5},
                                        "openrouter/kimi-k2.6": {"input": 0.1, "output": 0.2}})
        anthropic = llm.route_for("claude-opus-4-1", {"ANTHROPIC_API_KEY": "k"})
        gateway = llm.route_for("openai/claude-opus-4-1", {"OPENAI_API_KEY": "k"})
        moonshot = llm.route_for("moonshot/kimi-k2.6", {"MOONSHOT_API_KEY": "k"})
        openrouter = llm.route_for("openrouter/kimi-k2.6", {"OPENROUTER_API_KEY": "k"})
        costs = [llm.reply_cost(route, asked, answered, usage, {}, declared)[0] for route, asked, answered in (
            (anthropic, "claude-opus-4-1", "claude-opus-4-1-20250805"), (gateway, "openai/claude-opus-4-1", "claude-opus-4-1"),
            (moonshot, "moonshot/kimi-k2.6", "kimi-k2.6"), (openrouter, "openrouter/kimi-k2.6", "kimi-k2.6"))]
        self.assertEqual(costs[1], 6.0, "over the gateway's route, the gateway's declared price")
        self.assertAlmostEqual(costs[3], 0.3, msg="over openrouter's route, openrouter's declared price")
        self.assertEqual(costs[0], llm.reply_cost(anthropic, "claude-opus-4-1", "claude-opus-4-1-20250805", usage, {},
                                                  llm.NO_PRICES)[0], "the built-in price, not the gateway's")
        self.assertNotAlmostEqual(costs[2], 0.3, msg="moonshot's reply priced at openrouter's declared price")

    def anthropic_cost(self, data, primary="claude-sonnet-5-5"):
        fake = self.server(Answer(body=data))
        return self.worker(self.anthropic_env(fake), primary=primary).complete(TASK, [])

    def test_no_usage_is_unknown_cost(self):
        data = anthropic_message("ok")
        del data["usage"]
        reply = self.anthropic_cost(data)
        self.assertEqual((reply.cost_usd, reply.usage), (None, {}))
        half = anthropic_message("ok")
        del half["usage"]["output_tokens"]
        self.assertIsNone(self.anthropic_cost(half).cost_usd)

    def test_a_count_past_any_real_reply_is_unknown_usage(self):
        huge = 10 ** 400   # valid JSON; as a float it overflows
        for usage in ({"input_tokens": huge, "output_tokens": 1},
                      {"input_tokens": 1, "output_tokens": 1, "cache_read_input_tokens": huge},
                      {"input_tokens": 2 ** 53 - 1, "output_tokens": 1, "cache_creation_input_tokens": 1}):
            with self.subTest(usage=str(usage)[:40]):
                reply = self.anthropic_cost({**anthropic_message("ok"), "usage": usage})
                self.assertEqual((reply.cost_usd, reply.usage), (None, {}))

    def test_openai_no_usage_is_unknown_cost(self):
        data = openai_completion("ok")
        del data["usage"]
        fake = self.server(Answer(body=data))
        env = {"MOONSHOT_API_KEY": MOONSHOT_KEY, "MOONSHOT_BASE_URL": fake.url}
        reply = self.worker(env, primary="kimi-k2.6").complete(TASK, [])
        self.assertEqual((reply.cost_usd, reply.usage), (None, {}))

    def test_local_model_without_usage_costs_nothing(self):
        data = openai_completion("hi", model="llama3.2")
        del data["usage"]
        fake = self.server(Answer(body=data))
        reply = self.worker({"OPENAI_BASE_URL": fake.url}, primary="ollama/llama3.2").complete(TASK, [])
        self.assertEqual(reply.cost_usd, 0.0)

    def test_priced_by_the_model_that_answered(self):
        unpriced = self.anthropic_cost(anthropic_message("ok", model="claude-mystery-9"))
        self.assertEqual((unpriced.model, unpriced.cost_usd), ("claude-mystery-9", None))
        other = self.anthropic_cost(anthropic_message("ok", model="claude-sonnet-4-5-20250929"), "claude-haiku-5-5")
        self.assertAlmostEqual(other.cost_usd, (100 * 3.0 + 20 * 15.0) / 1e6)

    def test_a_declared_price_prices_the_same_model_with_or_without_its_provider_prefix(self):
        """A card pricing "openai/stockwise-9" had every reply of an OpenAI-compatible server, which names the model
        "stockwise-9", priced as unknown (and a card pricing "stockwise-9" had "openai/stockwise-9" unknown); another
        provider's model of that name, or a dated id priced exactly, stays another model."""
        usage_cost = (100 * 1.0 + 20 * 2.0) / 1e6
        table = (("openai/stockwise-9", "openai/stockwise-9", "stockwise-9", usage_cost),
                 ("stockwise-9", "stockwise-9", "openai/stockwise-9", usage_cost),
                 ("openai/stockwise-9", "openai/stockwise-9", "stockwise-9-20260101", usage_cost),
                 ("openai/stockwise-9", "openai/stockwise-9", "evil/stockwise-9", None),
                 ("stockwise-9-20260101", "stockwise-9-20260101", "stockwise-9-20990101", None))
        for primary, declared, answered, cost in table:
            with self.subTest(declared=declared, answered=answered):
                fake = self.server(Answer(body=openai_completion("ok", model=answered)))
                worker = self.worker({"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": fake.url}, primary=primary,
                                     prices={declared: {"input": 1, "output": 2}})
                if declared == primary:
                    self.assertAlmostEqual(worker.estimate_next_cost(TASK, []),
                                           (llm.estimate_input_tokens(TASK, []) * 1.0 + 1024 * 2.0) / 1e6)
                reply = worker.complete(TASK, [])
                self.assertEqual((reply.model, reply.price == f"{answered}: the card's prices"), (answered, cost is not None))
                if cost is None:
                    self.assertEqual((reply.cost_usd, reply.price), (None, f"unknown: no price for {answered}"))
                else:
                    self.assertAlmostEqual(reply.cost_usd, cost)
        self.assertEqual(llm.price("stockwise-9", llm.declared_prices({"openai/stockwise-9": {"input": 1, "output": 2}})),
                         (1, 2))
        both = llm.declared_prices({"openai/stockwise-9": {"input": 1, "output": 2}, "azure/stockwise-9": {"input": 3, "output": 4}})
        self.assertEqual(llm.price("stockwise-9", both), (1, 2), "a bare id goes to openai: azure's is another provider's")
        self.assertEqual(llm.price("azure/stockwise-9", both), (3, 4))

    def test_dated_snapshot_of_the_asked_alias_is_priced_as_the_alias(self):
        reply = self.anthropic_cost(anthropic_message("ok", model="claude-sonnet-5-5-20260928"))
        self.assertAlmostEqual(reply.cost_usd, (100 * 2.0 + 20 * 10.0) / 1e6)
        self.assertEqual(llm.price("claude-haiku-4-5-20991231"), (1.0, 5.0))


class RoutingTest(unittest.TestCase):
    def test_backend_rule(self):
        table = {"claude-sonnet-5-5": "anthropic", "kimi-k2.6": "moonshot", "moonshot-v1-8k": "moonshot",
                 "anthropic/claude-haiku-5-5": "anthropic", "openai/gpt-5": "openai", "moonshot/kimi-k3": "moonshot",
                 "ollama/llama3.2": "ollama", "openrouter/anthropic/claude-sonnet-4.5": "openrouter",
                 "offline": "offline", "qwen2.5-coder": "openai"}
        for model_id, backend in table.items():
            with self.subTest(model_id=model_id):
                self.assertEqual(llm.backend_for(model_id, {}), backend)
        self.assertEqual(llm.backend_for("kimi-k2.6", {"SAGEROUTE_URL": "http://p"}), "sageroute")

    def test_routes(self):
        env = {"ANTHROPIC_API_KEY": "a-key", "MOONSHOT_API_KEY": "m-key", "OPENAI_API_KEY": "o-key"}
        self.assertEqual(llm.route_for("claude-haiku-5-5", env).url, "https://api.anthropic.com/v1/messages")
        self.assertEqual(llm.route_for("kimi-k2.6", env).url, "https://api.moonshot.ai/v1/chat/completions")
        self.assertEqual(llm.route_for("ollama/qwen", env).url, "http://localhost:11434/v1/chat/completions")
        self.assertEqual(llm.route_for("ollama/qwen", env).headers["authorization"], "Bearer ollama")
        self.assertEqual(llm.route_for("openai/gpt-5", env).model, "gpt-5")
        with self.assertRaises(llm.LLMNoKey):
            llm.route_for("openrouter/x/y", env)
        with self.assertRaises(llm.LLMError):
            llm.route_for("claude-x", {**env, "ANTHROPIC_BASE_URL": "file:///etc"})

    def test_defaults_are_current_ids(self):
        self.assertEqual((llm.DEFAULT_PRIMARY, llm.DEFAULT_FALLBACK), ("claude-sonnet-5-5", "claude-haiku-5-5"))
        self.assertIsNotNone(llm.price(llm.DEFAULT_PRIMARY))
        self.assertIsNotNone(llm.price(llm.DEFAULT_FALLBACK))


class PriceTest(unittest.TestCase):
    def test_alias_and_snapshot_prices(self):
        self.assertEqual(llm.price("claude-sonnet-4-5"), (3.0, 15.0))
        self.assertEqual(llm.price("claude-sonnet-4-5-20250929"), (3.0, 15.0))
        self.assertEqual(llm.price("claude-haiku-4-5-20251001"), (1.0, 5.0))
        self.assertEqual(llm.price("anthropic/claude-opus-4-5-20251101"), (5.0, 25.0))
        self.assertEqual(llm.price("kimi-k2.5"), (0.6, 3.0))
        self.assertEqual(llm.price("ollama/llama3.2"), (0.0, 0.0))

    def test_unknown_model_has_no_price(self):
        for model in ("gpt-5", "claude-sonnet-9", "sageroute", "openrouter/anthropic/claude-sonnet-4.5"):
            with self.subTest(model=model):
                self.assertIsNone(llm.price(model))
                self.assertIsNone(llm.cost_usd(model, {"input_tokens": 1, "output_tokens": 1}))
                self.assertIsNone(llm.estimate_cost(model, 1, 1))

    def test_the_same_model_in_a_dated_or_provider_prefixed_form(self):
        table = (("claude-sonnet-5-5", "claude-sonnet-5-5", True), ("claude-sonnet-5-5", "claude-sonnet-5-5-20260101", True),
                 ("claude-sonnet-5-5", "anthropic/claude-sonnet-5-5", True), ("gpt-4o", "gpt-4o-2024-08-06", True),
                 ("anthropic/claude-sonnet-5-5", "claude-sonnet-5-5-20260101", True),
                 ("claude-sonnet-5-5", "gpt-4o-mini", False), ("claude-sonnet-5", "claude-sonnet-5-5", False),
                 ("anthropic/x-1", "evil/x-1", False), ("claude-sonnet-5-5", "", False), ("", "", False))
        for named, answered, same in table:
            with self.subTest(named=named, answered=answered):
                self.assertIs(llm.same_model(named, answered), same)

    def test_cost_and_estimate(self):
        usage = {"input_tokens": 1_000_000, "output_tokens": 1_000_000}
        self.assertAlmostEqual(llm.cost_usd("claude-sonnet-5-5", usage), 12.0)
        self.assertAlmostEqual(llm.cost_usd("claude-haiku-5-5", {"input_tokens": 200_000, "output_tokens": 0}), 0.1)
        self.assertAlmostEqual(llm.estimate_cost("claude-haiku-4-5", 4000, 1024), (4000 * 1 + 1024 * 5) / 1e6)
        self.assertEqual(llm.estimate_input_tokens([{"role": "user", "content": "x" * 400}], []),
                         -(-len(json.dumps([[{"role": "user", "content": "x" * 400}], []])) // 4))

    def test_worker_estimate(self):
        keyless = llm.Worker({"primary": "claude-sonnet-5-5"}, {}, rules=rules)
        self.assertEqual(keyless.estimate_next_cost(TASK, TOOLS), 0.0)
        keyed = llm.Worker({"primary": "claude-sonnet-5-5"}, {"ANTHROPIC_API_KEY": "k"}, max_tokens=100)
        tokens = llm.estimate_input_tokens(TASK, TOOLS)
        self.assertAlmostEqual(keyed.estimate_next_cost(TASK, TOOLS), (tokens * 2.0 + 100 * 10.0) / 1e6)


if __name__ == "__main__":
    unittest.main()
