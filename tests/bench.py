"""Benchmarks: every figure is a ratio to a floor measured in the same run, with the absolute value
beside it, because absolute times on a shared machine vary threefold from one run to the next.

    python3 tests/bench.py            # everything (a few minutes on 2 cores)
    python3 tests/bench.py --quick    # fewer tickets, a smaller tower, fewer repeats

It needs nothing beside a clone of the repo: the tickets are the repo's own (the inbox and the open
cases' inputs, never a sealed half), the index rows for the tower are generated, and every server
it talks to is started here on 127.0.0.1. Not a unit test: it measures and prints; each figure's
target is printed beside it and a figure past its target is marked `OVER`.

    figure                               floor (measured in the same run)            target
    python3 factory.py --help            a start that only compiles factory.py       <= 1.5x
      --help                             python3 -c pass                             (shown)
      a start that only compiles it      python3 -c pass                             (shown: --help cannot go under it)
    run --file, offline, per ticket      one call of the agent's rules on the ticket <= 4.0x
      (root under TMPDIR or /tmp, and again under /dev/shm when it exists)
    tower over N index rows, first call  reading the rows and json.loads of each     <= 1.5x
      tower after 1,000 more rows        a tower over a 1,000-row index              <= 3.0x (counts from its checkpoint)
    run --file in-process, per ticket    one call of the agent's rules on the ticket <= 2.5x (syscalls per ticket beside it)
      its instructions (valgrind)        the instructions of one rules call          (shown: load does not change it)
    prove --jobs 8, model at 200 ms      ideal: cases x latency / jobs               <= 1.25x (>= 0.8 of ideal)
    broker decision + recorded call      a bare function call with the same args     (shown, no target)
    Sage requests for 64 drafts          64 / 16 per batch                           <= 1.0x
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import hmac
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
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import broker  # noqa: E402
import factory  # noqa: E402
from tests.fake_llm import Answer, FakeServer, anthropic_message  # noqa: E402
from tests.fake_sage import FakeSage  # noqa: E402
from tests.support import make_root  # noqa: E402

# Each run creates its trace file, and a file system can make that the slowest step: creating a file on
# ext4 costs ~25 µs, but we measured 0.25-0.8 ms on this project's machines for a while after thousands
# of files were deleted (as a previous bench or test run does). So run --file is measured with its root
# on the RAM disk too, when there is one.
RAM_DISK = Path("/dev/shm")
FINAL = json.dumps({"label": "account", "escalate": False, "draft": "We are looking into your card order."})
PYTHON = [sys.executable]
# a user's environment: no factory settings or keys, and Python's own bytecode cache on (so the modules a
# station imports are read from __pycache__ as they would be; factory.py run as a script is compiled anyway)
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("FACTORY_", "SAGE", "ANTHROPIC", "OPENAI",
                                                                      "MOONSHOT", "OPENROUTER", "PYTHONDONTWRITEBYTECODE"))}


# ---------------------------------------------------------------- fixtures

def fresh_root(tmp: Path) -> tuple[Path, dict]:
    """A factory root with the shipped agents, masters and evals, and its environment (no keys)."""
    root = make_root(tmp)
    return root, {**CLEAN_ENV, "FACTORY_ROOT": str(root), "FACTORY_KEYS_DIR": str(tmp / "keys")}


def station(env: dict, *argv: str, answer: bytes | None = None) -> subprocess.CompletedProcess:
    """factory.py in a child process (stdin a pseudo-terminal typing `answer` when given)."""
    command = [*PYTHON, str(REPO / "factory.py"), *argv]
    if answer is None:
        return subprocess.run(command, env=env, capture_output=True, text=True)
    leader, follower = pty.openpty()
    child = subprocess.Popen(command, env=env, stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(follower)
    os.write(leader, answer)
    out, err = child.communicate()
    os.close(leader)
    return subprocess.CompletedProcess(command, child.returncode, out, err)


def certify(root: Path, env: dict) -> None:
    """Prove the triager's sealed half at bar 0 and sign its certificate at a pseudo-terminal."""
    card_path = root / "masters" / "triager.json"
    card = json.loads(card_path.read_text())
    card["evals"]["pass_bar"] = 0.0
    card_path.write_text(json.dumps(card))
    station(env, "prove", "triager", "--sealed")
    done = station(env, "certify", "triager", "--tier", "C1", "--by", "bench", answer=b"y\n")
    if done.returncode:
        raise SystemExit(f"certify failed: {done.stderr}")


