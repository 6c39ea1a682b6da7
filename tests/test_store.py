"""The Store and the layout: strict reads that name the file and line, atomic writes that a kill
leaves old or new, locked appends that survive a torn line, the shape checker, and no file written
anywhere in factory.py but through the Store."""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import unittest
from pathlib import Path

import factory
from tests import trust_helpers
from tests.support import INJECTION, REPO, CertifiedTest, LineTest, index_line, write_jsonl

HELPER = Path(trust_helpers.__file__).resolve()
CERT = "registry/triager.card.json"
TICKETS = ["My card was charged twice for the same coffee, please look into it.",
           "How do I change the phone number on my profile?",
           "The app crashes every time I open the statements tab."]
# Text one byte past the Store's limits (a JSON file, a JSONL line), and never more than 50 MB: the size that
# is refused is the limit's own edge, and a raised limit still has to refuse a 50 MB file.
PAST_THE_FILE_LIMIT = min(50 << 20, factory.MAX_FILE_BYTES + 1)
PAST_THE_LINE_LIMIT = min(50 << 20, factory.MAX_LINE_BYTES + 1)


class Shapes(unittest.TestCase):
    """The shape checker: exact types, bool never a number, optional fields only checked when present."""

    SHAPE = factory.Shape.of({"n": int, "x": (int, float), "s": str}, optional={"p": (float, type(None))})

    def test_fits_and_check_agree(self):
        table = [({"n": 1, "x": 2.5, "s": "a"}, None),
                 ({"n": 1, "x": 2, "s": "a", "p": None}, None),
                 ({"n": 1, "x": 2, "s": "a", "p": 0.5}, None),
                 ({"x": 2, "s": "a"}, "missing field 'n'"),
                 ({"n": True, "x": 2, "s": "a"}, "field 'n' has the wrong type (bool)"),
                 ({"n": 1, "x": False, "s": "a"}, "field 'x' has the wrong type (bool)"),
                 ({"n": 1, "x": 2, "s": 3}, "field 's' has the wrong type (int)"),
                 ({"n": 1, "x": 2, "s": "a", "p": "0.5"}, "field 'p' has the wrong type (str)")]
        for row, problem in table:
            with self.subTest(row=row):
                self.assertEqual(self.SHAPE.fits(row), problem is None)
                if problem is None:
                    self.assertIs(self.SHAPE.check(row, "here"), row)
                else:
                    with self.assertRaises(factory.Refusal) as refusal:
                        self.SHAPE.check(row, "here")
                    self.assertEqual(str(refusal.exception), f"here: {problem}")


class Digests(unittest.TestCase):
    """A digest is taken over text as the Store writes it: a lone surrogate (valid JSON, not text) as U+FFFD."""

    def test_a_lone_surrogate_is_digested_as_the_store_writes_it(self):
        self.assertEqual(factory.canonical({"detail": "boom \ud800"}), factory.canonical({"detail": "boom \ufffd"}))
        self.assertEqual(factory.canonical(["\udfff"]), '["\ufffd"]'.encode())


class OnlyTheStoreWrites(unittest.TestCase):
    """Every file write in factory.py goes through the Store: nothing outside class Store opens,
    creates, renames or deletes a file, or makes a folder; but code_cache, which keeps the compiled
    code of broker.py (the Store's own module) in the user's cache folder, outside every root, before
    there is a Store."""

    PATH_WRITERS = {"open", "write_text", "write_bytes", "mkdir", "touch", "symlink_to", "hardlink_to", "chmod",
                    "rename", "replace", "unlink", "rmdir"}
    READERS = {("shutil", "get_terminal_size"), ("shutil", "which")}   # shutil calls that write nothing
    OS_WRITERS = {"open", "fdopen", "replace", "link", "symlink", "unlink", "remove", "rename", "mkdir", "makedirs",
                  "chmod", "fchmod", "write", "truncate", "ftruncate"}

    def writes(self, call: ast.Call) -> bool:
        """True for a call that can create, change or delete a file or folder (str.replace is not one)."""
        func = call.func
        if isinstance(func, ast.Name):
            return func.id == "open"
        if not isinstance(func, ast.Attribute):
            return False
        owner = ast.unparse(func.value)
        if owner in ("os", "os.path"):
            return func.attr in self.OS_WRITERS
        if owner in ("shutil", "tempfile"):
            return (owner, func.attr) not in self.READERS
        return func.attr in self.PATH_WRITERS - {"replace"} and "store" not in owner

    def test_no_write_outside_the_store(self):
        tree = ast.parse((REPO / "factory.py").read_text())
        store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Store")
        cache = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "code_cache")
        inside = {id(n) for n in ast.walk(store)} | {id(n) for n in ast.walk(cache)}
        found = [f"line {node.lineno}: {ast.unparse(node)[:80]}" for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and id(node) not in inside and self.writes(node)]
        found = [f for f in found if "os.devnull" not in f and "os.write(2, " not in f]   # the broken-pipe stdout, and
        self.assertEqual(found, [])                                                       # quit_now's line on stderr
        writes_in_store = [node for node in ast.walk(store) if isinstance(node, ast.Call) and self.writes(node)]
        self.assertGreater(len(writes_in_store), 5, "the check would find the Store's own writes")


