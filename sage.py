"""Decision-model client: Levanto Sage `/decide` + `/decide/batch`, and System One `/v1/systemone`.

Wire formats follow the vendors' own material: the Sage OpenAPI document 1.1.0 (served at
https://sage.levanto.ai/openapi.json; the copy levanto-py tests against:
https://github.com/levantolabs/levanto-py/blob/40cd720b40657e00ba480ca1eb4ec94845f5715b/tests/data/openapi.json),
the levanto-py client (https://github.com/levantolabs/levanto-py, src/levanto/_core.py), and for
System One the TypeSafe docs (https://docs.typesafe.ai) and Sage's System One adapter
(https://github.com/celesteanglm/decision-models-skills/blob/52e0cc8d81c9885023a2f1b56427e211edb905ef/src/decision_models/providers/sage.py).
This module returns probabilities and never decides what they mean for a run; it never
prints, never reads os.environ (callers pass an `env` mapping) and keeps no mutable
module-level state.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from broker import as_text
from llm import CHOICES, BodyTooLarge, DeadlinePassed, choice, read_bounded, read_prefix, strict_json

# The edge WAF answers 403 to `Python-urllib/x.y` even with a good key (field notes:
# https://github.com/clawdbotatg/clawd-research/tree/1856fb790b545f9121e51a16deb66ab22e2c7c14/levanto-sage).
USER_AGENT = "agent-factory/0.1 (+python-urllib)"
DEFAULT_ENDPOINT = "https://sage.levanto.ai"
DEFAULT_SYSTEMONE_MODEL = "levanto-sage-v1.3"         # the model Sage serves at its own /v1/systemone
PROTOCOLS = CHOICES["SAGE_PROTOCOL"]
KINDS = ("yesno", "choice", "scale", "tags", "sort")
BATCH_MAX = 16                                        # Levanto's stated cap per batch call (Aug 2026)
MAX_BODY = 4 * 1024 * 1024                            # the cap decision-models-skills' transport uses
RETRYABLE = frozenset({429, 500, 502, 503, 504})      # levanto-py _core.py RETRYABLE_STATUSES
RETRY_AFTER_CAP = 30.0                                # levanto-py clamps Retry-After to 0-30 s
DETAIL_MAX = 300                                      # characters of server detail kept in a message
PROBE_CONTENT = "The sky is blue on a clear day."
PROBE_QUESTION = "Does this sentence talk about the sky?"

# One hint per status; the `{"detail": ...}` body is appended to it.
STATUS_HINTS = MappingProxyType({
    400: "request rejected",
    401: "the key was refused",
    402: "the allowance is used up",
    403: "check the User-Agent (edge blocks default clients even with a good key)",
    404: "no such route (check SAGE_ENDPOINT)",
    422: "request rejected",
    429: "rate limited",
    503: "the model is loading (or the content is too long)",
})


# ---------------------------------------------------------------- errors

class SageError(Exception):
    """Base of every failure to get a decision; str() is one line and never holds the key."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class NoKey(SageError):
    """No credentials configured, so no request was sent."""

    def __init__(self, message: str = "no SAGE_API_KEY"):
        super().__init__(message)


class Misconfigured(SageError):
    """The env names something this client cannot use (protocol, endpoint scheme)."""


class HTTPStatus(SageError):
    """A non-2xx answer: `status` (int), `detail` (server text), `retry_after` (s or None)."""

    def __init__(self, status: int, detail: str = "", retry_after: float | None = None):
        self.status, self.detail, self.retry_after = status, detail, retry_after
        tail = f": {detail}" if detail else ""
        super().__init__(f"HTTP {status} — {status_hint(status)}{tail}")


class Timeout(SageError):
    """No answer within `seconds`; never retried, since a slow call may still be billed."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"timeout {seconds:g}s")


class Malformed(SageError):
    """The server answered 2xx with something that is not the documented shape."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"malformed response: {reason}")


class Unreachable(SageError):
    """No HTTP answer at all: DNS, refused connection, reset, TLS."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"unreachable: {reason}")


class Rejected(SageError):
    """One question failed on its own (batch `ok: false`, System One refusal, unsupported kind)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"question failed: {reason}")


def status_hint(status: int) -> str:
    """Short cause for an HTTP status, as the factory's gate line shows it."""
    if status in STATUS_HINTS:
        return STATUS_HINTS[status]
    if 300 <= status < 400:
        return "redirect refused (check SAGE_ENDPOINT)"
    return "server error" if status >= 500 else "unexpected status"


# ---------------------------------------------------------------- values

