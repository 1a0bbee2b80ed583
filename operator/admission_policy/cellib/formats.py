"""Placeholder: being written."""
from __future__ import annotations

from .library import Library

LIBRARY = Library("formats", "ours")
