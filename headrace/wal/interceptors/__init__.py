"""Append interceptors of the framework WAL: lock -> dedup -> txn -> timetick."""
