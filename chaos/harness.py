"""Run a chaos scenario against a real local cluster and judge it.

    python -m floering.chaos.harness SCENARIO [--seed N] [--out DIR] [--insecure]   (also: floe chaos run)

Each round: start the cluster with the same launcher `floe up` uses (mutual TLS on
every call unless the scenario says `tls = false`), start the mapper processes (real
RingClients, fixed rate), inject the planned faults into processes started here (by
PID), sample every node's stats, stop the load, let re-replication settle, read the
ring back and check it against the mappers' journals (chaos.oracle), and time every
failure from the nodes' structured events (chaos.timeline). Writes result.json and
PNG plots to the output directory and prints a summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from floering.chaos import durable_faults
from floering.chaos import faults as fault_ops
from floering.chaos import handoff_faults
from floering.chaos import netns
from floering.chaos.hostile import hostile_clients, impostors
from floering.floe.cluster import LocalCluster
from floering.chaos.load import chunk_ids, chunk_keys, hottest_key
from floering.chaos.mapper_proc import MapperHandle
from floering.chaos.oracle import Verdict, check, check_ids, unreadable
from floering.chaos.scenarios import (NET_FAULTS, PlannedFault, Scenario, load_scenario, plan,
                             with_overrides)
from floering.chaos.timeline import (STAGES, FailureTimeline, Injected, by_simultaneous, event_lines,
                            failure_timelines, parse_events, stage_summary)


class Progress:
    """One line on stderr, rewritten in place on a terminal; quiet otherwise."""

    def __init__(self, stream=None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._width = 0

    def update(self, text: str) -> None:
        if self.enabled:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self._width = len(text)

    def done(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def bar(fraction: float, width: int = 24) -> str:
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"


class Sampler(threading.Thread):
    """Polls every node's stats (applied tuples, backup size, queue) every `interval`."""

    def __init__(self, seeds: list[str], interval: float = 0.1, tls=None) -> None:
        super().__init__(daemon=True, name="chaos-sampler")
        self.seeds, self.interval, self.tls = seeds, interval, tls
        self.samples: list[dict] = []
        self.stopping = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        from floering.mapper import RingClient
        try:
            client = RingClient(self.seeds, rpc_timeout=0.3, timeout=10, tls=self.tls)
        except Exception as exc:
            self.error = repr(exc)
            return
        last_refresh = 0.0
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                if now - last_refresh > 0.5:
                    try:
                        client.refresh_ring()
                    except Exception:
                        pass
                    last_refresh = now
                t = time.time()
                try:
                    rows = client.stats()
                except Exception:
                    rows = []
                nodes = {r["node_id"]: {k: r[k] for k in (
                    "applied", "handed_off", "backup_tuples", "queue_length", "under_replicated", "keys",
                    "ring_version", "lost_ranges", "fenced", "ring_share", "rejoined")} for r in rows if "error" not in r}
                self.samples.append({"t": t, "nodes": nodes})
                self.stopping.wait(self.interval)
        finally:
            try:
                client.close()          # nothing was emitted: the flush returns at once
            except Exception:
                pass

    def stop(self) -> None:
        self.stopping.set()
        self.join(15)


def series(samples: list[dict], since: float, window: float = 0.3) -> list[dict]:
    """Per sample: seconds since `since`, applied tuples/s across the ring over the last
    `window` seconds (the sum of per-node increases, so a dead node's counter vanishing
    is not a negative rate), and the total backup-buffer size."""
    out = []
    j = 0
    for cur in samples[1:]:
        while j + 1 < len(samples) and samples[j + 1]["t"] <= cur["t"] - window:
            j += 1
        prev = samples[j]
        dt = cur["t"] - prev["t"]
        if dt <= 0:
            continue
        gained = sum(max(0, n["applied"] - prev["nodes"][k]["applied"])
                     for k, n in cur["nodes"].items() if k in prev["nodes"])
        out.append({"t": round(cur["t"] - since, 3), "applied_per_s": round(gained / dt, 1),
                    "backup_tuples": sum(n["backup_tuples"] for n in cur["nodes"].values()),
                    "live_nodes": len(cur["nodes"])})
    return out


