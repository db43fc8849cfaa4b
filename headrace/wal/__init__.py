"""The write-ahead log: backend contract, backends, and the framework WAL on top."""
