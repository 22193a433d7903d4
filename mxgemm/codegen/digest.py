"""Digests of the sources that shape a kernel, blind to what cannot change one: comments, docstrings
and formatting. Kernel-cache keys and tune records carry them, so rewording a docstring of a rule
keeps its cached kernels and its tune log."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable
from pathlib import Path


def _canon(node: object) -> str:
    """A syntax tree as text that every Python version since 3.10 writes alike (``ast.dump`` does
    not: 3.12 adds ``type_params`` to every function, 3.13 drops empty fields): node names and their
    fields, empty ones left out, positions never in."""
    if isinstance(node, ast.AST):
        fields = (f"{k}={_canon(v)}" for k, v in ast.iter_fields(node) if v is not None and v != [])
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(map(_canon, node))}]"
    return repr(node)


def _code(path: Path) -> bytes:
    """A Python file's syntax tree without docstrings (:func:`_canon`), other files' bytes; b"" when
    the file is missing."""
    if not path.exists():
        return b""
    if path.suffix != ".py":
        return path.read_bytes()
    tree = ast.parse(path.read_bytes())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return _canon(tree).encode()


def sources(root: Path, rels: Iterable[str]) -> str:
    """16 hex digits over the files ``rels`` (paths relative to ``root``, in the given order)."""
    h = hashlib.sha256()
    for rel in rels:
        h.update(rel.encode() + _code(root / rel))
    return h.hexdigest()[:16]
