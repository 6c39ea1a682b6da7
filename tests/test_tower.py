"""The tower: one document, drawn as text, JSON and a self-contained HTML page; verdict order and
colour come from the one VERDICTS table."""

import contextlib
import hashlib
import hmac
import copy
import json
import math
import re
import unittest
from fractions import Fraction
import xml.etree.ElementTree as ET

import broker
import factory
from factory import render_tower_html
from tests.fake_sage import FakeSage
from tests.support import INJECTION, LineTest, index_line, write_jsonl

def day(when, runs, scored, passed, cost):
    """One day of an agent in the tower document's shape, its rates worked out as the tower does."""
    return {"day": when, "runs": runs, "scored": scored, "passed": passed,
            "pass_rate": passed / scored if scored else None,
            "pass_interval": broker.part(passed, scored)["interval"] if scored else None, "cost_usd": cost,
            "cost_per_run": None if cost is None else cost / runs}


def drift(certified=None, recent=None, limit=None, demoted=False, state="no baseline"):
    """An agent's drift part in the tower document's shape: certified and recent are (passes, runs)."""
    return {"test": "one-sided Fisher exact", "significance": 0.05, "window": 20,
            "certified_passes": certified and certified[0], "certified_runs": certified and certified[1],
            "certified_rate": certified and certified[0] / certified[1],
            "recent_runs": recent[1] if recent else 0, "recent_passes": recent and recent[0],
            "recent_rate": recent and recent[0] / recent[1], "limit_passes": limit,
            "limit_rate": None if limit is None else limit / 20, "demoted": demoted, "state": state}


def trust(summary="C1 signed by alice at 2026-11-22T10:00:00.000000Z; may run", **fields):
    """An agent's trust part in the tower document's shape (a verified C1 that may run, unless told)."""
    base = {"certificate": "verified", "tier": "C1", "signer": "alice", "signed_at": "2026-11-22T10:00:00.000000Z",
            "refusal": None, "revoked": None, "recalled": None, "stale": None, "refused_by": [], "demoted": False,
            "may_run": True, "runs_at": "C1", "summary": summary, "pending": 0, "uncertain_effect": 0}
    return {**base, **fields}


def make_agent(name="triager"):
    """A realistic agent entry in the tower document's shape (7 days, one unknown-cost day, one day
    whose runs were never scored)."""
    days = [day("2026-11-23", 15, 15, 11, 0.05), day("2026-11-24", 12, 12, 8, 0.04),
            day("2026-11-25", 4, 0, 0, 0.0), day("2026-11-26", 18, 18, 13, None),
            day("2026-11-27", 10, 10, 7, 0.03), day("2026-11-28", 5, 5, 0, 0.02),
            day("2026-11-29", 60, 60, 41, 0.20)]
    counts = [0, 1, 2, 4, 5, 9, 11, 16, 27, 34]
    return {
        "agent": name, "trust": trust(), "gate_bar": 0.85,
        "runs": 124, "unfinished": 2, "scored": 120, "passed": 80, "pass_rate": 80 / 120, "pass_interval": [0.5783, 0.7447],
        "unscored": 4,
        "acted": 3, "staged": 1, "denied": 2, "cost_usd": None, "cost_unknown": 18, "handed_off": 5, "backends": ["offline"],
        "models": {"claude-sonnet-5-5": 100, "gpt-4o-mini": 4}, "substituted": 4,
        "gate_p": {"bins": 10, "counts": counts, "runs": sum(counts)},
        "days": days,
        "verdicts": {"verified": 3, "waiting-for-approval": 1, "routed-to-human": 90,
                     "unscored": 20, "escalated": 2, "over-budget": 1,
                     "uncertain-effect": 0, "crashed": 0, "interrupted": 0},
        "drift": drift((14, 20), (13, 20), 8, state="in control (recent 13/20 passed, needs 8/20, certified 14/20)"),
        "problems": [],
    }


def empty_agent(name="newbie"):
    """An agent with a card and no runs at all."""
    return {
        "agent": name, "trust": trust("uncertified", certificate="none", tier=None, signer=None, signed_at=None,
                                      refusal=f"uncertified. no evals, no production. to certify it: prove {name} --sealed, "
                                              f"then certify {name} --tier C1 --by YOUR_NAME at a terminal", may_run=False, runs_at=None),
        "gate_bar": 0.9, "runs": 0, "unfinished": 0, "scored": 0, "passed": 0, "pass_rate": None, "unscored": 0,
        "acted": 0, "staged": 0, "denied": 0, "cost_usd": 0.0, "cost_unknown": 0, "handed_off": 0, "backends": [], "models": {}, "substituted": 0,
        "gate_p": {"bins": 10, "counts": [0] * 10, "runs": 0}, "days": [],
        "verdicts": {k: 0 for k in ("verified", "waiting-for-approval",
                                    "routed-to-human", "unscored", "escalated",
                                    "over-budget", "uncertain-effect", "crashed", "interrupted")},
        "drift": drift(), "problems": [],
    }


def sample_doc():
    """Two-agent sample document (one busy, one demoted with cost known) and one with no runs."""
    second = make_agent("fixer")
    second.update(cost_usd=1.37, gate_bar=0.5,
                  drift=drift((18, 20), (5, 20), 13, True, "DEMOTED to C0 (recent 5/20 passed, needs 13/20, certified 18/20)"))
    second["trust"] = trust("C1 signed by alice at 2026-11-22T10:00:00.000000Z; runs at C0 (demoted)", demoted=True, runs_at="C0")
    second["days"] = [dict(d, cost_usd=(d["cost_usd"] or 0.11) * 7, cost_per_run=(d["cost_usd"] or 0.11) * 7 / d["runs"])
                      for d in second["days"]]
    second["gate_p"] = {"bins": 10, "counts": [42, 8, 3, 1, 0, 1, 0, 3, 13, 49], "runs": 120}
    return {"format": "factory-tower-2", "generated_at": "2026-11-30T05:00:00Z", "partial": False, "problems": [],
            "agents": [make_agent("triager"), second, empty_agent()]}


