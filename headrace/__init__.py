"""Headrace: a write-ahead-log streaming service for data systems."""

__version__ = "0.1.0"