@dataclass
class RoundResult:
    index: int
    label: str
    planned: list[PlannedFault]
    load_started: float = 0.0
    injected: list[Injected] = field(default_factory=list)
    timelines: list[FailureTimeline] = field(default_factory=list)
    verdict: Verdict | None = None
    series: list[dict] = field(default_factory=list)
    mappers: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    final_stats: list[dict] = field(default_factory=list)
    workdir: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.verdict and self.verdict.ok) and not self.errors

    def to_dict(self) -> dict:
        return {"index": self.index, "label": self.label, "ok": self.ok,
                "workdir": self.workdir, "load_started": self.load_started,
                "planned": [asdict(p) for p in self.planned],
                "injected": [{**asdict(i), "at_s": round(i.at - self.load_started, 3)}
                             for i in self.injected],
                "timelines": [t.to_dict() for t in self.timelines],
                "oracle": self.verdict.to_dict() if self.verdict else None,
                "mappers": self.mappers, "errors": self.errors,
                "final_stats": self.final_stats, "series": self.series}


def run_round(scenario: Scenario, seed: int, index: int, planned: list[PlannedFault],
              workdir: Path, progress: Progress, of: int) -> RoundResult:
    """One round on a fresh cluster; a scenario with `disk_mb` keeps its data
    directories on a tmpfs of that size, mounted for the round only."""
    workdir.mkdir(parents=True, exist_ok=True)
    if scenario.netns:
        # every node and mapper on a host of its own; the harness reads through the
        # observer link (chaos.netns)
        hosts = netns.Hosts([f"n{i}" for i in range(scenario.nodes)]
                            + [f"m{m}" for m in range(scenario.load.mappers)])
        try:
            hosts.up()
        except netns.Unavailable as exc:
            raise durable_faults.Skipped(str(exc)) from None
        try:
            return _run_round(scenario, seed, index, planned, workdir, progress, of, None,
                              hosts)
        finally:
            hosts.remove()
    if not scenario.disk_mb:
        return _run_round(scenario, seed, index, planned, workdir, progress, of, None)
    with durable_faults.SmallDisk(workdir / "disk", scenario.disk_mb) as disk:
        return _run_round(scenario, seed, index, planned, workdir, progress, of, disk)


def _run_round(scenario: Scenario, seed: int, index: int, planned: list[PlannedFault],
               workdir: Path, progress: Progress, of: int,
               disk: durable_faults.SmallDisk | None,
               hosts: netns.Hosts | None = None) -> RoundResult:
    label = scenario.rounds[index].label or scenario.name
    result = RoundResult(index, label, planned, workdir=str(workdir))
    tag = f"{scenario.name} round {index + 1}/{of}"
    progress.update(f"{tag}: starting {scenario.nodes} nodes")
    data_dir = (disk.path if disk else workdir) / "data" if scenario.durable else None
    if hosts is not None:
        cluster = netns.start_nodes(hosts, [f"n{i}" for i in range(scenario.nodes)],
                                    scenario.replicas, workdir,
                                    tokens_per_node=scenario.tokens_per_node,
                                    reducer=scenario.reducer,
                                    extra_args=list(scenario.node_args), tls=scenario.tls)
    else:
        cluster = LocalCluster.up(scenario.nodes, scenario.replicas, workdir=workdir,
                                  tokens_per_node=scenario.tokens_per_node,
                                  reducer=scenario.reducer,
                                  extra_args=list(scenario.node_args),
                                  tls=scenario.tls, data_dir=data_dir)
    faults = _RoundFaults(scenario, seed, workdir, cluster, hosts, result, data_dir, disk)
    sampler = None
    try:
        sampler = Sampler(cluster.seeds, tls=cluster.tls("client"))
        sampler.start()
        faults.mappers = [faults.start_mapper(m) for m in range(scenario.load.mappers)]
        result.load_started = _wait_load_started(faults.mappers)
        t0 = result.load_started
        actions = sorted([(p.at, 0, p) for p in planned] +
                         [(p.at + p.pause, 1, p) for p in planned if p.kind == "pause"] +
                         [(p.at + p.hold, 1, p) for p in planned if p.kind in NET_FAULTS],
                         key=lambda a: (a[0], a[1]))
        end = t0 + scenario.round_seconds
        for at, step, p in actions:
            _sleep_until(t0 + at, progress, tag, t0, end, result)
            if faults.inject(step, p):
                # the outage ate into the load: keep it going a while after it
                end = max(end, time.time() + scenario.settle)
        faults.end_the_rest()
        _sleep_until(end, progress, tag, t0, end, result)
        progress.update(f"{tag}: stopping the load")
        for m in faults.mappers:
            code = m.stop()
            if code != 0:
                result.errors.append(f"mapper-{m.mapper} (pid {m.pid}) exited {code}: "
                                     + _tail(m.log))
        progress.update(f"{tag}: settling")
        _settle(sampler, cluster, deadline=time.monotonic() + 10,
                converge=hosts is not None)
        sampler.stop()
        result.series = series(sampler.samples, t0)
        if sampler.samples:
            result.final_stats = [dict(node_id=k, **v) for k, v in
                                  sorted(_last_whole(sampler.samples, cluster).items())]
        progress.update(f"{tag}: checking every tuple")
        _judge_round(scenario, seed, faults, sampler.samples, t0)
    except Exception as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        for m in faults.retired + faults.mappers:
            if m.alive():
                m.kill()
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        cluster.down()
    return result


