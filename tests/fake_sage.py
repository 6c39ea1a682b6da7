"""A scripted Sage server for tests: a real ThreadingHTTPServer on 127.0.0.1 (port 0) in a
daemon thread that speaks Levanto `/ready`, `/decide`, `/decide/batch` and System One
`/v1/systemone` (the documented request and reply shapes) and records every request.

    with FakeSage(yes_p=0.93) as fake:
        env = {"SAGE_ENDPOINT": fake.url, "SAGE_API_KEY": "test-key"}
        ...
        fake.requests[0].headers["user-agent"]

Scripting, from coarse to fine:
- `yes_p`, `expectation`, `shape` ("current" = v1.1, "old" = v0.6 with `confidence`):
  the default answer to every question;
- `answer=fn(question: dict, content) -> dict | Fail | None`: the inner `result` for Levanto
  (or the answer object for System One); Fail("why") fails that question alone (batch
  `ok: false`, single /decide 400); None falls back to the default;
- `status`/`body`/`headers`/`delay`: the same reply to every request;
- `replies=[Reply(429, {"detail": "x"}, {"Retry-After": "2"}), Reply()]`: one reply per request
  in order (a Reply with body None answers normally), then back to the rules above.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping

from tests.fake_llm import drip


@dataclass(frozen=True)
class Fail:
    """Script this as an answer to make one question fail on its own with `error`."""
    error: str


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP reply; body None means "answer normally" with this status' delay. `drip` (s)
    > 0 sends the body one byte per drip with no Content-Length (the body ends when the connection
    closes)."""
    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drip: float = 0.0


@dataclass(frozen=True)
class Seen:
    """One recorded request: headers have lower-case names; body is parsed JSON when it parses."""
    method: str
    path: str
    headers: dict
    body: Any


def verdict(p: float) -> str | None:
    """The fake's Levanto answer for P(yes): unsure between 0.45 and 0.55."""
    return "yes" if p >= 0.55 else "no" if p <= 0.45 else None


