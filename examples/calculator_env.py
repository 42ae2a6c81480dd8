"""An environment of your own: the model may call ``multiply`` while answering "a*b=" with \\boxed{product}.

Run with ``--env examples/calculator_env.py:CalculatorEnv``. The class is instantiated once per episode;
tools are plain functions with type annotations and a docstring (the model is shown the schema built from
them). ``score`` sees only what the model wrote in its final turn, never the tool's output.
"""

from coati.rollout.env import ToolEnv, boxed_answer


def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


class CalculatorEnv(ToolEnv):
    tools = [multiply]

    def score(self, row, text: str) -> float:
        answer = boxed_answer(text)
        return 1.0 if answer is not None and answer == str(row.label) else 0.0
