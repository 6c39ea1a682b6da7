"""The worker's model call: `Worker(card_model, env).complete(messages, tools) -> Reply`.

Wire formats, headers, errors, retries, model ids and prices come from the vendors' documents and
SDKs listed at the end; each constant below names the source URL it was read from.

Backend rule (`backend_for(model_id)`), first match wins:
  SAGEROUTE_URL in env -> sageroute   every call: POST {SAGEROUTE_URL}/v1/messages, Anthropic format,
                                      model "sageroute", Bearer SAGEROUTE_TOKEN (vendor keys never sent)
  offline              -> offline     the agent's rules, no network
  anthropic/M          -> anthropic   model M
  moonshot/M           -> moonshot    model M
  openai/M             -> openai      model M
  ollama/M             -> ollama      model M, OpenAI format at OPENAI_BASE_URL or http://localhost:11434/v1
  openrouter/M         -> openrouter  model M, https://openrouter.ai/api/v1 (OPENROUTER_BASE_URL), OPENROUTER_API_KEY
  claude-*             -> anthropic   POST {ANTHROPIC_BASE_URL or https://api.anthropic.com}/v1/messages,
                                      x-api-key ANTHROPIC_API_KEY, anthropic-version 2023-06-01
  kimi-*, moonshot-*   -> moonshot    POST {MOONSHOT_BASE_URL or https://api.moonshot.ai/v1}/chat/completions,
                                      Bearer MOONSHOT_API_KEY
  anything else        -> openai      POST {OPENAI_BASE_URL or https://api.openai.com/v1}/chat/completions,
                                      Bearer OPENAI_API_KEY (also vLLM, LM Studio, llama.cpp by base URL)
A backend whose key is missing raises `LLMNoKey` ("unavailable: no ANTHROPIC_API_KEY") before any request.

Replies: `Reply.stop_reason` is normalised to end | tool_use | length | refusal | other (the vendor's
value is kept in `raw_stop_reason`); `Reply.acts` is true only for end and tool_use, so a turn cut
off at the token limit can be refused. A refusal moves to the next model. `json_objects(text)` lists
the JSON objects in a final answer in order.

Prices: USD per million tokens, first from the card's own `prices` (a Worker's `prices`), then from
PRICES (each row keeps its source URL and date); dated snapshot ids map to their alias row, ollama/*
and offline cost 0.0, anything else is None (unknown, so never "within an envelope"). A reply is
priced by the model it says answered and says where the price came from (Reply.price); a priced
reply without both token counts costs None. The pre-call estimate counts input tokens as len(json of messages+tools)/4
and output as max_tokens. Cached prompt tokens are billed at the full input rate (an upper bound).

Worker order: card primary, then card fallback, then the offline rules. A model that failed (or has
no key) is never asked again by that Worker. Replies from the rules say why in their backend label:
"offline" (no model had a key), "offline-after-error: <reason>" (every model failed or was skipped),
or "offline-<reason>" after `Worker.use_rules(reason)`, e.g. "offline-over-envelope" when the
factory finds that the cost envelope cannot fit one model call. A `Breaker` shared by a batch's
Workers rests a backend after repeated 429/5xx answers; while it rests, Workers skip it.

OpenTelemetry (the last section): `otlp_settings(env)` reads the OTEL_* exporter settings, `run_spans`
turns one run's trace events into spans (a root `invoke_agent`, `chat`, `execute_tool`, `gate`),
`otlp_body` encodes them as OTLP protobuf or JSON, `send_otlp` posts them within the export timeout;
a Worker given a run id sends each request the W3C `traceparent` of its call's `chat` span.

Keys are read only from the `env` mapping given to the Worker; this module never reads os.environ,
keeps no module-level mutable state and does nothing on import. Tool names travel as `issues__label`
on the wire (":" is not allowed there) and come back as `issues:label`.

Sources: https://platform.claude.com/docs/en/api/errors.md,
https://platform.claude.com/docs/en/api/handling-stop-reasons.md, anthropics/anthropic-sdk-python@009b035
(src/anthropic/_base_client.py retry policy, types/*), openai/openai-python@e43b422 (_base_client.py,
types/chat/*), https://platform.kimi.com/docs/api/overview, https://openrouter.ai/docs/api/errors,
https://docs.ollama.com/api/openai-compatibility, https://platform.claude.com/docs/en/about-claude/model-deprecations.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import re
import threading
import time
import unicodedata
import urllib.parse
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Callable, Mapping, NamedTuple

from broker import as_text, reject_constant, unique_keys

# claude-sonnet-4-5 retires 2026-11-30 (https://platform.claude.com/docs/en/about-claude/model-deprecations)
# and Moonshot no longer lists kimi-k2.5 (https://platform.kimi.ai/docs/pricing/chat.md); these are current:
# https://platform.claude.com/docs/zh-CN/models/sonnet-5-5/overview
DEFAULT_PRIMARY = "claude-sonnet-5-5"
DEFAULT_FALLBACK = "claude-haiku-5-5"

# https://platform.claude.com/docs/en/api/errors.md ; anthropics/skills curl/examples.md
ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_BASE = "https://api.anthropic.com"
OPENAI_BASE = "https://api.openai.com/v1"
OPENAI_HOST = "api.openai.com"
_O_SERIES = re.compile(r"o\d+(?:-|\Z)")                # o1, o3-mini, o4-mini-high, ...
MOONSHOT_BASE = "https://api.moonshot.ai/v1"          # https://platform.kimi.com/docs/api/overview
OLLAMA_BASE = "http://localhost:11434/v1"             # https://docs.ollama.com/api/openai-compatibility
OPENROUTER_BASE = "https://openrouter.ai/api/v1"      # https://openrouter.ai/docs/api/errors
PROVIDERS = ("anthropic", "moonshot", "openai", "ollama", "openrouter")
LLM_USER_AGENT = "agent-factory-llm/1"

# Retry policy of the Anthropic and OpenAI SDKs (_base_client.py): 2 retries, 0.5 s doubling to 8 s.
MAX_RETRIES = 2
# A model reply's body is read up to MAX_REPLY_BYTES: a reply at its token limit (a few MiB even at
# 128k output tokens, every character escaped as \uXXXX) stays far below it, so only a broken or
# hostile server reaches it, and a body that never ends cannot fill the machine's memory.
MAX_REPLY_BYTES = 16 * 1024 * 1024
READ_CHUNK = 64 * 1024
RETRY_STATUSES = frozenset({408, 409, 429})           # and every status >= 500 (covers 504, 529)
MAX_RETRY_AFTER_S = 60.0
DEFAULT_REST_S = 30.0       # a Breaker's rest when the server gave no retry-after
MAX_REST_S = 600.0
# 429s that waiting does not cure: Anthropic's spend caps (the org's enforced monthly cap and a
# contract's cap, in error.details.error_code; https://platform.claude.com/docs/en/api/errors.md)
# and OpenAI's quota (https://developers.openai.com/docs/guides/error-codes).
NO_RETRY_CODES = frozenset({"enforced_spend_limit_reached", "contract_spend_limit_reached", "insufficient_quota"})
RECORDED_HEADERS = ("request-id", "x-request-id")     # plus every x-sageroute-* header
EMPTY_SCHEMA = MappingProxyType({"type": "object", "properties": {}})

# Why a model stopped, normalised across vendors; unknown or missing values are "other".
STOP_REASONS = ("end", "tool_use", "length", "refusal", "other")
ACTING_STOPS = frozenset({"end", "tool_use"})
# https://platform.claude.com/docs/en/api/handling-stop-reasons.md (anthropic-sdk-python types/stop_reason.py)
ANTHROPIC_STOPS = MappingProxyType({
    "end_turn": "end", "stop_sequence": "end", "tool_use": "tool_use", "max_tokens": "length",
    "model_context_window_exceeded": "length", "refusal": "refusal", "pause_turn": "other",
})
# finish_reason in openai/openai-python@e43b422 src/openai/types/chat/chat_completion.py
# (function_call is the deprecated single-function form)
OPENAI_STOPS = MappingProxyType({
    "stop": "end", "tool_calls": "tool_use", "function_call": "tool_use", "length": "length",
    "content_filter": "refusal",
})
OVER_ENVELOPE = "over-envelope"      # Worker.use_rules reason: the envelope cannot fit one model call
_REASON_TAG = re.compile(r"[a-z]+(?:-[a-z]+)*")
MAX_COUNT = 2 ** 53 - 1    # a token count past it is no count a reply could mean: unknown usage, as a missing one
_KEYLIKE = re.compile(r"\b(?:sk|lv|key|tok)[-_][A-Za-z0-9_\-*.]{6,}")


# ---------------------------------------------------------------------------------------------
# Values returned


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for; name is the factory's own (`issues:label`)."""
    id: str
    name: str
    args: dict


@dataclass(frozen=True)
class Reply:
    """One model answer: text, tool calls, usage (tokens), cost (USD, None = unknown) and provenance."""
    text: str                        # final text ('' when only tool calls)
    tool_calls: tuple[ToolCall, ...]
    usage: dict                      # {"input_tokens": int, "output_tokens": int}; input includes cached
    cost_usd: float | None           # None = unknown price
    model: str                       # the model the reply names (its `model` field), '' when it names none
    backend: str                     # anthropic|openai|moonshot|ollama|openrouter|sageroute|offline
    #                                    or "offline-after-error: <reason>"
    latency_ms: float                # the HTTP exchange that answered (not earlier retries)
    headers: dict = field(default_factory=dict)   # request-id / x-request-id / x-sageroute-*; never auth
    attempts: tuple[dict, ...] = ()  # failures before this reply: {"model","backend","error","retry_in_s"[,"headers"]}
    stop_reason: str = ""            # normalised: one of STOP_REASONS ('' = not recorded)
    raw_stop_reason: str = ""        # as the vendor sent it (Anthropic stop_reason, OpenAI finish_reason)
    requested: str = ""              # the model named in the request that answered ('' from the rules)
    price: str = ""                  # where the cost's price came from, or why the cost is unknown ("unknown: ...")

    @property
    def answered_by(self) -> str:
        """The model that answered: under SageRoute the one the proxy reports it routed to (x-sageroute-model),
        when it says, else the model the reply names ('' for none). The model a card's prices and proofs judge."""
        return (self.backend == "sageroute" and self.headers.get("x-sageroute-model")) or self.model

    @property
    def acts(self) -> bool:
        """True when the turn ended normally or to use tools; a cut-off or odd turn must not act."""
        return self.stop_reason in ACTING_STOPS


# ---------------------------------------------------------------------------------------------
# Errors: every str() is one line with no key material.


class LLMError(Exception):
    """A model call failed; str(self) is one line, `reason` a short tag for 'offline-after-error: <reason>'."""
    retryable = False

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


class LLMNoKey(LLMError):
    """The backend has no credential in env: 'unavailable: no NAME'."""

    def __init__(self, name: str):
        super().__init__(f"unavailable: no {name}")
        self.name = name