@dataclass(frozen=True)
class Answer:
    """One answer. `answer`: "yes"/"no"/None (None = unsure; yesno only); `p`: P(yes) for yesno,
    P(chosen) for choice; `expectation`: 0..4 for scale; `tags`: {id: {"p", "applies"}};
    `order`: sorted item indices (or ids); `probabilities`: choice option -> p (Levanto's are
    independent and do not sum to 1) or System One level -> p; `model`: meta.model."""
    kind: str
    answer: str | None = None
    p: float | None = None
    chosen: str | None = None
    expectation: float | None = None
    tags: dict | None = None
    order: list | None = None
    raw: dict = field(default_factory=dict, repr=False)
    confidence: float | None = None
    probabilities: dict | None = None
    model: str | None = None


@dataclass(frozen=True)
class Question:
    """One question. choice `options`: names or {"option", "description"?}; scale `levels`:
    exactly five, names or {"level": 0..4, "description"?}; `tags`: ids or {"id", "name"?}.
    Raises ValueError on shapes the server would answer with 400."""
    kind: str
    instructions: str = ""
    options: tuple = ()
    levels: tuple = ()
    tags: tuple = ()

    def __post_init__(self):
        levels = sorted((_level(n, item) for n, item in enumerate(self.levels)),
                        key=lambda level: level["level"])
        object.__setattr__(self, "options", tuple(_option(item) for item in self.options))
        object.__setattr__(self, "levels", tuple(levels))
        object.__setattr__(self, "tags", tuple(_tag(item) for item in self.tags))
        _check_question(self)


def _option(item) -> dict:
    """A choice option as {"option": str, "description"?: str}."""
    if isinstance(item, str):
        return {"option": item}
    if isinstance(item, Mapping) and isinstance(item.get("option"), str):
        return dict(item)
    raise ValueError(f"choice option must be a name or {{'option': name}}, not {item!r}")


def _level(position: int, item) -> dict:
    """A scale level as {"level": 0..4, "description"?: str}; a bare string takes its position."""
    if isinstance(item, str):
        return {"level": position, "description": item}
    if isinstance(item, Mapping) and type(item.get("level")) is int:
        return dict(item)
    raise ValueError(f"scale level must be a description or {{'level': n}}, not {item!r}")


def _tag(item) -> dict:
    """A tag as {"id": str, "name"?: str}."""
    if isinstance(item, str):
        return {"id": item}
    if isinstance(item, Mapping) and isinstance(item.get("id"), str):
        return dict(item)
    raise ValueError(f"tag must be an id or {{'id': id}}, not {item!r}")


def _check_question(question: Question) -> None:
    """Raise ValueError unless the question fits Sage's limits: 2-120 options, exactly 5 levels, 1-120 tags."""
    kind, extras = question.kind, (question.options, question.levels, question.tags)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if not isinstance(question.instructions, str):
        raise ValueError("instructions must be a string")
    if kind != "tags" and not question.instructions.strip():
        raise ValueError(f"a {kind} question needs instructions")
    wanted = {"choice": 0, "scale": 1, "tags": 2}.get(kind)
    if any(extra for n, extra in enumerate(extras) if n != wanted):
        raise ValueError(f"a {kind} question takes no other options, levels or tags")
    if kind == "choice":
        _check_names([o["option"] for o in question.options], 2, 120, "choice options")
    if kind == "scale" and [lv["level"] for lv in question.levels] != [0, 1, 2, 3, 4]:
        raise ValueError("scale needs exactly five levels numbered 0..4")
    if kind == "tags":
        _check_names([t["id"] for t in question.tags], 1, 120, "tags")


def _check_names(names: list, low: int, high: int, what: str) -> None:
    """Raise ValueError unless low <= len(names) <= high and the names are unique."""
    if not low <= len(names) <= high:
        raise ValueError(f"{what}: need {low}..{high}, got {len(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{what}: names must be unique")


# ---------------------------------------------------------------- content

def _content(content) -> Any:
    """Levanto content: text as is, a list of strings as list content with ids "0".."n-1"
    (Levanto's list content), a dict passed through as a content object."""
    if isinstance(content, str) or isinstance(content, Mapping):
        return content
    if isinstance(content, (list, tuple)) and all(isinstance(item, str) for item in content):
        return {"kind": "list", "value": [{"id": str(n), "content": item}
                                          for n, item in enumerate(content)]}
    raise ValueError("content must be text, a list of strings or a content object")


def _check_content(content, question: Question) -> None:
    """Raise ValueError when sort lacks 2..120 list items or another kind gets a list."""
    is_list = isinstance(content, (list, tuple))
    if question.kind == "sort" and not (is_list and 2 <= len(content) <= 120):
        raise ValueError("sort needs a list of 2..120 items")
    if question.kind != "sort" and is_list:
        raise ValueError(f"a {question.kind} question needs text content, not a list")
    _content(content)


