"""An artifact is a directory: ``model_library.so`` + ``metadata.json`` (+ optional files).

* :mod:`.layout` — the file names and how to find the library and metadata of a path (no dependencies:
  the deployed runtime uses it);
* :mod:`.outputs` — the gate every output directory passes, and atomic writes;
* :mod:`.metadata` — rendering ``metadata.json`` from its template;
* :mod:`.writer` — writing a compiled executable as an artifact;
* :mod:`.encryption` — encrypting, decrypting and re-keying an artifact directory.

This package's ``__init__`` imports nothing, so ``forgekit.artifact.layout`` stays cheap.
"""
