"""The crawl's state as the operator sees it: ``image-crawler status``.

``read_status`` gathers every source's keys in one round trip (a Lua script: the set of
sources is itself in Redis, so a plain pipeline would need two) and ``status_table``
renders the result; ``parse_status`` between them is pure. ``model`` holds the state,
its read and the figures derived from it; ``terminal`` draws it as a table, ``json_view``
writes it as ``--json``; the command (``crawlctl/commands/status.py``) runs them.
"""
