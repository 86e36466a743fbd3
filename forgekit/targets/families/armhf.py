"""32-bit ARMv7 hard-float Linux (Raspberry Pi OS 32-bit): GNU cross toolchain."""

from .base import GnuFamily

# No armv7 machine runs forgekit's compiler, so "armv7l" only matters for symmetry.
family = GnuFamily("ARMv7 hard-float Linux", "armv7l", "arm-linux-gnueabihf-g++", "g++-arm-linux-gnueabihf",
                   image="aarch64")
