"""The base every process shares: the contract (topics, Redis keys, statuses, messages),
settings from the environment, JSON logs, the process lifecycle, retries and the Lua
loader. It imports nothing of ``worker``, ``crawl_monitor`` or ``crawlctl``."""
