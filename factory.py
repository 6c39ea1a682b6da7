#!/usr/bin/env python3
"""The agent factory: a job card (ABOM) goes in, a certified agent comes out.

The one module that wires the parts together and prints: results on stdout, a refusal as one lowercase line
on stderr (exit statuses: START_HERE). Its seven sections, and the entry points of each:
1. Store and layout: Factory.at (every path), Store (every file read and written: read_json, read_jsonl,
   read_chain, write_json, write_text, append_jsonl, append_chained, append_row, creating, locked).
2. Cards and agents: load_card, read_agent, load_agent, Code, restamped, suite_name, load_cases, new_files.
3. Trust: Signer, signature_problem, sealed_evidence, evidence_problem, raise_anchor, append_to_log,
   certificate, replace_certificate, decisions_of, ClaimOnDisk, enforce, certified_agent.
4. Runs: build_loop, run_loop, run_one, execute_staged_call, prove_all, proof_record, Trace, index_lines.
5. Stations, cmd_NAME(fac, args) -> exit status each: new, stamp, restamp, prove, certify, run, tower,
   harvest, recall, doctor, pending, approve, reject, review, replay, export, digest, schema.
6. Tower: index_tally, tower_document.
7. CLI: main, build_parser, SafeStream, print.
"""

import sys   # builtin, loaded before any script: no file is looked for

# Before anything a newer Python has is used: 3.8 to 3.10 stop here, an older one at a SyntaxError (`:=`).
if sys.version_info < (3, 11):
    print(f"factory: needs Python 3.11 or newer, and this is Python {sys.version.split()[0]} ({sys.executable})",
          file=sys.stderr)
    sys.exit(2)

# A script's folder is first on sys.path, so a file planted beside factory.py under a standard module's name
# (textwrap.py, ast.py, __future__.py) would run at its first import: the folder leaves before anything is
# imported (as with `python3 -P`; so no `from __future__` here), and own modules load by path (own_module,
# Code). Run as `python3 -m` or imported, the path is the caller's.
if __name__ == "__main__" and __spec__ is None and not sys.flags.safe_path:
    del sys.path[0]

import os
import signal


def quit_now(signum: int, frame=None) -> None:
    """Exit 128 + signum, saying so in one line: a signal while the script loads, or a second one."""
    os.write(2, b"factory: interrupted\n")
    os._exit(128 + signum)


HALTING = (signal.SIGINT, signal.SIGTERM)   # Ctrl-C; what docker stop, systemd and CI send
if __name__ == "__main__":   # until main() takes over (Halt)
    for halting in HALTING:
        signal.signal(halting, quit_now)


# What --help and every station need; a module only some use (ast, hashlib, subprocess, ...) is imported where
# it is used, so a cold start does not pay for it.
import argparse
import builtins
import contextlib
import errno
import fcntl
import importlib.machinery
import importlib.util
import io
import json
import math
import re
import shutil
import stat
import threading
import textwrap
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace as with_fields
from datetime import datetime, timedelta, timezone
from functools import cached_property, lru_cache, partial
from operator import itemgetter
from pathlib import Path


class SourceOnly(importlib.machinery.SourceFileLoader):
    """Runs the module's .py source, never reading or writing __pycache__ (a planted .pyc would run in the source's
    place; git ignores that folder): compiled, or its code for these exact bytes from the user's own code_cache."""

    def get_code(self, fullname):
        return code_cache(self.get_data(self.path), self.path)


def code_cache(source: bytes, path: str, folder: str | None = None) -> types.CodeType:
    """compile(source) of the module at `path`, kept in the user's own $XDG_CACHE_HOME/agent-factory (else ~/.cache/...,
    made 0700), as compiling broker.py is most of a start. An entry is named by the sha256 of the path with Python's
    bytecode version and -O level, and of the source, and begins with the sha256 of the rest; one torn, edited or
    not a plain file is replaced, one another user owns or may write (or its folder) is not used; on any failure,
    compiled as without a cache."""
    import hashlib, marshal
    folder = folder or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "agent-factory")
    stem = hashlib.sha256(importlib.util.MAGIC_NUMBER + bytes([sys.flags.optimize]) + os.fsencode(path)).hexdigest()[:24]
    name, code = f"{stem}-{hashlib.sha256(source).hexdigest()[:40]}.code", None
    with contextlib.suppress(OSError, ValueError, EOFError, TypeError):
        if not os.path.isabs(folder):   # XDG_CACHE_HOME must be absolute (the XDG base directory specification)
            raise ValueError(f"{folder} is relative")
        os.makedirs(folder, 0o700, exist_ok=True)
        place = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        at = lambda name, flags: os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=place)
        try:
            if not users_own(place):
                raise ValueError(f"{folder} is not the user's own")
            with contextlib.suppress(OSError, ValueError, EOFError, TypeError), open(name, "rb", opener=at) as entry:
                if users_own(entry.fileno(), stat.S_ISREG) and hashlib.sha256((data := entry.read())[32:]).digest() == data[:32]:
                    if isinstance(loaded := marshal.loads(data[32:]), types.CodeType):
                        return loaded
            data = marshal.dumps(code := compile(source, path, "exec", dont_inherit=True))
            try:
                with open(temp := f".{name}.{os.getpid()}", "wb", opener=at) as out:
                    out.write(hashlib.sha256(data).digest() + data)
                os.replace(temp, name, src_dir_fd=place, dst_dir_fd=place)
            finally:   # gone once replaced; a failed write's is removed
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=place)
            for old in os.listdir(place):
                if old.lstrip(".").startswith(stem) and old != name:
                    os.unlink(old, dir_fd=place)
        finally:
            os.close(place)
    return code or compile(source, path, "exec", dont_inherit=True)


def users_own(handle: int, kind=stat.S_ISDIR) -> bool:
    """True when the open folder (or file of `kind`) is this user's and no other user may write it."""
    found = os.fstat(handle)
    return kind(found.st_mode) and found.st_uid == os.geteuid() and not found.st_mode & 0o022


def own_module(name: str, lazy: bool = False):
    """NAME (broker, llm, sage) from NAME.py beside this file, compiled from source (SourceOnly), in
    sys.modules; `lazy`: run at first use (LazyLoader: the clients' ~35 ms --help need not pay)."""
    if name in sys.modules:
        return sys.modules[name]
    path = str(Path(__file__).resolve().parent / f"{name}.py")
    loader = SourceOnly(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=importlib.util.LazyLoader(loader) if lazy else loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


own_module("broker")   # registered: the import below reads no file of its own
from broker import (  # noqa: E402
    APPROVE_GUARDS, ActEnvelope, BRIEF_CHARS, Batch, Broker, CANONICAL, CARD_SCHEMA, CERTIFY_GUARDS, CONTRACT,
    CUT_OFF_NOTE, CallRecord, Chain, Claim, DECIDING_GUARDS, DECISION_UNSIGNED, DEFAULT_DRAFT, DEFAULT_HANDOFF,
    Decisions, Diverged, Drift, END_FIELDS, ENTRYPOINT, EXAMPLE_TOOLS, EXECUTE_GUARDS, Escalated, FINAL, Finished,
    GENESIS, GatedRuns, HELD, HMAC_SIGNATURE, Harvested, IndexTally, Interrupted, LONE_SURROGATE, MODES, NAME,
    NEW_CASES, NOT_INDEXED, NO_VISIBLE_TEXT, OPEN_OUTCOME, OUTCOME, Outcome, OverBudget, PASSING, PROMOTION_RUNS,
    ParkedCounts, Policy, Production, REJECT_GUARDS, REVIEW_DECISIONS, RUN_GUARDS, SECRET_NAME, SET_BY_STAMP,
    SHARD_FORMAT, SIGNER, SSH_SIGNATURE, STANDING_GUARDS, STANDING_STATES, STARTED_FIELDS, STUCK, Settled,
    Settlement, Stop, TIERS, TOOL, Tally, ToolsOnFirstUse, allowed_signer, apply_draft_scores, args_digest,
    as_bytes_shown, attempts_of, attempts_said, attempts_since, brief_lines, call_columns, call_state, card_changes,
    card_models, card_problems, card_text, case_fields, case_problem, cases_text, certificate_trust, check_args,
    closes, closest, closing_verdicts, code_loading, component_lines, component_marks, contract_problems,
    contracts_assigned, copied_card, created_lines, cut, decided_line, decisions_in, detect, did_you_mean,
    doctor_lines, encodable, evidence, evidence_span, executed_calls, executed_twins, figure_problem, first_refusal,
    flagged, fold_decisions, from_state, gate_content, gate_lines, gate_not_run, grants_line, guard_results,
    harvest_run_of, head_problem, held_draft, in_shard, input_problem, is_blank, json_position, json_state, judge,
    judged_tier, junit_xml, last_line, line_verifies, lone_surrogate, merge_shards, module_name, new_card,
    new_module, new_tools, newer, no_contract, one_line, outcome_of, output_field_problems, outside_sealed,
    overlap_refusal, overruled, paired_text, parked_counts, parse_setting, part, plain_imports, printable,
    proof_figures, proof_summary, proof_verdict, quiet_denials, rate_text, recall_refusal, recorder_tools, redact,
    reject_constant, render_tower_html, replaced_text, replay_differences, restamp_lines, review_counts,
    reviews_text, routing_reasons, run_lines, run_verdict, same_json, schema_table, scored_note, seal_line,
    sealed_proof_lines, secret_values, settle, shard_line, share, signed_index, signs_of, standing_recall,
    state_column, substitution, task_text, ticket_problem, tool_families, tool_list, tower_lines, twin_lines,
    uncertain_said, unique_key, unique_keys, usd, utf8, visible, went, written_schema)

llm = own_module("llm", lazy=True)
sage = own_module("sage", lazy=True)

VERSION = "0.1"                # what --version says; sage.py's User-Agent names the same version
# Name patterns (NAME is broker's) use fullmatch: `^...$` with match() also accepts a final newline.
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{12}Z-[0-9a-f]{6}")
MAX_LINE_BYTES = 1 << 20       # one JSONL line (case, ticket, trace event, index row)
MAX_FILE_BYTES = 16 << 20      # one JSON file (card, record, certificate)
CLIP_CHARS = 8000              # ~2,000 tokens of a tool result or of the input go to the worker
TRACE_FORMAT = "factory-trace-3"
RECORD_FORMAT = "factory-proof-3"   # -3: the rubric's figures named rubric_* (were draft_*)
CERT_FORMAT = "factory-certificate-1"
TOWER_FORMAT = "factory-tower-2"       # printed by tower --json
ANCHOR_FORMAT = "factory-anchor-1"
ATTEMPTS_FORMAT = "factory-attempts-1"
CERTIFIED_MARKS = 20            # certifications per agent whose sealed-attempt counts are kept
CHAINED_LOGS = ("recalls", "revocations", "lineage", "approvals", "reviews")   # Factory properties of the hash-chained logs
STDOUT_CLOSED = 141            # run's exit status when stdout's reader stopped: 128 + SIGPIPE, as a shell reports it
PROOF_FAILED = 3               # prove's exit status for a proof that ran and did not pass (a refusal is 1)
DEFAULT_JOBS = 4               # concurrent cases or tickets: model and Sage calls are network waits


class Refusal(Exception):
    """A station declined (exit 1); str(self) is one lowercase line (SafeStream escapes a line break in it)."""


class Problems(Refusal):
    """A refusal naming several problems: `lines`, its head and an indented line per problem (str() joins)."""

    def __init__(self, head: str, problems: list[str]):
        self.lines = [head, *(f"  {problem}" for problem in problems)]
        super().__init__("\n".join(self.lines))


class Usage(Exception):
    """A command line that can never work, whatever the factory holds (exit 2), in one lowercase line;
    `station`: the station ('' before one)."""

    def __init__(self, message: str, station: str = ""):
        super().__init__(message)
        self.station = station


class Signalled(KeyboardInterrupt):
    """A signal of HALTING, args[0], stopped the station (exit 128 + it)."""


@dataclass
class Halt:
    """How a station stops at a signal of HALTING: Signalled in the main thread unless `held` (then as it ends);
    other runs stop before their next step or are closed; a second signal ends the process."""
    signum: int = 0
    holding: int = 0     # held blocks open
    runs: dict = field(default_factory=dict)   # run id -> (its Trace, closing it as interrupted)

    def catch(self, signum: int, frame) -> None:
        """The signal handler."""
        self.signum = signum
        for halting in HALTING:
            signal.signal(halting, quit_now)
        if not self.holding:
            raise Signalled(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A block no signal cuts (a run started, or settled and closed)."""
        main = threading.current_thread() is threading.main_thread()
        self.holding += main
        try:
            yield
        finally:
            self.holding -= main
            if main and self.signum and not self.holding:
                raise Signalled(self.signum)


class StoreError(Refusal, OSError):
    """The machine would not let the Store read or write one path (permission denied, no space, a file-size
    limit, a link out of the root); str(self) names path and cause. An OSError too: a tool whose effect could
    not be written fails as its contract says."""


# ================================================================ 1. Store and layout
# The factory's paths (Factory) and every read and write of its files (Store): nothing else opens a file for
# writing; writes go only through real folders inside the root, secrets scrubbed out.

# ---- text from outside: secrets, terminal controls, bytes that are not text

SEPARATORS = ("\n", "\t")   # print's end, and a tab-separated line's column separator


def note(fac: "Factory", line: str) -> None:
    """`factory: note: LINE` on stderr, once per station however many runs say it."""
    if line not in fac.store.noted:
        fac.store.noted.add(line)
        print(f"factory: note: {line}", file=sys.stderr)


# ---- time, run ids, digests, names

def utc_now() -> str:
    """Now, as iso() writes it (the second's text made once per second: a run stamps a dozen events)."""
    seconds, micro = divmod(time.time_ns() // 1000, 1_000_000)
    return utc_second(seconds) + f".{micro:06d}Z"


utc_second = lru_cache(maxsize=1)(lambda seconds: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))


def iso(moment: datetime) -> str:
    """ISO 8601 in UTC with microseconds and a Z (2026-11-30T04:12:55.123456Z): it sorts as text."""
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def new_run_id() -> str:
    """A RUN_ID that sorts by time: UTC timestamp with microseconds, then 6 random hex."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ") + "-" + os.urandom(3).hex()


def canonical(obj) -> bytes:
    """What digests and signatures cover: JSON, keys sorted, no spaces, as utf8."""
    return utf8(CANONICAL.encode(obj))


def sha256(data: bytes) -> str:
    """'sha256:' + 64 hex."""
    import hashlib   # loading OpenSSL is a cold start's cost --help need not pay
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_name(name: str, what: str = "agent") -> str:
    """name when NAME matches it whole; Refusal (before any path is built from it) otherwise."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise Refusal(f"{name!r} is not a valid {what} name (lowercase letter, then a-z 0-9 _ -, at most 64)")
    return name


# ---- strict JSON: UTF-8, no NaN, no key given twice, objects of a Shape

def decode(raw: bytes, where: str, first: bool = True) -> str:
    """The UTF-8 text of raw; Refusal naming `where` when it is not, or (`first`: a file's start) has a BOM."""
    if first and raw.startswith(b"\xef\xbb\xbf"):
        raise Refusal(f"{where}: starts with a utf-8 byte-order mark; save it as plain utf-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Refusal(f"{where}: not valid utf-8 (byte {error.start})") from None


def parse_json(text: str, where: str):
    """The JSON value in text; Refusal naming `where` and the position when it is malformed."""
    if not text.strip():
        raise Refusal(f"{where}: empty")
    try:
        return json.loads(text, parse_constant=reject_constant, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as error:
        # some of json's messages end in "at", waiting for the position: it is said once, after them
        raise Refusal(f"{where}: not valid json ({error.msg.removesuffix(' at')}{json_position(text, error)})") from None
    except RecursionError:
        raise Refusal(f"{where}: not valid json (nested too deeply)") from None
    except ValueError as error:
        raise Refusal(f"{where}: not valid json ({error})") from None


def as_object(value, where: str) -> dict:
    """value when it is a JSON object; Refusal otherwise."""
    if not isinstance(value, dict):
        raise Refusal(f"{where}: expected a json object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Shape:
    """A JSON object's fields and types, matched exactly (a bool is no number); `optional` when present."""
    required: tuple               # ((field, (type, ...)), ...)
    optional: tuple = ()

    @classmethod
    def of(cls, required: dict, optional: dict | None = None) -> "Shape":
        """A Shape from {field: type or tuple of types}."""
        def pairs(fields: dict) -> tuple:
            return tuple((key, kind if isinstance(kind, tuple) else (kind,)) for key, kind in fields.items())
        return cls(pairs(required), pairs(optional or {}))

    def __post_init__(self):
        # the fast path: the required fields of one type are fetched and typed in C, all at once
        single = [(key, kinds[0]) for key, kinds in self.required if len(kinds) == 1]
        object.__setattr__(self, "_fetch", itemgetter(*[key for key, _ in single]) if len(single) > 1 else None)
        object.__setattr__(self, "_types", tuple(kind for _, kind in single))
        object.__setattr__(self, "_rest", tuple(p for p in self.required if self._fetch is None or len(p[1]) > 1))

    def fits(self, value: dict) -> bool:
        """True when value has the shape (the fast path: every row of a million-row index)."""
        try:
            if self._fetch is not None and tuple(map(type, self._fetch(value))) != self._types:
                return False
            for key, kinds in self._rest:
                if type(value[key]) not in kinds:
                    return False
        except KeyError:
            return False
        for key, kinds in self.optional:
            if key in value and type(value[key]) not in kinds:
                return False
        return True

    def check(self, value: dict, where: str) -> dict:
        """value when it has the shape; Refusal naming the first missing or mistyped field."""
        for key, kinds in self.required + self.optional:
            if key not in value and (key, kinds) in self.required:
                raise Refusal(f"{where}: missing field '{key}'")
            if key in value and type(value[key]) not in kinds:
                raise Refusal(f"{where}: field '{key}' has the wrong type ({type(value[key]).__name__})")
        return value


# ---- the layout: every path of one factory

@dataclass(frozen=True)
class Factory:
    """Every path of one factory, from its root (asking creates nothing); `store` reads and writes, `code` loads
    agents/."""
    root: Path
    sealed_given: str | None   # --sealed-dir, when given
    keys_dir: Path
    env: Mapping[str, str] = field(default_factory=dict, compare=False)
    halt: Halt = field(default_factory=Halt, compare=False, repr=False)
    store: "Store" = field(init=False, compare=False, repr=False)
    code: "Code" = field(init=False, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "store", Store(self))
        object.__setattr__(self, "code", Code(self))

    @classmethod
    def at(cls, root: str | None, sealed_dir: str | None, env: Mapping[str, str], halt: Halt | None = None) -> "Factory":
        """The factory at --root, else $FACTORY_ROOT, else factory.py's folder; Refusal for an empty --root or
        --sealed-dir or a keys folder ($FACTORY_KEYS_DIR, else ~/.config/agent-factory/keys) in the root."""
        for flag, given in (("--root", root), ("--sealed-dir", sealed_dir)):
            if given is not None and not given.strip():
                raise Refusal(f"{flag} is empty (an unset variable?); name the folder, or leave {flag} out")
        base = Path(root or env.get("FACTORY_ROOT") or Path(__file__).resolve().parent).resolve()
        if not base.is_dir():
            raise Refusal(f"the factory root {base} is not a folder (--root, else $FACTORY_ROOT)")
        keys = Path(env.get("FACTORY_KEYS_DIR") or Path.home() / ".config" / "agent-factory" / "keys")
        if keys.absolute().is_relative_to(base) or keys.resolve().is_relative_to(base):
            # whoever writes the tree could read its keys there, and rewrite this machine's anchor
            raise Refusal(f"the keys folder {keys} is inside the factory root {base}: it must live outside the factory "
                          f"root (set FACTORY_KEYS_DIR to a folder of your own)")
        return cls(base, sealed_dir, keys, env, halt or Halt())

    @cached_property
    def sealed_dir(self) -> Path:
        """Where sealed halves live: --sealed-dir, else $FACTORY_SEALED_DIR, else evals/."""
        sealed = self.sealed_given or self.env.get("FACTORY_SEALED_DIR")
        return Path(sealed).resolve() if sealed else self.evals

    # computed once per Factory: a batch asks for the index and the traces folder on every run
    masters = cached_property(lambda self: self.root / "masters")
    evals = cached_property(lambda self: self.root / "evals")
    records = cached_property(lambda self: self.root / "records")
    registry = cached_property(lambda self: self.root / "registry")
    traces = cached_property(lambda self: self.root / "traces")
    agents = cached_property(lambda self: self.root / "agents")
    index = cached_property(lambda self: self.traces / "index.jsonl")
    recalls = cached_property(lambda self: self.registry / "recalls.jsonl")
    lineage = cached_property(lambda self: self.registry / "lineage.jsonl")
    revocations = cached_property(lambda self: self.registry / "revocations.jsonl")
    pending = cached_property(lambda self: self.registry / "pending")
    approvals = cached_property(lambda self: self.registry / "approvals.jsonl")
    reviews = cached_property(lambda self: self.registry / "reviews.jsonl")
    # the trust root of ssh signatures lives where someone who writes the registry cannot write
    allowed_signers = cached_property(lambda self: Path(self.env.get("FACTORY_ALLOWED_SIGNERS")
                                                        or self.keys_dir / "allowed_signers").absolute())
    otlp = cached_property(lambda self: llm.otlp_settings(self.env))   # None: no endpoint, nothing exported
    evidence_key_path = cached_property(lambda self: self.keys_dir / "_evidence.key")   # no signer's name starts with _
    # this machine's anchor for this root: a root is known by its path, which the registry's writers cannot move
    anchor_path = cached_property(lambda self: self.keys_dir / f"_anchor-{sha256(str(self.root).encode())[7:23]}.json")
    # this machine's count of sealed proofs, for every root: a copy of the tree counts with the original
    attempts_path = cached_property(lambda self: self.keys_dir / "_sealed-attempts.json")

    def card_path(self, name: str) -> Path:
        """masters/NAME.json."""
        return self.masters / f"{check_name(name)}.json"

    def cert_path(self, name: str) -> Path:
        """registry/NAME.card.json: the signed certificate."""
        return self.registry / f"{check_name(name)}.card.json"

    def history_path(self, name: str) -> Path:
        """registry/history/NAME/<new run id>.card.json: a superseded certificate."""
        return self.registry / "history" / check_name(name) / f"{new_run_id()}.card.json"

    def key_path(self, signer: str) -> Path:
        """KEYS_DIR/SIGNER.key."""
        if not isinstance(signer, str) or not SIGNER.fullmatch(signer):
            raise Refusal(f"{signer!r} is not a valid signer name (a letter, then letters, digits . _ -)")
        return self.keys_dir / f"{signer}.key"

    def suite_path(self, suite: str, sealed: bool) -> Path:
        """evals/SUITE/cases.jsonl, or SEALED_DIR/SUITE/sealed.jsonl for the sealed half."""
        return self.sealed_dir / suite / "sealed.jsonl" if sealed else self.evals / suite / "cases.jsonl"

    def record_path(self, agent: str, half: str) -> Path:
        """records/AGENT/<new run id>.HALF.json: a new proof record."""
        return self.records / check_name(agent) / f"{new_run_id()}.{half}.json"

    def trace_path(self, agent: str, run_id: str) -> Path:
        """traces/AGENT/RUN_ID.jsonl."""
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
            raise Refusal(f"{run_id!r} is not a run id (e.g. 20261130T041500123456Z-1a2b3c)")
        return self.traces / check_name(agent) / f"{run_id}.jsonl"

    queues = cached_property(lambda self: {})   # agent -> review_path, made once: every run appends there

    def review_path(self, agent: str) -> Path:
        """outbox/AGENT/review.jsonl: AGENT's drafts held for a human."""
        return self.queues.get(agent) or self.queues.setdefault(agent, self.root.joinpath("outbox", check_name(agent), "review.jsonl"))

    def spill_path(self, agent: str, run_id: str, name: str) -> Path:
        """traces/AGENT/RUN_ID/NAME.txt: a text too long to send the worker whole (NAME: input, tool-SEQ)."""
        return self.trace_path(agent, run_id).with_suffix("") / f"{name}.txt"

    def pending_path(self, run_id: str, call: int) -> Path:
        """registry/pending/RUN_ID.CALL.json: one parked call."""
        return self.pending / f"{run_id}.{call}.json"

    def shown(self, path: Path) -> str:
        """The path as the user sees it (one_line), relative to the root when inside it."""
        try:
            return one_line(str(path.relative_to(self.root)))
        except ValueError:
            return one_line(str(path))


# ---- processes: is the one an approval names still running

def process_started(pid: int) -> str | None:
    """When process `pid` started (boot id, clock ticks in /proc): with the pid, a name no file can fake. None
    when none runs (or a zombie); UNSEEN when /proc hides it (hidepid)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return None if fields[0] in "ZX" else f"{Path('/proc/sys/kernel/random/boot_id').read_text().strip()} {fields[19]}"
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return UNSEEN


UNSEEN = "runs, its start unseen"


def approver_runs(decisions: list) -> bool:
    """True when the process the last intent among a call's decisions names (`pid`, `started`) runs."""
    intent = next((d for d in reversed(decisions) if d["kind"] == "intent"), {})
    pid = intent.get("pid")
    return type(pid) is int and pid > 0 and (now := process_started(pid)) is not None and now in (intent.get("started"), UNSEEN)


# ---- the Store: every read and write of the factory's files

class Store:
    """Every read and write of one factory's files. Reads are strict (inside the root or the sealed folder
    unless the user named the file, bounded, UTF-8 JSON of the expected shape) and name file and line; writes go
    through real folders, atomic or appended whole under a lock, secrets scrubbed."""

    def __init__(self, fac: Factory):
        self.fac = fac
        self.decoder = json.JSONDecoder(parse_constant=reject_constant, object_pairs_hook=unique_keys)
        self.encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)   # one JSONL line
        self.hidden = secret_values(fac.env)
        self.noted: set[str] = set()      # notes printed by this station
        self.evidence: bytes | None = None   # the evidence key, once this station has read it (evidence_key)
        self.heads: dict = {}             # path -> {"bytes", "hash"}: its head after our last row
        self.tally = None                 # the index's tally, once counted (index_tally)
        self.rows: dict = {}              # path -> (the handle append_row keeps, its fstat)
        self.rows_lock = threading.Lock()

    def machine(self, path: Path, doing: str) -> "Store.Machine":
        """A block turning an OSError while `doing` something to path into a StoreError naming both."""
        return Store.Machine(self.fac, path, doing)

    class Machine:
        """Store.machine's: a class, not a generator, as it guards every line written."""

        def __init__(self, fac: Factory, path: Path, doing: str):
            self.fac, self.path, self.doing = fac, path, doing

        def __enter__(self) -> None:
            return None

        def __exit__(self, kind, error, traceback) -> None:
            if kind is None or not issubclass(kind, OSError) or issubclass(kind, (StoreError, FileExistsError)):
                return None
            cause = error.strerror or kind.__name__
            raise StoreError(f"{self.fac.shown(self.path)}: cannot {self.doing} it ({cause.lower()})") from None

    # ---- the Store's reads: files, JSON, JSONL (the one reader), hash-chained logs

    def check_readable(self, path: Path, confined: bool = True) -> Path:
        """The real location of path; Refusal unless a regular file inside the root or the sealed folder (a link
        out is outside) or, not `confined`, one the user names."""
        where, real = self.fac.shown(path), Path(os.path.realpath(path))
        if confined and not (real.is_relative_to(self.fac.root) or real.is_relative_to(self.fac.sealed_dir)):
            raise Refusal(f"{where}: points outside the factory root ({real}); refusing to read it")
        with self.machine(path, "read"):
            if path.is_dir():
                raise Refusal(f"{where}: is a folder, not a file")
            if not path.is_file():
                raise Refusal(f"{where}: no such file" if not path.exists() else f"{where}: not a regular file")
        return real

    def exists(self, path: Path) -> bool:
        """True when something is at path; StoreError when the machine will not say (a folder it may not
        enter)."""
        with self.machine(path, "read"):
            return path.exists()

    @contextlib.contextmanager
    def opened(self, path: Path, confined: bool = True) -> Iterator:
        """A binary reader of a readable file at its real location (no link swapped in, no FIFO waited on)."""
        real = self.check_readable(path, confined)
        with self.machine(path, "read"):
            handle = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISREG(os.fstat(handle).st_mode):
                os.close(handle)
                raise Refusal(f"{self.fac.shown(path)}: not a regular file")
            with os.fdopen(handle, "rb") as reader:
                yield reader

    def read_bytes(self, path: Path, limit: int = MAX_FILE_BYTES, confined: bool = True) -> bytes:
        """The bytes of a readable file; Refusal past `limit`."""
        with self.opened(path, confined) as reader, self.machine(path, "read"):
            if os.fstat(reader.fileno()).st_size > limit:
                raise Refusal(f"{self.fac.shown(path)}: larger than {limit >> 20} mib")
            return reader.read()

    def read_json(self, path: Path, shape: Shape | None = None, confined: bool = True) -> dict:
        """The JSON object in a file, of `shape`; Refusal naming the file for every way it can be wrong."""
        where = self.fac.shown(path)
        value = as_object(parse_json(decode(self.read_bytes(path, confined=confined), where), where), where)
        self.check_text(value, where)
        return shape.check(value, where) if shape else value

    def check_text(self, value, where: str) -> None:
        """Refusal naming `where` for a lone surrogate in a JSON value."""
        bad = lone_surrogate(value)
        if bad:
            raise Refusal(f"{where}: holds {bad}, half of a utf-16 pair, which is not text; remove it")

    def read_jsonl(self, path: Path, shape: Shape | None = None, confined: bool = True, each: bool = False,
                   start: tuple[int, int] = (0, 0), whole: bool = False, piped: bytes | None = None) -> Iterator[tuple]:
        """(line number, object) per non-blank line, streamed, each of `shape`; a torn, oversized, non-object,
        misshapen or non-text line is a Refusal naming file and line (`each`: yielded in its place). `start`:
        (byte offset, lines before it); `piped`: bytes read instead. `whole` yields (number, offset after it,
        its bytes, object), stopping before a last line with no newline."""
        where, scan, end = self.fac.shown(path), self.decoder.scan_once, start[0]
        with (self.opened(path, confined) if piped is None else io.BytesIO(piped)) as lines, self.machine(path, "read"):
            lines.seek(start[0])
            for number, raw in enumerate(iter(partial(lines.readline, MAX_LINE_BYTES + 1), b""), start[1] + 1):
                if whole and raw[-1:] != b"\n" and len(raw) <= MAX_LINE_BYTES:
                    return
                try:  # the common case fast: one object filling the line (a BOM, NaN, a key given twice or
                    text = raw.decode("utf-8")       # anything else fails here and is named on the slow path)
                    value, stop = scan(text, 0)
                    value = value if stop == len(text) or text[stop:] == "\n" else None
                except (ValueError, RecursionError, StopIteration):   # decode, json and NaN errors
                    value = None
                if type(value) is not dict or len(raw) > MAX_LINE_BYTES or "\\" in text and ("\\ud" in text or "\\uD" in text) \
                        or shape is not None and not shape.fits(value):
                    if not raw.strip():
                        end += len(raw)
                        continue
                    value = self.line_value(raw, lines, f"{where} line {number}", number, shape, each)
                end = end + len(raw) if len(raw) <= MAX_LINE_BYTES else lines.tell()
                yield (number, end, raw, value) if whole else (number, value)

    def line_value(self, raw: bytes, lines, at: str, number: int, shape: Shape | None, each: bool):
        """read_jsonl's slow path: the line's object, or the Refusal saying why not (returned with `each`, an
        oversized line skipped to its end)."""
        try:
            if len(raw) > MAX_LINE_BYTES:
                raise Refusal(f"{at}: longer than {MAX_LINE_BYTES >> 20} mib")
            value = as_object(parse_json(decode(raw, at, first=number == 1), at), at)
            self.check_text(value, at)
            return shape.check(value, at) if shape else value
        except Refusal as problem:
            if not each or (number == 1 and raw.startswith(b"\xef\xbb\xbf")):
                raise
            while len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raw = lines.readline(MAX_LINE_BYTES + 1)
            return problem

    def line_at(self, relative: str, offset: int) -> dict | None:
        """The object on the line at byte `offset` of a file under the root, or None: an effect read back."""
        with contextlib.suppress(Refusal, TypeError, ValueError):
            for _, row in self.read_jsonl(self.fac.root / relative, start=(offset, 0)):
                return row
        return None

    def read_chain(self, path: Path, shape: Shape | None = None) -> Chain:
        """The hash-chained log at path, verified (chain), read under a shared lock (no entry half appended);
        empty when there is none."""
        if not os.path.lexists(path):
            return Chain(self.fac.shown(path))
        with self.opened(path) as log, self.machine(path, "read"):
            fcntl.flock(log.fileno(), fcntl.LOCK_SH)
            data = log.read()
        return self.chain(path, data, shape)

    def chain(self, path: Path, data: bytes, shape: Shape | None = None) -> Chain:
        """The entries in a log's bytes, each of `shape`, each `prev` the sha256 of the line before (GENESIS
        first); Refusal naming file and line of a bad entry or a broken link."""
        where, entries, hashes = self.fac.shown(path), [], []
        for number, _, raw, entry in self.read_jsonl(path, shape, piped=data + b"\n", whole=True):
            at = f"{where} line {number}"
            if "prev" not in entry:
                raise Refusal(f"{at}: not a hash-chained entry (no 'prev'): written by hand, or before this log was chained")
            if entry["prev"] != (hashes[-1] if hashes else GENESIS):
                raise Refusal(f"{at}: the hash chain is broken here (an entry before it was edited, removed or "
                              f"inserted); restore the log from a copy")
            entries.append((number, entry))
            hashes.append(sha256(raw[:-1]))
        return Chain(where, tuple(entries), tuple(hashes))

    def head_at(self, path: Path, offset: int) -> str | None:
        """A chained file's head at byte `offset` (sha256 of its last line before, GENESIS at 0); None when no
        line ends there."""
        if not offset:
            return GENESIS
        if not self.exists(path):
            return None
        with self.opened(path) as reader, self.machine(path, "read"):
            last, ends = self.tail_line(reader.fileno(), offset) if os.fstat(reader.fileno()).st_size >= offset else (b"", False)
            return sha256(last) if ends else None

    @staticmethod
    def tail_line(handle: int, end: int) -> tuple[bytes, bool]:
        """(the last non-blank line before byte `end` of an open file, no newline; whether it ends there)."""
        size, ends = 1 << 12, None
        while True:
            start = max(0, end - size)
            lines = os.pread(handle, end - start, start).split(b"\n")
            ends = lines[-1] == b"" if ends is None else ends
            for line in reversed(lines[1:] if start else lines):   # the first may be cut
                if line.strip():
                    return line, ends
            if not start:
                return b"", ends
            size <<= 2

    def being_written(self, path: Path) -> bool:
        """True when a process holds the file's lock: an open Log (a live run) or an append under way."""
        with self.opened(path) as reader:
            try:
                fcntl.flock(reader.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
        return False

    # ---- where a write may go: real folders inside the root (or the sealed folder), plain files

    def bases(self) -> Iterator[Path]:
        """The root, then the sealed folder (asked for only for a path outside the root)."""
        yield self.fac.root
        yield self.fac.sealed_dir

    def parts_inside(self, path: Path) -> tuple[Path, tuple[str, ...]]:
        """(the root, else the sealed folder; path's parts below it); StoreError unless lexically in one."""
        parts = path.parts
        for base in self.bases():
            inside = len(base.parts)   # parts compared as Path.relative_to does, without building a new Path
            if parts[:inside] == base.parts and len(parts) > inside and ".." not in parts[inside:]:
                return base, parts[inside:]
        raise StoreError(f"{path}: not inside the factory root {self.fac.root}; refusing to write it")

    @contextlib.contextmanager
    def folder(self, path: Path, outside: bool = False) -> Iterator[int]:
        """A descriptor of path's folder for the block: open_folder's, or `outside` the one the user named (a
        report: theirs, links included) or the keys folder."""
        handle = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if outside else self.open_folder(path)
        try:
            yield handle
        finally:
            os.close(handle)

    def open_folder(self, path: Path) -> int:
        """A descriptor of path's folder (the caller closes it), opened from its base a part at a time with
        O_NOFOLLOW, made where missing: each folder on the way real and inside."""
        base, parts = self.parts_inside(path)
        handle = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for depth, part in enumerate(parts[:-1], 1):
                handle = self.step_into(handle, part, base, parts[:depth])
        except BaseException:
            os.close(handle)
            raise
        return handle

    def step_into(self, parent: int, part: str, base: Path, walked: tuple[str, ...]) -> int:
        """A descriptor of folder `part` in `parent` (made when missing; `parent` closed); StoreError naming
        base/`walked` for a link or no folder."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                child = os.open(part, flags, dir_fd=parent)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):   # another process may make it first
                    os.mkdir(part, 0o755, dir_fd=parent)
                child = os.open(part, flags, dir_fd=parent)
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise self.not_plain(parent, part, base.joinpath(*walked), "folder") from None
        os.close(parent)
        return child

    def not_plain(self, folder: int, name: str, where: Path, wanted: str) -> StoreError:
        """The StoreError for a link (saying where it points) or other file where a plain `wanted` must be."""
        shown = self.fac.shown(where)
        try:
            target = os.readlink(name, dir_fd=folder)
        except OSError:
            return StoreError(f"{shown}: not a regular {wanted}; refusing to write through it")
        return StoreError(f"{shown}: is a symbolic link (to {target}); the factory never writes through a "
                          f"link, so remove it or name the real file")

    def check_plain_file(self, folder: int, name: str, where: Path) -> int | None:
        """The permission bits of regular file `name` in folder, None when absent; StoreError for anything else
        or another hard link (one_name)."""
        try:
            found = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(found.st_mode):
            raise self.not_plain(folder, name, where, "file")
        self.one_name(found, where)
        return found.st_mode & 0o777

    def one_name(self, found: os.stat_result, where: Path) -> None:
        """StoreError for a file with another hard link (a name, perhaps outside the root, a write changes)."""
        if found.st_nlink > 1:
            raise StoreError(f"{self.fac.shown(where)}: has {found.st_nlink} hard links (other names for the same "
                             f"file, perhaps outside the root); the factory never writes through one: copy it to a "
                             f"file of its own (cp, then mv over it)")

    # ---- the Store's writes: the one atomic write, locked appends, chained logs, all-or-none files

    def write_json(self, path: Path, obj, exclusive: bool = False, private: bool = False) -> None:
        """obj as indented JSON through write_text, secrets scrubbed; `private`: a keys-folder file (0600, keys
        sorted, as it is)."""
        with self.writable(path):
            text = json.dumps(obj if private else redact(obj, self.hidden), indent=2, sort_keys=private, ensure_ascii=False,
                              allow_nan=False) + "\n"
        self.write_text(path, utf8(text) if private else text, exclusive, 0o600 if private else 0o644, private)

    @contextlib.contextmanager
    def writable(self, path: Path) -> Iterator[None]:
        """A block turning the encoder's ValueError for NaN or Infinity into a StoreError naming path."""
        try:
            yield
        except ValueError as error:
            if not str(error).startswith("Out of range float"):   # json's words for NaN and Infinity
                raise
            raise StoreError(f"{self.fac.shown(path)}: cannot write it (a number in it is nan or infinity, "
                             f"which json has no way to write)") from None

    def write_text(self, path: Path, text: str | bytes, exclusive: bool = False, mode: int = 0o644,
                   outside: bool = False) -> None:
        """The one atomic write: a temporary file beside path, fsynced, then os.replace (old or new, never
        torn) or, `exclusive`, os.link (FileExistsError if path exists). A new file gets `mode`, a replaced
        one keeps its own; text (not bytes) is scrubbed of secrets. `outside`: in the keys folder or one the
        user named."""
        data = self.encoded(text)
        with self.machine(path, "write"), self.folder(path, outside) as folder:
            kept = self.check_plain_file(folder, path.name, path)
            temp = f".{path.name}.{os.urandom(4).hex()}.tmp"
            handle = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
            try:
                os.fchmod(handle, mode if kept is None else kept)
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                (os.link if exclusive else os.replace)(temp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp, dir_fd=folder)

    def encoded(self, text: str | bytes) -> bytes:
        """The bytes write_text writes: text scrubbed of secrets, bytes as given."""
        return text if isinstance(text, bytes) else utf8(redact(text, self.hidden))

    def line(self, obj: dict, path: Path | None = None) -> bytes:
        """obj as one JSONL line (compact, scrubbed, UTF-8, newline); NaN or Infinity: ValueError (`path`:
        StoreError)."""
        try:   # no block entered for every line
            return utf8(self.encoder.encode(redact(obj, self.hidden)) + "\n")
        except ValueError as error:
            with self.writable(path) if path is not None else contextlib.nullcontext():
                raise error

    def append_jsonl(self, path: Path, obj: dict) -> int:
        """Append obj as one line under the file's lock; its byte offset, by which an effect is read back."""
        return self.locked_append(path, lambda handle: (self.line(obj, path), None))[0]

    def append_chained(self, path: Path, make) -> dict:
        """Append make(chain) to a hash-chained log, `prev` its head, under its lock: the log verified first and
        make may raise Refusal, so a check and its append are one step across processes. The entry."""
        def compose(handle: int) -> tuple[bytes, dict]:
            chain = self.chain(path, os.pread(handle, os.fstat(handle).st_size, 0))
            entry = {**make(chain), "prev": chain.head["hash"]}
            return self.line(entry, path), entry
        return self.locked_append(path, compose)[1]

    def locked_append(self, path: Path, compose) -> tuple[int, object]:
        """Write compose(handle)'s line at path's end under its lock; (the line's offset, compose's value)."""
        with self.machine(path, "write"):
            handle = self.open_append(path)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX)
                line, value = compose(handle)
                return self.append_locked(handle, line), value
            finally:
                os.close(handle)

    def append_row(self, path: Path, obj: dict, key: bytes | None = None) -> None:
        """Append obj to a chained file too long to read whole (the index) under its lock, `prev` the sha256 of
        its last line read from its end, sealed with `key`; `heads` keeps its head, `rows` its handle."""
        with self.rows_lock, self.machine(path, "write"):   # threads share the handle
            fcntl.flock(handle := self.kept(path), fcntl.LOCK_EX)
            try:
                ours, end = self.heads.get(path, {}), os.lseek(handle, 0, os.SEEK_END)   # our last row ends it: no read
                last, ends = (None, True) if ours.get("bytes") == end else self.tail_line(handle, end)
                line = self.line({**obj, "prev": ours["hash"] if last is None else sha256(last)}, path)
                line = seal_line(key, line) if key is not None else line
                offset = self.append_locked(handle, line, end if ends else 0, end)
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        self.heads[path] = {"bytes": offset + len(line), "hash": sha256(line[:-1])}

    def append_lines(self, path: Path, objs: list[dict]) -> None:
        """Append objs as whole lines in one write under the file's lock, through the handle `rows` keeps (a
        review queue, appended to by every run of the station)."""
        with self.rows_lock, self.machine(path, "write"):
            fcntl.flock(handle := self.kept(path), fcntl.LOCK_EX)
            try:
                data = b"".join(self.line(obj, path) for obj in objs)
                self.heads[path] = {"bytes": self.append_locked(handle, data, self.heads.get(path, {}).get("bytes", 0)) + len(data)}
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def kept(self, path: Path) -> int:
        """The station's append handle on path, kept in `rows` (made again when the file moved)."""
        handle, opened = self.rows.pop(path, (None, None))
        if handle is not None and self.moved(path, opened, alone=True):
            os.close(handle)
            handle = None
        if handle is None:
            handle = self.open_append(path)
            opened = os.fstat(handle)
        self.rows[path] = (handle, opened)
        return handle

    def moved(self, path: Path, opened: os.stat_result, alone: bool = False) -> bool:
        """True when path names another file than `opened`, a handle's fstat (device and inode, no link followed)
        or, `alone`, one open_append refuses (another hard link, a folder now a link)."""
        with self.machine(path, "read"):
            try:
                there = os.lstat(path)
            except FileNotFoundError:
                return True
        return (there.st_dev, there.st_ino) != (opened.st_dev, opened.st_ino) or alone and (there.st_nlink > 1 or os.path.islink(os.path.dirname(path)))

    def close(self) -> None:
        """Let go of the handles append_row keeps."""
        while self.rows:
            os.close(self.rows.popitem()[1][0])

    def open_append(self, path: Path) -> int:
        """A descriptor appending to the regular file path (made 0644) through real folders inside the root;
        StoreError for anything else there."""
        folder = self.open_folder(path)   # closed below, not by a folder block (a generator): every locked append comes here
        try:
            self.check_plain_file(folder, path.name, path)
            handle = os.open(path.name, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                             | os.O_CLOEXEC, 0o644, dir_fd=folder)
            try:
                opened = os.fstat(handle)   # what was opened, whatever was there a moment before
                if not stat.S_ISREG(opened.st_mode):
                    raise self.not_plain(folder, path.name, path, "file")
                self.one_name(opened, path)
            except StoreError:
                os.close(handle)
                raise
        finally:
            os.close(folder)
        return handle

    @staticmethod
    def append_locked(handle: int, line: bytes, ours: int = 0, end: int | None = None) -> int:
        """Write line at the file's end (locked, or one writer alone), cut back on failure; its offset. `ours`:
        where this handle's last line ended (0: none), needing no newline check; `end`: the end if known."""
        offset = os.lseek(handle, 0, os.SEEK_END) if end is None else end
        if offset and offset != ours and os.pread(handle, 1, offset - 1) != b"\n":   # a torn last line (a
            os.write(handle, b"\n")                                                  # killed writer) stays
            offset += 1                                                              # torn; ours starts clean
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(handle, view):]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(handle, offset)
            raise
        return offset

    class Log:
        """An append handle on a JSONL file only this process writes (a trace), locked from its first line, which
        makes the file, to close() (idempotent)."""

        def __init__(self, store: "Store", path: Path):
            self.store, self.path, self.handle, self.held = store, path, None, []
            self.end = 0   # where the last line written through this handle ended (0: none yet)

        def append(self, obj: dict) -> None:
            """Hold obj as one line, written at the next flush."""
            self.held.append(self.store.line(obj, self.path))

        def flush(self) -> None:
            """Write the lines held, in one write (cut back, never torn, when it fails)."""
            data, self.held = b"".join(self.held), []
            with self.store.machine(self.path, "write"):
                if data and self.handle is None:
                    self.handle = self.store.open_append(self.path)
                    fcntl.flock(self.handle, fcntl.LOCK_EX)
                if data:
                    self.end = self.store.append_locked(self.handle, data, self.end) + len(data)

        def moved(self) -> bool:
            """Store.moved of this handle; False before the first line."""
            return self.handle is not None and self.store.moved(self.path, os.fstat(self.handle))

        def close(self) -> None:
            """Let go of the file."""
            if self.handle is not None:
                os.close(self.handle)
                self.handle = None

    @contextlib.contextmanager
    def creating(self) -> Iterator[Callable[[Path, str | bytes], None]]:
        """A block creating files all or none: create(path, data) writes one atomically and exclusively
        (FileExistsError when it exists); whatever the block raises removes them first."""
        made: list[Path] = []
        def create(path: Path, data: str | bytes) -> None:
            try:
                self.write_text(path, data, exclusive=True)
            except FileExistsError:   # os.link names its temporary file; say which path exists
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
            made.append(path)
        try:
            yield create
        except BaseException:
            for path in reversed(made):
                self.discard(path)
            raise

    def discard(self, path: Path) -> None:
        """Remove a file this station just wrote (creating: a step that belongs with it failed)."""
        with self.machine(path, "remove"), self.folder(path) as folder:
            self.check_plain_file(folder, path.name, path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=folder)

    def remove_temporaries(self, path: Path) -> int:
        """Remove write_text's temporary files for path (`.NAME.` + 8 hex + `.tmp`, regular, never followed)
        that killed writes left; how many. Only where no write can race (`new`, locked)."""
        if not os.path.isdir(path.parent):   # nothing was ever written there; a folder is never made for this
            return 0
        ours, removed = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{8}}\.tmp"), 0
        with self.machine(path, "clean up beside"), self.folder(path) as folder:
            for name in filter(ours.fullmatch, os.listdir(folder)):
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISREG(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=folder)
                        removed += 1
        return removed

    @contextlib.contextmanager
    def locked(self, folder: Path) -> Iterator[None]:
        """An exclusive lock on a folder under the root (made when missing) for the block: a check and its
        append, no other check between."""
        with self.machine(folder, "lock"), self.folder(folder / ".lock") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def spill(self, agent: str, run_id: str, name: str, text: str) -> str:
        """Save a full text (a tool result, the input) at spill_path; that path as shown."""
        path = self.fac.spill_path(agent, run_id, name)
        self.write_text(path, text)
        return self.fac.shown(path)

    # ---- reports the user names (anywhere, never through a link or FIFO they did not name: Store.folder)

    def check_report(self, path: Path) -> None:
        """StoreError naming path unless its folder exists and takes a new file, and a file there is a regular
        one."""
        with self.machine(path, "write"), self.folder(path, outside=True) as folder:
            self.check_plain_file(folder, path.name, path)
            probe = f".{path.name}.{os.urandom(4).hex()}.tmp"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder))
            os.unlink(probe, dir_fd=folder)

    # ---- the keys folder (outside the root): signing keys, this machine's anchor, ssh-keygen

    def read_key(self, path: Path) -> str:
        """A key file's text, stripped; Refusal naming the file when it is not readable text or is open to
        others (check_private)."""
        try:
            handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO is never waited on
            with os.fdopen(handle, "rb") as reader:
                if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
                    raise Refusal(f"{path}: not a regular file; a key is one, so remove it and restore the key "
                                  f"(or certify with a new key)")
                text = reader.read(1 << 12).decode("ascii").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise Refusal(f"{path}: not a readable signing key ({type(error).__name__}); restore it or certify with a new key") from None
        self.check_private(path)
        return text

    def check_private(self, path: Path) -> None:
        """Refusal with the chmod that fixes it when a key file or its folder has a group or other bit."""
        open_to_others = [(place, mode) for place, mode in ((path.parent, "700"), (path, "600"))
                          if place.exists() and place.stat().st_mode & 0o077]
        if open_to_others:
            what = " and ".join("its folder" if place == path.parent else "the key file" for place, _ in open_to_others)
            fix = " && ".join(f"chmod {mode} {place}" for place, mode in open_to_others)
            raise Refusal(f"{path}: other users may read or write {what}; refusing to use it. fix it with: {fix}")

    def create_key(self, path: Path, text: str) -> bool:
        """Create a key file exclusively, 0600 in a private 0700 folder; False if there."""
        with self.machine(path, "write"):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.check_private(path)
        try:
            self.write_text(path, text.encode("ascii"), True, 0o600, outside=True)
        except FileExistsError:
            return False
        return True

    def read_private(self, path: Path) -> dict:
        """The JSON object in a keys-folder file, checked like a key; {} when there is none."""
        if not self.exists(path):
            return {}
        self.check_private(path)
        return self.read_json(path, confined=False)

    @contextlib.contextmanager
    def keys_locked(self) -> Iterator[None]:
        """An exclusive lock on the keys folder for the block (a read, merge and write back)."""
        with self.machine(self.fac.keys_dir, "lock"):
            handle = os.open(self.fac.keys_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)

    def keys_writable(self) -> bool:
        """True when the keys folder exists (or can be made, 0700) and may be written."""
        try:
            self.fac.keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            return False
        return os.access(self.fac.keys_dir, os.W_OK)

    def ssh_keygen(self, argv: list[str], data: bytes, files: dict[str, str] | None = None):
        """ssh-keygen's CompletedProcess for argv and `data` on stdin; each of `files` (name -> text under
        PIPE_TEXT) is a pipe named `{name}` in argv (/dev/fd/N). Refusal when a check takes over 60 s."""
        import subprocess
        program, readers = self.ssh_program(), {}
        try:
            for name, text in (files or {}).items():
                readers[name], writer = os.pipe()
                try:
                    os.write(writer, text.encode())   # far below a pipe's buffer: see PIPE_TEXT
                finally:
                    os.close(writer)
            for name, reader in readers.items():
                argv = [item.replace(f"{{{name}}}", f"/dev/fd/{reader}") for item in argv]
            return subprocess.run([program, *argv], input=data, capture_output=True, check=False,   # signing may
                                  pass_fds=tuple(readers.values()), timeout=60 if files else None)   # ask a passphrase
        except subprocess.TimeoutExpired:
            raise Refusal(f"ssh-keygen {' '.join(argv[:2])} did not answer within 60 s") from None
        finally:
            for reader in readers.values():
                os.close(reader)

    def ssh_program(self) -> str:
        """ssh-keygen's path on $PATH; Refusal in one line when it is not installed."""
        program = shutil.which("ssh-keygen", path=self.fac.env.get("PATH", os.defpath))
        if program is None:
            raise Refusal("ssh-keygen is not installed here (OpenSSH); ssh signatures cannot be made or checked "
                          "on this machine (hmac signatures still work)")
        return program

# ================================================================ 2. Cards and agents
# The job card (ABOM; broker's CARD_SCHEMA) and what derives from it: variants (stamp, restamp), the lineage
# log, the suites, and the Agent (card, entrypoint and tool modules) and its digest.

# ---- the card: checked, set (--set) and derived (stamp)

def card_check(fac: Factory, card: dict, name: str | None = None) -> list[str]:
    """card_problems and tool_check's line per tool no tool module defines: every station's card check."""
    return card_problems(card, name) + tool_check(fac, card)[1]


def refuse_if(problem: str | None) -> None:
    """Refusal with the one line `problem`, when there is one."""
    if problem:
        raise Refusal(problem)


def refuse(where: str, problems: list[str]) -> None:
    """Refusal naming each problem once (a module two checks load fails in both): one line for one, else the
    count and a line each."""
    problems = list(dict.fromkeys(problems))
    if len(problems) == 1:
        raise Refusal(f"{where}: {problems[0]}")
    if problems:
        raise Problems(f"{where}: {len(problems)} problems", problems)


def set_path(card: dict, dotted: str, value) -> dict:
    """A copy of card with the field at `a.b.c` set to value (objects made on the way)."""
    result = json.loads(json.dumps(card))
    node, parts = result, dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part, {}), dict):
            raise Refusal(f"--set {dotted}: '{part}' is not an object in the card")
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return result


