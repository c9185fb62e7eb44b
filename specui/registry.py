"""One small registry, used for algorithms, prompt sets and job kinds.

    PROMPT_SETS: Registry[PromptSet] = Registry("prompt set", modules=["specui.data.sets"])

    @PROMPT_SETS.register("demo")          # as a decorator ...
    def demo(split, limit): ...

    PROMPT_SETS.register("other", obj)     # ... or a call
    PROMPT_SETS["demo"]                    # SpecUIError naming the known ones when absent
    PROMPT_SETS.names(), list(PROMPT_SETS), "demo" in PROMPT_SETS

A name is registered once: a second registration is a ValueError, unless
``same(old, new)`` says it is the same thing again (a module imported under two
names).  Entries come from importing modules, found two ways, both imported on
first use of the registry (not at its creation, so a light process that never
asks pays nothing):

* ``modules``: the built-in ones, a list or a function giving it;
* ``env``: an environment variable holding more, comma-separated -- how a
  user's own package is found (``SPECUI_ALGORITHMS=my_pkg.my_algo``).  It is
  read again on every use, so a module added later is still imported once.

Torch-free, and importing nothing from SpecUI but the error type.

This module is SpecUI's one import by name (``importlib``): the modules a registry is told of,
and ``resolve("module:attr")``.  Everywhere else imports are plain statements a reader can
follow.  Why by name here: the modules come from a list and an environment variable, and an
algorithm's entry names its torch classes as strings so that registering the algorithms (every
``specui`` command, the job runner, the store's listings) does not import torch, about 1.5 s
of a 2-core machine's start-up.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, overload

from specui.errors import SpecUIError

T = TypeVar("T")
log = logging.getLogger(__name__)


class Registry(Generic[T]):
    def __init__(
        self,
        kind: str,
        *,
        modules: Iterable[str] | Callable[[], Iterable[str]] = (),
        env: str | None = None,
        skip_missing: bool = False,
        same: Callable[[T, T], bool] | None = None,
        describe: Callable[[T], str] | None = None,
    ) -> None:
        """``kind`` names an entry in messages ("algorithm", "job kind").
        ``skip_missing``: a module listed but not installed is skipped (else a SpecUIError).
        ``same(old, new)``: re-registering a name with an entry it accepts is allowed.
        ``describe(entry)``: where an entry comes from, for the duplicate message."""
        self.kind = kind
        self.env = env
        self.skip_missing = skip_missing
        self._modules = modules
        self._same = same or (lambda old, new: old is new)
        self._describe = describe or _where
        self._entries: dict[str, T] = {}
        self._imported: set[str] = set()
        self._loading = False

    # --- registering -----------------------------------------------------------------

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, obj: T) -> T: ...

    def register(self, name: str, obj: Any = None) -> Any:
        """Register ``obj`` as ``name``; without ``obj``, a decorator that does."""
        if obj is None:
            return lambda o: self.register(name, o)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        old = self._entries.get(name)
        if old is not None and not self._same(old, obj):
            raise ValueError(f"{self.kind} {name!r} is already registered ({self._describe(old)})")
        self._entries[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        """Forget ``name`` (a plug-in's tests clean up with this)."""
        self._entries.pop(name, None)

    # --- finding ----------------------------------------------------------------------

    def load(self, extra: Iterable[str] = ()) -> None:
        """Import every module that registers entries (built-in, ``$env``, ``extra``) not yet
        imported."""
        if self._loading:  # a module being imported asked the registry: it has what is there so far
            return
        modules = self._modules() if callable(self._modules) else self._modules
        from_env = (
            [m.strip() for m in os.environ.get(self.env, "").split(",") if m.strip()]
            if self.env
            else []
        )
        todo = [m for m in (*modules, *from_env, *extra) if m not in self._imported]
        if not todo:
            return
        self._loading = True
        try:
            for module in todo:
                self._import(module, from_env=module in from_env)
        finally:
            self._loading = False

    def _import(self, module: str, from_env: bool) -> None:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module and not module.startswith(f"{e.name}."):
                raise  # the module exists but imports something missing: a real error
            if not self.skip_missing:
                where = f" (listed in ${self.env})" if from_env else ""
                raise SpecUIError(f"cannot import {module!r}{where}: no such module") from None
            log.debug("%s module %s not found; skipped", self.kind, module)
        self._imported.add(module)

    def import_only(self, modules: Iterable[str]) -> None:
        """Import just ``modules`` (not the built-in and ``$env`` ones): a child process that
        needs one entry imports only the module registering it."""
        for module in modules:
            if module not in self._imported:
                self._import(module, from_env=False)

    def get(self, name: str, default: T | None = None, *, load: bool = True) -> T | None:
        """The entry or ``default``; ``load=False`` looks only at what is registered so far."""
        if load:
            self.load()
        return self._entries.get(name, default)

    def __getitem__(self, name: str) -> T:
        self.load()
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise SpecUIError(f"unknown {self.kind} {name!r}; known: {known}") from None

    lookup = __getitem__

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._entries

    def names(self, *, load: bool = True) -> list[str]:
        """Registered names, in the order they were registered (``load=False``: so far)."""
        if load:
            self.load()
        return list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        self.load()
        return list(self._entries.items())

    def values(self) -> list[T]:
        self.load()
        return list(self._entries.values())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"


def _where(obj: Any) -> str:
    qualname = getattr(obj, "__qualname__", None)  # functions and classes
    return f"by {obj.__module__}.{qualname}" if qualname else repr(obj)


def resolve(ref: Any) -> Any:
    """The object a ``"package.module:attr"`` string names, its module imported on first use
    (anything else is returned as it is: a spec may hold the class itself)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
