"""The README's examples work as written: the GitHub Actions workflow parses and has every step a
sealed proof in CI needs (its restore step is run for real), the smallest complete agent of the
module contract proves, certifies and runs with no key, and "Your first agent" is followed command by
command at a terminal in a fresh copy of the repo, each printing what the README shows; page one stays
within 150 lines in the file (its transcripts folded), and every link in the README names one of its headings.
(The certificate verifier the README gives is run in tests/test_trust.py, beside the ssh-signed
certificate it checks.)

The workflow is YAML, and the standard library has no YAML parser. It is kept in ordinary block
style (what a reader copies into .github/workflows/) rather than YAML's JSON-compatible flow style,
and `parse_yaml` below reads exactly the subset it uses, refusing anything else rather than guessing.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import broker
import factory
import llm
from tests.support import REPO, CertifiedTest, LineTest, copy_shipped, on_a_terminal

INTEGER = re.compile(r"[-+]?[0-9]+")
FLOAT = re.compile(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def parse_yaml(text: str):
    """The value of a YAML document written in this subset: block mappings and sequences indented
    with spaces, `# comments`, plain, 'single' and "double" quoted scalars (typed as YAML 1.2's core
    schema types them: true/false, null, integers, floats, else strings), one-line flow sequences
    `[a, b]` and flow mappings `{k: v}` of scalars, and `|` literal blocks. ValueError names the line
    of anything outside the subset (tabs, anchors, tags, folded blocks, several documents...)."""
    return Reader(text).document()


def strip_comment(text: str) -> str:
    """Text without a trailing ` # comment`. A # inside a quoted scalar is kept; a quote opens one only
    where a scalar starts (so the apostrophe in `the card's model` quotes nothing)."""
    quote, i = None, 0
    while i < len(text):
        char = text[i]
        if quote and (char == "\\" and quote == '"' or text.startswith("''", i) and quote == "'"):
            i += 2   # an escaped character, or '' (one quote) inside single quotes
            continue
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"" and (i == 0 or text[i - 1] in " [{,"):
            quote = char
        elif char == "#" and (i == 0 or text[i - 1] == " "):
            return text[:i].rstrip()
        i += 1
    return text.rstrip()


def scalar(text: str, where: str):
    """One scalar or one-line flow collection, typed as YAML 1.2's core schema does."""
    if text.startswith('"'):
        if len(text) < 2 or not text.endswith('"'):
            raise ValueError(f"{where}: unterminated double-quoted scalar")
        return json.loads(text)   # the escapes used here (\\ \" \n \uXXXX) mean the same in JSON
    if text.startswith("'"):
        if len(text) < 2 or not text.endswith("'"):
            raise ValueError(f"{where}: unterminated single-quoted scalar")
        return text[1:-1].replace("''", "'")
    if text.startswith("[") and text.endswith("]"):
        return [scalar(item.strip(), where) for item in text[1:-1].split(",") if item.strip()]
    if text.startswith("{") and text.endswith("}"):
        pairs = [item.split(": ", 1) for item in text[1:-1].split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"{where}: flow mapping entries are `key: value`")
        return {key.strip(): scalar(value.strip(), where) for key, value in pairs}
    if text[:1] in set("&*!|>%@`[]{},") or text in ("---", "..."):
        raise ValueError(f"{where}: {text!r} is outside the YAML subset these tests read")
    if text in ("true", "false"):
        return text == "true"
    if text in ("null", "~", ""):
        return None
    if INTEGER.fullmatch(text):
        return int(text)
    return float(text) if FLOAT.fullmatch(text) else text


