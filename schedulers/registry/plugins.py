"""Schedulers from outside the repository: plugin files, importable modules and installed packages.

A config's `plugins:` lists Python files (relative to the config file, or absolute) or module
names; an installed package declares its schedulers in the entry-point group
`schedlab.schedulers` (`name = "pkg.module:MyScheduler"`, or a module). Every concrete
`Scheduler` subclass they define is registered under its `name` in the registry, beside the
built-ins, so config validation, the roles and analysis see it like one of them.

A plugin's code is part of the run's identity, so loading returns what identifies it
(`PluginInfo`: the file's sha256; for a module or package, its version and the hash of its
source files), which goes into the run id and meta.json. Every failure is one `PluginError`
line naming the plugin (and, for a file that does not import, the file and the line), so
the CLI prints it as a config error and exits 2 before anything is created.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as md
import importlib.util
import inspect
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from schedulers import registry
from schedulers.api import Scheduler

GROUP = "schedlab.schedulers"  # the entry-point group installed packages declare their schedulers in
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class PluginError(ValueError):
    """A plugin that cannot be used; its text is one line for the user."""


class PluginInfo(BaseModel):
    """One loaded plugin: what it is, what it registered, and what identifies its code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: str  # as the config wrote it (or `entry_point:<name>`)
    kind: Literal["file", "module", "entry_point"]
    names: tuple[str, ...]  # the schedulers it registered
    sha256: str  # of the file, or of the package's source files
    version: str | None = None  # the installed distribution's, for modules and entry points
    path: str | None = None  # the file (kind file), or the module's (where it has one)
    module: str | None = None  # what a role imports to load it again (module and entry_point kinds)

    def identity(self) -> dict[str, Any]:
        """What the run id and meta.json record (no path: a config has the same run ids on every machine)."""
        return {"spec": self.spec, "kind": self.kind, "sha256": self.sha256, "version": self.version}

    def role_spec(self, copied: str | None = None) -> str:
        """How a role loads it again: the file's copy in the run directory, or the module's name."""
        return copied or self.path if self.kind == "file" else self.module


_LOADED: dict[tuple[str, str], PluginInfo] = {}  # (kind, resolved path or module) -> what was loaded


def load_plugins(specs: list[str], base_dir: Path, where: str = "plugins") -> list[PluginInfo]:
    """Import each plugin and register its schedulers. A file loaded before, unchanged, is not
    imported again (its schedulers stay registered); a file that changed is imported again and
    replaces its own schedulers. Errors: PluginError, `<where>[i]: ...`, and then nothing of
    the list stays registered (the registry is as it was)."""
    saved = [(d, dict(d)) for d in (registry.SCHEDULERS, registry.SOURCES, registry.PLUGIN_SPECS, _LOADED)]
    out = []
    for i, spec in enumerate(specs):
        try:
            if not isinstance(spec, str) or not spec.strip():
                raise PluginError(f"must be a Python file or a module name, got {spec!r}")
            out.append(_load_one(spec, Path(base_dir)))
        except PluginError as e:
            for d, before in saved:
                d.clear()
                d.update(before)
            raise PluginError(f"{where}[{i}]: {e}") from None
    return out


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or not _MODULE.match(spec)


def _load_one(spec: str, base_dir: Path) -> PluginInfo:
    if _is_file(spec):
        path = Path(spec).expanduser()
        path = (path if path.is_absolute() else base_dir / path).resolve()
        if not path.is_file():
            raise PluginError(f"{spec}: no such file ({path})")
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        key = ("file", str(path))
        known = _LOADED.get(key)
        if known is not None and known.sha256 == sha:
            registry.PLUGIN_SPECS.update({n: spec for n in known.names})  # infos() name it as asked now
            return known.model_copy(update={"spec": spec})
        module = _import_file(spec, path, sha)
        info = PluginInfo(spec=spec, kind="file", names=(), sha256=sha, path=str(path))
    else:
        key = ("module", spec)
        known = _LOADED.get(key)
        if known is not None:
            return known
        module = _import_module(spec)
        sha, version, path = _package_identity(module)
        info = PluginInfo(spec=spec, kind="module", names=(), sha256=sha, version=version, path=path, module=spec)
    classes = _schedulers_of(module, spec)
    info = info.model_copy(update={"names": _register(classes, info)})
    _LOADED[key] = info
    return info


def _import_file(spec: str, path: Path, sha: str):
    """The file imported as a module of its own (named after its hash, so an edited file is a
    new module), without writing bytecode beside it: loading a plugin creates nothing."""
    name = f"schedlab_plugin_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}_{sha[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - whatever the file raises is the user's one line
        del sys.modules[name]
        raise PluginError(f"{spec}: {_where_it_failed(e, path)}") from None
    finally:
        sys.dont_write_bytecode = dont_write
    return module


def _where_it_failed(e: BaseException, path: Path) -> str:
    """`FILE:LINE: Type: message`: for a SyntaxError its own line, else the last frame in the file."""
    if isinstance(e, SyntaxError) and e.filename and Path(e.filename).resolve() == path:
        return f"{path}:{e.lineno}: SyntaxError: {e.msg}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path]
    line = f":{frames[-1].lineno}" if frames else ""
    text = " ".join(str(e).split())
    return f"{path}{line}: {type(e).__name__}" + (f": {text}" if text else "")


