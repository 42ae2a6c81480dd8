"""GGUF checkpoints as ``-m``: a ``.gguf`` file (llama.cpp's format, often quantized) is read once through
transformers' GGUF reader, dequantized to float32, and written into the cache as a plain HF directory
(safetensors, config, tokenizer with its chat template). Every actor and engine then reads that directory, as it
would any model, and none of them needs the ``gguf`` package.

The cache entry is named after the file and a fingerprint of its size and first bytes (the header and tensor
index, which differ between any two checkpoints), so a changed file converts again and an unchanged one is not
read twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os

from coati.utils.cache import build_once, default_cache_dir

SUFFIX = ".gguf"
MARKER = "gguf_source.json"  # written last into the converted directory: a half-built one is never used
_FINGERPRINT_BYTES = 16 << 20
GGUF_FILE_HELP = "with -m a directory of several .gguf files: the one to load (e.g. model.Q4_1.gguf)"


class GGUFError(ValueError):
    """One line: why a GGUF model cannot be used, and what to do."""


def gguf_file_of(path: str, gguf_file: str | None = None, flag: str = "-m/--model") -> str | None:
    """The GGUF file ``path`` names: itself when it is a ``.gguf`` file, the one in a directory that holds GGUF
    files and no HF ``config.json`` (``gguf_file`` picks among several), else None (not a GGUF model)."""
    if os.path.isfile(path) and path.endswith(SUFFIX):
        return path
    if not os.path.isdir(path) or (os.path.isfile(os.path.join(path, "config.json")) and gguf_file is None):
        return None
    found = sorted(name for name in os.listdir(path) if name.endswith(SUFFIX))
    if gguf_file is not None:
        name = os.path.basename(gguf_file)
        if name not in found:
            raise GGUFError(f"--gguf-file {gguf_file}: not in {path} (it holds {', '.join(found) or 'no .gguf file'})")
        return os.path.join(path, name)
    if len(found) > 1:
        raise GGUFError(f"{flag} {path} holds {len(found)} GGUF files ({', '.join(found)}): pick one with "
                        f"--gguf-file NAME, or pass the file itself as {flag}")
    return os.path.join(path, found[0]) if found else None


def fingerprint(gguf_path: str) -> str:
    digest = hashlib.sha256(str(os.path.getsize(gguf_path)).encode())
    with open(gguf_path, "rb") as handle:
        digest.update(handle.read(_FINGERPRINT_BYTES))
    return digest.hexdigest()[:12]


def converted_dir(gguf_path: str, cache_dir: str | None = None) -> str:
    """Where the HF directory of ``gguf_path`` is (or will be) cached."""
    stem = os.path.basename(gguf_path)[: -len(SUFFIX)]
    return os.path.join(cache_dir or default_cache_dir(), "gguf", f"{stem}-{fingerprint(gguf_path)}")


def hf_dir_from_gguf(gguf_path: str, cache_dir: str | None = None, log=print) -> str:
    """The cached HF directory of ``gguf_path``, converted first when missing (once per cache, under a lock)."""
    out = converted_dir(gguf_path, cache_dir)
    if not os.path.isfile(os.path.join(out, MARKER)):
        log(f"{gguf_path}: a GGUF file; converting it once into an HF directory (float32 safetensors) at {out}")
        build_once(out, MARKER, lambda staging: _convert(gguf_path, staging, out.rsplit("-", 1)[1]))
    return out


def _convert(gguf_path: str, out_dir: str, stamp: str) -> None:
    try:
        import gguf  # noqa: F401 - transformers' GGUF reader needs it; say so before it fails deep inside
    except ImportError:
        raise GGUFError(f"{gguf_path}: reading GGUF files needs the gguf package: pip install gguf") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # three bars over 272 tensors each; the start line says what happens

    directory, name = os.path.split(os.path.abspath(gguf_path))
    with _parsed_once():
        try:
            with _no_tqdm():  # the GGUF reader's own bar ignores transformers' switch
                tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
                model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
        except (ValueError, KeyError, RuntimeError) as err:  # an architecture or quantization transformers cannot read
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise GGUFError(f"{gguf_path}: transformers cannot read this GGUF file ({first}); convert it to an HF "
                            "directory another way and pass that directory") from None
        adds_bos = _gguf_adds_bos(gguf_path)
    # the weights are dequantized on load; what still marks the model GGUF-quantized would refuse the save and
    # make every later reader look for the .gguf file
    model.hf_quantizer = None
    for holder in (model.config, getattr(model, "generation_config", None)):
        if holder is not None and hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    model.save_pretrained(out_dir)
    if adds_bos and hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = True  # transformers' GGUF reader drops it; a base Gemma without BOS rambles
    tokenizer.save_pretrained(out_dir)
    with open(os.path.join(out_dir, MARKER), "w") as handle:
        json.dump({"gguf": os.path.abspath(gguf_path), "fingerprint": stamp,
                   "architecture": type(model).__name__}, handle, indent=1)


def _gguf_adds_bos(gguf_path: str) -> bool:
    """Whether the GGUF file's tokenizer starts every text with BOS (``tokenizer.ggml.add_bos_token``)."""
    from gguf import GGUFReader

    field = GGUFReader(gguf_path).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field is not None and field.data and field.parts[field.data[0]][0])


@contextlib.contextmanager
def _parsed_once():
    """While this lasts, each GGUF file is parsed once and each tensor-name map built once.

    transformers parses the file's header for the config, again for the tokenizer and again for the weights, and
    ``_gguf_adds_bos`` a fourth time; each parse reads the tokenizer's vocabulary and merges value by value. It
    also rebuilds gguf's tensor-name map for every module it visits. Both are pure functions of their arguments,
    and transformers imports them from ``gguf`` when it calls them, so memoized stand-ins on the module serve
    every caller (docs/results.md: the conversion's time)."""
    import gguf

    def memoized(original):
        memo: dict = {}

        def call(*args, **kwargs):
            # one file under any spelling of its path (transformers joins it, _gguf_adds_bos gets the user's)
            key = (tuple(os.path.abspath(a) if isinstance(a, str) and a.endswith(SUFFIX) else a for a in args),
                   tuple(sorted(kwargs.items())))
            if key not in memo:
                memo[key] = original(*args, **kwargs)
            return memo[key]
        return call

    originals = {"GGUFReader": gguf.GGUFReader, "get_tensor_name_map": gguf.get_tensor_name_map}
    for name, original in originals.items():
        setattr(gguf, name, memoized(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(gguf, name, original)


@contextlib.contextmanager
def _no_tqdm():
    """transformers' GGUF reader without its progress bar while this lasts (it ignores transformers' switch)."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as reader

    bar = reader.tqdm
    reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        reader.tqdm = bar
