"""The PEP 517 build backend of the Python package `cohort` (pyproject.toml): `pip install .`
configures and builds the extension `cohort._C` with the project's CMake, then writes the wheel
(python/cohort/*.py, the extension, the GDCM helper `cohort-gdcm`, and the .dist-info) by hand.

Standard library only, and in the tree (pyproject.toml's backend-path), because pip's build
isolation would otherwise download setuptools and wheel from PyPI, which a machine that has
Debian's torch but no index cannot reach.

Where it builds:
- COHORT_BUILD_DIR set (absolute, or relative to the checkout, as scripts/build reads it): that
  build tree, configured there first if it holds none yet, and kept; only the target
  cohort_python and what it links are built, so a tree scripts/build has built already costs
  nothing more.
- otherwise a temporary build tree (tests, peers and benchmarks off), removed afterwards.
An editable install (`pip install -e .`, PEP 660) builds in COHORT_BUILD_DIR or ./build and
points Python at that tree's package (build/python), which each build keeps up to date.
"""

import base64
import csv
import glob
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tomllib
import zipfile

# The interpreter the extension is built for (python/CMakeLists.txt): the one with Debian's torch.
TORCH_PYTHON = "/usr/bin/python3"


def _source_dir():
    # PEP 517 runs every hook in the root of the source tree.
    root = os.path.abspath(os.getcwd())
    if not os.path.isfile(os.path.join(root, "python", "CMakeLists.txt")):
        raise RuntimeError(f"cohort_build: {root} is not a Cohort checkout "
                           "(no python/CMakeLists.txt)")
    return root


def _project(root):
    """Name, version and summary: pyproject.toml's [project], the version from CMake's project()."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    with open(os.path.join(root, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*cohort\b[^)]*\bVERSION\s+([0-9.]+)", f.read())
    if not m:
        raise RuntimeError("cohort_build: no VERSION in the project() of CMakeLists.txt")
    return project["name"], m.group(1), project.get("description", ""), project.get(
        "requires-python", "")


def _metadata(root):
    name, version, summary, requires_python = _project(root)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             f"Summary: {summary}"]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    # No Requires-Dist on torch: the extension is built against Debian's python3-torch, which
    # pip cannot see as a distribution of the same ABI, and a torch from PyPI would not load it.
    return "\n".join(lines) + "\n"


def _tag():
    """cp311-cp311-linux_x86_64 for the interpreter that runs pip (checked against Debian's)."""
    interp = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{interp}-{interp}-{platform}"


def _check_interpreter():
    """The extension is built for /usr/bin/python3 (Debian's torch); a pip of another Python
    (pyenv's, say, which has no Debian torch) would install a package it cannot import."""
    ours = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if ours != os.path.realpath(TORCH_PYTHON):
        raise RuntimeError(
            f"cohort_build: this pip runs the Python of {ours}, but the extension is built "
            f"against Debian's torch for {TORCH_PYTHON} (python3-torch): create the environment "
            f"with `{TORCH_PYTHON} -m venv --system-site-packages DIR` and use DIR/bin/pip")


def _run(cmd, **kw):
    print("cohort_build: " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr, **kw)


def _build(root, build_dir, minimal):
    """Configures `build_dir` if it holds no build tree yet, builds the target cohort_python,
    and returns the build tree's package folder (BUILD/python/cohort)."""
    _check_interpreter()
    if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
        cmd = ["cmake", "-S", root, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
               "-DCOHORT_PYTHON=ON", "-DCOHORT_PYTHON_REQUIRED=ON"]
        if shutil.which("ninja"):
            cmd += ["-G", "Ninja"]
        if minimal:  # what cohort._C needs, not the tests and peer benchmarks
            cmd += ["-DCOHORT_TESTS=OFF", "-DCOHORT_PEERS=OFF"]
        _run(cmd)
    else:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", f.read(), re.M)
        if m and os.path.realpath(m.group(1)) != os.path.realpath(root):
            print(f"cohort_build: note: {build_dir} builds the sources of {m.group(1)}, not of "
                  f"{root}; the extension comes from there", file=sys.stderr, flush=True)
    _run(["cmake", "--build", build_dir, "--target", "cohort_python", "--parallel",
          str(os.cpu_count() or 1)])
    package = os.path.join(build_dir, "python", "cohort")
    if not os.path.isfile(os.path.join(package, "_C" + sysconfig.get_config_var("EXT_SUFFIX"))):
        raise RuntimeError(f"cohort_build: the build left no {package}/_C"
                           f"{sysconfig.get_config_var('EXT_SUFFIX')} (is {build_dir} configured "
                           "with COHORT_PYTHON=ON and python3-dev, pybind11-dev, libtorch-dev?)")
    return package


def _named_build_dir(root, default=None):
    d = os.environ.get("COHORT_BUILD_DIR") or default
    return os.path.join(root, d) if d else None


class _Wheel:
    """A wheel being written: each file goes into the zip and into RECORD with its sha256."""

    def __init__(self, path, dist_info):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.dist_info = dist_info
        self.records = []

    def add(self, arcname, data, mode=0o644):
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.records.append((arcname, f"sha256={digest}", str(len(data))))

    def add_file(self, arcname, path):
        with open(path, "rb") as f:
            self.add(arcname, f.read(), 0o755 if os.access(path, os.X_OK) else 0o644)

    def close(self, root, tag):
        self.add(f"{self.dist_info}/METADATA", _metadata(root).encode())
        self.add(f"{self.dist_info}/WHEEL", (
            "Wheel-Version: 1.0\nGenerator: cohort_build\nRoot-Is-Purelib: false\n"
            f"Tag: {tag}\n").encode())
        record = f"{self.dist_info}/RECORD"
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerows(self.records + [(record, "", "")])
        info = zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o100644) << 16
        self.zip.writestr(info, out.getvalue())
        self.zip.close()


