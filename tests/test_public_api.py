"""The public surface: each package's ``__all__`` and the names it actually exports agree.

Modelled on httpx's ``tests/test_exported_members.py``: a name added to a package without a place
in ``__all__`` (or left in ``__all__`` after it went away) fails here, not in a user's import.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
import types
from pathlib import Path

import pytest

import bucketq
import bucketq.client
import bucketq.client.errors
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


def _drawn_error_tree() -> dict[str, tuple[str | None, set[str]]]:
    """The tree in :mod:`bucketq.errors`' docstring: qualified class name -> (drawn parent, the
    further bases its ``(also X)`` names). The classes drawn under ``SidecarError`` are the client's
    (:mod:`bucketq.client.errors`); ``X`` is a builtin or an engine class."""
    doc = bucketq.errors.__doc__ or ""
    lines = [line for line in doc.splitlines() if line.strip().startswith(("BucketqError", "├", "└", "│"))]
    assert lines and lines[0].strip() == "BucketqError", "no tree drawn in bucketq.errors"
    root = "bucketq.errors.BucketqError"
    tree: dict[str, tuple[str | None, set[str]]] = {root: (None, set())}
    stack: list[tuple[int, str]] = [(-1, root)]
    for line in lines[1:]:
        match = re.match(
            r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)\s*(?:\(also (?P<also>[\w., ]+)\))?", line.strip("\n")
        )
        assert match, f"cannot read this line of the drawn error tree: {line!r}"
        depth = len(match["indent"])
        while stack[-1][0] >= depth:
            stack.pop()
        parent = stack[-1][1]
        in_client = parent == "bucketq.errors.SidecarError" or parent.startswith("bucketq.client.")
        name = f"{'bucketq.client.errors' if in_client else 'bucketq.errors'}.{match['name']}"
        also = {
            f"builtins.{base}"
            if hasattr(builtins, base)
            else f"bucketq.errors.{base.removeprefix('bucketq.')}"
            for base in (match["also"] or "").replace(" ", "").split(",")
            if base
        }
        tree[name] = (parent, also)
        stack.append((depth, name))
    return tree


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_the_error_tree_drawn_in_errors_is_the_class_tree() -> None:
    """Every error class of the engine and the client is drawn in ``bucketq.errors``' docstring,
    under its first base, with its further bases as ``(also X)``; nothing is drawn that is not so."""
    drawn = _drawn_error_tree()
    classes = {
        _qualified(obj): obj
        for module in (bucketq.errors, bucketq.client.errors)
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, bucketq.errors.BucketqError)
    }
    assert sorted(drawn) == sorted(classes), "the drawn tree and the error classes differ"
    for name, (parent, also) in drawn.items():
        bases = [_qualified(b) for b in classes[name].__bases__]
        expected = ([parent] if parent else ["builtins.Exception"]) + sorted(also)
        assert bases[0] == expected[0], f"{name}: first base {bases[0]}, drawn under {parent}"
        assert sorted(bases[1:]) == sorted(expected[1:]), f"{name}: further bases {bases[1:]}, drawn {also}"


UNKNOWN_TOPIC = b'{"error": "topic_not_found", "message": "unknown topic \'orders\': create it first"}'


@pytest.mark.parametrize(
    ("status", "body", "engine_error"),
    [
        (409, b'{"error": "lease_lost", "message": "stale"}', bucketq.LeaseLost),
        (404, UNKNOWN_TOPIC, bucketq.TopicNotFound),
        (400, b'{"error": "invalid_message", "message": "bad"}', bucketq.InvalidArgument),
        (413, b'{"error": "message_too_large", "message": "big"}', bucketq.InvalidArgument),
        (400, b'{"error": "invalid_message", "message": "bad"}', ValueError),
    ],
)
def test_one_except_catches_the_engine_and_the_sidecar_error(
    status: int, body: bytes, engine_error: type[Exception]
) -> None:
    """An app that catches the engine's class catches the sidecar's answer for the same condition."""
    error = bucketq.client.errors.error_for(status, body, {})
    assert isinstance(error, bucketq.SidecarError)
    with pytest.raises(engine_error):
        raise error


def test_client_errors_carry_the_engine_errors_fields() -> None:
    missing = bucketq.client.errors.error_for(404, UNKNOWN_TOPIC, {})
    assert isinstance(missing, bucketq.TopicNotFound) and missing.topic == "orders"
    assert str(missing) == "404 topic_not_found: unknown topic 'orders': create it first"
    lost = bucketq.client.errors.error_for(409, b'{"error": "lease_lost", "message": "stale"}', {})
    assert isinstance(lost, bucketq.LeaseLost)
    assert (lost.status, lost.code, lost.reason, lost.position) == (409, "lease_lost", "stale", None)
    assert str(lost) == "409 lease_lost: stale"


def test_bad_arguments_are_value_errors_and_bucketq_errors() -> None:
    for cls in (
        bucketq.InvalidArgument,
        bucketq.InvalidName,
        bucketq.InvalidMessage,
        bucketq.MessageTooLarge,
    ):
        assert issubclass(cls, ValueError) and issubclass(cls, bucketq.InvalidArgument)
    assert issubclass(bucketq.InvalidReceipt, bucketq.InvalidArgument)


def _public_callables() -> list[tuple[str, object]]:
    """Every public function, and every public method of a public class, of bucketq and its client."""
    out: list[tuple[str, object]] = []
    for module in (bucketq, bucketq.client):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                out.append((f"{module.__name__}.{name}", obj))
            elif inspect.isclass(obj) and not issubclass(obj, BaseException):
                for attr, member in vars(obj).items():
                    func = member.__func__ if isinstance(member, classmethod | staticmethod) else member
                    if inspect.isfunction(func) and not attr.startswith("_"):
                        out.append((f"{module.__name__}.{name}.{attr}", func))
    return out


def test_public_methods_take_named_parameters() -> None:
    """No public method hides its parameters in ``*args``/``**kwargs: Any``: every parameter has a
    name, a type and (with the docstring) documentation an IDE shows. A ``**kwargs`` is allowed only
    typed field by field (``Unpack[SomeTypedDict]``)."""
    callables = _public_callables()
    assert len(callables) > 50, "found too few public methods: is the walk broken?"
    # Settings.load takes Settings' fields from mappings its callers compute (the CLI's flags, a
    # Spark job's options), which a typed **kwargs would refuse; Bucketq.from_env is the typed way.
    allowed = {"bucketq.Settings.load"}
    loose = [
        f"{where}({param})"
        for where, func in callables
        if where not in allowed
        for param in inspect.signature(func).parameters.values()  # type: ignore[arg-type]
        if param.kind is param.VAR_POSITIONAL
        or (param.kind is param.VAR_KEYWORD and not str(param.annotation).startswith("Unpack["))
    ]
    assert not loose, f"parameters without a name or type: {loose}"


@pytest.mark.parametrize(
    ("typed", "model"),
    [
        ("ProducerOverrides", "ProducerSettings"),
        ("ConsumerOverrides", "ConsumerSettings"),
        ("ConsumerTuning", "ConsumerSettings"),
        ("SettingsOverrides", "Settings"),
    ],
)
def test_override_keywords_name_exactly_the_settings_fields(typed: str, model: str) -> None:
    import bucketq.config

    keys = set(getattr(bucketq.config, typed).__annotations__)
    if typed == "ConsumerTuning":  # register_consumer's start_position is a parameter of its own
        keys.add("start_position")
    assert sorted(keys) == sorted(getattr(bucketq.config, model).model_fields)


def test_producer_overrides_are_register_producers_keywords() -> None:
    import bucketq.config

    params = inspect.signature(bucketq.Bucketq.register_producer).parameters
    assert sorted(p for p in params if params[p].kind is inspect.Parameter.KEYWORD_ONLY) == sorted(
        bucketq.config.ProducerOverrides.__annotations__
    )


def test_publish_methods_take_every_publish_option() -> None:
    """Every publish method takes the options as ``options=`` or as keyword arguments typed by
    PublishFields, whose keys are PublishOptions' fields: an option is added in one place and every
    way to publish has it."""
    import dataclasses

    from bucketq.publish_options import PublishFields

    fields = {f.name for f in dataclasses.fields(bucketq.PublishOptions)}
    assert set(PublishFields.__annotations__) == fields
    for func in (
        bucketq.Bucketq.publish,
        bucketq.Producer.publish,
        bucketq.client.Client.publish,
        bucketq.client.AsyncClient.publish,
        bucketq.client.message,
    ):
        params = inspect.signature(func).parameters
        assert params["options"].kind is inspect.Parameter.KEYWORD_ONLY, func.__qualname__
        assert params["data"].kind is inspect.Parameter.KEYWORD_ONLY, func.__qualname__
        (var_keyword,) = [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        assert var_keyword.annotation == "Unpack[PublishFields]", func.__qualname__
