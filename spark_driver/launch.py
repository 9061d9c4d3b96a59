"""Start the driver through spark-submit from Python (the main job, tests, benchmark)
and stop it with everything it started: the JVM, the Python driver, Spark's Python
daemon and workers. Every process is found by walking the process table (psutil) from the spark-submit PID
and signalled by its own PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "driver.py"
LOG_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"


SPARK_EXTRA = "the Spark driver needs pyspark: pip install 'floe-ring[spark]'"


def spark_submit() -> str:
    """spark-submit beside this Python, else on PATH; the driver and its executors run
    this Python, so its pyspark is checked first (one line naming the extra)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise FileNotFoundError(SPARK_EXTRA) from None
    local = Path(sys.executable).parent / "spark-submit"
    if local.exists():
        return str(local)
    found = shutil.which("spark-submit")
    if not found:
        raise FileNotFoundError(f"spark-submit not found: {SPARK_EXTRA}")
    return found


def command(driver_args: list[str], master: str = "local[2]", ui: bool = False,
            conf: dict | None = None, script: Path = DRIVER) -> list[str]:
    cmd = [spark_submit(), "--master", master,
           "--driver-java-options", f"-Dlog4j2.configurationFile=file:{LOG_CONFIG}",
           "--conf", f"spark.ui.enabled={'true' if ui else 'false'}"]
    for key, value in (conf or {}).items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd + [str(script), *driver_args]


def environment() -> dict:
    """This Python for the driver and the executors, this checkout importable."""
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if (ROOT / "proto" / "floering").is_dir():   # a checkout: floering finds the rest
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "proto"), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # local mode: loopback, no warning
    return env


class SparkDriver:
    """One spark-submit run of the driver."""

    def __init__(self, driver_args: list[str], *, master: str = "local[2]",
                 log: str | Path | None = None, conf: dict | None = None,
                 script: Path = DRIVER) -> None:
        self.cmd = command(driver_args, master, conf=conf, script=script)
        self.log_path = Path(log) if log else None
        out = open(self.log_path, "ab") if self.log_path else None
        try:
            self.proc = subprocess.Popen(self.cmd,
                                         stdout=subprocess.DEVNULL if out is None else out,
                                         stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=environment(), cwd=ROOT)
        finally:
            if out is not None:
                out.close()
        self.pid = self.proc.pid
        self._seen: dict[int, float] = {}  # pid -> its start time (a recycled pid differs)

    def descendants(self) -> set[int]:
        """Every live process started, directly or not, by spark-submit (remembered, so
        an orphan re-parented to init is still found)."""
        children: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid"]):
            ppid = proc.info["ppid"]
            if ppid is not None:
                children.setdefault(ppid, []).append(proc.pid)
        found, todo = set(), [self.pid, *self._seen]
        while todo:
            pid = todo.pop()
            for child in children.get(pid, ()):
                if child not in found and child not in self._seen:
                    found.add(child)
                    todo.append(child)
        for pid in found:
            started = _start_time(pid)
            if started is not None:
                self._seen[pid] = started
        return {p for p, t in self._seen.items() if _alive(p) and _start_time(p) == t}

    def wait(self, timeout: float | None = None) -> int:
        rc = self.proc.wait(timeout)
        self._reap_rest(10.0)
        return rc

    def terminate(self, grace: float = 30.0) -> int:
        """SIGTERM the Python driver (it stops the query and exits 0), then wait."""
        python_driver = [p for p in self.descendants() if _is_driver_python(p)]
        for pid in python_driver or [self.pid]:
            _signal(pid, signal.SIGTERM)
        try:
            return self.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL spark-submit and every process it started; wait until all are gone."""
        tree = self.descendants()
        _signal(self.pid, signal.SIGKILL)
        for pid in tree:
            _signal(pid, signal.SIGKILL)
        self.proc.wait()
        self._reap_rest(10.0)

    def _reap_rest(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = self.descendants()
            if not left:
                return
            if time.monotonic() > deadline:
                for pid in left:
                    _signal(pid, signal.SIGKILL)
                deadline = time.monotonic() + timeout
            time.sleep(0.05)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def __enter__(self) -> "SparkDriver":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None or self.descendants():
            self.kill()


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _is_driver_python(pid: int) -> bool:
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return bool(cmdline) and any(arg.endswith("driver.py") for arg in cmdline) \
        and "java" not in cmdline[0]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
