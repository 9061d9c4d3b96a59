"""The compiled combiner (ccombine.pyx) has the interface of the pure-Python one."""

from floering.mapper.pycombine import *  # noqa: F403
