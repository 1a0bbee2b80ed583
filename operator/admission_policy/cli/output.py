"""How every command ends on unusable input: one message and exit code 2."""
from __future__ import annotations

import sys
from typing import NoReturn

import click

from .documents import dump_json


def fail(error: Exception, output: str = "text") -> NoReturn:
    """Exit 2 with the error; under ``-o json`` as JSON on standard output, where a pipeline reads."""
    if output == "json":
        click.echo(dump_json({"errors": str(error).splitlines()}))
    else:
        click.echo(f"error: {error}", err=True)
    sys.exit(2)
