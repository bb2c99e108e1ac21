"""``python -m image_crawler``: the ``image-crawler`` command, where the script is not on PATH."""

from image_crawler.cli import main

main()
