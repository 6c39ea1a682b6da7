"""Tests for sage.py against the scripted FakeSage server (real HTTP on 127.0.0.1, no network)."""
import socket
import time
import unittest

from sage import (BATCH_MAX, MAX_BODY, USER_AGENT, Answer, HTTPStatus, Malformed, Misconfigured, NoKey,
                  Question, Rejected, Sage, SageError, Timeout, Unreachable, plan_batches,
                  retry_after_clamped)
from tests.fake_sage import Fail, FakeSage, Reply

KEY = "lv_live_test_key_0123456789"
LEVELS = [{"level": n, "description": d}
          for n, d in enumerate(["none", "low", "moderate", "high", "severe"])]
SHAPES = ("current", "old")


class SageTestCase(unittest.TestCase):
    """Starts FakeSage servers that close after the test; builds clients from env mappings."""

    def fake(self, *args, **kwargs) -> FakeSage:
        """A started FakeSage, closed when the test ends."""
        fake = FakeSage(*args, **kwargs).start()
        self.addCleanup(fake.close)
        return fake

    def client(self, fake: FakeSage, key: str | None = KEY, **kwargs) -> Sage:
        """Sage.from_env pointed at fake, with key (None: no SAGE_API_KEY) and extra `env`."""
        env = {"SAGE_ENDPOINT": fake.url, **({"SAGE_API_KEY": key} if key else {})}
        env.update(kwargs.pop("env", {}))
        return Sage.from_env(env, **kwargs)


