"""Extra `nightshift` sub-commands, one module each; each exposes `register(app: typer.Typer)`."""

from __future__ import annotations

import importlib
import pkgutil

import typer


def register_all(app: typer.Typer) -> None:
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}").register(app)
