"""Names of message properties with a meaning to the WAL.

Producers set them and the WAL's interceptors read them, so they live here,
below both.
"""

PRODUCER_ID = "producer_id"
"""The sending producer's id; with PRODUCER_SEQ, the message's deduplication key."""
PRODUCER_SEQ = "producer_seq"
"""The producer's sequence number of the message, a decimal integer."""
