"""TI Jacinto 7 / Sitara AM6x boards: their Arm cores (what forgekit compiles for) and their TIDL accelerator.

The Arm side is an ordinary aarch64 Linux target (family ``arm``: Debian's ``aarch64-linux-gnu`` cross
toolchain links it, qemu runs it); every one of these cores is ARMv8.0-A (Cortex-A72 or A53), so no
dot-product kernels.  The accelerator side (C7x DSP + MMA, driven by TI's TIDL) is what
:mod:`forgekit.offload.tidl` plans for: each board names the platform/SOC string TI's tools take and the
operator differences TI documents per device.

Sources: TI's product pages and the device table of edgeai-tidl-tools
(``docs/supported_ops_rts_versions.md``, "Feature set comparison across devices").
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TiBoard:
    """One TI SoC family as forgekit knows it."""

    tag: str
    soc: str  # TI's SoC name(s)
    #: the SOC name edgeai-tidl-tools' scripts take (``SOC=am68a``); None: no TIDL accelerator
    tidl_soc: str | None
    #: the ``platform`` string of TI's TVM fork (``J7``, ``J721S2``, ...); None when it has none
    tvm_platform: str | None
    mcpu: str
    cores: int
    accelerator: str  # human words, "none" for Arm-only parts
    #: device differences TI documents, used by the TIDL planner (names in forgekit.offload.tidl_rules)
    lacks: frozenset[str] = field(default_factory=frozenset)

    @property
    def has_tidl(self) -> bool:
        return self.tidl_soc is not None

    @property
    def description(self) -> str:
        core = self.mcpu.replace("cortex-", "Cortex-").replace("a7", "A7").replace("a5", "A5")
        return f"TI {self.soc}: {self.cores}x {core}" + (f" + {self.accelerator}" if self.has_tidl else "")


# TDA4VM/AM68PA (the first Jacinto 7) has no asymmetric per-channel quantization; AM62A has no LUT
# activations, no DepthToSpace, no 16-bit deconvolution and no 3x3 stride-3 convolution; AM67A no
# DepthToSpace (TI's operator table, rows Conv, ConvTranspose, DepthToSpace, and the device table).
_TDA4VM_LACKS = frozenset({"asymmetric_per_channel"})
_AM62A_LACKS = frozenset({"lut_activations", "depth_to_space", "deconv_16bit", "conv_3x3_stride3"})

BOARDS: tuple[TiBoard, ...] = (
    TiBoard("ti/tda4vm", "TDA4VM (J721E)", "am68pa", "J7", "cortex-a72", 2, "C71x DSP + MMA (8 TOPS)", _TDA4VM_LACKS),
    TiBoard("ti/am68pa", "AM68PA (J721E)", "am68pa", "J7", "cortex-a72", 2, "C71x DSP + MMA (8 TOPS)", _TDA4VM_LACKS),
    TiBoard("ti/am68a", "AM68A (J721S2)", "am68a", "J721S2", "cortex-a72", 2, "2x C7x DSP + MMA (8 TOPS)"),
    TiBoard("ti/am69a", "AM69A (J784S4)", "am69a", "J784S4", "cortex-a72", 8, "4x C7x DSP + MMA (32 TOPS)"),
    TiBoard("ti/am62a", "AM62A", "am62a", "AM62A", "cortex-a53", 4, "C7x DSP + MMA (2 TOPS)", _AM62A_LACKS),
    TiBoard("ti/am67a", "AM67A (J722S)", "am67a", "J722S", "cortex-a53", 4, "2x C7x DSP + MMA (4 TOPS)",
            frozenset({"depth_to_space"})),
    TiBoard("ti/am62", "AM62", None, None, "cortex-a53", 4, "none"),
)

BY_TAG: dict[str, TiBoard] = {b.tag: b for b in BOARDS}


def board(tag: str) -> TiBoard | None:
    """The TI board a target tag names (``ti/am68a``), None for any other target."""
    return BY_TAG.get(tag)
