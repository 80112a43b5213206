"""The public API: each documented name is its object, even once its module is imported."""

from __future__ import annotations

import importlib
import subprocess
import sys

import bayesprism
from bayesprism.cli.main import SUBCOMMANDS, build_parser


def test_every_public_name_is_the_documented_object_after_its_module_is_imported():
    for name, module in bayesprism._API.items():
        importlib.import_module(module)  # rebinding bayesprism.<module> must not shadow a name
        obj = getattr(bayesprism, name)
        assert obj is getattr(importlib.import_module(module), name), name
        assert callable(obj), name


def test_import_does_not_load_pymc():
    code = "import sys, bayesprism; sys.exit('pymc' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_every_subcommand_is_registered():
    parser = build_parser()
    choices = parser._subparsers._group_actions[0].choices
    # a module name is the command with "-" as "_" (what_if: what-if)
    assert set(choices) == {name.replace("_", "-") for name in SUBCOMMANDS}


def test_every_subcommand_help_renders_percent_signs_once():
    # argparse %-formats help strings but not descriptions: a '%%' there is printed as is
    choices = build_parser()._subparsers._group_actions[0].choices
    for name, sub in choices.items():
        text = sub.format_help()
        assert "%%" not in text, name
        assert "50% and 90%" in text or name != "validate"