class LLMStatus(LLMError):
    """A non-2xx answer: status, error type, message (redacted), retry-after seconds, recorded headers."""

    def __init__(self, status: int, type: str, message: str, retry_after: float | None = None,
                 headers: dict | None = None, code: str = "", should_retry: str = ""):
        kind = f"HTTP {status} {type or 'error'}"
        super().__init__(f"{kind}: {message}" if message else kind, kind)
        self.status, self.type, self.message = status, type, message
        self.retry_after, self.headers, self.code = retry_after, headers or {}, code
        self.should_retry = should_retry

    @property
    def retryable(self) -> bool:
        """408/409/429/5xx, unless x-should-retry or a spend limit says no (the SDKs' _should_retry)."""
        if self.should_retry == "false" or self.code in NO_RETRY_CODES:
            return False
        return self.status in RETRY_STATUSES or self.status >= 500


class LLMTimeout(LLMError):
    """No answer within `seconds`: one socket read past the per-read timeout, or the whole request past
    its total deadline; not retried: the call may already be billed."""

    def __init__(self, seconds: float):
        super().__init__(f"timeout after {seconds:g}s")


class ConnectionFailed(LLMError):
    """The connection was refused, reset or cut short; retryable."""
    retryable = True

    def __init__(self, detail: str):
        super().__init__(f"connection failed: {detail}", "connection failed")


class LLMMalformed(LLMError):
    """A 2xx answer whose body is not the expected JSON shape."""

    def __init__(self, detail: str):
        super().__init__(f"malformed response: {detail}", "malformed response")


class Oversized(LLMError):
    """A 2xx body longer than `limit` bytes; read no further and, like LLMMalformed, not retried."""

    def __init__(self, limit: int):
        super().__init__(f"reply too large: over {limit // (1024 * 1024)} MiB", "reply too large")


class RefusedRedirect(LLMError):
    """A 3xx answer; never followed, since urllib would copy the key headers to any host."""

    def __init__(self, status: int, host: str):
        super().__init__(f"refused redirect: HTTP {status} to {host}", "refused redirect")


class Rested(LLMError):
    """No request was sent: the backend's breaker is open after repeated 429/5xx answers."""

    def __init__(self, backend: str, detail: str, last: str):
        super().__init__(f"skipped: {backend} is rested {detail}", f"{backend} rested after {last}")
        self.backend = backend


class Declined(LLMError):
    """The model declined (Anthropic stop_reason refusal, OpenAI finish_reason content_filter or a
    `refusal` text in the message); try another model. `detail` is the refusal text, if any."""

    def __init__(self, stop_reason: str, detail: str = ""):
        kind = f"model declined: {stop_reason}"
        super().__init__(f"{kind}: {redact_line(detail)}" if detail.strip() else kind, kind)


def _model_field(data: dict) -> str:
    """The reply's `model` (the model that answered) as text, "" when absent; LLMMalformed when not a string."""
    model = data.get("model") or ""
    if not isinstance(model, str):
        raise LLMMalformed(f"model is a {type(model).__name__}, not a string")
    return as_text(model)


def redact_line(text: str, secrets: tuple[str, ...] = ()) -> str:
    """One line of at most 200 chars with every secret and key-like token replaced by ***."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    text = " ".join(_KEYLIKE.sub("***", text).split())
    return text[:200]


# ---------------------------------------------------------------------------------------------
# Prices (USD per million tokens). Cache reads are billed at the input rate and cache writes are
# never requested, so a cost here is an upper bound for Anthropic cache hits.

_ANTHROPIC_PRICING = "https://platform.claude.com/docs/en/docs/about-claude/pricing"
_ANTHROPIC_PRICING_NEW = "https://platform.claude.com/docs/en/about-claude/pricing?ref=optimizesmart.com"


@dataclass(frozen=True)
class Price:
    """USD per 1M input/output tokens for one model, where and when it was read."""
    input: float
    output: float
    source: str
    as_of: str
    long_input: float | None = None    # rates once the prompt exceeds long_above tokens
    long_output: float | None = None
    long_above: int | None = None


PRICES = MappingProxyType({
    "claude-sonnet-4-5": Price(3.00, 15.00, _ANTHROPIC_PRICING, "2026-02 (stored copy)"),
    "claude-sonnet-4-6": Price(3.00, 15.00, _ANTHROPIC_PRICING, "2026-02 (stored copy)"),
    "claude-haiku-4-5": Price(1.00, 5.00, _ANTHROPIC_PRICING, "2026-02 (stored copy)"),
    "claude-opus-4-5": Price(5.00, 25.00, _ANTHROPIC_PRICING, "2026-02 (stored copy)"),
    "claude-opus-4-6": Price(5.00, 25.00, _ANTHROPIC_PRICING_NEW, "2026-07 (stored copy)"),
    "claude-opus-4-7": Price(5.00, 25.00, _ANTHROPIC_PRICING_NEW, "2026-07 (stored copy)"),
    "claude-opus-4-8": Price(5.00, 25.00, _ANTHROPIC_PRICING_NEW, "2026-07 (stored copy)"),
    "claude-opus-4-1": Price(15.00, 75.00, _ANTHROPIC_PRICING_NEW, "2026-07 (stored copy)"),
    "claude-sonnet-5": Price(2.00, 10.00, "https://platform.claude.com/docs/zh-CN/models/sonnet-5-5/overview",
                             "2026-10 (stored copy)"),
    "claude-sonnet-5-5": Price(2.00, 10.00, "https://platform.claude.com/docs/zh-CN/models/sonnet-5-5/overview",
                               "2026-10 (stored copy)"),
    # Third-party figure; the official card says "From $0.10 / $0.50" (the <=100K-token tier).
    "claude-haiku-5-5": Price(0.10, 0.50, "https://github.com/TheKrush/PromptFuel/releases/tag/v1.0.23",
                              "2026-10 (third-party)", 0.50, 2.50, 100_000),
    "kimi-k2.5": Price(0.60, 3.00, "https://megalodon.jp/ref/2026-0326-0135-31/"
                       "https://platform.moonshot.ai:443/docs/pricing/chat", "2026-03-26 (archived)"),
    "kimi-k2.6": Price(0.95, 4.00, "https://developer.puter.com/tutorials/kimi-api-pricing/", "2026-06"),
    "kimi-k3": Price(3.00, 15.00, "https://github.com/getagentseal/codeburn/pull/709", "2026-07"),
    "offline": Price(0.0, 0.0, "no network", "n/a"),
})
# Dated snapshot id -> alias row (https://platform.claude.com/docs/zh-TW/models/sonnet-4-5/overview.md and the
# other model cards).
SNAPSHOTS = MappingProxyType({
    "claude-sonnet-4-5-20250929": "claude-sonnet-4-5",
    "claude-haiku-4-5-20251001": "claude-haiku-4-5",
    "claude-opus-4-5-20251101": "claude-opus-4-5",
    "claude-opus-4-1-20250805": "claude-opus-4-1",
})
_DATED = re.compile(r"-(?:19|20)\d\d(?:\d{4}|-\d\d-\d\d)\Z")   # -20250929 (Anthropic), -2024-08-06 (OpenAI)
_LOCAL = Price(0.0, 0.0, "self-hosted: no per-token price", "n/a")
NO_PRICES: Mapping[str, Price] = MappingProxyType({})
DECLARED = "the card's prices"      # Price.source of a price the agent's card declares


def declared_prices(prices: Mapping[str, Mapping[str, float]] | None) -> Mapping[str, Price]:
    """Model id -> Price from a card's `prices` ({MODEL: {"input": USD, "output": USD}} per million tokens)."""
    return MappingProxyType({model: Price(rates["input"], rates["output"], DECLARED, "")
                             for model, rates in (prices or {}).items()})


def price_row(model: str, declared: Mapping[str, Price] = NO_PRICES) -> Price | None:
    """The Price for a model id: the card's `declared` price for exactly that id first, else for the same model
    (declared_row), then the built-in table (alias, dated snapshot, provider/ form, ollama/* = 0), else None.

    A dated id not in SNAPSHOTS ("claude-sonnet-5-5-20260928") takes its alias's row: an Anthropic
    alias points at its dated snapshot, and responses name the snapshot (the model cards, e.g.
    https://platform.claude.com/docs/zh-TW/models/sonnet-4-5/overview.md)."""
    if row := declared.get(model) or declared_row(model, declared):
        return row
    provider, _, rest = model.partition("/")
    if rest and provider == "ollama":
        return _LOCAL
    if rest and provider in ("anthropic", "moonshot"):
        model = rest
    model = SNAPSHOTS.get(model, model)
    return PRICES.get(model) or PRICES.get(_DATED.sub("", model))


def declared_row(model: str, declared: Mapping[str, Price]) -> Price | None:
    """The declared Price of an id naming `model` in another form: with a provider's prefix it lacks or without
    the one it has ("openai/stockwise-9" and "stockwise-9", as an OpenAI-compatible server answers; a bare id only
    by the provider it goes to, backend_for: never openai/claude-x for claude-x), `model` also as the alias of its
    dated form; never another provider's id (evil/x) nor another date (reply_cost knows the route's provider). None for none, and
    for two prices (two providers' ids for it): which one it was is not guessed."""
    forms = {form for form in (model, _DATED.sub("", model)) if form}
    rows = {row for named, row in declared.items() if named and any(
        named == form or form.partition("/")[2] == named or named.partition("/")[2] == form and "/" not in form
        and named.partition("/")[0] == backend_for(form, {}) for form in forms)}
    return rows.pop() if len(rows) == 1 else None


def same_model(named: str, answered: str) -> bool:
    """True when a reply naming the model `answered` came from the card's model `named`: the same id, a
    dated form of it (claude-sonnet-5-5-20260101, gpt-4o-2024-08-06: a vendor's alias answers as its
    snapshot), or either one with a provider's prefix the other lacks (anthropic/claude-sonnet-5-5, as
    OpenRouter names it). A reply that names no model ('') is never the card's."""
    named, answered = _DATED.sub("", named), _DATED.sub("", answered)
    if not named or not answered:
        return False
    return named == answered or named.partition("/")[2] == answered or answered.partition("/")[2] == named


def price(model: str, declared: Mapping[str, Price] = NO_PRICES) -> tuple[float, float] | None:
    """(USD per 1M input tokens, USD per 1M output tokens) for a model id, or None if unknown."""
    row = price_row(model, declared)
    return None if row is None else (row.input, row.output)


def estimate_cost(model: str, input_tokens: int, max_output_tokens: int,
                  declared: Mapping[str, Price] = NO_PRICES) -> float | None:
    """USD for input_tokens in and max_output_tokens out (an upper bound); None = unknown price."""
    row = price_row(model, declared)
    if row is None:
        return None
    rate_in, rate_out = row.input, row.output
    if row.long_above is not None and input_tokens > row.long_above:
        rate_in, rate_out = row.long_input, row.long_output
    return (input_tokens * rate_in + max_output_tokens * rate_out) / 1e6