class Layout(LineTest):
    """The root: --root, else $FACTORY_ROOT; a root that is not a folder is refused."""

    def test_a_root_that_is_not_a_folder_is_refused(self):
        self.env["FACTORY_ROOT"] = str(self.root / "masters" / "triager.json")
        self.refused("is not a folder", "tower")
        self.env["FACTORY_ROOT"] = str(self.root / "missing")
        self.refused("is not a folder", "tower")

    def test_asking_for_a_path_creates_nothing(self):
        before = sorted(p.relative_to(self.tmp) for p in self.tmp.rglob("*"))
        for path in (self.fac.card_path("x"), self.fac.cert_path("x"), self.fac.key_path("alice"),
                     self.fac.trace_path("x", "20261130T041500123456Z-1a2b3c"), self.fac.pending_path("r", 1),
                     self.fac.spill_path("x", "20261130T041500123456Z-1a2b3c", "tool-3"), self.fac.record_path("x", "open"),
                     self.fac.history_path("x"), self.fac.suite_path("x", True), self.fac.store):
            self.assertIsNotNone(path)
        self.assertEqual(sorted(p.relative_to(self.tmp) for p in self.tmp.rglob("*")), before)


class StrictJson(LineTest):
    """NaN, infinity and deep nesting are one-line refusals, never a traceback."""

    def test_odd_numbers_and_deep_nesting_are_one_line_refusals(self):
        path = self.root / "masters" / "triager.json"
        card = json.loads(path.read_text())
        for text, message in ((json.dumps(card).replace('"max_steps": 6', '"max_steps": NaN'), "NaN is not a json number"),
                              ("[" * 100000 + "]" * 100000, "nested too deeply")):
            with self.subTest(message=message):
                path.write_text(text)
                self.refused(message, "digest", "triager")
        path.write_text(json.dumps(card))
        self.refused("field 'approval_expiry_hours'", "stamp", "triager", "--as", "x", "--set", "approval_expiry_hours=1e300")
        self.refused("field 'cost_envelope_usd'", "stamp", "triager", "--as", "x", "--set", "cost_envelope_usd=Infinity")

    def test_an_integer_no_float_holds_is_a_field_refusal(self):
        """A 400-digit integer is valid JSON (Python reads up to 4300 digits), but no float holds it: a
        card's number field holding one is refused like any number out of range, in every station."""
        huge = "1" + "0" * 400
        for setting, field in ((f"evals.pass_bar={huge}", "evals.pass_bar"), (f"cost_envelope_usd={huge}", "cost_envelope_usd")):
            with self.subTest(setting=setting):
                self.refused(f"field '{field}'", "stamp", "triager", "--as", "x", "--set", setting)
        evals = json.loads((self.root / "masters" / "triager.json").read_text())["evals"]
        self.edit_card("triager", evals={**evals, "pass_bar": int(huge)})   # json writes a Python int as digits
        self.assertIn(f'"pass_bar": {huge}', (self.root / "masters" / "triager.json").read_text())
        self.refused("field 'evals.pass_bar'", "prove", "triager")
        code, out, err = self.factory("tower")   # as for a NaN there: the bar is shown as unknown, the card named
        self.assertEqual((code, err), (1, "factory tower: its card does not load: masters/triager.json: field "
                                          "'evals.pass_bar' must be a number in 0..1\n"))
        self.assertIn("bar ?)", out.split("triager", 1)[1])


