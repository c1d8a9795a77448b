"""Atomic saves: a failed or killed save never leaves a loadable half-written version."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from kedro.io import DatasetError, Version

from rl_pipeline.datasets.atomic import JSONDataset, ParquetDataset
from rl_pipeline.datasets.model_folder import ModelFolderDataset
from tests.mounts import fill, remount_read_only, tmpfs


def _versioned(path: Path) -> ParquetDataset:
    return ParquetDataset(filepath=str(path), version=Version(None, None))


def test_failed_save_keeps_the_previous_version_loadable(tmp_path: Path) -> None:
    target = tmp_path / "prompts.parquet"
    _versioned(target).save(pd.DataFrame({"a": [1, 2]}))
    time.sleep(0.01)  # versions are millisecond timestamps
    with pytest.raises(DatasetError):
        _versioned(target).save(pd.DataFrame({"a": [object()]}))  # pyarrow cannot write this
    assert list(_versioned(target).load()["a"]) == [1, 2]
    assert not list(tmp_path.rglob("*.partial"))


@pytest.mark.slow
def test_killed_save_leaves_no_file_that_loads(tmp_path: Path) -> None:
    """SIGKILL a process in the middle of a large save: the target never exists half-written."""
    target = tmp_path / "big.parquet"
    _versioned(target).save(pd.DataFrame({"a": [1]}))
    script = (
        "import sys, pandas as pd, numpy as np\n"
        "from kedro.io import Version\n"
        "from rl_pipeline.datasets.atomic import ParquetDataset\n"
        "df = pd.DataFrame({'t': ['x' * 200] * 3_000_000, 'n': np.arange(3_000_000)})\n"
        "print('ready', flush=True)\n"
        f"ParquetDataset(filepath={str(target)!r}, version=Version(None, None)).save(df)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.time() + 60
    while not list(tmp_path.rglob("*.partial")) and time.time() < deadline:
        time.sleep(0.005)
    assert list(tmp_path.rglob("*.partial")), "the save never started writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finals = list(target.glob("*/big.parquet"))
    assert len(finals) == 1  # only the first, complete version
    assert list(_versioned(target).load()["a"]) == [1]


def test_json_save_replaces_the_file_whole(tmp_path: Path) -> None:
    ds = JSONDataset(filepath=str(tmp_path / "report.json"))
    ds.save({"rows": 1})
    ds.save({"rows": 2})
    assert ds.load() == {"rows": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


@pytest.mark.parametrize(("break_disk", "problem"), [
    (fill, "the disk is full"),
    (remount_read_only, "the file system is read-only"),
])
def test_full_or_read_only_disk_fails_clearly_and_keeps_earlier_versions(
        tmp_path: Path, break_disk, problem: str) -> None:
    with tmpfs(tmp_path / "disk", "1m") as disk:
        target = disk / "prompts.parquet"
        _versioned(target).save(pd.DataFrame({"a": [1, 2]}))
        break_disk(disk)
        time.sleep(0.01)
        with pytest.raises(DatasetError, match=rf"cannot save .*prompts\.parquet: {problem}"
                                               r".*Nothing was replaced"):
            _versioned(target).save(pd.DataFrame({"a": range(100_000)}))
        assert list(_versioned(target).load()["a"]) == [1, 2]
        assert len(list(target.iterdir())) == 1  # no empty version folder, no .partial
        assert not list(disk.rglob("*.partial"))


def test_model_folder_on_a_full_disk_fails_clearly(tmp_path: Path) -> None:
    source = tmp_path / "model"
    source.mkdir()
    (source / "model.safetensors").write_bytes(bytes(256 << 10))
    with tmpfs(tmp_path / "disk", "1m") as disk:
        earlier = tmp_path / "earlier"
        earlier.mkdir()
        (earlier / "config.json").write_text("{}")
        folder = lambda: ModelFolderDataset(path=str(disk / "merged"),  # noqa: E731
                                            version=Version(None, None))
        folder().save(str(earlier))
        fill(disk)
        time.sleep(0.01)
        with pytest.raises(DatasetError, match="the disk is full"):
            folder().save(str(source))
        assert (Path(folder().load()) / "config.json").read_text() == "{}"
        assert (source / "model.safetensors").is_file()  # the unsaved model is still there
        assert not list(disk.rglob("*.partial"))


def test_a_session_loads_what_it_saved_when_a_run_beside_it_saved_a_newer_version(
        tmp_path: Path) -> None:
    """Two merges by hand, side by side: the one that started first (its session's version
    the older) saves last. Its publish node reads back merged_model and must get its own
    folder, not the other run's newer one, which it would register as its own model. A
    later session loads the newest; a load version given by the user is kept."""
    early, late = "2026-01-01T02.00.00.000Z", "2026-01-01T02.01.00.000Z"
    target = tmp_path / "merged_model"

    def model(name: str) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(f'{{"run": "{name}"}}')
        return str(tmp_path / name)

    first = ModelFolderDataset(path=str(target), version=Version(None, early))
    second = ModelFolderDataset(path=str(target), version=Version(None, late))
    second.save(model("second"))
    first.save(model("first"))
    assert '"first"' in (Path(first.load()) / "config.json").read_text()
    assert '"second"' in (Path(second.load()) / "config.json").read_text()
    assert Path(ModelFolderDataset(path=str(target), version=Version(None, None)).load()
                ).parent.name == late
    pinned = ModelFolderDataset(path=str(target), version=Version(late, early))
    assert Path(pinned.load()).parent.name == late

    table = tmp_path / "prompts.parquet"
    older = ParquetDataset(filepath=str(table), version=Version(None, early))
    ParquetDataset(filepath=str(table), version=Version(None, late)).save(
        pd.DataFrame({"a": [2]}))
    older.save(pd.DataFrame({"a": [1]}))
    assert list(older.load()["a"]) == [1]
