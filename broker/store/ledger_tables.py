"""The ledger's tables, one home for every module that reads or writes them: the append-only
entries (broker/ledger.py writes them) and their per-day sums (revision 0011; written at
each commit by broker/store/daily_sums.py; broker/store/reports.py reads both)."""

from __future__ import annotations

import sqlalchemy as sa

from broker.store.tables import LedgerDailyRow, LedgerEntryRow

ENTRIES: sa.Table = LedgerEntryRow.__table__  # type: ignore[attr-defined]
DAILY: sa.Table = LedgerDailyRow.__table__  # type: ignore[attr-defined]
