"""Two-stage parsing for math-verify's LaTeX parser (latex2sympy2_extended, an ANTLR grammar).

ANTLR's default LL prediction falls back to full-context analysis wherever the grammar is ambiguous over a
long look-ahead, as this grammar is between sets, intervals, tuples and products: about 25 ms for a fresh
``(523, 17)``. ANTLR documents its cheaper SLL prediction as returning either the same parse tree LL would or
a syntax error, so the standard two-stage scheme changes no result: parse with SLL, and only when that
raises, parse again from the start with LL. latex2sympy2's error listener raises on the first syntax error
(it never builds a tree from error recovery), so "SLL raised" is exactly "SLL reported a syntax error"; the
second stage starts from a fresh lexer, so a lexing error also ends as it did before.
``tests/rewards/test_latex_parsing.py`` checks both ways give the same sympy objects.
"""

from __future__ import annotations

from antlr4.atn.PredictionMode import PredictionMode
from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy

_create_parser = _Latex2Sympy.create_parser


def _create_two_stage_parser(self, latex_str):
    parser = _create_parser(self, latex_str)
    sll_math = parser.math  # the grammar's start rule, the only one latex2sympy2 calls

    def math():
        parser._interp.predictionMode = PredictionMode.SLL
        try:
            return sll_math()
        # math-verify's timeout is a BaseException and passes through
        except Exception:  # noqa: BLE001 - a syntax error under SLL: this input may need full LL
            return _create_parser(self, latex_str).math()  # a fresh lexer and parser, LL as before

    parser.math = math
    return parser


def enable_two_stage_parsing(enabled: bool = True) -> None:
    """Make math-verify's LaTeX parsing two-stage (idempotent); ``False`` restores plain LL."""
    _Latex2Sympy.create_parser = _create_two_stage_parser if enabled else _create_parser


def two_stage_parsing_enabled() -> bool:
    return _Latex2Sympy.create_parser is _create_two_stage_parser