def cost_usd(model: str, usage: Mapping[str, int], declared: Mapping[str, Price] = NO_PRICES) -> float | None:
    """USD for a usage dict {"input_tokens","output_tokens"}; None = unknown (not within any envelope):
    an unpriced model, or a priced one whose usage lacks either count. A free (local) model costs 0.0."""
    row = price_row(model, declared)
    if row is not None and row.input == row.output == 0.0:
        return 0.0
    tokens_in, tokens_out = usage.get("input_tokens"), usage.get("output_tokens")
    if not (_is_count(tokens_in) and _is_count(tokens_out)):
        return None
    return estimate_cost(model, tokens_in, tokens_out, declared)


def _is_count(value) -> bool:
    """True for a non-negative int no larger than MAX_COUNT (a token count)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def estimate_input_tokens(messages: list[dict], tools: list[dict]) -> int:
    """Rough prompt size: len(serialized messages + tools) / 4, rounded up (no tokenizer in stdlib)."""
    return math.ceil(len(json.dumps([messages, tools], ensure_ascii=False, default=str)) / 4)


# ---------------------------------------------------------------------------------------------
# Routing: model id + env -> where the request goes.


@dataclass(frozen=True)
class Route:
    """Where one model id goes: backend name, wire dialect, URL, model sent, auth headers."""
    backend: str
    wire: str                                               # "anthropic" | "openai"
    url: str
    model: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)
    token_field: str = "max_tokens"                         # the body field that caps output tokens


def backend_for(model_id: str, env: Mapping[str, str]) -> str:
    """Backend name for a model id under env (rule in the module docstring)."""
    if env.get("SAGEROUTE_URL"):
        return "sageroute"
    if model_id == "offline":
        return "offline"
    provider, _, rest = model_id.partition("/")
    if rest and provider in PROVIDERS:
        return provider
    if model_id.startswith("claude-"):
        return "anthropic"
    if model_id.startswith(("kimi-", "moonshot-")):
        return "moonshot"
    return "openai"


def route_for(model_id: str, env: Mapping[str, str]) -> Route:
    """The Route for a model id; raises LLMNoKey when its key is missing, LLMError on a bad base URL."""
    backend = backend_for(model_id, env)
    provider, _, rest = model_id.partition("/")
    model = rest if rest and provider in PROVIDERS else model_id
    if backend == "offline":
        raise LLMError("offline is not a network backend")
    route = _ROUTERS[backend](model, env)
    if urllib.parse.urlsplit(route.url).scheme not in ("http", "https"):
        raise LLMError(f"bad base url for {backend}: scheme must be http or https")
    return route


def calls_to(model_id: str, env: Mapping[str, str]) -> str:
    """Where calls of a model id go under env, for a person: 'BACKEND URL', with the key it lacks when it
    lacks one (its calls are then not made), or 'offline'; the reason when its base url is bad."""
    if backend_for(model_id, env) == "offline":
        return "offline (the agent's rules)"
    try:
        return f"{backend_for(model_id, env)} {route_for(model_id, env).url}"
    except LLMNoKey as missing:
        return f"{calls_to(model_id, {**env, missing.name: 'set'})} (not asked: no {missing.name})"
    except LLMError as error:
        return str(error)


ENDPOINT_NAME = re.compile(r"_(?:URL|ENDPOINT|PROXY)$", re.I)   # ANTHROPIC_BASE_URL, SAGE_ENDPOINT, https_proxy


# Settings of a closed set: variable -> its values (sage.py reads the first two, otlp_settings the third), each
# read by choice(); unset or blank, its client's default (levanto; reasoning not sent; http/protobuf).
CHOICES = MappingProxyType({"SAGE_PROTOCOL": ("levanto", "systemone"), "SAGE_REASONING": ("auto", "off", "on"),
                            "OTEL_EXPORTER_OTLP_PROTOCOL": ("http/protobuf", "http/json")})


def choice(env: Mapping[str, str], name: str) -> str:
    """A CHOICES variable as its client reads it: stripped, in lower case ('' unset)."""
    return (env.get(name) or "").strip().lower()


def setting_problem(env: Mapping[str, str], names: tuple[str, ...], secret: re.Pattern) -> str | None:
    """Why one of the variables `names` set in env (a proxy's lower-case one too, as urllib reads it) can
    serve no request, or is outside its CHOICES, in one line never showing a key (one whose name matches
    `secret`); None when none."""
    for name in names + tuple(n.lower() for n in names if n.endswith("_PROXY")):
        value, key = env.get(name) or "", secret.search(name)
        if name in CHOICES and choice(env, name) not in ("", *CHOICES[name]):
            *others, last = CHOICES[name]
            return f"{name} must be {', '.join(others)} or {last}, not {value.strip()!r}"
        problem = key_problem(value.strip()) if key else url_problem(value, name[-6:].lower() == "_proxy") \
            if ENDPOINT_NAME.search(name) and value else None
        if problem:
            return f"{name} {problem}" + ("; set it again (its value is not shown)" if key else "")
    return None


def key_problem(key: str) -> str | None:
    """What in a key no HTTP header can carry (RFC 9110 section 5.5: a line break, another control, a
    character outside latin-1), as the rest of a line naming the key's variable; None when nothing."""
    for at, char in enumerate(key, 1):
        what = ("a line break" if char in "\r\n\x85\u2028\u2029" else "a control character" if unicodedata.category(char) == "Cc"
                or char == "\t" else "a character outside latin-1" if ord(char) > 0xFF else None)
        if what:
            return f"holds {what} (character {at} of {len(key)}), which no http header can carry"
    return None


def url_problem(url: str, proxy: bool) -> str | None:
    """What keeps url from being an address a request can go to (a proxy may leave out its http://: urllib reads
    one not starting SCHEME:/ as HOST:PORT), as the rest of a line naming its variable, the url shown without
    its user and password; None when nothing. A host is ascii: urllib sends it in the Host header as written (an international name
    goes in its IDNA form, xn--...)."""
    shown = re.sub(r"//[^/?#]*@", "//...@", url)
    try:
        bare = proxy and not re.match("[^/:]+:/", url)
        parts = urllib.parse.urlsplit(f"http://{url}" if bare else url)
        parts.port   # noqa: B018 - a port that is no number, or out of range, is a ValueError
        if re.search("[\x00-\x20\x7f-\x9f]", url) or parts.scheme not in ("http", "https") or not parts.hostname \
                or not url.isascii():
            return f"is not an http:// or https:// url with a host, free of spaces and controls, ascii (an international host in its xn-- form) ({shown})"
        parts.hostname.encode("idna")
        if parts.port == 0:
            return f"names port 0, which no connection can reach ({shown})"
        if bare and re.search("[/?#]", url):
            return f"is a proxy without its http://, which urllib reads as HOST:PORT alone: it holds no path ({shown})"
        if not proxy and "@" in parts.netloc:   # a proxy's user and password are sent (urllib's ProxyHandler)
            return f"holds a user or password, which urllib never sends to an endpoint: a key goes in its own variable ({shown})"
    except UnicodeError:
        return f"names a host IDNA cannot encode, which no name lookup can find ({shown})"
    except ValueError as error:
        return f"is not a url ({str(error).lower().replace(url, shown)}: {shown})"
    return None


def _need(env: Mapping[str, str], name: str) -> str:
    """env[name] without the white space around it, or LLMNoKey(name) when unset or empty."""
    value = (env.get(name) or "").strip()
    if not value:
        raise LLMNoKey(name)
    return value


def _messages_url(base: str) -> str:
    """{base}/v1/messages, tolerating a base that already ends in /v1."""
    base = base.rstrip("/")
    return (base[:-3] if base.endswith("/v1") else base) + "/v1/messages"


def _anthropic_route(model: str, env: Mapping[str, str]) -> Route:
    """Anthropic Messages with x-api-key (https://platform.claude.com/docs/en/api/errors.md)."""
    key = _need(env, "ANTHROPIC_API_KEY")
    url = _messages_url(env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_BASE)
    return Route("anthropic", "anthropic", url, model,
                 {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}, (key,))


def _sageroute_route(model: str, env: Mapping[str, str]) -> Route:
    """SageRoute proxy: Anthropic format, model 'sageroute', its own token only (vendor keys stay here)."""
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    token = (env.get("SAGEROUTE_TOKEN") or "").strip()
    if token:
        headers["authorization"] = f"Bearer {token}"
    return Route("sageroute", "anthropic", _messages_url(env["SAGEROUTE_URL"]), "sageroute",
                 headers, (token,) if token else ())


def _chat_route(backend: str, model: str, base: str, key: str, secret: bool = True) -> Route:
    """An OpenAI chat-completions Route with a Bearer key."""
    return Route(backend, "openai", base.rstrip("/") + "/chat/completions", model,
                 {"authorization": f"Bearer {key}"}, (key,) if secret else ())


def _openai_route(model: str, env: Mapping[str, str]) -> Route:
    """OpenAI-compatible server at OPENAI_BASE_URL with OPENAI_API_KEY; see openai_token_field."""
    key = _need(env, "OPENAI_API_KEY")
    route = _chat_route("openai", model, env.get("OPENAI_BASE_URL") or OPENAI_BASE, key)
    return replace(route, token_field=openai_token_field(model, route.url))


def openai_token_field(model: str, url: str) -> str:
    """'max_completion_tokens' for OpenAI's own API and for o-series models wherever they are
    served, else 'max_tokens'.

    OpenAI deprecated `max_tokens` for `max_completion_tokens`, which o-series models require
    (openai/openai-python@e43b422 src/openai/types/chat/completion_create_params.py). Moonshot,
    Ollama, vLLM and llama.cpp accept `max_tokens` (https://platform.kimi.com/docs/api/overview,
    https://docs.ollama.com/api/openai-compatibility,
    https://docs.vllm.ai/en/v0.8.1/serving/openai_compatible_server.html); LM Studio and OpenRouter
    are sent it too, as every other OpenAI-compatible server is, since older servers may not know
    the newer field."""
    if urllib.parse.urlsplit(url).hostname == OPENAI_HOST or _O_SERIES.match(model):
        return "max_completion_tokens"
    return "max_tokens"


def _moonshot_route(model: str, env: Mapping[str, str]) -> Route:
    """Moonshot/Kimi chat completions (https://platform.kimi.com/docs/api/overview)."""
    key = _need(env, "MOONSHOT_API_KEY")
    return _chat_route("moonshot", model, env.get("MOONSHOT_BASE_URL") or MOONSHOT_BASE, key)


def _ollama_route(model: str, env: Mapping[str, str]) -> Route:
    """Ollama: any non-empty key works; OPENAI_API_KEY is sent only to an explicit OPENAI_BASE_URL."""
    base = env.get("OPENAI_BASE_URL")
    if base and (env.get("OPENAI_API_KEY") or "").strip():
        return _chat_route("ollama", model, base, _need(env, "OPENAI_API_KEY"))
    return _chat_route("ollama", model, base or OLLAMA_BASE, "ollama", secret=False)


def _openrouter_route(model: str, env: Mapping[str, str]) -> Route:
    """OpenRouter chat completions (https://openrouter.ai/docs/api/errors)."""
    key = _need(env, "OPENROUTER_API_KEY")
    return _chat_route("openrouter", model, env.get("OPENROUTER_BASE_URL") or OPENROUTER_BASE, key)


_ROUTERS = MappingProxyType({
    "anthropic": _anthropic_route, "sageroute": _sageroute_route, "openai": _openai_route,
    "moonshot": _moonshot_route, "ollama": _ollama_route, "openrouter": _openrouter_route,
})


# ---------------------------------------------------------------------------------------------
# Wire formats: neutral messages <-> Anthropic Messages (anthropic-sdk-python types/message_create_params.py)
# and OpenAI chat completions (openai-python types/chat/completion_create_params.py).


def wire_name(name: str) -> str:
    """Tool name on the wire: ':' -> '__' (the pattern ^[a-zA-Z0-9_-]{1,64}$ forbids ':')."""
    return name.replace(":", "__")


def tool_names(tools: list[dict]) -> dict[str, str]:
    """{wire name: factory name} for the tools offered."""
    return {wire_name(t["name"]): t["name"] for t in tools}


def _factory_name(wire: str, names: Mapping[str, str]) -> str:
    """The factory's tool name for a wire name (unknown names decode '__' -> ':')."""
    return names.get(wire) or as_text(wire).replace("__", ":")


def anthropic_request(model: str, messages: list[dict], tools: list[dict], max_tokens: int) -> dict:
    """Anthropic Messages body: system on top, tools with input_schema (anthropic-sdk message_create_params.py)."""
    body = {"model": model, "max_tokens": max_tokens, "messages": _anthropic_turns(messages)}
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    if system:
        body["system"] = system
    if tools:
        body["tools"] = [{"name": wire_name(t["name"]), "description": t.get("description") or "",
                          "input_schema": dict(t.get("params") or EMPTY_SCHEMA)} for t in tools]
    return body


def _anthropic_turns(messages: list[dict]) -> list[dict]:
    """Neutral messages as Anthropic turns; consecutive tool results share one user turn, as the API expects."""
    turns: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"],
                     "content": m["content"], "is_error": bool(m.get("is_error"))}
            if turns and turns[-1]["role"] == "user" and isinstance(turns[-1]["content"], list):
                turns[-1]["content"].append(block)
            else:
                turns.append({"role": "user", "content": [block]})
        elif m["role"] == "assistant":
            turns.append(_anthropic_assistant(m))
        elif m["role"] == "user":
            turns.append({"role": "user", "content": m["content"]})
    return turns


