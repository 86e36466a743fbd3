"""aarch64 Linux (Raspberry Pi 3/4/5 64-bit, Jetson CPUs, Graviton): GNU cross toolchain."""

from .base import GnuFamily

family = GnuFamily("aarch64 Linux", "aarch64", "aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu", image="aarch64")
