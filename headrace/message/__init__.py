"""Messages: the model (:mod:`.types`), the envelope codec (:mod:`.codec`) and ids (:mod:`.ids`)."""
