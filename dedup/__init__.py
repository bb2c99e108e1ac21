"""The deduplication stage (issue 54): every crawled image placed in a cluster of the same
photograph, across sources (dedup/placement.py), by an exact Hamming-radius index of its
perceptual hash (dedup/index.py)."""