class ConfigTest(SageTestCase):
    def test_levanto_without_key_raises_nokey_and_sends_nothing(self):
        fake = self.fake()
        sage = self.client(fake, key=None)
        calls = [lambda: sage.yesno("x", "ok?"), lambda: sage.choice("x", "which?", ["a", "b"]),
                 lambda: sage.scale("x", "how?", LEVELS), lambda: sage.tags("x", "", ["t"]),
                 lambda: sage.sort(["a", "b"], "first?"), lambda: sage.probe(),
                 lambda: sage.batch([("x", Question("yesno", "ok?"))])]
        for call in calls:
            with self.subTest(call=call), self.assertRaises(NoKey) as caught:
                call()
            self.assertEqual(str(caught.exception), "no SAGE_API_KEY")
        self.assertFalse(sage.usable)
        self.assertEqual(fake.requests, [])
        # no HTTP opener either: from Python 3.12 building one loads the CA certificates, tens of ms a client
        self.assertNotIn("_opener", vars(sage))

    def test_systemone_with_endpoint_and_no_key_sends_no_authorization(self):
        fake = self.fake(yes_p=0.7)
        sage = self.client(fake, key=None, env={"SAGE_PROTOCOL": "systemone", "SAGE_MODEL": "m"})
        self.assertEqual(sage.yesno("x", "ok?").p, 0.7)
        self.assertNotIn("authorization", fake.requests[0].headers)

    def test_systemone_without_model_is_unusable_and_says_why(self):
        fake = self.fake()
        sage = self.client(fake, key=None, env={"SAGE_PROTOCOL": "systemone"})
        why = "SAGE_MODEL is unset: System One needs the decision model's name"
        self.assertFalse(sage.usable)
        self.assertEqual(sage.problem, why)
        for call in (lambda: sage.yesno("x", "ok?"), lambda: sage.batch([("x", Question("yesno", "ok?"))])):
            with self.subTest(call=call), self.assertRaises(Misconfigured) as caught:
                call()
            self.assertEqual(str(caught.exception), why)
        report = sage.ready()
        self.assertEqual((report["ready"], report["detail"], report["model"]), (False, why, None))
        self.assertEqual(fake.requests, [])
        blank = self.client(fake, env={"SAGE_PROTOCOL": "systemone", "SAGE_MODEL": "  "})
        self.assertEqual(blank.problem, why)

    def test_problem_is_none_when_usable_and_names_the_missing_key(self):
        fake = self.fake()
        self.assertIsNone(self.client(fake).problem)
        self.assertEqual(self.client(fake, key=None).problem, "no SAGE_API_KEY")

    def test_systemone_without_key_or_endpoint_is_nokey(self):
        sage = Sage.from_env({"SAGE_PROTOCOL": "systemone"})
        with self.assertRaises(NoKey):
            sage.yesno("x", "ok?")

    def test_defaults(self):
        sage = Sage.from_env({})
        self.assertEqual((sage.endpoint, sage.protocol, sage.timeout, sage.retries),
                         ("https://sage.levanto.ai", "levanto", 8.0, 0))
        one = Sage.from_env({"SAGE_PROTOCOL": "systemone", "SAGE_API_KEY": KEY})
        self.assertEqual(one.model, "levanto-sage-v1.3")

    def test_unknown_protocol_fails_every_call_without_network(self):
        fake = self.fake()
        sage = self.client(fake, env={"SAGE_PROTOCOL": "grpc"})
        with self.assertRaises(Misconfigured) as caught:
            sage.yesno("x", "ok?")
        self.assertIn("grpc", str(caught.exception))
        self.assertEqual(fake.requests, [])

    def test_trailing_slash_is_stripped(self):
        fake = self.fake()
        Sage.from_env({"SAGE_ENDPOINT": fake.url + "/", "SAGE_API_KEY": KEY}).yesno("x", "ok?")
        self.assertEqual(fake.requests[0].path, "/decide")

    def test_reasoning_is_sent_only_when_set(self):
        fake = self.fake()
        self.client(fake).yesno("x", "ok?")
        self.client(fake, env={"SAGE_REASONING": "off"}).batch([("x", Question("yesno", "ok?"))])
        self.assertNotIn("reasoning", fake.requests[0].body)
        self.assertEqual(fake.requests[1].body["reasoning"], "off")

    def test_repr_hides_key(self):
        self.assertNotIn(KEY, repr(Sage("https://x", KEY)))

    def test_bad_questions_raise_valueerror_before_sending(self):
        fake = self.fake()
        sage = self.client(fake)
        bad = [lambda: sage.scale("x", "how?", LEVELS[:4]),
               lambda: sage.choice("x", "which?", ["only"]),
               lambda: sage.yesno("x", ""),
               lambda: sage.sort("not a list", "first?"),
               lambda: Question("maybe", "?")]
        for call in bad:
            with self.subTest(call=call), self.assertRaises(ValueError):
                call()
        self.assertEqual(fake.requests, [])


class HeadersTest(SageTestCase):
    def test_user_agent_is_ours_and_key_is_bearer(self):
        fake = self.fake()
        self.client(fake).yesno("x", "ok?")
        headers = fake.requests[0].headers
        self.assertEqual(headers["user-agent"], USER_AGENT)
        self.assertNotIn("python-urllib", headers["user-agent"].lower().split("(")[0])
        self.assertEqual(headers["authorization"], f"Bearer {KEY}")
        self.assertEqual(headers["content-type"], "application/json")

    def test_ready_sends_no_key(self):
        fake = self.fake()
        report = self.client(fake).ready()
        self.assertTrue(report["ready"])
        self.assertEqual(report["status"], 200)
        self.assertEqual(fake.requests[0].path, "/ready")
        self.assertNotIn("authorization", fake.requests[0].headers)
        self.assertNotIn(KEY, repr(report))

    def test_ready_reports_loading(self):
        fake = self.fake(status=503, body={"detail": "Service is still loading."})
        report = self.client(fake, key=None).ready()
        self.assertEqual((report["ready"], report["status"], report["key"]), (False, 503, False))
        self.assertIn("Service is still loading.", report["detail"])


