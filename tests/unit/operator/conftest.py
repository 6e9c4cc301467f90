"""Makes ``optest`` (this directory's shared helpers) importable under --import-mode=importlib.

The directory has no ``__init__.py`` on purpose: a package named ``operator`` would shadow the
standard library's ``operator`` module for the whole test session.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
