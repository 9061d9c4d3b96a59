"""The compiled state table (floering.node.core.columnar.ctable) and the mapper's
compiled combiner (floering.mapper.ccombine), built from Cython.

Everything else about the package is in pyproject.toml. The extension is optional: where
Cython or a C compiler is missing the package still installs, and
floering.node.core.columnar falls back to its pure-Python table (KERNEL == "python") and
floering.mapper.combining to its pure-Python combiner (COMBINE_KERNEL == "python").
"""

from setuptools import setup
from setuptools.command.build_ext import build_ext

SOURCE = "node/core/columnar/ctable.pyx"
COMBINER = "mapper/ccombine.pyx"


class OptionalBuildExt(build_ext):
    """A failed compile leaves the pure-Python table in place instead of failing."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler failure
            print(f"floe-ring: the compiled state table was not built ({exc}); "
                  "the pure-Python table will be used")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"floe-ring: {ext.name} was not built ({exc})")


def extensions():
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("floe-ring: Cython is not installed; the pure-Python state table will be used")
        return []
    from setuptools import Extension
    ext = Extension("floering.node.core.columnar.ctable", [SOURCE],
                    include_dirs=["node/core/columnar"],
                    extra_compile_args=["-O3"])
    combiner = Extension("floering.mapper.ccombine", [COMBINER],
                         include_dirs=["node/core/columnar"],     # _murmur3.h
                         extra_compile_args=["-O3"])
    try:
        return cythonize([ext, combiner], compiler_directives={"language_level": 3},
                         quiet=True)
    except Exception as exc:  # noqa: BLE001 - a Cython that cannot compile the source
        print(f"floe-ring: the compiled state table was not generated ({exc})")
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
