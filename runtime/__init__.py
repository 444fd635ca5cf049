"""Runtime pieces of a gateway process that the layers above share; none reads the database or serves a route:
the process's counters and latency histograms (`metrics.py`), the loading cache (`cache.py`), one operation per key at a time
(`flight.py`), the batched access log (`accesslog.py`) /metrics gathered from every worker (`scrape.py`), and the process's one mutable state: the settings and
prices a reload replaces, the drain's flags (`state.py`)."""