def repo_tickets(n: int) -> list[dict]:
    """n tickets from the repo itself: the inbox, then the open cases' inputs, repeated with new ids."""
    texts = [json.loads(line)["input"] for line in (REPO / "evals" / "triager" / "inbox.jsonl").read_text().splitlines()]
    texts += [json.loads(line)["input"] for line in (REPO / "evals" / "triager" / "cases.jsonl").read_text().splitlines()]
    return [{"id": f"t{i}", "input": texts[i % len(texts)]} for i in range(n)]


def child(command: list[str], env: dict | None = None) -> Seconds:
    """Wall and CPU seconds (user + system) of one child process running `command` to the end, in the
    repo's folder (where `-c "import factory"` finds it, whatever folder the bench was started from)."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(command, env=env or CLEAN_ENV, capture_output=True, cwd=REPO)
    elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{command[:4]} failed: {done.stderr.decode()[-500:]}")
    return Seconds(elapsed, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


class Seconds(NamedTuple):
    """A duration as the wall clock saw it and as CPU time (user + system): on a shared machine the
    wall clock also counts other people's work, CPU time counts only ours."""
    wall: float
    cpu: float

    def __truediv__(self, n: float) -> "Seconds":
        return Seconds(self.wall / n, self.cpu / n)


def in_process(fn) -> Seconds:
    """Wall and CPU seconds (this process) of calling fn()."""
    started, cpu = time.perf_counter(), time.process_time()
    fn()
    return Seconds(time.perf_counter() - started, time.process_time() - cpu)


# ---------------------------------------------------------------- figures: (measured, floor) in seconds

def median(samples: list[Seconds]) -> Seconds:
    """The median wall and the median CPU time of some samples."""
    return Seconds(statistics.median(s.wall for s in samples), statistics.median(s.cpu for s in samples))


COMPILE_ONLY = "import sys\ncompile(open(sys.argv[1], 'rb').read(), sys.argv[1], 'exec')\n"


def bench_help(repeats: int) -> tuple[Seconds, Seconds, Seconds]:
    """Medians of `python3 factory.py --help`, of `python3 -c pass`, and of a child that only compiles
    factory.py (what Python does to a script on every start, before its first line runs: a script's
    bytecode is never cached, so --help cannot start faster than this), run interleaved."""
    helps, passes, compiles = [], [], []
    for _ in range(repeats):
        passes.append(child([*PYTHON, "-c", "pass"]))
        helps.append(child([*PYTHON, str(REPO / "factory.py"), "--help"]))
        compiles.append(child([*PYTHON, "-c", COMPILE_ONLY, str(REPO / "factory.py")]))
    return median(helps), median(passes), median(compiles)


def bench_run_file(n: int, parent: str | None = None) -> tuple[Seconds, Seconds]:
    """Per ticket: `run --file` of n repo tickets, offline, in a child process (its start included), with
    the factory root in a new folder under `parent` (tempfile's default when None); and one call of the
    triager's rules on each of the same tickets (in this process)."""
    from agents import triager
    tickets = repo_tickets(n)
    rules = in_process(lambda: [triager.rules(ticket["input"]) for ticket in tickets]) / n
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        root, env = fresh_root(Path(tmp))
        certify(root, env)
        path = Path(tmp) / "tickets.jsonl"
        path.write_text("".join(json.dumps(t) + "\n" for t in tickets))
        per_ticket = child([*PYTHON, str(REPO / "factory.py"), "run", "triager", "--file", str(path)], env) / n
    return per_ticket, rules


def evidence_key(keys: Path) -> bytes:
    """A factory evidence key in the keys folder (as the first proof makes one): 64 hex, mode 0600 in 0700."""
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    (keys / "_evidence.key").write_text(os.urandom(32).hex() + "\n")
    (keys / "_evidence.key").chmod(0o600)
    return (keys / "_evidence.key").read_bytes().strip()