def _content_key(content) -> str:
    """A stable key for grouping equal contents in a batch."""
    return json.dumps(content, sort_keys=True, ensure_ascii=False)


# ---------------------------------------------------------------- Levanto wire format

def levanto_question(question: Question, qid: str) -> dict:
    """The `question` object of a /decide body; only documented fields are sent (unknown ones are a 400)."""
    body = {"id": qid, "kind": question.kind}
    if question.instructions:
        body["instructions"] = question.instructions
    for name in ("options", "levels", "tags"):
        if getattr(question, name):
            body[name] = [dict(item) for item in getattr(question, name)]
    return body


def levanto_decision(envelope, question: Question, content) -> Answer:
    """Answer from a single-decide envelope {id, kind, result, meta}; accepts the v0.6 shape
    (with `confidence`) and v1.1 (nullable answer/chosen/applies)."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("result"), dict):
        raise Malformed("no result object")
    if envelope.get("kind", question.kind) != question.kind:
        raise Malformed(f"asked {question.kind}, got {envelope.get('kind')!r}")
    fields = LEVANTO_PARSERS[question.kind](envelope["result"], question, content)
    meta = envelope.get("meta") if isinstance(envelope.get("meta"), dict) else {}
    return Answer(kind=question.kind, raw=envelope, model=meta.get("model"), **fields)


def _levanto_yesno(result: dict, question: Question, content) -> dict:
    """yesno: `probability` = P(yes), always a number; `answer` yes/no/null (null = unsure)."""
    answer = result.get("answer")
    if answer not in ("yes", "no", None):
        raise Malformed(f"yesno answer {answer!r}")
    return {"answer": answer, "p": _prob(result.get("probability"), "probability"),
            "confidence": _prob(result.get("confidence"), "confidence", nullable=True)}


def _levanto_choice(result: dict, question: Question, content) -> dict:
    """choice: `chosen` and `probability` may be null; v0.6 had no `probability`."""
    names = [option["option"] for option in question.options]
    chosen = result.get("chosen")
    if chosen is not None and chosen not in names:
        raise Malformed(f"chosen {chosen!r} is not an option")
    probabilities = _choice_probabilities(result.get("probabilities"))
    p = result.get("probability")
    if "probability" not in result and chosen is not None and probabilities:
        p = probabilities.get(chosen)
    return {"chosen": chosen, "p": _prob(p, "probability", nullable=True),
            "probabilities": probabilities,
            "confidence": _prob(result.get("confidence"), "confidence", nullable=True)}


def _choice_probabilities(value) -> dict | None:
    """Option -> p from [{option, probability}] (v1.1) or a plain {option: p} map."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {str(name): _prob(p, f"probability of {name}") for name, p in value.items()}
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return {str(item.get("option")): _prob(item.get("probability"), "option probability")
                for item in value}
    raise Malformed("choice probabilities are neither a list nor a map")


def _levanto_scale(result: dict, question: Question, content) -> dict:
    """scale: `expectation` in 0..4 plus `confidence` (peakedness); no distribution."""
    return {"expectation": _number(result.get("expectation"), "expectation", 0.0, 4.0),
            "confidence": _prob(result.get("confidence"), "confidence", nullable=True)}


def _levanto_tags(result: dict, question: Question, content) -> dict:
    """tags: [{id, probability, applies}] with `applies` true/false/null."""
    entries = result.get("tags")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise Malformed("tags is not a list of objects")
    tags = {}
    for entry in entries:
        applies = entry.get("applies")
        if applies not in (True, False, None) or not isinstance(entry.get("id"), str):
            raise Malformed(f"tag entry {entry!r}")
        tags[entry["id"]] = {"p": _prob(entry.get("probability"), "tag probability"),
                                      "applies": applies}
    return {"tags": tags}


def _levanto_sort(result: dict, question: Question, content) -> dict:
    """sort: `sorted` item ids, `confidence` may be null."""
    ids = result.get("sorted")
    if not isinstance(ids, list):
        raise Malformed("sorted is not a list")
    return {"order": _sort_order(ids, content),
            "confidence": _prob(result.get("confidence"), "confidence", nullable=True)}


def _sort_order(ids: list, content) -> list:
    """Item indices for a list of strings we numbered "0".."n-1"; the ids themselves otherwise."""
    if not isinstance(content, (list, tuple)):
        return list(ids)
    expected = [str(n) for n in range(len(content))]
    if sorted(map(str, ids)) != sorted(expected):
        raise Malformed("sorted ids do not match the items sent")
    return [int(item) for item in ids]


