"""Thin setuptools shim that drives CMake (the shape of pybind's cmake_example).

`pip install .` builds the extension zrl._core with CMake and pybind11 from
PyPI alone; no apt package is needed. `pip install -e .` puts the built
`_core*.so` inside ./zrl so `python -m pytest` from the root uses it.
"""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str, sourcedir: str = "") -> None:
        super().__init__(name, sources=[])
        self.sourcedir = os.fspath(Path(sourcedir).resolve())


class CMakeBuild(build_ext):
    def build_extension(self, ext: CMakeExtension) -> None:
        extdir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        cfg = "Debug" if self.debug else "Release"
        import pybind11

        cmake_args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={extdir}{os.sep}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={cfg}",
            "-DZRL_BUILD_PYTHON=ON",
        ]
        if "CMAKE_ARGS" in os.environ:
            cmake_args += [a for a in os.environ["CMAKE_ARGS"].split(" ") if a]
        build_args = ["--target", "_core"]
        if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ:
            build_args += [f"-j{os.cpu_count() or 2}"]
        build_temp = Path(self.build_temp) / ext.name
        build_temp.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cmake", ext.sourcedir, *cmake_args], cwd=build_temp, check=True)
        subprocess.run(["cmake", "--build", ".", *build_args], cwd=build_temp, check=True)


class BuildPy(build_py):
    """Ships configs/*.yaml inside the package (zrl/configs/), so an installed zrl finds its
    default config from any directory. An editable install reads ./configs itself."""

    def run(self) -> None:
        super().run()
        dest = Path(self.build_lib) / "zrl" / "configs"
        dest.mkdir(parents=True, exist_ok=True)
        for src in sorted((ROOT / "configs").glob("*.yaml")):
            self.copy_file(str(src), str(dest / src.name))


setup(
    ext_modules=[CMakeExtension("zrl._core")],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
)
