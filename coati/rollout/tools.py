"""Tools the model may call mid-answer: plain typed Python functions with a docstring, and the built-in
sandboxed Python tool.

A tool is any function whose parameters all carry a type annotation (str, int, float, bool, list, dict) and
whose docstring says what it does; ``tool_schema`` derives the JSON schema the model is shown from the
signature (required = parameters without a default) and the docstring (the first paragraph is the
description; lines ``name: text`` under ``Args:`` describe the parameters). ``Toolbox`` checks every tool
once at start-up and then runs calls given as JSON text, turning every failure (bad JSON, unknown tool, wrong
arguments, the tool raising) into an error string the model sees instead of an exception.
"""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass
from typing import Callable

JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class ToolError(ValueError):
    """A tool that cannot be offered (no docstring, an unannotated parameter); raised at start-up."""


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google-style docstring."""
    description = doc.split("\n\n")[0].strip().replace("\n", " ")
    params, in_args = {}, False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
        elif in_args and ":" in stripped:
            name, text = stripped.split(":", 1)
            params[name.split("(")[0].strip()] = text.strip()
        elif in_args and not stripped:
            in_args = False
    return description, params


def tool_schema(fn: Callable) -> dict:
    """The JSON schema of tool ``fn`` (OpenAI function-calling shape); ToolError names what is missing."""
    name = getattr(fn, "__name__", repr(fn))
    doc = inspect.getdoc(fn)
    if not doc:
        raise ToolError(f"tool {name!r} has no docstring: add one saying what it does (the model reads it)")
    description, described = _docstring_parts(doc)
    properties, required = {}, []
    for param in inspect.signature(fn).parameters.values():
        annotation = param.annotation
        if isinstance(annotation, str):  # from __future__ import annotations
            annotation = {t.__name__: t for t in JSON_TYPES}.get(annotation, annotation)
        if annotation not in JSON_TYPES:
            raise ToolError(f"tool {name!r}: parameter {param.name!r} needs a type annotation, one of "
                            f"{', '.join(t.__name__ for t in JSON_TYPES)}")
        properties[param.name] = {"type": JSON_TYPES[annotation]}
        if param.name in described:
            properties[param.name]["description"] = described[param.name]
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


@dataclass
class ToolResult:
    text: str  # what the model sees
    error: bool = False  # the call failed (bad call, the tool raised, timed out)
    timeout: bool = False
    seconds: float = 0.0


def _argument_problem(schema: dict, arguments) -> str | None:
    if not isinstance(arguments, dict):
        return "arguments must be a JSON object"
    params = schema["function"]["parameters"]
    missing = [n for n in params["required"] if n not in arguments]
    if missing:
        return f"missing argument(s) {', '.join(missing)}"
    for key, value in arguments.items():
        if key not in params["properties"]:
            return f"unknown argument {key!r}"
        wanted = params["properties"][key]["type"]
        python_type = next(t for t, j in JSON_TYPES.items() if j == wanted)
        ok = isinstance(value, python_type) and not (python_type is int and isinstance(value, bool))
        if python_type is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            return f"argument {key!r} must be of JSON type {wanted}"
    return None


class Toolbox:
    """Named tools, their schemas, and calls from JSON text ``{"name": ..., "arguments": {...}}``."""

    def __init__(self, tools: list[Callable]):
        self.tools = {getattr(fn, "__name__", repr(fn)): fn for fn in tools}
        self.schemas = {name: tool_schema(fn) for name, fn in self.tools.items()}

    def call(self, call_text: str) -> tuple[str | None, ToolResult]:
        """(tool name or None, result). Never raises for anything the model wrote."""
        start = time.perf_counter()
        try:
            call = json.loads(call_text)
        except json.JSONDecodeError as err:
            return None, ToolResult(f"error: the tool call is not valid JSON ({err.msg})", error=True)
        name = call.get("name") if isinstance(call, dict) else None
        if name not in self.tools:
            return None, ToolResult(f"error: unknown tool {name!r}; tools: {', '.join(self.tools)}", error=True)
        arguments = call.get("arguments", {})
        problem = _argument_problem(self.schemas[name], arguments)
        if problem:
            return name, ToolResult(f"error: {problem}", error=True)
        try:
            value = self.tools[name](**arguments)
        except Exception as err:  # the tool's failure is an observation for the model, not a crash of the run
            return name, ToolResult(f"error: {type(err).__name__}: {err}", error=True,
                                    seconds=time.perf_counter() - start)
        if isinstance(value, ToolResult):
            value.seconds = time.perf_counter() - start
            return name, value
        return name, ToolResult(value if isinstance(value, str) else json.dumps(value),
                                seconds=time.perf_counter() - start)
