"""Ships the repository's top-level jobs/ and partitions/ inside the package at build time.

They stay where the mission puts them (the top level, where people read and edit them); a
wheel built from a checkout or from the sdist gets a copy as fedray/_bundled/, so an
installed fedray runs them by name (fedray/bundled.py; docs/packaging.md). Everything else is
in pyproject.toml.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLED = ("jobs", "partitions")


class BuildWithBundled(build_py):
    def run(self) -> None:
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        for folder in BUNDLED:
            source = os.path.join(here, folder)
            if not os.path.isdir(source):
                raise SystemExit(f"setup.py: {source} is missing: build from a checkout "
                                 "or from the sdist, which both hold it")
            target = os.path.join(self.build_lib, "fedray", "_bundled", folder)
            for base, dirs, files in os.walk(source):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".yaml", ".py")):
                        rel = os.path.relpath(os.path.join(base, name), source)
                        self.mkpath(os.path.dirname(os.path.join(target, rel)))
                        self.copy_file(os.path.join(base, name), os.path.join(target, rel))


setup(cmdclass={"build_py": BuildWithBundled})
