"""Where results go: thumbnails to S3 or a local folder, messages to Kafka, each behind
one narrow seam."""