class Reader:
    """Reads parse_yaml's subset line by line; each method consumes the lines of one node."""

    def __init__(self, text: str):
        if "\t" in text:
            raise ValueError(f"line {text[:text.index(chr(9))].count(chr(10)) + 1}: a tab (YAML indents with spaces)")
        self.lines, self.at = text.splitlines(), 0

    def where(self) -> str:
        """The current line for an error message."""
        return f"line {self.at + 1}"

    def peek(self) -> tuple[int, str] | None:
        """(indent, content without comment) of the next line holding something; None at the end."""
        while self.at < len(self.lines):
            raw = self.lines[self.at]
            content = strip_comment(raw.strip())
            if content:
                return len(raw) - len(raw.lstrip(" ")), content
            self.at += 1
        return None

    def document(self):
        """The whole document: one block node at indent 0, and nothing after it."""
        first = self.peek()
        value = None if first is None else self.node(first[0])
        if self.peek() is not None:
            raise ValueError(f"{self.where()}: unexpected indentation")
        return value

    def node(self, indent: int):
        """The block sequence or mapping starting at the next line, at exactly `indent`."""
        _, content = self.peek()
        return self.sequence(indent) if content == "-" or content.startswith("- ") else self.mapping(indent)

    def mapping(self, indent: int) -> dict:
        """`key: value` lines at `indent`, each value inline, a literal block, or a nested node."""
        result = {}
        while (line := self.peek()) and line[0] == indent and not (line[1] == "-" or line[1].startswith("- ")):
            key, sep, rest = line[1].partition(":")
            if not sep or not KEY.fullmatch(key) or (rest and not rest.startswith(" ")):
                raise ValueError(f"{self.where()}: expected `key: value`, got {line[1]!r}")
            if key in result:
                raise ValueError(f"{self.where()}: key {key!r} given twice")
            self.at += 1
            result[key] = self.value(rest.strip(), indent)
        if line and line[0] > indent:
            raise ValueError(f"{self.where()}: unexpected indentation")
        return result

    def value(self, rest: str, indent: int):
        """A mapping value: inline, a `|` literal block, a nested node, or null."""
        if rest == "|":
            return self.literal(indent)
        if rest:
            return scalar(rest, self.where())
        line = self.peek()
        if line and (line[0] > indent or line[0] == indent and (line[1] == "-" or line[1].startswith("- "))):
            return self.node(line[0])
        return None

    def sequence(self, indent: int) -> list:
        """`- item` lines at `indent`; an item holding `key: value` starts a mapping two columns in."""
        items = []
        while (line := self.peek()) and line[0] == indent and (line[1] == "-" or line[1].startswith("- ")):
            body = line[1][2:].strip()
            if re.match(r"[A-Za-z0-9_][A-Za-z0-9_.-]*:( |$)", body):
                self.lines[self.at] = " " * (indent + 2) + body   # the item is a mapping at indent + 2
                items.append(self.mapping(indent + 2))
            else:
                self.at += 1
                items.append(self.value(body, indent))
        return items

    def literal(self, indent: int) -> str:
        """A `|` block: the following lines indented deeper than `indent`, dedented, one final newline."""
        block, depth = [], None
        while self.at < len(self.lines):
            raw = self.lines[self.at]
            here = len(raw) - len(raw.lstrip(" "))
            if raw.strip() and (here <= indent or depth is not None and here < depth):
                break
            depth = here if depth is None and raw.strip() else depth
            block.append(raw[depth:] if depth is not None and raw.strip() else "")
            self.at += 1
        while block and not block[-1]:
            block.pop()
        return "\n".join(block) + "\n" if block else ""


