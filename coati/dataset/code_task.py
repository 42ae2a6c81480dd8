"""Small generated code tasks in PRIME format, for code-reward training runs and tests.

A row: ``{"messages": {"role": "user", "content": statement}, "test_cases": {"inputs": [...], "outputs":
[...]}, "task": name}``. Inputs are generated from a seeded ``random.Random``, outputs computed in Python, so
``write_code_dataset(path, n, seed)`` writes the same file for the same arguments. Every task also has a
reference program (passes all its cases) and a subtly wrong one (fails at least one case of every row,
guaranteed by :func:`generate_rows`), both stdin -> stdout Python 3 programs, for tests.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CodeTask:
    name: str
    statement: str
    make_input: Callable[[random.Random], str]  # one test input (stdin text)
    solve: Callable[[str], str]  # the expected stdout for an input
    reference: str  # correct program
    wrong: str  # plausible but wrong program
    wrong_solve: Callable[[str], str]  # what ``wrong`` prints for an input


def _ints(text: str) -> list[int]:
    return [int(token) for token in text.split()]


def _words(rng: random.Random, count: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz") -> list[str]:
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(count)]


def _lines_of_words(rng: random.Random) -> str:
    return "".join(" ".join(_words(rng, rng.randint(0, 5))) + "\n" for _ in range(rng.randint(1, 4)))


def _list_input(rng: random.Random, low: int = -1000, high: int = 1000, max_len: int = 12) -> str:
    values = [rng.randint(low, high) for _ in range(rng.randint(1, max_len))]
    return f"{len(values)}\n{' '.join(map(str, values))}\n"


def _fizzbuzz(n: int) -> str:
    out = []
    for i in range(1, n + 1):
        out.append("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i))
    return "\n".join(out) + "\n"


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _palindrome_input(rng: random.Random) -> str:
    half = "".join(rng.choice("abc") for _ in range(rng.randint(1, 5)))
    if rng.random() < 0.5:
        return half + half[::-1][rng.randint(0, 1) :] + "\n"
    return half + rng.choice("abc") + half + "\n"


TASKS: tuple[CodeTask, ...] = (
    CodeTask(
        name="sum_two",
        statement="Read two integers a and b separated by a space on one line and print their sum.",
        make_input=lambda rng: f"{rng.randint(-10**9, 10**9)} {rng.randint(-10**9, 10**9)}\n",
        solve=lambda text: f"{sum(_ints(text))}\n",
        reference="a, b = map(int, input().split())\nprint(a + b)\n",
        wrong="a, b = map(int, input().split())\nprint(a - b)\n",
        wrong_solve=lambda text: f"{_ints(text)[0] - _ints(text)[1]}\n",
    ),
    CodeTask(
        name="reverse_string",
        statement="Read one line containing a string of lowercase letters and print it reversed.",
        make_input=lambda rng: "".join(_words(rng, 3)) + "\n",
        solve=lambda text: text.strip()[::-1] + "\n",
        reference="s = input().strip()\nprint(s[::-1])\n",
        wrong="s = input().strip()\nprint(s)\n",
        wrong_solve=lambda text: text.strip() + "\n",
    ),
    CodeTask(
        name="count_vowels",
        statement=(
            "Read one line of lowercase letters and spaces and print how many vowels (a, e, i, o, u) it contains."
        ),
        make_input=lambda rng: " ".join(_words(rng, rng.randint(1, 6))) + "\n",
        solve=lambda text: f"{sum(ch in 'aeiou' for ch in text)}\n",
        reference="s = input()\nprint(sum(ch in 'aeiou' for ch in s))\n",
        wrong="s = input()\nprint(sum(ch in 'aeio' for ch in s))\n",
        wrong_solve=lambda text: f"{sum(ch in 'aeio' for ch in text)}\n",
    ),
    CodeTask(
        name="max_of_list",
        statement="The first line holds n, the second n integers separated by spaces. Print the largest of them.",
        make_input=_list_input,
        solve=lambda text: f"{max(_ints(text)[1:])}\n",
        reference="n = int(input())\nvalues = list(map(int, input().split()))\nprint(max(values))\n",
        wrong="n = int(input())\nvalues = list(map(int, input().split()))\nprint(values[-1])\n",
        wrong_solve=lambda text: f"{_ints(text)[-1]}\n",
    ),
    CodeTask(
        name="sort_numbers",
        statement=(
            "The first line holds n, the second n integers separated by spaces. Print them in non-decreasing "
            "order on one line, separated by single spaces."
        ),
        make_input=_list_input,
        solve=lambda text: " ".join(map(str, sorted(_ints(text)[1:]))) + "\n",
        reference="input()\nprint(*sorted(map(int, input().split())))\n",
        wrong="input()\nprint(*sorted(input().split()))\n",  # sorts as strings
        wrong_solve=lambda text: " ".join(sorted(text.split("\n")[1].split())) + "\n",
    ),
    CodeTask(
        name="fizzbuzz",
        statement=(
            "Read an integer n and print the numbers 1 to n, one per line, but print Fizz for multiples of 3, "
            "Buzz for multiples of 5 and FizzBuzz for multiples of both."
        ),
        make_input=lambda rng: f"{rng.randint(1, 40)}\n",
        solve=lambda text: _fizzbuzz(int(text)),
        reference=(
            "n = int(input())\nfor i in range(1, n + 1):\n"
            "    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)\n"
        ),
        wrong=(
            "n = int(input())\nfor i in range(1, n + 1):\n"
            "    print('Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else 'FizzBuzz' if i % 15 == 0 else i)\n"
        ),
        wrong_solve=lambda text: _fizzbuzz(int(text)).replace("FizzBuzz", "Fizz"),
    ),
    CodeTask(
        name="palindrome",
        statement="Read one word of lowercase letters. Print YES if it reads the same backwards, otherwise NO.",
        make_input=_palindrome_input,
        solve=lambda text: ("YES" if text.strip() == text.strip()[::-1] else "NO") + "\n",
        reference="s = input().strip()\nprint('YES' if s == s[::-1] else 'NO')\n",
        wrong="s = input().strip()\nprint('YES' if s[0] == s[-1] else 'NO')\n",
        wrong_solve=lambda text: ("YES" if text.strip()[0] == text.strip()[-1] else "NO") + "\n",
    ),
    CodeTask(
        name="gcd",
        statement="Read two positive integers a and b on one line and print their greatest common divisor.",
        make_input=lambda rng: (lambda g: f"{g * rng.randint(1, 500)} {g * rng.randint(1, 500)}\n")(rng.randint(1, 60)),
        solve=lambda text: f"{math.gcd(*_ints(text))}\n",
        reference="import math\na, b = map(int, input().split())\nprint(math.gcd(a, b))\n",
        wrong="a, b = map(int, input().split())\nprint(min(a, b))\n",
        wrong_solve=lambda text: f"{min(_ints(text))}\n",
    ),
    CodeTask(
        name="fibonacci",
        statement="Read an integer n (0 <= n <= 90) and print the n-th Fibonacci number, where F(0) = 0 and F(1) = 1.",
        make_input=lambda rng: f"{rng.randint(0, 90)}\n",
        solve=lambda text: f"{_fib(int(text))}\n",
        reference="n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)\n",
        wrong="n = int(input())\na, b = 1, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)\n",
        wrong_solve=lambda text: f"{_fib(int(text) + 1)}\n",
    ),
    CodeTask(
        name="count_primes",
        statement="Read an integer n (1 <= n <= 5000) and print how many prime numbers are at most n.",
        make_input=lambda rng: f"{rng.randint(1, 5000)}\n",
        solve=lambda text: f"{sum(_is_prime(k) for k in range(int(text) + 1))}\n",
        reference=(
            "n = int(input())\nsieve = [True] * (n + 1)\nsieve[0] = False\nif n >= 1:\n    sieve[1] = False\n"
            "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n"
            "        sieve[i * i :: i] = [False] * len(sieve[i * i :: i])\nprint(sum(sieve))\n"
        ),
        wrong="n = int(input())\nprint(sum(1 for k in range(2, n + 1) if k % 2 or k == 2))\n",  # counts odd numbers
        wrong_solve=lambda text: f"{sum(1 for k in range(2, int(text) + 1) if k % 2 or k == 2)}\n",
    ),
    CodeTask(
        name="word_count",
        statement="Read lines until the end of input and print the total number of words (separated by whitespace).",
        make_input=lambda rng: _lines_of_words(rng),
        solve=lambda text: f"{len(text.split())}\n",
        reference="import sys\nprint(len(sys.stdin.read().split()))\n",
        wrong="print(len(input().split()))\n",  # first line only
        wrong_solve=lambda text: f"{len(text.splitlines()[0].split())}\n",
    ),
)
TASKS_BY_NAME = {task.name: task for task in TASKS}


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def reference_solution(task_name: str) -> str:
    return TASKS_BY_NAME[task_name].reference


def wrong_solution(task_name: str) -> str:
    return TASKS_BY_NAME[task_name].wrong


def generate_rows(n: int, seed: int, cases_per_task: int = 5) -> list[dict]:
    """``n`` rows cycling through :data:`TASKS` in a seeded order; each row has ``cases_per_task`` cases,
    distinct inputs, and at least one case on which the task's wrong program fails."""
    if n < 0 or cases_per_task < 1:
        raise ValueError("n must be >= 0 and cases_per_task >= 1")
    rng = random.Random(seed)
    rows: list[dict] = []
    order: list[CodeTask] = []
    for _ in range(n):
        if not order:  # every task once per len(TASKS) rows, in a fresh seeded order each round
            order = list(TASKS)
            rng.shuffle(order)
        task = order.pop()
        inputs: list[str] = []
        for _ in range(1000):
            if len(inputs) == cases_per_task:
                break
            text = task.make_input(rng)
            if text in inputs:
                continue
            if len(inputs) == cases_per_task - 1 and all(task.wrong_solve(x) == task.solve(x) for x in inputs):
                if task.wrong_solve(text) == task.solve(text):
                    continue  # the last case must catch the wrong program
            inputs.append(text)
        if len(inputs) < cases_per_task:
            raise RuntimeError(f"could not generate {cases_per_task} distinct cases for {task.name}")
        rows.append(
            {
                "messages": {"role": "user", "content": task.statement},
                "test_cases": {"inputs": inputs, "outputs": [task.solve(text) for text in inputs]},
                "task": task.name,
            }
        )
    return rows


def write_code_dataset(path: str, n: int, seed: int, cases_per_task: int = 5) -> None:
    """Write :func:`generate_rows` ``(n, seed, cases_per_task)`` as jsonl to ``path``."""
    with open(path, "w", encoding="utf-8") as handle:
        for row in generate_rows(n, seed, cases_per_task):
            handle.write(json.dumps(row) + "\n")