class Appends(CertifiedTest):
    """Locked appends: a torn last line stays torn and named; the next line starts clean."""

    def test_a_torn_index_line_does_not_swallow_the_next_run(self):
        self.runs_ok(text="hello")
        index = self.root / "traces" / "index.jsonl"
        with index.open("ab") as out:   # what a writer killed mid-line leaves (rows anchored before it are whole)
            out.write(index.read_bytes().splitlines(keepends=True)[-1][:-30])
        self.runs_ok()
        lines = index.read_bytes().splitlines()
        self.assertEqual(json.loads(lines[-1])["agent"], "triager")
        self.assertEqual(json.loads(lines[-1])["state"], "closed")
        self.refused("traces/index.jsonl line 3: not valid json", "tower")   # lines 1 and 2 are the first run's

    def test_a_value_json_has_no_number_for_is_refused_naming_the_file_and_no_byte_is_written(self):
        """The locked appends open (and so create) the file before the line is made, because the file is
        its own lock and a chained append reads it under that lock: they leave it empty. A run's own log
        and a whole-file write leave no file at all."""
        folder = self.root / "outbox" / "x"
        left = {"log.jsonl": b"", "chained.jsonl": b"", "own.jsonl": None, "card.json": None}
        writes = {"log.jsonl": lambda path, obj: self.fac.store.append_jsonl(path, obj),
                  "chained.jsonl": lambda path, obj: self.fac.store.append_chained(path, lambda chain: obj),
                  "own.jsonl": self.appended_through_a_log,
                  "card.json": lambda path, obj: self.fac.store.write_json(path, obj)}
        for name, write in writes.items():
            for number in (float("nan"), float("inf"), float("-inf")):
                with self.subTest(name=name, number=number):
                    with self.assertRaises(factory.StoreError) as caught:
                        write(folder / name, {"n": [1, {"p": number}]})
                    self.assertIn(f"outbox/x/{name}: cannot write it (a number in it is nan or infinity", str(caught.exception))
                    self.assertEqual((folder / name).read_bytes() if (folder / name).exists() else None, left[name])

    def appended_through_a_log(self, path, obj):
        """obj appended through a run's own log (Store.Log), closed after."""
        log = factory.Store.Log(self.fac.store, path)
        try:
            log.append(obj)
            log.flush()
        finally:
            log.close()

    def test_a_runs_own_log_starts_clean_after_another_writers_torn_line(self):
        path = self.root / "outbox" / "x" / "log.jsonl"
        log = factory.Store.Log(self.fac.store, path)
        try:
            log.append({"n": 1})
            log.flush()
            log.append({"n": 2})
            log.flush()   # the file ends where its last line ended: nothing is read back
            with path.open("ab") as out:
                out.write(b'{"torn')            # a writer that ignored the lock, killed mid-line
            log.append({"n": 3})
            log.flush()
        finally:
            log.close()
        self.assertEqual(path.read_bytes().splitlines(), [b'{"n":1}', b'{"n":2}', b'{"torn', b'{"n":3}'])

    def test_every_index_row_is_chained_to_the_line_before_it_and_closed_rows_are_sealed_over_their_bytes(self):
        tickets = self.tmp / "t.jsonl"
        write_jsonl(tickets, [{"id": f"k{i}", "input": "How do I order a new card? " * (1 + i % 4)} for i in range(6)])
        self.assertEqual(self.factory("run", "triager", "--file", str(tickets))[0], 0)
        index = self.root / "traces" / "index.jsonl"
        index.write_bytes(index.read_bytes() + b'{"run_id": "torn')   # a writer killed mid-line ...
        self.runs_ok()                                                  # ... is ended by the next append, and chained
        lines, key = index.read_bytes().splitlines(), (self.tmp / "keys" / "_evidence.key").read_bytes().strip()
        self.assertEqual(len(lines), 15)
        for before, line in zip([None, *lines], lines):
            if line.startswith(b'{"run_id": "torn'):
                continue
            row = json.loads(line)
            self.assertEqual(row["prev"], factory.sha256(before) if before else factory.GENESIS)
            if row["state"] == "closed":
                unsealed = line[:line.rindex(b',"mac":')] + b"}"
                self.assertEqual(row["mac"], "hmac-sha256:" + hmac.new(key, unsealed, hashlib.sha256).hexdigest())
            else:
                self.assertNotIn("mac", row)

    def test_the_chains_head_at_a_recorded_offset(self):
        index = self.root / "traces" / "index.jsonl"
        self.assertEqual(self.fac.store.head_at(index, 0), factory.GENESIS)
        self.runs_ok()
        size, lines = len(index.read_bytes()), index.read_bytes().splitlines()
        self.assertEqual(self.fac.store.head_at(index, size), factory.sha256(lines[-1]))
        self.runs_ok(text="hello")
        resumed = list(factory.index_lines(self.fac, (size, 2)))
        self.assertEqual([(number, row.get("state")) for number, row in resumed], [(3, "started"), (4, "closed")])
        with index.open("ab") as out:
            out.write(b'{"torn')
        self.assertEqual(self.fac.store.head_at(index, size), factory.sha256(lines[-1]), "rows after it change nothing")
        self.assertIsNone(self.fac.store.head_at(index, size - 1), "no line ends there")
        index.write_bytes(index.read_bytes()[:size - 10])
        self.assertIsNone(self.fac.store.head_at(index, size), "a cut file no longer holds it")
        index.write_bytes(b"x" * (size - 1) + b"\n")
        self.assertNotEqual(self.fac.store.head_at(index, size), factory.sha256(lines[-1]), "nor a rewritten one")

