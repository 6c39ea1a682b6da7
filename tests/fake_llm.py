"""Scripted model servers for tests: real HTTP on 127.0.0.1, canned answers, every request recorded."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Answer:
    """One scripted response: status, body (dict -> JSON, str/bytes sent as is), headers, delay (s).
    `drip` (s) > 0 sends the body one byte per drip with no content-length (HTTP/1.0: the body ends
    when the connection closes); `unsized` sends it whole with no content-length."""
    status: int = 200
    body: object = None
    headers: dict = field(default_factory=dict)
    delay: float = 0.0
    drip: float = 0.0
    unsized: bool = False


class FakeServer:
    """A ThreadingHTTPServer that answers POSTs from a script and records path, headers and JSON body."""

    def __init__(self, *answers: Answer):
        self.answers = list(answers)
        self.requests: list[dict] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:PORT."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeServer":
        """Serve in a daemon thread; returns self."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and wake any delayed handler."""
        self.stopping.set()
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def take(self, record: dict) -> Answer:
        """Record one request and return the next scripted answer (599 once the script runs out)."""
        with self._lock:
            self.requests.append(record)
            return self.answers.pop(0) if self.answers else Answer(599, {"error": {"message": "script exhausted"}})


class _Server(ThreadingHTTPServer):
    """Keeps a client that hung up (timeout tests) from printing a traceback."""
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


class _Handler(BaseHTTPRequestHandler):
    """Records the request, waits the answer's delay, then sends it."""

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        record = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                  "raw": raw, "body": _json_or_none(raw)}
        fake = self.server.fake
        answer = fake.take(record)
        if answer.delay and fake.stopping.wait(answer.delay):
            return
        self._send(answer)

    def _send(self, answer: Answer) -> None:
        """Write status, headers and body; a vanished client is ignored."""
        body = answer.body
        data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
        try:
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("content-type", "application/json")
            if not (answer.drip or answer.unsized):
                self.send_header("content-length", str(len(data)))
            self.end_headers()
            if answer.drip:
                drip(self.wfile, data, answer.drip, self.server.fake.stopping)
            else:
                self.wfile.write(data)
        except OSError:
            pass

    def log_message(self, format, *args):
        pass


def drip(wfile, data: bytes, every: float, stopping: threading.Event) -> None:
    """Write data one byte per `every` seconds, flushed, until it is sent or `stopping` is set; a
    client that hung up ends it with OSError."""
    for index in range(len(data)):
        if stopping.wait(every):
            return
        wfile.write(data[index:index + 1])
        wfile.flush()


def _json_or_none(raw: bytes):
    """The parsed JSON body, or None."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def anthropic_message(text: str = "", tool_uses=(), model: str = "claude-sonnet-5-5",
                      usage=(100, 20), stop: str | None = None) -> dict:
    """An Anthropic Messages response; tool_uses = [(id, wire_name, input)]."""
    content = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in tool_uses]
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop or ("tool_use" if tool_uses else "end_turn"), "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}


def openai_completion(text: str | None = None, tool_calls=(), model: str = "kimi-k2.6", usage=(100, 20)) -> dict:
    """An OpenAI chat completion; tool_calls = [(id, wire_name, arguments JSON string)]."""
    calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in tool_calls]
    message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop", "message": message}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}


def anthropic_error(type: str, message: str) -> dict:
    """An Anthropic error body."""
    return {"type": "error", "error": {"type": type, "message": message}, "request_id": "req_err"}
