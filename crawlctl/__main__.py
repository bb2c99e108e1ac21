"""``python -m crawlctl``: the ``image-crawler`` command, where the script is not on PATH."""

from crawlctl.cli import main

main()
