"""Make the shared test helpers (tests/harness.py) importable as ``harness``."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
