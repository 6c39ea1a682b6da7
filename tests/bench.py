"""Benchmarks against the budgets of issues 4 and 7: prints a table of measured figures.

    python3 tests/bench.py            # everything (about a minute on 2 cores)
    python3 tests/bench.py --quick    # skips the 1,000,000-row tower and the sequential prove

Not a unit test: nothing here asserts; it measures and prints each figure beside its budget.
Every server it talks to is started here on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import pty
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import broker  # noqa: E402
import factory  # noqa: E402
import llm  # noqa: E402
from tests.fake_llm import Answer, FakeServer, anthropic_message  # noqa: E402
from tests.fake_sage import FakeSage  # noqa: E402

FINAL = json.dumps({"label": "account", "escalate": False, "draft": "We are looking into your card order."})
LABEL = ("t", "issues__label", {"label": "account", "escalate": False})


def fresh_root(tmp: Path) -> tuple[Path, dict]:
    """A factory root with the shipped agents, masters and evals, and its environment (no keys)."""
    root = tmp / "factory"
    for folder in ("agents", "masters", "evals"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"FACTORY_ROOT": str(root), "FACTORY_KEYS_DIR": str(tmp / "keys"), "PATH": os.environ.get("PATH", "")}
    return root, env


def station(env: dict, *argv: str, tty_answer: bytes | None = None) -> subprocess.CompletedProcess:
    """Run factory.py in a child process (stdin a pty typing tty_answer when given)."""
    if tty_answer is None:
        return subprocess.run([sys.executable, str(REPO / "factory.py"), *argv], env=env, capture_output=True, text=True)
    leader, follower = pty.openpty()
    child = subprocess.Popen([sys.executable, str(REPO / "factory.py"), *argv], env=env, stdin=follower,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(follower)
    os.write(leader, tty_answer)
    out, err = child.communicate()
    os.close(leader)
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def certify(root: Path, env: dict) -> None:
    """Prove the triager's sealed half at bar 0 and sign its certificate at a pseudo-terminal."""
    card_path = root / "masters" / "triager.json"
    card = json.loads(card_path.read_text())
    card["evals"]["pass_bar"] = 0.0
    card_path.write_text(json.dumps(card))
    station(env, "prove", "triager", "--sealed")
    done = station(env, "certify", "triager", "--tier", "C1", "--by", "bench", tty_answer=b"y\n")
    if done.returncode:
        raise SystemExit(f"certify failed: {done.stderr}")


def bench_broker(n: int = 20000) -> float:
    """Microseconds per broker decision + recorded call (dry mode), over n calls."""
    contracts = {"issues:label": {"effect": "draft", "params": {"type": "object", "required": ["label"],
                 "properties": {"label": {"type": "string", "enum": ["billing", "bug"]}}}}}
    events: list = []
    desk = broker.Broker(broker.Policy("bench", frozenset(contracts), frozenset()), contracts, {}, "dry", events.append)
    started = time.perf_counter()
    for _ in range(n):
        desk.carry_out("issues:label", {"label": "billing"})
    return (time.perf_counter() - started) / n * 1e6


def write_cases(root: Path, n: int) -> None:
    """An open half of n short banking questions for the prove benchmarks."""
    cases = [{"id": f"b{i}", "input": f"How do I order a new card? ({i})", "expect": {"label": "account"},
              "source": "synthetic"} for i in range(n)]
    (root / "evals" / "triager" / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))


def bench_prove(jobs: int, delay: float = 0.2, n: int = 64) -> tuple[float, int]:
    """(wall seconds, Sage requests) for prove over n cases with a model answering after `delay` s."""
    with tempfile.TemporaryDirectory() as tmp:
        root, env = fresh_root(Path(tmp))
        write_cases(root, n)
        server = FakeServer(*[Answer(body=anthropic_message(FINAL), delay=delay) for _ in range(n)]).start()
        with FakeSage(expectation=3.0) as sage:
            env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="sk-bench", SAGE_ENDPOINT=sage.url,
                       SAGE_API_KEY="bench")
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                factory.main(["prove", "triager", "--jobs", str(jobs), "--json"], env=env)
            wall = time.perf_counter() - started
            requests = len(sage.requests)
        server.close()
    return wall, requests


def real_tickets(n: int) -> list[dict]:
    """n real tickets: BANKING77 test rows, then CFPB narratives (from ../shared/data)."""
    data = REPO.parent / "shared" / "data"
    rows = [r["text"] for r in csv.DictReader((data / "banking77" / "test.csv").open())]
    rows += [r["narrative"] for r in csv.DictReader((data / "cfpb-complaints" / "complaints_subset.csv").open())]
    return [{"id": f"r{i}", "input": text} for i, text in enumerate(rows[:n])]


