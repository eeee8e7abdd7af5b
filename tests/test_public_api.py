"""The public surface: each package's ``__all__`` and the names it actually exports agree.

Modelled on httpx's ``tests/test_exported_members.py``: a name added to a package without a place
in ``__all__`` (or left in ``__all__`` after it went away) fails here, not in a user's import.
"""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

import pytest

import bucketq
import bucketq.client
import bucketq.errors
import bucketq.storage

PACKAGES = [bucketq, bucketq.client, bucketq.errors, bucketq.storage]


def public_members(module: types.ModuleType) -> list[str]:
    """What ``dir()`` shows without underscores, submodules (attributes the import system sets on a
    package, not names it exports) and the names ``from __future__ import annotations`` leaves."""
    return sorted(
        name
        for name in dir(module)
        if not name.startswith("_")
        and not isinstance(getattr(module, name), types.ModuleType)
        and name != "annotations"
    )


@pytest.mark.parametrize("module", PACKAGES, ids=lambda m: m.__name__)
def test_every_name_in_all_exists(module: types.ModuleType) -> None:
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{module.__name__}.__all__ names what it does not define: {missing}"


@pytest.mark.parametrize("module", PACKAGES, ids=lambda m: m.__name__)
def test_all_is_sorted_without_duplicates(module: types.ModuleType) -> None:
    assert list(module.__all__) == sorted(set(module.__all__))


@pytest.mark.parametrize("module", PACKAGES, ids=lambda m: m.__name__)
def test_every_public_name_is_in_all(module: types.ModuleType) -> None:
    exported = set(module.__all__) - {"__version__"}
    assert public_members(module) == sorted(exported), (
        f"{module.__name__}: public names and __all__ differ; add the name to __all__ or import it "
        "from its defining module instead of the package"
    )


def test_every_error_a_caller_can_catch_is_exported_from_bucketq() -> None:
    errors = {
        name
        for name, obj in vars(bucketq.errors).items()
        if inspect.isclass(obj)
        and issubclass(obj, bucketq.errors.BucketqError)
        and obj.__module__ == "bucketq.errors"
    }
    assert errors, "bucketq.errors defines no BucketqError subclass?"
    assert errors <= set(bucketq.__all__), (
        f"not exported from bucketq: {sorted(errors - set(bucketq.__all__))}"
    )
    for name in errors:
        assert getattr(bucketq, name) is getattr(bucketq.errors, name)


def test_client_errors_are_bucketq_errors() -> None:
    client_errors = [
        obj
        for name in bucketq.client.__all__
        if inspect.isclass(obj := getattr(bucketq.client, name)) and issubclass(obj, Exception)
    ]
    assert bucketq.client.SidecarError is bucketq.SidecarError
    for cls in client_errors:
        assert issubclass(cls, bucketq.SidecarError), f"{cls.__name__} is not a SidecarError"
        assert issubclass(cls, bucketq.BucketqError)


def test_lazy_engine_names_match_their_type_checking_imports() -> None:
    """bucketq resolves engine names on first use (``_LAZY``); type checkers read the TYPE_CHECKING
    imports instead. Both must name the same classes in the same modules."""
    tree = ast.parse(Path(bucketq.__file__).read_text())
    seen: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "typing.TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module is not None
                seen.update({alias.name: imp.module for alias in imp.names})
    assert seen == bucketq._LAZY
    for name, module in bucketq._LAZY.items():
        assert getattr(bucketq, name).__module__ == module