def _anthropic_assistant(m: dict) -> dict:
    """An assistant turn as text + tool_use blocks."""
    blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
    blocks += [{"type": "tool_use", "id": c["id"], "name": wire_name(c["name"]), "input": c.get("args") or {}}
               for c in m.get("tool_calls") or ()]
    return {"role": "assistant", "content": blocks or m.get("content") or ""}


class Parsed(NamedTuple):
    """One 2xx model answer read from the wire, before pricing."""
    text: str
    calls: tuple
    usage: dict
    model: str           # the response's model field, '' when absent
    raw_stop: str        # as sent
    stop: str            # one of STOP_REASONS


def anthropic_reply(data: dict, names: Mapping[str, str]) -> Parsed:
    """A Messages response read; skips unknown blocks; raises Declined on stop_reason refusal."""
    if data.get("type") == "error":
        raise _body_error(data, 500)
    blocks = data["content"]
    if not isinstance(blocks, list):
        raise LLMMalformed("content is not a list")
    raw = as_text(data.get("stop_reason") or "")
    stop = ANTHROPIC_STOPS.get(raw, "other")
    if stop == "refusal":
        raise Declined(raw)
    text = as_text("".join(b.get("text", "") for b in blocks if b.get("type") == "text"))
    calls = tuple(ToolCall(as_text(b["id"]), _factory_name(b["name"], names), _as_args(b.get("input")))
                  for b in blocks if b.get("type") == "tool_use")
    return Parsed(text, calls, _anthropic_usage(data.get("usage")), _model_field(data), raw, stop)


def _anthropic_usage(usage) -> dict:
    """{"input_tokens" (cached included), "output_tokens"}, or {} when the reply did not report both."""
    if not isinstance(usage, dict) or not (_is_count(usage.get("input_tokens"))
                                           and _is_count(usage.get("output_tokens"))):
        return {}
    counts = [usage.get(k) for k in ("cache_creation_input_tokens", "cache_read_input_tokens")]
    if any(count is not None and not _is_count(count) for count in counts):
        return {}
    tokens_in = usage["input_tokens"] + sum(count or 0 for count in counts)
    return {"input_tokens": tokens_in, "output_tokens": usage["output_tokens"]} if _is_count(tokens_in) else {}


def openai_request(model: str, messages: list[dict], tools: list[dict], max_tokens: int) -> dict:
    """Chat-completions body: system as a message, tools as functions (openai-python completion_create_params.py)."""
    body = {"model": model, "max_tokens": max_tokens, "messages": [_openai_message(m) for m in messages]}
    if tools:
        body["tools"] = [{"type": "function", "function": {
            "name": wire_name(t["name"]), "description": t.get("description") or "",
            "parameters": dict(t.get("params") or EMPTY_SCHEMA)}} for t in tools]
    return body


def _openai_message(m: dict) -> dict:
    """One neutral message as a chat message; tool results become role 'tool' (no is_error field there)."""
    if m["role"] == "tool":
        content = f"error: {m['content']}" if m.get("is_error") else m["content"]
        return {"role": "tool", "tool_call_id": m["tool_call_id"], "content": content}
    if m["role"] == "assistant" and m.get("tool_calls"):
        calls = [{"id": c["id"], "type": "function", "function": {
            "name": wire_name(c["name"]), "arguments": json.dumps(c.get("args") or {})}}
            for c in m["tool_calls"]]
        return {"role": "assistant", "content": m.get("content") or None, "tool_calls": calls}
    return {"role": m["role"], "content": m["content"]}


def openai_reply(data: dict, names: Mapping[str, str]) -> Parsed:
    """A chat completion read (openai-python types/chat/chat_completion.py); raises Declined on
    finish_reason content_filter or a `refusal` text, LLMMalformed on a non-function tool call."""
    if "error" in data and not data.get("choices"):
        raise _body_error(data, 502)       # OpenRouter reports late errors with HTTP 200
    choice = data["choices"][0]
    message = choice["message"]
    raw = as_text(choice.get("finish_reason") or "")
    stop = OPENAI_STOPS.get(raw, "other")
    refusal = message.get("refusal")
    if stop == "refusal" or refusal:
        raise Declined("refusal" if refusal else raw, as_text(str(refusal or "")))
    calls = _openai_calls(data, message, names)
    text = message.get("content") or ""
    if not isinstance(text, str):
        raise LLMMalformed(f"message content is a {type(text).__name__}, not a string")
    return Parsed(as_text(text), calls, _openai_usage(data.get("usage")), _model_field(data), raw, stop)


def _openai_usage(usage) -> dict:
    """{"input_tokens": prompt_tokens (cached included), "output_tokens": completion_tokens}, or {}
    when the reply did not report both."""
    if not isinstance(usage, dict) or not (_is_count(usage.get("prompt_tokens"))
                                           and _is_count(usage.get("completion_tokens"))):
        return {}
    return {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}


def _openai_calls(data: dict, message: dict, names: Mapping[str, str]) -> tuple[ToolCall, ...]:
    """The message's function tool calls (or its deprecated single `function_call`) as ToolCalls."""
    wire_calls = list(message.get("tool_calls") or ())
    if not wire_calls and isinstance(message.get("function_call"), dict):
        wire_calls = [{"type": "function", "function": message["function_call"]}]
    calls = []
    for index, call in enumerate(wire_calls):
        kind = call.get("type") or "function"
        if kind != "function":
            raise LLMMalformed(f"tool call {index} has type {kind!r}; only function tool calls are supported")
        function = call["function"]
        call_id = call.get("id") or stand_in_call_id(data, index, function)
        calls.append(ToolCall(as_text(str(call_id)), _factory_name(function["name"], names),
                              _as_args(function.get("arguments"))))
    return tuple(calls)


def stand_in_call_id(data: dict, index: int, function: dict) -> str:
    """An id for a tool call the server sent without one (some llama.cpp and LM Studio versions):
    'local-' + 16 hex of a digest of the response id, its creation time, the call's position,
    name and arguments, so the same reply gives the same ids and calls in one reply differ."""
    seed = [data.get("id"), data.get("created"), index, function.get("name"), function.get("arguments")]
    digest = hashlib.sha256(json.dumps(seed, sort_keys=True, default=str).encode()).hexdigest()
    return f"local-{digest[:16]}"


def _as_args(raw) -> dict:
    """Tool arguments as a dict; a string that is not JSON (strict_json: also NaN, Infinity or a key named
    twice, whose meaning is ambiguous) comes back as {"_unparsed_arguments": raw}, which the broker denies."""
    if isinstance(raw, str):
        try:
            raw = strict_json(raw) if raw.strip() else {}
        except (ValueError, RecursionError):   # RecursionError: nested deeper than the parser goes
            return {"_unparsed_arguments": raw}
    return raw if isinstance(raw, dict) else {"_unparsed_arguments": json.dumps(raw)}


# ---------------------------------------------------------------------------------------------
# Model text


def json_objects(text: str) -> list[dict]:
    """Every JSON object written in text, in order (outer objects only).

    A decode is tried at each '{' not inside an object already found, so prose braces before the
    object ("Output format {label, draft}:"), code fences and notes after it do not hide it; the
    caller takes the first one its output contract accepts. NaN, Infinity and numbers that
    overflow to infinity are refused, and nesting too deep to decode is not an object."""
    decoder = json.JSONDecoder(parse_constant=reject_constant, parse_float=_finite_float, object_pairs_hook=unique_keys)
    found, at = [], text.find("{")
    while at >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            value, end = None, at + 1
        if isinstance(value, dict):
            found.append(value)
        at = text.find("{", end)
    return found


def strict_json(raw: str | bytes):
    """The JSON value in raw as RFC 8259 (https://www.rfc-editor.org/rfc/rfc8259) has it: ValueError for
    NaN, Infinity, a number that overflows to infinity and an object naming one key twice (json.loads
    would take them all, the last key winning), as for any other bytes that are not JSON; RecursionError
    for nesting deeper than the parser goes. Nothing read this way can stop a trace line being written."""
    return json.loads(raw, parse_constant=reject_constant, parse_float=_finite_float, object_pairs_hook=unique_keys)


