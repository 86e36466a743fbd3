"""The contract of a CPU schedule rule (the counterpart of ``tvm.s_tir.dlight``'s ``ScheduleRule``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo


class ScheduleRule:
    """One kind of kernel and how to schedule it.

    ``matches`` inspects a fresh ``tvm.s_tir.Schedule`` of a fused PrimFunc and returns what ``apply`` needs
    (or None: not this rule's kernel); ``apply`` schedules it, optionally with tuning ``knobs`` from
    ``space`` (the default setting first; an empty space means the rule has nothing to tune).
    """

    #: the rule's name in compile reports and tuning records
    name: str = ""

    def matches(self, sch: Any, isa: IsaInfo) -> Any:
        raise NotImplementedError

    def apply(self, sch: Any, match: Any, isa: IsaInfo, knobs: dict[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def space(self, sch: Any, match: Any, isa: IsaInfo) -> list[dict[str, Any]]:
        return []