class LevantoKindsTest(SageTestCase):
    def test_yesno_both_shapes(self):
        for shape in SHAPES:
            with self.subTest(shape=shape):
                fake = self.fake(yes_p=0.93, shape=shape)
                decision = self.client(fake).yesno("ticket", "Is the reply helpful?")
                self.assertEqual((decision.kind, decision.answer, decision.p), ("yesno", "yes", 0.93))
                self.assertEqual(decision.confidence, 0.86 if shape == "old" else None)
                self.assertEqual(decision.model, fake._model())
                self.assertEqual(fake.requests[0].body, {
                    "content": "ticket",
                    "question": {"id": "yesno", "kind": "yesno",
                                 "instructions": "Is the reply helpful?"}})

    def test_yesno_null_answer_means_unsure(self):
        fake = self.fake(yes_p=0.51)
        decision = self.client(fake).yesno("x", "ok?")
        self.assertIsNone(decision.answer)
        self.assertEqual(decision.p, 0.51)

    def test_choice_both_shapes(self):
        for shape in SHAPES:
            with self.subTest(shape=shape):
                fake = self.fake(yes_p=0.8, shape=shape)
                options = ["billing", {"option": "bug", "description": "it broke"}, "other"]
                decision = self.client(fake).choice("x", "Which team?", options)
                self.assertEqual((decision.chosen, decision.p), ("billing", 0.8))
                self.assertEqual(set(decision.probabilities), {"billing", "bug", "other"})
                self.assertEqual(fake.questions()[0]["options"], [
                    {"option": "billing"}, {"option": "bug", "description": "it broke"},
                    {"option": "other"}])

    def test_choice_null_chosen(self):
        unsure = {"chosen": None, "probability": None,
                  "probabilities": [{"option": "a", "probability": 0.71},
                                    {"option": "b", "probability": 0.68}]}
        fake = self.fake(answer=lambda q, c: unsure)
        decision = self.client(fake).choice("x", "which?", ["a", "b"])
        self.assertEqual((decision.chosen, decision.p), (None, None))
        self.assertEqual(decision.probabilities, {"a": 0.71, "b": 0.68})

    def test_scale_both_shapes(self):
        for shape in SHAPES:
            with self.subTest(shape=shape):
                fake = self.fake(expectation=3.1, shape=shape)
                decision = self.client(fake).scale("draft", "How good?", LEVELS)
                self.assertEqual((decision.expectation, decision.confidence), (3.1, 0.8))
                self.assertEqual(fake.questions()[0]["levels"], LEVELS)

    def test_scale_accepts_five_descriptions(self):
        fake = self.fake()
        self.client(fake).scale("x", "how?", ["a", "b", "c", "d", "e"])
        self.assertEqual([lv["level"] for lv in fake.questions()[0]["levels"]], [0, 1, 2, 3, 4])

    def test_tags_both_shapes(self):
        for shape, applies in (("current", True), ("old", None)):
            with self.subTest(shape=shape):
                fake = self.fake(yes_p=0.9, shape=shape)
                tags = ["outage", {"id": "billing", "name": "billing: money"}]
                decision = self.client(fake).tags("x", "What is reported?", tags)
                self.assertEqual(decision.tags, {"outage": {"p": 0.9, "applies": applies},
                                                 "billing": {"p": 0.9, "applies": applies}})
                self.assertEqual(fake.questions()[0]["tags"][1], tags[1])

    def test_tags_null_applies(self):
        fake = self.fake(answer=lambda q, c: {"tags": [
            {"id": "quiz", "probability": 0.49, "applies": None},
            {"id": "summary", "probability": 0.97, "applies": True}]})
        decision = self.client(fake).tags("x", "", ["quiz", "summary"])
        self.assertIsNone(decision.tags["quiz"]["applies"])
        self.assertNotIn("instructions", fake.questions()[0])

    def test_sort_returns_indices(self):
        for shape in SHAPES:
            with self.subTest(shape=shape):
                fake = self.fake(shape=shape)
                decision = self.client(fake).sort(["typo", "db down", "pricing"], "Most urgent first")
                self.assertEqual(decision.order, [2, 1, 0])
                self.assertEqual(fake.requests[0].body["content"]["value"][1],
                                 {"id": "1", "content": "db down"})

    def test_malformed_answers(self):
        cases = {"no result": {"id": "yesno", "kind": "yesno"},
                 "wrong kind": {"id": "yesno", "kind": "scale", "result": {"expectation": 1}},
                 "p out of range": {"id": "yesno", "kind": "yesno",
                                    "result": {"answer": "yes", "probability": 1.7}},
                 "p an integer no float holds": '{"id": "yesno", "kind": "yesno", "result": {"answer": "yes", '
                                                '"probability": 1' + "0" * 400 + '}}',
                 "p missing": {"id": "yesno", "kind": "yesno", "result": {"answer": "yes"}},
                 "bad answer": {"id": "yesno", "kind": "yesno",
                                "result": {"answer": "maybe", "probability": 0.5}},
                 "not json": "<html>hello</html>",
                 "nested deeper than the parser goes": '{"id": ' + "[" * 3000 + "]" * 3000 + "}",
                 "not an object": [1, 2],
                 "NaN where no field is read": '{"id": "yesno", "kind": "yesno", "result": {"answer": "yes", '
                                               '"probability": 0.9}, "latency": NaN}',
                 "a key twice": '{"id": "yesno", "kind": "yesno", "result": {"answer": "no", "probability": 0.2, '
                                '"answer": "yes", "probability": 0.9}}'}
        for name, body in cases.items():
            with self.subTest(name=name):
                fake = self.fake(body=body)
                with self.assertRaises(Malformed) as caught:
                    self.client(fake).yesno("x", "ok?")
                self.assertTrue(str(caught.exception).startswith("malformed response: "))


