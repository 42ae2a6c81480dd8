"""The argument parser every ``coati`` command uses: one vocabulary of long flags across commands.

- A long flag takes both spellings: ``--input_key`` for ``--input-key`` and ``--master-port`` for
  ``--master_port`` (ColossalChat's scripts use underscores); ``--help`` lists each flag once.
- An unknown flag is one error line naming the closest one or two flags (``did you mean``), or, for a flag that
  another command spells this way with another meaning (``retired``), what to use here instead.
- ``given`` holds the destinations the last parse set from the command line, so a check can tell an option the
  user asked for from one left at its default (``-a GRPO --kl-reward-coef 0.05`` is refused even at the
  default value).
"""

from __future__ import annotations

import argparse
import difflib
import sys

UNDERSCORES_NOTE = "Every long flag may also be spelt with underscores (--input_key = --input-key)."


def closest(word: str, names) -> list[str]:
    """The name nearest ``word`` (``-`` and ``_`` alike), and a second one when it is nearly as near; [] when
    none is near."""
    canon = {name.replace("_", "-"): name for name in names}
    word = word.replace("_", "-")
    found = difflib.get_close_matches(word, list(canon), n=2, cutoff=0.6)
    ratios = [difflib.SequenceMatcher(None, word, name).ratio() for name in found]
    return [canon[name] for name, ratio in zip(found, ratios) if ratio >= ratios[0] - 0.05]


def suggestion(word: str, names, retired: dict[str, str] | None = None) -> str:
    """`` (did you mean X or Y?)`` / `` (here: ...)`` for an unknown ``word``, or ''."""
    if retired and word in retired:
        return f" ({retired[word]})"
    near = closest(word, names)
    return f" (did you mean {' or '.join(near)}?)" if near else ""


def _recording(base: type) -> type:
    """``base`` that also records its destination in the parser's ``given`` when its flag is on the line."""

    class Recorded(base):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            if isinstance(parser, FlagParser):
                parser.given.add(self.dest)

    Recorded.__name__ = f"Recorded{base.__name__}"
    return Recorded


RecordedBool = _recording(argparse.BooleanOptionalAction)


class _AppendOverDefault(argparse._AppendAction):
    """A repeatable flag whose first value on the line replaces its default (a command's own, e.g. a demo's
    ``--stop``, or ``--config``'s list), as every other flag's value does; the line's values then add up.
    argparse's own append adds to the default (and fails on a tuple one)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if isinstance(parser, FlagParser) and self.dest not in parser.given:
            setattr(namespace, self.dest, None)
        super().__call__(parser, namespace, values, option_string)


class FlagParser(argparse.ArgumentParser):
    def __init__(self, *args, retired: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.retired = dict(retired or {})  # flag -> what to use in this command instead
        self.given: set[str] = set()
        for name in (None, "store", "store_true", "store_false", "store_const"):
            self.register("action", name, _recording(self._registry_get("action", name)))
        self.register("action", "append", _recording(_AppendOverDefault))

    def spelling(self, token: str) -> str:
        """``token`` with its long flag in the spelling this parser knows (``--a_b`` <-> ``--a-b``)."""
        if not token.startswith("--") or token == "--":
            return token
        name, sep, value = token.partition("=")
        if name in self._option_string_actions:
            return token
        for other in ("--" + name[2:].replace("_", "-"), "--" + name[2:].replace("-", "_")):
            if other in self._option_string_actions:
                return other + sep + value
        return token

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        end = args.index("--") if "--" in args else len(args)
        args = [self.spelling(token) for token in args[:end]] + args[end:]
        for token in args[:end]:
            name = token.partition("=")[0]
            name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
            if name in self.retired:  # before argparse, which would read -tbs as -t with the value "bs"
                self.error(f"{name} is not a flag of {self.prog} ({self.retired[name]})")
        self.given = set()
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}" + self.hint(extras))
        return namespace

    def hint(self, extras: list[str]) -> str:
        """The "did you mean" of the first unknown flag among ``extras``."""
        flags = [token.partition("=")[0] for token in extras if token.startswith("-")]
        if not flags:
            return ""
        known = [flag for flag in self._option_string_actions if flag.startswith("--") or flag not in self.retired]
        return suggestion(flags[0], known, self.retired)