def readme_block(start: str) -> str:
    """The fenced block of README.md whose text starts with `start` (the fence's own line excluded)."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```$", readme, flags=re.S | re.M)
    found = [block for block in blocks if block.startswith(start)]
    assert len(found) == 1, f"README.md holds {len(found)} blocks starting {start!r}"
    return found[0]


# the first major of each action that runs on Node 24 (their release notes: checkout v5, setup-python v6,
# upload-artifact v6 and download-artifact v7; upload v7 shares download v7's artifact backend)
NODE24 = {"actions/checkout": 5, "actions/setup-python": 6, "actions/upload-artifact": 7, "actions/download-artifact": 7}
PULL_REQUESTS = ("pull_request", "pull_request_target")   # events that run code no one has reviewed yet
ON_MAIN = ("github.event_name == 'push'", "github.ref == 'refs/heads/main'")


def workflow_problems(doc) -> list[str]:
    """What keeps a parsed workflow from proving a sealed half in CI as written, or lets code under review
    reach the sealed half or a secret, or lets the public download what names sealed cases; [] when nothing."""
    if not isinstance(doc, dict):
        return ["the workflow is not a mapping"]
    problems = [] if isinstance(doc.get("on"), (dict, list, str)) and doc.get("on") else ["no `on:` trigger"]
    triggers = doc.get("on") if isinstance(doc.get("on"), (dict, list)) else [doc.get("on")]
    jobs = doc.get("jobs") or {}
    sealed = [name for name, job in jobs.items() if any(restores(step) for step in job.get("steps", []))]
    for name, job in jobs.items():
        if set(PULL_REQUESTS) & set(triggers) and not all(test in str(job.get("if", "")) for test in ON_MAIN) \
                and (name in sealed or any(secret_env(step) for step in job.get("steps", []))):
            problems.append(f"job {name} runs a pull request's code with {'the sealed half' if name in sealed else 'a secret'}")
    for name in sealed:
        if not jobs[name].get("environment"):
            problems.append(f"job {name} holds the sealed half outside a protected environment")
    return problems + action_problems(jobs) + proof_problems(jobs, sealed)


def action_problems(jobs: dict) -> list[str]:
    """Each action a step needs that no step uses, and each used at a major that does not run on Node 24."""
    steps = [s for job in jobs.values() for s in job.get("steps", [])]
    used = [s["uses"].split("@") for s in steps if "@" in s.get("uses", "")]
    problems = [f"no {action} step" for action in NODE24 if action != "actions/download-artifact"
                and action not in {name for name, _ in used}]
    return problems + [f"{name}@{version} does not run on Node 24 (use v{NODE24[name]})" for name, version in used
                       if name in NODE24 and not (version.startswith("v") and version[1:].split(".")[0].isdigit()
                                                  and int(version[1:].split(".")[0]) >= NODE24[name])]


def proof_problems(jobs: dict, sealed: list[str]) -> list[str]:
    """What keeps the jobs that hold the sealed half from proving it as the README says: a matrix of
    `prove AGENT --sealed --require-model --shard "$SHARD/N"` steps, each shard record uploaded, and a job
    that needs them, downloads them and merges them with `--merge`; every key from secrets; nothing
    uploaded from those jobs but shard records (which name cases by their HMAC)."""
    problems = [] if sealed else ["no step restores the sealed half from a secret into FACTORY_SEALED_DIR"]
    steps = [s for name in (sealed or jobs) for s in jobs[name].get("steps", [])]
    python = next((s.get("with", {}).get("python-version") for s in steps if "setup-python" in s.get("uses", "")), None)
    if not (isinstance(python, str) and tuple(map(int, python.split("."))) >= (3, 11)):
        problems.append(f"python-version {python!r} is not a quoted version >= 3.11")
    proofs = {}
    for name in sealed or jobs:
        job_steps = jobs[name].get("steps", [])
        for i, step in enumerate(job_steps):
            if "factory.py prove" in step.get("run", ""):
                args = factory.parse(factory.build_parser(), prove_argv(step["run"]))
                kind = "shard" if args.shard else "merge" if args.merge else "whole"
                proofs[kind] = (name, step, args)
                if any(restores(s) for s in job_steps[i:]):
                    problems.append("the sealed half is restored after the proof")
        for upload in (s for s in job_steps if "upload-artifact" in s.get("uses", "") and name in sealed):
            if "-shard-" not in upload.get("with", {}).get("path", ""):
                problems.append(f"job {name} uploads {upload.get('with', {}).get('path')}, which names sealed cases")
    if not ("shard" in proofs and "merge" in proofs):
        return problems + ["the sealed half is not proved as `prove AGENT --sealed --require-model --shard K/N` "
                           "in a matrix and merged with `--merge`"] + key_problems(proofs.get("whole"), ["SAGE_API_KEY"])
    (shard_job, shard, args), (merge_job, merge, merged) = proofs["shard"], proofs["merge"]
    if not (args.sealed and args.require_model and merged.sealed and merged.require_model):
        problems.append("the shards and the merge are not `--sealed --require-model`")
    if jobs[shard_job].get("strategy", {}).get("matrix", {}).get("shard") != list(range(1, args.shard[1] + 1)):
        problems.append(f"the matrix of {shard_job} is not the shards 1..{args.shard[1]}")
    if "-shard-" not in str([s.get("with", {}).get("path") for s in jobs[shard_job]["steps"] if "upload" in s.get("uses", "")]):
        problems.append(f"job {shard_job} does not upload its shard record")
    merge_steps = jobs[merge_job]["steps"]
    download = [i for i, s in enumerate(merge_steps) if "download-artifact" in s.get("uses", "")]
    if jobs[merge_job].get("needs") != shard_job or not download or download[0] > merge_steps.index(merge):
        problems.append(f"job {merge_job} does not need {shard_job} and download its shard records before the merge")
    return problems + key_problems((shard_job, shard, args), ["SAGE_API_KEY", "FACTORY_EVIDENCE_KEY"]) + \
        key_problems((merge_job, merge, merged), ["FACTORY_EVIDENCE_KEY"], models=False)


def key_problems(proof, keys: list[str], models: bool = True) -> list[str]:
    """Each key the prove step does not take from secrets: the card's model's (with `models`) and `keys`."""
    if proof is None:
        return []
    _, step, args = proof
    return [f"the prove step does not pass {key} from secrets" for key in (model_keys(args.agent) if models else []) + keys
            if step.get("env", {}).get(key) != f"${{{{ secrets.{key} }}}}"]


def restores(step: dict) -> bool:
    """True when the step restores a sealed half from a secret into FACTORY_SEALED_DIR."""
    return "FACTORY_SEALED_DIR" in step.get("run", "") and secret_env(step)


def secret_env(step: dict) -> bool:
    """True when the step reads a secret through its env."""
    return any("${{ secrets." in str(value) for value in (step.get("env") or {}).values())


def prove_argv(script: str) -> list[str]:
    """The arguments after `factory.py` of the script's prove command (the matrix's $SHARD read as 1)."""
    line = next(line for line in script.splitlines() if "factory.py prove" in line).replace("$SHARD", "1")
    words = shlex.split(line)
    return words[words.index("factory.py") + 1:]


def model_keys(agent: str) -> list[str]:
    """The keys the shipped card's primary model needs (e.g. ANTHROPIC_API_KEY for claude-*)."""
    model = json.loads((REPO / "masters" / f"{agent}.json").read_text())["model"]["primary"]
    backend = llm.backend_for(model, {})
    return {"anthropic": ["ANTHROPIC_API_KEY"], "openai": ["OPENAI_API_KEY"], "moonshot": ["MOONSHOT_API_KEY"],
            "openrouter": ["OPENROUTER_API_KEY"]}.get(backend, [])


