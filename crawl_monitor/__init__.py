"""The crawl monitor (``python -m crawl_monitor``): it splits ``inbound_images`` into
per-source queues and regulates the crawl through per-source rates in Redis and breakers.

- ``settings``: ``MonitorSettings.from_env()``
- ``policy.rates``: ``compute_crawl_rate``, overrides, Crawl-delays (pure)
- ``policy.adaptive``: the effective rate while a server pushes back (AIMD, pure)
- ``policy.breakers``: temporary and permanent halt decisions (pure)
- ``policy.decision``: one loop's decision: rates, pacing, breakers, writes (pure)
- ``sources``: the known sources, from ``SOURCES_FILE`` / ``SOURCES_URL``
- ``store``: the regulator's Redis reads and writes (one round trip each, ``lua/``)
- ``regulator``: the 1 s loop: read, decide, write; the leader lease
- ``backlog``: each source's backlog (consumer lag of the workers on ``urls.{source}``)
- ``monitoring``: the ``monitoring_update`` event
- ``metrics``: the Prometheus metrics and ``/healthz``'s problems
- ``splitter``: ``inbound_images`` -> ``urls.{source}``

``bench/regulator.py`` (beside the package) times the regulator's loop with many sources.
"""
