"""Old path of :mod:`nri_framework.inspect_cli` (it shadowed the stdlib's name).

Developer B's ``nri_balloons/demo.py`` still imports ``render`` from here;
the lead removes this module once B's branch (the demo moved out) lands.
"""

from nri_framework.inspect_cli import render

__all__ = ["render"]
