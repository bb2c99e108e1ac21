"""The fault campaign: the crawl on a local stack of real services, faults drawn from a
seed at random moments, an independent ledger of every uuid, and the checks of the
crawler's promises afterwards (``python -m chaos``, ``make chaos``; docs/guarantees.md)."""
