"""Another object's attributes as keyword arguments: one record built from the same-named
fields of another (a catalog entry from a tool, bounded waits from the settings, a call's
arguments from a spec), instead of a ``name=source.name`` line per field."""

from __future__ import annotations

from typing import Any

__all__ = ["fields_of"]


def fields_of(source: object, *names: str, prefix: str = "") -> dict[str, Any]:
    """``{name: source.<prefix><name>}`` for each of ``names``, in their order (an attribute
    ``source`` lacks: ``AttributeError``)."""
    return {name: getattr(source, prefix + name) for name in names}
