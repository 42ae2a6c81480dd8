"""The project's cache directory and how a build lands in it: once, atomically, under a lock, so that runs (and
pytest-xdist workers) sharing one cache build a thing once and never see it half built. Torch-free."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile


def default_cache_dir() -> str:
    # An empty COATI_CACHE counts as unset (it would otherwise mean the current directory).
    return os.environ.get("COATI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coati")


def build_once(root: str, marker: str, build) -> None:
    """Runs ``build(dir)`` into a staging directory and renames it to ``root``, unless ``root/marker`` exists.
    A killed build never looks finished (the marker comes with the rename), and runs sharing one cache build it
    once: the others wait on the lock, then find it built."""
    if os.path.isfile(os.path.join(root, marker)):
        return
    parent = os.path.dirname(root)
    os.makedirs(parent, exist_ok=True)
    with open(os.path.join(parent, f".{os.path.basename(root)}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(os.path.join(root, marker)):
            return
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.building-", dir=parent)
        try:
            build(staging)
            shutil.rmtree(root, ignore_errors=True)  # an unfinished build has no marker
            os.replace(staging, root)  # atomic
        finally:
            shutil.rmtree(staging, ignore_errors=True)
