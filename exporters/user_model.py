"""A user's own PyTorch model as a width-scalable model: load it, name it, derive its layout.

``--model`` takes, besides the zoo's names:

* ``path/to/file.py:factory``: a function (or class) in a Python file;
* ``package.module:factory``: one in an importable module;
* ``NAME``: a model a package registers under the ``fleetbench.models`` entry point group
  (``[project.entry-points."fleetbench.models"] NAME = "package.module:factory"``);
* ``factory@digest``: the name fleetbench gave a model before (see below).

The factory takes no argument (``num_classes`` is passed when ``--num-classes`` is given
and the factory accepts it) and returns a ``torch.nn.Module`` whose ``forward(x)`` maps a
batch of inputs to logits ``(N, classes)``. The input shape of one example, its dtype and
the number of classes come from attributes of the factory or of the module it returns
(``input_shape``, ``input_dtype``, ``num_classes``) or from the flags of the same names;
flags win, and ``num_classes`` defaults to the logits' width.

The model's **name** is ``<factory>@<digest>``: the digest hashes the definition (the
source file, the factory, the module's structure and parameter shapes, the sources of its
layer classes, and the options above), so a changed model is a new model and its cells are
never mixed with the old one's. The name, its source and options are written to a small
registry (``$FLEETBENCH_MODELS_DIR``, else ``~/.cache/fleetbench/models``), so that every
later command and every worker process resolves the name again; a name whose source has
changed since is refused.

BatchNorm layers are made static (batch statistics in training and evaluation, no running
statistics), as the zoo's are; the listing says which. The layout comes from
`exporters.layout_graph`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from exporters.manifest import sha256_file
from exporters.userinput import InputError

if TYPE_CHECKING:
    from exporters.zoo import ZooModel

#: Entry point group under which packages register models.
ENTRY_POINT_GROUP = "fleetbench.models"

#: Environment variable naming the registry directory.
REGISTRY_ENV = "FLEETBENCH_MODELS_DIR"

#: Input dtypes a model may take.
INPUT_DTYPES = ("float32", "int64")

#: Prefix of the module names under which model files are imported.
_FILE_MODULE_PREFIX = "fleetbench_user_"

_CANONICAL = re.compile(r"^(?P<factory>[A-Za-z_][A-Za-z0-9_.]*)@(?P<digest>[0-9a-f]{12})$")


@dataclass(frozen=True)
class ModelOptions:
    """What the command line says about a user's model (``None``: from the factory).

    Attributes
    ----------
    input_shape : tuple of int or None
        Shape of one example, without the batch dimension.
    input_dtype : str or None
        ``"float32"`` or ``"int64"``.
    num_classes : int or None
        Number of logits.
    unsliceable : str
        ``"refuse"`` or ``"keep"`` (see `exporters.layout_graph.derive_layout`).
    """

    input_shape: tuple[int, ...] | None = None
    input_dtype: str | None = None
    num_classes: int | None = None
    unsliceable: str = "refuse"


@dataclass(frozen=True)
class ModelSource:
    """Where a user's model is defined.

    Attributes
    ----------
    spec : str
        As given: ``file.py:factory``, ``package.module:factory`` or an entry point name.
    target : str
        What is imported: an absolute file path or a module name.
    factory : str
        Attribute of ``target`` that builds the model.
    """

    spec: str
    target: str
    factory: str

    @property
    def is_file(self) -> bool:
        """Whether `target` is a file path."""
        return self.target.endswith(".py")


def is_user_spec(spec: str) -> bool:
    """Return whether ``spec`` names a user's model rather than a zoo model.

    Parameters
    ----------
    spec : str

    Returns
    -------
    bool
        True for ``...:factory`` and ``factory@digest``; a plain name may still be an
        entry point (`parse_source`).
    """
    return ":" in spec or is_model_name(spec)


def registered_entry(name: str) -> importlib.metadata.EntryPoint | None:
    """Return the ``fleetbench.models`` entry point called ``name``, if a package registers one."""
    return next((e for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if e.name == name), None)


def is_model_name(spec: str) -> bool:
    """Return whether ``spec`` is a name fleetbench gave a user's model (``factory@digest``)."""
    return bool(_CANONICAL.match(spec))