class _RoundFaults:
    """A round's cluster, load and faults: carries out each planned fault at its time
    (and its end: a pause resumed, a network fault healed) and keeps what the judging
    needs (the mappers, the ones killed, the faults injected)."""

    def __init__(self, scenario: Scenario, seed: int, workdir: Path, cluster,
                 hosts: netns.Hosts | None, result: RoundResult, data_dir: Path | None,
                 disk: durable_faults.SmallDisk | None) -> None:
        self.scenario, self.seed, self.workdir = scenario, seed, workdir
        self.cluster, self.hosts, self.result = cluster, hosts, result
        self.data_dir, self.disk = data_dir, disk
        self.mappers: list[MapperHandle] = []
        self.retired: list[MapperHandle] = []      # killed mid-chunk, replaced
        self.generations: Counter = Counter()
        self.paused: dict[int, Injected] = {}
        self.broken: dict[int, Injected] = {}      # network faults not healed yet

    def start_mapper(self, m: int, first: int = 0, generation: int = 0) -> MapperHandle:
        name = f"mapper-{m}" + (f".{generation}" if generation else "")
        return MapperHandle(self.cluster.seeds, self.scenario.load, self.seed, m,
                            str(self.workdir / f"{name}.journal"),
                            str(self.workdir / f"{name}.log"),
                            first_chunk=first, tls_dir=self.cluster.tls_dir,
                            timeout=self.scenario.client_timeout,
                            prefix=self.hosts.exec_prefix(f"m{m}") if self.hosts else None)

    def inject(self, step: int, p: PlannedFault) -> bool:
        """Carry out `p`'s start (step 0) or end (step 1); True when it was an outage
        the load should outlast."""
        cluster, injected = self.cluster, self.result.injected
        if p.kind == "kill":
            injected.append(replace(fault_ops.kill_nodes(cluster, p.victims),
                                    tokens=dict(p.ranges)))
        elif p.kind == "pause" and step == 0:
            self.paused[id(p)] = replace(fault_ops.pause_nodes(cluster, p.victims),
                                         tokens=dict(p.ranges))
        elif p.kind == "pause":
            injected.append(fault_ops.resume_nodes(cluster, self.paused.pop(id(p))))
        elif p.kind == "partition" and step == 0:
            self.broken[id(p)] = netns.partition_fault(
                _net_hosts(self.hosts, p), p, [n.node_id for n in cluster.nodes],
                [f"m{m}" for m in range(self.scenario.load.mappers)])
        elif p.kind == "lossy-link" and step == 0:
            self.broken[id(p)] = netns.lossy_fault(_net_hosts(self.hosts, p), p)
        elif p.kind in NET_FAULTS:
            injected.append(netns.heal_fault(_net_hosts(self.hosts, p),
                                             self.broken.pop(id(p))))
        elif p.kind == "kill-mid-handoff":
            injected.append(handoff_faults.kill_mid_handoff(cluster, p))
        elif p.kind == "restart":
            injected.append(replace(fault_ops.restart_nodes(cluster, p.victims),
                                    tokens=dict(p.ranges)))
        elif p.kind == "rolling-restart":
            injected.append(fault_ops.rolling_restart(cluster, p.victims))
        elif p.kind == "hostile":
            injected.append(hostile_clients(cluster, p.victims))
        elif p.kind == "impostor":
            injected.append(impostors(cluster, p.victims, self.workdir / "impostor"))
        elif p.kind in durable_faults.KINDS:
            injected.append(_durable_fault(cluster, p, self.data_dir, self.disk,
                                           hottest_key(self.scenario.load, self.seed)))
            return True
        elif p.kind == "kill-mapper":
            self.kill_mapper(int(p.victims[0].split("-")[1]))
        return False

    def kill_mapper(self, which: int) -> None:
        victim = self.mappers[which]
        self.result.injected.append(fault_ops.kill_mapper_mid_chunk(victim))
        self.retired.append(victim)
        # A replacement process (a new source) carries on with the next chunks, as a
        # restarted task would; the killed chunk is never resent.
        state = victim.journal_state()
        nxt = max(state["emitted"], default=victim.first_chunk - 1) + 1
        self.generations[which] += 1
        self.mappers[which] = self.start_mapper(which, nxt, self.generations[which])

    def end_the_rest(self) -> None:
        """Resume a pause and heal a network fault still running at the round's end."""
        for fault in self.paused.values():
            self.result.injected.append(fault_ops.resume_nodes(self.cluster, fault))
        for fault in self.broken.values():
            self.result.injected.append(netns.heal_fault(_net_hosts(self.hosts, fault),
                                                         fault))


