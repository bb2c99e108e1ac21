"""The worker (``python -m worker``): takes URLs from the per-source queues, fetches each
in a slot of its source's pacing, thumbnails it and publishes its metadata.

- ``scheduler`` (consuming, fair shares from ``fair_share``, commits through ``offsets``)
- ``pipeline``: one URL from its queue to its results
- ``politeness/``: pacing, robots.txt, Retry-After, slow-answer signals
- ``download/``: the HTTP client of the sources and where it may connect
- ``images/``: the image kernel and the processes that run it
- ``sinks/``: thumbnails to S3 or a folder, messages to Kafka
- ``stats``: outcomes to Redis, as the monitor reads them
"""
