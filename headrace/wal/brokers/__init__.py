"""The toolkit the broker backends (Kafka, Pulsar) share.

A broker backend writes through an exclusive producer that the broker itself
fences, and adds the term rule on top with a stamp on every record. All of
that is the same for every broker but for the client calls, so it lives here
once and each backend supplies only those calls:

* :mod:`.stamps` — the term stamp of a record and the fencing decisions (pure).
* :mod:`.contract` — what a backend implements: a :class:`~.contract.Link`
  (its exclusive producer and the look at the topic's end), a
  :class:`~.contract.Source` (its consumer) and a :class:`~.contract.Boundary`
  (its error translation).
* :mod:`.writer` — :class:`~.writer.BrokerWriter`: open, fence check, the
  reacquire loop and group commit over a link.
* :mod:`.reader` — :class:`~.reader.BrokerReader`: the reader lifecycle
  (thread, open, waiting at the tail, close) over a source.
* :mod:`.plumbing` — the backend's own plumbing: blocking calls at the error
  boundary, topics prepared lazily once per pchannel, writers and readers
  opened over the backend's links and sources and closed with it.
* :mod:`.registration` — registering a backend whose client library is
  imported only when a backend is created.
* :mod:`.settings` — checking the keyword settings and client options.
* :mod:`.testing` — the checks every link and source passes, run by each
  backend's tests in one line.

Nothing here imports a broker's client library or a backend package
(import-linter enforces it).
"""