def _judge_round(scenario: Scenario, seed: int, faults: _RoundFaults, samples: list,
                 t0: float) -> None:
    """Every tuple checked against the mappers' journals, each fault judged on the
    nodes' events, and no node declared dead that no fault touched."""
    result, cluster, hosts = faults.result, faults.cluster, faults.hosts
    journals = faults.retired + faults.mappers
    acked, unacked, summaries = _journals(scenario, seed, journals)
    result.mappers = summaries
    members = {s["node_id"] for s in result.final_stats}
    acked_at = sorted(t for s in summaries for t in s["acked_at"])
    for i, injected in enumerate(result.injected):
        if injected.kind in durable_faults.KINDS:
            result.injected[i], errors = durable_faults.judge(
                injected, cluster, acked_at, members,
                flushes=[f for s in summaries for f in s["flushes"]])
            result.errors += errors
        elif injected.kind == "rolling-restart" and scenario.durable:
            result.injected[i], errors = _judge_durable_rolling(injected, cluster, acked_at)
            result.errors += errors
    result.verdict = _verify(cluster, acked, unacked, scenario.load.ids)
    logs = {node.node_id: _read(node.events) for node in cluster.nodes}
    events = [e for node, text in logs.items() for e in parse_events(node, text)]
    result.injected = [_judge_handoff(i, logs, events, result.errors)
                       if i.kind == "kill-mid-handoff" else i for i in result.injected]
    if hosts is not None:
        raw = [dict(e, _node=node) for node, text in logs.items() for e in event_lines(text)]
        final = {s["node_id"]: s for s in result.final_stats}
        result.injected = [netns.judge(i, raw, final, [m.journal for m in journals],
                                       result.errors, samples)
                           if i.kind in NET_FAULTS else i for i in result.injected]
    result.timelines = failure_timelines(result.injected, events)
    # A node a hostile client only talked to must not be declared dead either, nor one
    # a durable fault hit: it came back as itself (but one killed as it restored).
    faulted = {v for i in result.injected for v in _may_be_declared(i)}
    came_back = {v for i in result.injected if i.kind in durable_faults.KINDS
                 for v in i.victims}
    for e in events:
        if e.kind == "detected" and e.about[0] not in faulted:
            why = ("it came back on its data directory" if e.about[0] in came_back
                   else "no fault touched it")
            result.errors.append(f"false positive: {e.node} declared {e.about[0]} dead "
                                 f"at {e.t - t0:+.3f}s, though {why}")
    lost = sum(s.get("lost_ranges", 0) for s in result.final_stats)
    if lost:
        result.errors.append(f"{lost} ranges reported lost")