def _finite_float(text: str) -> float:
    """parse_float hook: a finite float, else ValueError (1e999 would be infinity)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


# ---------------------------------------------------------------------------------------------
# HTTP: one POST, errors mapped to the family above. urllib.request, urllib.error, http.client and
# email.utils are imported by the functions that use them: a station that asks no model (the offline
# rules, the tower) never loads the HTTP stack (about 25 ms of a cold start).


def build_opener(env: Mapping[str, str]) -> urllib.request.OpenerDirector:
    """An opener that never follows redirects and takes HTTP(S) proxies only from env."""
    import urllib.request

    class RefuseRedirects(urllib.request.HTTPRedirectHandler):
        """Builds no redirected request, so a 3xx surfaces as an HTTPError."""

        def redirect_request(self, req, fp, code, msg, headers, newurl):
            return None

    proxies = {}
    for scheme in ("http", "https"):
        value = env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")
        if value:
            proxies[scheme] = value
    return urllib.request.build_opener(urllib.request.ProxyHandler(proxies), RefuseRedirects)


def recorded_headers(headers) -> dict:
    """The safe-to-log response headers: request ids and x-sageroute-* (lower-cased names)."""
    if headers is None:
        return {}
    return {k.lower(): v for k, v in headers.items()
            if k.lower() in RECORDED_HEADERS or k.lower().startswith("x-sageroute-")}


def retry_after(headers) -> float | None:
    """Seconds from retry-after-ms, else retry-after (seconds or HTTP-date); None if absent/unreadable."""
    if headers is None:
        return None
    value = headers.get("retry-after")
    for text, scale in ((headers.get("retry-after-ms"), 1000.0), (value, 1.0)):
        try:
            return float(text) / scale
        except (TypeError, ValueError):
            pass
    import email.utils
    try:
        return email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        return None


def retry_wait(error: LLMError, retry: int, rng: random.Random) -> float | None:
    """Seconds before retry `retry` (0-based) or None to give up.

    The policy of anthropic-sdk-python@009b035 src/anthropic/_base_client.py (2 retries; a
    retry-after up to 60 s is honoured; else 0.5 s doubling to 8 s, less up to 25%), except that a
    retry-after wait is stretched by up to 25%, so Workers told the same wait do not return at once."""
    if retry >= MAX_RETRIES or not error.retryable:
        return None
    after = getattr(error, "retry_after", None)
    if after is not None and after > MAX_RETRY_AFTER_S:
        return None                    # asked to wait past 60 s: fail over instead of sleeping
    if after is not None and after > 0:
        return after * (1 + 0.25 * rng.random())   # never sooner than asked; spread so Workers do not burst
    return min(0.5 * 2 ** retry, 8.0) * (1 - 0.25 * rng.random())


def post_json(opener, url: str, headers: Mapping[str, str], body: dict, timeout: float,
              secrets: tuple[str, ...] = (), deadline: float | None = None) -> tuple[dict, dict, float]:
    """POST body as JSON; (parsed reply, recorded headers, latency ms). Raises LLMError subclasses.

    `timeout` (s) bounds each socket read; `deadline` (s, default twice `timeout`) bounds the whole
    request, connect and every read of the body together (LLMTimeout(deadline) past it); a 2xx body over
    MAX_REPLY_BYTES is Oversized."""
    raw, got, latency = post_bytes(opener, url, {"content-type": "application/json", "accept": "application/json",
                                                 **headers}, request_bytes(body), timeout, secrets, deadline)
    return _parse_json(raw), recorded_headers(got), latency


def post_bytes(opener, url: str, headers: Mapping[str, str], data: bytes, timeout: float,
               secrets: tuple[str, ...] = (), deadline: float | None = None,
               limit: int = MAX_REPLY_BYTES) -> tuple[bytes, object, float]:
    """POST data with these headers (and our user-agent); (2xx body, response headers, latency ms), the body
    read up to `limit` bytes. Timeouts and errors as post_json's."""
    import http.client
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url, data, method="POST", headers={"user-agent": LLM_USER_AGENT, **headers})
    deadline = 2 * timeout if deadline is None else deadline
    start = time.monotonic()
    try:
        with opener.open(request, timeout=min(timeout, deadline)) as response:
            raw = read_bounded(response, limit, start + deadline)
            got = response.headers
    except urllib.error.HTTPError as err:
        raise _status_error(err, secrets, start + deadline) from None
    except BodyTooLarge:
        raise Oversized(limit) from None
    except DeadlinePassed:
        raise LLMTimeout(deadline) from None
    except TimeoutError:
        raise LLMTimeout(timeout) from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, TimeoutError):
            raise LLMTimeout(timeout) from None
        raise ConnectionFailed(redact_line(str(err.reason), secrets)) from None
    except (OSError, http.client.HTTPException) as err:
        raise ConnectionFailed(type(err).__name__) from None
    return raw, got, (time.monotonic() - start) * 1000


class BodyTooLarge(Exception):
    """read_bounded met more than its limit of bytes."""


class DeadlinePassed(Exception):
    """read_bounded's deadline passed before the body ended."""


def read_bounded(response, limit: int, deadline: float) -> bytes:
    """The body of an http.client.HTTPResponse, at most `limit` bytes, read before `deadline`
    (a time.monotonic() value, s). Raises BodyTooLarge past the limit and DeadlinePassed past the
    deadline: each read's socket timeout is shortened to the time left, so a body sent a byte at a
    time cannot outlast it. A body shorter than its Content-Length is http.client.IncompleteRead; other
    OSError and http.client errors pass through."""
    chunks, size = [], 0
    for chunk in _body_chunks(response, deadline):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def read_prefix(response, limit: int, deadline: float) -> bytes:
    """Up to the first `limit` bytes of an error answer's body (an HTTPError or HTTPResponse), whatever
    arrived before `deadline` (time.monotonic() s); never raises: the status already says what happened,
    and the body only adds its message."""
    import http.client
    got = bytearray()
    try:
        for chunk in _body_chunks(response, deadline):
            got += chunk
            if len(got) >= limit:
                break
    except (DeadlinePassed, OSError, http.client.HTTPException):
        pass
    return bytes(got[:limit])


def _body_chunks(response, deadline: float):
    """Yield the body in chunks of at most READ_CHUNK bytes; DeadlinePassed when `deadline` passes
    first, http.client.IncompleteRead when it ends before its Content-Length."""
    import http.client
    sock = _body_socket(response)
    per_read = sock.gettimeout() if sock is not None else None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlinePassed()
        wait = left if per_read is None else min(left, per_read)
        if sock is not None:
            sock.settimeout(wait)
        try:
            chunk = response.read1(READ_CHUNK)
        except TimeoutError:
            if sock is not None and wait == left:
                raise DeadlinePassed() from None
            raise
        if not chunk:
            if getattr(response, "length", None):
                raise http.client.IncompleteRead(b"", response.length)
            return
        yield chunk


def _body_socket(response):
    """The socket an http.client.HTTPResponse reads from, or None (then only the clock between reads
    and each read's own timeout bound the body). urllib drops the connection's reference to it once the
    headers are read, and http.client offers no public way to reach it: the reader's SocketIO holds it."""
    reader = getattr(response, "fp", None)
    if hasattr(reader, "fp"):
        reader = reader.fp             # an HTTPError holds the HTTPResponse, which holds the reader
    sock = getattr(getattr(reader, "raw", None), "_sock", None)
    return sock if hasattr(sock, "settimeout") and hasattr(sock, "gettimeout") else None


def request_bytes(body: dict) -> bytes:
    """body as UTF-8 JSON; when it holds a lone surrogate (a model may send one back in a tool call's
    arguments, as the escape `\\ud800`, and the conversation repeats them), as ASCII JSON, which writes
    it as that same escape rather than failing: UTF-8 cannot encode it."""
    text = json.dumps(body, ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(body).encode()


def _parse_json(raw: bytes) -> dict:
    """A JSON object from a 2xx body, else LLMMalformed (also for one nested deeper than the parser goes, or
    holding NaN, Infinity or a key named twice: strict_json)."""
    try:
        data = strict_json(raw)
    except RecursionError:
        raise LLMMalformed(f"body is not JSON ({len(raw)} bytes)") from None
    except ValueError as error:
        raise LLMMalformed(f"body is not JSON ({len(raw)} bytes: {str(error)[:120]})") from None
    if not isinstance(data, dict):
        raise LLMMalformed("body is not a JSON object")
    return data


def _status_error(err: urllib.error.HTTPError, secrets: tuple[str, ...], deadline: float) -> LLMError:
    """The typed error for a non-2xx answer; its body (what arrives of its first 64 KiB before
    `deadline`, a time.monotonic() value) is parsed defensively (may be HTML)."""
    headers = err.headers
    if 300 <= err.code < 400:
        err.close()
        location = headers.get("location", "") if headers is not None else ""
        return RefusedRedirect(err.code, urllib.parse.urlsplit(location).hostname or "unknown host")
    try:
        raw = read_prefix(err, 65536, deadline)
    finally:
        err.close()
    etype, message, code = _error_fields(raw)
    should = (headers.get("x-should-retry") or "").lower() if headers is not None else ""
    return LLMStatus(err.code, etype, redact_line(message, secrets), retry_after(headers),
                      recorded_headers(headers), code, should)


def _error_fields(raw: bytes) -> tuple[str, str, str]:
    """(error type, message, code) from an Anthropic/OpenAI/Moonshot/OpenRouter error body."""
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError, RecursionError):
        return "", raw[:200].decode("utf-8", "replace"), ""
    if not isinstance(error, dict):
        return "", as_text(str(error or "")), ""
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    code = as_text(str(details.get("error_code") or error.get("code") or ""))
    return as_text(str(error.get("type") or code)), as_text(str(error.get("message") or "")), code


def _body_error(data: dict, default_status: int) -> LLMStatus:
    """LLMStatus for an error carried in a 2xx body (OpenRouter, proxies)."""
    error = data.get("error") if isinstance(data.get("error"), dict) else {}
    status = error.get("code") if isinstance(error.get("code"), int) else default_status
    return LLMStatus(status, as_text(str(error.get("type") or "")), redact_line(as_text(str(error.get("message") or ""))))


# ---------------------------------------------------------------------------------------------
# Circuit breaker: one per batch, shared by its Workers


@dataclass
class _Circuit:
    """One backend's recent record: consecutive 429/5xx answers, rested until (clock s), probe out."""
    failures: int = 0
    until: float = 0.0
    probing: bool = False
    last: str = ""


