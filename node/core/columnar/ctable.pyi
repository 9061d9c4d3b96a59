"""The compiled state table (ctable.pyx) has the interface of the pure-Python one."""

from floering.node.core.columnar.pytable import *  # noqa: F403
