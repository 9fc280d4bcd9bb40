"""The Tool-protocol face of an inline tool spec (``tools: - name: ...`` in an agent file): its
name, description, parameters and trust as declared. The inline tool kinds (an agent as a
tool, a knowledge search) take it and add their ``execute``."""

from __future__ import annotations

from typing import Any

from shared.agent.spec import InlineTool

__all__ = ["InlineFace"]


class InlineFace:
    """What the spec declares, as the ``Tool`` protocol reads it; a kind overrides what it
    derives instead."""

    _spec: InlineTool

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def description(self) -> str:
        return self._spec.description

    @property
    def parameters(self) -> dict[str, Any]:
        return self._spec.parameters

    @property
    def read_only(self) -> bool:
        """As declared (N-5: the default is write; declare ``read_only: true`` so a guarded
        agent runs it without approval)."""
        return self._spec.read_only

    @property
    def internal(self) -> bool:
        return False