def texts(elem):
    """All non-empty text fragments in an element tree."""
    return {t.strip() for t in elem.itertext() if t.strip()}


class TowerHtmlTest(unittest.TestCase):
    """The page is the tower: the text's table and the lines under each row, word for word, then each
    agent's charts, each a table whose bars are drawn from the figures beside them."""

    def render(self, doc):
        out = render_tower_html(doc)
        return out, ET.fromstring(out)

    def test_the_page_holds_the_texts_table_and_lines(self):
        doc = sample_doc()
        out, root = self.render(doc)
        self.assertTrue(out.startswith("<!DOCTYPE html>"))
        rows = [[cell.text or "" for cell in row] for row in root.find(".//table[@class='overview']")]
        self.assertEqual(rows, [[name for name, _ in broker.TOWER_COLUMNS]] + [broker.tower_cells(a) for a in doc["agents"]])
        sections = root.findall(".//section")
        self.assertEqual([s.get("data-agent") for s in sections], ["triager", "fixer", "newbie"])
        for agent, section in zip(doc["agents"], sections):
            shown = [(p.get("class"), p.text) for p in section.findall("p")]
            self.assertEqual(shown, [(kind, line.strip()) for kind, line in broker.agent_lines(agent)])
        self.assertEqual(sections[1].find("p[@class='trust']").get("data-state"), "demoted")
        self.assertIn("cost unknown in 18 of 124 runs: a run whose cost is unknown never passes the gate",
                      sections[0].find("p[@class='cost']").text, "the reason stands beside the figure")
        self.assertIn("(5 handed off by the agent though the gate passed)", sections[0].find("p[@class='verdicts']").text)

    def test_each_chart_is_a_table_of_the_figures_its_bars_draw(self):
        agent = make_agent()
        _, root = self.render({**sample_doc(), "agents": [agent]})
        charts = {table.get("data-chart"): table for table in root.iter("table") if table.get("data-chart")}
        self.assertEqual(sorted(charts), ["days", "gate-p", "verdicts"])
        def bars(table):   # (label, figure, bar width %, bar class, bar style) of each row
            return [(row[0].text, row[1].text, float(row[-1][0].get("style").split("width:")[1].split("%")[0]),
                     row[-1][0].get("class"), row[-1][0].get("style")) for row in table.findall("tr")[1:]]
        tenths = bars(charts["gate-p"])
        self.assertEqual([int(figure) for _, figure, *_ in tenths], agent["gate_p"]["counts"])
        self.assertEqual([round(width, 1) for _, _, width, *_ in tenths],
                         [round(100 * c / 34, 1) for c in agent["gate_p"]["counts"]], "bars as long as their figures")
        self.assertEqual([label for label, _, _, kind, _ in tenths if kind == "passing"], ["0.9-1.0"], "at or over bar 0.85")
        days = charts["days"].findall("tr")[1:]
        self.assertEqual([[c.text for c in row][:6] for row in days],
                         [[d["day"], str(d["runs"]), str(d["scored"]), str(d["passed"]), factory.rate_text(d),
                           broker.usd_text(d["cost_per_run"])] for d in agent["days"]])
        verdicts = bars(charts["verdicts"])
        self.assertEqual([(name, int(count)) for name, count, *_ in verdicts], list(agent["verdicts"].items()))
        self.assertEqual([style.split("background:")[1] for *_, style in verdicts], [v.colour for v in broker.VERDICTS])
        self.assertEqual(len({v.colour for v in broker.VERDICTS}), len(broker.VERDICTS), "two verdicts share a colour")
        self.assertEqual(list(factory.Tally().figures(factory.Drift(None))["verdicts"]), [v.name for v in broker.VERDICTS])
        self.assertIn("drift: in control (recent 13/20 passed, needs 8/20, certified 14/20)", charts["days"].find("caption").text)
        for table in charts.values():   # the by-day table's bar column had no header
            self.assertTrue(all((cell.text or "").strip() for cell in table.find("tr")), table.get("data-chart"))

    def test_only_runs_the_agent_handed_off_are_counted_as_handed_off(self):
        """A run the gate passed that went to a human for another reason (a duplicate acting call, a denied
        tool) is not counted as handed off by the agent: only one whose `why` says it handed off (it counted
        every gate-passed routed-to-human run)."""
        tally, row = broker.Tally(), {"run_id": "r", "at": "2026-12-01T00:00:00.000000Z", "gate": "pass", "p": 0.9,
                                      "verdict": "routed-to-human", "acted": 0, "staged": 0, "denied": [], "backends": [],
                                      "cost_usd": 0.0}
        for n, why in enumerate([["a duplicate of call 2: the same tool and arguments (by value)"],
                                 ["the broker denied a:void, which the agent asked for"],
                                 ["the broker denied a:void, which the agent asked for", f"{broker.HANDED_OFF} (needs_review: true)"]]):
            self.assertTrue(tally.add({**row, "run_id": f"r{n}", "why": why}))
        self.assertEqual(tally.figures(factory.Drift(None))["handed_off"], 1)

    def test_the_pass_column_carries_its_n_and_interval(self):
        """The pass column showed a bare 88.6% (its n and interval only on a line below, the point rounded there
        and cut here): now the cell is the rate as every other rate is printed."""
        agent = {**make_agent(), "scored": 35, "passed": 31, "pass_rate": 31 / 35, "pass_interval": list(broker.wilson(31, 35))}
        self.assertEqual(broker.tower_cells(agent)[2], "31/35 = 0.88 [0.74, 0.96]")   # Wilson: 0.7405, 0.9546
        self.assertEqual(broker.tower_cells({**agent, "scored": 0, "passed": 0, "pass_rate": None})[2], "-")
        self.assertEqual(broker.TOWER_COLUMNS[2][0], "gate pass over scored runs")

    def test_the_columns_stay_under_their_heads_at_millions_of_runs(self):
        """A pass cell over 100 or more scored runs is wider than its 26-character column (and a count of
        millions than its own): every cell after it moved right, under the next column's head."""
        doc = sample_doc()
        doc["agents"][0].update(runs=1234567, scored=1234560, passed=1134560, pass_rate=1134560 / 1234560,
                                pass_interval=list(broker.wilson(1134560, 1234560)), acted=10 ** 9)
        doc["agents"][1].update(scored=400, passed=399, pass_rate=399 / 400, pass_interval=list(broker.wilson(399, 400)))
        head, *rows = [line for line in broker.tower_lines(doc) if not line.startswith(" ")]
        self.assertEqual([row.split()[0] for row in rows], ["triager", "fixer", "newbie"])
        self.assertIn(" 1134560/1234560 = 0.91 [0.91, 0.92] 1000000000 ", rows[0])
        end = 0
        for name, _ in broker.TOWER_COLUMNS[1:-1]:   # right-aligned: each cell ends where its head ends
            end = head.index(name, end) + len(name)
            self.assertEqual([row[end - 1] != " " for row in rows], [True] * 3, f"{name}: {rows}")
            self.assertEqual({row[end] for row in rows}, {" "}, f"{name}: {rows}")
        self.assertEqual({row[head.index("backends"):].split()[0] for row in rows}, {"offline", "-"}, rows)

    def test_no_script_no_http_and_no_agents(self):
        out, root = self.render(sample_doc())
        self.assertNotIn("<script", out.lower())
        self.assertNotIn("http", out.lower())
        self.assertEqual(root.findall(".//script"), [])
        _, root = self.render({**sample_doc(), "agents": []})
        self.assertIn("(no agents yet)", " ".join(root.itertext()))

    def test_escaping_of_agent_name(self):
        name = 'a<b&c>"d\' \x00\x1b'
        out, root = self.render({**sample_doc(), "agents": [make_agent(name)], "generated_at": "<&>"})
        self.assertNotIn("<b&c>", out)
        self.assertIn("a&lt;b&amp;c&gt;", out)
        self.assertEqual(root.find(".//section").get("data-agent"), "a<b&c>\"d' \\u0000\\u001b")
        self.assertIn("<&>", " ".join(root.itertext()))

    def test_input_not_mutated(self):
        doc = sample_doc()
        before = copy.deepcopy(doc)
        render_tower_html(doc)
        self.assertEqual(doc, before)


