"""The image kernel (decode once, measure, thumbnail) and the pool of processes that
runs it off the event loop."""
