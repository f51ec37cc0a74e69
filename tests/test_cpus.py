"""The CPU count follows the container's quota, not only the affinity mask: fake cgroup v1
and v2 trees, the way a container runtime lays them out."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cpus import cpu_budget


def v2_tree(tmp_path: Path, cpu_max: str, own: str = "/") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    directory = root / own.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (directory / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text(f"0::{own}\n")
    return root, proc


def v1_tree(tmp_path: Path, quota: int, period: int = 100_000) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    cpu = root / "cpu,cpuacct"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (cpu / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/\n0::/\n")
    return root, proc


def test_two_cpus_of_quota_on_sixteen_cores_give_the_two_core_configuration(tmp_path):
    root, proc = v2_tree(tmp_path, "200000 100000")
    budget = cpu_budget(root, proc, affinity=16)
    assert (budget.cpus, budget.affinity, budget.quota, budget.source) == (2, 16, 2.0, "cgroup v2")


def test_no_quota_leaves_the_affinity_mask(tmp_path):
    root, proc = v2_tree(tmp_path, "max 100000")
    assert cpu_budget(root, proc, affinity=16).cpus == 16
    root, proc = v1_tree(tmp_path / "v1", quota=-1)
    assert cpu_budget(root, proc, affinity=4).cpus == 4


def test_the_mask_wins_when_it_is_smaller_than_the_quota(tmp_path):
    root, proc = v2_tree(tmp_path, "800000 100000")
    assert cpu_budget(root, proc, affinity=2).cpus == 2


def test_a_fractional_quota_rounds_up_and_never_gives_zero(tmp_path):
    root, proc = v2_tree(tmp_path, "150000 100000")
    assert cpu_budget(root, proc, affinity=16).cpus == 2
    root, proc = v2_tree(tmp_path / "small", "10000 100000")
    assert cpu_budget(root, proc, affinity=16).cpus == 1


def test_cgroup_v1_quota_and_period(tmp_path):
    root, proc = v1_tree(tmp_path, quota=300_000, period=100_000)
    budget = cpu_budget(root, proc, affinity=16)
    assert (budget.cpus, budget.source) == (3, "cgroup v1")


def test_the_process_own_cgroup_is_read_before_the_root(tmp_path):
    root, proc = v2_tree(tmp_path, "400000 100000", own="/kubepods/pod1/c1")
    (root / "cpu.max").write_text("max 100000\n")  # the node's root: no limit
    assert cpu_budget(root, proc, affinity=16).cpus == 4


def test_no_cgroup_tree_at_all_trusts_the_mask(tmp_path):
    assert cpu_budget(tmp_path / "absent", tmp_path / "absent_proc", affinity=3).cpus == 3


def test_engine_threads_follow_the_quota(tmp_path, monkeypatch):
    import service.translation.model_settings as model_settings
    from service import cpus
    from service.config import Settings

    root, proc = v2_tree(tmp_path, "200000 100000")
    monkeypatch.setattr(
        model_settings, "cpu_budget", lambda: cpus.cpu_budget(root, proc, affinity=16)
    )
    assert Settings().model.engine_threads == 1  # 2 CPUs of quota: one beside the event loop


@pytest.mark.parametrize("text", ["garbage", "12 abc"])
def test_an_unreadable_quota_trusts_the_mask(tmp_path, text):
    root, proc = v2_tree(tmp_path, text)
    assert cpu_budget(root, proc, affinity=5).cpus == 5


@pytest.mark.parametrize(
    ("threads", "cpus", "warned"),
    [
        (0, 2, False),
        (1, 2, False),
        (2, 2, True),
        (3, 4, False),
        (4, 4, True),
        (1, 1, False),
        (2, 1, True),
    ],
)
def test_threads_set_past_the_cpus_less_one_are_warned_of(threads, cpus, warned):
    from service.cpus import CpuBudget
    from service.wiring import oversubscribed

    warning = oversubscribed(threads, CpuBudget(cpus, affinity=cpus, quota=None, source="affinity"))
    assert (warning is not None) is warned
    if warned:
        assert (
            f"MT_INTRA_OP_THREADS={threads}" in warning and f"gives {max(1, cpus - 1)}" in warning
        )


def test_the_warning_is_logged_at_start_up(tmp_path, monkeypatch, caplog):
    import logging

    import service.wiring as wiring
    from service import cpus
    from service.config import Settings

    root, proc = v2_tree(tmp_path, "200000 100000")
    monkeypatch.setattr(wiring, "cpu_budget", lambda: cpus.cpu_budget(root, proc, affinity=16))
    settings = Settings(intra_op_threads=2, exports=[tmp_path / "no-models"])
    with caplog.at_level(logging.WARNING, logger="service.wiring"):
        wiring.create_app(settings)
    assert any("MT_INTRA_OP_THREADS=2 on 2 usable CPUs" in r.message for r in caplog.records)