LEVANTO_PARSERS = MappingProxyType({
    "yesno": _levanto_yesno, "choice": _levanto_choice, "scale": _levanto_scale,
    "tags": _levanto_tags, "sort": _levanto_sort,
})


def _levanto_answer(answer, question: Question, content, qid: str) -> Answer | SageError:
    """One batch answer: check `ok`, then read the nested single-decide envelope."""
    if not isinstance(answer, dict) or "ok" not in answer:
        return Malformed("batch answer without ok")
    if answer["ok"] is not True:
        return Rejected(str(answer.get("error") or "no reason given"))
    envelope = answer.get("result")
    if isinstance(envelope, dict) and envelope.get("id", qid) != qid:
        return Malformed(f"answer for {envelope.get('id')!r} in the slot of {qid}")
    try:
        return levanto_decision(envelope, question, content)
    except Malformed as error:
        return error


def _levanto_group(group, part: list) -> list:
    """(input index, Answer | SageError) for one group; answers[j] is questions[j]."""
    answers = group.get("answers") if isinstance(group, dict) else None
    if not isinstance(answers, list) or len(answers) != len(part):
        error = Malformed(f"expected {len(part)} answers in a group")
        return [(index, error) for index, _, _ in part]
    return [(index, _levanto_answer(answer, question, content, f"q{j}"))
            for j, ((index, content, question), answer) in enumerate(zip(part, answers))]


# ---------------------------------------------------------------- System One wire format

def systemone_questions(question: Question, name: str) -> dict:
    """The `questions` map entries for one question: yesno -> noul,
    choice -> choice with criteria, scale -> score with five criteria, tags -> one noul each.
    Raises Rejected for sort, which System One does not have."""
    base = {"instructions": question.instructions}
    if question.kind == "yesno":
        return {name: {"type": "noul", **base}}
    if question.kind == "choice":
        criteria = {o["option"]: o.get("description") for o in question.options}
        return {name: {"type": "choice", **base, "criteria": criteria}}
    if question.kind == "scale":
        criteria = [lv.get("description") or f"level {lv['level']}" for lv in question.levels]
        return {name: {"type": "score", **base, "criteria": criteria}}
    if question.kind == "tags":
        return {f"{name}_tag{n}": {"type": "noul", "instructions": _tag_instructions(question, tag)}
                for n, tag in enumerate(question.tags)}
    raise Rejected("sort is not available over System One")


def _tag_instructions(question: Question, tag: dict) -> str:
    """The yes/no text that stands in for one Levanto tag on a System One backend."""
    text = f"Does the tag '{tag.get('name') or tag['id']}' apply?"
    return f"{question.instructions.strip()} {text}".strip()


def systemone_decision(reply: dict, question: Question, name: str) -> Answer:
    """Answer from a System One reply's `answers`. System One has no abstention:
    yesno answer is "yes" when noul >= 0.5 else "no", and tag `applies` likewise."""
    answers = reply.get("answers")
    if not isinstance(answers, dict):
        raise Malformed("no answers map")
    if question.kind == "tags":
        fields = _systemone_tags(answers, question, name)
    else:
        fields = SYSTEMONE_PARSERS[question.kind](_systemone_answer(answers, name))
    return Answer(kind=question.kind, raw=reply, model=reply.get("model"), **fields)


def _systemone_answer(answers: dict, name: str) -> dict:
    """answers[name], raising Rejected on a refusal and Malformed when missing."""
    answer = answers.get(name)
    if not isinstance(answer, dict):
        raise Malformed(f"no answer for {name}")
    if answer.get("type") == "refusal":
        raise Rejected("the model refused to answer")
    return answer


def _systemone_yesno(answer: dict) -> dict:
    """noul = P(yes), nothing else."""
    p = _prob(answer.get("noul"), "noul")
    return {"answer": "yes" if p >= 0.5 else "no", "p": p}


def _systemone_choice(answer: dict) -> dict:
    """choice + softmax `probabilities` map + optional `confidence`."""
    probabilities = _choice_probabilities(answer.get("probabilities"))
    chosen = answer.get("choice")
    if not isinstance(chosen, str):
        raise Malformed("choice answer without a choice")
    return {"chosen": chosen, "p": (probabilities or {}).get(chosen),
            "probabilities": probabilities,
            "confidence": _prob(answer.get("confidence"), "confidence", nullable=True)}


