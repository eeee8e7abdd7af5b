"""The engine: the storage protocol of docs/design.md section 2 (independent of Kubernetes)."""