def _may_be_declared(injected: Injected) -> tuple[str, ...]:
    if injected.kind in ("hostile", "impostor"):
        return ()
    if injected.kind in durable_faults.KINDS:
        return durable_faults.may_be_declared(injected)
    return injected.victims


# What a node logs when it starts on a data directory whose member left the ring
# (node.runtime.durability.open_data_dir): it starts there as a new member.
LEFT_AND_BACK = "had left the ring; starting as a new member"


def _judge_durable_rolling(injected: Injected, cluster: LocalCluster,
                           acked_at: list[float]) -> tuple[Injected, list[str]]:
    """A rolling restart on data directories: every node started again on its own
    directory, found its member gone and started as a new member in it (what it held
    is not served again); chunks were acknowledged while the nodes restarted."""
    d = dict(injected.detail)
    until = injected.at + d["seconds"]
    after = [t for t in acked_at if t > injected.at]
    during = [t for t in after if t < until]
    d["first_ack_after_ms"] = round((min(after) - injected.at) * 1e3, 1) if after else None
    d["acked_during"] = len(during)
    d["longest_ack_gap_ms"] = round(max(b - a for a, b in zip(
        [injected.at, *during], [*during, until])) * 1e3, 1)
    d["new_members_on_data_dir"] = sorted(
        v for v in injected.victims if LEFT_AND_BACK in _read(cluster.node(v).log))
    errors = [f"rolling-restart: {v} did not start again on its data directory as a new "
              f"member" for v in injected.victims if v not in d["new_members_on_data_dir"]]
    if not during:
        errors.append("rolling-restart: no chunk was acknowledged while the nodes "
                      "restarted")
    return replace(injected, detail=d), errors


class NotPrepared(RuntimeError):
    """A fault was planned in a round that was not set up for it (a network fault
    without the namespaced hosts, a durable fault without a data directory, a full disk
    without the small disk): the scenario and the round's setup disagree."""


def _net_hosts(hosts: netns.Hosts | None, fault: PlannedFault | Injected) -> netns.Hosts:
    if hosts is None:
        raise NotPrepared(f"{fault.kind}: the round runs without network namespaces")
    return hosts


def _durable_fault(cluster: LocalCluster, p: PlannedFault, data_dir: Path | None,
                   disk: durable_faults.SmallDisk | None, key: str) -> Injected:
    if p.kind == "disk-full":
        if disk is None:
            raise NotPrepared("disk-full: the round has no small disk (disk_mb)")
        return durable_faults.disk_full(cluster, disk.path, p.hold, key)
    if p.kind == "kill-during-replay":
        return durable_faults.kill_during_replay(cluster, p.again, p.lag)
    if data_dir is None:
        raise NotPrepared(f"{p.kind}: the scenario is not durable (no data directory)")
    return durable_faults.restart_all(cluster, data_dir, tear=p.kind == "power-loss")


def _judge_handoff(injected: Injected, logs: dict[str, str], events, errors: list[str]) -> Injected:
    """Attach the handoff's outcome; a receiver that was killed after its giver
    committed owned the moved ranges too, so its timeline covers them."""
    outcome = handoff_faults.handoff_outcome(injected, logs, events)
    errors += handoff_faults.handoff_errors(outcome)
    d = injected.detail
    if not d["in_flight"]:
        errors.append(f"the kill of {injected.victims[0]} missed the handoff window: the "
                      f"giver's handoff was {d['state_when_killed']!r} when it landed")
    victim = injected.victims[0]
    tokens = dict(injected.tokens)
    committed = [t for g, m in d["moves"].items() if m["to"] == victim
                 and outcome["givers"][g]["outcome"] == "committed" for t in m["tokens"]]
    tokens[victim] = tuple(sorted(set(tokens.get(victim, ())) | set(committed)))
    detected = min((e.t for e in events if e.kind == "detected" and victim in e.about
                    and e.t >= injected.at - 0.001), default=None)
    outcome["detected_ms"] = None if detected is None else round((detected - injected.at) * 1e3, 1)
    return replace(injected, tokens=tokens, detail={**d, "outcome": outcome})


