"""Fetching a URL: the only HTTP client of the sources, where it may connect, and how
many body bytes it may hold."""