def watched(certified: tuple[int, int], passes: int) -> factory.Drift:
    """A drift watch on a certificate measured at certified = (passes, runs), fed a full window of
    DRIFT_WINDOW gated runs holding `passes` passes (failures first)."""
    drift = factory.Drift.of_certificate({"certified_rate": round(certified[0] / certified[1], 4),
                                          "certified_rate_runs": certified[1]})
    for k in range(broker.DRIFT_WINDOW):
        drift.observe({"gate": "pass" if k >= broker.DRIFT_WINDOW - passes else "flag"})
    return drift


class DriftAtTheExtremes(unittest.TestCase):
    """Drift is a one-sided Fisher exact test of the last 20 gated runs against the runs the certified
    rate was measured on, at 1/20: exact expectations at both extremes and in the middle."""

    def test_certified_at_one_hundred_percent_is_not_demoted_by_one_flag(self):
        self.assertFalse(watched((20, 20), 19).demoted, "one flag in twenty demoted an agent certified at 20/20")
        self.assertEqual(watched((20, 20), 19).describe(), "in control (recent 19/20 passed, needs 16/20, certified 20/20)")
        self.assertFalse(watched((20, 20), 16).demoted)
        self.assertTrue(watched((20, 20), 15).demoted)
        # all five flags of the forty runs fall in the window: C(20,5)/C(40,5), just under 1/20
        self.assertEqual(broker.lower_tail((20, 20), 15, 20), Fraction(math.comb(20, 5), math.comb(40, 5)))
        self.assertEqual(broker.lower_tail((20, 20), 16, 20), Fraction(math.comb(20, 4), math.comb(40, 4)))

    def test_certified_at_seventeen_and_a_half_percent_can_be_demoted(self):
        self.assertTrue(watched((7, 40), 0).demoted, "an agent certified at 7/40 could never be demoted")
        self.assertEqual(watched((7, 40), 0).describe(), "DEMOTED to C0 (recent 0/20 passed, needs 1/20, certified 7/40)")
        self.assertFalse(watched((7, 40), 1).demoted)
        # no pass in the window: all seven passes of the sixty runs fell among the forty certified ones
        self.assertEqual(broker.lower_tail((7, 40), 0, 20), Fraction(math.comb(40, 7), math.comb(60, 7)))

    def test_in_the_middle(self):
        self.assertEqual(watched((14, 20), 8).limit, 8)
        self.assertFalse(watched((14, 20), 8).demoted)
        self.assertTrue(watched((14, 20), 7).demoted)
        self.assertLess(broker.lower_tail((14, 20), 7, 20), Fraction(*broker.DRIFT_SIGNIFICANCE))
        self.assertGreaterEqual(broker.lower_tail((14, 20), 8, 20), Fraction(*broker.DRIFT_SIGNIFICANCE))

    def test_the_limit_is_exactly_where_the_test_starts_to_reject(self):
        for certified in ((20, 20), (16, 20), (14, 20), (7, 40), (1, 20), (0, 20), (100, 100), (1000, 1000)):
            limit = watched(certified, 0).limit
            for passes in range(broker.DRIFT_WINDOW + 1):
                rejects = broker.lower_tail(certified, passes, 20) < Fraction(*broker.DRIFT_SIGNIFICANCE)
                self.assertEqual(watched(certified, passes).demoted, rejects, (certified, passes))
                self.assertEqual(passes < limit, rejects, (certified, passes))

    def test_no_baseline_and_a_window_not_yet_full(self):
        self.assertEqual(factory.Drift.of_certificate({"certified_rate": None}).describe(), "no baseline")
        self.assertEqual(factory.Drift.of_certificate({"certified_rate": 0.8}).describe(), "no baseline")
        drift = factory.Drift.of_certificate({"certified_rate": 0.8, "certified_rate_runs": 20})
        drift.observe({"gate": "flag"})
        drift.observe({"gate": "unscored"})
        self.assertEqual((drift.describe(), drift.demoted), ("watching (1/20)", False))