class Breaker:
    """A per-backend circuit breaker shared by every Worker of one batch; thread-safe.

    After `threshold` consecutive 429/5xx answers from a backend (counted over all its Workers),
    the backend is rested for the last answer's retry-after (else `rest_s`; at most MAX_REST_S
    seconds): no request goes there and each Worker moves straight to its next model, then its
    rules, recording the skip in the reply's attempts. When the rest is over, one call is let
    through as a probe: a 2xx closes the breaker, another 429/5xx rests the backend again. The
    factory makes one per station invocation (run --file, prove) and hands it to every Worker;
    `clock` (seconds, monotonic) is for tests."""

    def __init__(self, threshold: int = 3, rest_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._threshold, self._clock = threshold, clock
        self._rest_s = DEFAULT_REST_S if rest_s is None else rest_s
        self._circuits: dict[str, _Circuit] = {}
        self._lock = threading.Lock()

    def admit(self, backend: str) -> None:
        """Return when a request may go to backend now; raise Rested when it may not."""
        with self._lock:
            circuit = self._circuits.get(backend)
            if circuit is None or circuit.failures < self._threshold:
                return
            left = circuit.until - self._clock()
            if left <= 0 and not circuit.probing:
                circuit.probing = True         # this caller's request is the probe
                return
            count = f"after {circuit.failures} answers of {circuit.last}"
            detail = f"for {left:.1f} s more {count}" if left > 0 else f"(a probe is out) {count}"
            raise Rested(backend, detail, circuit.last)

    def record(self, backend: str, error: LLMError | None) -> None:
        """Note how one request to backend ended: None for a 2xx answer, else its error."""
        with self._lock:
            circuit = self._circuits.setdefault(backend, _Circuit())
            circuit.probing = False
            if error is None:
                circuit.failures = 0
            elif overloaded(error):
                circuit.failures += 1
                circuit.last = error.reason
                if circuit.failures >= self._threshold:
                    circuit.until = self._clock() + self._rest_for(error)

    def _rest_for(self, error: LLMError) -> float:
        """Seconds to rest: the server's retry-after when it sent one, else rest_s; capped."""
        after = getattr(error, "retry_after", None)
        return min(after if after is not None and after > 0 else self._rest_s, MAX_REST_S)


def overloaded(error: LLMError) -> bool:
    """True for a 429 or 5xx answer: the kind of failure that rests a backend."""
    return isinstance(error, LLMStatus) and (error.status == 429 or error.status >= 500)


# ---------------------------------------------------------------------------------------------
# Backends


class Offline:
    """Deterministic stand-in: rules(task_input) -> (calls, output); turn k < len(calls) makes call k.

    The rules run once, at the first turn, and their plan is kept for the rest of the run: they are
    a pure function of the task input, so re-running the whole triage at every step was waste."""

    def __init__(self, rules: Callable, task_input=None):
        self._rules, self._task_input = rules, task_input
        self._plan: tuple | None = None

    def plan(self) -> tuple:
        """(calls, output) from the rules, computed on first use."""
        if self._plan is None:
            self._plan = self._rules(self._task_input)
        return self._plan

    def complete(self, messages: list[dict], tools: list[dict] = ()) -> Reply:
        """Tool call `offline-<k>` on assistant turn k, then json.dumps(output) as text; no network."""
        start = time.monotonic()
        calls, output = self.plan()
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn < len(calls):
            name, args = calls[turn]
            tool_calls, text, stop = (ToolCall(f"offline-{turn}", name, dict(args)),), "", "tool_use"
        else:
            tool_calls, text, stop = (), json.dumps(output), "end"
        return Reply(text, tool_calls, {"input_tokens": 0, "output_tokens": 0}, 0.0, "offline", "offline",
                     (time.monotonic() - start) * 1000, stop_reason=stop, price="offline: the agent's rules cost nothing")


_WIRES = MappingProxyType({
    "anthropic": (anthropic_request, anthropic_reply),
    "openai": (openai_request, openai_reply),
})


def parse_reply(wire: str, data: dict, names: Mapping[str, str]) -> Parsed:
    """A 2xx body read in its wire dialect; shape errors become LLMMalformed, declines Declined."""
    try:
        return _WIRES[wire][1](data, names)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as err:
        raise LLMMalformed(f"{type(err).__name__} reading {wire} reply") from None


def reply_cost(route: Route, model_id: str, answered: str, usage: dict, headers: Mapping[str, str],
               declared: Mapping[str, Price]) -> tuple[float | None, str]:
    """(USD or None = unknown, where its price came from or why it is unknown: Reply.price) for one reply,
    priced by the model that answered (the response's `model` field), never by the one asked for when they
    differ; a reply that names no model is priced as asked. Under SageRoute the reply names the proxy's
    alias: it is priced by the model the proxy reports it routed to (an x-sageroute-model header, beside the
    documented tier/action/intervention/source), else by the reply's model field, else as `sageroute`, the
    alias, which a card may price in its `prices`. Ollama is self-hosted: 0.0."""
    if route.backend == "sageroute":
        priced = headers.get("x-sageroute-model") or answered or "sageroute"
    else:
        priced = model_id if route.backend == "ollama" else answered or model_id
    for form in (priced, _DATED.sub("", priced)) if route.backend in PROVIDERS and "/" not in priced else ():
        if (own := declared.get(f"{route.backend}/{form}")) is not None:   # a bare reply over a provider's route
            declared = {**declared, priced: own}                              # is that provider's declared id
            break
    row, cost = price_row(priced, declared), cost_usd(priced, usage, declared)
    if row is None:
        return None, f"unknown: no price for {priced}"
    if cost is None:
        return None, f"unknown: the reply from {priced} had no token counts"
    return cost, f"{priced}: {row.source}" + (f" ({row.as_of})" if row.as_of else "")


def attempt_record(model_id: str, backend: str, error: LLMError, retry_in_s: float | None = None) -> dict:
    """One failed attempt for Reply.attempts; never carries key material."""
    record = {"model": model_id, "backend": backend, "error": str(error), "retry_in_s": retry_in_s}
    if getattr(error, "headers", None):
        record["headers"] = dict(error.headers)
    return record


def _model_chain(model: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """Card models to try in order; stops at 'offline'; SageRoute gets one entry (the proxy picks)."""
    chain: list[str] = []
    for model_id in (model.get("primary"), model.get("fallback")):
        if not model_id:
            continue
        if model_id == "offline":
            break
        if model_id not in chain:
            chain.append(model_id)
    return chain[:1] if env.get("SAGEROUTE_URL") else chain


class Worker:
    """The agent's model: primary, then fallback, then offline rules; sticks with what answered."""

    def __init__(self, model: dict, env: Mapping[str, str], rules=None, task_input=None,
                 timeout: float = 60.0, sleep: Callable[[float], None] = time.sleep, max_tokens: int = 1024,
                 breaker: Breaker | None = None, deadline: float | None = None, run_id: str | None = None,
                 prices: Mapping[str, Mapping[str, float]] | None = None):
        """`breaker`: the batch's shared Breaker; None gives this Worker one of its own. `timeout` (s)
        bounds each socket read of a model call, `deadline` (s; None: twice `timeout`) the whole call.
        With a `run_id`, every request carries the traceparent of its call's chat span (traceparent).
        `prices`: the card's, {MODEL: {"input", "output"}} USD per million tokens, used before PRICES."""
        self._env = dict(env)
        self._prices = declared_prices(prices)
        self._breaker = breaker if breaker is not None else Breaker()
        self._chain = _model_chain(model, self._env)
        self._offline = Offline(rules, task_input) if rules is not None else None
        self._timeout, self._sleep, self._max_tokens = timeout, sleep, max_tokens
        self._deadline = deadline
        self._dead: dict[str, LLMError] = {}   # model id -> why this Worker stopped asking it
        self._routes: dict[str, Route | LLMError] = {}   # model id -> its route under _env, or why it has none
        self._rules_reason = ""                # set by use_rules: no model is asked again
        self._run_id, self._calls = run_id, 0  # complete() calls so far: the step whose span a request names

    @cached_property
    def _rng(self) -> random.Random:
        """The jitter of retry waits, seeded when the first retry waits: seeding reads 2.5 KB from the
        system's random source, which a batch of offline runs (one Worker each) need not pay per ticket."""
        return random.Random()

    @cached_property
    def _opener(self) -> urllib.request.OpenerDirector:
        """The HTTP opener, built when the first model is asked: a Worker that answers offline never
        needs one, and from Python 3.12 building one loads the system's CA certificates (tens of ms)."""
        return build_opener(self._env)

    def backend_for(self, model_id: str) -> str:
        """Which backend model_id would use under this Worker's env."""
        return backend_for(model_id, self._env)

    def planned_backend(self) -> str:
        """Backend of the next model with a key, 'offline', or 'offline-<reason>' after use_rules."""
        if self._rules_reason:
            return f"offline-{self._rules_reason}"
        model_id = self._next_model()
        return "offline" if model_id == "offline" else self.backend_for(model_id)

    def tier(self) -> str:
        """Which card model the next call goes to: 'primary', 'fallback' or 'offline'."""
        model_id = self._next_model()
        if model_id == "offline":
            return "offline"
        return "primary" if self._chain and model_id == self._chain[0] else "fallback"

    def switch_model(self) -> bool:
        """Stop asking the current model (the run gate's switch_model); True when another model remains."""
        current = self._next_model()
        if current == "offline":
            return False
        self._dead[current] = LLMError("switched away by the run gate")
        return self._next_model() != "offline"

    def estimate_next_cost(self, messages: list[dict], tools: list[dict]) -> float | None:
        """Upper-bound USD for the next call (input ~ chars/4, output = max_tokens); None = unknown.

        Under SageRoute the card's primary is priced, though the proxy may pick another tier. A free
        model (the rules, a local server) costs 0.0 whatever the size, so nothing is counted."""
        model_id = self._next_model()
        row = price_row(model_id, self._prices)
        if row is not None and row.input == row.output == 0 and row.long_above is None:
            return 0.0
        return estimate_cost(model_id, estimate_input_tokens(messages, tools), self._max_tokens, self._prices)

    def use_rules(self, reason: str) -> None:
        """Answer with the agent's rules for the rest of this run; no model is asked again.

        Every later reply's backend is 'offline-<reason>', never plain 'offline', so the trace says
        why: the factory calls use_rules(OVER_ENVELOPE) when the cost envelope cannot fit one model
        call. reason is a lowercase tag of words joined by '-'. Raises ValueError for another
        reason shape, or when this Worker was built without rules."""
        if not _REASON_TAG.fullmatch(reason):
            raise ValueError(f"use_rules reason must be lowercase words joined by '-', not {reason!r}")
        if self._offline is None:
            raise ValueError("this Worker has no offline rules to answer with")
        self._rules_reason = reason

    def complete(self, messages: list[dict], tools: list[dict]) -> Reply:
        """One answer from the first live model, else offline rules; raises the last LLMError without rules."""
        self._calls += 1
        if self._rules_reason:
            return replace(self._offline.complete(messages, tools), backend=f"offline-{self._rules_reason}")
        attempts: list[dict] = []
        for model_id in self._live():
            try:
                reply = self._ask(model_id, messages, tools, attempts)
            except LLMError as err:
                self._dead[model_id] = err
                attempts.append(attempt_record(model_id, self.backend_for(model_id), err))
                continue
            return replace(reply, attempts=tuple(attempts))
        return self._last_resort(messages, tools, attempts)

    def _live(self) -> list[str]:
        """Chain models not yet failed, in order (none after use_rules)."""
        if self._rules_reason:
            return []
        return [m for m in self._chain if m not in self._dead]

    def _next_model(self) -> str:
        """The first live model whose route resolves (has a key), else 'offline'."""
        for model_id in self._live():
            try:
                self._route(model_id)
            except LLMNoKey:
                continue
            except LLMError:
                pass
            return model_id
        return "offline"

    def _route(self, model_id: str) -> Route:
        """route_for under this Worker's env, worked out once per model (the env is the Worker's own copy, so
        the answer cannot change; a run asks it at every step); raises what route_for raised."""
        if model_id not in self._routes:
            try:
                self._routes[model_id] = route_for(model_id, self._env)
            except LLMError as err:
                self._routes[model_id] = err
        if isinstance(found := self._routes[model_id], LLMError):
            raise found.with_traceback(None)
        return found

    def _ask(self, model_id: str, messages: list[dict], tools: list[dict], attempts: list[dict]) -> Reply:
        """One model's answer, retried per policy; raises LLMError."""
        route = self._route(model_id)
        body = _WIRES[route.wire][0](route.model, messages, tools, self._max_tokens)
        if route.token_field != "max_tokens":
            body[route.token_field] = body.pop("max_tokens")
        if route.backend == "moonshot" and route.model.startswith("kimi-k2.5"):
            # K2.5 thinks by default: https://platform.moonshot.cn/docs/guide/use-kimi-k2-thinking-model
            body["thinking"] = {"type": "disabled"}
        data, headers, latency = self._post(route, model_id, body, attempts)
        got = parse_reply(route.wire, data, tool_names(tools))
        cost, priced = reply_cost(route, model_id, got.model, got.usage, headers, self._prices)
        return Reply(got.text, got.calls, got.usage, cost, got.model, route.backend, latency,
                     headers, stop_reason=got.stop, raw_stop_reason=got.raw_stop, requested=route.model, price=priced)

    def _post(self, route: Route, model_id: str, body: dict, attempts: list[dict]) -> tuple[dict, dict, float]:
        """post_json with up to MAX_RETRIES retries while the breaker admits them; each retried
        failure is appended to attempts. Raises Rested when the backend is resting."""
        retry = 0
        while True:
            self._breaker.admit(route.backend)
            headers = {**route.headers, "traceparent": traceparent(self._run_id, self._calls)} if self._run_id else route.headers
            try:
                answer = post_json(self._opener, route.url, headers, body, self._timeout, route.secrets,
                                   self._deadline)
            except LLMError as err:
                self._breaker.record(route.backend, err)
                wait = retry_wait(err, retry, self._rng)
                if wait is None:
                    raise
                attempts.append(attempt_record(model_id, route.backend, err, round(wait, 3)))
                self._sleep(wait)
                retry += 1
                continue
            self._breaker.record(route.backend, None)
            return answer

    def _last_resort(self, messages: list[dict], tools: list[dict], attempts: list[dict]) -> Reply:
        """Offline rules after every model failed; 'offline' alone when no model ever had a key."""
        failures = [e for e in self._dead.values() if not isinstance(e, LLMNoKey)]
        if self._offline is None:
            keyless = list(self._dead.values()) or [LLMNoKey("model and no offline rules")]
            raise (failures[-1] if failures else keyless[0]).with_traceback(None)
        reply = self._offline.complete(messages, tools)
        if not failures:
            return reply                       # key-less from the start: plainly offline
        return replace(reply, backend=f"offline-after-error: {failures[-1].reason}", attempts=tuple(attempts))


# ---------------------------------------------------------------------------------------------
# What the loop asks of a worker, and the scripted twin of a Worker


class AnyWorker:
    """What the factory's loop needs of a worker, written down (it need not inherit from this class): Worker
    (the card's models, then the agent's own rules) and Scripted (given replies: replay and tests) have it."""

    def complete(self, messages: list[dict], tools: list[dict]) -> Reply:
        """One answer to the conversation so far, offered these tool schemas."""

    def estimate_next_cost(self, messages: list[dict], tools: list[dict]) -> float | None:
        """Upper bound in USD of the next complete(); None when unknown (never within an envelope)."""

    def tier(self) -> str:
        """Which model the next call goes to (primary, fallback, offline, ...), for run-gate records."""

    def switch_model(self) -> bool:
        """Stop asking the current model (the run gate's switch_model); True when another one remains."""

    def use_rules(self, reason: str) -> None:
        """Answer the rest of the run with the agent's rules (backend offline-REASON); ValueError when none."""


class Scripted:
    """A worker that answers with the replies it was given, in order, and keeps what it was sent: no
    network, no key. Replay feeds it the replies recorded in a trace; tests script a model with it.

    It has the Worker's five methods. When the replies run out, `complete` raises `exhausted()`
    (default: an LLMError), so the caller decides what running past the script means."""

    def __init__(self, replies, exhausted: Callable[[], Exception] | None = None):
        self._replies = list(replies)
        self._exhausted = exhausted or (lambda: LLMError("no scripted reply left", "script ended"))
        self.sent: list[tuple[list[dict], list[dict]]] = []   # (messages, tools) of each complete() call

    def estimate_next_cost(self, messages: list[dict], tools: list[dict]) -> float:
        """A scripted reply costs nothing now."""
        return 0.0

    def complete(self, messages: list[dict], tools: list[dict]) -> Reply:
        """The next reply; raises exhausted() when none is left."""
        self.sent.append(([dict(m) for m in messages], list(tools)))
        if not self._replies:
            raise self._exhausted()
        return self._replies.pop(0)

    def tier(self) -> str:
        """Always 'scripted'."""
        return "scripted"

    def switch_model(self) -> bool:
        """There is no other model to switch to."""
        return False

    def use_rules(self, reason: str) -> None:
        """A scripted worker has no rules to answer with: ValueError, as from a Worker without rules."""
        raise ValueError("a scripted worker has no offline rules to answer with")


# ---------------------------------------------------------------------------------------------
# OpenTelemetry: one run's trace as OTLP spans, sent over OTLP/HTTP (protobuf or JSON)
#
# Settings as every OpenTelemetry SDK reads them (https://opentelemetry.io/docs/specs/otel/protocol/exporter/);
# the message layout of opentelemetry-proto (opentelemetry/proto/trace/v1/trace.proto, common/v1/common.proto,
# collector/trace/v1/trace_service.proto) and its JSON mapping (docs/specification.md: ids as hex, 64-bit
# integers as strings); span and attribute names of the GenAI semantic conventions
# (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/, gen-ai-agent-spans/). Message content
# (the ticket, outputs, tool arguments and results) is opt-in there, and here. The factory documents each
# OTEL_* variable read below in its --help.

OTLP_TYPES = MappingProxyType(dict(zip(CHOICES["OTEL_EXPORTER_OTLP_PROTOCOL"], ("application/x-protobuf", "application/json"))))
EXPORT_TIMEOUT_MS, MAX_EXPORT_TIMEOUT_MS = 2000, 10000
SPAN_INTERNAL, SPAN_CLIENT = 1, 3         # trace.proto Span.SpanKind
STATUS_ERROR = 2                          # trace.proto Status.StatusCode (0 unset)
SCOPE = ("agent-factory", "1")            # the instrumentation scope's name and version


@dataclass(frozen=True)
class Otlp:
    """Where and how runs are exported. `problem` says why nothing can be sent with these settings
    ('' when something can): the export is then noted in the trace as failed, with that reason."""
    url: str
    protocol: str                           # one of OTLP_TYPES
    headers: tuple[tuple[str, str], ...]    # sent, never recorded: their values count as secrets
    resource: tuple[tuple[str, str], ...]   # service.name first
    content: bool                           # message content exported (opt-in)
    timeout_s: float                        # bounds the whole export: connect, send, answer
    problem: str = ""


def otlp_settings(env: Mapping[str, str]) -> Otlp | None:
    """The export settings in env (OTEL_* variables: a traces endpoint wins over the base endpoint, + /v1/traces),
    or None when no endpoint is set: then nothing is exported."""
    url = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
    base = (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    if not (url or base):
        return None
    url = url or base.rstrip("/") + "/v1/traces"
    protocol = choice(env, "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    headers, bad_headers = _otel_pairs(env.get("OTEL_EXPORTER_OTLP_HEADERS"))
    resource, bad_resource = _otel_pairs(env.get("OTEL_RESOURCE_ATTRIBUTES"))
    service = (env.get("OTEL_SERVICE_NAME") or dict(resource).get("service.name") or SCOPE[0]).strip()
    timeout = _finite_ms(env.get("OTEL_EXPORTER_OTLP_TIMEOUT"))
    problems = [f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not {' or '.join(OTLP_TYPES)}"] * (protocol not in OTLP_TYPES)
    problems += [f"the OTLP endpoint {redact_line(url)!r} is not an http(s) URL"] * (urllib.parse.urlsplit(url).scheme not in ("http", "https"))
    problems += [f"{name} holds an entry that is not key=value" for name, bad in
                 (("OTEL_EXPORTER_OTLP_HEADERS", bad_headers), ("OTEL_RESOURCE_ATTRIBUTES", bad_resource)) if bad]
    problems += [f"OTEL_EXPORTER_OTLP_HEADERS: header {name!r} (its value not shown) {why}" for name, value in headers
                 if (why := "is no header name" if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name) else key_problem(value))]
    problems += ["OTEL_EXPORTER_OTLP_TIMEOUT is not a number of milliseconds"] * (timeout is None)
    resource = (("service.name", service),) + tuple(kv for kv in resource if kv[0] != "service.name")
    return Otlp(url, protocol, headers, resource,
                (env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT") or "").strip().lower() == "true",
                min(timeout or EXPORT_TIMEOUT_MS, MAX_EXPORT_TIMEOUT_MS) / 1000, "; ".join(problems))


def _otel_pairs(text: str | None) -> tuple[tuple[tuple[str, str], ...], bool]:
    """(key, value) pairs of a W3C-baggage-like list `k=v,k2=v2` (values percent-decoded), and whether an
    entry was not key=value (it is left out)."""
    pairs, bad = [], False
    for entry in filter(str.strip, (text or "").split(",")):
        key, equals, value = entry.partition("=")
        if not (equals and key.strip()):
            bad = True
            continue
        pairs.append((key.strip(), urllib.parse.unquote(value.strip())))
    return tuple(pairs), bad


def _finite_ms(text: str | None) -> float | None:
    """A positive number of milliseconds (EXPORT_TIMEOUT_MS when unset), or None when it is not one."""
    try:
        value = float(text) if text and text.strip() else float(EXPORT_TIMEOUT_MS)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def trace_id(run_id: str) -> str:
    """The OpenTelemetry trace id (32 hex) of a run: the same for every export of it, and for its model calls."""
    return hashlib.sha256(f"trace {run_id}".encode()).hexdigest()[:32]


def span_id(run_id: str, part: str) -> str:
    """The span id (16 hex) of one part of a run: `root`, `chat STEP`, `tool SEQ`, `gate`, `run_gate N`."""
    return hashlib.sha256(f"span {run_id} {part}".encode()).hexdigest()[:16]


def traceparent(run_id: str, step: int) -> str:
    """The W3C traceparent of a run's model call number `step` (https://www.w3.org/TR/trace-context/):
    the call's chat span is its parent, sampled."""
    return f"00-{trace_id(run_id)}-{span_id(run_id, f'chat {step}')}-01"


@dataclass(frozen=True)
class Span:
    """One OTLP span of a run: ids as hex, times in ns since the epoch, attributes in order."""
    span_id: str
    parent_id: str             # '' for the run's root span
    name: str
    kind: int                  # SPAN_INTERNAL or SPAN_CLIENT
    start_ns: int
    end_ns: int
    attributes: tuple[tuple[str, object], ...]   # values: str, bool, int, float, or a tuple of str
    error: str = ""            # the status message of a span that failed ('' = unset)


def run_spans(events: list[dict], content: bool) -> list[Span]:
    """The spans of one run from its trace events as the factory records them (header first, then each event
    with `event` and `at`, ISO 8601 UTC): the root `invoke_agent AGENT` span, one `chat MODEL` per `model`
    event, one `execute_tool TOOL` per `tool` event, one `gate` per `gate` event, one `run_gate` per
    `run_gate` event. A model or tool event ends at its `at` and began `latency_ms` or `ms` before; a gate
    began with the event before it. Events written before events carried a time take the run's start; the
    root span then says so (factory.times = header-only). Without `content`, no text of the ticket, the
    output, the model or a tool is in any span (the GenAI conventions' opt-in)."""
    header, run_id = events[0], str(events[0].get("run_id"))
    start = previous = _ns(header.get("at"), 0)
    end = next((e for e in events if e.get("event") == "end"), {})
    results = {e.get("seq"): e for e in events if e.get("event") == "tool_result"}
    spans, untimed, steps = [], False, 0
    for event in events[1:]:
        kind, at = event.get("event"), _ns(event.get("at"), None)
        untimed |= at is None
        at = previous if at is None else at
        if kind == "model":
            steps += 1
            spans.append(_chat_span(run_id, event, steps, at, content))
        elif kind == "tool":
            spans.append(_tool_span(run_id, event, results.get(event.get("seq"), {}), at, content))
        elif kind in ("gate", "run_gate"):
            fields = ("result", "p", "bar", "answer") if kind == "gate" else ("action", "p", "source", "tier", "detectors")
            part = "gate" if kind == "gate" else f"run_gate {len(spans)}"
            spans.append(Span(span_id(run_id, part), "", kind, SPAN_INTERNAL, previous, at,
                              _present({f"factory.{kind}.{name}": event.get(name) for name in fields}),
                              "the gate failed" if event.get("result") == "failed" else ""))
        previous = max(previous, at)
    root = span_id(run_id, "root")
    agent = str(header.get("agent"))
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent, "gen_ai.conversation.id": run_id,
                  "factory.verdict": end.get("verdict"), "factory.status": end.get("status"),
                  "factory.tier": header.get("tier"), "factory.certified_tier": header.get("certified_tier"),
                  "factory.digest": header.get("digest"), "factory.ticket": header.get("ticket"),
                  "factory.gate.result": end.get("gate"), "factory.cost_usd": end.get("cost_usd"),
                  "factory.routed": end.get("routed"), "factory.times": "header-only" if untimed else None}
    if content:
        attributes.update({"gen_ai.input.messages": _messages("user", header.get("input")),
                           "gen_ai.output.messages": _messages("assistant", end.get("output")),
                           "factory.reason": end.get("reason")})
    error = f"run {end.get('status')}" if end.get("status") in ("crashed", "over-budget", "escalated") else ""
    return [Span(root, "", f"invoke_agent {agent}", SPAN_INTERNAL, start, max(previous, _ns(end.get("at"), previous)),
                 _present(attributes), error)] + [replace(span, parent_id=root) for span in spans]


def _chat_span(run_id: str, event: dict, step: int, at: int, content: bool) -> Span:
    """The `chat` span of one model event (its step-th model call: the span its traceparent named)."""
    usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
    requested = event.get("requested") or event.get("model")
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": str(event.get("backend", "")).split(":")[0],
                  "gen_ai.request.model": requested, "gen_ai.response.model": event.get("model"),
                  "gen_ai.usage.input_tokens": usage.get("input_tokens"),
                  "gen_ai.usage.output_tokens": usage.get("output_tokens"),
                  "gen_ai.response.finish_reasons": (event.get("raw_stop_reason") or event.get("stop_reason") or "",),
                  "factory.backend": event.get("backend"), "factory.cost_usd": event.get("cost_usd"),
                  "factory.attempts": len(event.get("attempts") or ())}
    if content:
        attributes["gen_ai.output.messages"] = _messages("assistant", event.get("text"), event.get("tool_calls"))
    return Span(span_id(run_id, f"chat {step}"), "", f"chat {requested}", SPAN_CLIENT,
                _before(at, event.get("latency_ms")), at, _present(attributes))


def _tool_span(run_id: str, event: dict, result: dict, at: int, content: bool) -> Span:
    """The `execute_tool` span of one tool event, with the broker's ruling (and the result text, with content)."""
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.get("tool"),
                  "gen_ai.tool.type": "function", "gen_ai.tool.call.id": result.get("tool_call_id"),
                  "factory.ruling": event.get("ruling"), "factory.effect": event.get("effect"),
                  "error.type": event.get("error") if event.get("ok") is False else None}
    if content:
        attributes.update({"gen_ai.tool.call.arguments": as_text(json.dumps(event.get("args"), ensure_ascii=False)),
                           "gen_ai.tool.call.result": result.get("content")})
    return Span(span_id(run_id, f"tool {event.get('seq')}"), "", f"execute_tool {event.get('tool')}", SPAN_INTERNAL,
                _before(at, event.get("ms")), at, _present(attributes), str(event.get("error") or "") if event.get("ok") is False else "")


def _messages(role: str, text, calls=None) -> str:
    """The GenAI conventions' message list (JSON text) of one message: its text part, then any tool calls."""
    parts = [] if text in (None, "") else [{"type": "text", "content": text if isinstance(text, str) else as_text(json.dumps(text, ensure_ascii=False))}]
    parts += [{"type": "tool_call", "id": c.get("id"), "name": c.get("name"), "arguments": c.get("args")}
              for c in calls or () if isinstance(c, dict)]
    return as_text(json.dumps([{"role": role, "parts": parts}], ensure_ascii=False))


def _before(at: int, ms) -> int:
    """at (ns) less a duration in ms, when ms is a duration (a number from 0 to a day); else at."""
    if isinstance(ms, (int, float)) and not isinstance(ms, bool) and 0 <= ms <= 86_400_000:
        return at - int(ms * 1e6)
    return at


def _present(attributes: dict) -> tuple:
    """The attributes whose value is set: None is left out, as OTLP has no null."""
    return tuple((key, value) for key, value in attributes.items() if value is not None)


def _ns(stamp, default):
    """ns since the epoch of an ISO 8601 time, or default when it is none."""
    from datetime import datetime
    try:
        moment = datetime.fromisoformat(stamp)
    except (TypeError, ValueError):
        return default
    return int(moment.timestamp()) * 10 ** 9 + moment.microsecond * 1000


def otlp_body(settings: Otlp, run_id: str, spans: list[Span]) -> bytes:
    """One ExportTraceServiceRequest holding the run's spans, encoded as settings.protocol says."""
    if settings.protocol == "http/json":
        return _json_request(settings, trace_id(run_id), spans)
    return _proto_request(settings, bytes.fromhex(trace_id(run_id)), spans)


def send_otlp(opener, settings: Otlp, body: bytes) -> None:
    """POST one export to settings.url within settings.timeout_s, headers and all; raises LLMError
    (LLMStatus, LLMTimeout, ConnectionFailed, ...) with no header value in its text."""
    if settings.problem:
        raise LLMError(settings.problem)
    secrets = tuple(value for _, value in settings.headers if value)
    post_bytes(opener, settings.url, {"content-type": OTLP_TYPES[settings.protocol], **dict(settings.headers)},
               body, settings.timeout_s, secrets, settings.timeout_s, limit=65536)


def _json_request(settings: Otlp, trace: str, spans: list[Span]) -> bytes:
    """OTLP/JSON: proto3's JSON mapping with lowerCamelCase names, ids as hex, 64-bit integers as strings."""
    def span(s: Span) -> dict:
        out = {"traceId": trace, "spanId": s.span_id, "name": s.name, "kind": s.kind,
               "startTimeUnixNano": str(s.start_ns), "endTimeUnixNano": str(s.end_ns),
               "attributes": _json_attributes(s.attributes)}
        out.update({"parentSpanId": s.parent_id} if s.parent_id else {})
        out.update({"status": {"code": STATUS_ERROR, "message": s.error}} if s.error else {})
        return out
    return as_text(json.dumps({"resourceSpans": [{
        "resource": {"attributes": _json_attributes(settings.resource)},
        "scopeSpans": [{"scope": {"name": SCOPE[0], "version": SCOPE[1]}, "spans": [span(s) for s in spans]}]}]},
        ensure_ascii=False)).encode()


def _json_attributes(pairs) -> list[dict]:
    """KeyValue list in OTLP/JSON."""
    return [{"key": key, "value": _json_value(value)} for key, value in pairs]


def _json_value(value) -> dict:
    """An AnyValue in OTLP/JSON."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (tuple, list)):
        return {"arrayValue": {"values": [_json_value(v) for v in value]}}
    return {"stringValue": as_text(str(value))}


def _proto_request(settings: Otlp, trace: bytes, spans: list[Span]) -> bytes:
    """OTLP/protobuf: ExportTraceServiceRequest{1: ResourceSpans{1: Resource, 2: ScopeSpans{1: scope, 2: spans}}}."""
    def span(s: Span) -> bytes:
        status = _pb(15, _pb(2, s.error.encode()) + _field_key(3, 0) + _varint(STATUS_ERROR)) if s.error else b""
        return (_pb(1, trace) + _pb(2, bytes.fromhex(s.span_id)) + (_pb(4, bytes.fromhex(s.parent_id)) if s.parent_id else b"")
                + _pb(5, s.name.encode()) + _field_key(6, 0) + _varint(s.kind)
                + _field_key(7, 1) + s.start_ns.to_bytes(8, "little") + _field_key(8, 1) + s.end_ns.to_bytes(8, "little")
                + b"".join(_pb(9, _proto_pair(k, v)) for k, v in s.attributes) + status)
    resource = _pb(1, b"".join(_pb(1, _proto_pair(k, v)) for k, v in settings.resource))
    scope = _pb(1, _pb(1, SCOPE[0].encode()) + _pb(2, SCOPE[1].encode()))
    return _pb(1, resource + _pb(2, scope + b"".join(_pb(2, span(s)) for s in spans)))


def _proto_pair(key: str, value) -> bytes:
    """A KeyValue{1: key, 2: AnyValue}."""
    return _pb(1, key.encode()) + _pb(2, _proto_value(value))


def _proto_value(value) -> bytes:
    """An AnyValue: 1 string, 2 bool, 3 int64, 4 double, 5 ArrayValue{1: values}."""
    import struct
    if isinstance(value, bool):
        return _field_key(2, 0) + _varint(int(value))
    if isinstance(value, int):
        return _field_key(3, 0) + _varint(value & (2 ** 64 - 1))   # int64 as two's complement
    if isinstance(value, float):
        return _field_key(4, 1) + struct.pack("<d", value)
    if isinstance(value, (tuple, list)):
        return _pb(5, b"".join(_pb(1, _proto_value(v)) for v in value))
    return _pb(1, as_text(str(value)).encode())


def _pb(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _field_key(number, 2) + _varint(len(payload)) + payload


def _field_key(number: int, wire: int) -> bytes:
    """A field's key: number and wire type (0 varint, 1 fixed64, 2 length-delimited)."""
    return _varint(number << 3 | wire)


def _varint(n: int) -> bytes:
    """n (>= 0) as a base-128 varint, low groups first."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)
