"""The subcommands of ``image-crawler``, a module each (``controls`` holds the four that
change a source's state in Redis): what each does, and ``register``, which adds its
parser(s) to the command line with the ``run(args) -> int`` that carries it out."""
