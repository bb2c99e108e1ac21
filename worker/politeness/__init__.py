"""What keeps the crawl polite: pacing (one schedule per source for the cluster),
robots.txt, Retry-After and slow answers."""
