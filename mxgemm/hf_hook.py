"""Registers ``quant_method: "mxgemm"`` with transformers (:mod:`mxgemm.hf`) once transformers loads its
quantizers, without importing torch or transformers itself: ``import mxgemm`` stays instant."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_TRIGGER = "transformers.quantizers.auto"


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs :func:`mxgemm.hf.register` right after :data:`_TRIGGER` is imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TRIGGER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        try:
            from mxgemm import hf

            hf.register()
        except Exception as e:  # noqa: BLE001 (transformers must import whatever happens here)
            import warnings

            warnings.warn(
                f"mxgemm: could not register quant_method 'mxgemm' with transformers: {e}", stacklevel=2
            )


def install() -> None:
    """Make transformers know ``quant_method: "mxgemm"``: now if it has loaded its quantizers, else when
    it does. Does nothing when transformers is not installed."""
    if _TRIGGER in sys.modules:
        from mxgemm import hf

        hf.register()
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
