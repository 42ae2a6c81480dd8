"""``-m`` as every command takes it: a local HF directory, a hub name ``ORG/NAME`` (its cached snapshot,
coati/utils/hub.py) or a GGUF file or directory (converted once into the cache, coati/utils/gguf.py), resolved
to the local HF directory that every model holder is handed."""

from __future__ import annotations

import os

from coati.utils.gguf import SUFFIX, GGUFError, gguf_file_of, hf_dir_from_gguf
from coati.utils.hub import HubError, resolve_model

# What a bad model name raises: catch these and print the message (one line).
MODEL_SOURCE_ERRORS = (HubError, GGUFError)


def local_model_dir(name: str, revision: str | None = None, flag: str = "-m/--model", gguf_file: str | None = None,
                    log=print) -> str:
    path = resolve_model(name, revision, flag)
    gguf = gguf_file_of(path, gguf_file, flag)
    if gguf is None:
        if gguf_file is not None:
            raise GGUFError(f"--gguf-file {gguf_file}: {flag} {name} is not a directory of GGUF files")
        return path
    out = hf_dir_from_gguf(gguf, log=log)
    log(f"{flag} {name}: GGUF, read from its HF directory {out} (float32, converted once)")
    return out


def model_display_name(name: str) -> str:
    """The name a run is called after: a GGUF file's without its suffix."""
    base = os.path.basename(os.path.normpath(name))
    return base[: -len(SUFFIX)] if base.endswith(SUFFIX) else base


def with_local_models(config, flags: dict[str, str], log=print):
    """``config`` (a frozen dataclass) with each model field named in ``flags`` (field -> its flag) resolved by
    ``local_model_dir``; a ``gguf_file`` field applies to ``model`` and is used up by it."""
    import dataclasses

    gguf_file = getattr(config, "gguf_file", None)
    changes = {name: local_model_dir(getattr(config, name), flag=flag, log=log,
                                     gguf_file=gguf_file if name == "model" else None)
               for name, flag in flags.items() if getattr(config, name, None)}
    if gguf_file is not None:
        changes["gguf_file"] = None
    return dataclasses.replace(config, **changes) if changes else config
