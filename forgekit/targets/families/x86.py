"""x86-64 Linux: native on an x86-64 machine, cross-linked elsewhere."""

from .base import GnuFamily

family = GnuFamily("x86-64 Linux", "x86_64", "x86_64-linux-gnu-g++", "g++-x86-64-linux-gnu", image=None)
