"""Tuning: measure the schedule knobs of the heavy kernels and keep the best (see :mod:`.tuner`).

:mod:`.records` (the JSON-lines records and their folders), :mod:`.tasks` (what is tuned),
:mod:`.tuner` (the measuring loop), :mod:`.remote` (measuring on a board over TVM RPC).
"""

from __future__ import annotations

from .records import ARTIFACT_RECORDS, RecordSet, Records, default_records_dir, query_record, target_key

__all__ = ["ARTIFACT_RECORDS", "RecordSet", "Records", "default_records_dir", "query_record", "target_key"]
