"""The artifact store: S3 key layout, the boto3-backed store, and a local MinIO server."""