def _systemone_scale(answer: dict) -> dict:
    """score = probability-weighted level index, the same quantity as `expectation`."""
    probabilities = answer.get("probabilities")
    return {"expectation": _number(answer.get("score"), "score", 0.0, 4.0),
            "probabilities": probabilities if isinstance(probabilities, dict) else None,
            "confidence": _prob(answer.get("confidence"), "confidence", nullable=True)}


def _systemone_tags(answers: dict, question: Question, name: str) -> dict:
    """Rebuild Levanto-style tags from one noul per tag; applies = p >= 0.5."""
    tags = {}
    for n, tag in enumerate(question.tags):
        p = _prob(_systemone_answer(answers, f"{name}_tag{n}").get("noul"), "noul")
        tags[tag["id"]] = {"p": p, "applies": p >= 0.5}
    return {"tags": tags}


SYSTEMONE_PARSERS = MappingProxyType({
    "yesno": _systemone_yesno, "choice": _systemone_choice, "scale": _systemone_scale,
})


def _systemone_result(reply: dict, question: Question, name: str) -> Answer | SageError:
    """Answer, or the SageError that stands in its slot."""
    try:
        return systemone_decision(reply, question, name)
    except SageError as error:
        return error


def _state(content) -> Any:
    """System One `state`: a string, JSON object or array."""
    return list(content) if isinstance(content, tuple) else content


# ---------------------------------------------------------------- numbers and bodies