def write_index(path: Path, rows: int, key: bytes, first: int = 0) -> None:
    """Append `rows` well-formed rows over 28 days to the index, as runs write them: a `started` row, then the
    run's `closed` row (a third flagged, p spread over 0..1), each chained to the line before it and each
    closed row sealed with `key` (the factory's format, written here directly: a million runs would take
    an hour). Run numbers start at `first`."""
    template = {"run_id": "", "agent": "triager", "at": "", "digest": "sha256:" + "0" * 64, "tier": "C1",
                "status": "done", "reason": "answered", "verdict": "routed-to-human", "gate": "flag", "p": 0.5,
                "backends": ["offline"], "cost_usd": 0.0, "steps": 3, "denied": [], "acted": 0, "staged": 0,
                "routed": True, "why": ["gate flag"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = path.read_bytes().split(b"\n") if path.exists() else []
    prev = "sha256:" + hashlib.sha256(next((line for line in reversed(lines) if line.strip()), b"")).hexdigest()
    with path.open("ab") as out:
        for i in range(first, first + rows // 2):
            at = f"2026-11-{1 + (i % rows) * 56 // rows:02}T00:00:00.000000Z"
            for row in ({"state": "started", "run_id": f"r{i}", "agent": "triager", "at": at, "tier": "C1", "digest": template["digest"]},
                        {"state": "closed", **template, "run_id": f"r{i}", "at": at, "p": (i % 100) / 100,
                         "gate": "pass" if i % 3 else "flag", "verdict": "verified" if i % 3 else "routed-to-human"}):
                line = json.dumps({**row, "prev": prev}, separators=(",", ":")).encode()
                if row["state"] == "closed":
                    line = line[:-1] + b',"mac":"hmac-sha256:' + hmac.new(key, line, hashlib.sha256).hexdigest().encode() + b'"}'
                out.write(line + b"\n")
                prev = "sha256:" + hashlib.sha256(line).hexdigest()


READ_ROWS = "import json, sys\nfor line in open(sys.argv[1], 'rb'):\n    json.loads(line)\n"


def bench_tower(rows: int, new: int = 1000) -> tuple[tuple[Seconds, Seconds], tuple[Seconds, Seconds]]:
    """((the first `python3 factory.py tower` over an index of `rows` rows, a child that reads the same file
    and json.loads each line), (a second tower after `new` more rows, which counts from the first's checkpoint,
    a tower over an index of `new` rows alone)); each run twice, interleaved, the faster kept."""
    with tempfile.TemporaryDirectory() as tmp:
        root, env = fresh_root(Path(tmp) / "big")
        small, small_env = fresh_root(Path(tmp) / "small")
        index, small_index, key = root / "traces" / "index.jsonl", small / "traces" / "index.jsonl", evidence_key(Path(tmp) / "big" / "keys")
        write_index(index, rows, key)
        write_index(small_index, new, evidence_key(Path(tmp) / "small" / "keys"))
        floors, firsts, seconds, smalls = [], [], [], []
        tower = [*PYTHON, str(REPO / "factory.py"), "tower"]
        for k in range(2):
            floors.append(child([*PYTHON, "-c", READ_ROWS, str(index)]))
            (root / "traces" / "tally.json").unlink(missing_ok=True)
            firsts.append(child(tower, env))                 # counts every row, and leaves a checkpoint
            write_index(index, new, key, first=rows + k * new)
            seconds.append(child(tower, env))                # counts the new rows from the checkpoint
            (small / "traces" / "tally.json").unlink(missing_ok=True)
            smalls.append(child(tower, small_env))
        return (min(firsts), min(floors)), (min(seconds), min(smalls))


def syscalls_per_ticket(root: Path, env: dict, tickets: Path, n: int) -> float | None:
    """System calls per ticket of `run --file` (strace -f -c: n tickets less one ticket), None without strace."""
    if not shutil.which("strace"):
        return None
    one = tickets.with_name("one.jsonl")
    one.write_text(tickets.read_text().splitlines()[0] + "\n")
    counted = []
    for path in (one, tickets):
        out = tickets.with_name("strace.txt")
        subprocess.run(["strace", "-f", "-c", "-o", str(out), *PYTHON, str(REPO / "factory.py"), "run", "triager",
                        "--file", str(path)], env=env, capture_output=True, check=True)
        counted.append(int(next(line for line in out.read_text().splitlines() if line.rstrip().endswith("total")).split()[3]))
    return (counted[1] - counted[0]) / (n - 1)


def bench_run_in_process(n: int, repeats: int) -> tuple[Seconds, Seconds, float | None]:
    """Per ticket: `run --file` of n repo tickets, offline, in this process (factory.main, its start not
    counted); one call of the triager's rules on each of the same tickets; syscalls per ticket. The rules and
    the batch are measured in turn `repeats` times and the fastest of each kept, so a busy moment of the
    machine does not land on one side of the ratio only."""
    from agents import triager
    tickets = repo_tickets(n)
    with tempfile.TemporaryDirectory() as tmp:
        root, env = fresh_root(Path(tmp))
        certify(root, env)
        path = Path(tmp) / "tickets.jsonl"
        path.write_text("".join(json.dumps(t) + "\n" for t in tickets))
        rules, batches = [], []
        with contextlib.redirect_stdout(io.StringIO()):
            factory.main(["run", "triager", "hello"], env=env)   # the agent's modules loaded, as in a batch
            for _ in range(repeats):
                rules.append(in_process(lambda: [triager.rules(ticket["input"]) for ticket in tickets]) / n)
                batches.append(in_process(lambda: factory.main(["run", "triager", "--file", str(path)], env=env)) / n)
        return min(batches), min(rules), syscalls_per_ticket(root, env, path, n)


def count_in_child(mode: str, n: int) -> None:
    """What a child run under callgrind does (bench.py --count MODE N): a root certified, a batch of 20 tickets
    run (the agent loaded, its patterns compiled), then again 20 tickets (`none`), 20 + n (`batch`), or 20 and
    then n calls of the rules (`rules`); so `batch` less `none` is n tickets, `rules` less `none` n rules calls."""
    from agents import triager
    tickets = repo_tickets(20 + n)
    with tempfile.TemporaryDirectory() as tmp:
        root, env = fresh_root(Path(tmp))
        certify(root, env)
        files = {}
        for name, some in (("warm", tickets[:20]), ("none", tickets[:20]), ("batch", tickets)):
            files[name] = Path(tmp) / f"{name}.jsonl"
            files[name].write_text("".join(json.dumps(t) + "\n" for t in some))
        with contextlib.redirect_stdout(io.StringIO()):
            factory.main(["run", "triager", "--file", str(files["warm"])], env=env)
            [triager.rules(ticket["input"]) for ticket in tickets[:20]]
            factory.main(["run", "triager", "--file", str(files["batch" if mode == "batch" else "none"])], env=env)
            if mode == "rules":
                [triager.rules(ticket["input"]) for ticket in tickets[20:]]


def instructions_per_ticket(n: int) -> tuple[float, float] | None:
    """(instructions per ticket of `run --file` in-process, per call of the triager's rules), as valgrind's
    callgrind counts them (https://valgrind.org/docs/manual/cl-manual.html): what the code executes in user
    space, the same on a busy machine and an idle one, blind to what the caches and the kernel add; None
    without valgrind. Each is the difference between two children of count_in_child, run two at a time."""
    if not shutil.which("valgrind"):
        return None
    def count(mode: str) -> int:
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *PYTHON, __file__,
                               "--count", mode, str(n)], capture_output=True, text=True, cwd=REPO,
                              env={**CLEAN_ENV, "PYTHONDONTWRITEBYTECODE": "1"})   # no child writes what another reads
        found = [line.split()[-1] for line in done.stderr.splitlines() if "Collected :" in line]
        if done.returncode or not found:
            raise SystemExit(f"valgrind --count {mode} failed: {done.stderr[-500:]}")
        return int(found[-1])
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        none, batch, rules = pool.map(count, ("none", "batch", "rules"))
    return (batch - none) / n, (rules - none) / n


def bench_prove(jobs: int, n: int = 64, delay: float = 0.2) -> tuple[Seconds, Seconds, int]:
    """(wall, ideal n x delay / jobs, Sage requests) for an in-process prove of n cases against a
    model answering after `delay` seconds, with drafts scored by a local Sage."""
    with tempfile.TemporaryDirectory() as tmp:
        root, env = fresh_root(Path(tmp))
        cases = [{"id": f"b{i}", "input": f"How do I order a new card? ({i})", "expect": {"label": "account"},
                  "source": "synthetic"} for i in range(n)]
        (root / "evals" / "triager" / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
        server = FakeServer(*[Answer(body=anthropic_message(FINAL), delay=delay) for _ in range(n)]).start()
        try:
            with FakeSage(expectation=3.0) as sage:
                env.update(ANTHROPIC_BASE_URL=server.url, ANTHROPIC_API_KEY="sk-bench", SAGE_ENDPOINT=sage.url,
                           SAGE_API_KEY="bench")
                with contextlib.redirect_stdout(io.StringIO()):
                    elapsed = in_process(lambda: factory.main(["prove", "triager", "--jobs", str(jobs), "--json"], env=env))
                requests = len(sage.requests)
        finally:
            server.close()
    ideal = n * delay / jobs
    return elapsed, Seconds(ideal, ideal), requests


def bench_broker(n: int) -> tuple[Seconds, Seconds]:
    """Seconds per broker decision + recorded call (dry mode); and per bare call of a function taking
    the same arguments."""
    contracts = {"issues:label": {"effect": "draft", "params": {"type": "object", "required": ["label"],
                 "properties": {"label": {"type": "string", "enum": ["billing", "bug"]}}}}}
    events: list = []
    desk = broker.Broker(broker.Policy("bench", frozenset(contracts), frozenset()), contracts, {}, "dry", events.append)
    def bare(tool, args):
        return tool, args
    floor = in_process(lambda: [bare("issues:label", {"label": "billing"}) for _ in range(n)]) / n
    decision = in_process(lambda: [desk.carry_out("issues:label", {"label": "billing"}) for _ in range(n)]) / n
    return decision, floor


# ---------------------------------------------------------------- the table

def unit(seconds: float) -> str:
    """A duration in the unit that reads best."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.2f} µs"


def row(what: str, measured: Seconds, floor: Seconds, floor_name: str, target: float | None, shown=unit) -> tuple:
    """One printed row: the ratio on the wall clock, the absolute figure, the floor, the target, and the
    same ratio in CPU time (what a loaded machine does not blur)."""
    ratio = measured.wall / floor.wall
    verdict = "" if target is None else ("ok" if ratio <= target else "OVER")
    cpu = f"cpu {measured.cpu / floor.cpu:.1f}×" if floor.cpu > 0 else "cpu -"
    return (what, f"{ratio:.1f}×", shown(measured.wall), f"{floor_name} {shown(floor.wall)}",
            "-" if target is None else f"<= {target}× {verdict}", cpu)


def main() -> None:
    """Measure each figure against its floor and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tickets, a smaller tower, fewer repeats")
    parser.add_argument("--count", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)   # a callgrind child's
    args = parser.parse_args()
    if args.count:
        return count_in_child(args.count[0], int(args.count[1]))
    quick = args.quick
    tickets, rows, repeats = (200, 100_000, 5) if quick else (1000, 1_000_000, 11)
    child([*PYTHON, "-c", "import factory, llm, sage, broker"])   # the bytecode cache, as after a first use
    helps, passes, compiles = bench_help(repeats)
    table = [row("python3 factory.py --help, cold", helps, compiles, "a start that only compiles it", 1.5),
             row("  --help", helps, passes, "python3 -c pass", None),
             row("  a start that only compiles factory.py", compiles, passes, "python3 -c pass", None)]
    table.append(row(f"run --file, offline, per ticket ({tickets}), root in {tempfile.gettempdir()}",
                     *bench_run_file(tickets), "one rules call", 4.0))
    if RAM_DISK.is_dir() and os.access(RAM_DISK, os.W_OK):
        table.append(row(f"run --file, offline, per ticket ({tickets}), root in {RAM_DISK}",
                         *bench_run_file(tickets, str(RAM_DISK)), "one rules call", 4.0))
    (first, floor), (second, small) = bench_tower(rows)
    table.append(row(f"tower over {rows:,} index rows, first call", first, floor, "read + json.loads", 1.5))
    table.append(row(f"  tower after 1,000 more rows (from its checkpoint)", second, small, "a tower over 1,000 rows", 3.0))
    per_ticket, rules, calls = bench_run_in_process(tickets, 3)
    table.append(row(f"run --file in-process, per ticket ({tickets}), {'-' if calls is None else f'{calls:.0f}'} syscalls per ticket",
                     per_ticket, rules, "one rules call", 2.5))
    counted = instructions_per_ticket(30 if quick else 100)
    if counted is None:
        print("bench: valgrind not found: the instructions per ticket are not counted", file=sys.stderr)
    else:
        table.append(row("  its instructions per ticket (valgrind's callgrind)", Seconds(counted[0], 0),
                         Seconds(counted[1], 0), "one rules call", None, shown=lambda n: f"{n / 1e6:.2f} M"))
    elapsed, ideal, requests = bench_prove(8)
    table.append(row("prove 64 cases, model at 200 ms, --jobs 8", elapsed, ideal, "ideal 64 x 0.2 s / 8", 1.25))
    table.append(row("Sage requests for 64 drafts", Seconds(requests, 0), Seconds(64 / 16, 0), "64 / 16 per batch", 1.0,
                     shown=lambda n: f"{n:g}"))
    table.append(row("broker decision + recorded call", *bench_broker(20000), "bare call", None))
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  load {os.getloadavg()[0]:.2f}  python {sys.version.split()[0]}")
    widths = [max(len(r[i]) for r in table) for i in range(6)]
    for r in table:
        print("  ".join(cell.ljust(width) if i != 1 else cell.rjust(width) for i, (cell, width) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    main()
