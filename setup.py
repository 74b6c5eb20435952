"""Build hook: compile the Go core into a shared library inside the package.

`pip install .` (or `pip install -e .`) runs `go build -buildmode=c-shared`
on ./gofastensor and places the library where pyfastensor/_lib.py looks for
it: in the package being installed and, for a build from a source tree, in
that tree's ``pyfastensor/`` as well (Python started in the tree imports it). Go (the version go.mod's `go` line names, or later) and gcc (for cgo) are
the only build tools needed besides pip; the Go module proxy supplies the Go
dependencies listed in go.mod.

cgo writes a C header beside the library, one prototype per exported
function: the build turns it into ``pyfastensor/_abi.py`` (with
pyfastensor/_cheader.py), the one table ``pyfastensor/_lib.py`` declares
every function from, in the package built and in the source tree (where it
is committed, so that a change of the Go side shows in the diff and
tests/test_abi_sync.py can compare the two).

The library calls no CPython API (Python loads it with ctypes), so it is named
``_native.so`` and wheels are tagged ``py3-none-<platform>``: one wheel serves
every Python 3. ``auditwheel repair`` turns that wheel into a manylinux one,
which installs where Go is not (README: "Installing without Go").
"""

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
VERSION = re.search(
    r'__version__ = "([^"]+)"', (ROOT / "pyfastensor" / "_version.py").read_text()
).group(1)

# Go 1.21 is the first release that fetches a newer toolchain when go.mod asks for one.
_FIRST_SWITCHING_GO = (1, 21)


def go_version_required(go_mod: Path = ROOT / "go.mod") -> str:
    """The Go version go.mod's ``go`` line names.

    Args:
        go_mod: the go.mod to read. Default: the one beside this file.

    Returns:
        The version, e.g. ``"1.26.8"``.

    Raises:
        RuntimeError: when go.mod has no ``go`` line.
    """
    m = re.search(r"^go\s+(\d+\.\d+(?:\.\d+)?)\s*$", go_mod.read_text(), re.MULTILINE)
    if m is None:
        raise RuntimeError(f"{go_mod} has no `go` line naming the Go version it needs")
    return m.group(1)


def _version_tuple(text: str) -> tuple[int, ...] | None:
    """``"go1.26.8"``, ``"1.22"`` or ``"devel go1.27-abc"`` as (1, 26, 8), (1, 22, 0), (1, 27, 0)."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def write_abi(header: Path, abi: Path) -> bool:
    """Write the prototype table of cgo's ``header`` as ``abi`` (pyfastensor/_abi.py)
    unless it holds it already; return whether it was written."""
    spec = importlib.util.spec_from_file_location("_pyfastensor_cheader", ROOT / "pyfastensor" / "_cheader.py")
    cheader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cheader)
    return cheader.write(header, abi)


class GoLibrary(Extension):
    """A shared library built from a Go package with -buildmode=c-shared."""

    def __init__(self, name: str, go_package: str) -> None:
        super().__init__(name, sources=[])
        self.go_package = go_package


class BuildGo(build_ext):
    def run(self) -> None:
        super().run()
        if self.inplace:  # an editable install: drop libraries named as before (see _lib.library_path)
            for stale in (ROOT / "pyfastensor").glob("_native.cpython-*.so"):
                stale.unlink()

    def get_ext_filename(self, fullname: str) -> str:
        # No CPython ABI in the name: the library never links libpython.
        if isinstance(self.ext_map.get(fullname), GoLibrary):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, GoLibrary):
            return super().build_extension(ext)
        need = go_version_required()
        go = shutil.which("go")
        if go is None:
            raise RuntimeError(
                f"pyfastensor needs the Go toolchain (go {need} or later, as go.mod says) and gcc "
                "to build its native library: install Go and make sure `go` is on PATH, then rerun "
                "pip install. Or install a prebuilt wheel, which needs neither (README: "
                "'Installing without Go')."
            )
        have = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
        have_v = _version_tuple(have) or (0, 0, 0)
        too_old = have_v < (_version_tuple(need) or (0, 0, 0))
        if too_old and have_v < _FIRST_SWITCHING_GO:
            raise RuntimeError(
                f"pyfastensor needs go {need} or later (go.mod), but {go} is {have or 'unknown'}: "
                "install a newer Go and rerun pip install."
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
        try:
            subprocess.run(cmd, cwd=ROOT, env=env, check=True)
        except subprocess.CalledProcessError as e:
            if too_old:  # go tried to fetch the toolchain go.mod names (GOTOOLCHAIN) and failed
                raise RuntimeError(
                    f"go build failed: pyfastensor needs go {need} or later (go.mod) and {go} is "
                    f"{have}; it could not switch to go{need} by itself (GOTOOLCHAIN={os.environ.get('GOTOOLCHAIN', 'auto')}). "
                    "Install a newer Go and rerun pip install."
                ) from e
            raise
        header = out.with_suffix(".h")
        write_abi(header, out.with_name("_abi.py"))  # the package's table of the prototypes
        if not self.inplace:
            self._leave_in_source_tree(out, ext.name)
            source_abi = ROOT.joinpath(*ext.name.split(".")).with_name("_abi.py")
            try:
                if source_abi.parent.is_dir() and write_abi(header, source_abi):
                    self.warn(f"{source_abi} changed: the Go side's exports did (commit it)")
            except OSError as e:  # a read-only tree
                self.warn(f"could not update {source_abi}: {e}")
        header.unlink(missing_ok=True)  # its content is _abi.py

    def _leave_in_source_tree(self, built: Path, name: str) -> None:
        """Copy the built library into the source tree's package too, as an in-place build does.

        The package sits at the top of the repository, so Python started in the
        clone's root (``pip install . && python -m pyfastensor demo``) imports
        ``./pyfastensor``, not the installed copy: with the library beside it,
        that package is as complete as the installed one. The copy replaces the
        old file by rename, so a process that has the old one loaded keeps it.
        """
        target = ROOT.joinpath(*name.split(".")).with_suffix(".so")
        if not target.parent.is_dir() or target.resolve() == built:
            return
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            shutil.copyfile(built, tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        except OSError as e:  # a read-only tree: the installed package still works elsewhere
            tmp.unlink(missing_ok=True)
            self.warn(f"could not copy the native library into {target.parent}: {e}")


class PlatformWheel(bdist_wheel):
    """Tag wheels ``py3-none-<platform>``: the native library is Python-independent."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    version=VERSION,
    ext_modules=[GoLibrary("pyfastensor._native", "./gofastensor")],
    cmdclass={"build_ext": BuildGo, "bdist_wheel": PlatformWheel},
)