NUMBER = re.compile(r"\$?\d[\d,]*(?:\.\d+)?%?")
FIXED_PHRASES = ("gate p by tenths 0->1",)   # label text the renderers print, not figures


def numbers_of(value) -> list[float]:
    """Every number anywhere in a JSON value (bools are not numbers)."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers_of(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers_of(v)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def strings_of(value) -> list[str]:
    """Every string anywhere in a JSON value, keys included."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings_of(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings_of(v)]
    return [value] if isinstance(value, str) else []


def figures_not_in(doc: dict, text: str, also: tuple[float, ...] = ()) -> list[str]:
    """Each number printed in `text` that is not a number of the document, formatted (a count, a rate
    as a percent to one place, USD to the places shown, each rounded, cut or raised to its last place: an
    interval's low end is cut, its high end raised); the document's own strings (names, phrases, times)
    are taken out first, longest first."""
    for known in sorted(set(strings_of(doc)) | set(FIXED_PHRASES), key=len, reverse=True):
        if any(c.isdigit() for c in known):
            text = text.replace(known, " ")
    figures = numbers_of(doc) + list(also)
    missing = []
    for token in NUMBER.findall(text):
        digits = token.strip("$%").replace(",", "")
        places = len(digits.partition(".")[2])
        value, tolerance = float(digits), 10 ** -places + 1e-12
        if token.endswith("%"):
            value, tolerance = value / 100, tolerance / 100
        if not any(abs(figure - value) <= tolerance for figure in figures):
            missing.append(token)
    return missing


class TowerReport(LineTest):
    """tower as text, --html and --json over real runs: triager certified with a baseline (20 of 20
    gated runs passed), then 17 passes, 3 flags, 4 unscored runs and a denied refund; evalsmith
    certified with no runs."""

    def prepare(self):
        self.certified()
        self.certified("evalsmith")
        self.run_batch(20, yes_p=0.93)
        self.sign("triager")
        self.run_batch(17, yes_p=0.93)
        self.run_batch(3, yes_p=0.2)
        self.run_batch(4)
        self.factory("run", "triager", INJECTION)

    def run_batch(self, count: int, yes_p: float | None = None) -> None:
        """`run triager --file` over `count` tickets, the gate answering yes_p (no gate key when None)."""
        tickets = self.tmp / "tickets.jsonl"
        write_jsonl(tickets, [{"id": f"t{k}", "input": "How do I order a new card?"} for k in range(count)])
        with contextlib.ExitStack() as stack:
            if yes_p is not None:
                fake = stack.enter_context(FakeSage(yes_p=yes_p))
                self.env.update(SAGE_ENDPOINT=fake.url, SAGE_API_KEY="sage-key")
            code, out, err = self.factory("run", "triager", "--file", str(tickets))
        self.env.pop("SAGE_API_KEY", None)
        self.assertEqual(code, 0, err)

    def tower(self) -> tuple[dict, str, ET.Element]:
        """(the --json document, the text, the parsed --html page), each from its own station call."""
        code, out, err = self.factory("tower", "--json")
        self.assertEqual(code, 0, err)
        doc = json.loads(out)
        code, text, err = self.factory("tower")
        self.assertEqual(code, 0, err)
        page = self.tmp / "tower.html"
        self.assertEqual(self.factory("tower", "--html", str(page))[0], 0)
        return doc, text, ET.fromstring(page.read_text())

    def agent(self, doc: dict, name: str = "triager") -> dict:
        """NAME's entry in the tower document."""
        return next(a for a in doc["agents"] if a["agent"] == name)

    def test_tower_counts_runs(self):
        doc, text, _ = self.tower()
        self.assertEqual(doc["format"], "factory-tower-2")
        row = [line for line in text.splitlines() if line.startswith("triager ")][0]
        self.assertEqual(row.split("]")[1].split(), ["0", "0", "$0", "1", "5", "0", "offline"], row)
        self.assertEqual(row.split()[:2], ["triager", "45"], row)
        self.assertIn(" 37/40 = 0.92 [0.80, 0.98] ", row, "37 of 40 scored runs passed; the rate is over scored runs")
        self.assertIn("gate p by tenths 0->1: 0 0 3 0 0 0 0 0 0 37   (40 of 45 runs with a gate p; bar 0.85)", text)
        self.assertIn("verdicts verified:37 routed-to-human:3 unscored:5", text)
        triager = self.agent(doc)
        self.assertEqual((triager["runs"], triager["scored"], triager["passed"], triager["pass_rate"]), (45, 40, 37, 37 / 40))
        self.assertEqual(triager["gate_p"]["counts"], [0, 0, 3, 0, 0, 0, 0, 0, 0, 37])

    def test_every_figure_in_text_and_html_comes_from_the_document(self):
        self.append_index({"state": "started", "run_id": "20261130T000000Z-killed", "agent": "triager",   # a run killed
                           "at": "2026-11-30T00:00:00.000000Z", "tier": "C1", "digest": "sha256:x"})     # after it started
        doc, text, page = self.tower()
        self.assertEqual(self.agent(doc)["unfinished"], 1)
        self.assertEqual(figures_not_in(doc, text), [])
        html = " | ".join(" ".join(e.itertext()) for e in page.find("body") if e.get("class") != "generated")
        bin_edges = tuple(k / 10 for k in range(11))   # a bin's edges, from the document's bins = 10
        self.assertEqual(figures_not_in(doc, html, bin_edges), [], html)
        self.assertIn("unfinished: 1 (started, never closed)", html)

    def test_the_html_says_what_the_text_says(self):
        doc, text, page = self.tower()
        triager = self.agent(doc)
        section = page.find(".//section[@data-agent='triager']")
        self.assertIn(" 37/40 = 0.92 [0.80, 0.98] ", text.split("\ntriager ", 1)[1].split("\n")[0])
        lines = [line.strip() for line in text.split("\ntriager ", 1)[1].split("\n")[1:] if line.startswith(" " * 17)]
        self.assertEqual([p.text for p in section.findall("p")], lines, "the page says what the text says, line for line")
        row = next(line for line in text.splitlines() if line.startswith("triager "))
        cells = [td.text for td in page.find(".//table[@class='overview']")[2]]
        self.assertEqual(cells, broker.tower_cells(triager))
        self.assertEqual(row.split(), [word for cell in cells for word in cell.split()])
        day = section.find(".//table[@data-chart='days']")[2]
        self.assertEqual([td.text for td in day][1:5], ["45", "40", "37", "37/40 = 0.92 [0.80, 0.98]"],
                         "one denominator: scored runs, and its interval")
        state = triager["drift"]["state"]
        self.assertEqual(state, "in control (recent 17/20 passed, needs 16/20, certified 20/20)")
        self.assertIn(f"drift: {state}", text)
        histogram = section.find(".//table[@data-chart='gate-p']")
        self.assertEqual([int(row[1].text) for row in histogram[2:]], triager["gate_p"]["counts"])
        self.assertNotIn(">ok", ET.tostring(page, encoding="unicode"))

    def test_an_agent_with_a_card_and_no_runs_is_shown_with_its_trust(self):
        self.assertEqual(self.factory("stamp", "triager", "--as", "faq")[0], 0)
        doc, text, page = self.tower()
        self.assertEqual([a["agent"] for a in doc["agents"]], ["evalsmith", "faq", "triager"])
        faq = self.agent(doc, "faq")
        self.assertEqual((faq["runs"], faq["trust"]["certificate"], faq["trust"]["summary"]), (0, "none", "uncertified"))
        self.assertEqual(text.split("\nfaq ", 1)[1].split()[:2], ["0", "-"], text)
        evalsmith = self.agent(doc, "evalsmith")
        self.assertEqual(evalsmith["trust"]["tier"], "C1")
        self.assertTrue(evalsmith["trust"]["may_run"])
        self.assertEqual(page.find(".//section[@data-agent='faq']/p[@class='trust']").text, "trust: uncertified")

    def test_a_recalled_stale_agent_looks_recalled_and_stale_everywhere(self):
        self.assertEqual(self.factory("recall", "triager", "--reason", "drafted refunds it may not promise")[0], 0)
        self.edit_card("triager", gate_question="Is this reply safe to send?")
        doc, text, page = self.tower()
        trust = self.agent(doc)["trust"]
        self.assertFalse(trust["may_run"])
        self.assertEqual(trust["recalled"], "recalled since certification: drafted refunds it may not promise. re-prove and re-certify.")
        self.assertTrue(trust["stale"].startswith("the ABOM changed since certification (card"), trust["stale"])
        refused = self.factory("run", "triager", "hello")[2]
        self.assertIn(trust["refusal"], refused, "the tower says what the run station says")
        self.assertIn("; may not run (recalled, stale)", trust["summary"])
        self.assertIn(f"trust: {trust['summary']}", text)
        self.assertIn(f"  {trust['recalled']}", text)
        self.assertIn(f"  {trust['stale']}", text)
        why = [p.text for p in page.findall(".//section[@data-agent='triager']/p[@class='why']")]
        self.assertEqual(why, [trust["recalled"], trust["stale"]])
        self.assertTrue(self.agent(doc, "evalsmith")["trust"]["may_run"], "the other agent is untouched")

    def test_a_revoked_certificate_is_shown_revoked(self):
        self.assertTrue(factory.revoke(self.fac, "triager", "the signing key leaked"))
        doc, text, page = self.tower()
        trust = self.agent(doc)["trust"]
        self.assertEqual(trust["revoked"], "certificate revoked: the signing key leaked. re-prove and re-certify.")
        self.assertEqual((trust["may_run"], trust["stale"], trust["recalled"]), (False, None, None))
        self.assertIn("; may not run (revoked)", trust["summary"])
        self.assertIn(f"  {trust['revoked']}", text)
        self.assertIn("may not run (revoked)", "".join(page.find(".//section[@data-agent='triager']/p[@class='trust']").itertext()))


