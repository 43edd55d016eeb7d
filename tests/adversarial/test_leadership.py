"""Leadership under a frozen leader, a leader whose host vanishes, a deposed leader's writes, and replicas whose
clocks disagree (issue 27.1).

Issue 27 found: SIGSTOP of the engine leader for 40 s gave no failover (its PostgreSQL session and
advisory lock stayed up); a standby 2 min ahead took over and rolled back a healthy rollout on
``silence <= 121s``; with an hour of skew a 30 s bake ran past 150 s or was cut short.

The first two cases run two real `edgectl controller run` processes on one PostgreSQL store with a real
Mosquitto (tests/replicas/conftest.py): what devices received is read off the wire, who published it
off the broker's log, what was written off the store. In the second the leader runs in a network
namespace of its own (tests/adversarial/netns.py) whose link is cut: its host vanishes, and neither
PostgreSQL nor the broker is told. The others run in process on the seams the code offers: a
:class:`TableLease` on a real PostgreSQL database, ``Store.fenced`` with a stale token, and the engine on a
:class:`StoreClock` whose read and monotonic clocks the test moves.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.reports import DeviceEvent
from edgecore.transport_memory import MemoryBroker
from edgectl.controller.clock import StoreClock
from edgectl.controller.engine import Engine
from edgectl.controller.leader import LEASE_TTL_S, MARGIN_S, TableLease
from edgectl.controller.records import DeviceStatus as D
from edgectl.controller.records import PackageRef, Phase, RolloutDevice, RolloutRow, RolloutSpec
from edgectl.controller.records import RolloutStatus as S
from edgectl.controller.service import Controller
from edgectl.controller.store import SqliteStore, open_url
from edgectl.controller.store.protocol import Fenced, LeaseToken
from edgectl.keys import Keyring
from tests.adversarial.netns import Netns, NetnsUnavailable, netns, unavailable
from tests.control.conftest import ControllerProcess
from tests.fleet import wait_for
from tests.guards.rollout_bench import Recorder
from tests.postgres import PostgresCluster, start_cluster
from tests.replicas.conftest import Replicas, open_replicas
from tests.replicas.test_failover import ended, leader_and_standby, pid

TICK_S = 0.5  # `controller run`'s tick
TAKE_OVER_S = 10.0 + TICK_S  # the failover bound docs/fleet.md states, and one tick to notice
HOUR = 3600.0


def done_audited(replicas: Replicas, rollout_id: str) -> None:
    """Until the leader's "rollout done" is in the audit log: it is written just after the status DONE, not with it."""
    wait_for(lambda: any(a.action == "rollout done" for a in replicas.store().audit_log(rollout_id)), 10,
             f"rollout {rollout_id}'s end in the audit log")


@dataclass(frozen=True)
class Finished:
    """What the standby left once it finished the rollout: the rows, the audit and how much went over the wire."""

    rows: list[tuple[str, D, bytes | None]]
    audit: list[tuple[int, str]]
    seen: int


def standby_finishes(replicas: Replicas, standby: ControllerProcess, rid: str, since: float, what: str) -> Finished:
    """The standby leads within TAKE_OVER_S of ``since`` (the leader's loss, ``what``) and finishes the rollout."""
    took_over = wait_for(lambda: replicas.leading(standby), 30, "the standby to lead")
    print(f"take-over {took_over.ts - since:.2f}s after {what}")
    assert took_over.ts - since < TAKE_OVER_S
    assert ended(replicas, rid, 60) is S.DONE  # the standby finished the bake and the second wave
    done_audited(replicas, rid)
    return Finished([(r.device_id, r.status, r.desired) for r in replicas.rows(rid)],
                    [(a.id, a.action) for a in replicas.store().audit_log(rid)], len(replicas.wire.messages))


def deposed_acts_no_more(replicas: Replicas, leader: ControllerProcess, rid: str, finished: Finished, back_at: float,
                         found_s: float) -> None:
    """The old leader, back since ``back_at``, finds its lease gone within ``found_s``, stays up, and changes nothing."""
    log = replicas.home.path.parent / "controller-a.log"
    wait_for(lambda: "passed to another controller" in log.read_text(errors="replace"), found_s,
             "the old leader, back, to find its lease gone")
    print(f"the deposed leader found its lease gone {time.time() - back_at:.2f}s after it came back")
    time.sleep(3 * TICK_S)  # a few of its ticks, back: it must do nothing in them

    assert leader.process is not None and leader.process.poll() is None, "the deposed leader died"
    assert [a.detail for a in replicas.audit("controller leading")].count(f"pid {pid(leader)}") == 1, "it took the lease back"
    assert [(r.device_id, r.status, r.desired) for r in replicas.rows(rid)] == finished.rows, "the rollout's rows changed"
    new = [(a.action, round(a.ts - back_at, 2)) for a in replicas.store().audit_log(rid)
           if (a.id, a.action) not in finished.audit]
    assert not new, f"the rollout's audit changed (action, seconds after it came back): {new}"
    late = [topic for ts, topic in replicas.publishers().get(pid(leader), []) if ts >= int(back_at)]
    assert not late, f"the deposed leader published {late[:3]}"
    after = [topic for topic, _payload, _retain in replicas.wire.messages[finished.seen:]]
    assert not [t for t in after if t.endswith(("/desired", "/commands"))], after[:3]