class AtomicWrites(LineTest):
    """A SIGKILL while write_json is writing leaves the file old or new, never partial. Four kills are
    aimed at each step of the write in turn (the child kills itself as it calls os.fchmod on the new
    temporary file, os.fsync on it written, os.replace to rename it, os.unlink after the rename), so each
    lands where it is aimed on any machine, however fast its disk; two more land at a random moment of a
    loop of writes."""

    AIMED = {"fchmod": 0, "fsync": 0, "replace": 0, "unlink": 1}   # the step killed -> the object then on disk

    def test_write_json_killed_mid_write_leaves_old_or_new(self):
        target = self.tmp / "crash" / "big.json"
        megabytes = 3
        objects = [trust_helpers.big_object(0, megabytes), trust_helpers.big_object(1, megabytes)]
        for call, holds in self.AIMED.items():
            with self.subTest(killed_at=f"os.{call}"):
                killed = subprocess.run([sys.executable, str(HELPER), "write-killed-at", call, str(target), str(megabytes)],
                                        capture_output=True, cwd=str(REPO), timeout=60)
                self.assertEqual(killed.returncode, -signal.SIGKILL, killed.stderr.decode()[-2000:])
                self.assertTrue(self.whole(target, call) == objects[holds], f"killed at os.{call}: not object {holds}")
                leftovers = list(target.parent.glob(f".{target.name}.*"))
                self.assertEqual(len(leftovers), 0 if call == "unlink" else 1, f"killed at os.{call}: {leftovers}")
                for path in leftovers:
                    path.unlink()
        rng = random.Random()
        for attempt in range(2):
            child = subprocess.Popen([sys.executable, str(HELPER), "write-loop", str(target), str(megabytes)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO))
            self.assertEqual(child.stdout.readline().strip(), b"ready", child.stderr.read()[-2000:] if child.poll() else "")
            time.sleep(rng.uniform(0.0, 0.1))
            child.send_signal(signal.SIGKILL)
            child.communicate()
            value = self.whole(target, f"a random moment ({attempt})")
            self.assertIn(value.get("which"), (0, 1))
            self.assertTrue(value == objects[value["which"]], f"kill {attempt}: neither the old nor the new object")
            for path in target.parent.glob(f".{target.name}.*"):
                path.unlink()

    def whole(self, target: Path, when: str) -> dict:
        """The object in target, failing the test when the file is not whole JSON."""
        try:
            return json.loads(target.read_text())
        except ValueError as error:
            self.fail(f"killed at {when}: {target.name} is partial: {error}")


# ---------------------------------------------------------------- bad input, file by file

