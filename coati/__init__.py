"""coati-rl. From Python: ``coati.build_config(**options)`` and ``coati.run(config)`` (coati/api.py), imported
on first use so that ``import coati`` stays light."""

__all__ = ["build_config", "run", "RunSummary"]


def __getattr__(name: str):
    if name in __all__:
        from coati import api

        return getattr(api, name)
    raise AttributeError(f"module 'coati' has no attribute {name!r}")