@pytest.mark.slow
def test_sigstop_the_leader_the_standby_leads_and_the_woken_one_acts_no_more(replicas: Replicas) -> None:
    replicas.agents(4)
    leader, standby = leader_and_standby(replicas)
    replicas.wait_devices(4)
    v1 = replicas.package("clf", 1, seed=1)
    rid = replicas.deploy(str(v1), "--fleet", "all", "--waves", "1,100%", "--bake", "4s")
    wait_for(lambda: replicas.rollout(rid).phase is Phase.BAKING, 60, "wave 1 to bake", interval=0.05)

    stopped_at = time.time()
    os.kill(pid(leader), signal.SIGSTOP)  # frozen: its kernel still answers TCP keepalives, its sessions stay up
    try:
        finished = standby_finishes(replicas, standby, rid, stopped_at, "SIGSTOP")
    finally:
        woken_at = time.time()
        os.kill(pid(leader), signal.SIGCONT)
    deposed_acts_no_more(replicas, leader, rid, finished, woken_at, 15)


@dataclass
class Elsewhere:
    """The replicas' plane, and a network namespace from which the store and the broker are reached over a veth link."""

    replicas: Replicas
    host: Netns
    store_url: str  # the plane's database, at this host's end of the link
    broker_url: str

    def sessions(self) -> int:
        """The store's sessions whose client is in the namespace."""
        import psycopg  # as tests/postgres.py: only where a PostgreSQL cluster runs

        with psycopg.connect(self.replicas.url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE client_addr = %s", (self.host.ns_ip,)).fetchone()
        return int(row[0]) if row else 0


@pytest.fixture
def elsewhere(tmp_path: Path, home_for: Any) -> Iterator[Elsewhere]:
    """A PostgreSQL cluster and a Mosquitto that listen on 127.0.0.1 and on this host's end of a veth pair."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    with ExitStack() as stack:
        try:
            host = stack.enter_context(netns())
        except NetnsUnavailable as exc:
            pytest.skip(f"no network namespace with a veth pair can be made here: {exc}")
        cluster = start_cluster(listen=f"127.0.0.1,{host.host_ip}", hba=f"host all all {host.ns_ip}/32 trust\n")
        try:
            with open_replicas(tmp_path, cluster, home_for, also_listen=host.host_ip) as plane:
                store_url = f"postgresql://postgres@{host.host_ip}:{cluster.port}/{urlsplit(plane.url).path.lstrip('/')}"
                try:
                    yield Elsewhere(plane, host, store_url, f"mqtt://{host.host_ip}:{plane.broker.port}")
                finally:
                    host.restore()  # its controller stops (at teardown) as it should only with the link up
        finally:
            cluster.stop()


@pytest.mark.slow
def test_the_leaders_host_vanishes_the_standby_leads_and_the_returned_one_acts_no_more(elsewhere: Elsewhere) -> None:
    replicas, host = elsewhere.replicas, elsewhere.host
    replicas.agents(4)
    leader = replicas.start_controller("a", prefix=host.prefix, store_url=elsewhere.store_url, broker_url=elsewhere.broker_url)
    wait_for(lambda: replicas.leading(leader), 60, "the controller in the namespace to lead")
    standby = replicas.start_controller("b")
    wait_for(lambda: len(replicas.audit("controller started")) == 2, 60, "the second controller to start")
    replicas.wait_devices(4)
    assert elsewhere.sessions() >= 2, "the leader's store sessions do not come over the veth link"
    assert f"from {host.ns_ip}" in replicas.broker.log.read_text(errors="replace"), "its broker connection does not either"
    v1 = replicas.package("clf", 1, seed=1)
    rid = replicas.deploy(str(v1), "--fleet", "all", "--waves", "1,100%", "--bake", "4s")
    wait_for(lambda: replicas.rollout(rid).phase is Phase.BAKING, 60, "wave 1 to bake", interval=0.05)

    cut_at = time.time()
    host.cut()  # its host vanishes: no FIN, no RST, nothing reaches PostgreSQL or the broker any more
    try:
        assert elsewhere.sessions() >= 2, "PostgreSQL was told: the leader's sessions ended with the cut"
        finished = standby_finishes(replicas, standby, rid, cut_at, "the leader's host vanished")
    finally:
        restored_at = time.time()
        host.restore()
    deposed_acts_no_more(replicas, leader, rid, finished, restored_at, 30)


def test_a_deposed_leaders_write_with_an_old_epoch_is_refused(postgres: PostgresCluster, tmp_path: Path) -> None:
    url = postgres.create_database()
    store = open_url(url, packages_dir=tmp_path / "cache")
    try:
        first, second = TableLease(url, "test", ttl_s=1.0), TableLease(url, "test", ttl_s=1.0)
        assert first.check() and not second.check(), "a live lease was taken twice"
        old = first.token()
        assert old is not None
        store.fenced(lambda: old).audit("written by the first leader")
        rollout = _rollout(tmp_path, "r1", bake_s=30.0)
        store.fenced(lambda: old).create_rollout(rollout, [RolloutDevice("r1", "d1", 1, "v1", D.PLANNED)])

        # The first leader stops renewing (frozen, cut off): the lease lapses on the database's clock.
        wait_for(second.check, 10, "the second controller to take the lapsed lease")
        new = second.token()
        assert new is not None and new.epoch == old.epoch + 1

        # It wakes up and writes with what it still holds: the store refuses every engine write.
        deposed = store.fenced(lambda: old)
        with pytest.raises(Fenced, match=rf"epoch {old.epoch} is no longer current \(epoch {new.epoch} held by "):
            deposed.audit("written by the deposed leader")
        rollout.status, rollout.reason = S.ROLLED_BACK, "by the deposed leader"
        with pytest.raises(Fenced):
            deposed.save_rollout(rollout)
        row = RolloutDevice("r1", "d1", 1, "v1", D.ROLLBACK_SENT)
        with pytest.raises(Fenced), store.batch():
            deposed.save_rollout_device(row)
        with pytest.raises(Fenced):  # its holder name with the new epoch is no token either
            store.fenced(lambda: LeaseToken(old.holder, new.epoch)).audit("a forged epoch")
        assert not first.check() and first.token() is None, "the deposed leader still thinks it leads"

        kept = store.rollout("r1")
        assert kept is not None and kept.status is S.RUNNING and kept.reason == ""
        assert [r.status for r in store.rollout_devices("r1")] == [D.PLANNED]
        actions = [a.action for a in store.audit_log()]
        assert "written by the first leader" in actions
        assert not {"written by the deposed leader", "a forged epoch"} & set(actions)

        store.fenced(lambda: new).audit("written by the new leader")  # the current epoch writes
        assert "written by the new leader" in [a.action for a in store.audit_log()]
        time.sleep(1.5)  # past the TTL without a renewal: the new leader's own epoch is refused as well
        with pytest.raises(Fenced, match="is no longer current"):
            store.fenced(lambda: new).audit("written after the lease lapsed")
        second.release()
        first.release()
    finally:
        store.close()


def test_a_frozen_leader_counts_its_lease_lapsed_before_the_database_frees_it(postgres: PostgresCluster) -> None:
    """Its own monotonic clock runs on while it is stopped: on waking it holds no token, so it publishes nothing."""
    url = postgres.create_database()
    open_url(url, packages_dir=Path("/nonexistent")).close()  # the schema, with its lease row
    now = [100.0]
    lease = TableLease(url, "test", monotonic=lambda: now[0])
    other = TableLease(url, "test")
    try:
        assert lease.check()
        assert lease.token() is not None
        now[0] += LEASE_TTL_S - MARGIN_S - 0.1
        assert lease.token() is not None
        now[0] += 0.2  # still before the database's expiry (the real time barely moved): no token all the same
        assert lease.token() is None
        assert not other.check(), "the database let the lease go before its TTL"
    finally:
        lease.release()
        other.release()


# -- one clock: the store's --------------------------------------------------------------------------


def _rollout(tmp_path: Path, rollout_id: str, bake_s: float, gates: tuple[str, ...] = ()) -> RolloutRow:
    package = PackageRef("v1", "a1", "clf", 2, "any", "clf v2", str(tmp_path / "clf.edgepkg"), 10)
    spec = RolloutSpec("all", (package,), 1, 0.5, bake_s, gates, 600.0, wave_timeout_s=600)
    return RolloutRow(rollout_id, 0.0, S.RUNNING, spec, wave=1, phase=Phase.START)


class Replica:
    """One controller's engine on the store's clock: ``read`` is the store's time, ``monotonic`` this host's own clock,
    whose origin (boot) has nothing to do with another host's."""

    def __init__(self, store: SqliteStore, store_time: list[float], boot_offset: float) -> None:
        self.store_time, self.boot_offset, self.elapsed = store_time, boot_offset, 0.0
        self.clock = StoreClock(lambda: store_time[0], lambda: self.boot_offset + self.elapsed)
        self.publisher = Recorder()
        self.engine = Engine(store, self.publisher, lambda _t, _b: None, clock=self.clock)

    def run(self, seconds: float, store: SqliteStore, step: float = 0.5) -> None:
        """Tick for ``seconds`` (the store's clock and this host's monotonic clock move together), devices heard from."""
        end = self.store_time[0] + seconds
        while self.store_time[0] < end - 1e-9:
            self.engine.tick()
            for row in store.rollout_devices("r1"):
                store.upsert_device(row.device_id, last_seen=self.clock())
                if row.status == D.SENT:
                    self.engine.reports.on_event(row.device_id,
                                                 DeviceEvent(row.device_id, "r1", "done", "ok", "", self.clock()))
            self.store_time[0] += step
            self.elapsed += step
            self.clock.sync()


def _baking_store(tmp_path: Path, store_time: list[float], bake_s: float, gates: tuple[str, ...]) -> tuple[SqliteStore, Replica]:
    store = SqliteStore(tmp_path / "store.db")
    store.upsert_device("d1", online=1, last_seen=store_time[0])
    store.create_rollout(_rollout(tmp_path, "r1", bake_s, gates), [RolloutDevice("r1", "d1", 1, "v1", D.PLANNED)])
    leader = Replica(store, store_time, boot_offset=5_000.0)
    leader.run(2.0, store)
    baking = store.rollout("r1")
    assert baking is not None and baking.phase is Phase.BAKING, baking
    return store, leader


@pytest.mark.parametrize("skew_s", [HOUR, -HOUR])
def test_a_bake_is_measured_on_the_store_clock_whoever_leads(tmp_path: Path, skew_s: float) -> None:
    """Replica A starts a 30 s bake and dies; replica B, on a host whose clocks are an hour off, takes over: the bake
    still ends 30 s (store time) after it began, neither cut short nor stretched."""
    store_time = [1_700_000_000.0]
    store, _a = _baking_store(tmp_path, store_time, 30.0, ())
    began = store.rollout("r1")
    assert began is not None
    b = Replica(store, store_time, boot_offset=store_time[0] + skew_s)  # B's monotonic clock reads its wall clock
    b.run(began.phase_since + 29.0 - store_time[0], store)
    baked = store.rollout("r1")
    assert baked is not None and baked.status is S.RUNNING and baked.phase is Phase.BAKING, "the bake was cut short"
    b.run(2.0, store)
    done = store.rollout("r1")
    assert done is not None and done.status is S.DONE, "the bake ran past 30 s"
    promoted = next(a for a in store.audit_log("r1") if a.action == "wave promoted")
    assert promoted.action and abs(b.clock() - began.phase_since - 31.0) < 1.0


def test_a_standby_ahead_by_minutes_does_not_roll_back_on_silence(tmp_path: Path) -> None:
    """A device heard from a second ago (the store's time) is not silent to a replica whose wall clock is 2 min ahead."""
    store_time = [1_700_000_000.0]
    store, _a = _baking_store(tmp_path, store_time, 60.0, ("silence <= 121s",))
    b = Replica(store, store_time, boot_offset=store_time[0] + 120.0)
    b.run(70.0, store)
    rollout = store.rollout("r1")
    assert rollout is not None and rollout.status is S.DONE, (rollout.status if rollout else None, store.audit_log("r1")[-3:])
    assert not [kind for kind, _ in b.publisher.sent if kind == "rollback"]

    # The same take-over on the replica's wall clock (what the engine ran on before): the gate would fail.
    store_time[0] += 10.0
    skewed_tmp = tmp_path / "wall"
    skewed_tmp.mkdir()
    skewed_store, _a2 = _baking_store(skewed_tmp, store_time, 60.0, ("silence <= 121s",))
    wall = Engine(skewed_store, Recorder(), lambda _t, _b: None, clock=lambda: store_time[0] + 125.0)
    wall.tick()
    halted = skewed_store.rollout("r1")
    assert halted is not None and halted.status is not S.RUNNING, "the silence gate did not see 125 s of silence"


def test_the_service_runs_its_engine_and_its_reports_on_the_store_clock(tmp_path: Path) -> None:
    """What the two tests above assume of `controller run`: its engine's timers read the store's clock."""
    store = SqliteStore(tmp_path / "store.db")
    ring = Keyring(tmp_path / "keys")
    ring.init("controller")
    controller = Controller(store, MemoryBroker().factory("ctl"), ring.signing_key("controller"), TrustedKeys([]))
    try:
        assert controller.engine.clock is controller.clock
        assert controller.engine.reports.clock is controller.clock
        assert controller.clock.read == store.now
    finally:
        store.close()