def derive(parent: dict, name: str, overrides: dict, master_digest: str) -> dict:
    """A variant's card: its parent's fields, its own overrides, then its lineage fields."""
    card = {key: value for key, value in parent.items() if key not in SET_BY_STAMP}
    card["agent"] = name
    for dotted, value in overrides.items():
        card = set_path(card, dotted, value)
    return {**card, "stamped_from": parent["agent"], "master_digest": master_digest, "overrides": overrides}


# ---- the code an agent is made of: read once, hashed, executed from exactly those bytes

def agent_modules(dotted: str, names: list[str]) -> list[str]:
    """The agent modules one import names, as paths under agents/: `from agents import a, b` -> a.py, b.py;
    `from agents.a import f`, `import agents.a` -> a.py; else []. Refusal for agents.tools.x (the factory's)."""
    parts = dotted.split(".")
    if parts[0] != "agents":
        return []
    if len(parts) > 2 or "tools" in parts[1:] + names:
        raise Refusal(f"imports {dotted}: an agent module is imported as `from agents import NAME` (agents/NAME.py)")
    return [f"{parts[1]}.py"] if len(parts) == 2 else [f"{name}.py" for name in names]


class Code:
    """One station's agent and tool modules, by path under agents/ (RELATIVE): each read once, hashed and
    executed from those bytes (no bytecode cache); an agent module imports this root's agents/, never sys.path."""

    def __init__(self, fac: Factory):
        self.fac = fac
        self.made: dict[str, dict] = {}   # kept's: what -> RELATIVE -> it
        self.modules: dict[str, types.ModuleType] = {}
        self.lock = threading.RLock()     # re-entered on one thread by a module importing another

    def kept(self, what: str, relative: str, make):
        """make(relative), made once per module (a failure is not kept)."""
        with self.lock:
            table = self.made.setdefault(what, {})
            if relative not in table:
                table[relative] = make(relative)
            return table[relative]

    def source(self, relative: str) -> bytes:
        """The bytes of agents/RELATIVE, read once: those are hashed and executed."""
        return self.kept("source", relative, lambda path: self.fac.store.read_bytes(self.fac.agents / path))

    def digest(self, relative: str) -> str:
        return sha256(self.source(relative))

    def tree(self, relative: str, part: str = "tree"):
        """SourceScan's PART of agents/RELATIVE; Refusal for invalid Python."""
        try:
            return getattr(parsed(self.source(relative), f"agents/{relative}"), part)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as error:   # ValueError: a null byte
            raise not_python(relative, error) from None

    def imports(self, relative: str) -> list[str]:
        """The agent modules agents/RELATIVE imports (SourceScan.wanted); Refusal for one that is not there."""
        def there(path: str) -> list[str]:
            for wanted in self.tree(path, "wanted"):
                refuse_if(not (self.fac.agents / wanted).is_file() and
                          f"agents/{path} imports agents.{wanted[:-3]}, and there is no agents/{wanted}")
            return self.tree(path, "wanted")
        return self.kept("imports", relative, there)

    def closure(self, relative: str) -> list[str]:
        """Every agent module agents/RELATIVE imports, directly or not, sorted (itself excluded)."""
        seen, todo = set(), [relative]
        while todo:
            fresh = set(self.imports(todo.pop())) - seen
            seen |= fresh
            todo += fresh
        return sorted(seen - {relative})

    def check(self, relative: str) -> None:
        """scan agents/RELATIVE and every agent module it imports, directly or not; nothing is executed."""
        for path in [relative, *self.closure(relative)]:
            self.scan(path)

    def scan(self, relative: str) -> None:
        """Refusal naming the line where agents/RELATIVE reaches for code the digest does not cover
        (code_loading), or imports by plain name a file inside the root (outside_the_root); once per module."""
        def scanned(path: str) -> bool:
            self.tree(path, "code")   # what parses may not compile (a late `from __future__`): not python either
            if reaching := self.tree(path, "reaching"):
                raise Refusal(f"agents/{path} line {reaching[0][0]}: {reaching[0][1]} loads code the digest does not cover, "
                              f"so the factory will not run this module; import an agent module as `from agents import NAME`")
            for top in self.tree(path, "tops"):
                self.outside_the_root(path, top)
            return True
        self.kept("scan", relative, scanned)

    def module(self, relative: str) -> types.ModuleType:
        """agents/RELATIVE executed once, from the bytes `source` read."""
        with self.lock:
            return self.modules[relative] if relative in self.modules else self.execute(relative)

    def execute(self, relative: str) -> types.ModuleType:
        """A fresh module from the compiled source; Refusal naming file and line when it raises. Agent code is
        not told where the sealed halves are (FACTORY_SEALED_DIR leaves the environment), but can read any file."""
        path, imports = str(self.fac.agents / relative), self.imports(relative)
        self.scan(relative)
        # safe: the Factory reads the sealed folder (lazily) from main's snapshot of the environment
        os.environ.pop("FACTORY_SEALED_DIR", None)
        module = types.ModuleType("agents." + relative.removesuffix(".py").replace("/", "."))
        module.__file__ = path
        module.__builtins__ = {**vars(builtins), "__import__": self.importer(relative, imports)}
        try:
            code = parsed(self.source(relative), f"agents/{relative}").at(path)
        except RecursionError as error:   # compiled (scan), too deep to name its path in
            raise not_python(relative, error) from None
        self.modules[relative] = module   # before it runs: an import cycle finds it half made, as Python's own does
        try:
            exec(code, vars(module))
        except (Exception, SystemExit) as error:   # noqa: BLE001 - the agent's own code: what it raises (a sys.exit
            # too: it ends no station) is named in one line
            del self.modules[relative]
            if isinstance(error, Refusal):
                raise
            import traceback
            lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if frame.filename == path]
            raise Refusal(f"agents/{relative}: failed while loading ({type(error).__name__}: {error}"
                          f"{f', line {lines[-1]}' if lines else ''})") from None
        return module

    def importer(self, relative: str, imports: list[str]):
        """The __import__ agents/RELATIVE runs with: of `agents`, the modules of this root its source names
        (`imports`); any other is Python's own."""
        def find(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and name.split(".")[0] != "agents":
                self.outside_the_root(relative, name.split(".")[0])
                return builtins.__import__(name, globals, locals, fromlist, level)
            try:
                paths = agent_modules(name, list(fromlist or ())) if level == 0 else None
            except Refusal:
                paths = None
            if paths is None or not set(paths) <= set(imports):
                raise ImportError(f"agents/{relative}: only an import written `from agents import NAME` loads an "
                                  f"agent module (it is what the digest covers)")
            loaded = {path[:-3]: self.module(path) for path in paths}
            return loaded[name.split(".")[1]] if "." in name and fromlist else types.SimpleNamespace(**loaded)
        return find

    def outside_the_root(self, relative: str, top: str) -> None:
        """Refusal when agents/RELATIVE's `import TOP` would load a file inside the root or beside factory.py
        (either may be on sys.path): code the digest does not cover. One loaded already is what it is."""
        if top in sys.modules:
            return
        spec = importlib.util.find_spec(top)
        origin = Path(spec.origin).resolve() if spec is not None and spec.has_location and spec.origin else None
        if origin is not None and any(origin.is_relative_to(base) for base in (self.fac.root, Path(__file__).resolve().parent)):
            raise Refusal(f"agents/{relative}: import {top} would load {self.fac.shown(origin)}, inside the factory root: "
                          f"code the digest does not cover; move it to agents/ and import it as `from agents import {top}`")


class SourceScan:
    """An agent module's source, parsed once a process per bytes and name under agents/ (errors are raised, not
    kept): tree, nodes (ast.walk's), code_loading's finds (reaching), imports by plain name (tops) and of agent
    modules (wanted: paths under agents/; Refusal for a malformed one), OUTPUT_SCHEMA as written, compiled code."""

    def __init__(self, source: bytes, name: str):
        import ast
        self.name, self.tree = name, ast.parse(source, name)
        self.nodes = tuple(ast.walk(self.tree))
        self.imports = [node for node in self.nodes if isinstance(node, (ast.Import, ast.ImportFrom))]
        self.reaching, self.tops = code_loading(self.nodes), plain_imports(self.imports)

    @cached_property
    def wanted(self) -> list[str]:
        import ast
        found = set()
        try:
            for node in self.imports:
                if isinstance(node, ast.Import):
                    found.update(path for alias in node.names for path in agent_modules(alias.name, []))
                elif node.level == 0 and node.module:
                    found.update(agent_modules(node.module, [alias.name for alias in node.names]))
        except Refusal as refusal:
            raise Refusal(f"{self.name} {refusal}") from None
        return sorted(found)

    schema = cached_property(lambda self: written_schema(self.tree, self.nodes))
    code = cached_property(lambda self: compile(self.tree, self.name, "exec", dont_inherit=True))

    def at(self, path: str, code: types.CodeType | None = None) -> types.CodeType:
        """The code with path as its functions' file name (what a traceback names)."""
        code = code or self.code
        return code.replace(co_filename=path, co_consts=tuple(
            self.at(path, const) if isinstance(const, types.CodeType) else const for const in code.co_consts))


parsed = lru_cache(maxsize=16)(SourceScan)   # prove's workers, the tests: many stations, each source parsed once


def not_python(relative: str, error: Exception) -> Refusal:
    """The refusal for agents/RELATIVE that Python will not parse or compile (or too deep or big to), naming
    the line when the error does."""
    if isinstance(error, (RecursionError, MemoryError)):
        return Refusal(f"agents/{relative}: too {'deeply nested' if isinstance(error, RecursionError) else 'large'} to parse")
    line = f", line {error.lineno}" if getattr(error, "lineno", None) else ""
    return Refusal(f"agents/{relative}: not valid python ({getattr(error, 'msg', error)}{line})")


# ---- the agent: card, entrypoint module, tool modules, digest

@dataclass(frozen=True)
class Agent:
    """One agent as the line sees it, read once per station: checked card, tools' contracts (from source),
    digest components; `module`, `toolboxes` once loaded."""
    name: str
    card: dict
    contracts: dict               # tool name -> contract of every tool those modules define; others are unknown
    components: dict              # component label -> sha256
    module: object = None         # the entrypoint module, once executed
    toolboxes: tuple = ()         # the tool modules (agents/tools/FAMILY.py) of the card's tools, once executed
    digest: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "digest", sha256(canonical(self.components)))

    @property
    def rules(self):
        """The entrypoint function, the agent's own rules: input -> (tool calls, output)."""
        return getattr(self.module, self.card["entrypoint"].split(":")[1])

    @property
    def act_envelope(self) -> ActEnvelope:
        """The card's act_envelope, with its contracts' amounts_usd."""
        amounts = {tool: tuple(contract["amounts_usd"]) for tool, contract in self.contracts.items() if "amounts_usd" in contract}
        return ActEnvelope(**self.card.get("act_envelope", {}), amounts=amounts)

    def policy_at(self, tier: str) -> Policy:
        """The broker's policy: the card's grants and denials at `tier`."""
        return Policy(self.name, frozenset(self.card["tools"]), frozenset(self.card["tools_denied"]), tier)

    @property
    def handoff_field(self) -> str:
        return self.card.get("handoff_field", DEFAULT_HANDOFF)

    @property
    def draft_field(self) -> str:
        return self.card.get("draft_rubric", {}).get("field", DEFAULT_DRAFT)

    def hands_off(self, output) -> bool:
        """True when the output's hand-off field is true (the run goes to a human)."""
        return isinstance(output, dict) and output.get(self.handoff_field) is True

    def tools_for(self, fac: Factory, run_id: str, tags: dict | None = None, announce=None) -> dict:
        """Tool name -> callable(args) of each tool the card grants, effects written through effect_writer."""
        made, write = {}, effect_writer(fac, run_id, tags or {}, announce)
        for toolbox in self.toolboxes:
            made.update(toolbox.make_tools(fac.root, self.name, run_id, write))
        return {name: tool for name, tool in made.items() if name in self.card["tools"]}


def effect_writer(fac: Factory, run_id: str, tags: dict, announce=None):
    """make_tools' `write(path, row) -> receipt`: row + run id, a fresh effect id and `tags` (gate result, p)
    appended as one locked line; the receipt {path, offset, effect_id} reads it back. `announce` gets {path,
    effect_id, written} before and after."""
    def write(path: Path, row: dict) -> dict:
        # lexically: ValueError outside the root, before writing; the Store refuses a link on the way
        began = {"path": Path(os.path.normpath(path)).relative_to(fac.root).as_posix(), "effect_id": os.urandom(8).hex(), "written": False}
        if announce is not None:
            announce(began)
        offset = fac.store.append_jsonl(fac.root / began["path"], {**row, "run_id": run_id, "effect_id": began["effect_id"], **tags})
        began["written"] = True
        return {"path": began["path"], "offset": offset, "effect_id": began["effect_id"]}
    return write


def toolbox_contracts(fac: Factory, relative: str) -> dict:
    """The CONTRACTS of tool module agents/RELATIVE (toolbox_problems); Refusal naming each problem."""
    contracts, problems = toolbox_problems(fac, relative)
    if len(problems) == 1:
        raise Refusal(problems[0])
    if problems:
        raise Problems(f"agents/{relative}: {len(problems)} problems", problems)
    return contracts


TOOL_MODULE_IS = ("a tool module assigns CONTRACTS (tool name -> contract) once, at its top level, written out as "
                  "a literal, and defines make_tools(root, agent, run_id, write)")


def toolbox_problems(fac: Factory, relative: str) -> tuple[dict, list[str]]:
    """(the CONTRACTS of tool module agents/RELATIVE, a line per problem with them), read from source as a
    literal, never executed. Refusal when the module cannot be read or is refused."""
    import ast
    fac.code.check(relative)
    family, where = Path(relative).stem, f"agents/{relative}"
    assigned = [node for node in fac.code.tree(relative).body if contracts_assigned(node)]
    if len(assigned) != 1 or assigned[0].value is None:
        return {}, [f"{where}: {TOOL_MODULE_IS}"]
    try:
        contracts = ast.literal_eval(assigned[0].value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return {}, [f"{where} line {assigned[0].lineno}: CONTRACTS is not written out as a literal (strings, numbers, "
                    f"True, False, None, lists and dicts only, no names or calls): the factory reads it from the "
                    f"source, without running the module"]
    if not isinstance(contracts, dict):
        return {}, [f"{where}: {TOOL_MODULE_IS}"]
    return contracts, [f"{where}: {problem}" for name, contract in contracts.items()
                       for problem in contract_problems(family, name, contract)]


def known_tools(fac: Factory) -> tuple[list[str], list[str]]:
    """(each tool name a CONTRACTS literal names, the families with a module), for near misses. Read, never run:
    a misspelled tool must not run a module no card names."""
    import ast
    names, families = [], []
    for path in sorted((fac.agents / "tools").glob("*.py")):
        families.append(path.stem)
        with contextlib.suppress(Refusal):
            for node in fac.code.tree(f"tools/{path.name}").body:
                if contracts_assigned(node) and isinstance(node.value, ast.Dict):
                    names += [key.value for key in node.value.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)]
    return names, families


