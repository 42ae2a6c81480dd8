"""A remote reward server: ``--reward-url http://HOST:PORT/PATH``.

Protocol (one HTTP POST per batch, ``Content-Type: application/json``, UTF-8)::

    request:  {"items": [{"prompt": str, "response": str, "label": <the row's label, any JSON>}, ...]}
    reply:    200, {"scores": [number, ...]}                       one finite number per item, in order
              optionally "parts": [{"name": number, ...}, ...]     per item, for the logs only
              optionally "correct": [true | false | null, ...]      per item, the server's verdict (null: none)

``prompt`` is the text of the row's last user message. A batch holds at most ``batch_size`` items.

Failures: a connection error, a timeout (``timeout_s`` per request), HTTP 429 or 5xx is tried again, up to
``retries`` more times with waits of 0.5 s, 1 s, 2 s...; when the server stays down the scorer raises
``RemoteRewardError`` (one line: the URL, what happened, how many tries). Any other HTTP status, a reply
that is not that JSON, or a wrong number of scores is a server bug: ``RemoteRewardError`` at once.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

from rewards.correctness import is_verdict
from rewards.types import Scored


class RemoteRewardError(RuntimeError):
    """The reward server could not be reached or answered wrongly; one line."""


def check_reward_url(url: str) -> str | None:
    """None when ``url`` looks usable, else a message saying what is wrong."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"--reward-url {url!r} must be http://HOST:PORT/PATH (or https://)"
    try:
        parsed.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return f"--reward-url {url!r} has a port that is not a number"
    return None


BACKOFF_S = 0.5  # the wait before the first retry; each later one doubles it


def retry_wait_s(retry: int, backoff_s: float = BACKOFF_S) -> float:
    """The wait before retry number ``retry`` (1, 2, ...)."""
    return backoff_s * 2 ** (retry - 1)


def give_up_s(timeout_s: float, retries: int, backoff_s: float = BACKOFF_S) -> float:
    """The longest a batch's tries take before ``RemoteRewardError``: every try timing out, and the waits between."""
    return (retries + 1) * timeout_s + sum(retry_wait_s(retry, backoff_s) for retry in range(1, retries + 1))


class _Retry(Exception):
    """A failure worth another try."""


class RemoteReward:
    name = "remote"

    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 3, batch_size: int = 256,
                 backoff_s: float = BACKOFF_S):
        problem = check_reward_url(url)
        if problem:
            raise RemoteRewardError(problem)
        self.url, self.timeout_s, self.retries = url, timeout_s, retries
        self.batch_size, self.backoff_s = batch_size, backoff_s

    def score(self, items: list[dict]) -> list[Scored]:
        """(score, parts, verdict) per item (``{"prompt", "response", "label"}``), in order."""
        out = []
        for start in range(0, len(items), self.batch_size):
            out += self._post(items[start : start + self.batch_size])
        return out

    def _post(self, batch: list[dict]) -> list[Scored]:
        body = json.dumps({"items": batch}, default=str).encode("utf-8")  # a value JSON lacks goes as its text
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(retry_wait_s(attempt, self.backoff_s))
            try:
                return self._parse(self._send(body), len(batch))
            except _Retry as err:
                last = str(err)
        raise RemoteRewardError(f"reward server {self.url} is down: {last} ({self.retries + 1} tries); "
                                "start it or fix --reward-url")

    def _send(self, body: bytes) -> bytes:
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return reply.read()
        except urllib.error.HTTPError as err:
            if err.code == 429 or err.code >= 500:
                raise _Retry(f"HTTP {err.code}") from None
            raise RemoteRewardError(f"reward server {self.url} answered HTTP {err.code} {err.reason}; "
                                    "check the path and the request format (docs/rewards.md)") from None
        except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(reason, TimeoutError) or "timed out" in str(reason):
                raise _Retry(f"no reply within {self.timeout_s:g} s") from None
            raise _Retry(f"{reason}") from None

    def _parse(self, raw: bytes, count: int) -> list[Scored]:
        try:
            reply = json.loads(raw)
        except ValueError:
            raise RemoteRewardError(f"reward server {self.url} replied with something that is not JSON: "
                                    f"{raw[:80]!r}") from None
        scores = reply.get("scores") if isinstance(reply, dict) else None
        if not isinstance(scores, list) or len(scores) != count:
            got = len(scores) if isinstance(scores, list) else "no list"
            raise RemoteRewardError(f"reward server {self.url} must reply {{\"scores\": [...]}} with {count} "
                                    f"numbers, got {got}")
        parts = reply.get("parts") or [{}] * count
        if not isinstance(parts, list) or len(parts) != count or not all(isinstance(p, dict) for p in parts):
            raise RemoteRewardError(f"reward server {self.url}: \"parts\" must be a list of {count} objects")
        verdicts = reply.get("correct") or [None] * count
        if not isinstance(verdicts, list) or len(verdicts) != count \
                or not all(v is None or is_verdict(v) for v in verdicts):
            raise RemoteRewardError(f"reward server {self.url}: \"correct\" must be a list of {count} true, false "
                                    "or null")
        return [Scored(_finite(s, self.url), {str(k): _finite(v, self.url) for k, v in p.items()}, c)
                for s, p, c in zip(scores, parts, verdicts)]


def _finite(value: Any, url: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RemoteRewardError(f"reward server {url} returned {value!r} as a score; scores must be finite numbers")
    return float(value)
