"""PySpark jobs of the data pipeline (flush; compaction later).

They use Headrace's public client (:mod:`headrace.client`) to read WAL ranges
and :mod:`headrace.table` to write and commit Iceberg tables; ``headrace``
itself never imports pyspark. See ``docs/pipeline.md``.
"""
