"""Deploying artifacts outside Python: :mod:`.capi` builds the C runtime (``libforgekit_runtime.so`` and
``forgekit-run``, sources in ``runtime/``) for this machine."""
