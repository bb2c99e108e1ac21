"""``python -m image_crawler``: the ``image-crawler`` command, where the script is not on PATH."""

from crawlctl.cli import main

main()