def parse_source(spec: str) -> ModelSource:
    """Parse a ``--model`` value that is not a zoo name.

    Parameters
    ----------
    spec : str

    Returns
    -------
    ModelSource

    Raises
    ------
    InputError
        If the file does not exist, or no entry point has that name.
    """
    target, colon, factory = spec.rpartition(":")
    if colon:
        if not target or not factory.isidentifier():
            raise InputError(f"model {spec!r}: expected FILE.py:FACTORY or PACKAGE.MODULE:FACTORY")
        if target.endswith(".py"):
            path = Path(target).expanduser()
            if not path.is_file():
                raise InputError(f"model {spec!r}: no such file {path}")
            return ModelSource(spec, str(path.resolve()), factory)
        return ModelSource(spec, target, factory)
    entry = registered_entry(spec)
    if entry is not None:
        module, _, attr = entry.value.partition(":")
        return ModelSource(spec, module.strip(), attr.strip())
    raise InputError(
        f"unknown model {spec!r}: not a zoo model, not FILE.py:FACTORY or MODULE:FACTORY, "
        f"and no package registers it under the {ENTRY_POINT_GROUP!r} entry points"
    )


def _module_of(source: ModelSource) -> Any:
    if source.is_file:
        name = _FILE_MODULE_PREFIX + hashlib.sha256(source.target.encode()).hexdigest()[:12]
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, source.target)
        if spec is None or spec.loader is None:
            raise InputError(f"model {source.spec!r}: cannot load {source.target}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise InputError(f"model {source.spec!r}: {source.target} fails to import: {_one_line(exc)}") from exc
        return module
    try:
        return importlib.import_module(source.target)
    except ImportError as exc:
        raise InputError(f"model {source.spec!r}: cannot import {source.target}: {_one_line(exc)}") from exc


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def load_factory(source: ModelSource) -> Callable[..., Any]:
    """Import the factory a `ModelSource` names.

    Parameters
    ----------
    source : ModelSource

    Returns
    -------
    callable

    Raises
    ------
    InputError
        If the file or module fails to import, or has no such callable.
    """
    module = _module_of(source)
    factory = getattr(module, source.factory, None)
    if not callable(factory):
        raise InputError(f"model {source.spec!r}: {source.target} has no callable {source.factory!r}")
    return factory


def call_factory(factory: Callable[..., Any], source: ModelSource, num_classes: int | None) -> nn.Module:
    """Call a model factory and check that it returns a module.

    Parameters
    ----------
    factory : callable
    source : ModelSource
        For messages.
    num_classes : int or None
        Passed as ``num_classes=`` when given and the factory accepts it.

    Returns
    -------
    torch.nn.Module

    Raises
    ------
    InputError
        If the factory raises (with its message) or returns something else.
    """
    kwargs: dict[str, Any] = {}
    if num_classes is not None:
        try:
            if "num_classes" in inspect.signature(factory).parameters:
                kwargs["num_classes"] = num_classes
        except (TypeError, ValueError):
            pass
    try:
        module = factory(**kwargs)
    except Exception as exc:  # the user's code: any exception is their model's error
        raise InputError(f"model {source.spec!r}: the factory raised {_one_line(exc)}") from exc
    if not isinstance(module, nn.Module):
        raise InputError(f"model {source.spec!r}: the factory returned {type(module).__name__}, not a torch.nn.Module")
    return module


def _attribute(name: str, factory: Any, module: nn.Module) -> Any:
    for holder in (factory, module):
        value = getattr(holder, name, None)
        if value is not None and not callable(value):
            return value
    return None


@dataclass(frozen=True)
class InputSpec:
    """The input and output a user's model was resolved with.

    Attributes
    ----------
    input_shape : tuple of int
    input_dtype : str
    num_classes : int
    """

    input_shape: tuple[int, ...]
    input_dtype: str
    num_classes: int


def example_input(spec: InputSpec, batch: int) -> torch.Tensor:
    """Return a deterministic batch of the model's input (ids below ``num_classes`` for int64)."""
    gen = torch.Generator().manual_seed(0)
    if spec.input_dtype == "int64":
        return torch.randint(0, spec.num_classes, (batch, *spec.input_shape), generator=gen)
    return torch.randn((batch, *spec.input_shape), generator=gen)


def input_spec(factory: Any, module: nn.Module, source: ModelSource, options: ModelOptions) -> InputSpec:
    """Settle the input shape, dtype and classes, and check one forward pass.

    Parameters
    ----------
    factory : callable
    module : torch.nn.Module
    source : ModelSource
    options : ModelOptions

    Returns
    -------
    InputSpec

    Raises
    ------
    InputError
        If the shape is unknown or malformed, the forward pass fails on it (naming the
        shape), or the logits are not ``(N, classes)``.
    """
    shape = options.input_shape or _attribute("input_shape", factory, module)
    if shape is None:
        raise InputError(
            f"model {source.spec!r}: input shape unknown: give --input-shape C,H,W or an input_shape attribute"
        )
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise InputError(f"model {source.spec!r}: input_shape {shape!r} is not a sequence of integers") from None
    if not shape or any(s < 1 for s in shape):
        raise InputError(f"model {source.spec!r}: input_shape {shape} must be positive integers")
    dtype = options.input_dtype or _attribute("input_dtype", factory, module) or "float32"
    if dtype not in INPUT_DTYPES:
        raise InputError(f"model {source.spec!r}: input dtype {dtype!r} is not one of {', '.join(INPUT_DTYPES)}")
    classes = options.num_classes or _attribute("num_classes", factory, module)
    probe = InputSpec(shape, dtype, int(classes or 2))
    try:
        with torch.no_grad():
            out = module.eval()(example_input(probe, 2))
    except Exception as exc:  # the user's forward pass
        raise InputError(f"model {source.spec!r}: forward pass fails on input shape {shape}: {_one_line(exc)}") from exc
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise InputError(f"model {source.spec!r}: forward must return logits (N, classes), got {got} for batch 2")
    if classes is not None and int(classes) != out.shape[1]:
        raise InputError(f"model {source.spec!r}: num_classes {classes} but the model returns {out.shape[1]} logits")
    return InputSpec(shape, dtype, int(out.shape[1]))


def _file_digest(path: str | None) -> str:
    return sha256_file(Path(path)) if path and os.path.isfile(path) else ""


def definition_digest(source: ModelSource, module: nn.Module, spec: InputSpec, options: ModelOptions) -> str:
    """Return the sha256 of everything that defines a user's model.

    Parameters
    ----------
    source : ModelSource
    module : torch.nn.Module
        The full-width module the factory built.
    spec : InputSpec
    options : ModelOptions

    Returns
    -------
    str
        Hex digest over the factory's name, its file (or its module's file), the module's
        ``repr`` and parameter shapes, the files of its layer classes, the input spec and
        the unsliceable policy.
    """
    target_file = source.target if source.is_file else getattr(sys.modules.get(source.target), "__file__", None)
    # A file's classes live in a module named after the file's path: name them by the file's
    # content instead, so that the same file elsewhere is the same model.
    classes = sorted({f"{_module_label(type(m).__module__)}.{type(m).__qualname__}" for m in module.modules()})
    class_files = sorted(
        {_file_digest(inspect.getsourcefile(type(m)) if not _is_torch(type(m)) else None) for m in module.modules()}
        - {""}
    )
    document = {
        "factory": source.factory,
        "file": _file_digest(target_file),
        "module": repr(module),
        "parameters": [[n, list(p.shape)] for n, p in module.named_parameters()],
        "classes": classes,
        "class_files": class_files,
        "input": asdict(spec),
        "unsliceable": options.unsliceable,
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def _module_label(name: str) -> str:
    return "<file>" if name.startswith(_FILE_MODULE_PREFIX) else name


def _is_torch(cls: type) -> bool:
    return cls.__module__.split(".")[0] in ("torch", "builtins")


def registry_dir() -> Path:
    """Return the model registry directory (``$FLEETBENCH_MODELS_DIR``, else ``~/.cache/fleetbench/models``)."""
    override = os.environ.get(REGISTRY_ENV)
    return Path(override) if override else Path.home() / ".cache" / "fleetbench" / "models"


@dataclass(frozen=True)
class RegistryEntry:
    """What the registry keeps per named user model.

    Attributes
    ----------
    name : str
        ``factory@digest``.
    source : str
        The ``--model`` value it was resolved from (file paths made absolute).
    options : ModelOptions
    """

    name: str
    source: str
    options: ModelOptions


def write_entry(entry: RegistryEntry) -> Path:
    """Write a registry entry atomically and return its path."""
    directory = registry_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{entry.name}.json"
    document = {"name": entry.name, "source": entry.source, "options": asdict(entry.options)}
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{entry.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle, indent=1)
    os.replace(tmp, path)
    return path


def read_entry(name: str) -> RegistryEntry:
    """Read the registry entry of a model name.

    Raises
    ------
    InputError
        If no command has resolved that name on this host.
    """
    path = registry_dir() / f"{name}.json"
    try:
        document = json.loads(path.read_text())
        options = dict(document["options"])
        if options.get("input_shape") is not None:
            options["input_shape"] = tuple(options["input_shape"])
        return RegistryEntry(document["name"], document["source"], ModelOptions(**options))
    except FileNotFoundError:
        raise InputError(f"unknown model {name!r}: no registry entry {path} (give --model FILE.py:FACTORY)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a model registry entry ({_one_line(exc)})") from None


def canonical_source(source: ModelSource) -> str:
    """Return the ``--model`` value that resolves ``source`` from any directory."""
    if source.is_file:
        return f"{source.target}:{source.factory}"
    return source.spec


def resolve(spec: str, options: ModelOptions | None = None) -> tuple[str, ModelSource, ModelOptions]:
    """Resolve a ``--model`` value to its canonical name, source and options.

    Parameters
    ----------
    spec : str
        ``file.py:factory``, ``module:factory``, an entry point name or ``factory@digest``.
    options : ModelOptions, optional

    Returns
    -------
    name : str
        ``factory@digest``.
    source : ModelSource
    options : ModelOptions
    """
    if is_model_name(spec):
        entry = read_entry(spec)
        source = parse_source(entry.source)
        return spec, source, entry.options
    return "", parse_source(spec), options or ModelOptions()


#: User models resolved in this process, by canonical name.
_RESOLVED: dict[str, ZooModel] = {}


def user_model(spec: str, options: ModelOptions | None = None) -> ZooModel:
    """Resolve a user's model to a width-scalable `exporters.zoo.ZooModel`.

    The factory builds the full model, its BatchNorm layers are made static, the input
    is checked by one forward pass, the definition is hashed into the name, and the
    layout is derived by `exporters.layout_graph.derive_layout`. A width is built by
    calling the factory again and pruning it (`exporters.layout_graph.prune_to_sizes`),
    so its weights are the prefix of a fresh full-width model's.

    Parameters
    ----------
    spec : str
        A ``--model`` value (see the module docstring).
    options : ModelOptions, optional
        From the command line; a ``factory@digest`` name brings its own.

    Returns
    -------
    exporters.zoo.ZooModel
        Named ``factory@digest``; registered so that the name resolves again.

    Raises
    ------
    InputError
        On any of the failures the module docstring lists, in one line.
    """
    from exporters.layout_graph import derive_layout, make_static_batchnorm, prune_to_sizes
    from exporters.zoo import ZooModel

    if spec in _RESOLVED and options is None:
        return _RESOLVED[spec]
    name, source, options = resolve(spec, options)
    factory = load_factory(source)
    module = call_factory(factory, source, options.num_classes)
    static = make_static_batchnorm(module)
    spec_in = input_spec(factory, module, source, options)
    digest = definition_digest(source, module, spec_in, options)
    canonical = f"{source.factory}@{digest[:12]}"
    if name and name != canonical:
        raise InputError(
            f"model {name!r}: its definition {source.spec} has changed since (it is now {canonical}); "
            f"profile it again under the new name"
        )
    if canonical in _RESOLVED:
        return _RESOLVED[canonical]
    example = example_input(spec_in, 2)
    try:
        derived = derive_layout(module, example, unsliceable=options.unsliceable)
    except InputError as exc:
        raise InputError(f"model {source.spec!r}: {exc}") from exc

    def builder(group_sizes: Mapping[str, int]) -> nn.Module:
        net = call_factory(factory, source, options.num_classes)
        make_static_batchnorm(net)
        return prune_to_sizes(net, example, derived.groups, group_sizes)

    notes = list(derived.kept_full)
    if static:
        notes.append(f"BatchNorm trains on batch statistics, without running statistics: {len(static)} layers")
    model = ZooModel(
        name=canonical,
        paper=f"your model: {canonical_source(source)}",
        groups=tuple((g.name, g.size) for g in derived.groups),
        builder=builder,
        layouts=derived.layouts,
        input_shape=spec_in.input_shape,
        input_dtype=spec_in.input_dtype,
        num_classes=spec_in.num_classes,
        source=canonical_source(source),
        digest=digest,
        notes=tuple(notes),
    )
    if not name:
        write_entry(RegistryEntry(canonical, canonical_source(source), options))
    _RESOLVED[canonical] = model
    return model