class FakeSage:
    """Scripted Levanto / System One server; use as a context manager, read `.url`, `.requests`."""

    def __init__(self, yes_p: float = 0.9, *, answer: Callable | None = None,
                 shape: str = "current", expectation: float = 3.0, status: int | None = None,
                 body: Any = None, headers: Mapping[str, str] | None = None, delay: float = 0.0,
                 replies: list[Reply] = ()):
        self.yes_p, self.answer, self.shape, self.expectation = yes_p, answer, shape, expectation
        self.status, self.body, self.headers, self.delay = status, body, dict(headers or {}), delay
        self.replies = list(replies)
        self.requests: list[Seen] = []
        self._lock, self._closing = threading.Lock(), threading.Event()
        self._server = None

    # -------------------------------------------------- lifecycle

    def __enter__(self) -> "FakeSage":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "FakeSage":
        """Bind 127.0.0.1:0 and serve in a daemon thread."""
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True).start()
        return self

    def close(self) -> None:
        """Stop serving; wakes any delayed reply."""
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:40123 (no trailing slash)."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def questions(self) -> list[dict]:
        """Every question sent to /decide or /decide/batch, flattened in order."""
        found = []
        for seen in self.requests:
            body = seen.body if isinstance(seen.body, dict) else {}
            if "question" in body:
                found.append(body["question"])
            for group in body.get("requests", []):
                found.extend(group.get("questions", []))
        return found

    # -------------------------------------------------- dispatch

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        """Record the request, then send the scripted or computed reply."""
        seen = self._record(handler)
        reply = self._next_reply()
        delay = reply.delay if reply else self.delay
        if delay and self._closing.wait(delay):
            return
        if reply and reply.body is None and reply.status == 200:
            reply = None
        status, payload, headers = self._choose(seen, reply)
        _send(handler, status, payload, headers, reply.drip if reply else 0.0, self._closing)

    def _record(self, handler) -> Seen:
        """Read and keep one request."""
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {name.lower(): value for name, value in handler.headers.items()}
        seen = Seen(handler.command, handler.path, headers, body)
        with self._lock:
            self.requests.append(seen)
        return seen

    def _next_reply(self) -> Reply | None:
        """The next scripted per-request reply, if any is left."""
        with self._lock:
            return self.replies.pop(0) if self.replies else None

    def _choose(self, seen: Seen, reply: Reply | None) -> tuple:
        """(status, payload, headers) from a Reply, the global override, or the routes."""
        if reply is not None:
            body = reply.body if reply.body is not None else {"detail": f"scripted {reply.status}"}
            return reply.status, body, dict(reply.headers)
        if self.status is not None or self.body is not None:
            status = self.status or 200
            body = self.body if self.body is not None else {"detail": f"scripted {status}"}
            return status, body, self.headers
        return (*self._route(seen), self.headers)

    def _route(self, seen: Seen) -> tuple:
        """(status, payload) for the documented routes; 404 otherwise."""
        if seen.method == "GET" and seen.path == "/ready":
            return 200, b""
        if seen.method == "POST" and seen.path == "/decide":
            return self._decide(seen.body)
        if seen.method == "POST" and seen.path == "/decide/batch":
            return self._batch(seen.body)
        if seen.method == "POST" and seen.path.endswith("/systemone"):
            return self._systemone(seen.body)
        return 404, {"detail": "Not Found"}

    # -------------------------------------------------- Levanto

    def _decide(self, body: dict) -> tuple:
        """Single /decide: the envelope, or 400 when the question is scripted to fail."""
        question, content = body["question"], body["content"]
        result = self._levanto_result(question, content)
        if isinstance(result, Fail):
            return 400, {"detail": result.error}
        return 200, self._envelope(question, result)

    def _batch(self, body: dict) -> tuple:
        """/decide/batch: answers[j] per questions[j], each `ok` with a full envelope."""
        results = []
        for group in body["requests"]:
            answers = [self._batch_answer(q, group["content"]) for q in group["questions"]]
            results.append({"answers": answers})
        count = sum(len(group["questions"]) for group in body["requests"])
        meta = {"model": self._model(), "request_count": len(results), "question_count": count,
                "latency_ms": 1.0}
        return 200, {"results": results, "meta": meta}

    def _batch_answer(self, question: dict, content) -> dict:
        """One batch answer object."""
        result = self._levanto_result(question, content)
        if isinstance(result, Fail):
            return {"ok": False, "result": None, "error": result.error}
        return {"ok": True, "result": self._envelope(question, result), "error": None}

    def _levanto_result(self, question: dict, content):
        """The scripted result, else the default for the question's kind."""
        scripted = self.answer(question, content) if self.answer else None
        return scripted if scripted is not None else self._default(question, content)

    def _envelope(self, question: dict, result: dict) -> dict:
        """{id, kind, result, meta}."""
        return {"id": question["id"], "kind": question["kind"], "result": result,
                "meta": {"model": self._model(), "latency_ms": 1.0}}

    def _model(self) -> str:
        """meta.model for the shape being spoken."""
        return "levanto-sage-v0.6" if self.shape == "old" else "levanto-sage-v1.1"

    def _default(self, question: dict, content) -> dict:
        """Default result per kind from yes_p / expectation, in the configured shape."""
        p, old = self.yes_p, self.shape == "old"
        kind = question["kind"]
        if kind == "yesno":
            if old:
                return {"probability": p, "confidence": round(2 * abs(p - 0.5), 4),
                        "answer": "yes" if p >= 0.5 else "no"}
            return {"answer": verdict(p), "probability": p}
        if kind == "choice":
            return _default_choice([o["option"] for o in question["options"]], p, old)
        if kind == "scale":
            return {"expectation": self.expectation, "confidence": 0.8}
        if kind == "tags":
            return {"tags": [_default_tag(t["id"], p, old) for t in question["tags"]]}
        if not (isinstance(content, dict) and content.get("kind") == "list"):
            return Fail("sort requires list content")
        ids = [item["id"] for item in content["value"]]
        return {"sorted": ids[::-1], "confidence": None if old else 0.9}

    # -------------------------------------------------- System One

    def _systemone(self, body: dict) -> tuple:
        """POST /v1/systemone: {model, answers: {name: answer}, usage}."""
        answers = {}
        for name, question in body["questions"].items():
            scripted = self.answer(question, body.get("state")) if self.answer else None
            if isinstance(scripted, Fail):
                return 400, {"detail": {"error_type": "invalid_request", "message": scripted.error}}
            answers[name] = scripted if scripted is not None else self._systemone_default(question)
        return 200, {"model": body.get("model") or "fake-systemone", "answers": answers,
                     "usage": {"input_tokens": 10, "output_tokens": 0}}

    def _systemone_default(self, question: dict) -> dict:
        """Default noul / choice / score answer from yes_p and expectation."""
        p = self.yes_p
        if question["type"] == "noul":
            return {"type": "noul", "noul": p}
        if question["type"] == "choice":
            names = list(question["criteria"])
            spread = _spread(names, p)
            return {"type": "choice", "choice": names[0], "probabilities": spread, "confidence": p}
        levels = [str(n) for n in range(len(question["criteria"]))]
        peak = {level: (1.0 if int(level) == round(self.expectation) else 0.0) for level in levels}
        return {"type": "score", "score": self.expectation, "probabilities": peak,
                "legend": dict(zip(levels, question["criteria"])), "confidence": 0.8}


