"""Messages: the model (:mod:`.types`), the envelope codec (:mod:`.codec`), message ids (:mod:`.ids`)."""
