"""Build hook: compile the Go core into a shared library inside the package.

`pip install .` (or `pip install -e .`) runs `go build -buildmode=c-shared`
on ./gofastensor and places the library where pyfastensor/_lib.py looks for
it. Go (1.22 or later) is the only build tool needed besides pip; the Go
module proxy supplies the Go dependencies listed in go.mod.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
VERSION = re.search(
    r'__version__ = "([^"]+)"', (ROOT / "pyfastensor" / "_version.py").read_text()
).group(1)


class GoLibrary(Extension):
    """A shared library built from a Go package with -buildmode=c-shared."""

    def __init__(self, name: str, go_package: str) -> None:
        super().__init__(name, sources=[])
        self.go_package = go_package


class BuildGo(build_ext):
    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, GoLibrary):
            return super().build_extension(ext)
        go = shutil.which("go")
        if go is None:
            raise RuntimeError(
                "pyfastensor needs the Go toolchain (1.22+) to build its native library: "
                "install Go and make sure `go` is on PATH, then rerun pip install."
            )
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="1")
        cmd = [
            go, "build", "-buildmode=c-shared", "-trimpath",
            "-ldflags", f"-s -w -X main.version={VERSION}",
            "-o", str(out), ext.go_package,
        ]
        self.announce(" ".join(cmd), level=2)
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
        out.with_suffix(".h").unlink(missing_ok=True)  # cgo's header: not shipped


setup(
    version=VERSION,
    ext_modules=[GoLibrary("pyfastensor._native", "./gofastensor")],
    cmdclass={"build_ext": BuildGo},
)
