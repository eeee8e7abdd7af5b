"""The end-to-end tests share the chart helpers (tests/ship) and the operator's API emulator and
bounded waits (tests/operator): make both importable here."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for folder in (TESTS / "ship", TESTS / "operator"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