def _import_module(spec: str):
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name is not None and (spec == e.name or spec.startswith(e.name + ".")):
            raise PluginError(f"{spec}: no such module (not a file ending in .py, and not importable)") from None
        raise PluginError(f"{spec}: {_module_failure(e)}") from None
    except Exception as e:  # noqa: BLE001
        raise PluginError(f"{spec}: {_module_failure(e)}") from None


def _module_failure(e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        return f"{e.filename}:{e.lineno}: SyntaxError: {e.msg}"
    frames = traceback.extract_tb(e.__traceback__)
    last = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
    return f"{last}{type(e).__name__}: {' '.join(str(e).split())}"


def _package_identity(module) -> tuple[str, str | None, str | None]:
    """(sha256 of its source files, its distribution's version or None, its file): a package's
    every .py file under its directories, by relative path, so any edit changes the hash."""
    top = module.__name__.split(".")[0]
    top_module = sys.modules.get(top, module)
    roots = [Path(p) for p in getattr(top_module, "__path__", [])]
    files = sorted((f.relative_to(r), f) for r in roots for f in r.rglob("*.py") if "__pycache__" not in f.parts)
    if not files and getattr(top_module, "__file__", None):
        files = [(Path(Path(top_module.__file__).name), Path(top_module.__file__))]
    h = hashlib.sha256()
    for rel, f in files:
        h.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
    version = None
    for dist in md.packages_distributions().get(top, []):
        try:
            version = md.version(dist)
            break
        except md.PackageNotFoundError:
            continue
    return h.hexdigest(), version, getattr(module, "__file__", None)


def _schedulers_of(module, spec: str) -> list[type[Scheduler]]:
    """The concrete Scheduler subclasses the module (or its package's submodules) defines."""
    name = module.__name__
    found = [v for v in vars(module).values()
             if inspect.isclass(v) and issubclass(v, Scheduler) and not inspect.isabstract(v)
             and (v.__module__ == name or v.__module__.startswith(name + "."))]
    if not found:
        raise PluginError(f"{spec}: defines no Scheduler subclass (from schedulers.api import Scheduler; "
                          f"subclass it, with a `name` and start, push, wait, close)")
    return list(dict.fromkeys(found))


def _register(classes: list[type[Scheduler]], info: PluginInfo) -> tuple[str, ...]:
    """Register the classes under their names: checked first, all or none, so a failing plugin
    leaves the registry as it was. A name may replace only what the same plugin registered."""
    source = info.path if info.kind == "file" else info.spec
    names: dict[str, type[Scheduler]] = {}
    for cls in classes:
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
            raise PluginError(f"{info.spec}: class {cls.__name__} needs a `name` (letters, digits, _ . -), "
                              f"got {name!r}")
        if name in names:
            raise PluginError(f"{info.spec}: classes {names[name].__name__} and {cls.__name__} are both named {name!r}")
        other = registry.SCHEDULERS.get(name)
        if other is not None and registry.SOURCES.get(name) != source:
            theirs = registry.SOURCES.get(name)
            what = f"the built-in scheduler {name!r}" if theirs is None else f"scheduler {name!r} of plugin {theirs}"
            raise PluginError(f"{info.spec}: scheduler {name!r} (class {cls.__name__}) clashes with {what} "
                              f"({other.__module__}.{other.__qualname__}); rename it")
        try:
            cls.describe()
        except AttributeError as e:
            raise PluginError(f"{info.spec}: class {cls.__name__} does not declare {e.name or e} (family, "
                              f"bound_model and display_order are required)") from None
        except ValidationError as e:
            err = e.errors()[0]
            raise PluginError(f"{info.spec}: class {cls.__name__}: {'.'.join(map(str, err['loc']))}: "
                              f"{err['msg']}") from None
        names[name] = cls
    for name in [n for n, s in registry.SOURCES.items() if s == source]:  # an edited file: its old ones go
        registry.SCHEDULERS.pop(name, None)
        registry.SOURCES.pop(name, None)
        registry.PLUGIN_SPECS.pop(name, None)
    for name, cls in names.items():
        registry.SCHEDULERS[name] = cls
        registry.SOURCES[name] = source
        registry.PLUGIN_SPECS[name] = info.spec
    return tuple(names)


def load_entry_points(group: str = GROUP) -> list[PluginInfo]:
    """Register the schedulers of every installed package's `schedlab.schedulers` entry point
    (`name = "pkg.module:Class"` or `"pkg.module"`); each is one plugin, spec `entry_point:<name>`."""
    out = []
    for ep in sorted(md.entry_points(group=group), key=lambda e: e.name):
        spec = f"entry_point:{ep.name}"
        key = ("entry_point", f"{ep.name}={ep.value}")
        if key in _LOADED:
            out.append(_LOADED[key])
            continue
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001
            raise PluginError(f"{spec} ({ep.value}): {_module_failure(e)}") from None
        module = sys.modules[ep.module]
        classes = [obj] if inspect.isclass(obj) and issubclass(obj, Scheduler) else _schedulers_of(obj, spec)
        sha, version, path = _package_identity(module)
        dist = getattr(ep, "dist", None)
        version = getattr(dist, "version", None) or version
        info = PluginInfo(spec=spec, kind="entry_point", names=(), sha256=sha, version=version, path=path,
                          module=ep.module)
        info = info.model_copy(update={"names": _register(classes, info)})
        _LOADED[key] = info
        out.append(info)
    return out


def loaded() -> list[PluginInfo]:
    """Every plugin loaded in this process so far."""
    return list(_LOADED.values())
