"""Target families: how an artifact for a kind of machine is linked (one module per family).

Each module satisfies :class:`~forgekit.targets.families.base.Family`.  The registry is a plain dict;
``get_family`` lists the valid names when asked for an unknown one.
"""

from __future__ import annotations

from ...errors import TargetError
from . import android, arm, armhf, cuda, x86
from .base import Family, native

FAMILIES: dict[str, Family] = {
    "x86": x86.family,
    "arm": arm.family,
    "armhf": armhf.family,
    "android": android,
    "other": native,
}
FAMILIES["cuda"] = cuda.CudaFamily(FAMILIES)


def get_family(name: str) -> Family:
    """Return the family module called ``name``."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise TargetError(f"Unknown target family '{name}'. Choose from: {', '.join(FAMILIES)}.") from None


__all__ = ["FAMILIES", "Family", "get_family"]
