"""``image-crawler``, the operator's command: run a crawl on this machine, feed it,
watch it, steer it."""