class PartialTower(LineTest):
    """One bad file or line never blinds the tower: it is named on its own line (stderr, and in the
    table under its agent when it names one), everything else is counted, and the tower says it is
    partial and exits 1."""

    def prepare(self):
        self.certified()
        self.certified("evalsmith")
        self.runs_ok()
        self.runs_ok()

    def partial(self, expected: str) -> tuple[dict, str]:
        """Tower text, JSON and HTML each exit 1 with `expected` as the one stderr line; (document, text)."""
        doc_code, out, doc_err = self.factory("tower", "--json")
        code, text, err = self.factory("tower")
        html_code, _, html_err = self.factory("tower", "--html", str(self.tmp / "t.html"))
        for status, stderr in ((doc_code, doc_err), (code, err), (html_code, html_err)):
            self.assertEqual(status, 1)
            self.assertEqual(len(stderr.splitlines()), 1, stderr)
            self.assertTrue(stderr.startswith(f"factory tower: {expected}"), stderr)
        doc = json.loads(out)
        self.assertTrue(doc["partial"])
        self.assertIn(broker.PARTIAL_LINE, text)
        page = ET.fromstring((self.tmp / "t.html").read_text())
        self.assertIn(broker.PARTIAL_LINE, " ".join(page.itertext()))
        return doc, text

    def triager_counted(self, doc: dict) -> None:
        """triager's two runs are all there."""
        triager = next(a for a in doc["agents"] if a["agent"] == "triager")
        self.assertEqual((triager["runs"], triager["verdicts"]["unscored"], triager["trust"]["may_run"]), (2, 2, True))

    def test_a_malformed_certificate_is_its_agents_problem_alone(self):
        (self.root / "registry" / "evalsmith.card.json").write_text('{"agent": "evalsmith", "tier": ')
        doc, text = self.partial("registry/evalsmith.card.json: not valid json")
        problem = evalsmith_problem = next(a for a in doc["agents"] if a["agent"] == "evalsmith")["problems"][0]
        self.assertTrue(evalsmith_problem.startswith("registry/evalsmith.card.json: not valid json"), problem)
        self.triager_counted(doc)
        evalsmith = next(a for a in doc["agents"] if a["agent"] == "evalsmith")
        self.assertEqual((evalsmith["problems"], evalsmith["trust"]["certificate"], evalsmith["trust"]["may_run"]),
                         ([problem], "unreadable", False))
        block = text.split("\nevalsmith ", 1)[1].split("\ntriager ", 1)[0]
        self.assertIn(f"problem: {problem}", block, "the problem is on its own line under its agent")
        self.assertEqual(doc["problems"], [])

    def test_a_torn_index_line_is_one_line_and_the_rest_is_counted(self):
        index = self.root / "traces" / "index.jsonl"
        with index.open("a") as out:
            out.write('{"run_id": "x", "agen')   # a writer killed mid-line: named once the next append ends it
        doc, text = self.partial("traces/index.jsonl line 5: cut short (its writer was killed mid-line); not counted")
        self.runs_ok()
        doc, text = self.partial("traces/index.jsonl line 5: not valid json")
        self.assertTrue(doc["problems"][0].endswith("; not counted"), doc["problems"])
        triager = next(a for a in doc["agents"] if a["agent"] == "triager")
        self.assertEqual((triager["runs"], triager["verdicts"]["unscored"]), (3, 3))
        self.assertEqual(len(doc["problems"]), 1)
        self.assertIn(f"problem: {doc['problems'][0]}", text)

    def test_a_misshapen_row_is_its_agents_problem(self):
        self.append_index({**self.index_rows()[-1], "run_id": "r-odd", "agent": "evalsmith", "acted": "x"})
        doc, _ = self.partial("traces/index.jsonl line 5: field 'acted' has the wrong type (str); not counted")
        self.triager_counted(doc)
        evalsmith = next(a for a in doc["agents"] if a["agent"] == "evalsmith")
        self.assertEqual((evalsmith["runs"], len(evalsmith["problems"])), (0, 1))

    def test_an_uncertified_agent_whose_card_does_not_load_is_named(self):
        """A card broken by hand showed as plain `trust: uncertified`, exit 0: nothing said it would not load."""
        (self.root / "masters" / "expense.json").write_text('{"agent": "expense", "prices": {"m": {"input": 1}}')
        doc, text = self.partial("its card does not load: masters/expense.json: not valid json")
        expense = next(a for a in doc["agents"] if a["agent"] == "expense")
        self.assertEqual((expense["trust"]["summary"], expense["gate_bar"]), ("uncertified", None))
        self.assertIn("problem: its card does not load: masters/expense.json: not valid json", text)

    def test_a_gated_run_written_by_hand_is_named_and_not_counted(self):
        """Anyone who can write the tree can chain a row to the index, and hand-chained passes with no MAC raised
        the tower's pass rate. A gated row whose evidence MAC does not verify is no evidence: not counted (runs,
        pass rate, drift), named under its agent, and the tower is partial."""
        run = {key: value for key, value in self.index_rows()[-1].items() if key not in ("p", "mac", "prev")}
        before = next(a for a in json.loads(self.factory("tower", "--json")[1])["agents"] if a["agent"] == "triager")
        self.append_index(*({**run, "run_id": f"r-forged-{i}", "gate": "pass", "p": 0.99, "verdict": "verified"}
                            for i in range(3)))
        self.append_index({**run, "run_id": "r-other-key", "gate": "pass", "p": 0.99, "verdict": "verified"}, sealed=True)
        index = self.root / "traces" / "index.jsonl"
        lines = index.read_bytes().splitlines(keepends=True)   # the last one sealed with another key
        index.write_bytes(b"".join(lines[:-1]) + broker.seal_line(b"f" * 64, lines[-1].split(b',"mac"')[0] + b"}\n"))
        doc, text = self.partial("4 gated run(s) of the index not counted: their evidence MAC does not verify "
                                 f"here (line {len(lines) - 3}, {len(lines) - 2}, {len(lines) - 1}, {len(lines)}): written by hand")
        triager = next(a for a in doc["agents"] if a["agent"] == "triager")
        self.assertEqual({k: triager[k] for k in ("runs", "scored", "passed", "unfinished")},
                         {k: before[k] for k in ("runs", "scored", "passed", "unfinished")})
        self.assertEqual(triager["unsealed"], 4)
        self.assertIn(f"problem: 4 gated run(s) of the index not counted", text)
        self.append_index({**run, "run_id": "r-sealed", "gate": "pass", "p": 0.99, "verdict": "verified"}, sealed=True)
        after = next(a for a in json.loads(self.factory("tower", "--json")[1])["agents"] if a["agent"] == "triager")
        self.assertEqual((after["runs"], after["passed"]), (before["runs"] + 1, before["passed"] + 1), "a sealed one counts")

    def test_figures_no_run_can_have_are_named_and_not_counted_in_every_view(self):
        run = {key: value for key, value in self.index_rows()[-1].items() if key not in ("p", "mac", "prev")}
        odd = {"r-inf": {"cost_usd": 1e999}, "r-huge": {"cost_usd": 1e300}, "r-owed": {"cost_usd": -0.5},
               "r-minus": {"acted": -1}, "r-many": {"staged": 10 ** 400}, "r-p": {"p": 7},
               "r-backend": {"backends": [{"name": "offline"}]}}
        index, key = self.root / "traces" / "index.jsonl", (self.tmp / "keys" / "_evidence.key").read_bytes().strip()
        for run_id, fields in odd.items():   # 1e999 is a number token json reads as inf; sealed as the line seals
            line = index_line(index, {**run, "run_id": run_id, **fields}).replace("Infinity", "1e999")
            index.write_text(index.read_text() + broker.seal_line(key, line.encode()).decode())
        self.append_index({**run, "run_id": "r-no-p", "gate": "pass", "verdict": "verified"}, sealed=True)
        code, out, err = self.factory("tower", "--json")
        self.assertEqual(code, 1, err)
        doc = json.loads(out, parse_constant=lambda name: self.fail(f"--json printed {name}, which is not JSON"))
        self.assertNotIn("Traceback", err)
        named = [line for line in err.splitlines() if "; not counted" in line]
        self.assertEqual(len(named), len(odd), err)
        for number, field in zip(range(5, 12), ("cost_usd", "cost_usd", "cost_usd", "acted", "staged", "p", "backends")):
            self.assertTrue(any(line.startswith(f"factory tower: traces/index.jsonl line {number}: field '{field}'")
                                for line in named), (number, field, err))
        triager = next(a for a in doc["agents"] if a["agent"] == "triager")
        self.assertEqual((triager["runs"], triager["scored"], triager["acted"], triager["staged"]), (3, 1, 0, 0),
                         "the p-less gated run is counted; no odd row is")
        self.assertEqual(triager["gate_p"]["runs"], 0)
        self.assertEqual(triager["cost_usd"], sum(row.get("cost_usd") or 0 for row in self.index_rows()[:2]))
        self.assertEqual(len(triager["problems"]), len(odd))
        self.assertTrue(doc["partial"])
        code, text, err = self.factory("tower")
        self.assertEqual(code, 1, err)
        self.assertNotIn("Traceback", err)
        row = next(line for line in text.splitlines() if line.startswith("triager "))
        self.assertIn(f" {broker.usd_text(triager['cost_usd'])} ", row)
        self.assertIn("(0 of 3 runs with a gate p; bar 0.85)", text)
        self.assertNotRegex(text.lower(), r"\b(inf|nan)\b")
        code, _, err = self.factory("tower", "--html", str(self.tmp / "t.html"))
        self.assertEqual(code, 1, err)
        page = ET.fromstring((self.tmp / "t.html").read_text())
        section = page.find(".//section[@data-agent='triager']")
        self.assertEqual([td.text for td in page.find(".//table[@class='overview']")[2]][5], broker.usd_text(triager["cost_usd"]))
        self.assertIn("0 of 3 runs with a gate p", section.find(".//table[@data-chart='gate-p']/caption").text)
        self.assertEqual(len(section.findall("p[@class='problem']")), len(odd))

    def test_a_torn_log_line_is_named_and_the_runs_are_still_counted(self):
        self.assertEqual(self.factory("recall", "evalsmith", "--reason", "leaked the sealed half")[0], 0)
        log = self.root / "registry" / "recalls.jsonl"
        log.write_text(log.read_text() + '{"agent": "tri\n')
        doc, text = self.partial("registry/recalls.jsonl line 2: not valid json")
        refused = self.factory("run", "triager", "hello")[2]
        for agent in doc["agents"]:
            self.assertEqual(agent["trust"]["certificate"], "unreadable", "a log it cannot read is no verdict on the certificate")
            self.assertEqual(len(agent["problems"]), 1)
            self.assertIn(agent["problems"][0], refused, "the line the run station refuses with")
            self.assertTrue(agent["trust"]["summary"].startswith("not checked ("), agent["trust"]["summary"])
        self.assertEqual(next(a for a in doc["agents"] if a["agent"] == "triager")["runs"], 2)
        self.assertEqual(text.count("problem: registry/recalls.jsonl line 2"), 2, "under each agent it blinds")

    def test_a_card_that_cannot_be_read_is_a_problem_not_a_stale_agent(self):
        (self.root / "masters" / "evalsmith.json").write_text('{"name": ')
        doc, text = self.partial("masters/evalsmith.json: not valid json")
        trust = next(a for a in doc["agents"] if a["agent"] == "evalsmith")["trust"]
        self.assertEqual((trust["certificate"], trust["stale"], trust["may_run"]), ("verified", None, False))
        self.assertIn("digest: unreadable", trust["refused_by"])
        self.assertNotIn("stale", trust["refused_by"])
        self.assertIn("bar ?)", text.split("\ntriager ", 1)[0], "the gate bar of a card that cannot be read is unknown")
        self.triager_counted(doc)

    def test_an_index_that_cannot_be_read_at_all_still_shows_every_agents_trust(self):
        index = self.root / "traces" / "index.jsonl"
        index.write_bytes(b"\xef\xbb\xbf" + index.read_bytes())
        doc, _ = self.partial("traces/index.jsonl line 1: starts with a utf-8 byte-order mark")
        self.assertTrue(doc["problems"][0].endswith("; runs after it are not counted"), doc["problems"])
        self.assertEqual([(a["agent"], a["runs"], a["trust"]["tier"]) for a in doc["agents"]],
                         [("evalsmith", 0, "C1"), ("triager", 0, "C1")])


