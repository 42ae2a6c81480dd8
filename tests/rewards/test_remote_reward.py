"""--reward-url against a real HTTP server on loopback (http.server in a thread): scores, slow, failing, down."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coati.dataset.rows import Example
from rewards.remote import RemoteReward, RemoteRewardError
from rewards.scorer import RewardScorer


class Server:
    """A reward server whose behaviour the test sets: ``mode`` ok | slow | fail_then_ok | fail | bad."""

    def __init__(self, mode="ok", delay_s=0.0, failures=0):
        self.mode, self.delay_s, self.failures = mode, delay_s, failures
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, self.headers["Content-Type"], body))
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                if outer.failures > 0:
                    outer.failures -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                if outer.mode == "notfound":
                    self.send_response(404)
                    self.end_headers()
                    return
                items = body["items"]
                reply = ({"scores": [len(i["response"]) / 10 for i in items],
                          "parts": [{"has_label": float(str(i["label"]) in i["response"])} for i in items]}
                         if outer.mode != "short" else {"scores": [1.0]})
                if outer.mode == "verdicts":  # the server's own verdict: the label appears in the response
                    reply["correct"] = [str(i["label"]) in i["response"] for i in items]
                if outer.mode == "bad_verdicts":
                    reply["correct"] = ["yes" for _ in items]
                data = json.dumps(reply).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def example(gold):
    return Example(messages=({"role": "user", "content": f"say {gold}"},), gt_answer=gold, source="t.jsonl:1",
                   row={"gt_answer": gold})


def test_scores_come_back_in_order_weighted_with_the_builtin():
    with Server() as server:
        scorer = RewardScorer("boxed", reward_url=server.url, reward_weights="boxed:1,remote:0.5")
        groups = scorer.score_groups([["\\boxed{7}", "no box"], ["\\boxed{12}"]], [example("7"), example("13")])
    assert len(server.requests) == 1  # one batch for the whole round
    path, content_type, body = server.requests[0]
    assert path == "/score" and content_type == "application/json"
    assert body == {"items": [{"prompt": "say 7", "response": "\\boxed{7}", "label": "7"},
                              {"prompt": "say 7", "response": "no box", "label": "7"},
                              {"prompt": "say 13", "response": "\\boxed{12}", "label": "13"}]}
    (right, nobox), (wrong,) = groups
    assert right.reward == pytest.approx(1.0 + 0.5 * 0.9) and right.parts["remote/has_label"] == 1.0
    assert nobox.reward == pytest.approx(0.0 + 0.5 * 0.6)
    assert wrong.reward == pytest.approx(0.1 + 0.5 * 1.0) and wrong.parts["remote"] == 1.0


def test_batches_are_split():
    with Server() as server:
        remote = RemoteReward(server.url, batch_size=2)
        scores = remote.score([{"prompt": "p", "response": "x" * n, "label": "l"} for n in range(5)])
    assert [s.score for s in scores] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert [len(body["items"]) for _, _, body in server.requests] == [2, 2, 1]


def test_failing_server_is_retried_then_answers():
    with Server(failures=2) as server:
        remote = RemoteReward(server.url, retries=2, backoff_s=0.01)
        assert remote.score([{"prompt": "p", "response": "abc", "label": "l"}])[0][0] == pytest.approx(0.3)
    assert len(server.requests) == 3


def test_server_failing_every_time_stops_with_one_line():
    with Server(failures=100) as server:
        remote = RemoteReward(server.url, retries=2, backoff_s=0.01)
        with pytest.raises(RemoteRewardError) as err:
            remote.score([{"prompt": "p", "response": "abc", "label": "l"}])
    assert str(err.value) == f"reward server {server.url} is down: HTTP 503 (3 tries); start it or fix --reward-url"
    assert len(server.requests) == 3


def test_slow_server_times_out_and_is_retried():
    with Server(delay_s=1.0) as server:
        remote = RemoteReward(server.url, timeout_s=0.2, retries=1, backoff_s=0.01)
        start = time.monotonic()
        with pytest.raises(RemoteRewardError, match=r"is down: no reply within 0.2 s \(2 tries\)"):
            remote.score([{"prompt": "p", "response": "abc", "label": "l"}])
        assert time.monotonic() - start < 5  # bounded: two timeouts and a short wait, not the server's pace
        server.delay_s = 0.05  # a server slower than usual but within the timeout is fine
        slow_ok = RemoteReward(server.url, timeout_s=2.0, retries=0)
        assert slow_ok.score([{"prompt": "p", "response": "ab", "label": "l"}])[0][0] == pytest.approx(0.2)


def test_server_down_stops_with_one_line():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    remote = RemoteReward(f"http://127.0.0.1:{port}/score", retries=1, backoff_s=0.01)
    with pytest.raises(RemoteRewardError) as err:
        remote.score([{"prompt": "p", "response": "x", "label": "l"}])
    assert "is down:" in str(err.value) and "(2 tries)" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("mode, message", [("notfound", "answered HTTP 404"),
                                           ("short", "must reply {\"scores\": [...]} with 2 numbers, got 1")])
def test_wrong_answers_are_not_retried(mode, message):
    with Server(mode) as server:
        remote = RemoteReward(server.url, retries=3, backoff_s=0.01)
        with pytest.raises(RemoteRewardError, match=message.replace("[", r"\[").replace("]", r"\]")):
            remote.score([{"prompt": "p", "response": "x", "label": "l"}] * 2)
    assert len(server.requests) == 1


@pytest.mark.parametrize("url", ["localhost:8000/score", "ftp://h/x", "http://:80/x", "http://h:port/x"])
def test_bad_urls(url):
    with pytest.raises(RemoteRewardError, match="--reward-url"):
        RemoteReward(url)


def test_the_server_may_say_what_is_correct():
    with Server("verdicts") as server:
        scorer = RewardScorer("boxed", reward_url=server.url, reward_weights="boxed:0")
        groups = scorer.score_groups([["\\boxed{7}", "7, no box"], ["\\boxed{12}"]], [example("7"), example("13")])
    (boxed, unboxed), (wrong,) = groups
    # the server's verdict, not the built-in one: "7, no box" has no box yet is correct
    assert [boxed.correct, unboxed.correct, wrong.correct] == [True, True, False]
    # and no format check of the built-in (weighted 0) fails it
    assert unboxed.parts["remote/correct"] is True and unboxed.format_ok and unboxed.reason == "correct"


def test_a_bad_verdict_from_the_server_is_one_line():
    with Server("bad_verdicts") as server, pytest.raises(RemoteRewardError) as err:
        RemoteReward(server.url).score([{"prompt": "p", "response": "r", "label": "l"}])
    assert '"correct" must be a list of 1 true, false or null' in str(err.value) and "\n" not in str(err.value)