def tool_check(fac: Factory, card: dict) -> tuple[list[str], list[str]]:
    """(a line per unreadable or malformed tool module, a line per granted or denied tool no module defines,
    with the nearest: denying an undefined tool denies nothing)."""
    named = {key: card[key] for key in ("tools", "tools_denied") if tool_list(card.get(key))}
    problems, contracts, broken = [], {}, set()
    for relative in tool_families(tool for tools in named.values() for tool in tools):
        found, wrong = family_problems(fac, relative)
        contracts.update(found)
        problems += wrong
        broken |= {relative} if wrong else set()
    missing = [(key, tool) for key, tools in named.items() for tool in tools
               if tool not in contracts and not set(tool_families([tool])) & broken]   # a broken module is named once
    known = known_tools(fac) if missing else ([], [])
    return problems, [no_contract(key, tool, known) for key, tool in missing]


def family_problems(fac: Factory, relative: str) -> tuple[dict, list[str]]:
    """(the contracts of tool module agents/RELATIVE, {} when it has problems; its problems), never executed;
    neither for a missing module."""
    if not (fac.agents / relative).is_file():
        return {}, []
    try:
        contracts, problems = toolbox_problems(fac, relative)
    except Refusal as refusal:
        return {}, [str(refusal)]
    return ({} if problems else contracts), problems


def toolbox_code_problems(fac: Factory, card: dict, relative: str) -> list[str]:
    """What is wrong with the tool module once executed: it fails to load, has no make_tools, changed its
    CONTRACTS, or make_tools misses granted tools."""
    where, contracts = f"agents/{relative}", toolbox_contracts(fac, relative)
    try:
        module = fac.code.module(relative)
    except Refusal as refusal:
        return [str(refusal)]
    if not callable(getattr(module, "make_tools", None)):
        return [f"{where}: {TOOL_MODULE_IS}"]
    if getattr(module, "CONTRACTS", None) != contracts:
        return [f"{where}: CONTRACTS changed while the module ran; the contracts are the literal its source writes "
                f"(what the digest covers and the broker rules on): change them there"]
    return made_tools_problems(fac, card, relative, contracts)


def refuse_to_write(path: Path, row: dict) -> dict:
    """The `write` make_tools is handed when the tools are only made."""
    raise RuntimeError("make_tools wrote an effect while the tools were only being made")


def made_tools_problems(fac: Factory, card: dict, relative: str, contracts: dict) -> list[str]:
    """The one-line problem when make_tools of agents/RELATIVE returns no callable for exactly each granted tool
    the module defines. Made, never called: a tool's code first runs in production."""
    where = f"agents/{relative}"
    try:
        made = fac.code.module(relative).make_tools(fac.root, card.get("agent"), new_run_id(), refuse_to_write)
    except (Exception, SystemExit) as error:   # noqa: BLE001 - the tool module's own code: what it raises (a
        # sys.exit too) is named in one line
        return [f"{where}: make_tools(root, agent, run_id, write) raised {type(error).__name__}: {error}"
                f"{agent_code_at(fac.agents, error)}"]
    if not isinstance(made, dict):
        return [f"{where}: make_tools returned {type(made).__name__}, not a dict of tool name -> callable(args)"]
    granted = card["tools"] if tool_list(card.get("tools")) else []
    missing = sorted(tool for tool in granted if tool in contracts and not callable(made.get(tool)))
    extra = sorted(map(repr, set(made) - set(contracts)))
    if not missing and not extra:
        return []
    said = ([f"no callable for {', '.join(missing)}, which the card grants"] if missing else []) + \
           ([f"{', '.join(extra)}, which no contract in it defines"] if extra else [])
    return [f"{where}: make_tools must return a callable for each granted tool its CONTRACTS define; it returns "
            + "; and ".join(said)]


def agent_code_at(agents: Path, error: BaseException) -> str:
    """' (agents/FILE line N)' for error's innermost traceback frame under `agents` (where agent code failed),
    or ''."""
    import traceback
    folder = str(agents) + os.sep
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename.startswith(folder)]
    if not frames:
        return ""
    return f" (agents/{Path(frames[-1].filename).relative_to(agents).as_posix()} line {frames[-1].lineno})"


ENTRYPOINT_NEEDS = (  # what the entrypoint module defines beside its function, and what each is
    ("SYSTEM", str, "the worker's system prompt: a string assigned at the top level of the entrypoint module, "
                    'SYSTEM = "You are ..."'),
    ("OUTPUT_SCHEMA", dict, "the output contract: a JSON-schema object assigned at the top level of the entrypoint "
                            "module, which the final answer must match"),
)


def entrypoint_problems(fac: Factory, card: dict) -> list[str]:
    """The one reason the entrypoint module cannot be read or is refused (Code.check, never executed), else the
    card's output fields its OUTPUT_SCHEMA as written lacks; nothing for a malformed entrypoint field."""
    entry = card.get("entrypoint")
    if not (isinstance(entry, str) and ENTRYPOINT.fullmatch(entry)):
        return []
    relative = entry_module(card)
    if not (fac.agents / relative).exists():
        return [f"field 'entrypoint': there is no agents/{relative} for {entry}"]
    try:
        fac.code.check(relative)
    except Refusal as refusal:
        return [str(refusal)]
    schema = fac.code.tree(relative, "schema")
    return [] if schema is None else output_field_problems(card, schema, f"agents/{relative}", written=True)


def entrypoint_code_problems(fac: Factory, card: dict) -> list[str]:
    """A line per thing the entrypoint module lacks once executed, or the one reason it fails to load."""
    relative, function = entry_module(card), card["entrypoint"].split(":")[1]
    try:
        module = fac.code.module(relative)
    except Refusal as refusal:
        return [str(refusal)]
    problems = [] if callable(getattr(module, function, None)) else [
        f"agents/{relative} has no function {function} (the entrypoint: the agent's own rules, "
        f"input -> (tool calls, output))"]
    problems += [f"agents/{relative} has no {name} ({what})"
                 for name, kind, what in ENTRYPOINT_NEEDS if not isinstance(getattr(module, name, None), kind)]
    return problems + output_field_problems(card, getattr(module, "OUTPUT_SCHEMA", None), f"agents/{relative}")


def entry_module(card: dict) -> str:
    """The entrypoint module's path under agents/: triager:rules -> triager.py."""
    return f"{card['entrypoint'].split(':')[0]}.py"


def missing_agent(fac: Factory, name: str) -> str | None:
    """The refusal line when NAME has no card (the nearest card's name, how to make one); else None."""
    path = fac.card_path(name)
    if fac.store.exists(path):
        return None
    near = did_you_mean(name, [card.stem for card in fac.masters.glob("*.json")])
    return f"no agent named {one_line(name)} (no {fac.shown(path)}){near}; a new agent is made with: new {one_line(name)}"


def read_card(fac: Factory, name: str) -> tuple[dict, str]:
    """(the JSON object in masters/NAME.json, its path as shown); Refusal when there is none."""
    refuse_if(missing_agent(fac, name))
    path = fac.card_path(name)
    return fac.store.read_json(path), fac.shown(path)


def load_card(fac: Factory, name: str) -> dict:
    """NAME's card, checked (card_check)."""
    card, where = read_card(fac, name)
    refuse(where, card_check(fac, card, name))
    return card


def read_agent(fac: Factory, name: str) -> Agent:
    """NAME with its code read, hashed and checked, never executed (agent_from_card)."""
    card, where = read_card(fac, name)
    return agent_from_card(fac, card, where, card_problems(card, name))


def load_agent(fac: Factory, name: str) -> Agent:
    """NAME with its code executed (loaded), for the stations that run it."""
    return loaded(fac, read_agent(fac, name))


def agent_from_card(fac: Factory, card: dict, where: str, problems: list[str] = ()) -> Agent:
    """The Agent a card describes, its code read, hashed and checked, never executed; Refusal naming the card's
    `problems` and every problem with its tools and code."""
    modules, tools = tool_check(fac, card)
    refuse(where, [*problems, *entrypoint_problems(fac, card), *modules, *tools])
    toolboxes = tool_families(card["tools"] + card["tools_denied"])
    contracts = {name: contract for relative in toolboxes for name, contract in toolbox_contracts(fac, relative).items()}
    return Agent(card["agent"], card, contracts, digest_components(fac, card, contracts))


def loaded(fac: Factory, agent: Agent) -> Agent:
    """The agent with its code executed from the bytes its digest covers, in this process with this user's
    rights; Refusal naming every problem the executed code shows."""
    families = tool_families(agent.card["tools"] + agent.card["tools_denied"])
    problems = entrypoint_code_problems(fac, agent.card)
    problems += [problem for relative in families for problem in toolbox_code_problems(fac, agent.card, relative)]
    refuse(fac.shown(fac.card_path(agent.name)), problems)
    return with_fields(agent, module=fac.code.module(entry_module(agent.card)),
                               toolboxes=tuple(map(fac.code.module, families)))


def code_components(fac: Factory, card: dict) -> dict:
    """Component label -> sha256 of what a valid card names, never executed: the card, its entrypoint module,
    the tool modules of its granted or denied tools, the agent modules those import."""
    entry, toolboxes = entry_module(card), tool_families(card["tools"] + card["tools_denied"])
    imported = {path for start in (entry, *toolboxes) for path in fac.code.closure(start)} - {entry}
    return {"card": sha256(canonical(card)), f"entrypoint agents/{entry}": fac.code.digest(entry),
            **{f"module agents/{path}": fac.code.digest(path) for path in sorted(imported)},
            **{f"tool code agents/{path}": fac.code.digest(path) for path in toolboxes}}


def digest_components(fac: Factory, card: dict, contracts: dict) -> dict:
    """code_components, and each granted or denied tool's contract as its module's source writes it."""
    named = sorted(set(card["tools"]) | set(card["tools_denied"]))
    return {**code_components(fac, card), **{f"{CONTRACT}{tool}": sha256(canonical(contracts[tool])) for tool in named}}


# ---- lineage: the hash-chained log of who was stamped from whom

LINEAGE_SHAPE = Shape.of({"agent": str, "stamped_from": str})


def lineage_entries(fac: Factory) -> dict[str, tuple[str, int]]:
    """variant -> (master, line) by the lineage log's FIRST entry for it; a later one naming another (moving a
    variant out from under a recall) is ignored, with a note."""
    found, chain = {}, fac.store.read_chain(fac.lineage, LINEAGE_SHAPE)
    for number, row in chain.entries:
        first, _ = found.setdefault(row["agent"], (row["stamped_from"], number))
        if first != row["stamped_from"]:
            note(fac, f"{chain.where} line {number} re-parents {row['agent']} to {row['stamped_from']}; ignored: "
                      f"a variant's parent is fixed by its first lineage entry ({first})")
    return found


def parents(fac: Factory) -> dict:
    """variant -> master, by the lineage log."""
    return {name: parent for name, (parent, _) in lineage_entries(fac).items()}


def card_parents(fac: Factory) -> dict:
    """variant -> master by each readable card's stamped_from (an unreadable card cannot run either)."""
    found = {}
    for path in sorted(fac.masters.glob("*.json")):
        with contextlib.suppress(Refusal):
            parent = fac.store.read_json(path).get("stamped_from")
            if isinstance(parent, str) and NAME.fullmatch(path.stem):
                found[path.stem] = parent
    return found


def lineage_problem(fac: Factory, name: str, card: dict) -> str | None:
    """The refusal when NAME's stamped_from is not its first lineage entry's master (neither: a master): a stamp
    stopped half-way (no entry: stamp again), else a human's edit."""
    said, first = card.get("stamped_from"), lineage_entries(fac).get(name)
    where, log = fac.shown(fac.card_path(name)), fac.shown(fac.lineage)
    if first is None:
        return None if said is None else (
            f"{where} says {name} was stamped from {said}, but {log} has no entry for it: a stamp that stopped half-way "
            f"(or a card written by hand); finish it with: python3 factory.py stamp {said} --as {name}")
    parent, line = first
    if said == parent:
        return None
    card_says = f"stamped from {said}" if said is not None else "no stamped_from (a master, which is never re-derived)"
    return (f"{where} and {log} disagree about {name}'s master: the card says {card_says}, the log's first entry for "
            f"it (line {line}) says {parent}; one of them was edited: restore it from a copy")


def ancestors(fac: Factory, name: str, maps: tuple[dict, ...] | None = None) -> list[str]:
    """NAME's master, its master's, ... nearest first, by the lineage log or each variant -> master map in
    maps."""
    maps, found, todo = maps or (parents(fac),), [], [name]
    for current in todo:
        for parent_of in maps:
            parent = parent_of.get(current)
            if parent is not None and parent != name and parent not in found:
                found.append(parent)
                todo.append(parent)
    return found


def descendants(fac: Factory, name: str, maps: tuple[dict, ...] | None = None) -> list[str]:
    """Every variant stamped from NAME, transitively, masters before their variants, by the lineage log or each
    variant -> master map of `maps`."""
    maps, found, queue = maps or (parents(fac),), [], [name]
    while queue:
        current = queue.pop(0)
        children = sorted({child for parent_of in maps for child, parent in parent_of.items()
                           if parent == current and child != name and child not in found})
        found += children
        queue += children
    return found


def recall_reach(fac: Factory) -> tuple[dict, dict]:
    """The maps a recall follows, the log's and the cards': neither an edited card nor a missing lineage entry
    takes a variant out of its master's recalls."""
    return parents(fac), card_parents(fac)


def restamped(fac: Factory, master: str) -> tuple[dict[str, dict], list[str], list[str]]:
    """(name -> new checked card of each variant of MASTER, transitively, masters first, that changes when
    derived again; those that do not; those skipped, with no card or under one skipped). Each must agree with
    the log."""
    parent_of, latest, changed, unchanged, skipped = parents(fac), {master: read_agent(fac, master)}, {}, [], []
    for name in descendants(fac, master, recall_reach(fac)):
        if parent_of.get(name) in skipped or not fac.store.exists(fac.card_path(name)):
            skipped.append(name)   # a retired variant, or a stamp stopped before its card: nothing to re-derive
            continue
        old = load_card(fac, name)
        refuse_if(lineage_problem(fac, name, old))
        parent = latest[parent_of[name]]
        card = derive(parent.card, name, old.get("overrides", {}), parent.digest)
        latest[name] = agent_from_card(fac, card, fac.shown(fac.card_path(name)), card_problems(card))
        if card != old:
            changed[name] = card
        else:
            unchanged.append(name)
    return changed, unchanged, skipped


# ---- suites: the open and the sealed half, and their cases

def suite_name(fac: Factory, card: dict, sealed: bool) -> str:
    """The suite an agent is proved on for one half: evals.suite, else the first of its own and its masters'
    (nearest first) with that half."""
    if "suite" in card["evals"]:
        return card["evals"]["suite"]
    for candidate in [card["agent"]] + ancestors(fac, card["agent"]):
        if fac.suite_path(candidate, sealed).exists():
            return candidate
    return card["agent"]


def inputs_of(fac: Factory, card: dict, sealed: bool) -> list[dict]:
    """The {id, input} cases of one half of the agent's suite, read leniently (proving that half names a bad
    line); [] when the half is not here."""
    path = fac.suite_path(suite_name(fac, card, sealed), sealed)
    rows = (row for _, row in fac.store.read_jsonl(path, each=True)) if fac.store.exists(path) else ()
    return [row for row in rows if isinstance(row, dict) and isinstance(row.get("id"), str) and "input" in row]


def load_cases(fac: Factory, path: Path, agent: Agent) -> list[dict]:
    """The cases of one half, each checked against the agent's output contract and tools (case_problem); Refusal
    naming the file and every malformed line."""
    where = fac.shown(path)
    if not path.exists():
        raise Refusal(f"{where}: no such file; a suite needs cases before it can prove anything")
    schema = agent.module.OUTPUT_SCHEMA.get("properties")
    contract = Contract(fac, schema if isinstance(schema, dict) else {}, frozenset(agent.contracts))
    cases, first_line, problems = [], {}, []
    for number, case in fac.store.read_jsonl(path, each=True):
        problem = str(case).removeprefix(f"{where} line {number}: ") if isinstance(case, Refusal) else \
            case_problem(case, first_line, contract)
        if problem:
            problems.append(f"line {number}: {problem}")
            continue
        first_line[case["id"]] = number
        cases.append(case)
    if len(problems) == 1:
        raise Refusal(f"{where} {problems[0]}")
    refuse(where, problems)
    if not cases:
        raise Refusal(f"{where}: has no cases")
    return cases


@dataclass(frozen=True)
class Contract:
    """What a case is checked against: the output contract's properties (name -> JSON schema), the tools
    `expect.denied` may name (the agent's, and any a tool module defines: a variant proved on its master's suite
    is denied tools it lacks)."""
    fac: Factory
    properties: dict
    tools: frozenset              # the tools its card's tool modules define (the card's own among them)

    def unknown_tool(self, tool: str) -> str | None:
        """The problem when no tool module defines TOOL, with the nearest; else None."""
        if tool in self.tools:
            return None
        defined = known_tools(self.fac)[0]
        return None if tool in defined else f"a tool no tool module defines{did_you_mean(tool, sorted(self.tools) + defined)}"


# ---- a new agent: its card, module, tool module and suite, made to prove as they are

@dataclass(frozen=True)
class NewFile:
    """One file `new` writes: where, what it holds, what to tell the user."""
    path: Path
    data: str | bytes
    what: str


def new_files(fac: Factory, name: str, effects: tuple[str, ...], owner: str) -> list[NewFile]:
    """A new agent's files, the card last (the agent exists once its card does)."""
    family = module_name(name)
    tools = [f"{family}:{EXAMPLE_TOOLS[effect]}" for effect in effects]
    open_half, sealed_half = NEW_CASES
    return [NewFile(fac.agents / f"{family}.py", new_module(name, effects), "SYSTEM, OUTPUT_SCHEMA and its offline rules"),
            NewFile(fac.agents / "tools" / f"{family}.py", new_tools(name, effects),
                    "its tools: " + ", ".join(f"{tool} ({effect})" for tool, effect in zip(tools, effects))),
            NewFile(fac.suite_path(name, False), cases_text(open_half, "o"), f"the open half: {len(open_half)} cases"),
            NewFile(fac.suite_path(name, True), cases_text(sealed_half, "s"), f"the sealed half: {len(sealed_half)} cases"),
            NewFile(fac.card_path(name), card_text(new_card(name, tools, owner, {"primary": llm.DEFAULT_PRIMARY, "fallback": llm.DEFAULT_FALLBACK})), "the card (`schema` explains each field)")]


def copied_files(fac: Factory, source: Agent, name: str, owner: str) -> list[NewFile]:
    """A new agent copied from source: its entrypoint module (the bytes its digest covers, a line saying
    whence), its open half if any (never the sealed), its card."""
    module = entry_module(source.card)
    note = f"# copied from agents/{module} by `python3 factory.py new {name} --from {source.name}`\n".encode()
    files = [NewFile(fac.agents / f"{module_name(name)}.py", note + fac.code.source(module), f"a copy of agents/{module}")]
    open_half = fac.suite_path(suite_name(fac, source.card, False), False)
    if fac.store.exists(open_half):
        files.append(NewFile(fac.suite_path(name, False), fac.store.read_bytes(open_half, limit=1 << 40),
                             f"the open half, a copy of {fac.shown(open_half)}"))
    return files + [NewFile(fac.card_path(name), card_text(copied_card(source, name, owner)),
                            f"the card, {source.name}'s with the same grants")]


def files_to_write(fac: Factory, name: str, files: list[NewFile]) -> list[NewFile]:
    """The files of `new NAME` not yet there (one holding what `new` writes, no card yet, is a killed `new`'s:
    kept); Refusal when NAME is taken."""
    taken = name_taken(fac, name, files)
    if taken:
        raise Refusal(taken)
    return [made for made in files if not fac.store.exists(made.path)]


def name_taken(fac: Factory, name: str, files: list[NewFile]) -> str | None:
    """Why NAME cannot be a new agent (a lineage master, a card, a file not what `new` writes); else None."""
    earlier = parents(fac).get(name)
    if earlier is not None:
        return f"{name} was stamped from {earlier} before ({fac.shown(fac.lineage)}); pick a new name"
    if fac.store.exists(fac.card_path(name)):
        return f"{fac.shown(fac.card_path(name))} already exists; pick a new name (nothing was written)"
    wanted = {made.path: fac.store.encoded(made.data) for made in files}
    for path in [*wanted, fac.suite_path(name, False), fac.suite_path(name, True)]:
        if fac.store.exists(path) and (path not in wanted or not holds(fac, path, wanted[path])):
            return (f"{fac.shown(path)} already exists and is not what this `new {name}` writes there; pick a new "
                    f"name, or move it away (nothing was written)")
    return None


def holds(fac: Factory, path: Path, data: bytes) -> bool:
    """True when the file at path holds exactly `data`."""
    with fac.store.machine(path, "read"):
        size = path.stat().st_size
    return size == len(data) and fac.store.read_bytes(path) == data


# ================================================================ 3. Trust
# What lets a certificate be believed: signing keys (HMAC, or OpenSSH's ssh-keygen), the evidence key's MACs,
# the chained logs' and index's heads, the evidence behind a signature, the parked calls' decisions, and what
# broker's guards read (ClaimOnDisk).

# ---- keys and signatures

UNSIGNED_FIELDS = ("signature", "revoked")   # revocation is added later and also kept in its own log
SSH_NAMESPACE = "agent-factory"   # ssh-keygen -Y's namespace: a signature made for git or email never verifies here


def read_key(fac: Factory, path: Path) -> bytes:
    """The 64-hex key in a key file; Refusal naming the file otherwise (a cut key lets anyone compute a valid
    HMAC) or when others may read it."""
    text = fac.store.read_key(path)
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise Refusal(f"{path}: not a signing key (expected 64 hex characters); restore it or certify with a new key")
    return text.encode()


def signing_key(fac: Factory, signer: str) -> bytes:
    """The signer's key, created on first use (0600) with a line saying where."""
    path = fac.key_path(signer)
    if not path.exists() and fac.store.create_key(path, os.urandom(32).hex() + "\n"):
        print(f"created signing key for {signer} at {path} (mode 0600; keep it out of the repo)", file=sys.stderr)
    return read_key(fac, path)


def signed_part(obj: dict, unsigned: tuple = UNSIGNED_FIELDS) -> bytes:
    """What a signature or MAC covers: the canonical JSON of obj but its unsigned fields."""
    return canonical({key: value for key, value in obj.items() if key not in unsigned})