def _wait_load_started(mappers: list[MapperHandle], timeout: float = 60.0) -> float:
    """The load starts when every mapper has emitted its first chunk."""
    deadline = time.monotonic() + timeout
    while True:
        firsts = [m.journal_state()["first"] for m in mappers]
        started = [t for t in firsts if t is not None]
        if len(started) == len(firsts):
            return max(started)
        for m in mappers:
            if not m.alive():
                raise RuntimeError(f"mapper-{m.mapper} exited at start: " + _tail(m.log))
        if time.monotonic() > deadline:
            raise TimeoutError("mappers did not start sending within 60 s")
        time.sleep(0.02)


def _sleep_until(t: float, progress: Progress, what: str, t0: float, end: float,
                 result: RoundResult) -> None:
    while True:
        now = time.time()
        if now >= t:
            return
        done = len(result.injected)
        progress.update(f"{what} {bar((now - t0) / (end - t0))} {now - t0:4.1f}/"
                        f"{end - t0:.1f}s  faults injected {done}/{len(result.planned)}")
        time.sleep(min(0.1, t - now))


def _last_whole(samples: list[dict], cluster: LocalCluster) -> dict:
    """The nodes of the last sample that heard from every running process: one poll
    whose Stats call to a busy node outlived the sampler's short deadline must not
    drop that node from the final stats. The last sample if none did."""
    running = sum(1 for node in cluster.nodes if node.alive())
    for sample in reversed(samples[-50:]):
        if len(sample["nodes"]) >= running:
            return sample["nodes"]
    return samples[-1]["nodes"]


CONVERGED = 1.0      # seconds a healed ring must hold, settled, before it counts as final


def _settle(sampler: Sampler, cluster: LocalCluster, deadline: float,
            converge: bool = False) -> None:
    """Wait until every live node has drained its queue and has every range it owns on
    r+1 nodes again (or the deadline passes: the timeline will then show it). Live
    means every running process: one just restarted may answer the sampler only after
    its channel's reconnect backoff, and the last sample must count it. With
    `converge` (a healed partition), also until every member holds the same ring
    version and none is fenced (a fenced node has rejoined as a new member), and that
    ring has held for CONVERGED seconds: one rejoined member may be admitted a moment
    after the other, and its ranges are then short of copies again for a while."""
    settled_at: tuple[int, float] | None = None      # (ring version, since when)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if not sampler.samples:
            continue
        nodes = sampler.samples[-1]["nodes"]
        running = sum(1 for node in cluster.nodes if node.alive())
        versions = {n["ring_version"] for n in nodes.values()}
        if converge and (len(versions) > 1 or any(n["fenced"] for n in nodes.values())):
            settled_at = None
            continue
        if nodes and len(nodes) >= running and all(
                n["queue_length"] == 0 and n["under_replicated"] == 0 for n in nodes.values()):
            if not converge:
                return
            now = time.monotonic()
            if settled_at is None or settled_at[0] != max(versions):
                settled_at = (max(versions), now)
            elif now - settled_at[1] >= CONVERGED:
                return
        else:
            settled_at = None


Tally = Counter[str] | dict[str, set[int]]


def _journals(scenario: Scenario, seed: int,
              handles: list[MapperHandle]) -> tuple[Tally, Tally, list[dict]]:
    """What was acknowledged and what was not, per key, rebuilt from the journals:
    counts, or with Load.ids the set of tuple ids."""
    ids = scenario.load.ids
    acked_ids: dict[str, set[int]] = {}
    unacked_ids: dict[str, set[int]] = {}
    acked_counts: Counter[str] = Counter()
    unacked_counts: Counter[str] = Counter()
    summaries = []
    for h in handles:
        state = h.journal_state()
        emitted = state["emitted"]
        acknowledged = [i for i in emitted if i in state["acked"]]
        pending = [i for i in emitted if i not in state["acked"]]
        for chunks, into_ids, into_counts in ((acknowledged, acked_ids, acked_counts),
                                              (pending, unacked_ids, unacked_counts)):
            for i in chunks:
                keys = chunk_keys(scenario.load, seed, h.mapper, i)
                if ids:
                    for key, tid in zip(keys, chunk_ids(h.mapper, i, len(keys))):
                        into_ids.setdefault(key, set()).add(tid)
                else:
                    into_counts.update(keys)
        summaries.append({"mapper": h.mapper, "pid": h.pid, "source": state["source"],
                          "chunks_acknowledged": len(acknowledged),
                          "chunks_unacknowledged": pending,
                          "failed": state["failed"], "exit": h.popen.returncode,
                          "acked_at": sorted(state["acked"].values()),
                          # (when its flush began, when it returned) per acknowledged chunk
                          "flushes": sorted((state["flushing_at"].get(i, t), t)
                                            for i, t in state["acked"].items())})
    if ids:
        return acked_ids, unacked_ids, summaries
    return acked_counts, unacked_counts, summaries