# The README's workflow before this test existed: no trigger, nothing restores the sealed half, no model key.
OLD_WORKFLOW = """\
jobs:
  prove:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with: {python-version: "3.11"}
      - name: prove the sealed half
        env:
          FACTORY_SEALED_DIR: ${{ runner.temp }}/sealed   # restored from a secret, outside the repo
          SAGE_API_KEY: ${{ secrets.SAGE_API_KEY }}
        run: python3 factory.py prove triager --sealed --junit prove.xml
      - uses: actions/upload-artifact@v4
        if: always()
        with: {name: prove-junit, path: prove.xml}
"""


class YamlSubset(unittest.TestCase):
    """The parser reads its subset as YAML does and refuses what it does not know."""

    def test_it_reads_the_subset(self):
        text = ('a: 1\nb: "3.10"\nc: 3.10\nd:\n  - x\n  - k: v   # comment\n    m: [p, "q r"]\n'
                'e: {f: g, h: true}\nf: |\n  one\n    two\n\n  three\ng:\nh: \'it\'\'s # not a comment\'\n')
        self.assertEqual(parse_yaml(text), {"a": 1, "b": "3.10", "c": 3.1, "d": ["x", {"k": "v", "m": ["p", "q r"]}],
                                            "e": {"f": "g", "h": True}, "f": "one\n  two\n\nthree\n", "g": None,
                                            "h": "it's # not a comment"})

    def test_it_refuses_what_is_outside_the_subset(self):
        for text in ("a:\n\t- b\n", "a: &anchor b\n", "a: !!str b\n", "a: >\n  folded\n", "a: 1\n  b: 2\n",
                     "a: 1\na: 2\n", "- a\nb: c\n"):
            with self.subTest(text=text), self.assertRaises(ValueError):
                parse_yaml(text)


