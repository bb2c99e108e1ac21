"""A URL list made a dataset (``image-crawler download``), in img2dataset's layout."""
