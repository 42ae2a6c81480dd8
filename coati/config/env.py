"""Options of multi-turn episodes with an environment (``--env``); see docs/tools.md."""

from __future__ import annotations

from dataclasses import dataclass

from coati.utils.dataclass_cli import option

# --env names that, without --model, run the tool demo (coati/demo/tool_demo.py): its model and its task; the
# second is its control, whose tool always fails.
TOOL_DEMO_ENVS = ("tool_demo", "tool_demo_off")


@dataclass(frozen=True)
class EnvConfig:
    env: str | None = option(
        None, "multi-turn episodes with an environment: a registered name (python_tool, tool_demo, tool_demo_off) or "
              "path/to/env.py:ClassName (default: off, one completion per sample); without --model, tool_demo runs the "
              "tool demo (a tiny model learns to call a multiply tool) and tool_demo_off its control (the tool always "
              "fails)", flag="--env")
    max_turns: int = option(4, "model turns per episode at most (with --env)")
    max_tool_calls: int = option(4, "tool calls per episode at most; one more ends the episode uncalled (with --env)")
    max_episode_tokens: int = option(
        512, "response tokens per episode at most, tool output included (with --env); -mnt caps each turn")

    def problem(self) -> str | None:
        """One line naming a bad option and the fix, or None."""
        for name in ("max_turns", "max_episode_tokens"):
            if getattr(self, name) < 1:
                return f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}"
        if self.max_tool_calls < 0:
            return f"--max-tool-calls must be >= 0, got {self.max_tool_calls}"
        return None
