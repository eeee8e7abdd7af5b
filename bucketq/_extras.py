"""Optional extras: which third-party modules each one brings, and the hint when one is missing.

``pip install bucketq`` is the engine, the CLI and the sidecar client; the sidecar server, the
operator and Spark support come with extras. A component whose extra is missing says so in one line
(the way httpx's CLI does) instead of failing later on a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib.util

# The top-level modules each extra of pyproject.toml installs (import names, not distribution names).
EXTRAS: dict[str, tuple[str, ...]] = {
    "sidecar": ("prometheus_client", "cloudevents"),
    "operator": ("kopf", "cryptography", "prometheus_client"),
    "spark": ("pyspark", "pyarrow"),
    "local": ("moto", "flask", "flask_cors"),  # moto[server]: its server is a flask app
}


class MissingExtra(ImportError):
    """A component was used without the optional extra that installs its dependencies."""

    def __init__(self, what: str, extra: str, module: str) -> None:
        super().__init__(install_hint(what, extra), name=module)
        self.extra = extra


def install_hint(what: str, extra: str) -> str:
    """The one-line message naming the extra ``what`` needs and how to install it."""
    return f"{what} needs the {extra} extra: pip install 'bucketq[{extra}]'"


def missing_module(extra: str) -> str | None:
    """The first module of ``extra`` that is not installed, or None when all are.

    ``find_spec`` looks the module up without importing it, so asking is cheap (the CLI asks for
    every optional command at start-up, and must not pay for importing kopf or pyspark).
    """
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def require(what: str, extra: str) -> None:
    """Raise :class:`MissingExtra` (an ``ImportError``) if ``extra`` is not installed."""
    module = missing_module(extra)
    if module is not None:
        raise MissingExtra(what, extra, module)