def _wheel_names(root):
    name, version, _, _ = _project(root)
    tag = _tag()
    return f"{name}-{version}.dist-info", f"{name}-{version}-{tag}.whl", tag


def _write_wheel(root, wheel_directory, fill):
    dist_info, filename, tag = _wheel_names(root)
    path = os.path.join(wheel_directory, filename)
    wheel = _Wheel(path, dist_info)
    try:
        fill(wheel)
        wheel.close(root, tag)
    except BaseException:
        wheel.zip.close()
        os.unlink(path)
        raise
    return filename


# PEP 517 and PEP 660 hooks.

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    root = _source_dir()
    dist_info, _, tag = _wheel_names(root)
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w") as f:
        f.write(_metadata(root))
    return dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    root = _source_dir()
    build_dir = _named_build_dir(root)
    scratch = None
    if build_dir is None:
        scratch = tempfile.mkdtemp(prefix="cohort-wheel-build-")
        build_dir = scratch
    try:
        built = _build(root, build_dir, minimal=scratch is not None)

        def fill(wheel):
            # The Python files of this tree; the extension and the GDCM helper from the build.
            for path in sorted(glob.glob(os.path.join(root, "python", "cohort", "*.py"))):
                wheel.add_file("cohort/" + os.path.basename(path), path)
            ext = "_C" + sysconfig.get_config_var("EXT_SUFFIX")
            wheel.add_file("cohort/" + ext, os.path.join(built, ext))
            # cohort_data names the helper it starts by its path in the build tree, which a
            # temporary build removes: the package carries its own, and `import cohort` points
            # COHORT_GDCM_HELPER at it.
            wheel.add_file("cohort/cohort-gdcm", os.path.join(build_dir, "bin", "cohort-gdcm"))

        return _write_wheel(root, wheel_directory, fill)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    root = _source_dir()
    build_dir = _named_build_dir(root, "build")
    _build(root, build_dir, minimal=False)
    name = _project(root)[0]

    def fill(wheel):
        # A .pth line puts the build tree's package folder on sys.path.
        wheel.add(f"__editable__.{name}.pth",
                  (os.path.realpath(os.path.join(build_dir, "python")) + "\n").encode())

    return _write_wheel(root, wheel_directory, fill)


def build_sdist(sdist_directory, config_settings=None):
    """The tracked files of the checkout (git ls-files, with their uncommitted changes)."""
    root = _source_dir()
    name, version, _, _ = _project(root)
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"cohort_build: an sdist is made from a git checkout's tracked files "
                           f"(git ls-files failed in {root}: {e})") from e
    base = f"{name}-{version}"
    filename = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as tar:
        for rel in sorted(p for p in listed if p and os.path.isfile(os.path.join(root, p))):
            tar.add(os.path.join(root, rel), arcname=f"{base}/{rel}", recursive=False)
        pkg_info = _metadata(root).encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(pkg_info))
    return filename
