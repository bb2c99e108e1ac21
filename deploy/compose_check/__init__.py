"""``make compose-check``: the production stack, built and run for real on this machine.

The check builds the two images from the repository's Dockerfiles and runs
``docker-compose.yml`` with Debian's docker-compose on a Docker engine of its own
(``engine.py``), with stand-ins for the images Docker Hub would give (``standins/``) and
host networking on loopback (``docker-compose.check.yml``). It crawls a local origin's
images through ``inbound_images`` with three workers, stops and restarts them, takes the
stack down and up again, and checks at each step what operators rely on (``__main__.py``
lists the steps). Every container and the engine are gone when it ends, also on a failure
or an interrupt; images, the base file system and the build cache stay in the cache folder
for the next run.
"""