class BatchTest(SageTestCase):
    @staticmethod
    def numbered(question: dict, content) -> dict | Fail:
        """p = n/100 for instructions 'qN'; q17 fails on its own."""
        n = int(question["instructions"][1:])
        return Fail("sort requires list content") if n == 17 else {"answer": "no", "probability": n / 100}

    def test_forty_questions_over_four_contents(self):
        fake = self.fake(answer=self.numbered)
        contents = [f"document {k}" for k in range(4)]
        items = [(contents[n % 4], Question("yesno", f"q{n}")) for n in range(40)]
        results = self.client(fake).batch(items)
        self.assertGreaterEqual(len(fake.requests), 3)
        for seen in fake.requests:
            self.assertEqual(seen.path, "/decide/batch")
            groups = seen.body["requests"]
            self.assertLessEqual(sum(len(g["questions"]) for g in groups), BATCH_MAX)
            for group in groups:
                numbers = [int(q["instructions"][1:]) for q in group["questions"]]
                self.assertTrue(all(contents[n % 4] == group["content"] for n in numbers))
        self.assertEqual(len(fake.questions()), 40)
        for n, result in enumerate(results):
            with self.subTest(n=n):
                if n == 17:
                    self.assertIsInstance(result, Rejected)
                    self.assertIn("sort requires list content", str(result))
                else:
                    self.assertIsInstance(result, Answer)
                    self.assertEqual(result.p, n / 100)

    def test_one_content_with_forty_questions_is_split(self):
        fake = self.fake()
        results = self.client(fake).batch([("same", Question("yesno", f"q{n}")) for n in range(40)])
        sizes = [len(s.body["requests"][0]["questions"]) for s in fake.requests]
        self.assertEqual(sizes, [16, 16, 8])
        self.assertTrue(all(isinstance(r, Answer) for r in results))

    def test_mixed_kinds(self):
        fake = self.fake(yes_p=0.9, expectation=2.0)
        items = [("t", Question("yesno", "ok?")), ("t", Question("scale", "how?", levels=LEVELS)),
                 (["a", "b"], Question("sort", "first?")),
                 ("t", Question("choice", "which?", options=("x", "y"))),
                 ("t", Question("tags", tags=("u",)))]
        results = self.client(fake).batch(items)
        self.assertEqual([r.kind for r in results], ["yesno", "scale", "sort", "choice", "tags"])
        self.assertEqual((results[1].expectation, results[2].order, results[3].chosen),
                         (2.0, [1, 0], "x"))
        self.assertEqual(len(fake.requests), 1)

    def test_empty_batch_sends_nothing(self):
        fake = self.fake()
        self.assertEqual(self.client(fake).batch([]), [])
        self.assertEqual(fake.requests, [])

    def test_no_key_raises_and_sends_nothing(self):
        fake = self.fake()
        with self.assertRaises(NoKey):
            self.client(fake, key=None).batch([("x", Question("yesno", "ok?"))])
        self.assertEqual(fake.requests, [])

    def test_fatal_status_stops_the_batch(self):
        fake = self.fake(status=403, body={"detail": "Request blocked"})
        results = self.client(fake).batch([(f"d{n}", Question("yesno", "ok?")) for n in range(40)])
        self.assertEqual(len(fake.requests), 1)
        self.assertTrue(all(isinstance(r, HTTPStatus) and r.status == 403 for r in results))

    def test_bad_request_fails_only_its_request(self):
        fake = self.fake(replies=[Reply(400, {"detail": "scale levels must be integers in 0..4"})])
        results = self.client(fake).batch([(f"d{n}", Question("yesno", "ok?")) for n in range(20)])
        self.assertEqual(len(fake.requests), 2)
        self.assertTrue(all(isinstance(r, HTTPStatus) for r in results[:16]))
        self.assertTrue(all(isinstance(r, Answer) for r in results[16:]))

    def test_answer_count_mismatch_is_malformed(self):
        fake = self.fake(body={"results": [{"answers": []}]})
        [result] = self.client(fake).batch([("x", Question("yesno", "ok?"))])
        self.assertIsInstance(result, Malformed)

    def test_answer_in_wrong_slot_is_malformed(self):
        envelope = {"id": "q1", "kind": "yesno", "result": {"answer": "yes", "probability": 0.9}}
        fake = self.fake(body={"results": [{"answers": [{"ok": True, "result": envelope}]}]})
        [result] = self.client(fake).batch([("x", Question("yesno", "ok?"))])
        self.assertIsInstance(result, Malformed)

    def test_plan_batches_groups_and_caps(self):
        items = [(f"c{n % 3}", Question("yesno", "ok?")) for n in range(50)]
        plan = plan_batches(items)
        self.assertTrue(all(sum(len(part) for part in request) <= 16 for request in plan))
        self.assertEqual(sorted(i for r in plan for part in r for i, _, _ in part), list(range(50)))


