"""OpenTelemetry export: a run arrives at a receiver on 127.0.0.1 as one trace of nested spans, decoded here
by a protobuf reader of the test's own (and as OTLP/JSON); a failed export is noted and the export station
sends it again; with no endpoint nothing is sent."""
import json
import struct
import time
import unittest

from tests.fake_llm import Answer, FakeServer, anthropic_message
from tests.support import CertifiedTest

TICKET = "How do I order a new card for my account?"
WIRE = {0: "varint", 1: "fixed64", 2: "bytes", 5: "fixed32"}


def fields(data: bytes) -> list[tuple[int, object]]:
    """(field number, value) of one protobuf message: varints as int, fixed64 as 8 bytes, length-delimited as bytes."""
    out, at = [], 0
    while at < len(data):
        key, at = varint(data, at)
        number, wire = key >> 3, WIRE[key & 7]
        if wire == "varint":
            value, at = varint(data, at)
        elif wire == "fixed64":
            value, at = data[at:at + 8], at + 8
        elif wire == "fixed32":
            value, at = data[at:at + 4], at + 4
        else:
            size, at = varint(data, at)
            value, at = data[at:at + size], at + size
            assert at <= len(data), "a length-delimited field runs past its message"
        out.append((number, value))
    return out


def varint(data: bytes, at: int) -> tuple[int, int]:
    """A base-128 varint at `at`: (value, the offset after it)."""
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def any_value(data: bytes):
    """common.proto AnyValue -> a Python value."""
    (number, value), = fields(data)
    if number == 1:
        return value.decode()
    if number == 2:
        return bool(value)
    if number == 3:
        return value - (1 << 64) if value >= 1 << 63 else value
    if number == 4:
        return struct.unpack("<d", value)[0]
    if number == 5:
        return [any_value(v) for _, v in fields(value)]
    raise AssertionError(f"AnyValue field {number} not expected")


def attributes(pairs: list[bytes]) -> dict:
    """A repeated KeyValue as a dict."""
    out = {}
    for pair in pairs:
        got = dict(fields(pair))
        out[got[1].decode()] = any_value(got[2])
    return out


def decode_request(raw: bytes) -> dict:
    """ExportTraceServiceRequest -> {"resource": {...}, "scope": (name, version), "spans": [span dict]}."""
    (number, resource_spans), = fields(raw)
    assert number == 1
    parts = fields(resource_spans)
    resource = attributes([v for n, v in fields(dict(parts)[1]) if n == 1])
    scope_spans = [v for n, v in parts if n == 2]
    assert len(scope_spans) == 1
    inner = fields(scope_spans[0])
    scope = dict(fields(dict(inner)[1]))
    spans = []
    for span in (v for n, v in inner if n == 2):
        got = fields(span)
        one = dict(got)
        status = dict(fields(one[15])) if 15 in one else {}
        spans.append({"trace_id": one[1].hex(), "span_id": one[2].hex(), "parent": one.get(4, b"").hex(),
                      "name": one[5].decode(), "kind": one[6],
                      "start": int.from_bytes(one[7], "little"), "end": int.from_bytes(one[8], "little"),
                      "attributes": attributes([v for n, v in got if n == 9]),
                      "status": (status.get(3, 0), status.get(2, b"").decode())})
    return {"resource": resource, "scope": (scope[1].decode(), scope[2].decode()), "spans": spans}


def json_value(value: dict):
    """An OTLP/JSON AnyValue -> a Python value (intValue is a string, as proto3's JSON mapping writes int64)."""
    (kind, inner), = value.items()
    if kind == "intValue":
        assert isinstance(inner, str), inner
        return int(inner)
    if kind == "arrayValue":
        return [json_value(v) for v in inner["values"]]
    return inner