def _spread(names: list, p: float) -> dict:
    """First name gets p, the rest share 1 - p."""
    rest = (1.0 - p) / max(1, len(names) - 1)
    return {name: (p if n == 0 else rest) for n, name in enumerate(names)}


def _default_choice(names: list, p: float, old: bool) -> dict:
    """Choice result choosing the first option with p (v0.6: confidence, no probability)."""
    spread = [{"option": name, "probability": q} for name, q in _spread(names, p).items()]
    if old:
        return {"chosen": names[0], "confidence": p, "probabilities": spread}
    return {"chosen": names[0], "probability": p, "probabilities": spread}


def _default_tag(tag_id: str, p: float, old: bool) -> dict:
    """One tag entry; the v0.6 shape has no `applies` without a threshold."""
    entry = {"id": tag_id, "probability": p}
    if not old:
        entry["applies"] = None if verdict(p) is None else verdict(p) == "yes"
    return entry


def _send(handler: BaseHTTPRequestHandler, status: int, payload, headers: Mapping, every: float = 0.0,
          closing: threading.Event | None = None) -> None:
    """Write one response: dicts/lists as JSON, str/bytes as they are; `every` > 0 drips the body one
    byte per `every` seconds without a Content-Length, until it is sent or `closing` is set."""
    if isinstance(payload, (dict, list)):
        raw, kind = json.dumps(payload).encode(), "application/json"
    else:
        raw = payload.encode() if isinstance(payload, str) else payload
        kind = "text/plain"
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    if not every:
        handler.send_header("Content-Length", str(len(raw)))
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    if every:
        drip(handler.wfile, raw, every, closing or threading.Event())
    else:
        handler.wfile.write(raw)


class _Server(ThreadingHTTPServer):
    """Daemon-threaded server that keeps quiet about clients that hung up (timeouts)."""
    daemon_threads = True
    fake: FakeSage

    def handle_error(self, request, client_address) -> None:
        pass


class _Handler(BaseHTTPRequestHandler):
    """Hands every request to the FakeSage that owns the server."""

    def do_GET(self) -> None:
        self.server.fake.handle(self)

    def do_POST(self) -> None:
        self.server.fake.handle(self)

    def log_message(self, *args) -> None:
        pass