def bench_run_file(n: int = 1000) -> float:
    """Tickets per second for `run --file` over n real tickets, offline (no keys)."""
    with tempfile.TemporaryDirectory() as tmp:
        root, env = fresh_root(Path(tmp))
        certify(root, env)
        tickets = Path(tmp) / "tickets.jsonl"
        tickets.write_text("".join(json.dumps(t) + "\n" for t in real_tickets(n)))
        started = time.perf_counter()
        done = station(env, "run", "triager", "--file", str(tickets))
        wall = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(f"run failed: {done.stderr}")
    return n / wall


def bench_tower(rows: int) -> tuple[float, float]:
    """(seconds, peak MB) for `tower` in a child process over an index of `rows` rows."""
    with tempfile.TemporaryDirectory() as tmp:
        root, env = fresh_root(Path(tmp))
        index = root / "traces" / "index.jsonl"
        index.parent.mkdir(parents=True)
        template = {"run_id": "", "agent": "triager", "at": "", "digest": "sha256:" + "0" * 64, "tier": "C1",
                    "status": "done", "reason": "answered", "verdict": "routed-to-human", "gate": "flag", "p": 0.5,
                    "backends": ["offline"], "cost_usd": 0.0, "steps": 3, "denied": [], "acted": 0, "staged": 0,
                    "routed": True, "why": ["gate flag"]}
        with index.open("w") as out:
            for i in range(rows):
                day = 1 + i * 28 // rows
                out.write(json.dumps({**template, "run_id": f"r{i}", "at": f"2026-11-{day:02}T00:00:00.000000Z",
                                      "p": (i % 100) / 100, "gate": "pass" if i % 3 else "flag"}) + "\n")
        command = ["/usr/bin/time", "-f", "%M"] if Path("/usr/bin/time").exists() else []
        started = time.perf_counter()
        done = subprocess.run(command + [sys.executable, str(REPO / "factory.py"), "tower"], env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - started
        peak_kb = int(done.stderr.strip().splitlines()[-1]) if command else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, peak_kb / 1024


def bench_help(times: int = 10) -> float:
    """Median milliseconds of a cold `python3 factory.py --help`."""
    walls = []
    for _ in range(times):
        started = time.perf_counter()
        subprocess.run([sys.executable, str(REPO / "factory.py"), "--help"], capture_output=True)
        walls.append((time.perf_counter() - started) * 1000)
    return statistics.median(walls)


def bench_loop_step(steps: int = 200) -> float:
    """Milliseconds of loop overhead per step, excluding model latency, against an instant local server."""
    with tempfile.TemporaryDirectory() as tmp:
        root, env = fresh_root(Path(tmp))
        fac = factory.Factory.at(str(root), None, {**env, "ANTHROPIC_API_KEY": "sk-bench"})
        card = factory.load_card(fac, "triager")
        card["max_steps"] = steps + 1
        agent = factory.agent_from_card(fac, card)
        server = FakeServer(*[Answer(body=anthropic_message(tool_uses=[LABEL])) for _ in range(steps)],
                            Answer(body=anthropic_message(FINAL))).start()
        env = {**fac.env, "ANTHROPIC_BASE_URL": server.url}
        worker = llm.Worker(card["model"], env, rules=agent.module.rules, task_input="hi")
        events: list = []
        desk = broker.Broker(agent.policy_at("C1"), agent.contracts, {"issues:label": lambda a: "ok"}, "run", events.append)
        loop = factory.Loop(worker, desk, agent, "How do I order a new card?", events.append)
        started = time.perf_counter()
        loop.run()
        wall = (time.perf_counter() - started) * 1000
        server.close()
    model_ms = sum(e["latency_ms"] for e in events if e.get("event") == "model")
    return (wall - model_ms) / loop.steps


def main() -> None:
    """Measure each figure and print it beside its budget."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    rows = [("broker decision + recorded call", f"{bench_broker():.1f} µs/call", "<= 20 µs")]
    rows.append(("loop overhead per step (model latency excluded)", f"{bench_loop_step():.2f} ms", "< 2 ms"))
    wall8, requests = bench_prove(8)
    rows.append(("prove 64 cases, model at 200 ms, --jobs 8", f"{wall8:.2f} s", "<= 2.5 s"))
    if not quick:
        rows.append(("prove 64 cases, model at 200 ms, --jobs 1", f"{bench_prove(1)[0]:.2f} s", "≈ 12.8 s (reference)"))
    rows.append(("Sage requests for 64 drafts", str(requests), "<= 4"))
    rows.append(("run --file 1,000 real tickets, offline", f"{bench_run_file():.0f} tickets/s", ">= 100 tickets/s"))
    count = 100_000 if quick else 1_000_000
    seconds, peak = bench_tower(count)
    rows.append((f"tower over {count:,} index rows", f"{seconds:.2f} s, peak {peak:.0f} MB", "<= 10 s, <= 200 MB"))
    rows.append(("python3 factory.py --help, cold", f"{bench_help():.0f} ms", "<= 150 ms"))
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'measured':>26}  budget")
    for what, measured, budget in rows:
        print(f"{what:<{width}}  {measured:>26}  {budget}")


if __name__ == "__main__":
    main()