def decode_json_request(raw: bytes) -> dict:
    """An OTLP/JSON ExportTraceServiceRequest, in decode_request's shape."""
    (resource_spans,) = json.loads(raw)["resourceSpans"]
    (scope_spans,) = resource_spans["scopeSpans"]
    spans = [{"trace_id": s["traceId"], "span_id": s["spanId"], "parent": s.get("parentSpanId", ""),
              "name": s["name"], "kind": s["kind"], "start": int(s["startTimeUnixNano"]), "end": int(s["endTimeUnixNano"]),
              "attributes": {a["key"]: json_value(a["value"]) for a in s["attributes"]},
              "status": (s.get("status", {}).get("code", 0), s.get("status", {}).get("message", ""))}
             for s in scope_spans["spans"]]
    return {"resource": {a["key"]: json_value(a["value"]) for a in resource_spans["resource"]["attributes"]},
            "scope": (scope_spans["scope"]["name"], scope_spans["scope"]["version"]), "spans": spans}


class ExportTest(CertifiedTest):

    def receiver(self, *answers: Answer) -> FakeServer:
        """An OTLP/HTTP receiver on 127.0.0.1 answering each POST in turn (200 when none is given)."""
        server = FakeServer(*(answers or [Answer(200, {})] * 4)).start()
        self.addCleanup(server.close)
        return server

    def run_exported(self, protocol: str = "http/protobuf", **env: str) -> tuple[FakeServer, dict, float, float]:
        """One run of the triager with the endpoint set: (receiver, decoded request, ns before, ns after)."""
        server = self.receiver()
        self.env.update(OTEL_EXPORTER_OTLP_ENDPOINT=server.url, OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
                        OTEL_SERVICE_NAME="triage-line", OTEL_RESOURCE_ATTRIBUTES="openinference.project.name=factory,team=ops",
                        OTEL_EXPORTER_OTLP_HEADERS="x-mlflow-experiment-id=7,authorization=Bearer%20otel-secret-123", **env)
        before = time.time_ns()
        self.runs_ok("triager", TICKET)
        after = time.time_ns()
        self.assertEqual(len(server.requests), 1)
        request = server.requests[0]
        decode = decode_request if protocol == "http/protobuf" else decode_json_request
        return server, decode(request["raw"]), before, after

    def assert_run_trace(self, sent: dict, before: int, after: int) -> None:
        """The decoded request is one run: a root invoke_agent span, every other span its child, real times."""
        spans = sent["spans"]
        self.assertEqual(sent["resource"], {"service.name": "triage-line", "openinference.project.name": "factory", "team": "ops"})
        self.assertEqual(sent["scope"][0], "agent-factory")
        roots = [s for s in spans if not s["parent"]]
        self.assertEqual([r["name"] for r in roots], ["invoke_agent triager"])
        root = roots[0]
        self.assertEqual({s["parent"] for s in spans if s is not root}, {root["span_id"]})
        self.assertEqual({s["trace_id"] for s in spans}, {root["trace_id"]})
        self.assertEqual(len({s["span_id"] for s in spans}), len(spans))
        self.assertRegex(root["trace_id"], "^[0-9a-f]{32}$")
        for span in spans:
            with self.subTest(span=span["name"]):
                self.assertLessEqual(before - 1000, span["start"])   # ISO times keep microseconds
                self.assertLessEqual(span["start"], span["end"])
                self.assertLessEqual(span["end"], after)
                self.assertGreaterEqual(span["start"], root["start"])
                self.assertLessEqual(span["end"], root["end"])
        row = self.index_rows()[-1]
        self.assertEqual({k: root["attributes"].get(k) for k in ("gen_ai.operation.name", "gen_ai.agent.name",
                                                                  "gen_ai.conversation.id", "factory.verdict", "factory.tier",
                                                                  "factory.digest", "factory.gate.result")},
                         {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "triager",
                          "gen_ai.conversation.id": row["run_id"], "factory.verdict": row["verdict"], "factory.tier": "C1",
                          "factory.digest": self.cert()["digest"], "factory.gate.result": row["gate"]})
        chats = [s for s in spans if s["name"].startswith("chat ")]
        self.assertEqual(len(chats), row["steps"])
        for chat in chats:
            self.assertEqual(chat["kind"], 3)   # CLIENT
            self.assertEqual(chat["attributes"]["gen_ai.operation.name"], "chat")
            self.assertIn("gen_ai.provider.name", chat["attributes"])
        tools = [s for s in spans if s["name"].startswith("execute_tool ")]
        trace = self.traces()[-1]
        recorded = [(e["tool"], e["ruling"]) for e in trace if e.get("event") == "tool"]
        self.assertEqual([(s["attributes"]["gen_ai.tool.name"], s["attributes"]["factory.ruling"]) for s in tools], recorded)
        self.assertTrue(recorded)
        self.assertEqual([s["attributes"]["gen_ai.operation.name"] for s in tools], ["execute_tool"] * len(tools))
        gate, = [s for s in spans if s["name"] == "gate"]
        self.assertEqual(gate["attributes"]["factory.gate.result"], row["gate"])
        self.assertTrue(all("at" in event for event in trace), "every trace event records its own time")

    def test_a_run_arrives_as_one_trace_of_nested_spans_in_protobuf(self):
        server, sent, before, after = self.run_exported()
        request = server.requests[0]
        self.assertEqual(request["path"], "/v1/traces")
        self.assertEqual(request["headers"]["content-type"], "application/x-protobuf")
        self.assertEqual(request["headers"]["x-mlflow-experiment-id"], "7")
        self.assertEqual(request["headers"]["authorization"], "Bearer otel-secret-123")
        self.assert_run_trace(sent, before, after)
        self.assertNotIn(TICKET.encode(), request["raw"], "no ticket text unless the user opts in")
        trace = self.traces()[-1]
        self.assertEqual([(e["event"], e["ok"], e["to"]) for e in trace[-1:]], [("export", True, server.url + "/v1/traces")])
        self.assertNotIn("otel-secret-123", json.dumps(trace), "export headers are never recorded")

    def test_a_run_arrives_as_otlp_json_with_hex_ids(self):
        self.env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "set below"
        server = self.receiver()
        self.env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = server.url + "/otlp/traces"   # used as given
        self.env.update(OTEL_EXPORTER_OTLP_PROTOCOL="http/json", OTEL_SERVICE_NAME="triage-line",
                        OTEL_RESOURCE_ATTRIBUTES="openinference.project.name=factory,team=ops")
        before = time.time_ns()
        self.runs_ok("triager", TICKET)
        sent = decode_json_request(server.requests[0]["raw"])
        self.assertEqual(server.requests[0]["path"], "/otlp/traces")
        self.assertEqual(server.requests[0]["headers"]["content-type"], "application/json")
        self.assert_run_trace(sent, before, time.time_ns())

    def test_content_is_exported_only_when_the_user_opts_in(self):
        _, sent, _, _ = self.run_exported(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true")
        root = next(s for s in sent["spans"] if not s["parent"])
        messages = json.loads(root["attributes"]["gen_ai.input.messages"])
        self.assertEqual(messages, [{"role": "user", "parts": [{"type": "text", "content": TICKET}]}])
        self.assertIn("gen_ai.output.messages", root["attributes"])

    def test_a_failed_export_is_noted_and_the_export_station_sends_it_again(self):
        down = self.receiver(Answer(503, {"error": "busy"}))
        self.env.update(OTEL_EXPORTER_OTLP_ENDPOINT=down.url)
        self.runs_ok("triager", TICKET)
        row = self.index_rows()[-1]
        self.assertEqual(row["verdict"], "unscored")   # as any run with no Sage key: the export changed nothing
        last = self.traces()[-1][-1]
        self.assertEqual((last["event"], last["ok"]), ("export", False))
        self.assertIn("503", last["error"])
        up = self.receiver()
        self.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = up.url
        code, out, err = self.factory("export")
        self.assertEqual((code, out, err), (0, f"{row['run_id']}\tsent\n", ""))
        self.assertEqual(decode_request(up.requests[0]["raw"])["spans"][0]["attributes"]["gen_ai.conversation.id"], row["run_id"])
        self.assertEqual(self.factory("export"), (0, "", ""), "a run sent is not sent again")
        code, out, _ = self.factory("export", "--all")
        self.assertEqual((code, out, len(up.requests)), (0, f"{row['run_id']}\tsent\n", 2))
        spans = [decode_request(r["raw"])["spans"] for r in up.requests]
        self.assertEqual(spans[0], spans[1], "a run sent again is the same trace, ids and times")
        self.runs_ok("triager", TICKET)   # sent as it ends: the third request
        (self.root / "traces" / "triager" / f"{row['run_id']}.jsonl").unlink()
        code, out, err = self.factory("export", "--all")
        gone, sent = out.splitlines()
        self.assertEqual((code, len(up.requests)), (1, 4), "the run whose trace is gone is named; the other is sent")
        self.assertRegex(gone, rf"^{row['run_id']}\tFAILED \(.*{row['run_id']}\.jsonl")
        self.assertEqual(sent, f"{self.index_rows()[-1]['run_id']}\tsent")

    def test_an_endpoint_that_does_not_answer_costs_the_run_its_timeout_alone(self):
        silent = self.receiver(Answer(200, {}, delay=30))   # answers long after the export gave up
        self.env.update(OTEL_EXPORTER_OTLP_ENDPOINT=silent.url, OTEL_EXPORTER_OTLP_TIMEOUT="250")
        self.runs_ok("triager", TICKET)
        last = self.traces()[-1][-1]
        self.assertEqual((last["event"], last["ok"], last["error"]), ("export", False, "timeout after 0.25s"))
        self.assertEqual(self.index_rows()[-1]["verdict"], "unscored", "the run is what it was without the endpoint")

    def test_an_export_that_cannot_be_sent_fails_the_station_naming_why(self):
        self.runs_ok("triager", TICKET)   # no endpoint: nothing sent, nothing noted
        self.assertNotIn("export", [e.get("event") for e in self.traces()[-1]])
        self.refused("no OTLP endpoint: set OTEL_EXPORTER_OTLP_ENDPOINT", "export")
        self.env.update(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_TIMEOUT="soon")
        code, out, _ = self.factory("export")
        self.assertEqual(code, 1)
        self.assertIn("FAILED (OTEL_EXPORTER_OTLP_TIMEOUT is not a number of milliseconds)", out)
        self.env.update(OTEL_EXPORTER_OTLP_TIMEOUT="", OTEL_EXPORTER_OTLP_PROTOCOL="grpc")   # checked at start instead
        self.refused("OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf or http/json, not 'grpc'", "export")

    def test_model_calls_carry_the_traceparent_of_their_chat_span(self):
        model = FakeServer(Answer(body=anthropic_message(json.dumps({"label": "cards", "escalate": False,
                                                                     "draft": "Order it in the app."})))).start()
        self.addCleanup(model.close)
        self.env.update(ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="sk-test-traceparent")
        server, sent, _, _ = self.run_exported()
        chat, = [s for s in sent["spans"] if s["name"].startswith("chat ")]
        self.assertEqual(model.requests[0]["headers"]["traceparent"], f"00-{chat['trace_id']}-{chat['span_id']}-01")
        self.assertEqual((chat["attributes"]["gen_ai.request.model"], chat["attributes"]["gen_ai.response.model"],
                          chat["attributes"]["gen_ai.usage.input_tokens"], chat["attributes"]["gen_ai.usage.output_tokens"],
                          chat["attributes"]["gen_ai.provider.name"]), ("claude-sonnet-5-5", "claude-sonnet-5-5", 100, 20, "anthropic"))
        self.assertNotIn(b"sk-test-traceparent", server.requests[0]["raw"])


if __name__ == "__main__":
    unittest.main()
