"""Model names from the Hugging Face hub: ``-m org/name`` becomes the local snapshot directory that
``huggingface_hub.snapshot_download`` keeps in its cache (HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN all
as huggingface_hub reads them), so every model holder is handed a plain local directory."""

from __future__ import annotations

import os
import re

HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
FILL_HINT = "fill the cache on a machine with a network (`hf download {name}` with the same HF_HOME), then copy it"


class HubError(ValueError):
    """One line: why the name is neither a local directory nor a model the hub (or its cache) gives."""


def is_hub_name(name: str) -> bool:
    """``org/name`` that is not a path on this machine."""
    return bool(HUB_NAME.match(name)) and not os.path.exists(name) and ".." not in name


def resolve_model(name: str, revision: str | None = None, flag: str = "-m/--model") -> str:
    """The local directory of ``name``: itself when it is not a hub name, else its snapshot in the cache
    (downloaded when missing and the hub is reachable)."""
    if not is_hub_name(name):
        return name
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{name}@{revision}" if revision else name
    try:
        return snapshot_download(name, revision=revision)
    except GatedRepoError:
        raise HubError(f"{flag} {at}: the hub model is gated; accept its terms on huggingface.co and set HF_TOKEN "
                       "(or `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise HubError(f"{flag} {at}: not a local directory, and the hub has no model {name} (a private one needs "
                       "HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise HubError(f"{flag} {at}: the hub model has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub cannot be reached"
        raise HubError(f"{flag} {at}: not a local directory, and not in the Hugging Face cache "
                       f"{constants.HF_HUB_CACHE} while {why}: {FILL_HINT.format(name=name)}, "
                       "or pass a local directory") from None
