"""Measure: a built variant loaded and called through its C table (`kernel`; the table and the
argument structs read from the family's ABI header, `abi`), checked against
the float64 reference on shared input sets (`cases`, `accuracy`) and timed with CUDA events
(`timing`) in a worker process per GPU that survives crashes and hangs (`worker`). The search's
side of it, live or replayed from a recording, is `tuner.search.evaluate`."""
