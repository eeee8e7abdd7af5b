"""The engine: the storage protocol of DESIGN.md section 2 (independent of Kubernetes)."""
