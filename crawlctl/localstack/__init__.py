"""A whole crawl on one machine, for ``image-crawler up`` and ``demo``: ``stack`` is the
crawl (``LocalStack``), ``services`` the broker and redis-server it runs beside the
crawler, ``processes`` the child processes all of them are."""