class ErrorTest(SageTestCase):
    STATUSES = {400: "request rejected", 401: "the key was refused",
                402: "the allowance is used up", 403: "check the User-Agent",
                429: "rate limited", 503: "the model is loading"}

    def test_statuses_have_distinct_one_line_messages_with_detail(self):
        messages = set()
        for status, hint in self.STATUSES.items():
            with self.subTest(status=status):
                detail = f"detail for {status}\nsecond line"
                fake = self.fake(status=status, body={"detail": detail})
                with self.assertRaises(HTTPStatus) as caught:
                    self.client(fake).yesno("x", "ok?")
                message = str(caught.exception)
                self.assertTrue(message.startswith(f"HTTP {status} — {hint}"))
                self.assertIn(f"detail for {status} second line", message)
                self.assertNotIn("\n", message)
                self.assertEqual(caught.exception.status, status)
                messages.add(message)
        self.assertEqual(len(messages), len(self.STATUSES))

    def test_an_error_body_nested_deeper_than_the_parser_goes_is_still_the_status(self):
        fake = self.fake(status=400, body='{"detail": ' + "[" * 3000 + "]" * 3000 + "}")
        with self.assertRaises(HTTPStatus) as caught:
            self.client(fake).yesno("x", "ok?")
        self.assertEqual(caught.exception.status, 400)

    def test_a_lone_surrogate_in_an_error_detail_is_read_as_text(self):
        bodies = {"a string": '{"detail": "boom \\ud800 now"}', "a list": '{"detail": [{"msg": "\\udfff"}, 5]}',
                  "an object": '{"detail": {"message": "x\\udc00"}}'}
        for shape, body in bodies.items():
            with self.subTest(shape):
                fake = self.fake(status=400, body=body)
                with self.assertRaises(HTTPStatus) as caught:
                    self.client(fake).yesno("x", "ok?")
                self.assertIn("\ufffd", caught.exception.detail)
                str(caught.exception).encode("utf-8")   # raises UnicodeEncodeError on a lone surrogate

    def test_403_line_for_the_gate(self):
        fake = self.fake(status=403, body={"detail": "Request blocked"})
        with self.assertRaises(SageError) as caught:
            self.client(fake).yesno("x", "ok?")
        self.assertEqual(str(caught.exception), "HTTP 403 — check the User-Agent (edge blocks "
                                                "default clients even with a good key): Request blocked")

    def test_key_never_in_messages(self):
        fake = self.fake(status=401, body={"detail": f"key {KEY} is not valid"})
        with self.assertRaises(HTTPStatus) as caught:
            self.client(fake).yesno("x", "ok?")
        self.assertNotIn(KEY, str(caught.exception))
        self.assertNotIn(KEY, caught.exception.detail)

    def test_other_detail_shapes(self):
        cases = [(502, "Bad Gateway", "Bad Gateway"),
                 (401, {"detail": {"error_type": "authentication_error", "message": "bad key"}},
                  "bad key"),
                 (422, {"detail": [{"loc": ["content"], "msg": "Field required"}]}, "Field required"),
                 (500, {"message": "boom"}, "boom")]
        for status, body, expected in cases:
            with self.subTest(status=status):
                fake = self.fake(status=status, body=body)
                with self.assertRaises(HTTPStatus) as caught:
                    self.client(fake).yesno("x", "ok?")
                self.assertTrue(str(caught.exception).endswith(f": {expected}"))

    def test_timeout(self):
        fake = self.fake(delay=2.0)
        start = time.monotonic()
        with self.assertRaises(Timeout) as caught:
            self.client(fake, timeout=0.1).yesno("x", "ok?")
        self.assertLess(time.monotonic() - start, 0.8)
        self.assertEqual(str(caught.exception), "timeout 0.1s")
        self.assertEqual(caught.exception.seconds, 0.1)

    def test_dripping_reply_ends_at_the_deadline(self):
        # a byte every 0.05 s never trips a per-read timeout; the client's timeout is the whole call's
        fake = self.fake(replies=[Reply(200, {"id": "yesno", "kind": "yesno", "result": {}}, drip=0.05)])
        start = time.monotonic()
        with self.assertRaises(Timeout) as caught:
            self.client(fake, timeout=0.4).yesno("x", "ok?")
        self.assertLess(time.monotonic() - start, 1.2)
        self.assertEqual(str(caught.exception), "timeout 0.4s")

    def test_dripping_error_body_keeps_its_status_and_ends_at_the_deadline(self):
        fake = self.fake(replies=[Reply(503, {"detail": "loading " * 50}, drip=0.05)])
        start = time.monotonic()
        with self.assertRaises(HTTPStatus) as caught:
            self.client(fake, timeout=0.4).yesno("x", "ok?")
        self.assertLess(time.monotonic() - start, 1.2)
        self.assertEqual(caught.exception.status, 503)

    def test_body_past_the_cap_is_malformed(self):
        fake = self.fake(replies=[Reply(200, b" " * (MAX_BODY + 1) + b"{}")])
        with self.assertRaises(Malformed) as caught:
            self.client(fake).yesno("x", "ok?")
        self.assertEqual(str(caught.exception), "malformed response: response body over 4 MiB")

    def test_unreachable(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        sage = Sage.from_env({"SAGE_ENDPOINT": f"http://127.0.0.1:{port}", "SAGE_API_KEY": KEY})
        with self.assertRaises(Unreachable) as caught:
            sage.yesno("x", "ok?")
        self.assertIn(f"127.0.0.1:{port}", str(caught.exception))
        self.assertFalse(sage.ready()["ready"])

    def test_redirect_is_not_followed(self):
        fake = self.fake()
        fake.replies.append(Reply(302, "", {"Location": fake.url + "/decide"}))
        with self.assertRaises(HTTPStatus) as caught:
            self.client(fake).yesno("x", "ok?")
        self.assertEqual(caught.exception.status, 302)
        self.assertEqual(len(fake.requests), 1)


class RetryTest(SageTestCase):
    def setUp(self):
        self.sleeps = []

    def batch_client(self, fake: FakeSage, **kwargs) -> Sage:
        """A client as prove builds it: retries=2, sleeps recorded instead of slept."""
        return self.client(fake, retries=2, sleep=self.sleeps.append, **kwargs)

    def test_batch_honours_retry_after(self):
        fake = self.fake(replies=[Reply(429, {"detail": "slow down"}, {"Retry-After": "2"}), Reply()])
        [result] = self.batch_client(fake).batch([("x", Question("yesno", "ok?"))])
        self.assertIsInstance(result, Answer)
        self.assertEqual(self.sleeps, [2.0])
        self.assertEqual(len(fake.requests), 2)

    def test_gives_up_after_retries_with_backoff(self):
        fake = self.fake(status=503, body={"detail": "Service is still loading."})
        [result] = self.batch_client(fake).batch([("x", Question("yesno", "ok?"))])
        self.assertIsInstance(result, HTTPStatus)
        self.assertEqual((len(fake.requests), self.sleeps), (3, [0.5, 1.0]))

    def test_timeout_is_never_retried(self):
        fake = self.fake(delay=2.0)
        [result] = self.batch_client(fake, timeout=0.1).batch([("x", Question("yesno", "ok?"))])
        self.assertIsInstance(result, Timeout)
        self.assertEqual((len(fake.requests), self.sleeps), (1, []))

    def test_client_errors_are_not_retried(self):
        fake = self.fake(status=400, body={"detail": "no"})
        with self.assertRaises(HTTPStatus):
            self.batch_client(fake).yesno("x", "ok?")
        self.assertEqual((len(fake.requests), self.sleeps), (1, []))

    def test_default_is_one_attempt(self):
        fake = self.fake(status=429, body={"detail": "slow down"})
        with self.assertRaises(HTTPStatus):
            self.client(fake, sleep=self.sleeps.append).yesno("x", "ok?")
        self.assertEqual((len(fake.requests), self.sleeps), (1, []))

    def test_retry_after_forms(self):
        now = 1_000_000.0
        self.assertEqual(retry_after_clamped("3", now), 3.0)
        self.assertEqual(retry_after_clamped("999", now), 30.0)
        self.assertEqual(retry_after_clamped("Mon, 12 Jan 1970 13:46:45 GMT", now), 5.0)
        self.assertIsNone(retry_after_clamped("soon", now))
        self.assertIsNone(retry_after_clamped("nan", now))
        self.assertIsNone(retry_after_clamped(None, now))


class SystemOneTest(SageTestCase):
    def one(self, fake: FakeSage, **kwargs) -> Sage:
        """A System One client for fake with model lev-test."""
        env = {"SAGE_PROTOCOL": "systemone", "SAGE_MODEL": "lev-test"}
        return self.client(fake, env=env, **kwargs)

    def test_yesno_is_a_noul_without_abstention(self):
        for p, answer in ((0.93, "yes"), (0.5, "yes"), (0.3, "no")):
            with self.subTest(p=p):
                fake = self.fake(yes_p=p)
                decision = self.one(fake).yesno("ticket", "Helpful?")
                self.assertEqual((decision.answer, decision.p), (answer, p))
                self.assertEqual(fake.requests[0].path, "/v1/systemone")
                self.assertEqual(fake.requests[0].body, {
                    "model": "lev-test", "state": "ticket",
                    "questions": {"q0": {"type": "noul", "instructions": "Helpful?"}}})
                self.assertEqual(fake.requests[0].headers["authorization"], f"Bearer {KEY}")

    def test_choice_maps_to_criteria(self):
        fake = self.fake(yes_p=0.8)
        options = ["billing", {"option": "bug", "description": "it broke"}]
        decision = self.one(fake).choice("x", "Which team?", options)
        self.assertEqual(fake.requests[0].body["questions"]["q0"],
                         {"type": "choice", "instructions": "Which team?",
                          "criteria": {"billing": None, "bug": "it broke"}})
        self.assertEqual((decision.chosen, decision.p, decision.confidence), ("billing", 0.8, 0.8))

    def test_scale_maps_to_score_with_five_criteria(self):
        fake = self.fake(expectation=1.0)
        decision = self.one(fake).scale("x", "How bad?", LEVELS)
        question = fake.requests[0].body["questions"]["q0"]
        self.assertEqual((question["type"], question["criteria"]),
                         ("score", ["none", "low", "moderate", "high", "severe"]))
        self.assertEqual((decision.expectation, decision.probabilities["1"]), (1.0, 1.0))

    def test_tags_map_to_one_noul_each(self):
        fake = self.fake(answer=lambda q, state: {"type": "noul",
                                                  "noul": 0.9 if "outage" in q["instructions"] else 0.2})
        decision = self.one(fake).tags("x", "What is reported?", ["outage", "billing"])
        questions = fake.requests[0].body["questions"]
        self.assertEqual([q["type"] for q in questions.values()], ["noul", "noul"])
        self.assertEqual(decision.tags, {"outage": {"p": 0.9, "applies": True},
                                         "billing": {"p": 0.2, "applies": False}})

    def test_sort_is_not_available(self):
        fake = self.fake()
        with self.assertRaises(Rejected):
            self.one(fake).sort(["a", "b"], "first?")
        self.assertEqual(fake.requests, [])

    def test_refusal_is_rejected(self):
        fake = self.fake(answer=lambda q, state: {"type": "refusal"})
        with self.assertRaises(Rejected):
            self.one(fake).yesno("x", "ok?")

    def test_batch_sends_one_state_per_call(self):
        fake = self.fake(yes_p=0.6)
        items = [("a", Question("yesno", "ok?")), ("b", Question("yesno", "ok?")),
                 ("a", Question("scale", "how?", levels=LEVELS)), (["x", "y"], Question("sort", "?"))]
        results = self.one(fake).batch(items)
        self.assertEqual([s.body["state"] for s in fake.requests], ["a", "b"])
        self.assertEqual(list(fake.requests[0].body["questions"]), ["q0", "q1"])
        self.assertEqual([type(r).__name__ for r in results], ["Answer"] * 3 + ["Rejected"])

    def test_endpoint_that_names_the_route(self):
        fake = self.fake()
        env = {"SAGE_PROTOCOL": "systemone", "SAGE_ENDPOINT": fake.url + "/v1/systemone", "SAGE_MODEL": "d1-omni"}
        Sage.from_env(env).probe()
        self.assertEqual(fake.requests[0].path, "/v1/systemone")
        self.assertEqual(fake.requests[0].body["model"], "d1-omni")

    def test_ready_probes_with_one_noul(self):
        fake = self.fake()
        report = self.one(fake).ready()
        self.assertTrue(report["ready"])
        self.assertEqual([q["type"] for q in fake.requests[0].body["questions"].values()], ["noul"])

    def test_error_detail_object(self):
        fake = self.fake(answer=lambda q, state: Fail("max_tokens_exceeded"))
        with self.assertRaises(HTTPStatus) as caught:
            self.one(fake).yesno("x", "ok?")
        self.assertIn("max_tokens_exceeded", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