class Checkpoint(LineTest):
    """The tower counts from a sealed checkpoint of the index's tally, bound to the chain's head where it was
    made, and reads only the rows after it; its answer is the full count's, on generated histories with
    torn, unsealed and removed rows. A checkpoint that does not verify, was counted by other code, or no
    longer matches the index is ignored, said in one note, and the tally counted again from the first row."""

    def prepare(self):
        self.certified("triager")

    def history(self, rng, runs: int, first: int = 0, prev: bytes | None = None) -> list[bytes]:
        """The lines `runs` runs leave in the index, chained from the line `prev` (none: the first): a started
        row, then mostly a closed one (sealed with this test's evidence key, sometimes not), sometimes torn
        (a writer killed mid-line: the next row is chained to what it left), of two agents and two digests."""
        key, digest = (self.tmp / "keys" / "_evidence.key").read_bytes().strip(), self.cert()["digest"]
        lines = []
        def put(row: dict, sealed: bool) -> None:
            body = json.dumps({**row, "prev": factory.sha256(lines[-1] if lines else prev or b"")}, separators=(",", ":")).encode()
            if sealed:
                body = body[:-1] + f',"mac":"hmac-sha256:{hmac.new(key, body, hashlib.sha256).hexdigest()}"}}'.encode()
            lines.append(body)
        for i in range(first, first + runs):
            agent, at = rng.choice(("triager", "triager", "evalsmith")), f"2026-11-{1 + i % 28:02}T00:00:{i % 60:02}.000000Z"
            run = {"run_id": f"r{i}", "agent": agent, "at": at, "tier": "C1", "digest": rng.choice((digest, "sha256:" + "1" * 64))}
            put({"state": "started", **run}, False)
            if rng.random() < 0.05:
                continue   # unfinished
            gate = rng.choice(("pass", "pass", "flag", "unsure", "unscored"))
            row = {"state": "closed", **run, "status": "done", "reason": "answered", "gate": gate,
                   "verdict": {"pass": "verified", "unscored": "unscored"}.get(gate, "routed-to-human"),
                   "p": None if gate == "unscored" else round(rng.random(), 3), "backends": ["offline"],
                   "cost_usd": rng.choice((0.0, 0.001, None)), "steps": 2, "denied": [], "acted": 0,
                   "staged": int(rng.random() < 0.05), "routed": gate != "pass", "why": []}
            put(row, rng.random() > 0.1)
            if rng.random() < 0.02:
                lines.append(lines[-1][:rng.randrange(1, len(lines[-1]))])   # torn: the next row is chained to it
        return lines

    def tower(self) -> tuple[dict, list[str]]:
        """(the tower's document without its time, its stderr lines)."""
        code, out, err = self.factory("tower", "--json")
        self.assertIn(code, (0, 1), err)
        return {**json.loads(out), "generated_at": None}, err.splitlines()

    def full(self) -> tuple[dict, list[str]]:
        """The tower counted from the index's first row: no checkpoint."""
        (self.root / "traces" / "tally.json").unlink(missing_ok=True)
        return self.tower()

    def test_counted_from_its_checkpoint_it_answers_as_counted_from_the_first_row(self):
        import random
        for seed in range(2):
            with self.subTest(seed=seed):
                self.setUp()
                index, checkpoint, rng = self.root / "traces" / "index.jsonl", self.root / "traces" / "tally.json", random.Random(seed)
                index.parent.mkdir(exist_ok=True)
                lines = self.history(rng, 700)
                for _ in range(3):   # rows removed: the chain breaks where each was
                    del lines[rng.randrange(1, len(lines))]
                index.write_bytes(b"".join(line + b"\n" for line in lines))
                first = self.tower()
                self.assertTrue(checkpoint.exists(), "a count of 1000 rows or more leaves a checkpoint")
                head = json.loads(checkpoint.read_text())["index"]
                self.assertEqual((head["bytes"], head["lines"]), (len(index.read_bytes()), len(lines)))
                more = self.history(rng, 300, first=700, prev=lines[-1])
                with index.open("ab") as out:
                    out.write(b"".join(line + b"\n" for line in more))
                counted = self.tower()
                self.assertFalse([line for line in counted[1] if "note:" in line], "it counted from its checkpoint")
                self.assertEqual(counted, self.full())
                self.assertNotEqual(counted[0], first[0], "the rows after the checkpoint were counted")
                self.assertTrue(any("the hash chain is broken here (and 2 more break(s) after it)" in line
                                    for line in counted[1]), counted[1])

    def test_a_checkpoint_that_does_not_verify_or_no_longer_matches_is_ignored_and_said_so(self):
        import random
        index, path = self.root / "traces" / "index.jsonl", self.root / "traces" / "tally.json"
        index.parent.mkdir(exist_ok=True)
        lines = self.history(random.Random(7), 700)
        index.write_bytes(b"".join(line + b"\n" for line in lines))
        self.tower()
        saved = path.read_text()
        key = (self.tmp / "keys" / "_evidence.key").read_bytes().strip()
        def resealed(change):
            state = json.loads(saved)
            change(state)
            body = {k: v for k, v in state.items() if k != "mac"}
            return json.dumps({**body, "mac": "hmac-sha256:" + hmac.new(key, factory.canonical(body), hashlib.sha256).hexdigest()})
        tally = json.loads(saved)["state"]["agents"]["triager"]
        cases = {
            "does not verify with the factory evidence key": saved.replace(f'"acted": {tally["acted"]}', f'"acted": {tally["acted"] + 5}', 1),
            "was counted by another version of factory.py": resealed(lambda s: s.update(code="sha256:" + "0" * 64)),
            f"no longer matches traces/index.jsonl at byte {len(index.read_bytes())}: rows were removed or rewritten "
            f"before it": None,
        }
        for why, text in cases.items():
            with self.subTest(why):
                path.write_text(saved)
                if text is None:
                    index.write_bytes(b"".join(line + b"\n" for line in lines[:5] + lines[6:]))   # a row removed
                else:
                    path.write_text(text)
                counted = self.tower()
                self.assertIn(f"factory: note: traces/tally.json {why}: ignored; the tally is counted again from the "
                              f"index's first row", counted[1])
                self.assertEqual((counted[0], [line for line in counted[1] if "note:" not in line]), self.full())
                index.write_bytes(b"".join(line + b"\n" for line in lines))


    def test_an_index_restored_from_a_copy_is_counted_again_not_named_broken_by_its_checkpoint(self):
        """A row edited in place breaks the chain and the tower that sees it names it (and checkpoints the
        break); once the index is restored from a copy, as that line says, the checkpoint still matches its
        head, but the break it holds is mended: it is ignored and the tower answers as the full count."""
        import random
        index = self.root / "traces" / "index.jsonl"
        index.parent.mkdir(exist_ok=True)
        lines = self.history(random.Random(5), 700)
        k = next(i for i, line in enumerate(lines) if i > 50 and b'"gate":"flag"' in line)
        edited = lines[:k] + [lines[k].replace(b'"gate":"flag"', b'"gate":"pass"')] + lines[k + 1:]
        index.write_bytes(b"".join(line + b"\n" for line in edited))
        self.assertTrue(any("the hash chain is broken here" in line for line in self.tower()[1]))
        index.write_bytes(b"".join(line + b"\n" for line in lines))   # restored
        counted = self.tower()
        self.assertFalse([line for line in counted[1] if "hash chain is broken" in line], counted[1])
        self.assertIn("factory: note: traces/tally.json no longer matches traces/index.jsonl at byte "
                      f"{len(index.read_bytes())}: rows were removed or rewritten before it: ignored; the tally is "
                      "counted again from the index's first row", counted[1])
        self.assertEqual(counted[0], self.full()[0])


if __name__ == "__main__":
    unittest.main()
