"""Shared fixtures. S3 servers and opened storages live in ``servers.py``."""

from servers import file_storage, memory_storage, moto_server, s3_backend, seaweedfs_server

__all__ = ["file_storage", "memory_storage", "moto_server", "s3_backend", "seaweedfs_server"]