def mangle_utf8(data: bytes) -> bytes:
    """data with an invalid UTF-8 byte put inside its second line (or the middle of a one-line file)."""
    lines = data.splitlines(keepends=True)
    if len(lines) > 2:
        return b"".join(lines[:1]) + lines[1].replace(b'"', b'"\xff', 1) + b"".join(lines[2:])
    middle = data.index(b'"', len(data) // 2) if b'"' in data[len(data) // 2:] else len(data) // 2
    return data[:middle + 1] + b"\xff\xfe" + data[middle + 1:]


class BadFiles(CertifiedTest):
    """Each bad file: exit 1, one stderr line naming the file, no traceback, nothing written. Every
    row starts from the class's prepared factory: triager certified, one run in the index."""

    def prepare(self):
        super().prepare()
        self.runs_ok()

    def setUp(self):
        super().setUp()
        [record] = (self.root / "records" / "triager").glob("*.sealed.json")
        self.record = record.relative_to(self.root).as_posix()
        self.tickets = self.tmp / "tickets.jsonl"

    # -- edits of the factory under test
    def path(self, relative: str) -> Path:
        return self.root / relative

    def put(self, relative: str, data) -> None:
        """Write bytes or text to a file under the root (or to an absolute path)."""
        target = Path(relative) if os.path.isabs(relative) else self.path(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data if isinstance(data, bytes) else data.encode())

    def edit(self, relative: str, fn) -> None:
        """Replace a file's bytes by fn(bytes)."""
        self.put(relative, fn(self.path(relative).read_bytes()))

    def edit_json(self, relative: str, **changes) -> None:
        """Rewrite a JSON file with some fields replaced."""
        value = json.loads(self.path(relative).read_text())
        self.put(relative, json.dumps({**value, **changes}, indent=2))

    def append(self, relative: str, line) -> None:
        """Append one raw line to a JSONL file."""
        with self.path(relative).open("ab") as out:
            out.write(line if isinstance(line, bytes) else line.encode())

    def append_row(self, relative: str, **changes) -> None:
        """Append a copy of the file's last JSONL row with some fields replaced (chained to it in the index)."""
        last = json.loads(self.path(relative).read_text().splitlines()[-1])
        if relative == "traces/index.jsonl":
            line = index_line(self.path(relative), {k: v for k, v in {**last, **changes}.items() if k not in ("prev", "mac")})
        else:
            line = json.dumps({**last, **changes}) + "\n"
        self.append(relative, line)

    def link_outside(self, relative: str) -> None:
        """Move the file out of the root and leave a symlink pointing at it."""
        outside = self.tmp / "elsewhere" / relative.replace("/", "_")
        outside.parent.mkdir(exist_ok=True)
        shutil.copyfile(self.path(relative), outside)
        self.path(relative).unlink()
        os.symlink(outside, self.path(relative))

    def huge_field(self, relative: str, field: str) -> None:
        """Rewrite a JSON file with one field holding more text than a JSON file may (PAST_THE_FILE_LIMIT)."""
        value = json.loads(self.path(relative).read_text())
        head = json.dumps({k: v for k, v in value.items() if k != field})[:-1].encode()
        self.put(relative, head + b', "' + field.encode() + b'": "' + b"a" * PAST_THE_FILE_LIMIT + b'"}\n')

    def huge_line(self, relative: str) -> None:
        """Append one JSONL line longer than a line may be (PAST_THE_LINE_LIMIT)."""
        self.append(relative, b'{"id": "huge", "input": "' + b"a" * PAST_THE_LINE_LIMIT + b'"}\n')

    def truncate(self, relative: str) -> None:
        """Cut a file in the middle of its last JSON value."""
        data = self.path(relative).read_bytes().rstrip()
        self.put(relative, data[:-max(len(data.splitlines()[-1]) // 2, 1)])

    def restore(self) -> None:
        """Put the factory back as the class prepared it, and the tickets file as it starts."""
        shutil.rmtree(self.root)
        shutil.copytree(self.template / "factory", self.root, symlinks=True)
        shutil.rmtree(self.tmp / "elsewhere", ignore_errors=True)
        if self.tickets.is_dir():
            self.tickets.rmdir()
        elif self.tickets.exists() and not self.tickets.is_file():   # a FIFO: writing to it would wait forever
            self.tickets.unlink()
        self.tickets.write_text("".join(json.dumps({"id": f"r-{n}", "input": t}) + "\n" for n, t in enumerate(TICKETS)))

    def table(self, rows: list) -> int:
        """Run each (label, prepare, argv, name) row as a subTest; returns the row count."""
        for label, prepare, argv, name in rows:
            with self.subTest(label):
                self.restore()
                prepare()
                self.refused_writing_nothing(name, *argv)
        self.restore()
        return len(rows)

    def test_bad_files_table(self):
        card, cases, sealed, index = "masters/triager.json", "evals/triager/cases.jsonl", "evals/triager/sealed.jsonl", "traces/index.jsonl"
        rec, tk = self.record, str(self.tickets)
        digest, prove, prove_sealed = ("digest", "triager"), ("prove", "triager"), ("prove", "triager", "--sealed")
        certify, run, tower = ("certify", "triager", "--tier", "C1", "--by", "alice"), ("run", "triager", "hi"), ("tower",)
        run_file = ("run", "triager", "--file", tk)
        bom = lambda data: b"\xef\xbb\xbf" + data  # noqa: E731
        surrogate = lambda data: data.replace(b'": "', b'": "\\udcff', 1)  # noqa: E731  in the first string value
        first_id = json.loads(self.path(cases).read_text().splitlines()[0])["id"]
        rows = [
            # the job card: masters/triager.json
            ("card truncated", lambda: self.truncate(card), digest, card),
            ("card empty", lambda: self.put(card, b""), digest, card),
            ("card with a utf-8 bom", lambda: self.edit(card, bom), digest, card),
            ("card with invalid utf-8", lambda: self.edit(card, mangle_utf8), digest, card),
            ("card not an object", lambda: self.put(card, "[1, 2]"), digest, card),
            ("card max_steps a string", lambda: self.edit_json(card, max_steps="8"), digest, card),
            ("card tools a string", lambda: self.edit_json(card, tools="issues:label"), digest, card),
            ("card unknown field", lambda: self.edit_json(card, tools_denid=["billing:refund"]), digest, card),
            ("card over the size limit", lambda: self.huge_field(card, "gate_question"), digest, card),
            ("card symlink outside the root", lambda: self.link_outside(card), digest, card),
            ("card missing", lambda: self.path(card).unlink(), digest, card),
            ("card entrypoint ../", lambda: self.edit_json(card, entrypoint="../evil:rules"), digest, card),
            ("card evals.suite ../", lambda: self.edit_json(card, evals={"pass_bar": 0.5, "gate": 0.8, "suite": "../../etc"}), digest, card),
            ("card stamped_from ../", lambda: self.edit_json(card, stamped_from="../x"), digest, card),
            ("card with a lone surrogate", lambda: self.edit(card, surrogate), digest, card),
            # the open cases: evals/triager/cases.jsonl
            ("cases truncated line", lambda: self.append(cases, '{"id": "x", "inp\n'), prove, cases),
            ("cases non-object line", lambda: self.append(cases, "[1, 2]\n"), prove, cases),
            ("cases unknown field", lambda: self.append(cases, '{"id": "x", "input": "a", "expect": {}, "expected": 1}\n'), prove, cases),
            ("cases id a number", lambda: self.append(cases, '{"id": 5, "input": "a", "expect": {}}\n'), prove, cases),
            ("cases expect a list", lambda: self.append(cases, '{"id": "x", "input": "a", "expect": []}\n'), prove, cases),
            ("cases duplicate id", lambda: self.append(cases, json.dumps({"id": first_id, "input": "a", "expect": {}}) + "\n"), prove, cases),
            ("cases empty file", lambda: self.put(cases, b""), prove, cases),
            ("cases with a utf-8 bom", lambda: self.edit(cases, bom), prove, cases),
            ("cases with invalid utf-8", lambda: self.edit(cases, mangle_utf8), prove, cases),
            ("cases line over the size limit", lambda: self.huge_line(cases), prove, cases),
            ("cases missing", lambda: self.path(cases).unlink(), prove, cases),
            ("cases symlink outside the root", lambda: self.link_outside(cases), prove, cases),
            ("cases with a lone surrogate", lambda: self.append(cases, '{"id": "x\\ud800", "input": "a", "expect": {}}\n'), prove, cases),
            ("sealed truncated line", lambda: self.truncate(sealed), prove_sealed, sealed),
            ("sealed non-object line", lambda: self.append(sealed, '"just a string"\n'), prove_sealed, sealed),
            # the proof record, read by certify
            ("record truncated", lambda: self.truncate(rec), certify, rec),
            ("record empty", lambda: self.put(rec, b""), certify, rec),
            ("record with a utf-8 bom", lambda: self.edit(rec, bom), certify, rec),
            ("record with invalid utf-8", lambda: self.edit(rec, mangle_utf8), certify, rec),
            ("record not an object", lambda: self.put(rec, "[]"), certify, rec),
            ("record over the size limit", lambda: self.huge_field(rec, "backends"), certify, rec),
            ("record symlink outside the root", lambda: self.link_outside(rec), certify, rec),
            ("record score a string", lambda: self.edit_json(rec, score="0.9"), certify, rec),
            ("record suite a number", lambda: self.edit_json(rec, suite=5), certify, rec),
            ("record suite ../", lambda: self.edit_json(rec, suite="../../../outside"), certify, rec),
            ("record an empty object", lambda: self.put(rec, "{}"), certify, rec),
            ("record with a lone surrogate", lambda: self.edit(rec, surrogate), certify, rec),
            # the certificate, read by run
            ("certificate truncated", lambda: self.truncate(CERT), run, CERT),
            ("certificate empty", lambda: self.put(CERT, b""), run, CERT),
            ("certificate with a utf-8 bom", lambda: self.edit(CERT, bom), run, CERT),
            ("certificate with invalid utf-8", lambda: self.edit(CERT, mangle_utf8), run, CERT),
            ("certificate not an object", lambda: self.put(CERT, '"C3"'), run, CERT),
            ("certificate over the size limit", lambda: self.huge_field(CERT, "owner"), run, CERT),
            ("certificate symlink outside the root", lambda: self.link_outside(CERT), run, CERT),
            ("certificate signer a number", lambda: self.edit_json(CERT, signer=5), run, CERT),
            ("certificate signer ../", lambda: self.edit_json(CERT, signer="../alice"), run, CERT),
            ("certificate unknown field", lambda: self.edit_json(CERT, scope="everything"), run, CERT),
            ("certificate with a lone surrogate", lambda: self.edit(CERT, surrogate), run, CERT),
            # the trace index, read by tower
            ("index truncated line", lambda: self.truncate(index), tower, index),
            ("index non-object line", lambda: self.append(index, "42\n"), tower, index),
            ("index with a utf-8 bom", lambda: self.edit(index, bom), tower, index),
            ("index with invalid utf-8", lambda: self.append(index, b'{"agent": "tri\xffager"}\n'), tower, index),
            ("index line over the size limit", lambda: self.huge_line(index), tower, index),
            ("index symlink outside the root", lambda: self.link_outside(index), tower, index),
            ("index acted a string", lambda: self.append_row(index, acted="x"), tower, index),
            ("index denied a number", lambda: self.append_row(index, denied=5), tower, index),
            ("index cost a string", lambda: self.append_row(index, cost_usd="free"), tower, index),
            ("index backends a number", lambda: self.append_row(index, backends=3), tower, index),
            ("index with a lone surrogate", lambda: self.append_row(index, agent="tri\udfffager"), tower, index),
            # a tickets file named by the user (outside the root is fine; it is the user's file)
            ("tickets truncated line", lambda: self.put(tk, '{"id": "a", "inp\n'), run_file, "tickets.jsonl"),
            ("tickets non-object line", lambda: self.put(tk, "[]\n"), run_file, "tickets.jsonl"),
            ("tickets input a number", lambda: self.put(tk, '{"id": "a", "input": 5}\n'), run_file, "tickets.jsonl"),
            ("tickets without id", lambda: self.put(tk, '{"input": "hello"}\n'), run_file, "tickets.jsonl"),
            ("tickets empty", lambda: self.put(tk, b""), run_file, "tickets.jsonl"),
            ("tickets with a utf-8 bom", lambda: self.put(tk, bom(self.tickets.read_bytes())), run_file, "tickets.jsonl"),
            ("tickets with invalid utf-8", lambda: self.put(tk, b'{"id": "a", "input": "caf\xff"}\n'), run_file, "tickets.jsonl"),
            ("tickets line over the size limit", lambda: self.put(tk, b'{"id": "a", "input": "' + b"a" * PAST_THE_LINE_LIMIT + b'"}\n'), run_file, "tickets.jsonl"),
            ("tickets missing", lambda: self.tickets.unlink(), run_file, "tickets.jsonl"),
            ("tickets a directory", lambda: (self.tickets.unlink(), self.tickets.mkdir()), run_file, "tickets.jsonl"),
            ("tickets with a lone surrogate", lambda: self.put(tk, '{"id": "a", "input": "refund \\udcff"}\n'), run_file, "tickets.jsonl"),
            ("tickets a fifo", lambda: (self.tickets.unlink(), os.mkfifo(self.tickets)), run_file, "tickets.jsonl"),
        ]
        escaping = [   # names that would escape the root: malformed on the command line, so usage errors
            ("digest", "../triager"), ("prove", "../triager", "--sealed"), ("run", "../triager", "hi"),
            ("certify", "../triager", "--tier", "C1", "--by", "alice"), ("certify", "triager", "--tier", "C1", "--by", "../alice"),
            ("recall", "../triager", "--reason", "x"), ("harvest", "../triager"), ("stamp", "../triager", "--as", "x"),
            ("stamp", "triager", "--as", "../../evil"), ("digest", "/etc/passwd")]
        for argv in escaping:
            with self.subTest(argv=argv):
                self.restore()
                self.usage_error(f"{next(a for a in argv if '/' in a)!r} is not a valid", *argv)
        self.assertGreaterEqual(self.table(rows), 20)

    def test_a_key_given_twice_is_refused_in_every_file(self):
        """json.loads keeps the last of two equal keys: a second tools_denied would silently undo the first."""
        card, cases, sealed, index = "masters/triager.json", "evals/triager/cases.jsonl", "evals/triager/sealed.jsonl", "traces/index.jsonl"
        twice = lambda key, value: lambda data: data.replace(b"{", b'{"%s": %s, ' % (key, value), 1)  # noqa: E731
        rows = [
            ("card", lambda: self.edit(card, lambda d: d.replace(b'"gate_question"', b'"tools_denied": [], "gate_question"')),
             ("digest", "triager"), card, "tools_denied"),
            ("cases", lambda: self.append(cases, '{"id": "x", "input": "a", "input": "b", "expect": {}}\n'), ("prove", "triager"), cases, "input"),
            ("sealed", lambda: self.append(sealed, '{"id": "x", "input": "a", "expect": {}, "expect": {}}\n'),
             ("prove", "triager", "--sealed"), sealed, "expect"),
            ("record", lambda: self.edit(self.record, twice(b"score", b"1.0")),
             ("certify", "triager", "--tier", "C1", "--by", "alice"), self.record, "score"),
            ("certificate", lambda: self.edit(CERT, twice(b"tier", b'"C3"')), ("run", "triager", "hi"), CERT, "tier"),
            ("index", lambda: self.append(index, '{"agent": "triager", "agent": "evalsmith"}\n'), ("tower",), index, "agent"),
            ("tickets", lambda: self.put(str(self.tickets), '{"id": "a", "input": "hi", "id": "b"}\n'),
             ("run", "triager", "--file", str(self.tickets)), "tickets.jsonl", "id"),
        ]
        for label, prepare, argv, name, key in rows:
            with self.subTest(label):
                self.restore()
                prepare()
                err = self.refused_writing_nothing(name, *argv)
                self.assertIn(f"duplicate key '{key}'", err)
        self.restore()


class BadTraceFiles(BadFiles):
    """A trace harvest reads, broken each way: one line naming the trace, nothing written."""

    def prepare(self):
        self.certified("triager")
        self.certified("evalsmith")
        self.runs_ok("triager", INJECTION)                      # a flagged run: harvest reads its trace

    def test_bad_files_table(self):
        flagged = self.index_rows()[-1]
        self.assertEqual(flagged["denied"], ["billing:refund"])   # flagged: a tool was denied
        trace = f"traces/triager/{flagged['run_id']}.jsonl"
        harvest = ("harvest", "triager")
        rows = [
            ("trace truncated", lambda: self.truncate(trace), harvest, trace),
            ("trace header not an object", lambda: self.edit(trace, lambda d: b"[1]\n" + d), harvest, trace),
            ("trace header of another format", lambda: self.edit(trace, lambda d: d.replace(factory.TRACE_FORMAT.encode(), b"factory-trace-9", 1)), harvest, trace),
            ("trace with a utf-8 bom", lambda: self.edit(trace, lambda d: b"\xef\xbb\xbf" + d), harvest, trace),
            ("trace with invalid utf-8", lambda: self.edit(trace, mangle_utf8), harvest, trace),
            ("trace empty", lambda: self.put(trace, b""), harvest, trace),
            ("trace missing", lambda: self.path(trace).unlink(), harvest, trace),
            ("trace symlink outside the root", lambda: self.link_outside(trace), harvest, trace),
            ("trace line over the size limit", lambda: self.huge_line(trace), harvest, trace),
            ("trace tool event without its ruling", lambda: self.edit(trace, lambda d: d.replace(b'"ruling"', b'"rul"', 1)), harvest, trace),
            ("trace with a lone surrogate", lambda: self.edit(trace, lambda d: d.replace(b'"input":"', b'"input":"\\udcff', 1)), harvest, trace),
            ("trace header with tier C9", lambda: self.edit(trace, lambda d: d.replace(b'"tier":"C1"', b'"tier":"C9"', 1)), harvest, trace),
        ]
        self.assertEqual(self.table(rows), 12)


if __name__ == "__main__":
    unittest.main()