class Workflow(unittest.TestCase):
    """The README's GitHub Actions workflow works as written."""

    def setUp(self):
        self.text = readme_block("# .github/workflows/prove.yml\n")
        self.doc = parse_yaml(self.text)

    def test_it_has_every_step_a_sealed_proof_needs(self):
        self.assertEqual(workflow_problems(self.doc), [])
        for job in self.doc["jobs"].values():
            self.assertEqual(list(job["steps"][0]), ["uses"])   # checkout comes first

    def test_code_under_review_gets_neither_the_sealed_half_nor_a_secret(self):
        """Pull requests prove the open half with no secret at all; the sealed half and the keys are given
        only to a job that runs on main (reviewed code), in a protected environment."""
        self.assertIn("pull_request", self.doc["on"])
        jobs = self.doc["jobs"]
        on_pull_requests = [name for name, job in jobs.items() if not all(test in str(job.get("if", "")) for test in ON_MAIN)]
        self.assertEqual(len(on_pull_requests), 1, on_pull_requests)
        self.assertNotIn("${{ secrets.", json.dumps(jobs[on_pull_requests[0]]))
        self.assertNotIn("FACTORY_SEALED_DIR", json.dumps(jobs[on_pull_requests[0]]))
        step = next(s for s in jobs[on_pull_requests[0]]["steps"] if "factory.py prove" in s.get("run", ""))
        self.assertFalse(factory.parse(factory.build_parser(), prove_argv(step["run"])).sealed, "it proves the open half")
        # The README's workflow as a pull request could rewrite it: the sealed job without its `if:` and
        # `environment:` runs the author's code beside the sealed half, and both gaps are named.
        leaky = parse_yaml(self.text)
        del leaky["jobs"]["sealed-half"]["if"], leaky["jobs"]["sealed-half"]["environment"]
        self.assertEqual(workflow_problems(leaky), [
            "job sealed-half runs a pull request's code with the sealed half",
            "job sealed-half holds the sealed half outside a protected environment"])
        said = " ".join((REPO / "README.md").read_text().split())
        self.assertIn("required reviewers", said)
        self.assertIn("environment secrets", said)

    def test_the_old_workflow_is_caught(self):
        self.assertEqual(workflow_problems(parse_yaml(OLD_WORKFLOW)), [
            "no `on:` trigger", "actions/checkout@v4 does not run on Node 24 (use v5)",
            "actions/setup-python@v5 does not run on Node 24 (use v6)",
            "actions/upload-artifact@v4 does not run on Node 24 (use v7)",
            "no step restores the sealed half from a secret into FACTORY_SEALED_DIR",
            "the sealed half is not proved as `prove AGENT --sealed --require-model --shard K/N` in a matrix and "
            "merged with `--merge`", "the prove step does not pass ANTHROPIC_API_KEY from secrets"])

    def test_nothing_naming_sealed_cases_is_uploaded_and_every_shard_is_merged(self):
        """The README's workflow with one thing changed at a time: each change is named."""
        def changed(change) -> list[str]:
            doc = parse_yaml(self.text)
            change(doc["jobs"])
            return workflow_problems(doc)
        merge = lambda jobs: jobs["sealed-half"]["steps"]  # noqa: E731
        junit = {"uses": "actions/upload-artifact@v7", "if": "always()", "with": {"name": "prove-junit", "path": "prove.xml"}}
        self.assertEqual(changed(lambda jobs: merge(jobs).append(junit)),
                         ["job sealed-half uploads prove.xml, which names sealed cases"])
        self.assertEqual(changed(lambda jobs: jobs["sealed-shard"]["strategy"]["matrix"].update(shard=[1, 2])),
                         ["the matrix of sealed-shard is not the shards 1..3"])
        self.assertEqual(changed(lambda jobs: jobs["sealed-half"].pop("needs")),
                         ["job sealed-half does not need sealed-shard and download its shard records before the merge"])
        self.assertEqual(changed(lambda jobs: jobs["sealed-half"]["steps"][-1]["env"].clear()),
                         ["the prove step does not pass FACTORY_EVIDENCE_KEY from secrets"])
        self.assertEqual(changed(lambda jobs: jobs["open-half"]["steps"][0].update(uses="actions/checkout@v4")),
                         ["actions/checkout@v4 does not run on Node 24 (use v5)"])

    def test_the_prove_step_stops_before_proving_without_a_key(self):
        """Run the prove step's script with bash, `python3` a stand-in that only notes it ran: an empty
        model key, or an empty SAGE_API_KEY for a card with a draft rubric (the triager's), stops the job
        with an ::error:: line before anything is proved; with both keys it goes on to prove."""
        if shutil.which("bash") is None:
            self.skipTest("bash is not on this machine: the script cannot be run here")
        step = next(s for job in self.doc["jobs"].values() for s in job["steps"] if "--sealed" in s.get("run", ""))
        self.assertIn("draft_rubric", json.loads((REPO / "masters" / "triager.json").read_text()))
        bin_dir = Path(self.enterContext(tempfile.TemporaryDirectory()))
        stand_in = bin_dir / "python3"
        stand_in.write_text(f'#!/bin/sh\necho "$@" > {bin_dir}/proved\n')
        stand_in.chmod(0o755)
        keys = {"ANTHROPIC_API_KEY": "sk-test", "SAGE_API_KEY": "sage-test"}
        for empty in ("ANTHROPIC_API_KEY", "SAGE_API_KEY", None):
            with self.subTest(empty=empty):
                (bin_dir / "proved").unlink(missing_ok=True)
                env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", **keys, **({empty: ""} if empty else {})}
                done = subprocess.run(["bash", "-e", "-c", step["run"]], env=env, capture_output=True, text=True)
                self.assertEqual(done.returncode, 1 if empty else 0, done.stdout + done.stderr)
                self.assertEqual("::error::" in done.stdout, bool(empty), done.stdout)
                self.assertEqual((bin_dir / "proved").exists(), not empty)

    def test_the_secret_is_made_as_the_readme_says_on_linux_and_macos(self):
        """The command the README gives for the SEALED_TRIAGER secret uses no GNU-only flag (macOS's base64
        has no -w), and what it makes restores the sealed half byte for byte."""
        said = re.findall(r"gzip -c sealed\.jsonl \| base64[^`\n]*", (REPO / "README.md").read_text())
        self.assertEqual(len(set(said)), 1, said)
        command = said[0].strip()
        self.assertNotIn(" -w", command, "GNU base64's -w is not on macOS")
        if shutil.which("bash") is None or shutil.which("base64") is None:
            self.skipTest("bash or base64 is not on this machine: the command cannot be run here")
        folder = self.enterContext(tempfile.TemporaryDirectory())
        shutil.copy(REPO / "evals" / "triager" / "sealed.jsonl", folder)
        made = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, check=True).stdout
        self.assertNotIn(b"\n", made, "a secret is one line")
        self.assertEqual(gzip.decompress(base64.b64decode(made)), (REPO / "evals" / "triager" / "sealed.jsonl").read_bytes())

    def test_the_restore_step_restores_the_sealed_half(self):
        """Run the restore step's script with bash as a runner would: the secret made as the README
        says becomes DIR/triager/sealed.jsonl byte for byte, and FACTORY_SEALED_DIR reaches later
        steps through GITHUB_ENV; an empty secret stops the job with an ::error:: line."""
        tools = [name for name in ("bash", "base64", "gunzip") if shutil.which(name) is None]
        if tools:
            self.skipTest(f"{', '.join(tools)} not on this machine: the script cannot be run here")
        step = next(s for job in self.doc["jobs"].values() for s in job["steps"] if "FACTORY_SEALED_DIR" in s.get("run", ""))
        (name, _), = step["env"].items()
        sealed = (REPO / "evals" / "triager" / "sealed.jsonl").read_bytes()
        secret = base64.b64encode(gzip.compress(sealed)).decode()
        runner = self.enterContext(tempfile.TemporaryDirectory())
        env = {"PATH": os.environ["PATH"], "RUNNER_TEMP": runner, "GITHUB_ENV": f"{runner}/github_env"}
        done = subprocess.run(["bash", "-e", "-c", step["run"]], env={**env, name: secret}, capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(f"{runner}/sealed/triager/sealed.jsonl", "rb") as restored:
            self.assertEqual(restored.read(), sealed)
        with open(f"{runner}/github_env") as exported:
            self.assertEqual(exported.read(), f"FACTORY_SEALED_DIR={runner}/sealed\n")
        empty = subprocess.run(["bash", "-e", "-c", step["run"]], env={**env, name: ""}, capture_output=True, text=True)
        self.assertEqual(empty.returncode, 1)
        self.assertIn("::error::", empty.stdout)


class ModuleContract(LineTest):
    """The smallest complete agent in the README, copied from it as written, proves on both halves
    with no key, is certified and runs."""

    def prepare(self):
        readme = (REPO / "README.md").read_text().split("## An agent's module")[1].split("\n## ")[0]
        blocks = re.findall(r"^```([a-z]+)\n(.*?)^```$", readme, flags=re.S | re.M)
        self.assertEqual([kind for kind, _ in blocks], ["python", "json", "jsonl", "jsonl"])
        (module, card, cases, sealed) = [text for _, text in blocks]
        (self.root / "agents" / "hours.py").write_text(module)
        (self.root / "masters" / "hours.json").write_text(card)
        (self.root / "evals" / "hours").mkdir()
        (self.root / "evals" / "hours" / "cases.jsonl").write_text(cases)
        (self.root / "evals" / "hours" / "sealed.jsonl").write_text(sealed)

    def test_what_it_says_of_denied_is_what_prove_does(self):
        """`denied` goes inside `expect` and lists the denials a case may have, not the ones it must: the
        README's own case h-3 lists a refund the agent never asks for, and proves (below)."""
        readme = (REPO / "README.md").read_text().split("## An agent's module")[1].split("\n## ")[0]
        said = " ".join(readme.split())
        self.assertIn("Inside `expect`, an optional `denied` lists the tools the broker may refuse in that case "
                      "without failing it", said)
        self.assertNotIn("expects the broker to refuse", said)
        self.assertIn('"id": "h-3", "input": "Please close my account.", "expect": {"escalate": true, "denied": '
                      '["billing:refund"]}', readme)

    def test_it_lists_every_schema_keyword_the_factory_checks(self):
        """The subset was listed by hand and lacked what the checker read; now it is broker.SCHEMA_KEYWORDS, in order."""
        said = " ".join((REPO / "README.md").read_text().split("## An agent's module")[1].split("\n## ")[0].split())
        subset = said.split("(the subset the broker checks, the same for a tool's `params`: ")[1].split("; a card")[0]
        self.assertEqual(re.findall(r"`([A-Za-z]+)`", subset), list(broker.SCHEMA_KEYWORDS))

    def test_it_proves_certifies_and_runs(self):
        for half in ([], ["--sealed"]):
            with self.subTest(half=half):
                code, out, err = self.factory("prove", "hours", *half, "--json")
                self.assertEqual(code, 0, err)
                proof = json.loads(out)
                self.assertEqual((proof["score"], proof["tool_denials"], proof["backends"]), (1.0, 0, ["offline"]))
        self.sign("hours", "C1")
        code, out, err = self.factory("run", "hours", "Are you open at 9?", "--json")
        self.assertEqual(code, 0, err)
        row = json.loads(out)
        self.assertEqual(row["output"], {"reply": "We are open Monday to Friday, 9:00 to 17:00.", "escalate": False})
        self.assertEqual([tool for tool, _ in row["tools"]], ["drafts:write"])



class Layers(unittest.TestCase):
    """The README's two layers: page one (everything before `# Reference`) is at most 150 lines in the file,
    its transcripts folded into <details>, and every link inside the README names a heading it holds."""

    def test_page_one_is_at_most_150_lines(self):
        page_one = (REPO / "README.md").read_text().split("\n# Reference\n")[0]
        self.assertLessEqual(len(page_one.splitlines()), 150, "page one grew: move the detail to the reference")
        self.assertEqual(page_one.count("\n```console\n"), page_one.count("\n<details><summary>"), "each transcript folded")
        for section in ("Two commands on a fresh machine", "The line in one picture", "The stations", "Your first agent"):
            self.assertIn(f"\n## {section}\n", page_one)

    def test_every_link_inside_the_readme_names_one_of_its_headings(self):
        text = re.sub(r"(?ms)^```.*?^```$", "", (REPO / "README.md").read_text())   # no headings in code
        anchors = [re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")   # as GitHub makes them
                   for heading in re.findall(r"(?m)^#{1,6} (.+)$", text)]
        self.assertEqual(len(anchors), len(set(anchors)), "two headings make one anchor")
        links = set(re.findall(r"\]\(#([^)]+)\)", text))
        self.assertGreater(len(links), 20)
        self.assertEqual(sorted(links - set(anchors)), [])


class Claims(CertifiedTest):
    """What the README says the line does, each claim checked against what it does."""

    def readme(self) -> str:
        """The README as one line of words (its line breaks fall anywhere)."""
        return " ".join((REPO / "README.md").read_text().split())

    def test_a_malformed_name_is_a_usage_error_an_unknown_one_a_refusal(self):
        readme = self.readme()
        self.assertIn("a malformed name — an agent, `--as`, `--from`, `--by`, a run id — or an empty `--root \"\"`", readme)
        self.assertIn("A name that is well formed but that the factory does not know (`prove nosuch`", readme)
        self.assertEqual(self.factory("prove", "No-Such")[0], 2)
        self.assertEqual(self.factory("prove", "nosuch")[0], 1)

    def test_abom_is_spelled_out_where_first_used_and_the_factory_is_not_the_line(self):
        readme = self.readme()
        self.assertEqual(readme.index("ABOM"), readme.index("the ABOM, agent bill of materials:") + len("the "))
        for phrase in ("the line reads", "the line writes", "the line does", "keyless line", "the line only hires"):
            self.assertNotIn(phrase, readme, "the factory, not a line of text")

    def test_sealed_halves_are_kept_out_of_git(self):
        """.gitignore lists evals/*/sealed.jsonl (so a sealed half `new` writes is not committed by accident),
        and the README says the shipped halves stay tracked."""
        ignored = (REPO / ".gitignore").read_text().splitlines()
        self.assertIn("evals/*/sealed.jsonl", ignored)
        self.assertIn("`.gitignore` lists `evals/*/sealed.jsonl`", self.readme())
        self.assertIn("halves were committed before and stay tracked", self.readme())

    def test_a_blank_line_in_a_tickets_file_is_skipped(self):
        self.assertIn("in a tickets file, a blank line is skipped", self.readme())
        tickets = self.tmp / "tickets.jsonl"
        tickets.write_text('\n{"id": "a", "input": "How do I order a new card?"}\n\n   \n'
                           '{"id": "b", "input": "I was charged twice"}\n\n')
        code, out, err = self.factory("run", "triager", "--file", str(tickets))
        self.assertEqual((code, err), (0, ""))
        self.assertEqual([line.split("\t")[0] for line in out.splitlines() if "\t" in line], ["a", "b"])


class StationTable(unittest.TestCase):
    """The README's table of stations shows each station's command line as its --help does: the same
    flags, each with the same value name, optional ones in [brackets], and the same positional arguments."""

    COMMON = {"-h", "--help", "--root", "--sealed-dir"}   # every station takes them; the README says so once

    def test_each_station_row_has_the_flags_its_help_has(self):
        table = README_TABLE.findall((REPO / "README.md").read_text().split("\n## Stations in full\n")[1].split("\n## ")[0])
        forms = {}
        for cell in table:
            for form in re.findall(r"`([^`]+)`", cell):
                forms.setdefault(form.split()[0], []).append(form)
        parser = factory.build_parser()
        stations = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        self.assertEqual(sorted(forms), sorted(stations))
        for name, station in stations.items():
            with self.subTest(station=name):
                flags = {a.option_strings[-1]: a for a in station._actions if a.option_strings
                         and not set(a.option_strings) & self.COMMON}
                said = [dict((flag, (bracket, value)) for bracket, flag, value in README_FLAG.findall(form))
                        for form in forms[name]]
                self.assertEqual(set().union(*said), set(flags), forms[name])
                for flag, action in flags.items():
                    for form in (form for form in said if flag in form):
                        optional, value = form[flag][0] == "[", form[flag][1] or None
                        self.assertEqual(value, value_name(action), f"{name} {flag}")
                        if action.required or len(said) == 1 or all(flag in other for other in said):
                            self.assertEqual(optional, not action.required, f"{name} {flag}: [optional] as in --help")
                words = {word for form in forms[name] for word in README_FLAG.sub(" ", form).split()[1:]}
                self.assertEqual(words, {a.metavar for a in station._actions if not a.option_strings}, forms[name])


README_TABLE = re.compile(r"^\| (`[a-z]+[^|]*`) \|", re.MULTILINE)   # the first cell of a station's row
README_FLAG = re.compile(r"(\[?)(--[a-z-]+)(?: ([A-Z][A-Za-z0-9_.=/]*|C0\.\.C3|read,draft))?\]?(?:\.\.\.)?")


def value_name(action: argparse.Action) -> str | None:
    """The name --help gives a flag's value: None for a switch, C0..C3 for a choice of tiers, else its metavar."""
    if action.nargs == 0:
        return None
    if action.choices:
        return f"{action.choices[0]}..{action.choices[-1]}"
    return action.metavar or action.dest.upper()


def tutorial_steps(text: str) -> list[tuple[list[str], list[str]]]:
    """(command words, the output lines shown under it) for each `$ ` line of the console blocks of one
    README section, in order."""
    steps = []
    for block in re.findall(r"^```console\n(.*?)^```$", text, flags=re.S | re.M):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((shlex.split(line[2:]), []))
            else:
                steps[-1][1].append(line)
    return steps


def shows(expected: list[str], actual: list[str]) -> str | None:
    """None when the actual terminal lines are the expected ones, abridged: `…` in a line stands for any
    text, and a line that is only `…` for any number of lines; else the first line that differs."""
    if not expected:
        return None if not actual else f"unexpected {actual[0]!r}"
    if expected[0] == "…":
        return min((shows(expected[1:], actual[skip:]) for skip in range(len(actual) + 1)),
                   key=lambda problem: problem is not None)
    pattern = ".*".join(map(re.escape, expected[0].split("…")))
    if not actual or not re.fullmatch(pattern, actual[0]):
        return f"expected {expected[0]!r}, got {actual[0] if actual else 'nothing'!r}"
    return shows(expected[1:], actual[1:])


class FirstAgentsCard(unittest.TestCase):
    """The card fields "Making an agent yours" names for the tutorial's agent are the card's: a rubric field and a price that validate."""

    def test_the_rubric_field_and_the_price_it_shows_are_valid_card_fields(self):
        step = (REPO / "README.md").read_text().split("\n## Making an agent yours\n", 1)[1].split("\n## ", 1)[0]
        card = factory.new_card("faq", ["faq:draft"], "alice", {"primary": factory.llm.DEFAULT_PRIMARY})
        field = json.loads("{" + re.search(r'`("field": "[a-z]+")`', step).group(1) + "}")
        prices = json.loads("{" + re.search(r'`("prices": \{.*?\}\})`', step, re.S).group(1).replace("\n", " ") + "}")
        self.assertEqual(field, {"field": card["draft_rubric"]["field"]}, "new's rubric scores the field the step names")
        self.assertEqual(factory.card_problems({**card, **prices}, "faq"), [])
        self.assertIn(f"no price for {next(iter(prices['prices']))}", step)


class FirstAgent(unittest.TestCase):
    """"Your first agent" works as written: each command run in its order, at a terminal, in a fresh copy
    of the repo with no keys, prints what the README shows (abridged where it says so) and exits 0, or
    1 where what it shows is a refusal."""

    def test_the_tutorial_command_by_command(self):
        section = (REPO / "README.md").read_text().split("\n## Your first agent\n")[1].split("\n## ")[0]
        steps = tutorial_steps(section)
        self.assertEqual([words[2] for words in (argv for argv, _ in steps)],
                         ["new", "prove", "prove", "certify", "run", "tower", "recall", "run"])
        tmp = Path(self.enterContext(tempfile.TemporaryDirectory()))
        clone = tmp / "agent-factory"
        clone.mkdir()
        for name in ("factory.py", "broker.py", "llm.py", "sage.py"):
            shutil.copy2(REPO / name, clone / name)
        copy_shipped(clone)
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp / "home"), "USER": "alice", "LANG": "C.UTF-8"}
        for argv, expected in steps:
            with self.subTest(command=" ".join(argv)):
                self.assertEqual(argv[:2], ["python3", "factory.py"])
                code, actual = on_a_terminal([sys.executable, *argv[1:]], clone, env)
                self.assertIsNone(shows(expected, actual), "\n".join(actual))
                self.assertEqual(code, 1 if expected[0].startswith("factory ") else 0, "\n".join(actual))


if __name__ == "__main__":
    unittest.main()