def _number(value, what: str, low: float, high: float) -> float:
    """value as a float in [low, high], else Malformed (an integer too large for a float is valid JSON,
    up to 4300 digits, and not a number this reads)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise Malformed(f"{what} is not a number: {value!r:.40}")
    if not low <= value <= high:
        raise Malformed(f"{what} {value} is outside {low:g}..{high:g}")
    return float(value)


def _finite(value: int | float) -> bool:
    """True when value is a finite float or an integer a float can hold."""
    try:
        return math.isfinite(value)
    except OverflowError:   # math converts an int to float first
        return False


def _prob(value, what: str, nullable: bool = False) -> float | None:
    """value as a probability in [0, 1]; None allowed only when nullable."""
    if value is None and nullable:
        return None
    return _number(value, what, 0.0, 1.0)


def _json_object(raw: bytes) -> dict:
    """The body as a JSON object, else Malformed (also for one nested deeper than the parser goes, or
    holding NaN, Infinity or a key named twice: llm.strict_json)."""
    try:
        value = as_text(strict_json(raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Malformed(f"not JSON: {raw[:80]!r}") from None
    if not isinstance(value, dict):
        raise Malformed("body is not a JSON object")
    return value


def error_detail(raw: bytes) -> str:
    """The human text of an error body: `detail` (string, object or pydantic list), else
    `message`/`error`, else the raw text (as levanto-py's _extract_detail does)."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        body = as_text(json.loads(text))
    except (ValueError, RecursionError):
        return text
    if not isinstance(body, dict):
        return text
    detail = next((body[k] for k in ("detail", "message", "error") if body.get(k)), text)
    if isinstance(detail, dict):
        detail = detail.get("message") or json.dumps(detail)
    if isinstance(detail, list):
        detail = "; ".join(str(i.get("msg", i) if isinstance(i, dict) else i) for i in detail)
    return str(detail)


def _clip(text: str, key: str | None) -> str:
    """One line of at most DETAIL_MAX characters with the key blanked out."""
    if key:
        text = text.replace(key, "[key]")
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_MAX else text[:DETAIL_MAX - 1] + "…"


def retry_after_clamped(value: str | None, now: float) -> float | None:
    """Seconds from a Retry-After header (delta or HTTP date), clamped to 0..30 as levanto-py does."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        import email.utils   # here, like the HTTP stack (see Sage._opener)
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError):
            return None
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP)


def backoff(error: HTTPStatus, attempt: int) -> float:
    """Wait before retry number attempt+1: Retry-After if sent, else 0.5 s doubling, max 8 s."""
    if error.retry_after is not None:
        return error.retry_after
    return min(8.0, 0.5 * 2 ** attempt)


def plan_batches(items: Sequence[tuple], limit: int = BATCH_MAX) -> list[list[list[tuple]]]:
    """Requests -> groups -> [(input index, content, question)]: equal contents share a group,
    and no request holds more than `limit` questions."""
    groups: dict[str, list] = {}
    for index, (content, question) in enumerate(items):
        groups.setdefault(_content_key(content), []).append((index, content, question))
    requests, current, size = [], [], 0
    for members in groups.values():
        for start in range(0, len(members), limit):
            part = members[start:start + limit]
            if size + len(part) > limit:
                requests, current, size = requests + [current], [], 0
            current, size = current + [part], size + len(part)
    return requests + [current] if current else requests


def _proxies(env: Mapping[str, str]) -> dict:
    """Proxy map from the env mapping (HTTPS_PROXY / HTTP_PROXY, either case)."""
    found = {}
    for scheme in ("https", "http"):
        value = env.get(f"{scheme.upper()}_PROXY") or env.get(f"{scheme}_proxy")
        if value:
            found[scheme] = value
    return found


# ---------------------------------------------------------------- the client

class Sage:
    """A decision-model client for one endpoint; its settings fixed at construction, thread-safe."""

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, key: str | None = None, *,
                 protocol: str = "levanto", model: str | None = None, timeout: float = 8.0,
                 retries: int = 0, sleep: Callable[[float], None] = time.sleep,
                 reasoning: str | None = None, proxies: Mapping[str, str] | None = None):
        """`retries` re-sends only on 429/5xx; `reasoning` (auto/off/on, v1.1+) is omitted when
        None; `proxies` maps scheme -> proxy URL (None: direct)."""
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).strip().rstrip("/")
        self.protocol, self.model, self.reasoning = protocol, model, reasoning
        self.timeout, self.retries, self.sleep = timeout, max(0, int(retries)), sleep
        self._key = key or None
        self._proxies = dict(proxies or {})

    @cached_property
    def _opener(self) -> urllib.request.OpenerDirector:
        """The HTTP opener, built on the first call: a client that is never asked (no key, an offline
        run) never needs one, and from Python 3.12 building one loads the system's CA certificates
        (tens of ms). Two threads asking first may each build one; either serves. The HTTP stack
        (urllib.request, urllib.error, http.client) is imported by the methods that send, so a station
        that never asks Sage does not load it (about 25 ms of a cold start)."""
        import urllib.request

        class RefuseRedirect(urllib.request.HTTPRedirectHandler):
            """Never follow a redirect, so the Bearer key never reaches another host."""

            def redirect_request(self, *args, **kwargs):
                """None: urllib then raises HTTPError for the 3xx itself."""
                return None
        return urllib.request.build_opener(RefuseRedirect(), urllib.request.ProxyHandler(self._proxies))

    @classmethod
    def from_env(cls, env: Mapping[str, str], timeout: float = 8.0, retries: int = 0,
                 sleep: Callable[[float], None] = time.sleep) -> "Sage":
        """Client from SAGE_ENDPOINT, SAGE_API_KEY, SAGE_PROTOCOL (levanto|systemone),
        SAGE_MODEL (systemone), SAGE_REASONING (optional) and *_PROXY; never raises —
        a problem (no key, bad protocol) is raised by every call instead."""
        endpoint = (env.get("SAGE_ENDPOINT") or "").strip() or DEFAULT_ENDPOINT
        protocol = choice(env, "SAGE_PROTOCOL") or "levanto"
        model = (env.get("SAGE_MODEL") or "").strip() or None
        if protocol == "systemone" and model is None and endpoint.rstrip("/") == DEFAULT_ENDPOINT:
            model = DEFAULT_SYSTEMONE_MODEL
        return cls(endpoint, (env.get("SAGE_API_KEY") or "").strip() or None, protocol=protocol,
                   model=model, timeout=timeout, retries=retries, sleep=sleep,
                   reasoning=choice(env, "SAGE_REASONING") or None,
                   proxies=_proxies(env))

    def __repr__(self) -> str:
        key = "set" if self._key else "none"
        return f"Sage({self.endpoint!r}, protocol={self.protocol!r}, key={key})"

    def _find_problem(self) -> SageError | None:
        """Why no call can be made, or None: Levanto needs a key; System One needs the model's
        name (its `model` field is required) and a key or an endpoint of its own (a local
        Ollama, vLLM or llama.cpp server has no key)."""
        if self.protocol not in PROTOCOLS:
            return Misconfigured(f"SAGE_PROTOCOL must be levanto or systemone, not {self.protocol!r}")
        if not self.endpoint.startswith(("https://", "http://")):
            return Misconfigured("SAGE_ENDPOINT must start with https:// or http://")
        if self.protocol == "systemone" and not self.model:
            return Misconfigured("SAGE_MODEL is unset: System One needs the decision model's name")
        if self._key or (self.protocol == "systemone" and self.endpoint != DEFAULT_ENDPOINT):
            return None
        if self.protocol == "systemone":
            return NoKey("no SAGE_API_KEY or SAGE_ENDPOINT for System One")
        return NoKey()

    @property
    def usable(self) -> bool:
        """True when calls will be attempted (credentials and settings are present)."""
        return self._find_problem() is None

    @property
    def problem(self) -> str | None:
        """Why no call will be attempted, as one line ("no SAGE_API_KEY", "SAGE_MODEL is unset:
        …"), or None when the client is usable."""
        problem = self._find_problem()
        return None if problem is None else str(problem)

    # -------------------------------------------------- public calls

    def yesno(self, content, question: str) -> Answer:
        """P(yes) about content; answer None means unsure (Levanto only). Raises SageError."""
        return self.ask(content, Question("yesno", question))

    def choice(self, content, question: str, options: list) -> Answer:
        """The chosen option (or None) and its probability. Raises SageError, ValueError."""
        return self.ask(content, Question("choice", question, options=tuple(options)))

    def scale(self, content, question: str, levels: list) -> Answer:
        """Expectation in 0..4 over exactly five levels. Raises SageError, ValueError."""
        return self.ask(content, Question("scale", question, levels=tuple(levels)))

    def tags(self, content, question: str, tags: list) -> Answer:
        """Per tag {"p", "applies"}. Raises SageError, ValueError."""
        return self.ask(content, Question("tags", question or "", tags=tuple(tags)))

    def sort(self, items: list[str], question: str) -> Answer:
        """`order` = indices of items, first = most as asked (Levanto only). Raises SageError."""
        if isinstance(items, (str, bytes)):
            raise ValueError("sort needs a list of items, not one string")
        return self.ask(list(items), Question("sort", question))

    def probe(self) -> Answer:
        """One cheap yes/no (a single noul on System One) to prove the endpoint answers."""
        return self.yesno(PROBE_CONTENT, PROBE_QUESTION)

    def ask(self, content, question: Question) -> Answer:
        """One question about one content. Raises SageError (ValueError for a bad question)."""
        _check_content(content, question)
        self._require_usable()
        if self.protocol == "levanto":
            return self._decide(content, question)
        [(_, result)] = self._systemone_group([(0, content, question)])
        if isinstance(result, SageError):
            raise result
        return result

    def batch(self, items: Sequence[tuple]) -> list:
        """[(content, Question)] -> [Answer | SageError] in input order; at most 16 questions
        per request. Raises only NoKey/Misconfigured (nothing sent) and ValueError."""
        items = [(content, question) for content, question in items]
        for content, question in items:
            _check_content(content, question)
        self._require_usable()
        results: list = [None] * len(items)
        fatal = None
        for request in self._plan(items):
            for index, result in self._send_batch(request, fatal):
                results[index] = result
                fatal = fatal or (result if _stops_batch(result) else None)
        return results

    def ready(self) -> dict:
        """Doctor report {ready, status, detail, ms, endpoint, protocol, model, key(bool),
        user_agent}: GET /ready without auth on Levanto, probe() on System One."""
        report = {"endpoint": self.endpoint, "protocol": self.protocol, "model": self.model,
                  "key": bool(self._key), "user_agent": USER_AGENT}
        start = time.monotonic()
        try:
            self._check_ready()
            status, detail = 200, ""
        except SageError as error:
            status, detail = getattr(error, "status", None), str(error)
        ms = round((time.monotonic() - start) * 1000, 1)
        return {**report, "ready": status == 200, "status": status, "detail": detail, "ms": ms}

    # -------------------------------------------------- plumbing

    def _require_usable(self) -> None:
        """Raise NoKey/Misconfigured before any network call."""
        problem = self._find_problem()
        if problem is not None:
            raise problem

    def _check_ready(self) -> None:
        """Raise SageError unless the endpoint says it is serving."""
        if self.protocol == "systemone":
            self.probe()
            return
        problem = self._find_problem()
        if isinstance(problem, Misconfigured):  # /ready needs no key
            raise problem
        import urllib.request
        request = urllib.request.Request(self.endpoint + "/ready", headers=self._headers(False))
        self._open(request)

    def _decide(self, content, question: Question) -> Answer:
        """POST /decide with one question; its id is the kind name, as the SDKs do."""
        body = {"content": _content(content), "question": levanto_question(question, question.kind)}
        return levanto_decision(self._post("/decide", body), question, content)

    def _plan(self, items: list) -> list:
        """Planned requests; System One takes one state per call, so each group is its own."""
        requests = plan_batches(items)
        return requests if self.protocol == "levanto" else [[p] for r in requests for p in r]

    def _send_batch(self, request: list, fatal: SageError | None) -> list:
        """(index, result) for every question of one planned request; after a fatal error
        (no key, 401/402/403, timeout, unreachable) nothing more is sent."""
        indices = [index for part in request for index, _, _ in part]
        if fatal is not None:
            return [(index, fatal) for index in indices]
        try:
            if self.protocol == "levanto":
                return self._levanto_batch(request)
            return self._systemone_group(request[0])
        except SageError as error:
            return [(index, error) for index in indices]

    def _levanto_batch(self, request: list) -> list:
        """POST /decide/batch; results[i] is group i, answers[j] question j."""
        groups = [{"content": _content(part[0][1]),
                   "questions": [levanto_question(q, f"q{j}") for j, (_, _, q) in enumerate(part)]}
                  for part in request]
        results = self._post("/decide/batch", {"requests": groups}).get("results")
        if not isinstance(results, list) or len(results) != len(request):
            raise Malformed(f"expected {len(request)} results, got {_count(results)}")
        return [pair for group, part in zip(results, request) for pair in _levanto_group(group, part)]

    def _systemone_group(self, part: list) -> list:
        """(index, result) for one content's questions in one POST /v1/systemone."""
        questions, out, sent = {}, [], []
        for j, (index, content, question) in enumerate(part):
            try:
                questions.update(systemone_questions(question, f"q{j}"))
                sent.append((index, question, f"q{j}"))
            except Rejected as error:
                out.append((index, error))
        if sent:
            reply = self._post(self._systemone_path(), self._systemone_body(part[0][1], questions))
            out += [(index, _systemone_result(reply, q, name)) for index, q, name in sent]
        return out

    def _systemone_path(self) -> str:
        """'/v1/systemone', unless SAGE_ENDPOINT already names the route."""
        return "" if self.endpoint.endswith("/systemone") else "/v1/systemone"

    def _systemone_body(self, content, questions: dict) -> dict:
        """{"model", "state", "questions"}; a client without a model never gets this far."""
        return {"model": self.model, "state": _state(content), "questions": questions}

    def _post(self, path: str, body: dict) -> dict:
        """POST JSON, retrying 429/5xx up to self.retries times (never a timeout: it may be billed)."""
        if self.reasoning:
            body = {**body, "reasoning": self.reasoning}
        import urllib.request
        data, attempt = json.dumps(body).encode("utf-8"), 0
        while True:
            request = urllib.request.Request(self.endpoint + path, data=data,
                                             headers=self._headers(True), method="POST")
            try:
                return _json_object(self._open(request))
            except HTTPStatus as error:
                if error.status not in RETRYABLE or attempt >= self.retries:
                    raise
                self.sleep(backoff(error, attempt))
                attempt += 1

    def _headers(self, auth: bool) -> dict:
        """Request headers; the Bearer key only when auth and a key is set."""
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if auth:
            headers["Content-Type"] = "application/json"
        if auth and self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def _open(self, request: urllib.request.Request) -> bytes:
        """The 2xx body (at most MAX_BODY bytes); every failure becomes a SageError. self.timeout (s)
        is the whole request's deadline: connect, headers and every read of the body together, so a
        reply sent a byte at a time ends as Timeout when it passes."""
        import http.client
        import urllib.error
        deadline = time.monotonic() + self.timeout
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return read_bounded(response, MAX_BODY, deadline)
        except urllib.error.HTTPError as error:
            raise self._status_error(error, deadline) from None
        except BodyTooLarge:
            raise Malformed("response body over 4 MiB") from None
        except (TimeoutError, DeadlinePassed):
            raise Timeout(self.timeout) from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                raise Timeout(self.timeout) from None
            raise Unreachable(self._where(error.reason)) from None
        except (OSError, http.client.HTTPException) as error:
            raise Unreachable(self._where(error)) from None

    def _status_error(self, error: urllib.error.HTTPError, deadline: float) -> HTTPStatus:
        """HTTPStatus with the body's detail (key blanked; what arrives of the body's first MAX_BODY
        bytes before `deadline`, a time.monotonic() value) and any Retry-After."""
        try:
            raw = read_prefix(error, MAX_BODY, deadline)
        finally:
            error.close()          # read1 leaves a sized body's connection open at its end
        detail = _clip(error_detail(raw), self._key)
        return HTTPStatus(error.code, detail, retry_after_clamped(error.headers.get("Retry-After"), time.time()))

    def _where(self, reason) -> str:
        """'<endpoint>: <reason>' with the key blanked."""
        return _clip(f"{self.endpoint}: {reason or 'connection failed'}", self._key)


def _stops_batch(result) -> bool:
    """True for failures that would repeat on every later request of a batch."""
    if isinstance(result, (Timeout, Unreachable, NoKey, Misconfigured)):
        return True
    return isinstance(result, HTTPStatus) and result.status in (401, 402, 403)


def _count(value) -> str:
    """len(value) as text, or 'none' when it is not a list."""
    return str(len(value)) if isinstance(value, list) else "none"