def hmac_hex(key: bytes, data: bytes) -> str:
    """'hmac-sha256:<64 hex>' of data under key."""
    import hashlib
    import hmac
    return "hmac-sha256:" + hmac.new(key, data, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Signer:
    """A person who signs (a certificate, a decision): by their HMAC key in the keys folder, or OpenSSH key
    `ssh_key` through `ssh-keygen -Y sign`, verified against the trusted allowed-signers file."""
    name: str
    ssh_key: Path | None = None

    def ready(self, fac: Factory, station: str) -> None:
        """Refusal, before anything is shown or written, when this signer cannot sign here: no HMAC key (never
        made here), a key others may read, an ssh key missing or not a trusted signer's."""
        if self.ssh_key is not None:
            fac.store.ssh_program()
            if not self.ssh_key.is_file():
                raise Refusal(f"--ssh-key {self.ssh_key}: no such key file")
            problem = trusted_signers_problem(fac)
            if problem:
                raise Refusal(f"{station} with --ssh-key: {problem}")
            pub = self.ssh_key.with_name(self.ssh_key.name + ".pub")   # else ssh-keygen derives it (perhaps asking)
            public = " ".join((pub.read_text() if pub.is_file() else fac.store.ssh_keygen(
                ["-y", "-f", str(self.ssh_key)], b"").stdout.decode("ascii", "replace")).split()[:2])
            if f" {public} " not in f" {' '.join(signer_lines(fac, self.name).split())} ":
                raise Refusal(f"--ssh-key {self.ssh_key}: its public key is not listed for {self.name} in the trusted "
                              f"allowed signers ({fac.allowed_signers}), so nothing it signs verifies; add "
                              f"`{self.name} {public}` to it")
            return
        path = fac.key_path(self.name)
        if not path.exists():
            raise Refusal(f"no signing key for {self.name} on this machine ({path}): {station} signs with the "
                          f"person's own key (certify creates one on first use), or with --ssh-key")
        read_key(fac, path)

    def sign(self, fac: Factory, data: bytes) -> str:
        """'hmac-sha256:<hex>' of data, or an armoured ssh signature."""
        if self.ssh_key is None:
            return hmac_hex(read_key(fac, fac.key_path(self.name)), data)
        made = fac.store.ssh_keygen(["-Y", "sign", "-f", str(self.ssh_key), "-n", SSH_NAMESPACE], data)
        armour = made.stdout.decode("ascii", "replace")
        if made.returncode != 0 or not SSH_SIGNATURE.fullmatch(armour):
            raise Refusal(f"--ssh-key {self.ssh_key}: ssh-keygen could not sign with it ({last_line(made.stderr)})")
        return armour

    def signed(self, fac: Factory, body: dict, unsigned: tuple) -> dict:
        """body with its `signature` over all but the unsigned fields."""
        return {**body, "signature": self.sign(fac, signed_part(body, unsigned))}


def same_text(computed: str, given: str) -> bool:
    """Constant-time equality of two ASCII texts."""
    import hmac
    return hmac.compare_digest(computed.encode(), given.encode())


def signature_problem(fac: Factory, signer: str, obj: dict, unsigned: tuple = UNSIGNED_FIELDS) -> str | None:
    """None when obj's `signature` verifies as signer's (by signer's HMAC key here, or `ssh-keygen -Y verify`
    against the trusted allowed signers), else why not; a signature of neither form does not verify."""
    signature, data = obj.get("signature"), signed_part(obj, unsigned)
    if isinstance(signature, str) and HMAC_SIGNATURE.fullmatch(signature):
        key = fac.key_path(signer)
        if not key.exists():
            return f"cannot be checked: {signer}'s key is not on this machine ({key})"
        return None if same_text(hmac_hex(read_key(fac, key), data), signature) else f"does not verify with {signer}'s key"
    if isinstance(signature, str) and SSH_SIGNATURE.fullmatch(signature):
        return None if ssh_verifies(fac, signer, data, signature) else \
            f"does not verify with {signer}'s ssh key in {fac.shown(fac.allowed_signers)}"
    return "does not verify (its signature is neither hmac-sha256 hex nor an ssh signature)"


def trusted_signers_problem(fac: Factory) -> str | None:
    """None when the allowed-signers file, the trust root of ssh signatures, can be trusted (there, outside the
    root, written by no other user); else why not."""
    path = fac.allowed_signers
    if any(place.is_relative_to(fac.root) for place in (path, Path(os.path.realpath(path)))):
        return (f"the allowed signers file {path} is inside the factory root, where anyone who writes the registry "
                f"could add a signer; keep it in the keys folder (or set FACTORY_ALLOWED_SIGNERS outside the root)")
    if not path.is_file():
        legacy = (f" ({fac.shown(fac.registry / 'allowed_signers')} is not read: anyone who writes the registry could "
                  f"add a signer; list the signers you trust in {path})") if (fac.registry / "allowed_signers").exists() else ""
        return f"there is no {path} to check it against{legacy}"
    return owner_problem(path) or replaced_problem(path)


def owner_problem(path: Path) -> str | None:
    """Why PATH is not this user's alone to change (root's counts as ours: root may write anything)."""
    found = os.stat(path)
    if found.st_uid not in (os.geteuid(), 0):
        return f"{path} is owned by another user (uid {found.st_uid}), who may change it; use a file of your own"
    if found.st_mode & 0o022:
        return f"other users may write {path}; fix it with: chmod go-w {path}"
    return None


def replaced_problem(path: Path) -> str | None:
    """Why another user could put another file at PATH: its folder (or its link's) is another user's, or
    writable by others and not sticky."""
    for folder in dict.fromkeys((path.absolute().parent, Path(os.path.realpath(path)).parent)):
        found = folder.stat()
        if found.st_uid not in (os.geteuid(), 0):
            return f"another user (uid {found.st_uid}) owns {folder}, the folder of {path}, and may replace it"
        if found.st_mode & 0o022 and not found.st_mode & stat.S_ISVTX:
            return (f"other users may replace {path} (its folder {folder} is writable by others and not sticky); "
                    f"fix it with: chmod go-w {folder}")
    return None


PIPE_TEXT = 16384   # characters ssh_keygen writes to one pipe before ssh-keygen reads it (an armoured signature's most)


def signer_lines(fac: Factory, signer: str) -> str:
    """The trusted allowed-signers lines naming SIGNER exactly, each rewritten to name SIGNER alone (ssh-keygen
    matches -I against patterns: `*` would trust a key for every signer); Refusal past PIPE_TEXT."""
    path = fac.allowed_signers
    text = fac.store.read_bytes(path, confined=False).decode("utf-8", "replace")
    lines = "".join(f"{signer} {rest}\n" for principals, rest in map(allowed_signer, text.splitlines())
                    if signer in principals)
    if len(lines) > PIPE_TEXT:
        raise Refusal(f"{path}: the keys listed for {signer} are longer than one check reads ({PIPE_TEXT} characters)")
    return lines


def ssh_verifies(fac: Factory, signer: str, data: bytes, signature: str) -> bool:
    """True when `ssh-keygen -Y verify` accepts signature over data as signer's by a key signer_lines lists;
    Refusal when the allowed signers cannot be trusted or there is no ssh-keygen."""
    problem = trusted_signers_problem(fac)
    if problem:
        raise Refusal(problem)
    lines = signer_lines(fac, signer)
    if not lines:
        return False
    checked = fac.store.ssh_keygen(["-Y", "verify", "-f", "{signers}", "-I", signer, "-n", SSH_NAMESPACE,
                                    "-s", "{signature}"], data, {"signers": lines, "signature": signature})
    return checked.returncode == 0


# ---- the factory evidence key: MACs on what certify relies on

def evidence_key(fac: Factory, create: bool) -> bytes | None:
    """The factory evidence key ($FACTORY_EVIDENCE_KEY, else KEYS_DIR/_evidence.key, checked like a signing key,
    created when `create` and the keys folder is writable), read once per station; None when there is none."""
    if fac.store.evidence is not None:
        return fac.store.evidence
    given = fac.env.get("FACTORY_EVIDENCE_KEY")
    if given is not None:   # CI's secret: runners that share it make records that verify on each other
        refuse_if(not re.fullmatch(r"[0-9a-f]{64}", given.strip()) and "FACTORY_EVIDENCE_KEY is not an evidence key "
                  "(64 hex characters, as KEYS_DIR/_evidence.key holds)")
        fac.store.evidence = given.strip().encode()
        return fac.store.evidence
    path = fac.evidence_key_path
    if create and not path.exists() and fac.store.keys_writable() \
            and fac.store.create_key(path, os.urandom(32).hex() + "\n"):
        print(f"created the factory evidence key at {path} (mode 0600; it seals proof records and index rows; "
              f"keep it out of the repo)", file=sys.stderr)
    fac.store.evidence = read_key(fac, path) if path.exists() else None
    return fac.store.evidence


def mac_verifies(key: bytes, obj: dict) -> bool:
    """True when obj's `mac` is the HMAC of its other fields under key."""
    mac = obj.get("mac")
    return isinstance(mac, str) and HMAC_SIGNATURE.fullmatch(mac) is not None \
        and same_text(hmac_hex(key, signed_part(obj, ("mac",))), mac)


def sealing_key(fac: Factory) -> bytes | None:
    """The evidence key to seal with (made on first use); None, noted, when there is none."""
    key = evidence_key(fac, create=True)
    if key is None:
        note(fac, f"no factory evidence key at {fac.evidence_key_path} and the keys folder cannot be written: "
                  f"proof records and index rows are written without a MAC and count as no evidence")
    return key


def sealed_evidence(fac: Factory, obj: dict, named: bool = False) -> dict:
    """obj with its `mac` (`named`: and the key's id `mac_key`); as it is with no key (no evidence then)."""
    key = sealing_key(fac)
    if key is None:
        return obj
    obj = redact({**obj, "mac_key": key_id(key)} if named else obj, fac.store.hidden)   # as the store writes it
    return {**obj, "mac": hmac_hex(key, signed_part(obj, ("mac",)))}


def key_id(key: bytes) -> str:
    """A key's public id: 16 hex of a labelled sha256."""
    return sha256(b"factory evidence key id\n" + key)[7:23]


def evidence_problem(fac: Factory, obj: dict) -> str | None:
    """None when obj's MAC verifies under the evidence key; else why not."""
    if "mac" not in obj:
        return "carries no evidence MAC (written by hand, or without an evidence key)"
    key = evidence_key(fac, create=False)
    if key is None:
        return f"cannot be checked: the factory evidence key is not on this machine ({fac.evidence_key_path})"
    if mac_verifies(key, obj):
        return None
    if obj.get("mac_key", key_id(key)) != key_id(key):
        return (f"was sealed with another factory evidence key (key id {one_line(str(obj['mac_key']))}, this one's "
                f"{key_id(key)}): it was made under another keys folder (FACTORY_KEYS_DIR) or on another machine")
    return "does not verify with the factory evidence key: it was changed after it was written"


# ---- the hash-chained logs and their heads

def chained_logs(fac: Factory) -> dict[str, Chain]:
    """log name -> its hash-chained log, read and verified."""
    return {name: fac.store.read_chain(getattr(fac, name)) for name in CHAINED_LOGS}


# ---- this machine's anchor: the newest state of the registry and index it has written or verified
# A registry put back to an older, self-consistent state (a log emptied, an old certificate copied back, the
# index cut) passes every check of itself. So the keys folder, which the tree's writers cannot write, keeps per
# root the newest head of each log, of the index, and each agent's newest certificate, and verifiers refuse an
# older one. Only what this machine wrote, or a signature verified here, raises it.

ANCHOR_PARTS = ("logs", "certificates", "index")


def read_anchor(fac: Factory) -> dict:
    """This machine's anchor for this root: {"logs": {name: {"count", "hash"}}, "certificates": {agent:
    {"signature", "signed_at"}}, "index": {"bytes", "hash"}}, parts {} when missing."""
    anchor = fac.store.read_private(fac.anchor_path)
    return {part: anchor.get(part) if isinstance(anchor.get(part), dict) else {} for part in ANCHOR_PARTS}


def update_private(fac: Factory, path: Path, read, change, head: dict, unkept: str) -> None:
    """Write {**head, **state} to PATH in the keys folder, under its lock, when change(state) on read()'s state
    says it changed; an unwritable folder only notes `unkept`."""
    if not fac.store.keys_writable():
        note(fac, f"the keys folder {fac.keys_dir} cannot be written: {unkept}")
        return
    with fac.store.keys_locked():
        state = read()
        if change(state):
            fac.store.write_json(path, {**head, **state}, private=True)


def anchor_problem(fac: Factory, chains: dict[str, Chain], logs: dict | None = None) -> str | None:
    """The line naming the first log in `chains` that lost an entry this machine wrote or verified (by the
    anchor's `logs`, read before the chains; default: now), and the fix; None."""
    logs = read_anchor(fac)["logs"] if logs is None else logs
    return next(filter(None, (head_problem(chain, logs[name], f"this machine last wrote or verified it ({fac.anchor_path})",
                                           "a copy that holds them") for name, chain in chains.items()
                              if isinstance(logs.get(name), dict))), None)


def raise_anchor(fac: Factory, logs: dict | None = None, certificates: dict | None = None, index: dict | None = None) -> None:
    """Record in the anchor the log heads, certificates and index head written or verified now, where newer."""
    logs = {name: dict(head) for name, head in (logs or {}).items()}
    certificates = {name: {"signature": cert["signature"], "signed_at": cert["signed_at"]}
                    for name, cert in (certificates or {}).items()}
    index = {key: index[key] for key in ("bytes", "hash")} if index else {}
    def merge(anchor: dict) -> bool:
        fresh = {"logs": {n: h for n, h in logs.items() if newer(anchor["logs"].get(n), h, "count")},
                 "certificates": {n: c for n, c in certificates.items() if newer(anchor["certificates"].get(n), c, "signed_at")},
                 "index": index if index and newer(old := anchor["index"], index, "bytes") and not (   # nor past a cut
                     type(old.get("bytes")) is int and fac.store.head_at(fac.index, old["bytes"]) != old.get("hash")) else {}}
        for part, newest in fresh.items():
            anchor[part].update(newest)
        return any(fresh.values())
    if merge(read_anchor(fac)):   # read first without the lock: most stations have nothing newer to record
        update_private(fac, fac.anchor_path, lambda: read_anchor(fac), merge, {"format": ANCHOR_FORMAT, "root": str(fac.root)},
                       "this machine's anchor of the registry is not kept up to date, so a registry put back to an older "
                       "state may go unnoticed here")


def count_sealed_attempt(fac: Factory, name: str, suite_digest: str | None = None, certified: str | None = None,
                         shard: bool = False) -> None:
    """Count a sealed proof of NAME on `suite_digest` (a `shard` also as "DIGEST shards") in the keys folder
    (the tree cannot lower it); `certified` (a signed_at): mark the counts then."""
    def count(agents: dict) -> bool:
        mine = attempts_of(agents, name)
        if certified:
            mine["certified"] = dict(sorted({**mine["certified"], certified: dict(mine["sealed"])}.items())[-CERTIFIED_MARKS:])
        for key in () if certified else (suite_digest, *[f"{suite_digest} shards"] * shard):
            mine["sealed"][key] = (ran if type(ran := mine["sealed"].get(key)) is int else 0) + 1
        agents[name] = mine
        return True
    update_private(fac, fac.attempts_path, lambda: all_attempts(fac), lambda state: count(state["agents"]),
                   {"format": ATTEMPTS_FORMAT}, "this machine's count of sealed proofs is not kept up to date")


def all_attempts(fac: Factory) -> dict:
    """The keys folder's sealed-attempt counts, every root's: {"agents": {agent: attempts_of}}."""
    agents = fac.store.read_private(fac.attempts_path).get("agents")
    return {"agents": agents if isinstance(agents, dict) else {}}


def append_to_log(fac: Factory, name: str, make) -> dict:
    """Append make(chain) to the chained log NAME under its lock, refused when the log is older than the anchor
    (an entry after a rollback would hide it), then raise the anchor; the entry."""
    path, head = getattr(fac, name), {}
    def checked(chain: Chain) -> dict:
        problem = anchor_problem(fac, {name: chain})
        if problem:
            raise Refusal(problem)
        head["count"] = len(chain.hashes) + 1
        return make(chain)
    entry = fac.store.append_chained(path, checked)
    head["hash"] = sha256(fac.store.line(entry).rstrip(b"\n"))
    raise_anchor(fac, logs={name: head})
    return entry


# ---- revocations

def revoke(fac: Factory, name: str, reason: str) -> bool:
    """Mark NAME's certificate revoked and log it; False when there was none to revoke."""
    path = fac.cert_path(name)
    if not path.exists():
        return False
    cert = fac.store.read_json(path)
    if cert.get("revoked"):
        return False
    entry = {"agent": name, "reason": reason, "at": utc_now(), "signature": cert.get("signature")}
    append_to_log(fac, "revocations", lambda chain: entry)
    fac.store.write_json(path, {**cert, "revoked": {"reason": reason, "at": entry["at"]}})
    return True


def revocation_reason(fac: Factory, name: str, cert: dict) -> str | None:
    """Why NAME's certificate is revoked (its mark, or the revocation log's entry of its signature), one line; None if
    it is not."""
    revoked = cert.get("revoked") or next((row for _, row in fac.store.read_chain(fac.revocations).entries
                                           if row.get("signature") == cert["signature"]), None)
    if not revoked:
        return None
    reason = revoked.get("reason") if isinstance(revoked, dict) else None
    if not isinstance(reason, str) or not reason.strip():
        reason = f"marked revoked in {fac.shown(fac.cert_path(name))}"
    return " ".join(reason.split())


# ---- recalls, sealed proofs, production evidence

RECALL_SHAPE = Shape.of({"agent": str, "reason": str, "at": str})


def recalls_of(fac: Factory, name: str) -> list[dict]:
    """The recalls reaching NAME (its own and its masters'), oldest first."""
    reach = {name, *ancestors(fac, name, recall_reach(fac))}
    return [row for _, row in fac.store.read_chain(fac.recalls, RECALL_SHAPE).entries if row["agent"] in reach]


RECORD_SHAPE = Shape.of({"format": str, "agent": str, "half": str, "at": str, "verdict": str, "passed": bool,
                         "score": (int, float), "passing_cases": int, "cases": int, "pass_bar": (int, float),
                         "rubric": str, "digest": str, "components": dict, "suite": str, "suite_digest": str,
                         "rubric_check": str, "failures": list}, optional={"mac": str})


def sealed_records(fac: Factory, name: str) -> list[tuple[Path, dict]]:
    """(path, record) of every sealed proof of NAME, oldest first."""
    found = []
    for path in sorted((fac.records / name).glob("*.sealed.json")):   # none for no folder
        record = fac.store.read_json(path)
        if isinstance(record, dict) and record.get("format") != RECORD_FORMAT:   # formats are not migrated before 1.0
            raise Refusal(f"{fac.shown(path)}: a {visible(str(record.get('format')))} record, not {RECORD_FORMAT}: re-prove")
        RECORD_SHAPE.check(record, fac.shown(path))
        if not NAME.fullmatch(record["suite"]):
            raise Refusal(f"{fac.shown(path)}: field 'suite' must be a suite name, got {record['suite']!r}")
        found.append((path, record))
    return found


SEALED_COUNTS = ("passing_cases", "cases", "interval", "real", "synthetic", "by_source", "by_expected", "label_sources", "handoff")   # on a certificate


def verified_runs(fac: Factory, agent: Agent, since: str) -> frozenset:
    """The run ids of this agent's digest whose closed row verifies, closed after `since`, gated or not (a full read)."""
    key = evidence_key(fac, create=False)
    return frozenset() if key is None or not fac.store.exists(fac.index) else frozenset(
        row["run_id"] for _, _, raw, row in fac.store.read_jsonl(fac.index, each=True, whole=True) if type(row) is dict
        and row.get("state") == "closed" and (row.get("agent"), row.get("digest")) == (agent.name, agent.digest)
        and str(row.get("at")) > since and line_verifies(key, raw[:-1]))


def index_problem(fac: Factory, cert: dict | None = None) -> str | None:
    """Why the index cannot be counted on (the head it had when `cert` was signed, or this machine anchored, is
    gone; its chain is broken); else None."""
    start, anchored, where = signed_index(cert or {}), read_anchor(fac)["index"], fac.shown(fac.index)
    if fac.store.head_at(fac.index, start["bytes"]) != start["hash"]:
        return (f"{where}: holds less than it did when {fac.shown(fac.cert_path(cert['agent']))} was signed "
                f"({start['bytes']} bytes), or was rewritten: rows were removed; restore it from a copy")
    gone = type(anchored.get("bytes")) is int and fac.store.head_at(fac.index, anchored["bytes"]) != anchored.get("hash")
    return index_tally(fac).chain_problem(where, start["bytes"]) or (
        f"{where}: no longer holds the rows this machine wrote or verified up to byte {anchored['bytes']} ({fac.anchor_path}): "
        f"rows were removed or rewritten since; restore it from a copy that holds them" if gone else None)


# ---- signing a certificate

def certificate(fac: Factory, claim: Claim, signer: Signer) -> dict:
    """The signed certificate of the claim's agent at its tier on its latest sealed proof, with the heads of the
    chained logs and of the index at signing."""
    agent, tier, (path, proof) = claim.agent, claim.tier, claim.proofs[-1]
    cert = {"format": CERT_FORMAT, "agent": agent.name, "tier": tier, "digest": agent.digest,
            "components": agent.components, "sealed_score": proof["score"], "sealed_record": path.name,
            "sealed_counts": {key: proof[key] for key in SEALED_COUNTS if key in proof},
            "sealed_at": proof["at"], "suite_digest": proof["suite_digest"], "grants": agent.card["tools"],
            "denied": agent.card["tools_denied"], "envelope_usd": agent.card["cost_envelope_usd"],
            "identity": agent.card["identity"], "owner": agent.card["owner"], "signer": signer.name, "signed_at": utc_now()}
    production = claim.production(judged_tier(tier))
    cert["certified_rate"] = round(production.rate, 4) if production.runs >= PROMOTION_RUNS else None
    cert["certified_rate_runs"] = production.runs
    cert["chains"] = {name: chain.head for name, chain in chained_logs(fac).items()}
    cert["index"] = index_tally(fac).head   # drift counts only the rows after it
    return signer.signed(fac, cert, UNSIGNED_FIELDS)


def replace_certificate(fac: Factory, name: str, cert: dict) -> None:
    """Put a new certificate in NAME's place in an order a kill cannot break: the old kept in
    registry/history/NAME/, the new written (the switch) and anchored, then the old revoked as superseded."""
    current = fac.cert_path(name)
    old = fac.store.read_bytes(current) if current.exists() else None
    if old is not None:
        fac.store.write_text(fac.history_path(name), old)
    fac.store.write_json(current, cert)
    raise_anchor(fac, logs=cert["chains"], certificates={name: cert}, index=cert["index"])
    try:
        signature = json.loads(old).get("signature") if old is not None else None
    except (ValueError, AttributeError, RecursionError):
        signature = None
    if isinstance(signature, str):
        entry = {"agent": name, "reason": "superseded by a newer certificate", "at": utc_now(), "signature": signature}
        append_to_log(fac, "revocations", lambda chain: entry)


# ---- parked calls, and the approvals log that decides them

PENDING_FORMAT = "factory-pending-2"   # -2: seals the digests of the ticket and the output (input_digest, output_digest)


PENDING_SHAPE = Shape.of({"format": str, "run_id": str, "call": int, "agent": str, "tool": str, "args": dict,
                          "args_digest": str, "certificate": str, "digest": str, "staged_at": str, "expires_at": str},
                         optional={"gate": dict, "input_digest": str, "output_digest": str, "mac": str})


# registry/approvals.jsonl, chained: an entry per decision (broker.DECISIONS), signed by who made it; what the
# verified ones make of a call is broker.call_state.
DECISION_SHAPE = Shape.of({"kind": str, "run_id": str, "call": int, "agent": str, "by": str, "at": str, "signature": str})
# registry/reviews.jsonl, the same way: what a human did with a held draft (broker.REVIEW_DECISIONS)
REVIEW_SHAPE = Shape.of({"kind": str, "decision": str, "agent": str, "run_id": str, "seq": int, "by": str, "at": str,
                         "signature": str})
# the logs of humans' signed decisions: name -> (its entries' shape, what an entry decides on)
DECISION_LOGS = {"approvals": (DECISION_SHAPE, itemgetter("run_id", "call")), "reviews": (REVIEW_SHAPE, itemgetter("run_id", "seq"))}


@dataclass(frozen=True)
class Decision:
    """A human's signed decision on a parked call, not yet appended, and its Signer (who signs its result)."""
    entry: dict
    signer: Signer


def load_pending(fac: Factory, run_id: str, call: int) -> dict:
    """The parked call RUN_ID/CALL, shape-checked; Refusal for an odd id, no such file, or another call's."""
    if not RUN_ID.fullmatch(run_id or "") or call < 1:
        raise Refusal(f"{run_id!r} --call {call} does not name a staged call (see `pending`)")
    path = fac.pending_path(run_id, call)
    if not path.exists():
        raise Refusal(f"no staged call {call} for run {run_id} (see `pending`)")
    entry = fac.store.read_json(path, PENDING_SHAPE)
    if (entry["run_id"], entry["call"]) != (run_id, call):
        raise Refusal(f"{fac.shown(path)}: holds call {entry['call']} of run {entry['run_id']}, not this file's "
                      f"(copied?); not executed.")
    return entry


def decision_problem(fac: Factory, entry: dict) -> str | None:
    """None when a decision's signature verifies as its signer's (`by`), else why not; a key that cannot be read
    (open to others, no ssh-keygen) leaves it unchecked: not believed."""
    by = entry["by"]
    if not SIGNER.fullmatch(by):
        return "names no signer"
    try:
        return signature_problem(fac, by, entry, DECISION_UNSIGNED)
    except Refusal as why:
        return f"cannot be checked ({why})"


def verified_entries(fac: Factory, chain: Chain, wanted=None, log: str = "approvals") -> tuple[list[tuple[int, dict]], dict]:
    """((line number, entry) of each entry of a decision log wanted(entry) selects (default: all) whose
    signature verifies, what it decides on -> a line naming each that does not); one misshapen is neither."""
    (shape, item), verified, doubted = DECISION_LOGS[log], [], {}
    for number, entry in chain.entries:
        if not shape.fits(entry) or (wanted is not None and not wanted(entry)):
            continue
        problem = decision_problem(fac, entry)
        if problem is None:
            verified.append((number, entry))
        else:
            doubted.setdefault(item(entry), []).append(
                f"{chain.where} line {number}: the {one_line(entry['kind'])} entry by {one_line(entry['by'])} {problem}; not counted")
    return verified, doubted


def decisions_of(fac: Factory, wanted=None, log: str = "approvals") -> Decisions:
    """A decision log (DECISION_LOGS), chain verified, each entry wanted(entry) selects (default: all) checked;
    Refusal when it holds less than this machine wrote or verified. Read whole, it raises the anchor to its last
    verified entry."""
    logs = read_anchor(fac)["logs"]
    chain = fac.store.read_chain(getattr(fac, log), DECISION_LOGS[log][0])
    problem = anchor_problem(fac, {log: chain}, logs)
    if problem:
        raise Refusal(problem)
    verified, doubted = verified_entries(fac, chain, wanted, log)
    if wanted is None and verified:
        last = verified[-1][0]
        raise_anchor(fac, logs={log: {"count": last, "hash": chain.hashes[last - 1]}})
    return Decisions(decisions_in(verified, DECISION_LOGS[log][1]), doubted)


def call_record(decisions: list, expires_at: str = "~") -> CallRecord:
    """A parked call's CallRecord by its verified decisions, its expiry (default: never) and whether the process
    its last intent names runs (no lock on a file anyone may replace)."""
    state, last = call_state(decisions, executing=True, expired=utc_now() > expires_at)
    return CallRecord("uncertain-effect" if state == "executing" and not approver_runs(decisions) else state, last, decisions)


def deciding(claim: "ClaimOnDisk", guards: tuple, compose):
    """make(chain) for the approvals log: under its lock, `guards` enforced on the claim read again from the
    log, then compose(claim) -> the entry. Of two deciders racing, the first wins."""
    def make(chain: Chain) -> dict:
        return compose(enforce(with_fields(claim, chain=chain), guards))
    return make


def claiming(approval: Decision):
    """compose(claim) for an approval's intent, signed again naming this process (`pid`, `started`)."""
    def compose(claim: "ClaimOnDisk") -> dict:
        pid = os.getpid()
        body = {key: value for key, value in approval.entry.items() if key not in DECISION_UNSIGNED}
        return approval.signer.signed(claim.fac, {**body, "pid": pid, "started": process_started(pid)}, DECISION_UNSIGNED)
    return compose


def closing(signer: Signer, body: dict, outcome: str):
    """compose(claim) for a result or rejected entry (body), signed, with the run's verdict before and after it
    (broker.closing_verdicts; this call's `outcome`)."""
    def compose(claim: ClaimOnDisk) -> dict:
        run_id, call = claim.entry["run_id"], claim.entry["call"]
        decided = decisions_in(verified_entries(claim.fac, claim.chain, lambda e: e["run_id"] == run_id)[0])
        calls = {n: call_record(decided.get((run_id, n), [])) for n in {*range(1, claim.staging[1] + 1), call}}   # as they stand
        before, after = closing_verdicts(claim.verdict_at_close, [r for n, r in calls.items() if n != call], calls[call], outcome)
        return signer.signed(claim.fac, {**body, "verdict_from": before, "verdict_to": after}, DECISION_UNSIGNED)
    return compose


def read_back_attempts(fac: Factory, entry: dict) -> tuple[bool | None, str]:
    """(written, what reading back finds) of a parked call's effect by its trace's `effect_started` events: True
    when a file one names holds its effect id, None when one cannot be read, else False. It informs a human,
    never decides a retry (a trace can be edited)."""
    try:
        started = [e for _, e in fac.store.read_jsonl(fac.trace_path(entry["agent"], entry["run_id"]))
                   if e.get("event") == "effect_started" and e.get("call") == entry["call"]]
        found = [e for e in started if effect_written(fac, e)]
    except Refusal as why:
        return None, f"cannot be read back ({why})"
    if not started:
        return False, "its trace records no write begun through the store"
    shown = (found or started)[-1]
    where, effect = shown.get("path"), shown.get("effect_id")
    if found:
        return True, f"the effect IS written: {where} holds effect {effect}"
    earlier = f" (nor any of {len(started) - 1} earlier attempt(s))" if len(started) > 1 else ""
    return False, f"the effect was NOT found: {where} holds no effect {effect}{earlier}"


def effect_written(fac: Factory, started: dict) -> bool:
    """True when the file an `effect_started` event names holds a row with its effect id."""
    path = fac.root / str(started.get("path"))
    return path.exists() and any(row.get("effect_id") == started.get("effect_id") for _, row in fac.store.read_jsonl(path))


# ---- the guards: broker's chains (broker.Claim, RUN_GUARDS ...) over evidence read from the factory's files

@dataclass
class ClaimOnDisk(Claim):
    """A broker.Claim whose evidence is read from the factory's files, each piece once, when a guard first asks;
    a file that does not read raises Refusal."""
    fac: Factory = field(default=None, kw_only=True)
    chain: Chain | None = field(default=None, kw_only=True)   # approve: the approvals log as its lock holder reads it (deciding)

    cert = cached_property(lambda self: self.fac.store.read_json(p) if (p := self.fac.cert_path(self.name)).exists() else None)
    missing = cached_property(lambda self: missing_agent(self.fac, self.name))
    trusted_signers = cached_property(lambda self: trusted_signers_problem(self.fac))
    hmac_key = cached_property(lambda self: (str(key := self.fac.key_path(self.cert["signer"])), key.exists()))
    logs = cached_property(lambda self: read_anchor(self.fac)["logs"])
    chains = cached_property(lambda self: (self.logs, chained_logs(self.fac))[1])
    anchor_problem = cached_property(lambda self: anchor_problem(self.fac, self.chains, self.logs))
    anchors = cached_property(lambda self: list(anchors(self.fac, self.name)))
    seen = cached_property(lambda self: read_anchor(self.fac)["certificates"].get(self.name))
    revocation = cached_property(lambda self: revocation_reason(self.fac, self.name, self.cert))
    recalls = cached_property(lambda self: recalls_of(self.fac, self.name))
    card = cached_property(lambda self: load_card(self.fac, self.name))
    code = cached_property(lambda self: code_components(self.fac, self.card))
    agent = cached_property(lambda self: agent_from_card(self.fac, self.card, self.fac.shown(self.fac.card_path(self.name))))
    lineage = cached_property(lambda self: lineage_problem(self.fac, self.name, self.card))
    proofs = cached_property(lambda self: sealed_records(self.fac, self.name))
    suite_digest = cached_property(lambda self: sha256(self.fac.store.read_bytes(self.place("sealed suite"), limit=1 << 40)))
    unpriced = cached_property(lambda self: unpriced(self.fac, self.card))
    index_problem = cached_property(lambda self: index_problem(self.fac))
    counted = cached_property(lambda self: index_tally(self.fac, self.recalls[-1]["at"] if self.recalls else ""))
    record = cached_property(lambda self: call_record(self.decisions.of(self.entry["run_id"], self.entry["call"]),
                                                      self.entry["expires_at"]))
    read_back = cached_property(lambda self: read_back_attempts(self.fac, self.entry))
    recorded = cached_property(lambda self: Trace.read(self.fac, self.entry["run_id"], self.entry["agent"]))
    attempts = cached_property(lambda self: (Trace.read(self.fac, self.entry["run_id"], self.entry["agent"]).later,
                                             with_fields(self).record))   # in this order: see broker.not_carried_out
    staging = cached_property(lambda self: staging_of(self.fac, self.entry))
    one_line = staticmethod(one_line)

    @cached_property
    def ssh_keygen(self) -> str | None:
        """Why ssh-keygen cannot run here, else None."""
        try:
            self.fac.store.ssh_program()
        except Refusal as missing:
            return str(missing)
        return None

    @cached_property
    def decisions(self) -> Decisions:
        """The approvals log's verified decisions on the parked call (others unchecked), from `chain` if
        there."""
        run_id, call = self.entry["run_id"], self.entry["call"]
        wanted = lambda e: (e["run_id"], e["call"]) == (run_id, call)  # noqa: E731
        if self.chain is None:
            return decisions_of(self.fac, wanted)
        verified, doubted = verified_entries(self.fac, self.chain, wanted)
        return Decisions(decisions_in(verified), doubted)

    @property
    def verdict_at_close(self) -> str:
        """The verdict the staging run ended with (its trace's end event); waiting-for-approval, a parking
        run's, when the trace cannot say."""
        try:
            end = self.recorded.end or {}
        except Refusal:
            end = {}
        return end.get("verdict") if isinstance(end.get("verdict"), str) else "waiting-for-approval"

    def signature_problem(self, signer: str, obj: dict, unsigned: tuple = UNSIGNED_FIELDS) -> str | None:
        """signature_problem, on this factory's keys."""
        return signature_problem(self.fac, signer, obj, unsigned)

    def mac_problem(self, obj: dict) -> str | None:
        """evidence_problem, under this factory's evidence key."""
        return evidence_problem(self.fac, obj)

    def production(self, tier: str | None) -> Production:
        """The gated runs of the agent's digest (at `tier`) whose row verifies, after the latest recall reaching it; a
        pass a human overruled (broker.overruled) is not one."""
        found = self.counted.evidence.get(key := f"{self.name}\t{self.agent.digest}") or GatedRuns()
        counts = [found.tiers.get(tier, [0, 0])] if tier is not None else found.tiers.values()
        human = overruled(decisions_of(self.fac, lambda e: e["agent"] == self.name).decided, self.counted.staged_passes,
                          f"{key}\t{tier or ''}")
        return Production(sum(c[0] for c in counts), sum(c[1] for c in counts) - human, tuple(found.unverified_lines),
                          found.unverified, human)

    def recorded_digest(self, value) -> str:
        """recorded_digest, by this factory's Store."""
        return recorded_digest(self.fac, value)

    def raise_anchor(self, **heads) -> None:
        """raise_anchor to what a guard found to hold."""
        raise_anchor(self.fac, **heads)

    def place(self, place: str) -> Path:
        """The path of a place a refusal names (broker.Claim.shown)."""
        fac, entry = self.fac, self.entry or {}
        return {"certificate": lambda: fac.cert_path(self.name), "index": lambda: fac.index, "approvals": lambda: fac.approvals,
                "anchor": lambda: fac.anchor_path, "parked call": lambda: fac.pending_path(entry["run_id"], entry["call"]),
                "proof": lambda: self.proofs[-1][0], "sealed suite": lambda: fac.suite_path(self.proof["suite"], True),
                "trace": lambda: self.recorded.path}[place]()

    def shown(self, place: str) -> str:
        """A place a refusal names, as the user sees it (the anchor, in the keys folder, in full)."""
        return str(self.fac.anchor_path) if place == "anchor" else self.fac.shown(self.place(place))


def anchors(fac: Factory, but: str) -> Iterator[tuple[str, dict]]:
    """(path shown, log heads) of each other agent's certificate whose signature verifies here (an unverified
    one anchors nothing: anyone could have written it)."""
    for path in sorted(fac.registry.glob("*.card.json")):
        try:
            cert = fac.store.read_json(path)
            signer = cert.get("signer")
            if path.name != f"{but}.card.json" and isinstance(cert.get("chains"), dict) and isinstance(signer, str) \
                    and SIGNER.fullmatch(signer) and signature_problem(fac, signer, cert) is None:
                yield fac.shown(path), cert.get("chains")
        except Refusal:   # that agent's own station names what is wrong with its certificate
            continue


def staging_of(fac: Factory, entry: dict) -> tuple[str, int]:
    """(how a parked call's run ended: `closed` (a verified row parked this many calls), `started` (a started
    row only) or `none` (no row: copied under a new run id); the calls it parked)."""
    tally = index_tally(fac)
    verdict, staged, verified = tally.parked.get(entry["run_id"], (None, 0, False))
    if verified and staged >= entry["call"]:
        return "closed", staged
    return ("started" if entry["run_id"] in getattr(tally.agents.get(entry["agent"]), "unclosed", ()) else "none"), 0


def call_standing(fac: Factory, entry: dict, decisions: list) -> tuple[str, str | None]:
    """(a parked call's state, the line naming a file its check could not read, else None), in approve's order:
    unsealed; its call_record's state unless pending; STANDING_GUARDS' (its agent may act, its run ended); else
    pending (unknown when a file, or the trace's event that parked it, cannot be read)."""
    claim, unread = staged_call_claim(fac, entry), set()
    if evidence_problem(fac, entry):
        return "unsealed", None
    try:
        state = call_record(decisions, entry["expires_at"]).state
    except Refusal as why:
        return "unknown", str(why)
    if state != "pending":
        return state, None
    name, line = guard_results(claim, STANDING_GUARDS, Refusal, refusal_line, unread)[-1]
    if not line:
        return "pending", None
    if unread or name == "staged event":
        return "unknown", line
    return STANDING_STATES.get(name) or ("run never closed" if claim.staging[0] == "started" else "not staged"), None


def refusal_line(refusal: Refusal) -> str:
    """A refusal on one line: Problems as 'WHERE: N problems: first; second; ...', so the tower shows and counts
    them as the station lists them."""
    if isinstance(refusal, Problems):
        return f"{refusal.lines[0]}: " + "; ".join(line.strip() for line in refusal.lines[1:])
    return str(refusal)


def enforce(claim: Claim, guards: tuple) -> Claim:
    """The claim when every guard holds, in order; Refusal with the first refusal otherwise (a file a guard
    could not read refuses as it was raised)."""
    refuse_if(first_refusal(claim, guards))
    return claim


def certified_agent(fac: Factory, name: str) -> tuple[Agent, dict]:
    """The agent, its code executed (loaded), and its certificate, when RUN_GUARDS hold (the certificate
    verifies, is not revoked or recalled, covers the code)."""
    claim = enforce(ClaimOnDisk(name, "run", fac=fac), RUN_GUARDS)
    return loaded(fac, claim.agent), claim.cert


def staged_call_claim(fac: Factory, entry: dict, approval: Decision | None = None) -> ClaimOnDisk:
    """The claim that a stored parked call may be executed (on `approval`, for the executor)."""
    return ClaimOnDisk(entry["agent"], "approve", entry=entry, approval=approval, fac=fac)


# ================================================================ 4. Runs
# Owns what happens inside one run of an agent, in every mode: the loop (its worker: llm.AnyWorker) and its
# Stop family, the run gate (detectors, then Sage), the output gate, the verdicts, the trace (header,
# events, end, index row) and the one function that assembles a broker and a loop for a mode.

def parse_output(text: str, schema: dict) -> dict:
    """The first JSON object in the final text that OUTPUT_SCHEMA accepts (llm.json_objects: prose, a fence or a
    note around it do not hide it); Escalated naming the first one's contract break, or for none."""
    found = llm.json_objects(text)
    if not found:
        raise Escalated("the answer holds no json object")
    problems = []
    for value in found:
        problems.append(check_args(schema, value, "output"))
        if problems[-1] is None:
            return value
    raise Escalated(f"the answer breaks the output contract: {problems[0]}")


@dataclass
class Loop:
    """One run of the worker: ask, carry out each tool call through the broker, until a Stop. `record` appends
    a trace event; `spill(name, text) -> path` keeps a text too long to send; `router`: the run gate."""
    worker: "llm.AnyWorker | None"
    broker: Broker
    agent: Agent
    task: str
    record: callable
    spill: callable = None
    steps: int = 0
    cost: float | None = 0.0         # USD so far; None once any call's cost is unknown
    output: dict | None = None
    reason: str = ""
    router: object = None
    cut_off: str = ""                # the stop reason of the last turn that was used for nothing
    unpriced: str = ""               # why the cost is unknown, from the first reply whose cost is (llm.Reply.price)
    unpriced_by: str = ""            # the model that answered that reply ('' for none: it was priced as asked)
    backends: list = field(default_factory=list)   # each reply's backend (llm.Reply.backend)
    models: list = field(default_factory=list)   # the model that answered each reply (llm.Reply.answered_by; '' for none)
    halt: Halt = field(default_factory=Halt)     # the station's
    flush: callable = None                       # Trace.flush
    messages: list = field(default_factory=list)

    @property
    def answered(self) -> list[str]:
        """The models that answered its model replies ('' for a reply naming none), each once, sorted: the
        agent's rules (offline) are no model."""
        return sorted({m for b, m in zip(self.backends, self.models) if not b.startswith("offline")})

    def run(self) -> str:
        """Step until a Stop; its status."""
        self.messages = [{"role": "system", "content": self.agent.module.SYSTEM},
                         {"role": "user", "content": self.clip(self.task, "input")}]
        while True:
            try:
                self.step()
            except Stop as stop:
                self.reason = str(stop)
                return stop.status

    def step(self) -> None:
        """Ask the worker once; text ends the run, tool calls go through the broker. A turn that did not end
        normally or to use tools (cut off, say) is used for nothing, and the worker is asked again."""
        reply = self.ask()
        if not reply.acts:
            self.cut_off = reply.stop_reason or "not recorded"
            self.broker.rule_unrun(reply.tool_calls)   # a denied tool it asked for counts, though nothing ran
            self.messages.append({"role": "user", "content": CUT_OFF_NOTE.format(stop=self.cut_off)})
            return
        if not reply.tool_calls:
            self.output = parse_output(reply.text, self.agent.module.OUTPUT_SCHEMA)
            raise Finished("answered")
        calls = [{"id": c.id, "name": c.name, "args": c.args} for c in reply.tool_calls]
        self.messages.append({"role": "assistant", "content": reply.text, "tool_calls": calls})
        for call in reply.tool_calls:
            outcome = self.broker.carry_out(call.name, call.args, call.id)
            content = self.clip(outcome.result, f"tool-{outcome.seq}")
            self.record({"event": "tool_result", "seq": outcome.seq, "tool_call_id": call.id, "content": content})
            self.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name,
                                  "content": content, "is_error": not outcome.ok})
        if self.router is not None:
            self.router.review(self)

    def ask(self) -> "llm.Reply":
        """Check the step budget and the envelope *before* spending, then call the worker."""
        max_steps = self.agent.card.get("max_steps", 8)
        if self.halt.signum:
            raise Interrupted("")
        if self.steps >= max_steps:
            last = f" (a turn stopped for {self.cut_off}; none of its tool calls ran)" if self.cut_off else ""
            raise Escalated(f"step budget of {max_steps} spent without an answer{last}")
        schemas = self.schemas()
        self.fit_envelope(schemas)
        self.steps += 1
        if self.flush is not None and self.worker.tier() != "offline":   # a kill while it answers keeps the steps
            self.flush()
        reply = self.worker.complete(self.messages, schemas)
        self.cost = None if self.cost is None or reply.cost_usd is None else usd(self.cost + reply.cost_usd)
        if reply.cost_usd is None and not self.unpriced:
            self.unpriced = reply.price.removeprefix("unknown: ") or f"the cost of a reply of {reply.model} is unknown"
            self.unpriced_by = reply.answered_by
        self.backends.append(reply.backend)
        self.models.append(reply.answered_by)
        self.record({"event": "model", "step": self.steps, "backend": reply.backend, "model": reply.model, "requested": reply.requested,
                     "usage": reply.usage, "cost_usd": usd(reply.cost_usd), "price": reply.price,
                     "latency_ms": round(reply.latency_ms, 3),
                     "text": reply.text, "tool_calls": [{"id": c.id, "name": c.name, "args": c.args} for c in reply.tool_calls],
                     "attempts": list(reply.attempts), "headers": reply.headers,
                     "stop_reason": reply.stop_reason, "raw_stop_reason": reply.raw_stop_reason})
        for bad in (a for a in reply.attempts if a["error"].startswith("malformed response")):   # never answered around
            raise Escalated(f"a reply of {bad['model']} could not be read ({bad['error']}); what it asked for is unknown")
        return reply

    def fit_envelope(self, schemas: list[dict]) -> None:
        """OverBudget when the next call would pass the cost envelope; before the first call, the agent's rules
        answer the run instead (offline-over-envelope), the trace says why. An unknown estimate passes."""
        envelope = self.agent.card["cost_envelope_usd"]
        estimate = self.worker.estimate_next_cost(self.messages, schemas)
        if self.cost is None or estimate is None or self.cost + estimate <= envelope:
            return
        why = f"next call (~${estimate:.4f}) would pass the ${envelope} cost envelope at ${self.cost:.4f}"
        if self.steps:
            raise OverBudget(why)
        try:
            self.worker.use_rules(llm.OVER_ENVELOPE)
        except ValueError:   # a worker without rules to answer with
            raise OverBudget(why) from None
        self.record({"event": "envelope", "why": f"{why}: not one model call fits, so the agent's rules answer this run"})

    def restart_clean(self) -> None:
        """Keep the task, the tool calls and their results; drop the model's text."""
        self.messages = [m if m["role"] != "assistant" else {**m, "content": ""} for m in self.messages]

    def schemas(self) -> list[dict]:
        """Tool schemas of the granted, not denied tools only."""
        allowed = [t for t in self.agent.card["tools"] if t not in self.agent.card["tools_denied"]]
        return [{"name": t, "description": self.agent.contracts[t]["description"],
                 "params": self.agent.contracts[t]["params"]} for t in allowed if t in self.agent.contracts]

    def clip(self, text: str, name: str) -> str:
        """Text for the worker: whole when short, else head + tail + where the whole is kept
        (traces/AGENT/RUN_ID/NAME.txt; not in a dry run)."""
        if len(text) <= CLIP_CHARS:
            return text
        where = f"full text at {self.spill(name, text)}" if self.spill else "full text not kept (dry run)"
        head, tail = text[:CLIP_CHARS // 2], text[-CLIP_CHARS // 4:]
        return f"{head}\n[... {len(text) - len(head) - len(tail)} characters clipped; {where} ...]\n{tail}"


def run_loop(loop: Loop) -> str:
    """The loop's status, or `crashed` (traceback in the trace, the reason naming the agent's file and line)
    when its code or model raised; a StoreError is the machine's and goes up."""
    try:
        return loop.run()
    except StoreError:
        raise
    except (Exception, SystemExit) as error:  # the agent's code (even a sys.exit in it) or its model failed:
        # this run crashed, the batch goes on; KeyboardInterrupt still stops the station
        entry = getattr(loop.agent.module, "__file__", None)   # agents/NAME.py: its folder holds all the agent's code
        loop.reason = f"{type(error).__name__}: {error}" + (agent_code_at(Path(entry).parent, error) if entry else "")
        import traceback
        loop.record({"event": "crash", "traceback": traceback.format_exc()})
        return "crashed"


# ---- the run gate: local detectors every step; only when one fires, Sage decides

INTERVENE_P = 0.6            # P(needs intervention) at which the router asks which intervention


ROUTER_ACTIONS = ("continue", "switch_model", "restart_clean", "escalate_human")


@dataclass
class Router:
    """The run gate: local detectors after each step; only when one fires does Sage decide (without Sage, a
    second firing escalates). One model switch and one clean restart at most."""
    sage_client: object            # sage.Sage, or None when there is no key
    record: callable
    fires: int = 0
    switches: int = 0
    restarts: int = 0
    signs: list = field(default_factory=list)   # the Sign of each broker outcome so far, in call order

    def review(self, loop: "Loop") -> None:
        """Only the calls since the last review get their Sign, from what is fixed when made (args by value,
        result), never the args, which the agent may still mutate."""
        self.signs += signs_of(loop.broker.outcomes[len(self.signs):])
        signs = self.signs
        fired = detect(signs, loop.cost, loop.agent.card["cost_envelope_usd"])
        if not fired:
            return
        self.fires += 1
        summary = evidence(signs, fired, loop.cost)
        action, intervention, source, p = self.decide(summary)
        action = self.capped(action)
        self.record({"event": "run_gate", "step": loop.steps, "detectors": fired, "evidence": summary,
                     "tier": loop.worker.tier(), "action": action, "intervention": intervention, "p": p, "source": source})
        self.carry_out(action, loop, fired)

    def decide(self, summary: str) -> tuple[str, bool, str, float | None]:
        """(action, intervention?, source, p): Sage's yesno, then its choice; locally, escalate on the second
        firing."""
        try:
            if self.sage_client is None:
                raise sage.NoKey()
            need = self.sage_client.yesno(summary, "Does this run need intervention?")
            if need.answer != "yes" or need.p is None or need.p < INTERVENE_P:
                return "continue", False, "sage", need.p
            pick = self.sage_client.choice(summary, "Which intervention does this run need?", list(ROUTER_ACTIONS))
            return (pick.chosen if pick.chosen in ROUTER_ACTIONS else "escalate_human"), True, "sage", need.p
        except sage.SageError:
            return ("escalate_human", True, "local", None) if self.fires >= 2 else ("continue", False, "local", None)

    def capped(self, action: str) -> str:
        """A second switch or restart becomes escalate_human."""
        if action == "switch_model" and self.switches >= 1 or action == "restart_clean" and self.restarts >= 1:
            return "escalate_human"
        return action

    def carry_out(self, action: str, loop: "Loop", fired: list[str]) -> None:
        if action == "escalate_human":
            raise Escalated(f"run gate: {', '.join(fired)}")
        if action == "switch_model":
            self.switches += 1
            if not loop.worker.switch_model():
                raise Escalated(f"run gate: {', '.join(fired)}; no other model to switch to")
        if action == "restart_clean":
            self.restarts += 1
            loop.restart_clean()


# ---- the output gate (Sage)

class Clients:
    """The network clients a station's runs share: the gate's Sage client (one attempt, 8 s; the run gate's too)
    and the llm circuit breaker."""

    def __init__(self, env: Mapping[str, str]):
        self.gate = sage.Sage.from_env(env, timeout=8.0)
        self.breaker = llm.Breaker()
        self.router = self.gate if self.gate.usable else None   # the run gate's; its settings are the station's


def gate_output(clients: Clients, agent: Agent, task: str, output: dict, held: list, problems: list[str], tier: str) -> dict:
    """Sage's gate answer on the input, the output and every held call: {result, p, answer, bar, line, why,
    shown (sha256 of what it saw), effects ((seq, tool, args digest): only those may commit)}; `problems`
    keep it from passing. One attempt, 8 s."""
    bar, content = agent.card["evals"]["gate"], gate_content(task, output, held, tier)
    seen = {"shown": sha256(utf8(content)), "effects": [[o.seq, o.tool, args_digest(o.args)] for o in held]}
    try:
        decision = clients.gate.yesno(content, agent.card["gate_question"])
    except sage.SageError as error:   # NoKey among them
        result, said = ("unscored", f"unscored ({error})") if isinstance(error, sage.NoKey) else ("failed", f"FAILED ({error})")
        return {"result": result, "p": None, "answer": None, "bar": bar, "line": f"gate: {said}", "why": said, **seen}
    return {**judge(decision.answer, decision.p, bar, tuple(problems)), **seen}


# ---- verdicts: how a run ends, from separate evidence

def effect_problems(fac: Factory, committed: list, settled: "Settled") -> list[str]:
    """One line per uncertain effect: a committed write that failed or does not read back, a review row not
    written."""
    problems = [f"{o.tool} write FAILED ({o.error})" for o in committed if not o.ok]
    problems += [f"{o.tool} wrote no effect that reads back (receipt {json.dumps(o.receipt)})"
                 for o in committed if o.ok and not read_back(fac, o.receipt)]
    return problems + settled.lost


def read_back(fac: Factory, receipt: dict | None) -> bool:
    """True when the line a receipt names is there with its effect id."""
    try:
        row = fac.store.line_at(receipt["path"], receipt["offset"])
        return row is not None and row.get("effect_id") == receipt["effect_id"]
    except (TypeError, KeyError):
        return False


# ---- the trace: one transcript per run, and its row in the index

STARTED_SHAPE = Shape.of({"state": str, "run_id": str, "agent": str, "at": str, "tier": str, "digest": str})
INDEX_SHAPE = Shape.of({"run_id": str, "agent": str, "at": str, "status": str, "verdict": str, "gate": str,
                        "backends": list, "denied": list, "acted": int, "staged": int, "why": list},
                       optional={"cost_usd": (int, float, type(None)), "p": (int, float, type(None)), "state": str,
                                 "review": int, "mac": str, "models": list, "substitutes": list})
EVENT_SHAPES = {  # what replay and harvest rely on in each kind of event
    "model": Shape.of({"tool_calls": list, "stop_reason": str},
                      optional={"text": str, "usage": dict, "model": str, "cost_usd": (int, float, type(None))}),
    "tool": Shape.of({"seq": int, "tool": str, "ruling": str}),
    "tool_result": Shape.of({"seq": int, "content": str}),
}
CALL_SHAPE = Shape.of({"id": str, "name": str, "args": dict})


@dataclass(frozen=True)
class Recorded:
    """A trace read back: header, events through the end, the end (None: never finished), and `later`, the
    events after it (a parked call's approval)."""
    path: Path
    header: dict
    events: list
    end: dict | None
    later: list = field(default_factory=list)


class Trace:
    """One run's transcript, traces/AGENT/RUN_ID.jsonl, and its index rows: header, `started` row, events, end,
    `closed` row (a run killed between is never closed). A running run holds its trace's lock, its writers
    `pen`. `read` alone refuses a malformed trace."""

    def __init__(self, fac: Factory, agent: str, run_id: str):
        self.fac, self.agent, self.run_id = fac, agent, run_id
        self.path = fac.trace_path(agent, run_id)
        self.effect_tags: dict = {}   # fields every effect the run commits carries besides the gate's
        self.header: dict = {}        # the header it was started with (a trace opened later has none)
        self.log = None
        self.closed = False
        self.pen = threading.RLock()

    @classmethod
    def start(cls, fac: Factory, header: dict) -> "Trace":
        """A new trace: header, then the `started` row (a run refused at either is not counted: its trace is
        removed)."""
        trace = cls(fac, header["agent"], header["run_id"])
        trace.header, trace.log = header, Store.Log(fac.store, trace.path)
        trace.record({"format": TRACE_FORMAT, **header})
        trace.flush()
        try:
            fac.store.append_row(fac.index, {"state": "started", **{key: header[key] for key in STARTED_FIELDS}})
        except BaseException:
            trace.release()
            fac.store.discard(trace.path)
            raise
        return trace

    def record(self, event: dict) -> None:
        """Append one event, stamped `at` unless it has one: held on the run's handle, or (a trace opened later)
        appended under the lock."""
        event = {"at": event.get("at") or utc_now(), **event}
        with self.pen:
            if self.log is not None:
                self.log.append(event)
            else:
                self.fac.store.append_jsonl(self.path, event)

    def flush(self) -> None:
        """Write the events held so far."""
        with self.pen:
            if self.log is not None:
                self.log.flush()

    def release(self) -> None:
        """Write what is held and let go of the handle (idempotent)."""
        if self.log is not None:
            with contextlib.suppress(StoreError):   # one that failed already said why
                self.flush()
            self.log.close()
            self.log = None

    def close(self, row: dict) -> None:
        """The end event (END_FIELDS), then the sealed `closed` row (all but NOT_INDEXED); a trace moved mid-run
        is said in the reason and a note."""
        if self.log is not None and self.log.moved():
            moved = f"the trace was moved away from {self.fac.shown(self.path)} while the run wrote it"
            row["reason"] = "; ".join(filter(None, (row.get("reason"), moved)))
            note(self.fac, f"run {self.run_id}: {moved}; its later events went to the file that was moved, or were lost with it if it was deleted or replaced")
        self.record({"event": "end", **{key: row[key] for key in END_FIELDS}})
        self.flush()
        closed = {"state": "closed", **{k: v for k, v in row.items() if k not in NOT_INDEXED}}
        self.fac.store.append_row(self.fac.index, closed, sealing_key(self.fac))   # counted as evidence
        self.closed, self.row = True, row
        self.release()   # after the closed row: until then the run is still being written (harvest asks)
        if self.fac.otlp:
            with contextlib.suppress(Refusal):   # a trace moved away mid-run is not sent (its reason says so)
                export_run(self.fac, Trace.read(self.fac, self.run_id, self.agent))

    @staticmethod
    def read(fac: Factory, run_id: str, agent: str | None = None) -> Recorded:
        """A run's trace (found by id alone when agent is None); Refusal naming file and line for an odd id, no
        trace, a header not ours, or a malformed event replay relies on."""
        path = fac.trace_path(agent, run_id) if agent else find_trace(fac, run_id)
        where, events, end, later = fac.shown(path), [], None, []
        for number, event in fac.store.read_jsonl(path):   # every line is read: a torn one is refused
            if number == 1:
                check_header(event, where)
            if end is None:
                check_event(event, f"{where} line {number}")
                events.append(event)
                end = event if event.get("event") == "end" else None
            else:
                later.append(event)
        if not events:
            raise Refusal(f"{where}: empty")
        return Recorded(path, events[0], events, end, later)


def check_header(header: dict, where: str) -> None:
    """Refusal unless line 1 is our header, of today's format (not migrated before 1.0)."""
    if header.get("format") != TRACE_FORMAT and str(header.get("format")).startswith("factory-trace-"):
        raise Refusal(f"{where}: a {visible(header['format'])} trace, not {TRACE_FORMAT}: written by an older factory")
    if not (header.get("format") == TRACE_FORMAT and isinstance(header.get("agent"), str)
            and NAME.fullmatch(header["agent"]) and "input" in header):
        raise Refusal(f"{where}: not a {TRACE_FORMAT} trace (no header line)")
    if header.get("tier", "C0") not in TIERS:
        raise Refusal(f"{where} line 1: field 'tier' must be one of {' '.join(TIERS)}, not {header['tier']!r}")


def check_event(event: dict, where: str) -> None:
    """Refusal naming the line for an event lacking what replay and harvest read."""
    shape = EVENT_SHAPES.get(event.get("event"))
    if shape is not None:
        shape.check(event, where)
    for call in event.get("tool_calls", []) if shape is EVENT_SHAPES["model"] else ():
        CALL_SHAPE.check(as_object(call, where), f"{where} tool call")


def find_trace(fac: Factory, run_id: str) -> Path:
    """traces/AGENT/RUN_ID.jsonl; Refusal for an odd or unknown id."""
    if not RUN_ID.fullmatch(run_id or ""):
        raise Refusal(f"{run_id!r} is not a run id (e.g. 20261130T041500123456Z-1a2b3c)")
    found = sorted(fac.traces.glob(f"*/{run_id}.jsonl"))
    if not found:
        raise Refusal(f"no trace for run {run_id} under {fac.shown(fac.traces)}")
    return found[0]


def index_lines(fac: Factory, start: tuple[int, int] = (0, 0)) -> Iterator[tuple[int, dict]]:
    """(line number, row) of each index row from `start` (byte offset, lines before), streamed, each checked
    against its state's shape."""
    if not fac.index.exists():
        return
    where = fac.shown(fac.index)
    for number, row in fac.store.read_jsonl(fac.index, start=start):
        shape = STARTED_SHAPE if row.get("state") == "started" else INDEX_SHAPE
        if not shape.fits(row):
            shape.check(row, f"{where} line {number}")
        yield number, row


# ---- assembling a loop: the one place a broker and a loop are put together

def make_worker(fac: Factory, agent: Agent, task_input, clients: Clients, run_id: str | None) -> "llm.Worker":
    """The agent's llm.Worker, sharing the station's circuit breaker; `run_id` gives its traceparent."""
    return llm.Worker(model=agent.card["model"], env=fac.env, rules=agent.rules, task_input=task_input,
                      breaker=clients.breaker, run_id=run_id, prices=agent.card.get("prices"))


def build_loop(fac: Factory, agent: Agent, mode: str, record, task_input=None, *, tier: str = "C0",
               run_id: str | None = None, worker: "llm.AnyWorker | None" = None, tools: dict | None = None,
               clients: Clients | None = None) -> Loop:
    """A loop for one of MODES: broker at `tier`, the agent's own tools for run and approve (else `tools`), the
    worker (else the agent's llm.Worker via `clients`), and for a run spills and the run gate; events to
    `record`."""
    how = MODES[mode]
    if clients is None and (how.watched or how.asks and worker is None):
        clients = Clients(fac.env)
    if how.own_tools:
        tools = ToolsOnFirstUse(partial(agent.tools_for, fac, run_id))
    broker = Broker(agent.policy_at(tier), agent.contracts, {} if tools is None else tools, how.broker, record)
    if worker is None and how.asks:
        worker = make_worker(fac, agent, task_input, clients, run_id)
    spill = (lambda name, text: fac.store.spill(agent.name, run_id, name, text)) if how.spills else None
    router = Router(clients.router, record) if how.watched else None
    return Loop(worker, broker, agent, task_text(task_input), record, spill=spill, router=router, halt=fac.halt)


# ---- one production run

def run_one(fac: Factory, agent: Agent, cert: dict, task_input, ticket_id: str | None = None,
            tier: str | None = None, clients: Clients | None = None, effect_tags: dict | None = None) -> dict:
    """Run a certified agent on one input at `tier` (default the certificate's): loop, gate, settling, verdict,
    trace and index rows; the row. Committed effects carry `effect_tags`. Refusal for a blank input, before a
    run id."""
    if is_blank(task_text(task_input)):
        raise Refusal(NO_VISIBLE_TEXT)
    tier, clients = tier or cert["tier"], clients or Clients(fac.env)
    run_id, trace, interrupted = new_run_id(), None, None
    try:
        with fac.halt.held():   # counted whole or not at all
            trace = Trace.start(fac, {"run_id": run_id, "agent": agent.name, "ticket": ticket_id, "at": utc_now(),
                                      "digest": agent.digest, "tier": tier, "certified_tier": cert["tier"], "input": task_input})
            trace.effect_tags = dict(effect_tags or {})
            loop = build_loop(fac, agent, "run", trace.record, task_input, tier=tier, run_id=run_id, clients=clients)
            loop.flush = trace.flush
            interrupted = partial(close_run, fac, clients, agent, cert, trace, loop, "interrupted", tier)
            fac.halt.runs[run_id] = (trace, interrupted)
        return close_run(fac, clients, agent, cert, trace, loop, run_loop(loop), tier)
    except KeyboardInterrupt:   # in this thread, before it settled
        if interrupted is not None:
            interrupted()
        raise
    finally:
        fac.halt.runs.pop(run_id, None)
        if trace is not None:
            trace.release()


def close_run(fac: Factory, clients: Clients, agent: Agent, cert: dict, trace: Trace, loop: Loop, status: str,
              tier: str) -> dict:
    """Gate the output and held calls, settle them (none when interrupted), derive the verdict, close the trace;
    the row. Nothing outside traces/ is written before the gate answers."""
    if status == "interrupted":
        loop.reason = f"interrupted by {signal.Signals(fac.halt.signum).name}" if fac.halt.signum else "interrupted"
    cost = cost_problem(fac, agent, loop)
    if clients.router is not None:
        trace.flush()
    named = [model for model in card_models(agent.card) if model != "offline"]
    problems = [problem for problem in (cost, substitution(named, other_models(agent.card, loop.answered))) if problem]
    gate = {**gate_run(clients, agent, loop, status, problems, tier), "problems": problems}
    with trace.pen, fac.halt.held():   # after the gate, settled and closed whole
        if trace.closed:
            return trace.row
        trace.record({"event": "gate", **gate})
        handed_off = agent.hands_off(loop.output)
        settled = Settled() if status == "interrupted" else settle_held(fac, agent, cert, trace, loop.broker, tier, gate, handed_off, loop.output)
        uncertain = effect_problems(fac, loop.broker.committed, settled)
        verdict = run_verdict(status, gate["result"], not gate["problems"], handed_off, uncertain, settled.parked,
                              any(row[1] == "duplicate" for row in settled.rows) or bool(loop.broker.denials()))
        reasons = routing_reasons(status, loop, gate, handed_off, uncertain, gate["problems"], settled.routes)
        if reasons and status != "interrupted" and not settled.parked + settled.review and isinstance(loop.output, dict):
            said = queue_review(fac, agent, trace, gate, [{"seq": 1, "tool": OUTPUT_ITEM, "effect": "none",
                                                           "args": loop.output, "why": "; ".join(reasons)}])
            settled.review += "path" in said
            settled.lost += [f"its output could not be queued for review ({said['error']})"] if "error" in said else []
        row = {"run_id": trace.run_id, "agent": agent.name, "at": utc_now(), "digest": agent.digest, "tier": tier,
               "status": status, "reason": loop.reason, "verdict": verdict, "gate": gate["result"], "p": gate["p"],
               "gate_line": gate["line"], "cost_line": cost, "backends": sorted(set(loop.backends)), "cost_usd": loop.cost,
               "models": loop.answered, "substitutes": other_models(agent.card, loop.answered),
               "steps": loop.steps, "denied": loop.broker.denials(), "acted": settled.acted, "staged": settled.parked,
               "review": settled.review, "routed": bool(reasons), "why": reasons, "output": loop.output,
               "tools": [[o.tool, o.ruling] for o in loop.broker.outcomes], "settled": settled.rows}
        trace.close(row)
        return row


def cost_problem(fac: Factory, agent: Agent, loop: Loop) -> str | None:
    """Why the cost is not within the envelope (unknown and why, or over it), else None."""
    envelope = agent.card["cost_envelope_usd"]
    return unknown_cost(fac, agent.card, loop.unpriced, loop.unpriced_by) if loop.cost is None else \
        f"cost outside the cost envelope: ${loop.cost:.4f} of ${envelope}" if loop.cost > envelope else None


def unknown_cost(fac: Factory, card: dict, why: str, by: str = "") -> str:
    """'cost unknown: WHY', naming where to declare a missing price; none is asked when `by`, the model that
    answered, is not one the card names (a price would not make it the card's)."""
    if by and other_models(card, [by]):
        return f"cost unknown: {why}, not a model the card names (another model answered)"
    return f"cost unknown: {why}" + f"; declare one in {fac.shown(fac.card_path(card['agent']))} (prices)" * why.startswith("no price")


def unpriced(fac: Factory, card: dict) -> str | None:
    """unknown_cost for the card's models that neither its `prices` nor llm.PRICES price (each of their runs
    goes to a human); None when all are priced."""
    declared = llm.declared_prices(card.get("prices"))
    models = [m for m in card_models(card) if m != "offline" and llm.price_row(m, declared) is None]
    return unknown_cost(fac, card, f"no price for {', '.join(models)}") if models else None


def gate_run(clients: Clients, agent: Agent, loop: Loop, status: str, problems: list[str], tier: str) -> dict:
    """The gate's answer for a finished run; `not-run` otherwise."""
    if status == "done":
        return gate_output(clients, agent, loop.task, loop.output, loop.broker.held, problems, tier)
    return gate_not_run(status, loop.reason, agent.card["evals"]["gate"])


def settle_held(fac: Factory, agent: Agent, cert: dict, trace: Trace, broker: Broker, tier: str, gate: dict,
                handed_off: bool, output: dict | None = None) -> Settled:
    """Carry out broker.settle on each held call in order, each a `settled` event: commit (its row naming run,
    gate result and p), park (with `output`), queue for review (the drafts in a row in one write), or record
    what it would have done."""
    done, tags, committing, drafts = Settled(), {"gate": gate["result"], "p": gate["p"]}, None, []
    def settled(settlement, event: dict) -> None:
        trace.record(event)
        done.rows.append([settlement.call.tool, settlement.decision, event.get("ruling") or event.get("error")])
        done.routes += [settlement.route] if settlement.route else []
    def to_review() -> None:   # then their events, naming the queue or why it could not be written
        said = queue_review(fac, agent, trace, gate, [{"seq": s.call.seq, "tool": s.call.tool, "effect": s.call.effect, "args": s.call.args, "why": s.why}
                      for s, _ in drafts])
        for settlement, event in drafts:
            done.review += "path" in said
            done.lost += [f"{settlement.call.tool} could not be put in the review queue ({said['error']})"] if "error" in said else []
            settled(settlement, {**event, **said})
        drafts.clear()
    held_back = "; ".join(filter(None, (gate["why"], *gate.get("problems", ()))))   # why the gate did not pass, in full
    for settlement in settle(list(broker.held), tier, gate["result"], handed_off, gate["effects"], agent.act_envelope, held_back,
                             tuple(broker.denials())):
        earlier = settlement.decision == "commit" and settlement.call.effect == "act" and claim_effect(fac, agent, trace, settlement.call)
        settlement = Settlement(settlement.call, "park", f"held for a human: {earlier}", settlement.digest, earlier) if earlier else settlement
        call, decision = settlement.call, settlement.decision
        event = {"event": "settled", "at": utc_now(), "seq": call.seq, "tool": call.tool, "args_digest": settlement.digest,
                 "decision": decision, "why": settlement.why}
        if decision == "review":
            drafts.append((settlement, event))
            continue
        if drafts:   # those settled before it first
            to_review()
        if decision in ("commit", "park"):   # the trace first
            trace.flush()
        if decision == "commit":   # tools made once
            committing = committing or agent.tools_for(fac, trace.run_id, {**tags, **trace.effect_tags}, announcer(trace, None, []))
            committed = broker.commit(call, committing)
            done.acted += committed.ok and committed.effect == "act"
            event["ruling"] = committed.ruling
        elif decision == "park":   # sealed: the executor compares the parked file with this event
            done.parked += 1
            stored = park(fac, agent, cert, trace, done.parked, call, gate, output)
            event = sealed_evidence(fac, {**event, "call": done.parked, "path": fac.shown(stored), "run_id": trace.run_id,
                                          "certificate": cert["signature"], "digest": agent.digest})
        settled(settlement, event)
    if drafts:
        to_review()
    return done


def claim_effect(fac: Factory, agent: Agent, trace: Trace, call: Outcome, claim: bool = True) -> str | None:
    """Mark an acting call's effect as this run's by its contract's unique_by (effect_mark, made exclusively: of two
    runs one wins); None when it is (or names none), else whose it is, or that the marks are gone though the index
    counts acting calls of the agent. `claim` False: marked over what is there."""
    if (marked := effect_mark(fac, agent, call.tool, call.args)) is None:
        return None
    path, mark = marked
    if claim and not fac.store.exists(path.parent) and (acted := index_tally(fac).agents.get(agent.name, Tally()).acted):
        return (f"{fac.shown(path.parent)}, which remembers the unique_by values executed, is missing though {agent.name} "
                f"executed {acted} acting call(s) ({fac.shown(fac.index)}): a call executed before cannot be told from a new one")
    try:
        fac.store.write_json(path, {**mark, "run_id": trace.run_id, "seq": call.seq, "at": utc_now()}, exclusive=claim)
        return None
    except FileExistsError:
        return f"{json.dumps(mark, ensure_ascii=False)} was executed for {mark_holder(fac, path)} already (unique_by)"


def mark_holder(fac: Factory, path: Path) -> str:
    """The run an effect mark names ('run ID'), as a reason says it."""
    with contextlib.suppress(Refusal):
        if isinstance(run := fac.store.read_json(path).get("run_id"), str):
            return f"run {run}"
    return f"a run {fac.shown(path)} does not name"


def marked_note(fac: Factory, entry: dict, agent: Agent | None = None) -> list[str]:
    """approve's and pending's note on a parked call whose effect_mark is there: executed already for its unique_by
    values; none for a tool that does not read; Refusal for a card that does not (`agent`: the entry's, read)."""
    agent = agent or read_agent(fac, entry["agent"])
    with contextlib.suppress(Refusal, KeyError):
        if (marked := effect_mark(fac, agent, entry["tool"], entry["args"])) and fac.store.exists(marked[0]):
            return [f"note: {json.dumps(marked[1], ensure_ascii=False)} was executed already, for "
                    f"{mark_holder(fac, marked[0])} (unique_by): see that it is not done twice"]
    return []


def effect_mark(fac: Factory, agent: Agent, tool: str, args: dict) -> tuple[Path, dict] | None:
    """(outbox/AGENT/unique/KEY.json, {tool, its unique_by values}) of an acting call; None for a contract naming none."""
    key = unique_key(agent.contracts[tool], args)
    return None if key is None else (fac.root / "outbox" / agent.name / "unique" / key[0], {"tool": tool, **key[1]})


def queue_review(fac: Factory, agent: Agent, trace: Trace, gate: dict, rows: list[dict]) -> dict:
    """Append a run's rows to its review queue in one write, its trace flushed first: {"path": the queue} or
    {"error": why not}."""
    path = fac.review_path(agent.name)
    trace.flush()
    try:
        fac.store.append_lines(path, [{"run_id": trace.run_id, **row, "routed": "human", "gate": gate["result"],
                                       "p": gate["p"], "at": utc_now()} for row in rows])
        return {"path": fac.shown(path)}
    except OSError as error:
        return {"error": f"{type(error).__name__}: {error.strerror or error}"}


def park(fac: Factory, agent: Agent, cert: dict, trace: Trace, call: int, outcome: Outcome, gate: dict, output) -> Path:
    """Store a held acting call for approval, sealed whole (arguments, certificate, expiry, the gate's answer,
    the digests of the ticket and `output` approve shows); its path."""
    run_id = trace.run_id
    staged = datetime.now(timezone.utc)
    hours = agent.card.get("approval_expiry_hours", 24)
    entry = {"format": PENDING_FORMAT, "run_id": run_id, "call": call, "agent": agent.name,
             "tool": outcome.tool, "args": outcome.args, "args_digest": args_digest(outcome.args),
             "certificate": cert["signature"], "digest": agent.digest, "staged_at": iso(staged),
             "expires_at": iso(staged + timedelta(hours=hours)),
             "gate": {key: gate[key] for key in ("result", "p", "bar", "shown")},
             "input_digest": recorded_digest(fac, trace.header["input"]), "output_digest": recorded_digest(fac, output)}
    path = fac.pending_path(run_id, call)
    fac.store.write_json(path, sealed_evidence(fac, entry))   # every field, the run id and times included
    return path


def execute_staged_call(fac: Factory, run_id: str, call: int, approval: Decision | None = None) -> dict:
    """Execute one parked call, exactly once, on a signed approval (EXECUTE_GUARDS, checked again whoever
    calls it); the result entry. In order: under the approvals log's lock the call's state read again and
    the `intent` naming this process appended (claiming); effect_started in the trace before each write;
    the effect; the signed `result`, with what was written and the run's verdict before and after."""
    claim = enforce(staged_call_claim(fac, load_pending(fac, run_id, call), approval), EXECUTE_GUARDS)
    entry, agent, writes = claim.entry, loaded(fac, claim.agent), []
    with fac.halt.held():   # a signal waits for the result
        append_to_log(fac, "approvals", deciding(claim, DECIDING_GUARDS, claiming(approval)))
        trace = Trace(fac, agent.name, run_id)   # the run's own trace: the approval is part of its story
        broker = build_loop(fac, agent, "approve", trace.record, tier="C2", run_id=run_id).broker
        held = broker.carry_out(entry["tool"], entry["args"])
        gate = entry.get("gate") if isinstance(entry.get("gate"), dict) else {}
        tools = agent.tools_for(fac, run_id, {"gate": gate.get("result"), "p": gate.get("p")}, announcer(trace, call, writes))
        done = broker.commit(held, tools) if held.ruling == HELD else held
        if done.ok and done.effect == "act":
            claim_effect(fac, agent, trace, done, claim=False)
        refused = writes and not done.ok and not any(w["written"] for w in writes) and read_back_attempts(fac, entry)[0] is not True
        outcome = {"ok": done.ok, "ruling": done.ruling, "result": done.result, "receipt": done.receipt,
                   "read_back": read_back(fac, done.receipt), "written": True if any(w["written"] for w in writes) else
                   False if refused else None}
        body = {"kind": "result", "run_id": run_id, "call": call, "agent": agent.name, "by": approval.signer.name,
                "at": utc_now(), **outcome}
        result = append_to_log(fac, "approvals", deciding(claim, (), closing(approval.signer, body, outcome_of(body))))
    trace.record({"event": "approved_call", "call": call, "at": result["at"], "by": result["by"], **outcome})
    return result


def announcer(trace: "Trace", call: int, writes: list):
    """announce(began) for effect_writer: writes in the run's trace where the effect of parked `call` (None: of
    the run's own commit) is about to be written, read back by `pending` after a kill; keeps `began` in `writes`."""
    def announce(began: dict) -> None:
        trace.record({"event": "effect_started", "call": call, "path": began["path"], "effect_id": began["effect_id"]})
        trace.flush()
        writes.append(began)
    return announce


# ---- the proving ground: every tool a recorder

def prove_case(fac: Factory, agent: Agent, case: dict, clients: Clients | None = None) -> dict:
    """One case, every tool a recorder, judged against `expect`; `seconds` is its wall time."""
    started, events = time.monotonic(), []
    loop = build_loop(fac, agent, "prove", events.append, case["input"], clients=clients)
    status = run_loop(loop)
    expect = dict(case["expect"])
    allowed = set(expect.pop("denied", []))
    got = loop.output or {}
    wrong = {key: {"wanted": want, "got": got.get(key)} for key, want in expect.items() if not same_json(got.get(key), want)}
    denied = loop.broker.denials()
    unexpected = sorted(set(denied) - allowed)
    known = sorted({*agent.contracts, *agent.card["tools"]})
    unknown = {tool: closest(tool, known) for tool in unexpected if tool not in agent.contracts}   # a typo in the rules
    draft = got.get(agent.draft_field)
    draft = draft if isinstance(draft, str) and draft.strip() else None   # no text: nothing for the rubric
    unscorable = status == "done" and "draft_rubric" in agent.card and draft is None   # the rubric has nothing to score
    result = {**case_fields(agent, case), "passed": status == "done" and not wrong and not unexpected and not unscorable,
            "status": status, "reason": loop.reason, "wrong": wrong, "denied": denied, "unscorable": unscorable,
            "unexpected_denials": unexpected, "unknown_tools": unknown, "draft": draft,
            "backends": sorted(set(loop.backends)),
            "models": loop.answered,
            "handed_off": agent.hands_off(loop.output), "rubric_score": None, "rubric_min": None, "seconds": time.monotonic() - started,
            "unpriced": unknown_cost(fac, agent.card, loop.unpriced, loop.unpriced_by) if loop.cost is None else ""}
    return {**result, "answered": answered_by_card_models(agent.card, result)}


def draft_items(agent: Agent, cases: list[dict], results: list[dict], indices: list[int]) -> list:
    """(content, scale Question) of the drafts at `indices`."""
    rubric = agent.card["draft_rubric"]
    question = sage.Question(kind="scale", instructions=rubric["instructions"], levels=rubric["levels"])
    return [(f"Input:\n{task_text(cases[i]['input'])}\n\nThe agent's {agent.draft_field}:\n{results[i]['draft']}", question)
            for i in indices]


def scoring_problem(client) -> tuple[str, str] | None:
    """(rubric state, draft note) when no draft can be scored (no key, or a decision model set up wrong); else
    None."""
    try:
        client.batch([])
    except sage.NoKey:
        return "no key", "unscored (no key)"
    except sage.SageError as error:
        return "failed", f"scoring FAILED ({error})"
    return None


def prove_all(fac: Factory, agent: Agent, cases: list[dict], jobs: int) -> tuple[list[dict], str, str]:
    """Run the cases `jobs` at a time (results in order, one circuit breaker) while drafts are scored in batches
    as each fills; (results, rubric state, draft note)."""
    rubric = agent.card.get("draft_rubric")
    client = sage.Sage.from_env(fac.env, timeout=30.0, retries=2)
    problem = ("none", "no rubric") if not rubric else scoring_problem(client)
    progress, clients = Progress(f"prove {agent.name}", len(cases)), Clients(fac.env)
    results, ready, batches = [], [], []
    from concurrent.futures import ThreadPoolExecutor
    pool, scorer = ThreadPoolExecutor(max_workers=jobs), ThreadPoolExecutor(max_workers=2)
    try:
        for future in [pool.submit(prove_case, fac, agent, case, clients) for case in cases]:
            results.append(future.result())
            progress.tick()
            if problem is None and results[-1]["draft"] is not None:
                ready.append(len(results) - 1)
            if len(ready) == sage.BATCH_MAX or (ready and len(results) == len(cases)):
                batches.append((ready, scorer.submit(client.batch, draft_items(agent, cases, results, ready))))
                ready = []
        answered = [(i, answer) for indices, future in batches for i, answer in zip(indices, future.result())]
    finally:   # at a signal, the cases still waiting are dropped
        for each in (pool, scorer):
            each.shutdown(wait=not fac.halt.signum, cancel_futures=True)
    progress.close()
    return (results, *(problem or apply_draft_scores(results, answered, rubric["min"], agent.draft_field)))


# ---- the proof's record: exit status, summary line, --json and --junit all read its verdict (broker.proof_verdict)

def answered_by_card_models(card: dict, result: dict) -> bool:
    """True when each reply of a case named a card model (llm.same_model), the rules only when the card names
    `offline` and they answered from the start."""
    backends, rules_named = result["backends"], "offline" in card_models(card)
    return bool(backends) and all(not b.startswith("offline") or (b == "offline" and rules_named) for b in backends) \
        and not other_models(card, result["models"])


def other_models(card: dict, models: list[str]) -> list[str]:
    """Those of `models` ('' is none) the card does not name."""
    return [m or "none named" for m in models if not any(llm.same_model(c, m) for c in card_models(card))]


def proof_record(agent: Agent, half: str, suite: str, suite_digest: str, results: list, rubric: str, draft: str,
                 require_model: bool = False, cost_line: str | None = None) -> dict:
    """A proof's record (RECORD_FORMAT) with its verdict and figures (broker.proof_figures)."""
    proof = {"agent": agent.name, "half": half, "at": utc_now(),
             **proof_figures(agent, half, suite, suite_digest, results, rubric, draft, require_model, cost_line)}
    verdict = proof_verdict(proof)
    return {"format": RECORD_FORMAT, "verdict": verdict, "passed": verdict in PASSING, **proof}


# ---- sharded proofs: a slice of a half per CI runner (broker.merge_shards decides the merge)

def blinded(fac: Factory, case_id: str) -> str:
    """A case id as a shard names it: its HMAC under the evidence key, so an uploaded record says nothing of
    which sealed case passed."""
    key = evidence_key(fac, create=True)
    refuse_if(key is None and f"a shard needs the evidence key (FACTORY_EVIDENCE_KEY, or {fac.evidence_key_path})")
    return hmac_hex(key, utf8(f"case {case_id}"))


def shard_record(fac: Factory, agent: Agent, half: str, suite: str, suite_digest: str, shard: tuple[int, int],
                 results: list, rubric: str, draft: str) -> dict:
    """A shard's record: each case's outcome by blinded id; no verdict."""
    keep = OUTCOME + (OPEN_OUTCOME if half == "open" else ())
    return {"format": SHARD_FORMAT, "agent": agent.name, "half": half, "suite": suite, "suite_digest": suite_digest,
            "digest": agent.digest, "shard": list(shard), "at": utc_now(), "rubric": rubric, "rubric_check": draft,
            "cases": {blinded(fac, r["id"]): {key: r[key] for key in keep} for r in results}}


def merged_results(fac: Factory, agent: Agent, half: str, suite_digest: str, cases: list[dict],
                   paths: list[Path]) -> tuple[list[dict], str, str]:
    """(results in suite order, rubric state, draft note) of a half from its shard records; Refusal for a record
    that does not verify, or as merge_shards says."""
    records = [(fac.shown(path), fac.store.read_json(path)) for path in paths]
    for where, record in records:
        refuse_if(evidence_problem(fac, record) and f"{where}: {evidence_problem(fac, record)}")
    keyed = {blinded(fac, case["id"]): case for case in cases}
    want = {"format": SHARD_FORMAT, "agent": agent.name, "half": half, "digest": agent.digest, "suite_digest": suite_digest}
    try:
        outcomes, rubric, note = merge_shards(records, want, lambda k, n: {b for b, c in keyed.items() if in_shard(c["id"], (k, n))})
    except ValueError as problem:
        raise Refusal(str(problem)) from None
    results = [{**case_fields(agent, c), "reason": "", "wrong": {}, "unknown_tools": {}, **outcomes[b]} for b, c in keyed.items()]
    return results, rubric, note or scored_note(results)


# ---- replay: a recorded run against today's code

def recorded_digest(fac: Factory, value) -> str:
    """sha256 of value as the Store writes it in a JSONL line (secrets scrubbed, a lone surrogate as U+FFFD), so
    the value read back has the same digest."""
    return sha256(fac.store.line({"value": value}))


def recorded_reply(event: dict) -> "llm.Reply":
    """An llm.Reply rebuilt from a `model` trace event."""
    calls = tuple(llm.ToolCall(c["id"], c["name"], c["args"]) for c in event.get("tool_calls", []))
    return llm.Reply(event.get("text", ""), calls, event.get("usage", {}), event.get("cost_usd"),
                     event.get("model", ""), "replay", 0.0, stop_reason=event.get("stop_reason", ""),
                     raw_stop_reason=event.get("raw_stop_reason", ""))


# ================================================================ 5. Stations
# cmd_NAME(fac, args) -> exit status, marked @station(...) with the arguments it reads; its docstring is its
# --help; the CLI lists the stations in this order.

# ---- @station: a station's arguments, and what its --help shows after them

def arg(*flags: str, **options) -> tuple:
    """One argument of a station: add_argument's flags and options."""
    return flags, options


def station(*arguments: tuple, examples: tuple[str, ...], exits: tuple[str, str], env: tuple[str, ...],
            more_exits: tuple[tuple[int, str], ...] = ()):
    """Mark cmd_NAME as station NAME with these arguments (arg()) and its --help epilog: examples, what exits 0
    and 1 mean, other exits, the variables it reads (ENVIRONMENT's)."""
    def mark(func):
        func.station_arguments = arguments
        func.station_help = {"examples": examples, "exits": exits, "env": env, "more_exits": more_exits}
        return func
    return mark


ENVIRONMENT = {   # variable -> what it does, as a station's --help lists it
    "FACTORY_ROOT": "the factory root when --root is not given",
    "FACTORY_SEALED_DIR": "where sealed halves live: DIR/SUITE/sealed.jsonl",
    "FACTORY_KEYS_DIR": "signers' and evidence keys (~/.config/agent-factory/keys)",
    "FACTORY_ALLOWED_SIGNERS": "trusted ssh signers (KEYS_DIR/allowed_signers)",
    "FACTORY_EVIDENCE_KEY": "the evidence key itself (a CI secret), not KEYS_DIR's",
    "ANTHROPIC_API_KEY": "claude-* models; with no model key, the agent's own rules",
    "ANTHROPIC_BASE_URL": "another server speaking the Anthropic Messages API",
    "OPENAI_API_KEY": "OpenAI-compatible chat completions",
    "OPENAI_BASE_URL": "an OpenAI-compatible server (vLLM, LM Studio, Ollama...)",
    "MOONSHOT_API_KEY": "kimi-* and moonshot-* models",
    "MOONSHOT_BASE_URL": "another Moonshot endpoint",
    "OPENROUTER_API_KEY": "openrouter/MODEL models",
    "OPENROUTER_BASE_URL": "another OpenRouter endpoint",
    "SAGEROUTE_URL": "send every model call through a SageRoute proxy",
    "SAGEROUTE_TOKEN": "the SageRoute proxy's token",
    "SAGE_API_KEY": "the decision model (Sage); unset: gate results 'unscored'",
    "SAGE_ENDPOINT": "another Sage endpoint, or a local System One server",
    "SAGE_PROTOCOL": "levanto (default) or systemone",
    "SAGE_MODEL": "the decision model's name (System One)",
    "SAGE_REASONING": "Levanto's reasoning setting: auto, off or on",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "export each run to this OTLP/HTTP URL + /v1/traces",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "export each run to exactly this URL",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf (default) or http/json",
    "OTEL_EXPORTER_OTLP_HEADERS": "export headers, k=v,k2=v2 (never recorded)",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "ms an export may take (2000; at most 10000)",
    "OTEL_SERVICE_NAME": "service.name of exported runs (agent-factory)",
    "OTEL_RESOURCE_ATTRIBUTES": "resource attributes of exported runs, k=v,...",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true: export the ticket, output and tool texts",
    "HTTPS_PROXY": "proxy for https model and Sage calls (or https_proxy)",
    "HTTP_PROXY": "proxy for http model and Sage calls (or http_proxy)",
    "USER": "your name where it is recorded (unset: your login name)",
    "XDG_CACHE_HOME": "compiled modules are kept in DIR/agent-factory (~/.cache)",
    "PATH": "where ssh-keygen is found (ssh signatures)",
}
def env_named(*starts: str) -> tuple[str, ...]:
    """The names in ENVIRONMENT starting with one of `starts`, in its order."""
    return tuple(name for name in ENVIRONMENT if name.startswith(starts))


PROXY_ENV, GATE_ENV, OTEL_ENV = env_named("HTTPS_PROXY", "HTTP_PROXY"), env_named("SAGE_"), env_named("OTEL_")
WORKER_ENV = env_named("ANTHROPIC_", "OPENAI_", "MOONSHOT_", "OPENROUTER_", "SAGEROUTE_")
ROOT_ENV = ("FACTORY_ROOT", "FACTORY_KEYS_DIR", "FACTORY_EVIDENCE_KEY", "XDG_CACHE_HOME")   # every station (the keys outside the root)
ENV_COLUMN = 19   # --help puts a longer name on a line of its own: 80 columns
KEYS_ENV = ("FACTORY_ALLOWED_SIGNERS",)   # stations that sign or check a signature
MODEL_ENV = (*WORKER_ENV, *GATE_ENV, *PROXY_ENV)   # stations that ask a worker model and Sage


# ---- argument types: a value that can never work is a usage error (2); a name the factory lacks, a refusal (1)

def checked(fits: Callable[[str], object], wrong: str) -> Callable[[str], str]:
    """An argument type (argparse): the text when fits(text), else `wrong` (its {!r} the text)."""
    def check(text: str) -> str:
        if not fits(text):
            raise argparse.ArgumentTypeError(wrong.format(text))
        return text
    return check


signer_name = checked(SIGNER.fullmatch, "{!r} is not a valid signer name (a letter, then letters, digits . _ -)")
run_id_text = checked(RUN_ID.fullmatch, "{!r} is not a run id (e.g. 20261130T041500123456Z-1a2b3c)")
folder_text = checked(str.strip, "is empty (an unset variable?); name the folder, or leave the option out")
new_agent_name = checked(lambda text: NAME.fullmatch(text) and module_name(text) != "tools",   # agents/tools/ holds tools
                         "{!r} is not a name for a new agent (a lowercase letter, then a-z 0-9 _ -, at most 64; not 'tools')")


def agent_name(text: str) -> str:
    """An agent's name (check_name)."""
    try:
        return check_name(text)
    except Refusal as why:
        raise argparse.ArgumentTypeError(str(why)) from None


def at_least_one(text: str) -> int:
    """A whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def shard_text(text: str) -> tuple[int, int]:
    """K/N, 1 <= K <= N."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise argparse.ArgumentTypeError(f"{text!r} is not K/N with 1 <= K <= N (e.g. 2/3)")
    return int(k), int(n)


def sent_text(text: str, need: str = "the text you sent") -> str:
    """What a human wrote for the record; blank (broker.is_blank) is a usage error."""
    if is_blank(text):
        raise argparse.ArgumentTypeError(f"needs {need}, not blank: it is kept with the record")
    return text


def reason_text(text: str) -> str:
    """sent_text on one line (refusals echo it)."""
    return " ".join(sent_text(text, "a reason").split())


def run_reference(text: str) -> tuple[str | None, str]:
    """(agent or None, run id) from RUN_ID or AGENT/RUN_ID."""
    agent, _, run_id = text.rpartition("/")
    if not RUN_ID.fullmatch(run_id) or (agent and not NAME.fullmatch(agent)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a run id, RUN_ID or AGENT/RUN_ID "
                                         f"(e.g. triager/20261130T041500123456Z-1a2b3c)")
    return agent or None, run_id


def example_tools(text: str) -> tuple[str, ...]:
    """'read', 'draft' or both, comma-separated, in EXAMPLE_TOOLS' order."""
    chosen = [word.strip() for word in text.split(",")]
    unknown = [word for word in chosen if word not in EXAMPLE_TOOLS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{text!r}: the example tools are read and draft, e.g. read,draft; for an acting "
                                         "tool, copy billing:refund from agents/tools/billing.py (effect act, its amounts_usd declared)")
    return tuple(effect for effect in EXAMPLE_TOOLS if effect in chosen)


# ---- arguments several stations take, and what --json prints

JSON_LINES = arg("--json", action="store_true", help="print JSON instead: one object per line (see README)")
SSH_KEY = arg("--ssh-key", metavar="KEY", type=Path,
              help="sign with this OpenSSH key (ssh-keygen -Y sign) instead of the signer's HMAC key; "
                   "verified against the trusted allowed signers (FACTORY_ALLOWED_SIGNERS)")
STAGED_CALL = (arg("run_id", type=run_id_text, metavar="RUN_ID", help="the run that staged the call, as pending lists it"),
               arg("--call", type=at_least_one, default=1, metavar="N", help="which staged call of that run (default 1)"))


def jobs_argument(what: str) -> tuple:
    """--jobs N; None when not given (the station decides: jobs_for)."""
    return arg("--jobs", type=at_least_one, metavar="N", help=f"{what} at a time (default {DEFAULT_JOBS}; 1 when the agent's "
               f"models and the gate are all offline, since such {what} wait on nothing; 1 is exactly sequential); results keep input order")


def printed_json(args, *objects: dict) -> bool:
    """With --json, print each object as a JSON line and return True; else False."""
    for obj in objects if args.json else ():
        print(json.dumps(obj, ensure_ascii=False))
    return args.json


def print_lines(lines, file=None) -> None:
    """One print per line."""
    for line in lines:
        print(line, file=file)


def complained(station: str, problems) -> int:
    """Each problem as `factory STATION: PROBLEM` on stderr; 1 when there was one, else 0."""
    print_lines([f"factory {station}: {problem}" for problem in problems], sys.stderr)
    return 1 if problems else 0


def at_a_terminal(refused: str) -> None:
    """Refusal 'stdin is not a terminal: REFUSED' (what was not done, and why a human does it) without one."""
    if not sys.stdin.isatty():
        raise Refusal(f"stdin is not a terminal: {refused}")


def declined(lines: list[str], question: str) -> str | None:
    """Show lines and ask `QUESTION [y/N]` on stderr: None when the human typed y or yes, else answered()."""
    print_lines(lines, sys.stderr)
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = typed_answer()
    return None if answer in YES else answered(answer)


def signer_of(fac: Factory, args) -> Signer:
    """The Signer of --by NAME [--ssh-key KEY] (the name checked first)."""
    fac.key_path(args.by)
    return Signer(args.by, args.ssh_key.expanduser() if args.ssh_key else None)


# ---- new: an agent of your own

@station(arg("name", type=new_agent_name, metavar="NAME",
             help="the new agent's name: a lowercase letter, then a-z 0-9 _ - (a - becomes _ in its module names)"),
         arg("--from", dest="source", type=agent_name, metavar="AGENT",
             help="start from a copy of AGENT: its module, its card with the same grants, and its open half "
                  "(never its sealed half: write the copy's own)"),
         arg("--tools", type=example_tools, metavar="read,draft",
             help="which example tools to make (default both): read, a lookup that runs at once; draft, a reply "
                  "held until the gate has passed it"),
         examples=("python3 factory.py new faq", "python3 factory.py new faq --tools draft",
                   "python3 factory.py new my-triager --from triager"),
         exits=("the agent was created", "refused: the name is taken, or AGENT does not load; nothing was written"),
         env=(*ROOT_ENV, "FACTORY_SEALED_DIR", "USER"))
def cmd_new(fac: Factory, args) -> int:
    """Create your own agent, ready to prove, certify and run.

    Writes its card, module, tool module (NAME:lookup, NAME:draft), and open and sealed halves whose cases
    pass; --from AGENT copies AGENT's module, card and open half. All or none, the card last: a `new`
    stopped part-way is finished by running it again.
    """
    family = module_name(args.name)
    if args.source is not None and args.tools is not None:
        raise Usage("--tools makes example tools for a new agent; a copy (--from) has its source's tools")
    if args.source is None and not TOOL.fullmatch(f"{family}:draft"):
        raise Usage(f"{args.name!r} is too long to name its tool module agents/tools/{family}.py (at most 32)")
    owner = user_name(fac.env)
    files = (copied_files(fac, source_agent(fac, args.source, args.name), args.name, owner) if args.source
             else new_files(fac, args.name, args.tools or tuple(EXAMPLE_TOOLS), owner))
    with fac.store.locked(fac.masters):   # a second `new` of the name waits, then finds the first one's card
        missing = files_to_write(fac, args.name, files)
        removed = sum(fac.store.remove_temporaries(made.path) for made in files)
        write_new_agent(fac, args.name, missing)
    import shlex
    root = f" --root {shlex.quote(args.root)}" if getattr(args, "root", None) else ""   # the same factory next time
    print_lines(created_lines(args.name, args.source, len(files) - len(missing), removed, root,
                              [(fac.shown(made.path), made.what) for made in files], fac.shown(fac.suite_path(args.name, True))))
    return 0


def source_agent(fac: Factory, source: str, name: str) -> Agent:
    """The agent `new NAME --from SOURCE` copies; Refusal when there is none."""
    if not fac.store.exists(fac.card_path(source)):
        near = did_you_mean(source, [card.stem for card in fac.masters.glob("*.json")])
        raise Refusal(f"no agent named {source} to copy (no {fac.shown(fac.card_path(source))}){near}; --from names an "
                      f"agent that has a card, or leave it out to make {name} from nothing")
    return read_agent(fac, source)


def write_new_agent(fac: Factory, name: str, files: list[NewFile]) -> None:
    """Write a new agent's files all or none, then read it (never executed: a copy may hold anyone's code);
    Refusal, nothing left written, when a file cannot be written or the agent does not read."""
    try:
        with fac.store.creating() as create:
            for made in files:
                create(made.path, made.data)
            read_agent(fac, name)
    except FileExistsError as error:   # made by someone else since name_taken looked
        raise Refusal(f"{fac.shown(Path(error.filename))} appeared while {name} was being created; nothing was written") from None
    except StoreError as why:
        raise Refusal(f"{why}; nothing was written") from None
    except Refusal as why:
        raise Refusal(f"{name} does not load, so nothing was written: {why}") from None


# ---- stamp and restamp: variants, each with the master the lineage log fixes for it

@station(arg("master", type=agent_name, metavar="MASTER", help="the agent to derive from (masters/MASTER.json)"),
         arg("--as", dest="new", type=agent_name, metavar="NEW", required=True,
             help="the variant's name: a lowercase letter, then lowercase letters, digits, - or _"),
         arg("--set", action="append", metavar="PATH=JSON",
             help="override one card field (repeatable): a dotted PATH and a JSON value; a bare word is a string"),
         examples=("python3 factory.py stamp triager --as triager-eu --set owner=eu-lead",
                   "python3 factory.py stamp triager --as strict --set evals.pass_bar=0.95"),
         exits=("the variant was written", "refused: no such master, the name is taken, or the card is invalid"),
         env=ROOT_ENV)
def cmd_stamp(fac: Factory, args) -> int:
    """Derive a variant from a master, with overrides.

    Writes masters/NEW.json (the master's card, each --set applied, with stamped_from, master_digest and
    the overrides restamp re-derives it from) and appends the lineage log.
    """
    try:
        overrides = dict(parse_setting(text) for text in args.set or [])
    except ValueError as why:   # the setting as typed can never work: a usage error
        raise Usage(str(why)) from None
    master = read_agent(fac, args.master)
    path = fac.card_path(check_name(args.new))
    with fac.store.locked(fac.masters):   # new's lock: a `new` of the name removes temporary files beside its card
        return stamp_card(fac, args.master, args.new, overrides, master, path)


def stamp_card(fac: Factory, master_name: str, name: str, overrides: dict, master: Agent, path: Path) -> int:
    """Under the lock on masters/: the lineage entry, then the card (a stamp stopped between: finish_stamp);
    Refusal for a name taken."""
    earlier = parents(fac).get(name)   # the lineage log fixes a name's parent for good, even once its card is gone
    if earlier is not None and earlier != master_name:
        raise Refusal(f"{name} was stamped from {earlier} before ({fac.shown(fac.lineage)}); "
                      f"a name keeps its first parent: pick a new name")
    if path.exists():
        return finish_stamp(fac, master_name, name, overrides, earlier)
    card = derive(master.card, name, overrides, master.digest)
    agent_from_card(fac, card, f"variant {name}", card_problems(card))
    if earlier is None:   # the lineage entry first: a kill before the card leaves no variant the log does not know
        append_to_log(fac, "lineage", first_lineage_entry(name, master_name))
    try:
        fac.store.write_json(path, card, exclusive=True)
    except FileExistsError:
        raise Refusal(f"{name} already exists ({fac.shown(path)}); pick a new name or restamp") from None
    except StoreError as error:
        raise StoreError(f"{error}; its lineage entry is written: run this stamp again to finish it") from None
    print(f"stamped {name} from {master_name}: {fac.shown(path)} overrides {json.dumps(overrides)}")
    return 0


def first_lineage_entry(name: str, master: str):
    """make(chain) for append_to_log: NAME's lineage entry; Refusal if the log has one (two stamps at once)."""
    def make(chain: Chain) -> dict:
        if any(row.get("agent") == name for _, row in chain.entries):
            raise Refusal(f"{name} was stamped a moment ago by another stamp ({chain.where}); pick a new name")
        return {"agent": name, "stamped_from": master, "at": utc_now()}
    return make


def finish_stamp(fac: Factory, master: str, name: str, overrides: dict, earlier: str | None) -> int:
    """The card exists: a stamp stopped before its lineage entry (card says MASTER, the log nothing of NAME) is
    finished, the card as written; else the name is taken."""
    path = fac.card_path(name)
    card, where = read_card(fac, name)
    if earlier is not None or card.get("stamped_from") != master:
        raise Refusal(f"{name} already exists ({where}); pick a new name or restamp")
    if overrides and overrides != card.get("overrides"):
        raise Refusal(f"{name} is a stamp from {master} that stopped half-way ({where} is written, its lineage entry "
                      f"is not); finish it as it was written, with no --set: python3 factory.py stamp {master} --as {name}")
    append_to_log(fac, "lineage", first_lineage_entry(name, master))
    print(f"finished the stamp of {name} from {master}: appended its lineage entry to {fac.shown(fac.lineage)} "
          f"({fac.shown(path)} was written before the stamp stopped)")
    return 0


@station(arg("master", type=agent_name, metavar="MASTER", help="the master whose variants to re-derive"), JSON_LINES,
         examples=("python3 factory.py restamp triager",),
         exits=("done, also when no variant changed", "refused: no such master, or a variant's card is invalid"),
         env=ROOT_ENV)
def cmd_restamp(fac: Factory, args) -> int:
    """Carry a master's fix to every variant stamped from it.

    Each variant, transitively, is re-derived as the master's card plus its own overrides. A variant whose
    card changes has its certificate revoked (kept, marked with the reason): re-prove and re-certify it.
    """
    changed, unchanged, skipped = restamped(fac, args.master)
    # revoke before the cards change: a kill in between leaves them revoked, never runnable on an old signature
    revoked = [name for name in changed if revoke(fac, name, f"restamped: {args.master} changed")]
    for name, card in changed.items():
        fac.store.write_json(fac.card_path(name), card)
    done = {"master": args.master, "restamped": list(changed), "revoked": revoked, "unchanged": unchanged, "skipped": skipped}
    printed_json(args, done) or print_lines(restamp_lines(**done))
    return 0


# ---- prove: a proof record per half (sharded proofs merged into one)

@station(arg("agent", type=agent_name, metavar="AGENT", help="the agent to prove (masters/AGENT.json)"),
         arg("--sealed", action="store_true",
             help="prove the sealed half, the proof certify needs (sealed cases are named by id only)"),
         arg("--json", action="store_true", help=f"print the proof record (format {RECORD_FORMAT}), not the summary"),
         arg("--junit", metavar="FILE", help="also write JUnit XML to FILE (a file, not a folder): one testcase per case"),
         arg("--require-model", action="store_true",
             help="fail the proof (verdict MODEL UNANSWERED) unless the card's models answered every case: a "
                  "missing or bogus key, or a model that is down, would otherwise prove the agent's offline rules"),
         arg("--shard", type=shard_text, metavar="K/N", help="prove the K-th of N slices of the half (by case id) and "
             "write a shard record: no verdict, the merge judges the whole"),
         arg("--merge", nargs="+", type=Path, metavar="RECORD", help="the verdict over the whole half from the shard "
             "records of every slice (each once, this digest and suite), written as the one proof record"),
         jobs_argument("cases"),
         examples=("python3 factory.py prove triager",
                   "python3 factory.py prove triager --sealed --require-model --junit prove.xml",
                   "python3 factory.py prove triager --sealed --shard 2/3",
                   "python3 factory.py prove triager --sealed --merge s1.json s2.json s3.json"),
         exits=("verdict PASS, or PASS WITHOUT RUBRIC (rubric not run); --shard: written", "refused: nothing was proved"),
         more_exits=((PROOF_FAILED, "the proof ran and did not pass: any other verdict (README: In CI)"),),
         env=(*ROOT_ENV, "FACTORY_SEALED_DIR", *MODEL_ENV))
def cmd_prove(fac: Factory, args) -> int:
    """Prove an agent on its open or sealed suite.

    Every case runs with every tool a recorder, on the card's model when its key is set, else the agent's
    offline rules. Writes the proof record under records/AGENT/; prints the verdict, the score's interval
    against the bar, and why each case failed (sealed ones by id only).
    """
    agent = load_agent(fac, args.agent)
    refuse_if(lineage_problem(fac, agent.name, agent.card))   # the suite may be a master's: its lineage must hold
    half = "sealed" if args.sealed else "open"
    suite = suite_name(fac, agent.card, args.sealed)
    path = fac.suite_path(suite, args.sealed)
    cases = load_cases(fac, path, agent)
    refuse_if(overlap_refusal(inputs_of(fac, agent.card, False), inputs_of(fac, agent.card, True)))
    if args.shard and (args.merge or args.junit):
        raise Usage("--shard proves a slice, which has no verdict: --merge and --junit go with the merge", "prove")
    if args.junit:   # before any case runs or any record is written
        if os.path.isdir(args.junit) and not os.path.islink(args.junit):
            raise Refusal(f"--junit {args.junit}: is a folder; --junit names the report's file, e.g. "
                          f"{Path(args.junit) / 'prove.xml'}")
        fac.store.check_report(Path(args.junit))
    started, suite_digest = time.monotonic(), sha256(fac.store.read_bytes(path, limit=1 << 40))
    if args.merge:
        results, rubric, draft = merged_results(fac, agent, half, suite_digest, cases, args.merge)
    else:
        results, rubric, draft = prove_all(fac, agent, [c for c in cases if in_shard(c["id"], args.shard)],
                                           args.jobs or jobs_for(fac, agent, Clients(fac.env)))
    if args.shard:
        args.sealed and count_sealed_attempt(fac, agent.name, suite_digest, shard=True)
        return write_shard(fac, shard_record(fac, agent, half, suite, suite_digest, args.shard, results, rubric, draft), args.json)
    cost = unpriced(fac, agent.card) or next((r["unpriced"] for r in results if r["unpriced"]), None)
    proof = proof_record(agent, half, suite, suite_digest, results, rubric, draft, args.require_model, cost)
    proof.update(merged_shards=len(args.merge)) if args.merge else None
    fac.store.write_json(fac.record_path(agent.name, half), sealed_evidence(fac, proof, named=True))
    if args.sealed and not args.merge:
        count_sealed_attempt(fac, agent.name, proof["suite_digest"])   # where deleting records cannot lower the count
    if args.junit:
        fac.store.write_text(Path(args.junit), junit_xml(proof, results, time.monotonic() - started), outside=True)
    print_block(json.dumps(proof, indent=2)) if args.json else print_lines(proof_summary(proof))
    return 0 if proof["passed"] else PROOF_FAILED


def write_shard(fac: Factory, record: dict, as_json: bool) -> int:
    """Write a shard record, sealed, beside the proof records (never read as one); exit 0."""
    k, n = record["shard"]
    path = fac.record_path(record["agent"], f"{record['half']}-shard-{k}-of-{n}")
    fac.store.write_json(path, sealed_evidence(fac, record))
    print_block(json.dumps(record, indent=2)) if as_json else print(shard_line(record, fac.shown(path)))
    return 0


# ---- certify, and what its prompt shows the signer

@station(arg("agent", type=agent_name, metavar="AGENT", help="the agent to sign for (its latest sealed proof must clear the bar)"),
         arg("--tier", choices=TIERS, required=True,
             help="C0 observe, C1 draft, C2 act with approval, C3 act alone; at most the card's tier_ceiling"),
         arg("--by", type=signer_name, required=True, metavar="NAME", help="who signs; their HMAC key is created on first use"),
         SSH_KEY,
         examples=("python3 factory.py certify triager --tier C1 --by alice",
                   "python3 factory.py certify triager --tier C1 --by alice --ssh-key KEY"),
         exits=("signed", "refused, or declined at the prompt: nothing was signed"),
         env=(*ROOT_ENV, "FACTORY_SEALED_DIR", *KEYS_ENV, "PATH"))
def cmd_certify(fac: Factory, args) -> int:
    """Sign an agent's certificate, as a human at a terminal.

    Needs a verified sealed proof, verdict PASS, of the agent as it is now, and every other guard (suite
    unchanged, tier ceiling, no recall, production evidence at C2/C3, stdin a terminal). Shows what you
    sign and asks `sign it? [y/N]`; signs with the signer's HMAC key (made on first use) or --ssh-key.
    """
    signer = signer_of(fac, args)
    claim = enforce(ClaimOnDisk(args.agent, "certify", tier=args.tier, fac=fac), CERTIFY_GUARDS)
    agent = claim.agent
    if signer.ssh_key is not None:
        signer.ready(fac, "certify")
    elif not fac.key_path(args.by).exists() and not fac.store.keys_writable():
        raise Refusal(f"no key for {args.by} and the keys folder {fac.keys_dir} cannot be created or written (FACTORY_KEYS_DIR)")
    at_a_terminal("unsigned. certification is the station that stays human.")
    if no := declined(certify_prompt(fac, claim, signer), "sign it?"):
        raise Refusal(f"unsigned. you answered {no}; only y or yes signs.")
    if signer.ssh_key is None:
        signing_key(fac, signer.name)   # created on first use, with a line saying where
    cert = certificate(fac, claim, signer)
    problem = signature_problem(fac, signer.name, cert) if signer.ssh_key else None
    if problem:
        raise Refusal(f"unsigned: the ssh signature {problem}; add `{signer.name} <your public key line>` to it")
    replace_certificate(fac, agent.name, cert)
    count_sealed_attempt(fac, agent.name, certified=cert["signed_at"])
    print(f"certified {agent.name} at {args.tier}: {fac.shown(fac.cert_path(agent.name))}")
    return 0


def certify_prompt(fac: Factory, claim: ClaimOnDisk, signer: Signer) -> list[str]:
    """What the signer sees before `sign it?`."""
    agent, card, (path, proof) = claim.agent, claim.agent.card, claim.proofs[-1]
    acting = [tool for tool in card["tools"] if agent.contracts[tool]["effect"] == "act"]
    sealed = sealed_proof_lines(proof, fac.shown(path), fac.evidence_key_path, unpriced(fac, card),
                                [m for m in card_models(card) if m != "offline"], other_models(card, proof.get("models", [])))
    how = f"ssh key {signer.ssh_key}" if signer.ssh_key else "hmac key"
    return [f"{agent.name} at tier {claim.tier}, signed by {signer.name} ({how})", f"  digest {agent.digest}",
            *variant_lines(fac, claim), *sealed, *attempts_lines(claim), production_line(fac, claim),
            *replaced_lines(fac, claim), *paired_lines(fac, claim), grants_line(card, acting, agent.act_envelope),
            "y or yes signs; anything else declines and nothing is signed."]


def attempts_lines(claim: ClaimOnDisk) -> list[str]:
    """Sealed attempts since the last certification (broker.attempts_said), counted here under the suite digest
    (and "DIGEST shards")."""
    try:
        signed = (claim.cert or {}).get("signed_at")
    except Refusal:   # a certificate that cannot be read dates nothing; replaced_lines names it
        signed = None
    since = signed if isinstance(signed, str) else None
    here, shards = (attempts_since(all_attempts(claim.fac)["agents"], claim.name, claim.proof["suite_digest"] + part, since) or 0
                    for part in ("", " shards"))
    return attempts_said(since, [p for _, p in claim.proofs], claim.agent.digest, here - shards, shards, claim.name,
                         claim.fac.shown(claim.fac.records / claim.name))


def production_line(fac: Factory, claim: ClaimOnDisk) -> str:
    """The index's authenticated gated runs of this digest, as certify judges them."""
    below, problem = judged_tier(claim.tier), index_problem(fac)
    production = claim.production(below)
    return (f"  production evidence {evidence_span(claim.recalls, claim.name)}: {production.runs} authenticated gated run(s) "
            f"{f'at {below} (what {claim.tier} is judged on)' if below else 'at any tier'}, gate pass rate {production.rate_text}{production.not_counted(fac.shown(fac.index))}; its held calls "
            f"{reviews_text(review_figures(fac, claim.name, verified_runs(fac, claim.agent, claim.counted.since))[0])}" + (f"; WARNING: {problem}" if problem else ""))


def replaced_lines(fac: Factory, claim: ClaimOnDisk) -> list[str]:
    """The certificate this signature replaces, whether it would run now, the recalls since it was signed."""
    where = fac.shown(fac.cert_path(claim.name))
    try:
        old = claim.cert
    except Refusal as why:
        return [f"  replaces {where}, which cannot be read: {why}"]
    state = None if old is None else certificate_state(fac, claim.name)
    since = "" if old is None else str(old.get("signed_at", ""))
    return replaced_text(where, old, state, claim.proof, [r for r in recalls_of(fac, claim.name) if r["at"] > since])


def paired_lines(fac: Factory, claim: ClaimOnDisk) -> list[str]:
    """On the sealed cases both ran, what this proof fixes and breaks against the one certified before (the
    agent's, else its master's; McNemar exact), or why they cannot be compared."""
    master = parents(fac).get(claim.name)
    try:
        cert = claim.cert or (current_cert(fac, master) if master else None)
    except Refusal:
        return []   # replaced_lines names a certificate that cannot be read
    if not isinstance(cert, dict) or not NAME.fullmatch(str(cert.get("agent"))) or \
            not re.fullmatch(r"[0-9A-Za-z-]+\.sealed\.json", str(cert.get("sealed_record"))):
        return []
    path = fac.records / cert["agent"] / cert["sealed_record"]
    head = f"  against the proof certified before ({fac.shown(path)}, {cert['agent']}'s {cert.get('tier')} of {cert.get('signed_at')})"
    try:
        before = fac.store.read_json(path)
    except Refusal as why:
        return [f"{head}: no paired comparison, it cannot be read ({why})"]
    problem = evidence_problem(fac, before) or ("" if isinstance(before.get("ran"), list) else
                                               "does not list the cases it ran (made by an older factory)")
    if problem:
        return [f"{head}: no paired comparison, that record {problem}"]
    return [f"{head}: {paired_text(before, claim.proof)}"]


def variant_lines(fac: Factory, claim: ClaimOnDisk) -> list[str]:
    """For a variant, each way its card differs from its master's as it is now."""
    master = parents(fac).get(claim.name)
    if master is None:
        return []
    try:
        base = load_card(fac, master)
    except Refusal as why:
        return [f"  variant of {master}, whose card does not load, so what it changes cannot be shown: {why}"]
    changes = card_changes(base, claim.agent.card, ("agent", "tools", "tools_denied", *SET_BY_STAMP), TIERS)
    head = f"  variant of {master}; " + (f"what it changes relative to {master}:" if changes else "the same card but its name")
    return [head, *(f"    {change}" for change in changes)]


# ---- run: one input, or a file of tickets

def load_tickets(fac: Factory, path: Path, piped: bytes | None = None) -> list[tuple[str, str | Refusal]]:
    """(id, input) per line of a tickets file (or `piped` bytes); a bad line's input is its Refusal, its id
    `line N` when it names none. Refusal for the whole file: a sealed half, no tickets, unreadable."""
    if path.resolve().name == "sealed.jsonl" or path.resolve().is_relative_to(fac.sealed_dir) and fac.sealed_dir != fac.evals:
        raise Refusal(f"{fac.shown(path)}: is a sealed half; sealed cases are never run as tickets")
    tickets, where = [], fac.shown(path)
    for number, row in fac.store.read_jsonl(path, confined=False, each=True, piped=piped):
        problem = row if isinstance(row, Refusal) else ticket_problem(row, f"{where} line {number}")
        named = isinstance(row, dict) and isinstance(row.get("id"), str) and row["id"].isprintable() and row["id"]
        tickets.append((row["id"] if named else f"line {number}",
                        Refusal(problem) if isinstance(problem, str) else problem or row["input"]))
    if not tickets:
        raise Refusal(f"{fac.shown(path)}: has no tickets")
    return tickets


@station(arg("agent", type=agent_name, metavar="AGENT", help="the certified agent to run"),
         arg("input", nargs="?", metavar="TEXT", help="the input, one ticket's text (quote it); - reads it from standard input; or --file"),
         arg("--file", metavar="TICKETS.jsonl",
             help='run each line {"id": ..., "input": ...} of a tickets file (- : standard input; blank lines are '
                  "skipped); prints a tab-separated line per ticket: its id, HANDOFF=VALUE (the agent's hand-off field), "
                  "gate=RESULT, verdict=VERDICT, -> where it went and why; on a terminal a header line names them"),
         arg("--json", action="store_true", help="one JSON object per run: the index row, ticket, output, tools, gate line"),
         arg("--input-json", action="store_true", help='TEXT (or -) is the input as JSON, e.g. {"vendor": ..., "text": ...}; '
             "without it TEXT is text, even when it looks like JSON"),
         jobs_argument("tickets"),
         examples=('python3 factory.py run triager "my new card never arrived"',
                   "python3 factory.py run triager --file evals/triager/inbox.jsonl --json"),
         exits=("every run completed, whether or not a human must see it",
                "refused, a run crashed, or a run's effect is uncertain (a write failed)"),
         more_exits=((STDOUT_CLOSED, "stdout closed (--file ... | head): stderr says how many ran"),),
         env=(*ROOT_ENV, "FACTORY_SEALED_DIR", *KEYS_ENV, "PATH", *MODEL_ENV, *OTEL_ENV))
def cmd_run(fac: Factory, args) -> int:
    """Run a certified agent on one input or a file of tickets.

    Reads execute; drafts and acting calls are held until the output gate (Sage) has seen them, then
    settled by tier, gate and hand-off; a run not passed is routed to a human, saying why. An effect not
    written or not read back ends uncertain-effect (exit 1).
    """
    if (args.input is None) == (args.file is None):
        raise Usage("one input: TEXT or --file TICKETS.jsonl, not both and not neither")
    if args.input_json and args.file:
        raise Usage("--input-json reads TEXT as JSON; a tickets file's inputs are JSON already")
    piped = piped_in(one=True) if args.input == "-" else piped_in(one=False) if args.file == "-" else None
    args.input = piped if args.input == "-" else args.input
    try:   # wrong whatever the factory holds: a usage error
        args.input = parse_json(args.input, "--input-json") if args.input_json else args.input
        refuse_if(args.file is None and input_problem(args.input))
    except Refusal as why:
        raise Usage(str(why)) from None
    agent, cert = certified_agent(fac, args.agent)
    tickets = [(None, args.input)] if args.file is None else \
        load_tickets(fac, Path("stdin") if args.file == "-" else Path(args.file), piped)
    clients = Clients(fac.env)
    jobs = args.jobs or (1 if len(tickets) == 1 else jobs_for(fac, agent, clients))
    def emit(ticket_id, row):
        if args.json:
            print(json.dumps({"ticket": ticket_id, **row, "went": went(row)}, ensure_ascii=False))
        else:
            print_lines(run_lines(row)) if args.file is None else print_ticket(ticket_id, row, agent.handoff_field)
        sys.stdout.flush()   # each result as it comes, and a reader that stopped (head) is seen at once
    framed = args.file is not None and not args.json and sys.stdout.isatty()   # a pipe gets the lines alone
    if framed:
        print(*TICKET_COLUMNS.replace("HANDOFF", agent.handoff_field).split("\t"), sep="\t")
    batch = run_tickets(fac, agent, cert, tickets, jobs, emit, clients)
    if framed and batch.reviewed and not batch.closed:
        print(f"{batch.reviewed} held call(s) from {batch.reviewing} run(s) wait for a human in "
              f"{fac.shown(fac.review_path(agent.name))}")
    if said := batch.problems(len(tickets)):
        print(f"factory run: {'; '.join(said)}", file=sys.stderr)
    if batch.closed:
        stdout_closed()
        print(f"factory run: {batch.closed_text(len(tickets))}", file=sys.stderr)
        return STDOUT_CLOSED
    return 1 if batch.failed else 0


def piped_in(one: bool) -> bytes | str:
    """Standard input: all of it (`--file -`), or with `one` one input's text without its last line break."""
    raw = sys.stdin.buffer.read() if sys.stdin is not None else b""
    if is_blank(raw.decode("utf-8", "replace")):
        raise Usage("standard input is empty: pipe " + ("the input in (echo TEXT | run AGENT -)" if one else
                                                       "the tickets in (run AGENT --file - < TICKETS.jsonl)"))
    if not one:
        return raw
    if len(raw) > MAX_LINE_BYTES // 2:
        raise Usage(f"standard input is over {MAX_LINE_BYTES // 2 >> 10} kib, more than one input: pipe tickets to --file -")
    try:
        return decode(raw, "standard input").removesuffix("\n").removesuffix("\r")
    except Refusal as why:
        raise Usage(str(why)) from None


def jobs_for(fac: Factory, agent: Agent, clients: Clients) -> int:
    """Runs at a time unless --jobs says: 1 when they make no network call (no model key for the card, no gate),
    since threads only help runs that wait on one (offline ones would contend for the interpreter)."""
    offline = make_worker(fac, agent, None, clients, None).planned_backend() == "offline" and clients.router is None
    return 1 if offline else DEFAULT_JOBS


def run_tickets(fac: Factory, agent: Agent, cert: dict, tickets: list, jobs: int, emit, clients: Clients) -> Batch:
    """Run tickets `jobs` at a time, each emitted in input order; once stdout closes (BrokenPipeError) none
    starts and those started finish unseen. The drift watch is asked before each ticket, fed each result."""
    drift, progress, inflight = Drift.of_certificate(cert, index_tally(fac)), Progress(f"run {agent.name}", len(tickets)), deque()
    refuse_if(drift.certified and index_problem(fac, cert))
    batch = Batch()
    def finish():
        ticket_id, future = inflight.popleft()
        row = future.result()
        batch.add(row)
        drift.observe(row)
        progress.clear()
        if not batch.closed:
            try:
                emit(ticket_id, row)
                batch.shown += 1
            except BrokenPipeError:
                batch.closed = True
        progress.tick()
    pool = pool_of(jobs)
    try:
        for ticket_id, text in tickets:
            if len(inflight) >= jobs:
                finish()
            if batch.closed:
                break
            if isinstance(text, Refusal):
                inflight.append((ticket_id, refused_ticket(text)))
                continue
            batch.ran += 1
            if drift.demoted:
                print(f"drift: {agent.name} {drift.describe()}; this run is clamped to C0 until it is re-certified.", file=sys.stderr)
            tier = "C0" if drift.demoted else None
            inflight.append((ticket_id, pool.submit(run_one, fac, agent, cert, text, ticket_id, tier, clients)))
        while inflight:
            finish()
    except KeyboardInterrupt:   # its threads' runs (perhaps waiting a minute for a model) closed once not
        fac.halt.holding += 1   # settling; their pens kept: nothing they do later is written
        for trace, close in list(fac.halt.runs.values()):
            trace.pen.acquire()
            close()
        raise
    finally:
        pool.shutdown(wait=not fac.halt.signum)
    progress.close()
    return batch


class Done:
    """A finished call read as a Future. Not concurrent.futures' (~8 ms to import cold) for one at a time."""

    def __init__(self, value=None, error: Exception | None = None):
        self.value, self.error = value, error

    def result(self):
        """The value, or the call's Exception raised."""
        if self.error is not None:
            raise self.error
        return self.value


class Inline:
    """The executor for --jobs 1: submit(fn, *args) calls fn now, in this thread (an Exception kept for
    result(), as a pool keeps it; an interrupt goes up)."""

    def shutdown(self, wait: bool = True) -> None:
        """Nothing to wait for."""

    @staticmethod
    def submit(fn, *args) -> Done:
        """fn(*args), called now."""
        try:
            return Done(fn(*args))
        except Exception as error:
            return Done(error=error)


def pool_of(jobs: int):
    """`jobs` threads, or Inline for one."""
    if jobs == 1:
        return Inline()
    from concurrent.futures import ThreadPoolExecutor
    return ThreadPoolExecutor(max_workers=jobs)


def stdout_closed() -> None:
    """Point stdout at the null device after its reader went away, so what is buffered is dropped at exit
    rather than raising again (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):   # no descriptor: a test's in-memory stream
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def refused_ticket(problem: Refusal) -> Done:
    """The row of a ticket refused, not run (no run id, no trace)."""
    return Done({"run_id": None, "status": "refused", "verdict": None, "gate": "-", "output": None,
                 "routed": True, "why": [str(problem)]})


TICKET_COLUMNS = "ticket\tHANDOFF=\tgate=\tverdict=\t-> where it went"   # run --file's lines, as --help and the header name them


def print_ticket(ticket_id: str, row: dict, handoff: str) -> None:
    """One TICKET_COLUMNS line of run --file (the hand-off value `-` without an output)."""
    out = row["output"] or {}
    value = json.dumps(out[handoff]) if handoff in out else "-"
    print_columns(ticket_id, f"{handoff}={value}", f"gate={row['gate']}", f"verdict={row['verdict'] or '-'}", f"-> {went(row)}")


# ---- tower (section 6)

@station(arg("--json", action="store_true", help=f"print the tower document (format {TOWER_FORMAT})"),
         arg("--html", metavar="FILE", help="write one self-contained HTML page with charts to FILE"),
         examples=("python3 factory.py tower", "python3 factory.py tower --html tower.html"),
         exits=("done: every file the tower reads was read",
                "partial: a file or line could not be read, or FILE cannot be written"),
         env=(*ROOT_ENV, *KEYS_ENV))
def cmd_tower(fac: Factory, args) -> int:
    """Show per agent its trust, runs, gate results and verdicts.

    --json prints the document the text and --html (an offline page of charts) are drawn from; what cannot
    be read is named (partial).
    """
    doc = tower_document(fac)
    if args.json:
        print_block(json.dumps(doc, indent=2))
    elif args.html:
        fac.store.write_text(Path(args.html), render_tower_html(doc), outside=True)
        print(f"wrote {args.html}")
    else:
        print_lines(tower_lines(doc))
    complained("tower", dict.fromkeys(doc["problems"] + [line for agent in doc["agents"] for line in agent["problems"]]))
    return 1 if doc["partial"] else 0


# ---- harvest: flagged runs into proposed eval cases

@station(arg("agent", type=agent_name, metavar="AGENT", help="the agent whose flagged runs to harvest"), JSON_LINES,
         examples=("python3 factory.py harvest triager",),
         exits=("done, also when nothing was flagged", "refused: no such agent, or evalsmith is not certified"),
         env=(*ROOT_ENV, *KEYS_ENV, *MODEL_ENV, *OTEL_ENV))
def cmd_harvest(fac: Factory, args) -> int:
    """Turn an agent's flagged runs into proposed eval cases.

    The certified evalsmith writes one case per flagged run into evals/AGENT/proposed.jsonl, in AGENT's
    output contract (AGENT's own rules its reference); promotion is a human edit.
    """
    target = read_agent(fac, args.agent)
    try:
        smith, smith_cert = certified_agent(fac, "evalsmith")
    except Refusal as why:
        if not fac.cert_path("evalsmith").exists():
            raise Refusal("evalsmith, which writes the proposed cases, is not certified: prove evalsmith --sealed, then "
                          "certify evalsmith --tier C1 --by YOUR_NAME at a terminal") from None
        raise Refusal(f"evalsmith, which writes the proposed cases, may not run: {why}") from None
    with fac.store.locked(fac.records / args.agent):   # two harvests at once never propose one run twice
        done = harvest_flagged(fac, loaded(fac, target), smith, smith_cert)
    proposals = fac.shown(fac.evals / args.agent / "proposed.jsonl")
    printed_json(args, {"agent": args.agent, **vars(done), "proposals": proposals}) or print_lines(
        done.summary(args.agent, proposals, fac.shown(fac.review_path(smith.name))))
    if done.failed:
        print(f"factory harvest: the proposal for {len(done.failed)} run(s) could not be written (evalsmith run(s) "
              f"{', '.join(done.failed)}: see their traces); they stay flagged for the next harvest", file=sys.stderr)
    return 1 if done.failed else 0


def harvest_flagged(fac: Factory, target: Agent, smith: Agent, smith_cert: dict) -> Harvested:
    """Run evalsmith on each flagged run not harvested yet but a sealed case's input (counted, never proposed);
    one whose proposal is written is only recorded. The caller holds the lock."""
    name, log = target.name, fac.records / target.name / "harvested.jsonl"
    done = {row.get("run_id") for _, row in fac.store.read_jsonl(log)} if log.exists() else set()
    todo, result = harvest_candidates(fac, name, done)
    written = proposed_before(fac, name, smith.name)
    found, todo = [row for row in todo if row["run_id"] in written], [row for row in todo if row["run_id"] not in written]
    quiet = quiet_denials(inputs_of(fac, target.card, False), target.handoff_field)
    inputs = [flagged_input(fac, row, target, quiet) for row in todo]  # every trace read before anything is written
    kept = outside_sealed(inputs, inputs_of(fac, target.card, True))
    result.sealed, todo, inputs = len(todo) - len(kept), [todo[i] for i in kept], [inputs[i] for i in kept]
    for row in found:
        fac.store.append_jsonl(log, {"run_id": row["run_id"], "by_run": None, "status": "found proposed"})
    result.found, result.flagged = len(found), len(todo)
    clients = Clients(fac.env)   # one gate client and breaker for the whole harvest
    for row, given in zip(todo, inputs):
        ran = run_one(fac, smith, smith_cert, given, ticket_id=row["run_id"], clients=clients,
                      effect_tags={"source_run": row["run_id"]})
        settled = [(decision, ruling) for tool, decision, ruling in ran["settled"] if tool == "evals:propose"]
        made, held_back = settled.count(("commit", "ok")), settled.count(("review", None))
        result.proposed, result.reviewed = result.proposed + made, result.reviewed + held_back
        if made or held_back:   # a run whose proposal was lost stays flagged for the next harvest
            fac.store.append_jsonl(log, {"run_id": row["run_id"], "by_run": ran["run_id"], "status": ran["status"]})
        elif any(decision in ("commit", "review") for decision, _ in settled):
            result.failed.append(ran["run_id"])   # it was to be written, and could not be
    return result


def harvest_candidates(fac: Factory, name: str, done: set) -> tuple[list[dict], Harvested]:
    """(NAME's runs to harvest, in index order, not in `done`; the count still being written). An unfinished run
    no process writes is one; one killed before its trace began is not."""
    entries = [row for _, row in index_lines(fac) if row["agent"] == name and row["run_id"] not in done]
    closed, todo, result = {row["run_id"] for row in entries if row.get("state") != "started"}, [], Harvested()
    for row in entries:
        if row.get("state") != "started":
            todo += [row] if flagged(row) else []
        elif row["run_id"] not in closed and trace_header(fac, name, row["run_id"]) is not None:
            if fac.store.being_written(fac.trace_path(name, row["run_id"])):
                result.running += 1
            else:
                todo.append({**row, "status": "unfinished", "gate": "not-run", "p": None, "denied": [],
                             "why": ["did not finish: started, never closed (killed mid-way)"]})
    return todo, result


def proposed_before(fac: Factory, name: str, smith: str) -> set[str]:
    """NAME's run ids whose proposal is written: in evals/NAME/proposed.jsonl, or held in evalsmith's queue."""
    found, proposals, review = set(), fac.evals / name / "proposed.jsonl", fac.review_path(smith)
    for _, row in fac.store.read_jsonl(proposals) if fac.store.exists(proposals) else ():
        found |= {row.get("source_run"), *harvest_run_of(row.get("id"))}
    for _, row in fac.store.read_jsonl(review) if fac.store.exists(review) else ():
        args = row.get("args") if isinstance(row.get("args"), dict) else {}
        if row.get("tool") == "evals:propose" and args.get("agent") == name and isinstance(args.get("case"), dict):
            found.update(harvest_run_of(args["case"].get("id")))
    return found - {None}


def trace_header(fac: Factory, agent: str, run_id: str) -> dict | None:
    """A trace's first line; None when there is no trace or it is empty (killed before its header)."""
    path = fac.trace_path(agent, run_id)
    if not fac.store.exists(path):
        return None
    return next((row for _, row in fac.store.read_jsonl(path)), None)


def flagged_input(fac: Factory, row: dict, target: Agent, quiet: list[str]) -> dict:
    """What evalsmith sees of a flagged run (agents/evalsmith.py says each field; `quiet`: quiet_denials)."""
    if row.get("state") == "started":
        header, output = trace_header(fac, row["agent"], row["run_id"]), None
    else:
        recorded = Trace.read(fac, row["run_id"], row["agent"])
        header, output = recorded.header, recorded.end.get("output") if recorded.end else None
    try:
        reference = target.rules(header.get("input"))[1]
    except (Exception, SystemExit):   # the agent's code: its failure is no answer, and harvest goes on
        reference = None
    return {"run_id": row["run_id"], "agent": row["agent"], "input": header.get("input"), "output": output,
            "gate": {"verdict": row.get("gate"), "p": row.get("p")},
            "denials": row.get("denied", []), "why": "; ".join(row.get("why", [])),
            "contract": {"properties": target.module.OUTPUT_SCHEMA.get("properties", {}), "handoff": target.handoff_field,
                         "tools": sorted({*target.contracts, *known_tools(fac)[0]}),   # as load_cases allows
                         "denied_without_handoff": quiet}, "reference": reference}


# ---- recall

@station(arg("agent", type=agent_name, metavar="AGENT", help="the agent to recall, with every variant stamped from it"),
         arg("--reason", type=reason_text, required=True, metavar="TEXT",
             help="why: kept in the recall log and shown in every refusal it causes"), JSON_LINES,
         examples=('python3 factory.py recall triager --reason "drafts promised refunds"',),
         exits=("recalled", "refused: no such agent, or it and every variant are still recalled"),
         env=(*ROOT_ENV, "USER"))
def cmd_recall(fac: Factory, args) -> int:
    """Recall an agent and every variant stamped from it.

    Every new run of them is refused until a sealed proof made after the recall and a new signature; runs
    underway finish and are gated.
    """
    load_card(fac, args.agent)
    variants = descendants(fac, args.agent, recall_reach(fac))   # read (and checked) before anything is written
    refuse_if(recall_refusal(args.agent, {name: recalled_now(fac, name) for name in (args.agent, *variants)}))
    entry = {"agent": args.agent, "reason": args.reason, "at": utc_now(), "by": user_name(fac.env)}
    append_to_log(fac, "recalls", lambda chain: entry)
    if printed_json(args, {**entry, "variants": variants}):
        return 0
    print(f"recalled {args.agent} and {len(variants)} variant(s): {variants}")
    print("every new run of these is refused until a fresh sealed proof and a new signature; runs already underway finish and are gated.")
    return 0


def recalled_now(fac: Factory, name: str) -> dict | None:
    """broker.standing_recall of NAME since its certificate's sealed proof (one that does not read or say when is
    no signature since)."""
    since = current_cert(fac, name).get("sealed_at")
    return standing_recall(recalls_of(fac, name), since if isinstance(since, str) else None)


# ---- doctor: what each agent would use, the gate, the index

KEY_NAMES = tuple(name for name in ENVIRONMENT if name.endswith(("_API_KEY", "_TOKEN")))   # doctor: present or not


def certificate_state(fac: Factory, name: str) -> str:
    """Whether NAME may run now: 'certified C1', or the refusal it would get (no agent code executed)."""
    try:
        return f"certified {enforce(ClaimOnDisk(name, 'run', fac=fac), RUN_GUARDS).cert['tier']}"
    except Refusal as why:
        return str(why)


def gate_report(fac: Factory) -> list[str]:
    """doctor's lines on the gate: the key's presence (never its value), why it is unusable, or a live check."""
    client = sage.Sage.from_env(fac.env, timeout=8.0)
    unusable = None if client.usable else scoring_problem(client)[0] == "no key"
    return gate_lines(client, bool(fac.env.get("SAGE_API_KEY")), sage.USER_AGENT, unusable,
                      None if unusable is not None else client.ready())


@station(JSON_LINES, examples=("python3 factory.py doctor",),
         exits=("done, whatever it found", "refused: the root is no folder, or a key or endpoint no request can use"),
         env=(*ROOT_ENV, *KEYS_ENV, *MODEL_ENV))
def cmd_doctor(fac: Factory, args) -> int:
    """Say which models and gate each agent would use, and why.

    Answers "why is every run routed to a human?": each agent's worker, gate bar and whether it may run;
    the keys set (never their values); a live check of the gate; the index's hash chain from its first row.
    """
    present = [name for name in KEY_NAMES if fac.env.get(name)]
    agents, gate = [doctor_row(fac, path.stem) for path in sorted(fac.masters.glob("*.json"))], gate_report(fac)
    index = index_report(fac)
    if printed_json(args, {"root": str(fac.root), "keys_present": present, "agents": agents, "gate": gate, "index": index}):
        return 0
    print_lines([*doctor_lines(str(fac.root), present, agents), *gate, *index])
    return 0


def doctor_row(fac: Factory, name: str) -> dict:
    """What doctor says of one agent, or why its card does not load."""
    try:
        card = load_card(fac, name)
    except Refusal as why:
        return {"agent": name, "problem": str(why)}
    return {"agent": name, "worker": llm.Worker(model=card["model"], env=fac.env).planned_backend(),
            "primary": card["model"]["primary"], "fallback": card["model"].get("fallback"),
            "calls": {model: llm.calls_to(model, fac.env) for model in card_models(card)},
            "gate_bar": card["evals"]["gate"], "cost": unpriced(fac, card), "state": certificate_state(fac, name)}


def index_report(fac: Factory) -> list[str]:
    """doctor's lines on the index, counted from its first row."""
    fac.store.tally = tally = IndexTally()
    if fac.store.exists(fac.index):
        count_index(fac, tally, evidence_key(fac, create=False))
    return [f"index: {tally.head['lines']} line(s), {len(tally.breaks)} break(s) in its hash chain",
            f"index: {index_problem(fac) or 'whole, holding every row this machine anchored'}"]


# ---- pending, approve, reject: the staged calls a human decides on

@station(JSON_LINES, examples=("python3 factory.py pending",),
         exits=("done, also when nothing waits", "a parked file or log entry does not read or verify: named"),
         env=(*ROOT_ENV, *KEYS_ENV, "PATH"))
def cmd_pending(fac: Factory, args) -> int:
    """List the staged calls and the state of each.

    Oldest first, with the exact arguments and the expiry; one that can no longer be approved says why, an
    uncertain effect what closes it. Only decisions whose signature verifies count; anything that does not
    read or verify is named on stderr (exit 1), and every other call still listed.
    """
    calls = parked(fac)
    states, decided = calls.states, calls.decided or {}
    done = executed_calls(decided, calls.entries)
    shown = sorted((e for e in calls.entries if states[e["run_id"], e["call"]] in ("pending", "unknown", "executing", *STUCK)),
                   key=lambda e: e["staged_at"])
    uncertain = [e for e in calls.entries if states[e["run_id"], e["call"]] == "uncertain-effect"]
    problems = [line for _, line in calls.unread] + calls.doubted
    for e in shown + uncertain:
        call = e["run_id"], e["call"]
        why = [uncertain_column(fac, e, decided[call])] if e in uncertain else state_column(states[call], decided.get(call, []))
        twins, marked = executed_twins(done, e), []   # the same call or effect executed: named, never refused
        try:
            marked = marked_note(fac, e)
        except Refusal as unread:   # its card
            problems.append(f"{call_columns(e)[0]}: whether its effect was executed already (unique_by) could not be "
                            f"worked out: {refusal_line(unread)}")
        if not printed_json(args, {**{key: e[key] for key in PENDING_FIELDS}, "state": states[call], "why": (why or [None])[0],
                                   "executed_before": twins, "marked_executed": (marked or [None])[0]}):
            print(*call_columns(e), f"staged {e['staged_at']}", f"expires {e['expires_at']}",
                  *(why or ["PENDING: approve executes it, reject closes it"]), *twin_lines(twins, one=True), *marked, sep="\t")
    if not shown and not uncertain and not calls.unread and not args.json:
        print("(nothing waits for approval)")
    if calls.log_problem:
        problems.append(f"{calls.log_problem}; the state of every parked call is unknown until it is restored")
    return complained("pending", problems)


PENDING_FIELDS = ("run_id", "call", "agent", "tool", "args", "staged_at", "expires_at")   # of pending --json


def uncertain_column(fac: Factory, entry: dict, decisions: list[dict]) -> str:
    """pending's last column for an uncertain effect."""
    intent = [e for e in decisions if e["kind"] == "intent"][-1]
    return (f"UNCERTAIN-EFFECT: approved by {intent['by']} at {intent['at']}, {one_line(uncertain_said(decisions))}; "
            f"read back: {read_back_attempts(fac, entry)[1]}; {closes(decisions)}")


@dataclass(frozen=True)
class Parked:
    """The parked calls as pending and tower see them, and what was not read or believed."""
    entries: list[dict]
    states: dict                        # (run id, call) -> state
    decided: dict | None                # (run id, call) -> [entry, ...], verified; None when the log cannot be read
    unread: list[tuple[str, str]]       # (run id from the file's name, line) per parked file that does not read
    log_problem: str | None             # why the approvals log cannot be read, when it cannot
    doubted: list = field(default_factory=list)    # one line per decision whose signature does not verify


def parked_files(fac: Factory) -> tuple:
    """(each parked call that reads, (run id, line) per parked file that does not)."""
    entries, unread = [], []
    for path in (p for p in sorted(fac.pending.glob("*.json")) if p.name.count(".") == 2):
        try:
            entries.append(fac.store.read_json(path, PENDING_SHAPE))
        except Refusal as why:
            unread.append((path.name.split(".")[0], f"{why}; skipped"))
    return entries, unread


def parked(fac: Factory) -> Parked:
    """Every parked call and its state by the approvals log's verified decisions; a call a sealed index row
    parked whose file is gone (unless closed) or does not read is in `unread`."""
    entries, unread = parked_files(fac)
    try:
        decisions, log_problem = decisions_of(fac), None
    except Refusal as why:
        decisions, log_problem = None, str(why)
    decided, states = decisions.decided if decisions else None, {}
    for e in entries:
        key = (e["run_id"], e["call"])
        states[key], problem = ("unknown", None) if decided is None else call_standing(fac, e, decided.get(key, []))
        unread += [(e["run_id"], problem)] if problem else []
    for run_id, (_, staged, verified) in index_tally(fac).parked.items():   # sealed rows' calls
        for call in range(1, staged + 1 if verified else 1):
            state = "unknown" if decided is None else call_record(decided.get((run_id, call), [])).state
            if state not in FINAL and not fac.pending_path(run_id, call).exists():
                unread.append((run_id, f"{fac.shown(fac.pending_path(run_id, call))}: missing, though run {run_id}'s "
                                       f"sealed index row parked call {call} ({state}); restore it from a copy"))
    return Parked(entries, states, decided, unread, log_problem, decisions.lines if decisions else [])


def approval_brief(fac: Factory, entry: dict) -> list[str]:
    """What a human needs to decide on a parked call (the trace checked: shows_what_was_staged)."""
    recorded = Trace.read(fac, entry["run_id"], entry["agent"])
    why = [e.get("why") for e in recorded.events if (e.get("event"), e.get("decision"), e.get("call")) == ("settled", "park", entry["call"])]
    return brief_lines(entry, task_text(recorded.header.get("input")), recorded.end.get("output") if recorded.end else None,
                       one_line(str(why[:1] and why[0])))


@station(*STAGED_CALL, arg("--by", type=signer_name, required=True, metavar="NAME", help="who approves: their signing key must be here"),
         SSH_KEY,
         examples=("python3 factory.py pending", "python3 factory.py approve 20261130T041500123456Z-1a2b3c --by alice",
                   "python3 factory.py approve 20261130T041500123456Z-1a2b3c --call 2 --by al"),
         exits=("approved, executed and read back", "refused, declined at the prompt, or its effect is uncertain"),
         env=(*ROOT_ENV, *KEYS_ENV, "PATH"))
def cmd_approve(fac: Factory, args) -> int:
    """Approve one staged call at a terminal and execute it.

    Shows the ticket and output from the run's trace (checked against the digests sealed with the call),
    the gate's answer and the exact call; y or yes executes exactly that call, once, signed with NAME's own
    key (HMAC, never made here, or --ssh-key) in registry/approvals.jsonl with its result.
    """
    entry, signer, claim = decider(fac, args, APPROVE_GUARDS)
    at_a_terminal("unapproved. approving an acting call is a human's job, at a terminal.")
    retry = ["retry: " + uncertain_column(fac, entry, claim.record.decisions)] if claim.record.state == "uncertain-effect" else []
    twins = twin_lines(executed_twins(executed_calls(decisions_of(fac, lambda e: e["agent"] == entry["agent"]).decided, parked_files(fac)[0]), entry))
    twins += marked_note(fac, entry, claim.agent)
    if no := declined(approval_brief(fac, entry) + twins + retry, "approve?"):
        raise Refusal(f"not approved; the call stays staged. you answered {no}; only y or yes approves.")
    body = {"kind": "intent", **{key: entry[key] for key in ("run_id", "call", "agent", "tool", "args_digest", "certificate")},
            "by": signer.name, "at": utc_now()}
    result = execute_staged_call(fac, entry["run_id"], entry["call"], Decision(signer.signed(fac, body, DECISION_UNSIGNED), signer))
    print(decided_line(entry, result))
    return 0 if outcome_of(result) == "verified" else 1


@station(*STAGED_CALL, arg("--by", type=signer_name, required=True, metavar="NAME", help="who rejects: their signing key must be here"),
         arg("--reason", type=reason_text, required=True, metavar="TEXT", help="why: kept with the decision"),
         SSH_KEY,
         examples=('python3 factory.py reject 20261130T041500123456Z-1a2b3c --by al --reason dup',),
         exits=("rejected", "refused: no such call, it is not open, or NAME has no key here"),
         env=(*ROOT_ENV, *KEYS_ENV, "PATH"))
def cmd_reject(fac: Factory, args) -> int:
    """Close one staged call without executing it.

    Signed with NAME's own key in registry/approvals.jsonl. Also closes an uncertain effect checked by hand
    and a call that can no longer be approved.
    """
    entry, signer, claim = decider(fac, args, REJECT_GUARDS)
    body = {"kind": "rejected", "run_id": entry["run_id"], "call": entry["call"], "agent": entry["agent"],
            "by": signer.name, "at": utc_now(), "reason": args.reason}
    done = append_to_log(fac, "approvals", deciding(claim, REJECT_GUARDS, reconciled(signer, body)))
    print(decided_line(entry, done))
    return 0


def reconciled(signer: Signer, body: dict):
    """compose(claim) for a rejection: closing's, with an uncertain effect's read-back (written: verified)."""
    def compose(claim: ClaimOnDisk) -> dict:
        written, found = claim.read_back if claim.record.state == "uncertain-effect" else (None, None)
        checked = {**body, "written": written, "found": found} if found else body
        return closing(signer, checked, outcome_of(checked))(claim)
    return compose


def decider(fac: Factory, args, guards: tuple) -> tuple[dict, Signer, ClaimOnDisk]:
    """(staged call, Signer, Claim) for approve and reject: guards enforced, doubts noted, key ready."""
    entry, signer = load_pending(fac, args.run_id, args.call), signer_of(fac, args)
    claim = enforce(staged_call_claim(fac, entry), guards)
    for line in claim.decisions.doubted.get((entry["run_id"], entry["call"]), []):
        note(fac, line)
    signer.ready(fac, args.command)
    return entry, signer, claim


# ---- the review queue: the drafts held for a human, and what the human did with each

QUEUE_ROW = Shape.of({"run_id": str, "seq": int, "tool": str, "args": dict, "at": str})
OUTPUT_ITEM = "output"   # a routed run's output, queued when it held no call (a tool's name has a `:`)


def review_queue(fac: Factory, agent: str) -> tuple[dict, dict, list[str]]:
    """(AGENT's held drafts by (run id, seq), each its first row in outbox/AGENT/review.jsonl; the first
    verified decision on each in registry/reviews.jsonl; a line per one that does not read or verify)."""
    path, items, problems = fac.review_path(agent), {}, []
    for _, row in fac.store.read_jsonl(path, QUEUE_ROW, each=True) if fac.store.exists(path) else ():
        (problems.append(f"{row}; not listed") if isinstance(row, Refusal) else items.setdefault((row["run_id"], row["seq"]), row))
    decisions = decisions_of(fac, lambda e: e["agent"] == agent, "reviews")
    return items, {key: entries[0] for key, entries in decisions.decided.items()}, problems + decisions.lines


def review_figures(fac: Factory, agent: str, runs=None) -> tuple[dict | None, list[str]]:
    """(review_counts, of `runs` when given, None when unread; the lines of what could not be read)."""
    try:
        items, decided, problems = review_queue(fac, agent)
    except Refusal as why:
        return None, [str(why)]
    return review_counts(items, decided, runs), problems


@station(arg("agent", type=agent_name, metavar="AGENT", help="the agent whose review queue to list or decide on"),
         arg("run_id", nargs="?", type=run_id_text, metavar="RUN_ID", help="the run of the held call you decide on"),
         arg("--seq", type=at_least_one, metavar="N", help="which of that run's held calls (when several wait)"),
         arg("--accept", action="store_true", help="you sent it (or, an acting call, did it) as the agent wrote it"),
         arg("--edit", type=sent_text, metavar="TEXT", help="you sent or did it changed: the text you actually sent"),
         arg("--discard", action="store_true", help="you threw it away"),
         arg("--by", type=signer_name, metavar="NAME", help="who decided: their signing key must be here"),
         arg("--reason", type=reason_text, metavar="TEXT", help="why (needed with --edit and --discard)"),
         SSH_KEY, arg("--json", action="store_true", help="list the queue as one JSON document"),
         examples=("python3 factory.py review triager --json",
                   "python3 factory.py review faq 20261130T041500123456Z-1a2b3c --accept --by al"),
         exits=("listed, or the decision recorded", "refused, or a line that does not read or verify (named)"),
         env=(*ROOT_ENV, *KEYS_ENV, "PATH"))
def cmd_review(fac: Factory, args) -> int:
    """List calls waiting for a human, or record what was done.

    AGENT lists the undecided held calls (drafts; a handed-off run's acting calls, never carried out from
    here) by run, oldest first; RUN_ID with --accept, --edit TEXT (the text actually sent) or --discard
    records that decision once per call, signed with --by NAME's own key in registry/reviews.jsonl.
    """
    chosen = [kind for kind, on in zip(REVIEW_DECISIONS, (args.accept, args.edit is not None, args.discard)) if on]
    if (args.run_id is None) != (not chosen) or len(chosen) > 1 or chosen and not (args.by and (args.reason or args.accept)):
        raise Usage("list with review AGENT, or decide with review AGENT RUN_ID [--seq N] and one of --accept, "
                    "--edit TEXT or --discard (these two with --reason TEXT), and --by NAME", "review")
    items, decided, problems = review_queue(fac, args.agent)
    if not chosen:
        return list_queue(fac, args.agent, items, decided, problems, args.json)
    signer, (item, problem) = signer_of(fac, args), held_draft(items, decided, args.agent, args.run_id, args.seq)
    refuse_if(problem)
    signer.ready(fac, "review")
    body = {"kind": "review", "decision": chosen[0], "agent": args.agent, "run_id": item["run_id"], "seq": item["seq"],
            "tool": item["tool"], "args_digest": args_digest(item["args"]), "by": signer.name, "at": utc_now(),
            **{key: value for key, value in (("reason", args.reason), ("sent", args.edit)) if value is not None}}

    def make(chain: Chain) -> dict:   # under the log's lock: the first decision on a draft is its only one
        first = verified_entries(fac, chain, lambda e: (e["run_id"], e["seq"]) == (item["run_id"], item["seq"]), "reviews")[0]
        refuse_if(first and f"run {item['run_id']} --seq {item['seq']} was already {first[0][1]['decision']} by "
                  f"{first[0][1]['by']} at {first[0][1]['at']} ({one_line(str(first[0][1].get('reason', 'no reason')))}).")
        return signer.signed(fac, body, DECISION_UNSIGNED)
    append_to_log(fac, "reviews", make)
    print(f"recorded: {chosen[0]} {item['tool']} of run {item['run_id']} (--seq {item['seq']}) by {signer.name}"
          + f" ({NOT_CARRIED_OUT})" * (item.get("effect") == "act"))
    return 0


def list_queue(fac: Factory, agent: str, items: dict, decided: dict, problems: list[str], as_json: bool) -> int:
    """review AGENT: the waiting drafts by run, with each run's input, output and why from its trace."""
    runs: dict = {}
    for item in (item for key, item in items.items() if key not in decided):
        runs.setdefault(item["run_id"], {"run_id": item["run_id"], "age_hours": hours_since(item["at"]), "items": []})["items"].append(item)
    for run in runs.values():
        try:
            recorded = Trace.read(fac, run["run_id"], agent)
            run.update(input=recorded.header["input"], output=(recorded.end or {}).get("output"), why=(recorded.end or {}).get("why"))
        except Refusal as why:
            problems.append(str(why))
    counts = review_counts(items, decided)
    lines = [json.dumps({"format": "factory-review-1", "agent": agent, "runs": list(runs.values()), "counts": counts,
                         "problems": problems}, ensure_ascii=False)] if as_json else [line for run in runs.values() for line in (
        f"{run['run_id']}  queued {run['age_hours']}h ago  routed: {one_line('; '.join(run.get('why') or ['?']))}",
        f"  input: {one_line(task_text(run.get('input', '?')))[:BRIEF_CHARS]}",
        f"  output: {json.dumps(run.get('output'), ensure_ascii=False)}",
        *(f"  --seq {i['seq']}  {i['tool']} {json.dumps(i['args'], ensure_ascii=False)}" + f"  ({NOT_CARRIED_OUT}; do it by hand, or not)" * (i.get("effect") == "act")
          for i in run["items"]))] + [
        f"{len(runs)} run(s) wait in {fac.shown(fac.review_path(agent))}: {reviews_text(counts)}"]
    print_lines(lines)
    return complained("review", problems)


NOT_CARRIED_OUT = "an acting call: the factory did not carry it out, and will not"   # review's note on a queued acting call


def hours_since(at: str) -> float | None:
    """Hours from an ISO time to now, to a tenth; None for no time."""
    with contextlib.suppress(ValueError, TypeError):
        return round((datetime.now(timezone.utc) - datetime.fromisoformat(at)).total_seconds() / 3600, 1)
    return None


# ---- replay, export, digest, schema

@station(arg("run", type=run_reference, metavar="RUN_ID",
             help="the run to replay: its id, or AGENT/RUN_ID as run printed it (trace AGENT/RUN_ID)"),
         arg("--live", action="store_true", help="ask the model again instead of feeding its recorded replies"),
         examples=("python3 factory.py replay 20261130T041500123456Z-1a2b3c",
                   "python3 factory.py replay 20261130T041500123456Z-1a2b3c --live"),
         exits=("no differences", "differences (each printed), or refused"),
         env=(*ROOT_ENV, *WORKER_ENV, *PROXY_ENV))
def cmd_replay(fac: Factory, args) -> int:
    """Replay a recorded run against today's code.

    Feeds the recorded model replies (a run the offline rules answered: today's rules; --live: the model
    again) to the agent as it is now, its tools handing back what each call did then (nothing is written),
    and prints what differs.
    """
    agent_name, run_id = args.run
    recorded = Trace.read(fac, run_id)
    if agent_name and recorded.path.parent.name != agent_name:
        raise Refusal(f"run {run_id} is not {agent_name}'s: its trace is {fac.shown(recorded.path)}")
    if recorded.end is None:
        raise Refusal(f"{fac.shown(recorded.path)}: not a finished {TRACE_FORMAT} trace")
    header, agent = recorded.header, load_agent(fac, recorded.header["agent"])
    models = [e for e in recorded.events if e.get("event") == "model"]
    ran_out = lambda: Diverged("today's code asked the model again after the recorded run ended")  # noqa: E731
    rules = not args.live and models and all(e.get("backend", "").startswith("offline") for e in models)
    worker = (llm.Worker({"primary": "offline"}, {}, agent.rules, header["input"]) if rules
              else None if args.live else llm.Scripted(map(recorded_reply, models), ran_out))
    mode, how = (("live", "asks the model again with") if args.live else ("the agent's rules, as offline", "runs") if rules
                 else ("recorded replies", "feeds its recorded replies to"))
    if header.get("digest") != agent.digest:
        print(f"run {run_id} was made under digest {header.get('digest')}; {agent.name} is now {agent.digest}: this replay "
              f"{how} today's card and code, not the ones that made it")
    now: list[dict] = []
    loop = build_loop(fac, agent, "replay", now.append, header["input"], tier=header.get("tier", "C0"),
                      worker=worker, tools=recorder_tools(recorded.events, agent.contracts))
    status = run_loop(loop)
    differences = replay_differences(recorded.events, now, recorded.end, loop, status)
    print(f"replay {run_id} ({agent.name}, {mode}): " + (f"{len(differences)} difference(s)" if differences else "no differences"))
    for line in differences:
        print(f"  {line}")
    return 1 if differences else 0


@station(arg("runs", type=run_reference, nargs="*", metavar="RUN_ID", help="these runs (RUN_ID or AGENT/RUN_ID); "
             "default: each run not yet sent"),
         arg("--all", action="store_true", help="every stored run, sent before or not"),
         examples=("python3 factory.py export", "python3 factory.py export --all"),
         exits=("every run chosen was sent", "no endpoint set, or a run could not be sent (each named)"),
         env=(*ROOT_ENV, *OTEL_ENV, *PROXY_ENV))
def cmd_export(fac: Factory, args) -> int:
    """Send stored runs to an OpenTelemetry backend (OTLP/HTTP).

    A run is one trace: its spans are the run, model calls, tool calls and gate decisions. A run sends
    itself as it ends; this sends those not sent yet, or the runs named.
    """
    if fac.otlp is None:
        raise Refusal("no OTLP endpoint: set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://localhost:4318)")
    runs = [(agent or find_trace(fac, run_id).parent.name, run_id) for agent, run_id in args.runs] or \
           [(row["agent"], row["run_id"]) for _, row in index_lines(fac) if row.get("state") != "started"]
    failed = 0
    for agent, run_id in runs:
        try:   # a trace gone or torn is named, and the other runs are still sent
            recorded = Trace.read(fac, run_id, agent)
        except Refusal as why:
            problem = str(why)
        else:
            if not (args.all or args.runs) and [e.get("ok") for e in recorded.later if e.get("event") == "export"][-1:] == [True]:
                continue   # sent before
            problem = export_run(fac, recorded)
        failed += bool(problem)
        print(run_id, f"FAILED ({problem})" if problem else "sent", sep="\t")
    return 1 if failed else 0


def export_run(fac: Factory, recorded: Recorded) -> str:
    """Send one finished run to fac.otlp, noting it in its trace; '' when sent, else why not."""
    try:
        body = llm.otlp_body(fac.otlp, recorded.header["run_id"], llm.run_spans(recorded.events, fac.otlp.content))
        llm.send_otlp(llm.build_opener(fac.env), fac.otlp, body)
        problem = ""
    except llm.LLMError as error:
        problem = str(error)   # names no header value (llm.send_otlp); the trace is written scrubbed
    Trace(fac, recorded.header["agent"], recorded.header["run_id"]).record(
        {"event": "export", "to": fac.otlp.url, "ok": not problem, **({"error": problem} if problem else {})})
    return problem


@station(arg("agent", type=agent_name, metavar="AGENT", help="the agent whose digest to print"),
         arg("--explain", action="store_true", help="print each component's digest, marking what changed since certification"),
         JSON_LINES,
         examples=("python3 factory.py digest triager", "python3 factory.py digest triager --explain"),
         exits=("done", "refused: no such agent, or its card or code does not load"),
         env=ROOT_ENV)
def cmd_digest(fac: Factory, args) -> int:
    """Print an agent's digest: what its certificate covers.

    One sha256 over its card, entrypoint module and the agent modules it imports, the tool code, and each
    granted or denied tool's contract.
    """
    agent, path = read_agent(fac, args.agent), fac.cert_path(args.agent)   # hashed and checked, never executed
    certified = fac.store.read_json(path).get("components") if path.exists() and (args.explain or args.json) else None
    marks = component_marks(agent.components, certified)
    if printed_json(args, {"agent": agent.name, "digest": agent.digest, "components": agent.components, **marks}):
        return 0
    print(agent.digest)
    print(*component_lines(agent.components, certified, marks), sep="\n") if args.explain else None
    return 0


@station(examples=("python3 factory.py schema",),
         exits=("done", "refused: the root is not a folder"),
         env=ROOT_ENV)
def cmd_schema(fac: Factory, args) -> int:
    """Print the job card's fields and what each does.

    The table validation checks and the README's card section shows.
    """
    print_block(schema_table())
    return 0


# ================================================================ 6. Tower
# One document counted in one streamed pass over the index (the --json shape); broker draws its text and page.

TALLY_FORMAT = "factory-tally-1"
CHECKPOINT_ROWS = 1000       # a count of this many rows or more leaves a checkpoint


def unread(fac: Factory, tally: IndexTally, row, number: int) -> None:
    """Why index line `number` is not counted (unread, its shape, or closed figures no run can have), in its
    agent's problems (else the tower's)."""
    if type(row) is not dict:
        tally.problems.append(f"{row}; not counted")
        return
    shape, where = STARTED_SHAPE if row.get("state") == "started" else INDEX_SHAPE, f"{fac.shown(fac.index)} line {number}"
    try:
        shape.check(row, where)
        problem = figure_problem(row) if shape is INDEX_SHAPE else None
        line = f"{where}: {problem}; not counted" if problem else f"{where}: not counted"
    except Refusal as why:
        line = f"{why}; not counted"
    agent = row.get("agent")
    (tally.agents[agent].problems if agent in tally.agents else tally.problems).append(line)


def count_index(fac: Factory, tally: IndexTally, key: bytes | None) -> int:
    """Count the whole index lines after tally's head into it, each link checked (and MAC, where evidence); the
    lines read. An unreadable file is a problem line."""
    import hashlib
    head, read, sha = tally.head, 0, hashlib.sha256
    prev, end, number = head["hash"], head["bytes"], head["lines"]
    try:
        for number, end, raw, row in fac.store.read_jsonl(fac.index, each=True, start=(end, number), whole=True):
            fits = type(row) is dict and (type(row.get("run_id")) is str if row.get("state") == "started" else INDEX_SHAPE.fits(row))
            if type(row) is not dict or not tally.count(row, fits, raw, number, end, prev, key):
                unread(fac, tally, row, number)
            prev, read = "sha256:" + sha(raw[:-1]).hexdigest(), read + 1
    except Refusal as why:
        tally.problems.append(f"{why}; runs after it are not counted")
        return 0
    finally:
        tally.head = {"bytes": end, "lines": number, "hash": prev}
    if os.path.getsize(fac.index) > end and not fac.store.being_written(fac.index):   # the next append ends it
        tally.torn = f"{fac.shown(fac.index)} line {number + 1}: cut short (its writer was killed mid-line); not counted"
    return read


def index_tally(fac: Factory, since: str = "") -> IndexTally:
    """The index's tally, once per station: from the checkpoint when it verifies, was counted by this code and
    matches the index at its head; else from the first row, noted. With `since` (a recall's `at`), its evidence
    of the rows closed after it only: counted from the first row, never kept."""
    if since:
        tally = IndexTally(since=since)
        if fac.store.exists(fac.index):
            count_index(fac, tally, evidence_key(fac, create=False))
        return tally
    if fac.store.tally is not None:
        return fac.store.tally
    key, path = evidence_key(fac, create=False), fac.traces / "tally.json"
    tally = checkpoint(fac, path, key) if key is not None and fac.store.exists(path) else IndexTally()
    if isinstance(tally, str):
        note(fac, f"{fac.shown(path)} {tally}: ignored; the tally is counted again from the index's first row")
        tally = IndexTally()
    if fac.store.exists(fac.index) and count_index(fac, tally, key) >= CHECKPOINT_ROWS and key is not None:
        saved = {"format": TALLY_FORMAT, "code": code_digest(), "index": tally.head, "state": json_state(tally)}
        with contextlib.suppress(StoreError):   # a root it may not write still gets its tower
            fac.store.write_json(path, sealed_evidence(fac, saved))
    fac.store.tally = tally
    return tally


def checkpoint(fac: Factory, path: Path, key: bytes) -> IndexTally | str:
    """The checkpoint's tally, or why it cannot be used."""
    try:
        saved = fac.store.read_json(path)
        head, state = saved["index"], saved["state"]
        at = next((at for at, _, chained in state["breaks"] if chained), None)
        row = at is not None and next(fac.store.read_jsonl(fac.index, each=True, start=(at, 0)), (0, None))[1]
        return ("does not verify with the factory evidence key" if not mac_verifies(key, saved) else
                "was counted by another version of factory.py" if (saved["format"], saved["code"]) != (TALLY_FORMAT, code_digest())
                else f"no longer matches {fac.shown(fac.index)} at byte {head['bytes']}: rows were removed or rewritten before it"
                if fac.store.head_at(fac.index, head["bytes"]) != head["hash"] or type(row) is dict
                and row.get("prev") == fac.store.head_at(fac.index, at) else from_state(IndexTally, state))
    except (Refusal, KeyError, TypeError, AttributeError) as error:
        return f"cannot be read ({error})"


def code_digest() -> str:
    """sha256 of this file and broker.py: a tally other code counted is counted again."""
    here = Path(__file__).resolve()
    return sha256(here.read_bytes() + here.with_name("broker.py").read_bytes())


def tower_document(fac: Factory) -> dict:
    """The tower (--json, TOWER_FORMAT): each agent with runs, a card or a certificate, its figures and trust.
    What cannot be read is a line in `problems` and makes it `partial`; it never hides other agents."""
    calls, counted = parked(fac), index_tally(fac)
    problems, tallies = list(counted.problems), {name: from_state(Tally, json_state(t)) for name, t in counted.agents.items()}
    problems += [line for line in (index_problem(fac), counted.torn) if line]
    watch = {run: counted.parked[run][0] for run in {e["run_id"] for e in calls.entries} | {run for run, _ in calls.decided or {}}
             if run in counted.parked}
    fold_decisions(tallies, calls, watch, problems)
    waiting = calls_by_agent(fac, calls, problems)
    agents = []
    for name in sorted(set(tallies) | set(known_agents(fac)) | set(waiting)):
        tally, drift = tallies.get(name) or Tally(), Drift.of_certificate(current_cert(fac, name), index_tally(fac))
        trust, trouble = certificate_trust(ClaimOnDisk(name, "run", fac=fac), drift.demoted, Refusal, refusal_line)
        counts = waiting.get(name) or ParkedCounts()
        trust.update(pending=counts.pending, uncertain_effect=counts.uncertain_effect, stuck=counts.stuck)
        reviews, unread = review_figures(fac, name)
        bar, unloaded = gate_bar(fac, name)
        agents.append({"agent": name, "trust": trust, "gate_bar": bar, **tally.figures(drift), "reviews": reviews,
                       "problems": tally.all_problems() + (trouble or unloaded) + counts.problems + unread})
    partial = bool(problems) or any(a["problems"] for a in agents)
    return {"format": TOWER_FORMAT, "generated_at": utc_now(), "partial": partial, "problems": problems, "agents": agents}


def calls_by_agent(fac: Factory, calls: Parked, problems: list[str]) -> dict[str, ParkedCounts]:
    """agent -> ParkedCounts; an unread or missing parked file is its run's agent's problem, or the tower's."""
    found = parked_counts(calls.entries, calls.states)
    for run_id, line in calls.unread:
        agent = run_agent(fac, run_id)
        (found.setdefault(agent, ParkedCounts()).problems if agent else problems).append(line)
    return found


def run_agent(fac: Factory, run_id: str) -> str | None:
    """The agent whose folder holds RUN_ID's trace, or None."""
    try:
        return find_trace(fac, run_id).parent.name
    except Refusal:
        return None


def current_cert(fac: Factory, name: str) -> dict:
    """NAME's certificate, {} when none or unreadable (its trust says which)."""
    try:
        path = fac.cert_path(name)
        return fac.store.read_json(path) if fac.store.exists(path) else {}
    except Refusal:
        return {}


def known_agents(fac: Factory) -> list[str]:
    """Every agent with a card or a certificate."""
    names = [path.stem for path in fac.masters.glob("*.json")] + [path.name[:-10] for path in fac.registry.glob("*.card.json")]
    return [name for name in names if NAME.fullmatch(name)]


def gate_bar(fac: Factory, name: str) -> tuple[float | None, list[str]]:
    """NAME's card's gate bar (None: gone or not loading), and the line naming why it does not load."""
    try:
        return load_card(fac, name)["evals"]["gate"], []
    except Refusal as why:
        return None, [f"its card does not load: {why}"] * fac.card_path(name).exists()


# ================================================================ 7. CLI
# The streams all output goes through (secrets scrubbed, controls escaped, never an encoding error), progress,
# the parser, and main, where a Refusal becomes a stderr line and an exit status.

def print_block(text: str, file=None) -> None:
    """Print text the factory made (json.dumps: no raw line break in its strings) a line per print; never an
    outside value as it is."""
    print_lines(text.split("\n"), file)


def print_columns(*cells: str) -> None:
    """print(*cells, sep="\t"), in one write to a SafeStream (a write per line, even unbuffered)."""
    if isinstance(sys.stdout, SafeStream):
        sys.stdout.write_columns(cells)
    else:
        print(*cells, sep="\t")


class SafeStream:
    """stdout or stderr as stations print: secrets scrubbed, what a terminal would act on or the encoding cannot
    hold as `\\uXXXX`; one print is one line. `unfiltered`: the stream underneath."""

    def __init__(self, stream, hidden: tuple[tuple[str, str], ...]):
        self.unfiltered, self.hidden = stream, hidden
        self.target = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        """Write text made safe; len(text)."""
        self.unfiltered.write(text if text in SEPARATORS else self.safe(text))
        return len(text)

    def safe(self, text: str) -> str:
        return encodable(visible(redact(text, self.hidden)), self.target)

    def write_columns(self, cells: tuple[str, ...]) -> None:
        """The cells made safe, tab-separated, in one write: its tabs and end are the only ones."""
        self.unfiltered.write("\t".join(map(self.safe, cells)) + "\n")

    def __getattr__(self, name: str):
        return getattr(self.unfiltered, name)   # flush, isatty, fileno, encoding, ...


def print(*values, sep: str | None = " ", end: str | None = "\n", file=None, flush: bool = False) -> None:
    """builtins.print, but a value that is exactly a line feed or tab (SEPARATORS), which SafeStream cannot tell
    from sep and end, escaped."""
    shown = [visible(text) if (text := str(value)) in SEPARATORS else text for value in values]
    builtins.print(*shown, sep=sep, end=end, file=file, flush=flush)


@contextlib.contextmanager
def safe_streams(env: Mapping[str, str]) -> Iterator[None]:
    """sys.stdout and sys.stderr in SafeStream for the block."""
    saved, hidden = (sys.stdout, sys.stderr), secret_values(env)
    sys.stdout, sys.stderr = SafeStream(sys.stdout, hidden), SafeStream(sys.stderr, hidden)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


@dataclass
class Progress:
    """Done/total, rate and time left on one stderr line, on a terminal after a second (wiped for results)."""
    label: str
    total: int
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    on_terminal: bool = field(default_factory=lambda: sys.stderr.isatty())
    width: int = 0

    def tick(self) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.started
        if self.on_terminal and elapsed > 1.0:
            rate = self.done / elapsed
            line = f"{self.label}: {self.done}/{self.total}  {rate:.1f}/s  ~{(self.total - self.done) / rate:.0f}s left"
            self.show("\r" + line.ljust(self.width))
            self.width = len(line)

    def clear(self) -> None:
        """Wipe the line so the next stdout line starts clean."""
        if self.width:
            self.show("\r" + " " * self.width + "\r")
            self.width = 0

    close = clear

    @staticmethod
    def show(text: str) -> None:
        """Write our own line (an agent name, numbers, carriage returns) to the terminal."""
        terminal = getattr(sys.stderr, "unfiltered", sys.stderr)
        terminal.write(text)
        terminal.flush()


YES = ("y", "yes")   # the answers that sign at certify's prompt and approve at approve's


def answered(answer: str) -> str:
    """What was typed at a prompt, for a decline: quoted, or 'nothing (just enter)'."""
    return json.dumps(answer[:40]) if answer else "nothing (just enter)"


def user_name(env: Mapping[str, str]) -> str:
    """Who runs the station, for the records: $USER, else the login name."""
    return env.get("USER") or login_name()


def login_name() -> str:
    """getpass's login name (LOGNAME, then the password database), or 'unassigned'."""
    import getpass
    try:
        return getpass.getuser()
    except (OSError, KeyError, ImportError):   # no such variable and no password entry (a bare container)
        return "unassigned"


def typed_answer() -> str:
    """The line typed at a prompt, stripped, lowercased; undecodable bytes read as U+FFFD (never `y`)."""
    raw = sys.stdin.buffer.readline() if hasattr(sys.stdin, "buffer") else sys.stdin.readline().encode()
    return raw.decode(getattr(sys.stdin, "encoding", None) or "utf-8", errors="replace").strip().lower()


def stations() -> list:
    """The @station functions, in definition order."""
    # callable() first: hasattr on the lazily loaded llm and sage modules would load them
    return [value for value in globals().values() if callable(value) and hasattr(value, "station_arguments")]


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises Usage (one line naming the station, exit 2) for main to report."""
    station = ""

    def error(self, message: str):
        """Usage for this station; a mistyped station names the nearest."""
        typed = re.search(r"argument STATION: invalid choice: '([^']*)'", message)
        if typed and not self.station:
            names = [func.__name__.removeprefix("cmd_") for func in stations()]
            message = (f"argument STATION: invalid choice: {typed.group(1)!r}{did_you_mean(typed.group(1), names)} "
                       f"(choose from {', '.join(names)})")
        raise Usage(message, self.station)

    def _print_message(self, message: str, file=None) -> None:
        """argparse's output, a print a line through SafeStream: no public hook takes all of it (the --help
        tests catch an argparse that stops calling it)."""
        try:
            for line in message.rstrip("\n").split("\n") if message else []:
                print(line, file=file or sys.stderr)
            (file or sys.stderr).flush()
        except BrokenPipeError:   # `--help | head -1`: the reader had what it wanted, which is no error
            stdout_closed()


START_HERE = """\
start here, with the shipped triager (no keys needed: it runs on its own rules):
  python3 factory.py doctor                         what this machine can reach
  python3 factory.py prove triager --sealed         prove it on its sealed half
  python3 factory.py certify triager --tier C1 --by NAME  sign it at a terminal
  python3 factory.py run triager "my card is lost"  run it; then: tower
  python3 factory.py new faq                        then an agent of your own
  python3 factory.py STATION --help                 flags, examples, exit status

exit status: 0 done, 1 refused, 2 usage error, 3 a proof that ran and did not
pass, 130 interrupted, 141 run's stdout closed, 143 terminated. Results go to
stdout; refusals, prompts and progress to stderr."""


def wrapped(text: str, columns: int) -> str:
    """Text as --help shows it, each paragraph wrapped to a terminal COLUMNS wide."""
    width = min(columns - 2, 100)
    return "\n\n".join(textwrap.fill(" ".join(part.split()), width, break_on_hyphens=False)   # never split --ssh-key
                       for part in re.split(r"\n\s*\n", text.strip()))


def station_epilog(func) -> str:
    """A station's --help after its arguments: examples, exit statuses, environment."""
    about = func.station_help
    done, failed = about["exits"]
    width = min(max(len(name) for name in about["env"]), ENV_COLUMN) + 2
    exits = sorted([(0, done), (1, failed), (2, "usage error (one line on stderr)"), (130, "interrupted (SIGINT)"),
                    (143, "terminated (SIGTERM)"), *about["more_exits"]])
    return "\n".join(["examples:", *(f"  {line}" for line in about["examples"]), "",
                      "exit status:", *(f"  {status:<4} {what}" for status, what in exits), "",
                      "environment:", *(f"  {name:<{width}}{ENVIRONMENT[name]}" if len(name) <= ENV_COLUMN
                                        else f"  {name}\n  {'':<{width}}{ENVIRONMENT[name]}" for name in about["env"])])


def build_parser(built: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The argparse tree: a subparser per station (its docstring the description, its epilog after); only those
    in `built` (None: all) are built whole, the rest are a name and summary."""
    return parser_tree(built, shutil.get_terminal_size().columns)


@lru_cache(maxsize=16)   # parsing leaves a parser as it was: built once a process
def parser_tree(built: tuple[str, ...] | None, columns: int) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)  # accepted before or after the station name
    common.add_argument("--root", type=folder_text, default=argparse.SUPPRESS, metavar="DIR",
                        help="the factory root (default: $FACTORY_ROOT, else the folder of factory.py)")
    common.add_argument("--sealed-dir", type=folder_text, default=argparse.SUPPRESS, metavar="DIR",
                        help="where SUITE/sealed.jsonl live (default: $FACTORY_SEALED_DIR, else evals/)")
    raw = argparse.RawDescriptionHelpFormatter   # descriptions come wrapped, epilogs laid out by hand
    parser = Parser(prog="factory.py", description=wrapped(__doc__.split("\n\n")[0], columns), epilog=START_HERE,
                    parents=[common], formatter_class=raw)
    parser.add_argument("--version", action="version", version=version_line())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="STATION", title="stations")
    for func in stations():
        name = func.__name__.removeprefix("cmd_")
        summary = func.__doc__.splitlines()[0].replace("%", "%%")  # argparse %-formats help, not descriptions
        if built is not None and name not in built:
            subparsers.add_parser(name, help=summary, add_help=False)   # takes anything: never parsed for real
            continue
        sub = subparsers.add_parser(name, help=summary, description=wrapped(func.__doc__, columns),
                                    epilog=station_epilog(func), parents=[common], formatter_class=raw)
        sub.station = name
        sub.set_defaults(func=func)
        for flags, options in func.station_arguments:
            sub.add_argument(*flags, **options)
    return parser


def version_line() -> str:
    """What --version prints: version, Python, the formats it writes."""
    python = ".".join(map(str, sys.version_info[:3]))
    return f"factory.py {VERSION} (Python {python}; writes {TRACE_FORMAT}, {RECORD_FORMAT}, {CERT_FORMAT})"


def chosen_station(argv: list[str]) -> str:
    """The station argv names, with none built (a --root value is never taken for one); Usage for none or a
    mistyped one. Top-level --help and --version exit here."""
    return build_parser(built=()).parse_known_args(argv)[0].command


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line; Usage for anything argparse refuses or leaves over."""
    args, extra = parser.parse_known_args(argv)   # --help exits here, before the clients load
    if extra and args.command == "run" and args.input is None and len(extra) == 1 and not extra[0].startswith("-"):
        args.input = extra[0]   # `run AGENT --json TEXT`: argparse binds optional positionals before options only
    elif extra:
        raise Usage(f"unrecognized arguments: {' '.join(extra)}", args.command)
    return args


# Arguments that name paths: any bytes the file system allows are fine there (decoded with surrogateescape).
PATH_ARGUMENTS = ("root", "sealed_dir", "file", "junit", "html")


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Parse argv, build the Factory, run the station, in safe streams: a Refusal is one stderr line and exit 1,
    a usage error (an argument not text too) exit 2; no arguments: help on stderr, exit 2."""
    # a snapshot: Code.execute takes FACTORY_SEALED_DIR out of os.environ before agent code loads; the station reads this
    env, halt = dict(os.environ) if env is None else env, Halt()
    before = [signal.signal(halting, halt.catch) for halting in HALTING if threading.current_thread() is threading.main_thread()]
    try:
        with safe_streams(env):
            return run_station(argv, env, halt)
    finally:   # (only the main thread may set one)
        for halting, handler in zip(HALTING, before):
            signal.signal(halting, handler)


def run_station(argv: list[str] | None, env: Mapping[str, str], halt: Halt) -> int:
    """main inside the safe streams; only the named station's parser is built."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        build_parser(built=()).print_help(sys.stderr)
        return 2
    station = ""
    try:
        args = parse(build_parser(built=(chosen_station(argv),)), argv)
        station = args.command
        bad = not_text(args)
        if bad:
            raise Usage(bad, station)
        refuse_if(llm.setting_problem(env, args.func.station_help["env"], SECRET_NAME))   # before anything is written
        llm.Worker, sage.Sage  # noqa: B018 - load the lazy clients now, before any thread (LazyLoader is not thread-safe on 3.11)
        fac = Factory.at(getattr(args, "root", None), getattr(args, "sealed_dir", None), env, halt)
        try:
            return args.func(fac, args)
        finally:   # the index rows this station appended, anchored once
            fac.store.close()
            raise_anchor(fac, index=fac.store.heads.get(fac.index))
    except Usage as usage:
        station = usage.station or station
        print(f"factory{' ' + station if station else ''}: {usage}; see `factory.py {station + ' ' if station else ''}--help`",
              file=sys.stderr)
        return 2
    except Refusal as refusal:
        first, *more = refusal.lines if isinstance(refusal, Problems) else [str(refusal)]
        print(f"factory {station}: {first}", file=sys.stderr)
        for line in more:
            print(line, file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:
        print(f"factory{' ' + station if station else ''}: interrupted", file=sys.stderr)
        status = 128 + (stop.args[0] if isinstance(stop, Signalled) else signal.SIGINT)
        if isinstance(stop, Signalled) and threading.active_count() > 1:   # not waiting for a thread's model
            for stream in (sys.stdout, sys.stderr):                        # call (its run is closed)
                stream.flush()
            os._exit(status)
        return status
    except BrokenPipeError:
        raise
    except OSError as error:   # the machine refused something outside the Store's reads and writes
        where = f"{error.filename}: " if error.filename else ""
        print(f"factory {station}: {where}{(error.strerror or type(error).__name__).lower()}", file=sys.stderr)
        return 1


def not_text(args: argparse.Namespace) -> str | None:
    """Why an argument but a path (any bytes) cannot be used (undecodable bytes, as lone surrogates), or
    None."""
    for dest, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if dest not in PATH_ARGUMENTS and isinstance(text, str) and LONE_SURROGATE.search(text):
                shown = dest if dest in ("input", "agent", "master", "run_id") else "--" + dest.replace("_", "-")
                return (f"{shown} holds bytes that are not {sys.getfilesystemencoding()} text "
                        f"({printable(as_bytes_shown(text))[:80]}); pass it as text in the terminal's encoding")
    return None


if __name__ == "__main__":   # ends by os._exit, flushed: in Python's teardown (default handlers) a signal kills silently
    try:
        try:
            status = main() if sys.stdout else None
        finally:
            sys.stdout and sys.stdout.flush()
    except BrokenPipeError:   # what stays buffered is dropped: os._exit flushes nothing
        status = None
    except SystemExit as leaving:   # --help, --version
        status = leaving.code or 0
    with contextlib.suppress(AttributeError, OSError):
        if status is None:   # the output is incomplete (`run` exits STDOUT_CLOSED instead)
            sys.stderr.write("factory: stdout was closed before everything was written to it (its reader stopped, "
                             "e.g. head, or it was never open)\n")
        sys.stderr.flush()
    os._exit(1 if status is None else status)