def _verify(cluster: LocalCluster, acked, unacked, ids: bool) -> Verdict:
    from floering.mapper import RingClient
    seeds = [n.address for n in cluster.nodes if n.alive()]
    try:
        client = RingClient(seeds, timeout=60, tls=cluster.tls("client"))
        try:
            counted = client.scan_all()
        finally:
            client.close()
    except Exception as exc:
        if ids:
            acked = Counter({k: len(v) for k, v in acked.items()})
            unacked = Counter({k: len(v) for k, v in unacked.items()})
        return unreadable(f"{type(exc).__name__}: {exc}", acked, unacked)
    return check_ids(counted, acked, unacked) if ids else check(counted, acked, unacked)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _tail(path: str, lines: int = 5) -> str:
    return " | ".join(_read(path).splitlines()[-lines:])


# ------------------------------------------------------------------- a scenario

def run_scenario(scenario: Scenario, seed: int = 1, out: str | Path | None = None,
                 progress: Progress | None = None, plots: bool = True) -> dict:
    progress = progress or Progress()
    out = Path(out or f"chaos-results/{scenario.name}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        # Old journals and logs would be read as this run's.
        raise ValueError(f"output directory {out} is not empty; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    rounds_plan = plan(scenario, seed)
    rounds = []
    started = time.time()
    try:
        skipped = durable_faults.skip_reason(scenario) or (
            netns.skip_reason() if scenario.netns else None)
        if skipped:
            raise durable_faults.Skipped(skipped)
        for index, planned in enumerate(rounds_plan):
            rounds.append(run_round(scenario, seed, index, planned,
                                    out / f"round-{index + 1:02d}", progress, len(rounds_plan)))
    except durable_faults.Skipped as exc:
        progress.done()
        return _skipped(scenario, seed, out, started, str(exc))
    progress.done()
    timelines = [t for r in rounds for t in r.timelines]
    result = {
        "scenario": scenario.to_dict(), "seed": seed, "started": started,
        "seconds": round(time.time() - started, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "ok": all(r.ok for r in rounds),
        "summary": {stage: stage_summary(timelines, stage) for stage in STAGES},
        "recovery_by_simultaneous": by_simultaneous(timelines, "applying"),
        "takeover_by_simultaneous": by_simultaneous(timelines, "taken_over"),
        "rounds": [r.to_dict() for r in rounds],
    }
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    result["out"] = str(out)
    if plots:
        from floering.chaos.plots import plot_result
        result["plots"] = plot_result(result, out)
    return result


def _skipped(scenario: Scenario, seed: int, out: Path, started: float, why: str) -> dict:
    """A scenario this machine cannot run: nothing was checked, nothing failed."""
    result = {"scenario": scenario.to_dict(), "seed": seed, "started": started,
              "seconds": round(time.time() - started, 1), "ok": False, "skipped": why,
              "rounds": []}
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    result["out"] = str(out)
    return result


def summary_table(result: dict) -> str:
    """The terminal summary: one row per failure, then per-stage p50/max."""
    if result.get("skipped"):
        return f"SKIP: {result['scenario']['name']} seed {result['seed']}: {result['skipped']}"
    head = ("round", "fault", "victim", "detected", "taken over", "applying", "re-replicated")
    rows = [head]
    for r in result["rounds"]:
        for t in r["timelines"]:
            rows.append((str(r["index"] + 1), f"{t['kind']} x{t['simultaneous']}", t["victim"],
                         *(_ms(t[f"{s}_ms"]) for s in STAGES)))
        for inj in r["injected"]:
            if inj["kind"] == "kill-mapper":
                d = inj["detail"]
                rows.append((str(r["index"] + 1), "kill-mapper", inj["victims"][0],
                             "mid-chunk" if d.get("mid_chunk") else "between chunks",
                             f"in flight {d.get('in_flight_chunks')}", "", ""))
            elif inj["kind"] == "rolling-restart":
                d = inj["detail"]
                rows.append((str(r["index"] + 1), "rolling-restart", ",".join(inj["victims"]),
                             f"{d['seconds']:.1f} s", f"{len(d['steps'])} steps", "", ""))
            elif inj["kind"] in durable_faults.KINDS:
                rows.append((str(r["index"] + 1), inj["kind"], ",".join(inj["victims"]),
                             *durable_faults.summary_cells(inj)))
            elif inj["kind"] in NET_FAULTS:
                d = inj["detail"]
                what = (f"mappers with {d['mappers_with']}" if inj["kind"] == "partition"
                        else f"loss {100 * d['loss']:.0f}%")
                declared = sum(len(v) for v in d.get("declared", {}).values())
                wait = d.get("chunk_wait_ms", {})
                rows.append((str(r["index"] + 1), inj["kind"], ",".join(inj["victims"]),
                             f"{what}, healed at {_ms(1e3 * d.get('healed_s', 0))}",
                             f"{declared} declarations, {d.get('suspicions', 0)} suspicions",
                             f"chunk wait p50 {_ms(wait.get('p50'))} "
                             f"max {_ms(wait.get('max'))}",
                             "fenced +" + ",".join(_ms(v) for v in
                                                  d.get("fenced_after_heal_ms", {}).values())
                             if d.get("fenced_after_heal_ms") else ""))
            elif inj["kind"] == "kill-mid-handoff":
                d = inj["detail"]
                rows.append((str(r["index"] + 1), f"{d['handoff']} {d['side']}",
                             inj["victims"][0],
                             "in flight" if d["in_flight"] else "MISSED the window",
                             d.get("outcome", {}).get("summary", "?"), "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    s = result["summary"]
    lines.append("")
    lines.append("ms after injection   " + "   ".join(
        f"{name}: p50 {_ms(s[st]['p50'])} max {_ms(s[st]['max'])}"
        + (f" ({s[st]['missing']} missing)" if s[st]["missing"] else "")
        for name, st in zip(("detected", "taken over", "applying", "re-replicated"), STAGES)))
    by_k = result["recovery_by_simultaneous"]
    if len(by_k) > 1:
        lines.append("recovery (applying again) by failures at once: " + ", ".join(
            f"{k}: p50 {_ms(v['p50'])} max {_ms(v['max'])}" for k, v in by_k.items()))
    for r in result["rounds"]:
        o = r["oracle"]
        verdict = o["summary"] if o else "not checked"
        errors = ("; errors: " + "; ".join(r["errors"])) if r["errors"] else ""
        lines.append(f"round {r['index'] + 1} ({r['label']}): {verdict}{errors}")
    lines.append(("PASS" if result["ok"] else "FAIL") + f": {result['scenario']['name']} "
                 f"seed {result['seed']}, {len(result['rounds'])} rounds in "
                 f"{result['seconds']}s; results in {result.get('out', '?')}")
    return "\n".join(lines)


def _ms(value) -> str:
    return "-" if value is None else f"{value:.0f} ms" if isinstance(value, (int, float)) else str(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", help="a built-in scenario name or a .json/.toml file")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="output directory (default chaos-results/NAME-seedN-TIME)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--insecure", action="store_true",
                        help="run the cluster in the clear (default: mutual TLS on every call)")
    args = parser.parse_args(argv)
    try:
        scenario = with_overrides(load_scenario(args.scenario),
                                  tls=False if args.insecure else None)
        result = run_scenario(scenario, args.seed, args.out, plots=not args.no_plots)
    except ValueError as exc:
        print(f"floe chaos: {exc}", file=sys.stderr)
        return 2
    print(summary_table(result))
    return 0 if result["ok"] or result.get("skipped") else 1


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
