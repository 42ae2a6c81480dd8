"""For tools that still call setup.py (``python setup.py --version``, ``pip install -e .`` with old pips).

Every piece of metadata (name, version, dependencies, the ``coati`` console script) lives in pyproject.toml;
setuptools reads it from there when ``setup()`` is called with no arguments.
"""

from setuptools import setup

setup()
