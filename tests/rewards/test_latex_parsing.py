"""Two-stage (SLL, then LL) LaTeX parsing gives math-verify exactly the parses plain LL gives."""

import random
from concurrent.futures import ThreadPoolExecutor

from math_verify.parser import parse_latex_cached
from sympy import srepr

from rewards.latex_parsing import enable_two_stage_parsing, two_stage_parsing_enabled
from rewards.math import parse_math
from tests.rewards.test_math_verdicts import RESPONSE_ROWS, ROWS


def _corpus() -> list[str]:
    texts = {text for gold, answer, _, _ in ROWS for text in (gold, answer)}
    texts |= {gold for gold, *_ in RESPONSE_ROWS}
    rng = random.Random(0)
    shapes = ["\\frac{%d}{%d}", "%d\\sqrt{%d}", "(%d, -%d)", "[%d, %d)", "%dx^2+%d", "\\{%d, %d\\}", "x=%d, y=%d",
              "%d^{%d}", "\\sin(%d) + \\cos(%d)", "\\begin{pmatrix} %d \\\\ %d \\end{pmatrix}", "%d < x \\le %d",
              "\\log_{%d} %d", "%d!", "\\binom{%d}{%d}", "(%d, %d] \\cup [%d, \\infty)", "\\text{(%d)} %d", "%d,"]
    for shape in shapes:
        for _ in range(3):
            texts.add(shape % tuple(rng.randint(1, 99) for _ in range(shape.count("%d"))))
    return sorted(texts)


def _parses(texts: list[str]) -> list[str]:
    def run():
        out = []
        for text in texts:
            parse_latex_cached.cache_clear()  # math-verify caches parses by string
            out.append(repr([srepr(p) if not isinstance(p, str) else p for p in parse_math(text)]))
        return out

    # Off the main thread math-verify's 5 s timeouts are off: a loaded machine cannot turn a slow LL parse
    # into an empty one and fail the comparison.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


def test_two_stage_parsing_is_on_and_changes_no_parse():
    parse_math("\\boxed{1}")  # math-verify is loaded, and two-stage parsing turned on, at the first parse
    assert two_stage_parsing_enabled()
    texts = _corpus()
    assert len(texts) > 200
    two_stage = _parses(texts)
    enable_two_stage_parsing(False)
    try:
        plain_ll = _parses(texts)
    finally:
        enable_two_stage_parsing()
    assert [(t, a) for t, a, b in zip(texts, two_stage, plain_ll) if a != b] == []
